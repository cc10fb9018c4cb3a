use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

use super::BoxMount;
use crate::error::{ErrorKind, MountError};
use crate::request::MountRequest;
use crate::response::MountResponse;
use crate::server::{MountLimits, MountObserver};

mod slots;

use slots::{Admit, Bounds, FullQueue, Refusal, Slots};

/// Admits mounts to the node's slots: at most `max_in_flight` mounts in flight, and a
/// namespace past its share (`max_in_flight_per_namespace`) takes a slot only while that
/// many stay free for the other namespaces. A mount that cannot take a slot at once waits
/// for one in its namespace's queue until its [`MountRequest::deadline`] (then
/// DeadlineExceeded, naming the wait); as slots free up they go to the namespaces with
/// waiters in turn (round-robin, as Kubernetes' API Priority and Fairness queues), each to
/// its oldest waiter, the share rule still deciding whether a namespace may take one. Only
/// when a queue is full — `max_queued` waiters on the node or `max_queued_per_namespace`
/// of its namespace — is a mount refused at once with ResourceExhausted (the driver
/// retries) and told to the observer as shed.
///
/// So a pod storm of one namespace is served in full, a slot at a time as they free up,
/// while a namespace whose mounts stall can hold at most all slots but one share, and its
/// queue, never the slots the others need.
///
/// The slots and queues are shared by every service this layer makes (and their clones):
/// build the layer once per process.
#[derive(Clone, Debug)]
pub struct AdmissionLayer {
    slots: Arc<Slots>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl AdmissionLayer {
    /// The bounds of `limits` (`max_in_flight`, `max_in_flight_per_namespace`,
    /// `max_queued`, `max_queued_per_namespace`); the slots and a share are at least one.
    pub fn new(limits: &MountLimits) -> Self {
        Self {
            slots: Arc::new(Slots::new(Bounds {
                max: limits.max_in_flight.max(1),
                share: limits.max_in_flight_per_namespace.max(1),
                max_queued: limits.max_queued,
                max_queued_per_namespace: limits.max_queued_per_namespace,
            })),
            observer: None,
        }
    }

    /// Tells `observer` of every mount shed, queued and dequeued.
    pub fn with_observer(mut self, observer: Arc<dyn MountObserver>) -> Self {
        self.observer = Some(observer);
        self
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Admission<S> {
        Admission {
            inner,
            slots: self.slots.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service of [`AdmissionLayer`].
#[derive(Clone, Debug)]
pub struct Admission<S> {
    inner: S,
    slots: Arc<Slots>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl<S> Admission<S> {
    fn shed(&self, message: String) -> BoxMount {
        if let Some(observer) = &self.observer {
            observer.mount_shed();
        }
        super::exhausted(message)
    }
}

impl<S> Service<MountRequest> for Admission<S>
where
    S: Service<MountRequest, Response = MountResponse, Error = MountError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = BoxMount;

    // Readiness is the inner service's, and admission is per request, in `call`: whether a
    // mount takes a slot, waits or is shed depends on its namespace (and how long it may
    // wait on its deadline), which `poll_ready` does not see; and tonic polls readiness
    // before it reads a request, so a layer not ready until a slot frees would make every
    // namespace's mounts wait behind the one holding the slots.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: MountRequest) -> BoxMount {
        let namespace = request.pod.namespace.as_deref().unwrap_or("");
        let queued = match self.slots.admit(namespace) {
            Admit::Now(slot) => {
                let mount = self.inner.call(request);
                return Box::pin(async move {
                    let _slot = slot;
                    mount.await
                });
            }
            Admit::Refused(refusal) => {
                return self.shed(refused(namespace, refusal, self.slots.bounds()));
            }
            Admit::Wait(queued) => queued,
        };
        if let Some(observer) = &self.observer {
            observer.mount_queued();
        }
        let queued = queued.observed_by(self.observer.clone());
        // The service made ready for this mount goes with it and is called once a slot is
        // granted; a clone takes its place, to be made ready for the next request.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let bounds = self.slots.bounds();
        Box::pin(async move {
            let slot = queued
                .wait(request.deadline)
                .await
                .map_err(|waited| deadline_passed(waited, request.timeout, bounds))?;
            let mount = inner.call(request);
            let _slot = slot;
            mount.await
        })
    }
}

/// The message of a mount refused because a queue is full: why it could not take a slot,
/// and which queue bound it met, each with its setting.
fn refused(namespace: &str, refusal: Refusal, b: Bounds) -> String {
    let quoted = bounded::quote(namespace);
    let no_slot = if refusal.in_flight >= b.max {
        format!(
            "all {} slots for mounts on this node are taken (limit {}, \
             server.max_in_flight_mounts)",
            b.max, b.max
        )
    } else {
        format!(
            "namespace {quoted} has {} mounts in flight on this node, past its share of \
             {} (server.max_in_flight_per_namespace), while other namespaces may need the {} \
             slots left",
            refusal.held,
            b.share,
            b.max - refusal.in_flight
        )
    };
    let full = match refusal.full {
        FullQueue::Node => format!(
            "no place is left to wait for one (server.max_queued_mounts: {})",
            b.max_queued
        ),
        FullQueue::Namespace => format!(
            "no place is left for namespace {quoted} to wait for one \
             (server.max_queued_mounts_per_namespace: {})",
            b.max_queued_per_namespace
        ),
    };
    format!("{no_slot}, and {full}; the driver will retry")
}

/// The message of a mount whose deadline passed while it waited for a slot.
fn deadline_passed(waited: Duration, granted: Duration, b: Bounds) -> MountError {
    MountError::new(
        ErrorKind::DeadlineExceeded,
        format!(
            "mount waited {waited:?} for a slot on this node and its deadline of {granted:?} \
             passed first: the {} slots (server.max_in_flight_mounts) stayed taken, or its \
             namespace stayed past its share of {} (server.max_in_flight_per_namespace); the \
             driver will retry",
            b.max, b.share
        ),
    )
}
