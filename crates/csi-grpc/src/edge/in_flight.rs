use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use super::BoxMount;
use crate::error::{ErrorKind, MountError};
use crate::request::MountRequest;
use crate::response::MountResponse;
use crate::server::{MountLimits, MountObserver};

/// Bounds the mounts in flight on the node (`max_in_flight`), and the mounts of one
/// namespace while the other namespaces may need the slots (`max_in_flight_per_namespace`):
/// past either, a mount is refused at once with ResourceExhausted (the driver retries) and
/// told to the observer as shed. A namespace past its share still takes a slot while that
/// many stay free, so the share binds only when another namespace may need the slots.
///
/// The slots are shared by every service this layer makes (and their clones): build the
/// layer once per process.
#[derive(Clone, Debug)]
pub struct InFlightLimitLayer {
    slots: Arc<Slots>,
    observer: Option<Arc<dyn MountObserver>>,
}

#[derive(Debug)]
struct Slots {
    max: usize,
    per_namespace: usize,
    in_flight: Arc<Semaphore>,
    namespaces: Arc<NamespaceSlots>,
}

impl InFlightLimitLayer {
    /// The bounds of `limits` (`max_in_flight`, `max_in_flight_per_namespace`).
    pub fn new(limits: &MountLimits) -> Self {
        let max = limits.max_in_flight.max(1);
        Self {
            slots: Arc::new(Slots {
                max,
                per_namespace: limits.max_in_flight_per_namespace.max(1),
                in_flight: Arc::new(Semaphore::new(max)),
                namespaces: Arc::default(),
            }),
            observer: None,
        }
    }

    /// Tells `observer` of every mount shed.
    pub fn with_observer(mut self, observer: Arc<dyn MountObserver>) -> Self {
        self.observer = Some(observer);
        self
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;

    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit {
            inner,
            slots: self.slots.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service of [`InFlightLimitLayer`].
#[derive(Clone, Debug)]
pub struct InFlightLimit<S> {
    inner: S,
    slots: Arc<Slots>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl<S> InFlightLimit<S> {
    fn shed(&self, message: String) -> BoxMount {
        if let Some(observer) = &self.observer {
            observer.mount_shed();
        }
        Box::pin(std::future::ready(Err(MountError::new(
            ErrorKind::ResourceExhausted,
            message,
        ))))
    }

    /// A slot for the mount, or the message of its refusal.
    fn admit(&self, namespace: &str) -> Result<(OwnedSemaphorePermit, NamespaceSlot), String> {
        let slots = &self.slots;
        let permit = slots.in_flight.clone().try_acquire_owned().map_err(|_| {
            format!(
                "too many mounts in flight on this node (limit {}); the driver will retry",
                slots.max
            )
        })?;
        let in_use = slots.max - slots.in_flight.available_permits();
        let slot = slots
            .namespaces
            .try_take(namespace, slots.per_namespace, in_use, slots.max)
            .ok_or_else(|| {
                format!(
                    "namespace {namespace:?} has {} or more mounts in flight on this node, \
                     past its share (server.max_in_flight_per_namespace) while other \
                     namespaces need the slots left; the driver will retry",
                    slots.per_namespace
                )
            })?;
        Ok((permit, slot))
    }
}

impl<S> Service<MountRequest> for InFlightLimit<S>
where
    S: Service<MountRequest, Response = MountResponse, Error = MountError>,
    S::Future: Send + 'static,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = BoxMount;

    // Readiness is per request: a mount past the bounds is refused at once rather than
    // queued (the driver retries; a queue would hold its deadline), and whether it fits
    // depends on its namespace. So readiness is the inner service's, and `call` admits.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: MountRequest) -> BoxMount {
        let namespace = request.pod.namespace.as_deref().unwrap_or("");
        let (permit, slot) = match self.admit(namespace) {
            Ok(admitted) => admitted,
            Err(message) => return self.shed(message),
        };
        let mount = self.inner.call(request);
        Box::pin(async move {
            let _held = (permit, slot);
            mount.await
        })
    }
}

/// Mounts in flight per namespace; a namespace with none has no entry.
#[derive(Debug, Default)]
struct NamespaceSlots {
    held: Mutex<HashMap<String, usize>>,
}

impl NamespaceSlots {
    /// A slot for `namespace`: within its `share`, or past it while `share` slots of the
    /// `total` stay free for the other namespaces (`in_use` counts this mount already).
    fn try_take(
        self: &Arc<Self>,
        namespace: &str,
        share: usize,
        in_use: usize,
        total: usize,
    ) -> Option<NamespaceSlot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(namespace.to_owned()).or_default();
        if *count >= share && in_use.saturating_add(share) > total {
            if *count == 0 {
                held.remove(namespace);
            }
            return None;
        }
        *count += 1;
        Some(NamespaceSlot {
            slots: self.clone(),
            namespace: namespace.to_owned(),
        })
    }
}

/// One mount's slot in its namespace's share, given back when dropped.
struct NamespaceSlot {
    slots: Arc<NamespaceSlots>,
    namespace: String,
}

impl Drop for NamespaceSlot {
    fn drop(&mut self) {
        let mut held = self
            .slots
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.namespace) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.namespace);
            }
        }
    }
}
