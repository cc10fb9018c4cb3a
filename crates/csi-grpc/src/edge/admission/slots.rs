//! The node's slots for mounts, a share of them per namespace, and the mounts waiting for
//! one: a queue per namespace, the namespaces with waiters served in turn.
//!
//! Everything is under one mutex, held for bookkeeping only: never across an await and
//! never while a [`Slot`] is dropped (its `Drop` takes the mutex to give the slot back and
//! hand it on).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::server::{MountObserver, WaitOutcome};

/// The bounds of [`crate::MountLimits`], resolved (a node and a share of at least one slot).
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    /// Slots on the node: mounts in flight at once.
    pub(super) max: usize,
    /// A namespace's share: past it, it takes a slot only while this many stay free.
    pub(super) share: usize,
    /// Mounts waiting for a slot on the node at once.
    pub(super) max_queued: usize,
    /// Mounts of one namespace waiting at once.
    pub(super) max_queued_per_namespace: usize,
}

/// The slots and the queues, shared by every service of one layer.
#[derive(Debug)]
pub(super) struct Slots {
    bounds: Bounds,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Slots taken.
    in_flight: usize,
    /// Slots taken per namespace; a namespace with none has no entry.
    held: HashMap<String, usize>,
    /// The waiters of each namespace, oldest first; a namespace with none has no entry.
    queues: HashMap<String, VecDeque<Waiter>>,
    /// The namespaces with waiters, in turn: the first that may take a free slot gets it
    /// for its oldest waiter and goes to the back.
    turns: VecDeque<String>,
    /// Waiters in all queues.
    queued: usize,
    next_ticket: u64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    grant: oneshot::Sender<Slot>,
}

/// What [`Slots::admit`] decided for a mount.
#[derive(Debug)]
pub(super) enum Admit {
    /// A slot now.
    Now(Slot),
    /// A place in its namespace's queue.
    Wait(Queued),
    /// Neither: the bound of a queue is reached.
    Refused(Refusal),
}

/// Why a mount could neither take a slot nor wait for one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refusal {
    /// Slots taken on the node.
    pub(super) in_flight: usize,
    /// Slots the mount's namespace holds.
    pub(super) held: usize,
    /// The queue whose bound is reached.
    pub(super) full: FullQueue,
}

/// Which queue bound a refused mount met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FullQueue {
    /// `max_queued`: the node's.
    Node,
    /// `max_queued_per_namespace`: its namespace's.
    Namespace,
}

impl Slots {
    pub(super) fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            state: Mutex::default(),
        }
    }

    pub(super) fn bounds(&self) -> Bounds {
        self.bounds
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a mount of `namespace` if it may take one now and none of its namespace
    /// waits before it, else a place at the back of its namespace's queue, else (both
    /// bounds of the queues checked) the refusal.
    pub(super) fn admit(self: &Arc<Self>, namespace: &str) -> Admit {
        let b = self.bounds;
        let mut state = self.lock();
        let waiting = state.queues.get(namespace).map_or(0, VecDeque::len);
        if waiting == 0 && state.may_take(namespace, b) {
            state.take(namespace);
            return Admit::Now(Slot::new(self, namespace));
        }
        let full = if state.queued >= b.max_queued {
            Some(FullQueue::Node)
        } else if waiting >= b.max_queued_per_namespace {
            Some(FullQueue::Namespace)
        } else {
            None
        };
        if let Some(full) = full {
            return Admit::Refused(Refusal {
                in_flight: state.in_flight,
                held: state.held_by(namespace),
                full,
            });
        }
        let (grant, granted) = oneshot::channel();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        if waiting == 0 {
            state.turns.push_back(namespace.to_owned());
        }
        state
            .queues
            .entry(namespace.to_owned())
            .or_default()
            .push_back(Waiter { ticket, grant });
        state.queued += 1;
        Admit::Wait(Queued {
            slots: self.clone(),
            namespace: namespace.to_owned(),
            ticket,
            granted,
            since: Instant::now(),
            outcome: None,
            observer: None,
        })
    }
}

impl State {
    fn held_by(&self, namespace: &str) -> usize {
        self.held.get(namespace).copied().unwrap_or(0)
    }

    /// Whether a mount of `namespace` may take a free slot: one is free, and the namespace
    /// is within its share or, past it, a share stays free after this mount takes one.
    fn may_take(&self, namespace: &str, b: Bounds) -> bool {
        self.in_flight < b.max
            && (self.held_by(namespace) < b.share
                || self.in_flight.saturating_add(1).saturating_add(b.share) <= b.max)
    }

