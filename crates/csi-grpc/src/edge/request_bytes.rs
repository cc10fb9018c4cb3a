//! The bytes the decoded requests of the mounts in flight and waiting hold, bounded: a
//! request is at most [`crate::MAX_REQUEST_BYTES`], and by default the node admits 128
//! mounts (64 slots, 64 places to wait), so without this bound the requests alone could
//! hold 128 MiB.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use secrecy::ExposeSecret;
use tower::{Layer, Service};

use super::BoxMount;
use crate::error::MountError;
use crate::request::MountRequest;
use crate::response::MountResponse;
use crate::server::{MountLimits, MountObserver};

/// What a map entry or list element costs besides its strings (node, pointers, lengths).
const ENTRY_BYTES: usize = 64;

impl MountRequest {
    /// The bytes this decoded request holds while it is served or waits: its strings and
    /// their entries (attributes, tokens, NodePublish secrets, object versions, the pod),
    /// and the struct itself. What [`RequestBytesLayer`] counts.
    pub fn held_bytes(&self) -> usize {
        let strings = |pairs: &mut dyn Iterator<Item = (usize, usize)>| -> usize {
            pairs.map(|(k, v)| k + v + ENTRY_BYTES).sum()
        };
        let pod = [
            &self.pod.namespace,
            &self.pod.name,
            &self.pod.uid,
            &self.pod.service_account,
        ]
        .iter()
        .map(|s| s.as_ref().map_or(0, String::len))
        .sum::<usize>();
        std::mem::size_of::<Self>()
            + pod
            + strings(&mut self.attributes.iter().map(|(k, v)| (k.len(), v.len())))
            + strings(
                &mut self.service_account_tokens.iter().map(|(audience, t)| {
                    let expiration = t.expiration_timestamp.as_ref().map_or(0, String::len);
                    (audience.len(), t.token.expose_secret().len() + expiration)
                }),
            )
            + strings(
                &mut self
                    .node_publish_secrets
                    .iter()
                    .map(|(k, v)| (k.len(), v.expose_secret().len())),
            )
            + strings(
                &mut self
                    .current_object_versions
                    .iter()
                    .map(|v| (v.id.len(), v.version.len())),
            )
    }
}

/// Bounds the bytes held by the requests of the mounts in flight and waiting
/// ([`MountRequest::held_bytes`]): at most `max_request_bytes` on the node, and past
/// `max_request_bytes_per_namespace` a namespace takes more only while that share stays free
/// for the other namespaces. A mount that would take either past its bound is refused at
/// once with ResourceExhausted (waiting would not help: its request is already held) and
/// told to the observer; the driver retries. Placed outside [`crate::AdmissionLayer`], so
/// that the mounts waiting for a slot are counted.
///
/// A driver's request is a few KiB: the defaults (8 MiB, a share of 1 MiB) refuse nothing
/// but classes of hundreds of KiB mounted by many pods at once.
///
/// The count is shared by every service this layer makes (and their clones): build the
/// layer once per process.
#[derive(Clone, Debug)]
pub struct RequestBytesLayer {
    held: Arc<Held>,
    observer: Option<Arc<dyn MountObserver>>,
}

#[derive(Debug)]
struct Held {
    max: usize,
    max_per_namespace: usize,
    state: Mutex<HeldState>,
}

#[derive(Debug, Default)]
struct HeldState {
    total: usize,
    /// Bytes per namespace; a namespace holding none has no entry.
    by_namespace: HashMap<String, usize>,
}

impl RequestBytesLayer {
    /// The bounds `max_request_bytes` and `max_request_bytes_per_namespace` of `limits`.
    pub fn new(limits: &MountLimits) -> Self {
        Self {
            held: Arc::new(Held {
                max: limits.max_request_bytes,
                max_per_namespace: limits.max_request_bytes_per_namespace,
                state: Mutex::default(),
            }),
            observer: None,
        }
    }

