use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::client::TlsStream;
use tower::Service;

use crate::config::Proxy;
use crate::stats::{OpenGuard, Stats};

pub(crate) use tower::BoxError;

/// `host:port` of a URI, with the scheme's default port; `None` without scheme or host.
/// This is the key of every per-host bound, counter and trust decision.
pub fn authority_of(uri: &Uri) -> Option<String> {
    let host = uri.host()?;
    let port = uri.port_u16().or(match uri.scheme_str()? {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    })?;
    Some(format!("{host}:{port}"))
}

/// A per-host semaphore table.
#[derive(Clone, Debug)]
pub(crate) struct Permits {
    per_host: usize,
    hosts: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

impl Permits {
    pub(crate) fn new(per_host: usize) -> Self {
        Self {
            per_host: per_host.max(1),
            hosts: Arc::default(),
        }
    }

    pub(crate) fn of(&self, authority: &str) -> Arc<Semaphore> {
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        // A semaphore nobody holds a permit of, nor waits on, has every permit free: drop
        // it, so the table holds only the hosts in use now (a fresh one is the same).
        hosts.retain(|host, semaphore| host == authority || Arc::strong_count(semaphore) > 1);
        hosts
            .entry(authority.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
            .clone()
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.hosts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod permit_tests {
    use super::*;

    #[test]
    fn idle_hosts_are_forgotten_and_busy_ones_kept() {
        let permits = Permits::new(2);
        let held = permits.of("busy:443").try_acquire_owned().unwrap();
        for i in 0..1000 {
            let _ = permits
                .of(&format!("host-{i}:443"))
                .try_acquire_owned()
                .unwrap();
        }
        // Only the busy host and the last one asked for remain.
        assert_eq!(permits.tracked(), 2);
        // The busy host's permit still counts: one of two is taken.
        assert_eq!(permits.of("busy:443").available_permits(), 1);
        drop(held);
        let _ = permits.of("other:443");
        assert_eq!(permits.tracked(), 1);
    }
}

/// How to reach one authority.
#[derive(Clone, Debug)]
enum Route {
    Plain,
    Tls {
        config: Arc<ClientConfig>,
        proxy: bool,
    },
}

/// Makes connections: TCP (optionally through a CONNECT proxy), then TLS with the trust of
/// the destination. Each connection holds a per-host permit until it is closed, which is
/// what bounds open sockets per host.
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    tcp: HttpConnector,
    oci: Arc<ClientConfig>,
    dedicated: Arc<HashMap<String, Arc<ClientConfig>>>,
    plain_http: Vec<String>,
    proxy: Option<Arc<Proxy>>,
    permits: Permits,
    stats: Stats,
    connect_timeout: Duration,
}

impl Connector {
    #[allow(clippy::too_many_arguments)] // reason: internal constructor called once
    pub(crate) fn new(
        oci: Arc<ClientConfig>,
        dedicated: HashMap<String, Arc<ClientConfig>>,
        plain_http: Vec<String>,
        proxy: Option<Proxy>,
        max_connections_per_host: usize,
        connect_timeout: Duration,
        tcp_keepalive: Option<Duration>,
        stats: Stats,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_keepalive(tcp_keepalive);
        tcp.set_connect_timeout(Some(connect_timeout));
        Self {
            tcp,
            oci,
            dedicated: Arc::new(dedicated),
            plain_http,
            proxy: proxy.map(Arc::new),
            permits: Permits::new(max_connections_per_host),
            stats,
            connect_timeout,
        }
    }

    fn route(&self, uri: &Uri, authority: &str) -> Result<Route, BoxError> {
        match uri.scheme_str() {
            Some("http") if self.plain_http.iter().any(|a| a == authority) => Ok(Route::Plain),
            Some("http") => Err(format!(
                "refusing plain http to {authority}: only the instance metadata endpoint (and a \
                 trace collector configured as http://) may use http://"
            )
            .into()),
            Some("https") => Ok(match self.dedicated.get(authority) {
                Some(config) => Route::Tls {
                    config: config.clone(),
                    proxy: false,
                },
                None => Route::Tls {
                    config: self.oci.clone(),
                    proxy: !self.plain_http.iter().any(|a| a == authority)
                        && self
                            .proxy
                            .as_ref()
                            .is_some_and(|p| !uri.host().is_some_and(|h| p.bypasses(h))),
                },
            }),
            _ => Err(format!("unsupported scheme for {authority}").into()),
        }
    }

    async fn tcp(&mut self, authority: &str) -> Result<TcpStream, BoxError> {
        let uri: Uri = format!("http://{authority}").parse()?;
        std::future::poll_fn(|cx| self.tcp.poll_ready(cx)).await?;
        let io = self.tcp.call(uri).await?;
        Ok(io.into_inner())
    }

    async fn connect(mut self, uri: Uri) -> Result<Conn, BoxError> {
        let authority = authority_of(&uri).ok_or("the URI has no host")?;
        let route = self.route(&uri, &authority)?;
        // Wait for a connection slot of this host before touching the network: the permit
        // lives as long as the connection.
        let permit = self.permits.of(&authority).acquire_owned().await?;
        let connect_timeout = self.connect_timeout;
        let io = tokio::time::timeout(connect_timeout, async {
            match route {
                Route::Plain => Ok::<_, BoxError>((Io::Plain(self.tcp(&authority).await?), false)),
                Route::Tls { config, proxy } => {
                    let tcp = match (proxy, self.proxy.clone()) {
                        (true, Some(p)) => {
                            let mut tcp = self.tcp(&p.authority).await?;
                            tunnel(&mut tcp, &authority, p.basic_auth.as_deref()).await?;
                            tcp
                        }
                        _ => self.tcp(&authority).await?,
                    };
                    let host = uri.host().unwrap_or_default();
                    let name =
                        ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))?
                            .to_owned();
                    #[allow(clippy::disallowed_types)] // reason: this crate is the transport
                    let tls = tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await?;
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    Ok((Io::Tls(Box::new(tls)), h2))
                }
            }
        })
        .await
        .map_err(|_| format!("connect to {authority} timed out after {connect_timeout:?}"))??;
        let open = self.stats.opened(&authority);
        tracing::debug!(authority, h2 = io.1, "connection opened");
        Ok(Conn {
            io: TokioIo::new(io.0),
            h2: io.1,
            _permit: permit,
            _open: open,
        })
    }
}

/// Opens a CONNECT tunnel to `authority` through the proxy on `tcp`.
async fn tunnel(
    tcp: &mut TcpStream,
    authority: &str,
    basic_auth: Option<&str>,
) -> Result<(), BoxError> {
    let mut request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(credentials) = basic_auth {
        request.push_str(&format!("Proxy-Authorization: Basic {credentials}\r\n"));
    }
    request.push_str("\r\n");
    tcp.write_all(request.as_bytes()).await?;
    let mut response = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !response.ends_with(b"\r\n\r\n") {
        if response.len() > 8192 || tcp.read(&mut byte).await? == 0 {
            return Err(
                "the proxy closed the connection or sent an oversized answer to CONNECT".into(),
            );
        }
        response.push(byte[0]);
    }
    let status_line = response.split(|b| *b == b'\r').next().unwrap_or_default();
    let status = String::from_utf8_lossy(status_line);
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("the proxy refused CONNECT {authority}: {status}").into());
    }
    Ok(())
}

impl Service<Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// A socket, plain or TLS.
#[derive(Debug)]
pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// A pooled connection: the socket, its host permit and its place in the counters.
#[derive(Debug)]
pub(crate) struct Conn {
    io: TokioIo<Io>,
    h2: bool,
    _permit: OwnedSemaphorePermit,
    _open: OpenGuard,
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        let connected = Connected::new();
        if self.h2 {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}
