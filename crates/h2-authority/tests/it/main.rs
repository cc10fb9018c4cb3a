//! The adapter byte for byte: what a client writes goes in one end of an in-memory pipe,
//! what the server would read comes out of the adapter, and its header blocks are
//! decoded with a fresh HPACK decoder, as the server's would be.
// Test helpers are shared between modules of this one test binary; they are not an API.
#![allow(unreachable_pub, missing_debug_implementations)]

mod fuzz;
mod rewrite;

use std::io;

use h2_authority::{Config, RewriteAuthority};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADERS: u8 = 0x1;
pub const SETTINGS: u8 = 0x4;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// `/var/run/secrets-store-csi-providers/oci.sock`, Huffman-coded (RFC 7541 appendix B), as
/// grpc-go sends it; produced with the `hpack` Python package, whose encoding of
/// `www.example.com` matches RFC 7541 C.4.1.
pub const HUFFMAN_SOCKET_PATH: &str =
    "63b8ec62cb6a610525854a16424f6156220cb5761fb9a42d8860e432e8393aff";
pub const SOCKET_PATH: &[u8] = b"/var/run/secrets-store-csi-providers/oci.sock";

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

pub fn settings(parameters: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, value) in parameters {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &payload)
}

pub fn settings_ack() -> Vec<u8> {
    frame(SETTINGS, 0x1, 0, &[])
}

/// HPACK building blocks (RFC 7541 section 6).
pub mod hpack {
    fn integer(out: &mut Vec<u8>, value: usize, prefix: u8, first: u8) {
        let max = (1usize << prefix) - 1;
        if value < max {
            out.push(first | value as u8);
            return;
        }
        out.push(first | max as u8);
        let mut rest = value - max;
        while rest >= 128 {
            out.push((rest % 128 + 128) as u8);
            rest /= 128;
        }
        out.push(rest as u8);
    }

    fn string(out: &mut Vec<u8>, s: &[u8]) {
        integer(out, s.len(), 7, 0);
        out.extend_from_slice(s);
    }

    /// An entry of the static or dynamic table.
    pub fn indexed(out: &mut Vec<u8>, index: usize) {
        integer(out, index, 7, 0x80);
    }

    /// A literal, added to the dynamic table.
    pub fn incremental(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        out.push(0x40);
        string(out, name);
        string(out, value);
    }

    /// A literal with an indexed name, added to the dynamic table.
    pub fn incremental_indexed_name(out: &mut Vec<u8>, name_index: usize, value: &[u8]) {
        integer(out, name_index, 6, 0x40);
        string(out, value);
    }

    /// A literal without indexing.
    pub fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        out.push(0);
        string(out, name);
        string(out, value);
    }

    /// A literal never indexed, with an indexed name and a Huffman-coded value.
    pub fn never_indexed_huffman(out: &mut Vec<u8>, name_index: usize, huffman: &[u8]) {
        integer(out, name_index, 4, 0x10);
        integer(out, huffman.len(), 7, 0x80);
        out.extend_from_slice(huffman);
    }

    /// A dynamic table size update.
    pub fn size_update(out: &mut Vec<u8>, size: usize) {
        integer(out, size, 5, 0x20);
    }

    /// `:method POST`, `:scheme http`, `:path`, in grpc-go's order, and what follows
    /// `:authority`.
    pub fn request_start(out: &mut Vec<u8>, path: &[u8]) {
        indexed(out, 3); // :method POST
        indexed(out, 6); // :scheme http
        integer(out, 4, 4, 0); // :path, name from the static table
        string(out, path);
    }

    pub fn grpc_tail(out: &mut Vec<u8>) {
        literal(out, b"content-type", b"application/grpc");
        literal(out, b"te", b"trailers");
    }
}

/// One side of a connection through the adapter: `client` is what the client holds,
/// `server` what the server reads and writes.
pub struct Pipe {
    pub client: DuplexStream,
    pub server: RewriteAuthority<DuplexStream>,
}

impl Default for Pipe {
    fn default() -> Self {
        Self::with_config(&Config::default())
    }
}

