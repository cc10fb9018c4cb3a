//! HTTP/2 at the frame level against the real server: header blocks a gRPC client could
//! send, written byte by byte, over the provider's socket. grpc-go (`grpc_go.rs`) cannot
//! produce some of them (blocks larger than a frame, malformed HPACK), so they are built
//! here.

use std::path::Path;
use std::time::Duration;

use secrets_store_csi_grpc::{CsiProvider, Endpoint, Listener, MountLimits, serve};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::support::{info, start};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// `/var/run/secrets-store-csi-providers/oci.sock` Huffman-coded (see h2-authority's
/// tests for where it comes from).
const HUFFMAN_SOCKET_PATH: &str =
    "63b8ec62cb6a610525854a16424f6156220cb5761fb9a42d8860e432e8393aff";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    assert!(s.len() < 127);
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

/// `:method POST`, `:scheme http`, `:path` of Version; the authority goes after.
fn version_request_start() -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x04];
    string(&mut block, b"/v1alpha1.CSIDriverProvider/Version");
    block
}

fn grpc_tail(block: &mut Vec<u8>) {
    block.push(0);
    string(block, b"content-type");
    string(block, b"application/grpc");
    block.push(0);
    string(block, b"te");
    string(block, b"trailers");
}

fn literal_authority(value: &[u8]) -> Vec<u8> {
    let mut block = version_request_start();
    block.push(0x01); // literal without indexing, name :authority (static 1)
    string(&mut block, value);
    grpc_tail(&mut block);
    block
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// `Version` answered `v1alpha1`.
    Answered,
    Reset(u32),
    GoAway(u32),
    Closed,
}

/// A bare HTTP/2 client: the bytes it sends are exactly the test's.
struct RawClient<IO> {
    io: IO,
    decoder: loona_hpack::Decoder<'static>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> RawClient<IO> {
    async fn start(mut io: IO) -> Self {
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        io.write_all(&hello).await.unwrap();
        Self {
            io,
            decoder: loona_hpack::Decoder::new(),
        }
    }

    async fn send(&mut self, frames: &[Vec<u8>]) {
        for f in frames {
            // The server may already have closed the connection: the outcome says so.
            if self.io.write_all(f).await.is_err() {
                return;
            }
        }
    }

