//! Serve HTTP/2 (gRPC) on a Unix socket to clients that send a socket path as `:authority`.
//!
//! grpc-go, dialling a Unix socket without `WithAuthority`, sends the socket path
//! (`/var/run/app.sock`) as `:authority`; grpc-core clients (Python, C++, Ruby) send it
//! percent-encoded; others send an empty value. The `h2` crate, under hyper and tonic,
//! validates `:authority` as a URI authority and resets every such stream with
//! `PROTOCOL_ERROR`, so these clients cannot talk to a Rust server at all, and no `h2`,
//! hyper or tonic setting turns the check off.
//!
//! [`RewriteAuthority`] wraps the server's side of a connection (any `AsyncRead +
//! AsyncWrite`) and fixes the requests on their way in:
//!
//! - server-to-client bytes pass untouched; the server's SETTINGS are read as they pass,
//!   and take effect when the client acknowledges them, as they do for the server;
//! - a connection whose first request already carries the configured authority
//!   (`localhost`: grpc-go with `WithAuthority`, drivers since v1.6) passes untouched from
//!   then on, its header blocks neither decoded nor re-encoded;
//! - otherwise client-to-server frames pass untouched, except HEADERS and CONTINUATION: their
//!   header block is decoded with one HPACK decoder per connection (dynamic table, Huffman,
//!   table size updates, blocks split over CONTINUATION frames), and re-encoded as literals
//!   that never touch the server's dynamic table, with `:authority` replaced by `localhost`
//!   (inserted when a request has none), then split again to the server's maximum frame
//!   size. Trailers are re-encoded unchanged.
//! - A malformed frame sequence or HPACK block, a header block larger than the server's
//!   header list limit, or a decoded header list above that limit fails the connection
//!   (the read returns [`std::io::ErrorKind::InvalidData`] wrapping a [`RewriteError`]);
//!   nothing panics, and no more than one header block is buffered.
//! - A connection that does not start with the HTTP/2 preface is passed through as is.
//!
//! With tonic (feature `tonic`), wrap each accepted stream:
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn example(router: tonic::transport::server::Router) -> Result<(), Box<dyn std::error::Error>> {
//! use futures_util::StreamExt;
//! use h2_authority::RewriteAuthority;
//!
//! let listener = tokio::net::UnixListener::bind("/run/app.sock")?;
//! let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener)
//!     .map(|stream| stream.map(RewriteAuthority::new));
//! router.serve_with_incoming(incoming).await?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

mod frame;
mod reader;
mod settings;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use reader::RewriteError;

/// What the adapter writes and how much it accepts.
#[derive(Clone, Debug)]
pub struct Config {
    authority: Bytes,
    max_header_list_size: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            authority: Bytes::from_static(b"localhost"),
            // hyper's (and so tonic's) default SETTINGS_MAX_HEADER_LIST_SIZE.
            max_header_list_size: 16 * 1024,
        }
    }
}

impl Config {
    /// `localhost` as the authority; 16 KiB of header list until the server advertises
    /// its own limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `:authority` every request gets (default `localhost`). It must be a valid URI
    /// authority, or the server will refuse the requests as before.
    pub fn authority(mut self, authority: &str) -> Self {
        self.authority = Bytes::copy_from_slice(authority.as_bytes());
        self
    }

    /// The header list limit (RFC 9113 6.5.2, name + value + 32 per field) used until the
    /// server's SETTINGS_MAX_HEADER_LIST_SIZE is in force. Set it to the server's own
    /// limit if that is not hyper's default of 16 KiB.
    pub fn max_header_list_size(mut self, bytes: u32) -> Self {
        self.max_header_list_size = bytes;
        self
    }
}

/// The server's side of one HTTP/2 connection, with every request's `:authority`
/// replaced. See the [crate documentation](crate).
#[derive(Debug)]
pub struct RewriteAuthority<IO> {
    io: IO,
    reader: reader::Reader,
    observer: settings::Observer,
}

impl<IO> RewriteAuthority<IO> {
    /// Wraps `io` with the default [`Config`].
    pub fn new(io: IO) -> Self {
        Self::with_config(io, &Config::default())
    }

    /// Wraps `io` with `config`.
    pub fn with_config(io: IO, config: &Config) -> Self {
        Self {
            io,
            reader: reader::Reader::new(config),
            observer: settings::Observer::default(),
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Gives back the wrapped connection; bytes already read and not yet handed out are
    /// lost.
    pub fn into_inner(self) -> IO {
        self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for RewriteAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Self {
            io,
            reader,
            observer,
        } = this;
        reader.poll_read(cx, buf, io, observer)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for RewriteAuthority<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.observer.observe(&buf[..written.min(buf.len())]);
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let mut left = written;
        for slice in bufs {
            if left == 0 {
                break;
            }
            let n = left.min(slice.len());
            this.observer.observe(&slice[..n]);
            left -= n;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(feature = "tonic")]
impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for RewriteAuthority<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