    /// Tells `observer` of every mount refused for its request's bytes.
    pub fn with_observer(mut self, observer: Arc<dyn MountObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Bytes the requests of the mounts in flight and waiting hold now.
    pub fn held(&self) -> usize {
        self.held.lock().total
    }

    /// The layer of the HTTP requests under the gRPC server: it counts each request's body
    /// as it arrives, against this layer's node bound, until it is decoded (see
    /// [`DecodingBytesLayer`]).
    pub fn decoding(&self) -> DecodingBytesLayer {
        DecodingBytesLayer {
            held: self.held.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// Bounds the bytes of requests before tonic decodes them: each HTTP/2 request's body is
/// counted frame by frame against `server.max_request_bytes` (the bound
/// [`RequestBytesLayer`] holds the decoded requests to, shared with it) and given back when
/// the body is dropped, once decoded. A body that would pass it ends with
/// `ResourceExhausted` at once, so no number of streams on one connection (HTTP/2 allows
/// hundreds, each up to [`crate::MAX_REQUEST_BYTES`]) is buffered past the node's bound.
#[derive(Clone, Debug)]
pub struct DecodingBytesLayer {
    held: Arc<Held>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl<S> Layer<S> for DecodingBytesLayer {
    type Service = DecodingBytes<S>;

    fn layer(&self, inner: S) -> DecodingBytes<S> {
        DecodingBytes {
            inner,
            held: self.held.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service of [`DecodingBytesLayer`].
#[derive(Clone, Debug)]
pub struct DecodingBytes<S> {
    inner: S,
    held: Arc<Held>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl<S> Service<http::Request<tonic::body::Body>> for DecodingBytes<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> S::Future {
        let (parts, body) = request.into_parts();
        let counted = Counted {
            body,
            held: self.held.clone(),
            observer: self.observer.clone(),
            taken: 0,
        };
        self.inner.call(http::Request::from_parts(
            parts,
            tonic::body::Body::new(counted),
        ))
    }
}

/// A request body whose data frames are counted as they arrive.
struct Counted {
    body: tonic::body::Body,
    held: Arc<Held>,
    observer: Option<Arc<dyn MountObserver>>,
    taken: usize,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let frame = match std::pin::Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            if let Err(message) = this.held.grow(data.len()) {
                if let Some(observer) = &this.observer {
                    observer.mount_shed_for_request_bytes();
                }
                return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(message))));
            }
            this.taken += data.len();
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.held.shrink(self.taken);
    }
}

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `bytes` for `namespace`, or says which bound it would pass.
    fn take(self: &Arc<Self>, namespace: &str, bytes: usize) -> Result<Taken, String> {
        let mut state = self.lock();
        let of_namespace = state.by_namespace.get(namespace).copied().unwrap_or(0);
        if state.total.saturating_add(bytes) > self.max {
            return Err(format!(
                "this mount's request holds {bytes} bytes and the requests of the mounts in \
                 flight and waiting on this node hold {} of {} (server.max_request_bytes); \
                 the driver will retry",
                state.total, self.max
            ));
        }
        // Past its share a namespace still takes bytes while a share stays free for the
        // others (the byte budget's rule): no two namespaces fill the node.
        let past_share = of_namespace.saturating_add(bytes) > self.max_per_namespace;
        let leaves_a_share = state
            .total
            .saturating_add(bytes)
            .saturating_add(self.max_per_namespace)
            <= self.max;
        if past_share && !leaves_a_share {
            let quoted = bounded::quote(namespace);
            return Err(format!(
                "this mount's request holds {bytes} bytes and the requests of namespace \
                 {quoted} in flight and waiting on this node hold {of_namespace}, past its \
                 share of {} (server.max_request_bytes_per_namespace), while other namespaces \
                 may need the {} bytes left; the driver will retry",
                self.max_per_namespace,
                self.max - state.total
            ));
        }
        state.total += bytes;
        *state.by_namespace.entry(namespace.to_owned()).or_default() += bytes;
        Ok(Taken {
            held: self.clone(),
            namespace: namespace.to_owned(),
            bytes,
        })
    }
}

impl Held {
    /// Counts `bytes` more of a request still being decoded (its namespace is not known
    /// yet: the node's bound alone), or says it would pass it.
    fn grow(&self, bytes: usize) -> Result<(), String> {
        let mut state = self.lock();
        if state.total.saturating_add(bytes) > self.max {
            return Err(format!(
                "the requests of the mounts in flight, waiting and being read on this node \
                 hold {} of {} bytes (server.max_request_bytes); the driver will retry",
                state.total, self.max
            ));
        }
        state.total += bytes;
        Ok(())
    }

    fn shrink(&self, bytes: usize) {
        let mut state = self.lock();
        state.total = state.total.saturating_sub(bytes);
    }
}

/// Bytes counted for one mount, given back when its answer is ready or it is dropped.
#[derive(Debug)]
struct Taken {
    held: Arc<Held>,
    namespace: String,
    bytes: usize,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut state = self.held.lock();
        state.total = state.total.saturating_sub(self.bytes);
        if let Some(n) = state.by_namespace.get_mut(&self.namespace) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                state.by_namespace.remove(&self.namespace);
            }
        }
    }
}

impl<S> Layer<S> for RequestBytesLayer {
    type Service = RequestBytes<S>;

    fn layer(&self, inner: S) -> RequestBytes<S> {
        RequestBytes {
            inner,
            held: self.held.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service of [`RequestBytesLayer`].
#[derive(Clone, Debug)]
pub struct RequestBytes<S> {
    inner: S,
    held: Arc<Held>,
    observer: Option<Arc<dyn MountObserver>>,
}

impl<S> Service<MountRequest> for RequestBytes<S>
where
    S: Service<MountRequest, Response = MountResponse, Error = MountError>,
    S::Future: Send + 'static,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = BoxMount;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: MountRequest) -> BoxMount {
        let namespace = request.pod.namespace.as_deref().unwrap_or("");
        match self.held.take(namespace, request.held_bytes()) {
            Ok(taken) => {
                let mount = self.inner.call(request);
                Box::pin(async move {
                    let _taken = taken;
                    mount.await
                })
            }
            Err(message) => {
                if let Some(observer) = &self.observer {
                    observer.mount_shed_for_request_bytes();
                }
                super::exhausted(message)
            }
        }
    }
}