    async fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.io.read_exact(&mut head).await.ok()?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0; len];
        self.io.read_exact(&mut payload).await.ok()?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Some((head[3], head[4], stream, payload))
    }

    /// Sends one Version call on `stream` with the given header frames.
    async fn version(&mut self, stream: u32, header_frames: Vec<Vec<u8>>) -> Outcome {
        let mut frames = header_frames;
        // The gRPC message: uncompressed, 10 bytes, field 1 = "v1alpha1".
        let mut message = vec![0, 0, 0, 0, 10, 0x0a, 8];
        message.extend_from_slice(b"v1alpha1");
        frames.push(frame(DATA, END_STREAM, stream, &message));
        self.send(&frames).await;
        let mut body = Vec::new();
        let read = async {
            loop {
                let Some((kind, flags, id, payload)) = self.read_frame().await else {
                    return Outcome::Closed;
                };
                match kind {
                    SETTINGS if flags & 0x1 == 0 => {
                        self.send(&[frame(SETTINGS, 0x1, 0, &[])]).await;
                    }
                    GOAWAY => {
                        let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                        return Outcome::GoAway(code);
                    }
                    RST_STREAM if id == stream => {
                        return Outcome::Reset(u32::from_be_bytes(
                            payload[..4].try_into().unwrap(),
                        ));
                    }
                    DATA if id == stream => body.extend_from_slice(&payload),
                    HEADERS if id == stream => {
                        let headers = self.decoder.decode(&payload).unwrap();
                        if flags & END_STREAM != 0 {
                            let ok = headers
                                .iter()
                                .any(|(n, v)| n == b"grpc-status" && v == b"0");
                            assert!(ok, "grpc-status 0 in {headers:?}");
                            let answered = body.windows(8).any(|w| w == b"v1alpha1");
                            assert!(answered, "a VersionResponse");
                            return Outcome::Answered;
                        }
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the server answers or closes within 10 s")
    }
}

async fn unix_client(path: &Path) -> RawClient<tokio::net::UnixStream> {
    RawClient::start(tokio::net::UnixStream::connect(path).await.unwrap()).await
}

fn server() -> crate::support::Running {
    let inner = tower::service_fn(|_req: secrets_store_csi_grpc::MountRequest| async move {
        Err::<secrets_store_csi_grpc::MountResponse, _>(
            secrets_store_csi_grpc::MountError::internal("not used"),
        )
    });
    start(inner, MountLimits::default(), Duration::from_secs(1))
}

#[tokio::test]
async fn the_socket_path_percent_encoded_empty_or_no_authority_is_served() {
    let server = server();
    let path = server.path.to_str().unwrap().as_bytes().to_vec();
    let mut client = unix_client(&server.path).await;
    let mut stream = 1;
    for authority in [
        path.as_slice(),
        b"%2Fvar%2Frun%2Fsecrets-store-csi-providers%2Foci.sock",
        b"",
        b"localhost",
    ] {
        let block = literal_authority(authority);
        let outcome = client
            .version(stream, vec![frame(HEADERS, END_HEADERS, stream, &block)])
            .await;
        assert_eq!(
            outcome,
            Outcome::Answered,
            "{}",
            String::from_utf8_lossy(authority)
        );
        stream += 2;
    }
    let mut none = version_request_start();
    grpc_tail(&mut none);
    let outcome = client
        .version(stream, vec![frame(HEADERS, END_HEADERS, stream, &none)])
        .await;
    assert_eq!(outcome, Outcome::Answered, "no :authority at all");
    server.stop().await;
}

#[tokio::test]
async fn a_huffman_coded_socket_path_is_served() {
    let server = server();
    let mut client = unix_client(&server.path).await;
    let mut block = version_request_start();
    block.push(0x11); // never indexed, name :authority
    let huffman: Vec<u8> = (0..HUFFMAN_SOCKET_PATH.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&HUFFMAN_SOCKET_PATH[i..i + 2], 16).unwrap())
        .collect();
    block.push(0x80 | huffman.len() as u8);
    block.extend_from_slice(&huffman);
    grpc_tail(&mut block);
    let outcome = client
        .version(1, vec![frame(HEADERS, END_HEADERS, 1, &block)])
        .await;
    assert_eq!(outcome, Outcome::Answered);
    server.stop().await;
}

#[tokio::test]
async fn an_authority_from_the_dynamic_table_and_size_updates_are_served() {
    let server = server();
    let mut client = unix_client(&server.path).await;
    // First request: the socket path enters the dynamic table (index 62).
    let mut first = version_request_start();
    first.push(0x41); // incremental indexing, name :authority
    string(&mut first, b"/var/run/secrets-store-csi-providers/oci.sock");
    grpc_tail(&mut first);
    assert_eq!(
        client
            .version(1, vec![frame(HEADERS, END_HEADERS, 1, &first)])
            .await,
        Outcome::Answered
    );
    // Later requests refer to it.
    for stream in [3, 5, 7] {
        let mut later = version_request_start();
        later.push(0x80 | 62);
        grpc_tail(&mut later);
        assert_eq!(
            client
                .version(stream, vec![frame(HEADERS, END_HEADERS, stream, &later)])
                .await,
            Outcome::Answered
        );
    }
    // A table size update to 0 and back empties the table; the path is sent again.
    let mut updated = vec![0x20, 0x3f, 0xe1, 0x1f]; // size 0, then 4096
    updated.extend(version_request_start());
    updated.push(0x41);
    string(
        &mut updated,
        b"/var/run/secrets-store-csi-providers/oci.sock",
    );
    grpc_tail(&mut updated);
    assert_eq!(
        client
            .version(9, vec![frame(HEADERS, END_HEADERS, 9, &updated)])
            .await,
        Outcome::Answered
    );
    server.stop().await;
}

#[tokio::test]
async fn a_header_block_split_over_continuation_frames_is_served() {
    let server = server();
    let mut client = unix_client(&server.path).await;
    let block = literal_authority(server.path.to_str().unwrap().as_bytes());
    let frames = vec![
        frame(HEADERS, 0, 1, &block[..3]),
        frame(CONTINUATION, 0, 1, &block[3..40]),
        frame(CONTINUATION, 0, 1, &block[40..41]),
        frame(CONTINUATION, END_HEADERS, 1, &block[41..]),
    ];
    assert_eq!(client.version(1, frames).await, Outcome::Answered);
    server.stop().await;
}

#[tokio::test]
async fn a_malformed_or_oversized_block_closes_that_connection_only() {
    let server = server();
    let mut bystander = unix_client(&server.path).await;
    let good = literal_authority(b"/var/run/secrets-store-csi-providers/oci.sock");
    assert_eq!(
        bystander
            .version(1, vec![frame(HEADERS, END_HEADERS, 1, &good)])
            .await,
        Outcome::Answered
    );

    // Index 0 is not valid HPACK.
    let mut bad = version_request_start();
    bad.push(0x80);
    let mut client = unix_client(&server.path).await;
    let outcome = client
        .version(1, vec![frame(HEADERS, END_HEADERS, 1, &bad)])
        .await;
    assert_eq!(
        outcome,
        Outcome::Closed,
        "a broken HPACK state ends the connection"
    );

    // A header block far above the 16 KiB header list limit, in CONTINUATION frames.
    let mut client = unix_client(&server.path).await;
    let mut frames = vec![frame(HEADERS, 0, 1, &good)];
    for _ in 0..8 {
        frames.push(frame(CONTINUATION, 0, 1, &[0u8; 16_000]));
    }
    frames.push(frame(CONTINUATION, END_HEADERS, 1, &[]));
    assert_eq!(client.version(1, frames).await, Outcome::Closed);

    // The server, and the connection that behaved, go on.
    assert_eq!(
        bystander
            .version(3, vec![frame(HEADERS, END_HEADERS, 3, &good)])
            .await,
        Outcome::Answered
    );
    let mut fresh = unix_client(&server.path).await;
    assert_eq!(
        fresh
            .version(1, vec![frame(HEADERS, END_HEADERS, 1, &good)])
            .await,
        Outcome::Answered
    );
    server.stop().await;
}

#[tokio::test]
async fn stream_errors_still_come_from_the_server() {
    // A request without :path is the server's to refuse, with a stream reset as before:
    // the adapter does not turn stream errors into connection errors.
    let server = server();
    let mut client = unix_client(&server.path).await;
    let mut block = vec![0x83, 0x86, 0x01];
    string(&mut block, b"/var/run/secrets-store-csi-providers/oci.sock");
    let outcome = client
        .version(1, vec![frame(HEADERS, END_HEADERS, 1, &block)])
        .await;
    assert_eq!(outcome, Outcome::Reset(1), "PROTOCOL_ERROR");
    let good = literal_authority(b"/x.sock");
    assert_eq!(
        client
            .version(3, vec![frame(HEADERS, END_HEADERS, 3, &good)])
            .await,
        Outcome::Answered
    );
    server.stop().await;
}

#[tokio::test]
async fn tcp_gets_the_same_treatment() {
    let listener = Listener::bind(&Endpoint::Tcp("127.0.0.1:0".parse().unwrap()), 0o600).unwrap();
    let Endpoint::Tcp(addr) = listener.local_endpoint() else {
        unreachable!()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let inner = tower::service_fn(|_req: secrets_store_csi_grpc::MountRequest| async move {
        Err::<secrets_store_csi_grpc::MountResponse, _>(
            secrets_store_csi_grpc::MountError::internal("not used"),
        )
    });
    let provider = CsiProvider::new(inner, info(), MountLimits::default());
    let done = tokio::spawn(serve(
        listener,
        provider,
        async move {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
    ));
    let mut client = RawClient::start(tokio::net::TcpStream::connect(addr).await.unwrap()).await;
    let block = literal_authority(b"/var/run/secrets-store-csi-providers/oci.sock");
    assert_eq!(
        client
            .version(1, vec![frame(HEADERS, END_HEADERS, 1, &block)])
            .await,
        Outcome::Answered
    );
    drop(client);
    let _ = stop.send(());
    done.await.unwrap().unwrap();
}
