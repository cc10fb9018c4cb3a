//! Property tests over hostile input: the adapter never panics, fails only with its own
//! error, and whatever it accepts it hands on as HPACK the server can decode, with
//! `localhost` as every request's authority. `PROPTEST_CASES=100000` runs them longer.

use std::io;

use h2_authority::RewriteError;
use proptest::prelude::*;

use crate::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// Runs `bytes` through the adapter: `Ok(output)` or the adapter's error.
fn run(rt: &tokio::runtime::Runtime, bytes: &[u8]) -> Result<Vec<u8>, RewriteError> {
    rt.block_on(Pipe::new().through(bytes))
        .map_err(|e: io::Error| {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            *e.into_inner().unwrap().downcast::<RewriteError>().unwrap()
        })
}

fn valid_connection() -> Vec<u8> {
    let mut first = Vec::new();
    hpack::size_update(&mut first, 4096);
    hpack::request_start(&mut first, b"/v1alpha1.CSIDriverProvider/Mount");
    hpack::incremental_indexed_name(&mut first, 1, SOCKET_PATH);
    hpack::incremental(&mut first, b"user-agent", b"grpc-go/1.33.3");
    hpack::grpc_tail(&mut first);
    let mut later = Vec::new();
    hpack::request_start(&mut later, b"/v1alpha1.CSIDriverProvider/Version");
    hpack::indexed(&mut later, 63);
    hpack::indexed(&mut later, 62);
    hpack::grpc_tail(&mut later);
    let mut huffman = Vec::new();
    hpack::request_start(&mut huffman, b"/v1alpha1.CSIDriverProvider/Version");
    hpack::never_indexed_huffman(&mut huffman, 1, &hex(HUFFMAN_SOCKET_PATH));
    hpack::grpc_tail(&mut huffman);
    let mut bytes = PREFACE.to_vec();
    bytes.extend(settings(&[(0x4, 65_535)]));
    bytes.extend(settings_ack());
    bytes.extend(frame(HEADERS, 0, 1, &first[..10]));
    bytes.extend(frame(CONTINUATION, END_HEADERS, 1, &first[10..]));
    bytes.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\x05hello"));
    bytes.extend(frame(HEADERS, END_HEADERS, 3, &later));
    bytes.extend(frame(0x0, END_STREAM, 3, b"\0\0\0\0\0"));
    bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, &huffman));
    bytes
}

/// Checks what the adapter let through: frames parse and every header block decodes.
fn check_output(out: &[u8]) {
    if !out.starts_with(PREFACE) {
        return; // not HTTP/2: passed through raw, the server decides
    }
    let mut rest = &out[PREFACE.len()..];
    // The tail may be a partial frame (the input ended mid-frame): ignore it.
    let mut whole = Vec::new();
    while rest.len() >= 9 {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        if rest.len() < 9 + len {
            break;
        }
        whole.extend_from_slice(&rest[..9 + len]);
        rest = &rest[9 + len..];
    }
    let mut framed = PREFACE.to_vec();
    framed.extend(whole);
    let frames = parse(&framed);
    // An unfinished block at the end never reaches the server: the adapter holds it.
    for (_, headers) in blocks(&frames) {
        if !header(&headers, ":method").is_empty() {
            // Duplicates (a mutated index) are the server's to refuse; each is replaced.
            let authorities = header(&headers, ":authority");
            assert!(!authorities.is_empty());
            assert!(
                authorities.iter().all(|a| *a == "localhost"),
                "{authorities:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases, or PROPTEST_CASES

    #[test]
    fn random_bytes_after_the_preface(tail in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let rt = runtime();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(tail);
        if let Ok(out) = run(&rt, &bytes) {
            check_output(&out);
        }
    }

    #[test]
    fn random_header_blocks(block in proptest::collection::vec(any::<u8>(), 0..2048), flags in any::<u8>()) {
        let rt = runtime();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, flags | END_HEADERS, 1, &block));
        if let Ok(out) = run(&rt, &bytes) {
            check_output(&out);
        }
    }

    #[test]
    fn mutated_valid_connections(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let rt = runtime();
        let mut bytes = valid_connection();
        for (at, value) in flips {
            let i = at.index(bytes.len() - PREFACE.len()) + PREFACE.len();
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()) + 1);
        }
        if let Ok(out) = run(&rt, &bytes) {
            check_output(&out);
        }
    }
}

#[test]
fn the_valid_connection_used_for_mutations_is_valid() {
    let out = run(&runtime(), &valid_connection()).unwrap();
    let blocks = blocks(&parse(&out));
    assert_eq!(blocks.len(), 3);
    for (_, headers) in &blocks {
        assert_eq!(header(headers, ":authority"), ["localhost"]);
    }
    assert_eq!(header(&blocks[1].1, "user-agent"), ["grpc-go/1.33.3"]);
}