    fn take(&mut self, namespace: &str) {
        self.in_flight += 1;
        *self.held.entry(namespace.to_owned()).or_default() += 1;
    }

    fn release(&mut self, namespace: &str) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(count) = self.held.get_mut(namespace) {
            *count -= 1;
            if *count == 0 {
                self.held.remove(namespace);
            }
        }
    }

    /// Hands the free slots to the waiters: each to the oldest waiter of the first
    /// namespace in turn that may take it (the share rule decides, so a namespace past its
    /// share keeps its place in turn while the others are served), which then goes to the
    /// back of the turns.
    fn serve(&mut self, slots: &Arc<Slots>) {
        let b = slots.bounds;
        while let Some(turn) = self.turns.iter().position(|n| self.may_take(n, b)) {
            let Some(namespace) = self.turns.remove(turn) else {
                return;
            };
            let Some(queue) = self.queues.get_mut(&namespace) else {
                continue;
            };
            let waiter = queue.pop_front();
            if queue.is_empty() {
                self.queues.remove(&namespace);
            } else {
                self.turns.push_back(namespace.clone());
            }
            let Some(waiter) = waiter else {
                continue;
            };
            self.queued -= 1;
            self.take(&namespace);
            if let Err(mut slot) = waiter.grant.send(Slot::new(slots, &namespace)) {
                // The waiter's receiver is gone (it was dropped before its place in the
                // queue was removed): give the slot back here, under the lock this
                // function is called with, rather than by the slot's `Drop`, which would
                // take the lock again; the loop hands it on.
                slot.slots = None;
                self.release(&namespace);
            }
        }
    }

    /// Removes the waiter `ticket` of `namespace`, if it is still queued.
    fn leave(&mut self, namespace: &str, ticket: u64) {
        let Some(queue) = self.queues.get_mut(namespace) else {
            return;
        };
        let Some(place) = queue.iter().position(|w| w.ticket == ticket) else {
            return;
        };
        queue.remove(place);
        self.queued -= 1;
        if queue.is_empty() {
            self.queues.remove(namespace);
            self.turns.retain(|n| n != namespace);
        }
    }
}

/// One mount's slot, given back (and handed to the next waiter in turn) when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    /// `None` once given back without the `Drop` (see [`State::serve`]).
    slots: Option<Arc<Slots>>,
    namespace: String,
}

impl Slot {
    fn new(slots: &Arc<Slots>, namespace: &str) -> Self {
        Self {
            slots: Some(slots.clone()),
            namespace: namespace.to_owned(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            let mut state = slots.lock();
            state.release(&self.namespace);
            state.serve(&slots);
        }
    }
}

/// A mount's place in its namespace's queue. Dropped before a slot is granted (its
/// deadline passed, or its caller went away), it leaves the queue; a slot granted in the
/// meantime is in its receiver and is given back when that drops, after the place is
/// removed and the lock released.
#[derive(Debug)]
pub(super) struct Queued {
    slots: Arc<Slots>,
    namespace: String,
    ticket: u64,
    granted: oneshot::Receiver<Slot>,
    since: Instant,
    /// How the wait ended; `None` while waiting, and if the caller drops it (cancelled).
    outcome: Option<WaitOutcome>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl Queued {
    /// Tells `observer` how and after how long the wait ends.
    pub(super) fn observed_by(mut self, observer: Option<Arc<dyn MountObserver>>) -> Self {
        self.observer = observer;
        self
    }

    /// The slot, once granted, or how long the mount waited before `deadline` passed.
    pub(super) async fn wait(mut self, deadline: Instant) -> Result<Slot, Duration> {
        match tokio::time::timeout_at(deadline, &mut self.granted).await {
            Ok(Ok(slot)) => {
                self.outcome = Some(WaitOutcome::Admitted);
                Ok(slot)
            }
            // The sender is dropped unsent only when the place is removed, which is this
            // value's own `Drop`: not reached while it waits; read as the deadline.
            Ok(Err(_)) | Err(_) => {
                self.outcome = Some(WaitOutcome::DeadlineExceeded);
                Err(self.since.elapsed())
            }
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or(WaitOutcome::Cancelled);
        if outcome != WaitOutcome::Admitted {
            // The guard is a temporary: the lock is released before `granted` (and a slot
            // in it) is dropped after this function.
            self.slots.lock().leave(&self.namespace, self.ticket);
        }
        if let Some(observer) = &self.observer {
            observer.mount_dequeued(outcome, self.since.elapsed());
        }
    }
}