impl Pipe {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_config(config: &Config) -> Self {
        let (client, server) = tokio::io::duplex(1 << 22);
        Self {
            client,
            server: RewriteAuthority::with_config(server, config),
        }
    }

    /// The client writes `bytes`, then closes its side; returns what the server reads.
    pub async fn through(mut self, bytes: &[u8]) -> io::Result<Vec<u8>> {
        self.client.write_all(bytes).await?;
        self.client.shutdown().await?;
        let mut out = Vec::new();
        self.server.read_to_end(&mut out).await?;
        Ok(out)
    }

    /// The server writes `bytes` (its SETTINGS, say); the client reads them.
    pub async fn server_writes(&mut self, bytes: &[u8]) {
        self.server.write_all(bytes).await.unwrap();
        self.server.flush().await.unwrap();
        let mut seen = vec![0; bytes.len()];
        self.client.read_exact(&mut seen).await.unwrap();
        assert_eq!(seen, bytes, "server bytes pass untouched");
    }
}

/// A frame as the server reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// Splits what the server read into the preface and frames.
pub fn parse(bytes: &[u8]) -> Vec<Frame> {
    assert!(bytes.starts_with(PREFACE), "the preface passes first");
    let mut rest = &bytes[PREFACE.len()..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        assert!(rest.len() >= 9, "a whole frame header");
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        frames.push(Frame {
            kind: rest[3],
            flags: rest[4],
            stream,
            payload: rest[9..9 + len].to_vec(),
        });
        rest = &rest[9 + len..];
    }
    frames
}

/// Header blocks as the server decodes them (one HPACK decoder for the connection),
/// checking that the adapter never adds to the server's dynamic table.
pub fn blocks(frames: &[Frame]) -> Vec<(u32, Vec<(String, String)>)> {
    let mut decoder = loona_hpack::Decoder::new();
    let mut out = Vec::new();
    let mut block: Option<(u32, Vec<u8>)> = None;
    for frame in frames {
        match frame.kind {
            HEADERS => {
                assert!(block.is_none());
                assert_eq!(frame.flags & PADDED, 0, "padding is dropped");
                let start = if frame.flags & PRIORITY != 0 { 5 } else { 0 };
                block = Some((frame.stream, frame.payload[start..].to_vec()));
            }
            CONTINUATION => {
                let (stream, bytes) = block.as_mut().expect("CONTINUATION after HEADERS");
                assert_eq!(*stream, frame.stream);
                bytes.extend_from_slice(&frame.payload);
            }
            _ => {
                assert!(
                    block.is_none(),
                    "no frame between HEADERS and its CONTINUATION"
                );
                continue;
            }
        }
        if frame.flags & END_HEADERS != 0 {
            let (stream, bytes) = block.take().unwrap();
            let headers = decoder
                .decode(&bytes)
                .unwrap()
                .into_iter()
                .map(|(n, v)| {
                    (
                        String::from_utf8_lossy(&n).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    )
                })
                .collect();
            assert!(
                only_plain_literals(&bytes),
                "the adapter writes literals without indexing only"
            );
            out.push((stream, headers));
        }
    }
    out
}

/// Whether `block` consists of literals without indexing with literal names and no
/// Huffman coding, the only representation the adapter writes.
fn only_plain_literals(mut block: &[u8]) -> bool {
    fn string(b: &[u8]) -> Option<usize> {
        let first = *b.first()?;
        if first & 0x80 != 0 {
            return None;
        }
        let (len, used) = if first & 0x7f < 0x7f {
            (usize::from(first & 0x7f), 1)
        } else {
            let mut value = 0x7f;
            let mut shift = 0;
            let mut used = 1;
            loop {
                let byte = *b.get(used)?;
                used += 1;
                value += usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            (value, used)
        };
        (b.len() >= used + len).then_some(used + len)
    }
    while !block.is_empty() {
        if block[0] != 0 {
            return false;
        }
        let Some(name) = string(&block[1..]) else {
            return false;
        };
        let Some(value) = string(&block[1 + name..]) else {
            return false;
        };
        block = &block[1 + name + value..];
    }
    true
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
