use std::io;

use h2_authority::{Config, RewriteError};

use crate::*;

const PATH: &[u8] = b"/v1alpha1.CSIDriverProvider/Mount";

fn request(authority: Option<&[u8]>) -> Vec<u8> {
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    if let Some(authority) = authority {
        hpack::literal(&mut block, b":authority", authority);
    }
    hpack::grpc_tail(&mut block);
    block
}

fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(settings(&[]));
    for f in frames {
        bytes.extend_from_slice(f);
    }
    bytes
}

async fn rewritten(frames: &[Vec<u8>]) -> Vec<(u32, Vec<(String, String)>)> {
    let out = Pipe::new().through(&connection(frames)).await.unwrap();
    blocks(&parse(&out))
}

fn expected_request() -> Vec<(String, String)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1alpha1.CSIDriverProvider/Mount"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v.to_owned()))
    .collect()
}

async fn failure(pipe: Pipe, frames: &[Vec<u8>]) -> RewriteError {
    let err = pipe.through(&connection(frames)).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    err.into_inner()
        .unwrap()
        .downcast::<RewriteError>()
        .map(|e| *e)
        .unwrap()
}

#[tokio::test]
async fn a_literal_socket_path_becomes_localhost() {
    let blocks = rewritten(&[frame(HEADERS, END_HEADERS, 1, &request(Some(SOCKET_PATH)))]).await;
    assert_eq!(blocks, vec![(1, expected_request())]);
}

#[tokio::test]
async fn percent_encoded_empty_and_other_authorities_become_localhost() {
    for authority in [
        &b"%2Fvar%2Frun%2Fsecrets-store-csi-providers%2Foci.sock"[..],
        b"",
        b"provider.example:443",
    ] {
        let blocks = rewritten(&[frame(HEADERS, END_HEADERS, 1, &request(Some(authority)))]).await;
        assert_eq!(blocks, vec![(1, expected_request())], "{authority:?}");
    }
}

#[tokio::test]
async fn a_request_without_authority_gets_localhost_among_its_pseudo_headers() {
    let blocks = rewritten(&[frame(HEADERS, END_HEADERS, 1, &request(None))]).await;
    let headers = &blocks[0].1;
    assert_eq!(header(headers, ":authority"), ["localhost"]);
    // Pseudo-headers must all come before regular fields (RFC 9113 8.3).
    let first_regular = headers
        .iter()
        .position(|(n, _)| !n.starts_with(':'))
        .unwrap();
    assert!(
        headers[first_regular..]
            .iter()
            .all(|(n, _)| !n.starts_with(':'))
    );
    assert_eq!(first_regular, 4);
}

#[tokio::test]
async fn a_huffman_coded_authority_is_decoded_and_replaced() {
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    // :authority (static index 1), never indexed, Huffman: as grpc-go may send it.
    hpack::never_indexed_huffman(&mut block, 1, &hex(HUFFMAN_SOCKET_PATH));
    hpack::grpc_tail(&mut block);
    let blocks = rewritten(&[frame(HEADERS, END_HEADERS, 1, &block)]).await;
    assert_eq!(blocks, vec![(1, expected_request())]);
}

#[tokio::test]
async fn an_authority_indexed_from_the_dynamic_table_is_replaced_on_every_request() {
    // First request: grpc-go adds :authority and a custom field to the dynamic table.
    let mut first = Vec::new();
    hpack::request_start(&mut first, PATH);
    hpack::incremental_indexed_name(&mut first, 1, SOCKET_PATH);
    hpack::incremental(&mut first, b"user-agent", b"grpc-go/1.33.3");
    hpack::grpc_tail(&mut first);
    // Later requests refer to them by index: 62 is the newest entry, 63 the one before.
    let mut later = Vec::new();
    hpack::request_start(&mut later, PATH);
    hpack::indexed(&mut later, 63);
    hpack::indexed(&mut later, 62);
    hpack::grpc_tail(&mut later);
    let frames: Vec<_> = std::iter::once(frame(HEADERS, END_HEADERS, 1, &first))
        .chain((1..50).map(|i| frame(HEADERS, END_HEADERS, 1 + 2 * i, &later)))
        .collect();
    let blocks = rewritten(&frames).await;
    assert_eq!(blocks.len(), 50);
    for (i, (stream, headers)) in blocks.iter().enumerate() {
        assert_eq!(*stream, 1 + 2 * i as u32);
        assert_eq!(header(headers, ":authority"), ["localhost"]);
        assert_eq!(header(headers, "user-agent"), ["grpc-go/1.33.3"]);
    }
}

#[tokio::test]
async fn dynamic_table_size_updates_are_followed() {
    let mut first = Vec::new();
    hpack::size_update(&mut first, 4096);
    hpack::request_start(&mut first, PATH);
    hpack::incremental_indexed_name(&mut first, 1, SOCKET_PATH);
    hpack::grpc_tail(&mut first);
    // Shrinking the table to 0 evicts the entry; an index to it is then an error.
    let mut evict = Vec::new();
    hpack::size_update(&mut evict, 0);
    hpack::size_update(&mut evict, 4096);
    hpack::request_start(&mut evict, PATH);
    hpack::literal(&mut evict, b":authority", b"");
    hpack::grpc_tail(&mut evict);
    let blocks = rewritten(&[
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS, 3, &evict),
    ])
    .await;
    assert_eq!(
        blocks,
        vec![(1, expected_request()), (3, expected_request())]
    );

    let mut stale = Vec::new();
    hpack::request_start(&mut stale, PATH);
    hpack::indexed(&mut stale, 62);
    let err = failure(
        Pipe::new(),
        &[
            frame(HEADERS, END_HEADERS, 1, &first),
            frame(HEADERS, END_HEADERS, 3, &evict),
            frame(HEADERS, END_HEADERS, 5, &stale),
        ],
    )
    .await;
    assert!(
        matches!(err, RewriteError::Hpack { stream: 5, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_table_size_update_above_the_servers_setting_is_refused() {
    let mut block = Vec::new();
    hpack::size_update(&mut block, 4097);
    hpack::request_start(&mut block, PATH);
    let err = failure(Pipe::new(), &[frame(HEADERS, END_HEADERS, 1, &block)]).await;
    assert!(
        matches!(err, RewriteError::Hpack { stream: 1, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_block_split_over_continuation_frames_is_joined_and_rewritten() {
    let block = request(Some(SOCKET_PATH));
    let (a, rest) = block.split_at(7);
    let (b, c) = rest.split_at(20);
    let blocks = rewritten(&[
        frame(HEADERS, 0, 1, a),
        frame(CONTINUATION, 0, 1, b),
        frame(CONTINUATION, END_HEADERS, 1, c),
    ])
    .await;
    assert_eq!(blocks, vec![(1, expected_request())]);
}

#[tokio::test]
async fn padding_is_dropped_priority_and_end_stream_are_kept() {
    let block = request(Some(SOCKET_PATH));
    let mut payload = vec![3u8]; // pad length
    payload.extend_from_slice(&[0x80, 0, 0, 0, 41]); // exclusive dependency on 0, weight 42
    payload.extend_from_slice(&block);
    payload.extend_from_slice(&[0, 0, 0]);
    let out = Pipe::new()
        .through(&connection(&[frame(
            HEADERS,
            END_HEADERS | END_STREAM | PADDED | PRIORITY,
            1,
            &payload,
        )]))
        .await
        .unwrap();
    let frames = parse(&out);
    let headers = frames.iter().find(|f| f.kind == HEADERS).unwrap();
    assert_eq!(headers.flags, END_HEADERS | END_STREAM | PRIORITY);
    assert_eq!(&headers.payload[..5], &[0x80, 0, 0, 0, 41]);
    assert_eq!(blocks(&frames), vec![(1, expected_request())]);
}

#[tokio::test]
async fn trailers_pass_without_an_authority() {
    let mut trailers = Vec::new();
    hpack::literal(&mut trailers, b"grpc-status", b"0");
    let blocks = rewritten(&[
        frame(HEADERS, END_HEADERS, 1, &request(Some(SOCKET_PATH))),
        frame(0x0, 0, 1, b"\0\0\0\0\0"),
        frame(HEADERS, END_HEADERS | END_STREAM, 1, &trailers),
    ])
    .await;
    assert_eq!(blocks[1], (1, vec![("grpc-status".into(), "0".into())]));
}

#[tokio::test]
async fn other_frames_pass_byte_for_byte() {
    let data = frame(0x0, END_STREAM, 1, &[7; 40_000]);
    let ping = frame(0x6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let window = frame(0x8, 0, 0, &[0, 1, 0, 0]);
    let rst = frame(0x3, 0, 1, &[0, 0, 0, 8]);
    let goaway = frame(0x7, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
    let unknown = frame(0xfa, 0xff, 9, b"extension");
    let frames = [
        data.clone(),
        ping.clone(),
        window.clone(),
        rst.clone(),
        goaway.clone(),
        unknown.clone(),
    ];
    let out = Pipe::new().through(&connection(&frames)).await.unwrap();
    let mut expected = connection(&[]);
    for f in &frames {
        expected.extend_from_slice(f);
    }
    assert_eq!(out, expected);
}

#[tokio::test]
async fn a_long_block_is_split_again_at_the_servers_frame_size() {
    // 12 KiB of a custom field: one 16 KiB frame from the client, and after the server
    // lowers nothing (16 KiB is the minimum), the rewritten block still fits; with a
    // client that sends 1 KiB CONTINUATION frames the adapter still sends few frames (one
    // byte a frame would be a CONTINUATION flood, refused past 32 frames).
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    hpack::literal(&mut block, b":authority", SOCKET_PATH);
    hpack::literal(&mut block, b"x-large", &[b'a'; 15_000]);
    hpack::grpc_tail(&mut block);
    let mut frames = vec![frame(HEADERS, 0, 1, &block[..1])];
    let chunks: Vec<&[u8]> = block[1..].chunks(1024).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i == chunks.len() - 1;
        frames.push(frame(
            CONTINUATION,
            if last { END_HEADERS } else { 0 },
            1,
            chunk,
        ));
    }
    let out = Pipe::new().through(&connection(&frames)).await.unwrap();
    let parsed = parse(&out);
    let header_frames: Vec<_> = parsed
        .iter()
        .filter(|f| f.kind == HEADERS || f.kind == CONTINUATION)
        .collect();
    assert_eq!(header_frames.len(), 1, "15 KiB fits one 16 KiB frame");
    assert!(header_frames.iter().all(|f| f.payload.len() <= 16_384));
    let blocks = blocks(&parsed);
    assert_eq!(header(&blocks[0].1, "x-large")[0].len(), 15_000);
    assert_eq!(header(&blocks[0].1, ":authority"), ["localhost"]);
}

#[tokio::test]
async fn blocks_above_the_default_frame_size_are_split_into_continuations() {
    // A server that accepts larger header lists: the block no longer fits one frame.
    let config = Config::new().max_header_list_size(64 * 1024);
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    hpack::literal(&mut block, b":authority", SOCKET_PATH);
    hpack::literal(&mut block, b"x-large", &[b'b'; 40_000]);
    let mut frames = vec![frame(HEADERS, 0, 1, &block[..16_000])];
    frames.push(frame(CONTINUATION, 0, 1, &block[16_000..32_000]));
    frames.push(frame(CONTINUATION, END_HEADERS, 1, &block[32_000..]));
    let out = Pipe::with_config(&config)
        .through(&connection(&frames))
        .await
        .unwrap();
    let parsed = parse(&out);
    let kinds: Vec<_> = parsed
        .iter()
        .filter(|f| f.stream == 1)
        .map(|f| (f.kind, f.flags, f.payload.len() <= 16_384))
        .collect();
    assert_eq!(
        kinds,
        [
            (HEADERS, 0, true),
            (CONTINUATION, 0, true),
            (CONTINUATION, END_HEADERS, true)
        ]
    );
    assert_eq!(header(&blocks(&parsed)[0].1, "x-large")[0].len(), 40_000);
}

#[tokio::test]
async fn the_servers_settings_apply_once_the_client_acknowledges_them() {
    let mut pipe = Pipe::with_config(&Config::new().max_header_list_size(1 << 20));
    // The server advertises 64 KiB frames and a 100-byte header list.
    pipe.server_writes(&settings(&[(0x5, 65_536), (0x6, 100)]))
        .await;
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    hpack::literal(&mut block, b"x-large", &[b'c'; 40_000]);
    // Before the ACK the 100-byte limit is not in force, and 40 KiB goes out in
    // 16 KiB frames; after it, the same block is refused.
    let mut bytes = connection(&[]);
    bytes.extend(frame(HEADERS, 0, 1, &block[..16_000]));
    bytes.extend(frame(CONTINUATION, 0, 1, &block[16_000..32_000]));
    bytes.extend(frame(CONTINUATION, END_HEADERS, 1, &block[32_000..]));
    bytes.extend(settings_ack());
    bytes.extend(frame(HEADERS, END_HEADERS, 3, &request(Some(SOCKET_PATH))));
    let err = pipe.through(&bytes).await.unwrap_err();
    let err = *err
        .into_inner()
        .unwrap()
        .downcast::<RewriteError>()
        .unwrap();
    assert_eq!(
        err,
        RewriteError::HeaderListTooLarge {
            stream: 3,
            limit: 100
        }
    );

    // With a generous list size, the 64 KiB frame size is used after the ACK.
    let mut pipe = Pipe::with_config(&Config::new().max_header_list_size(1 << 20));
    pipe.server_writes(&settings(&[(0x5, 65_536), (0x6, 1 << 20)]))
        .await;
    let mut bytes = connection(&[]);
    bytes.extend(settings_ack());
    bytes.extend(frame(HEADERS, 0, 1, &block[..16_000]));
    bytes.extend(frame(CONTINUATION, 0, 1, &block[16_000..32_000]));
    bytes.extend(frame(CONTINUATION, END_HEADERS, 1, &block[32_000..]));
    let out = pipe.through(&bytes).await.unwrap();
    let header_frames: Vec<_> = parse(&out).into_iter().filter(|f| f.stream == 1).collect();
    assert_eq!(header_frames.len(), 1, "one 40 KiB HEADERS frame");
    assert_eq!(header_frames[0].flags, END_HEADERS);
}

#[tokio::test]
async fn an_hpack_bomb_is_refused_at_the_header_list_limit() {
    // One 4000-byte entry in the dynamic table, then 2000 one-byte references to it:
    // 8 MB of header list from a 2 KB block. Refused at 16 KiB, and never buffered.
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    hpack::incremental(&mut block, b"x-bomb", &[b'x'; 4000]);
    block.extend(std::iter::repeat_n(0xbe, 2000));
    let err = failure(Pipe::new(), &[frame(HEADERS, END_HEADERS, 1, &block)]).await;
    assert_eq!(
        err,
        RewriteError::HeaderListTooLarge {
            stream: 1,
            limit: 16 * 1024
        }
    );
}

#[tokio::test]
async fn an_oversized_header_block_is_refused_before_it_is_buffered_whole() {
    // CONTINUATION frames without end: refused once the block passes the limit.
    let mut frames = vec![frame(HEADERS, 0, 1, &[0; 16_000])];
    for _ in 0..100 {
        frames.push(frame(CONTINUATION, 0, 1, &[0; 16_000]));
    }
    let err = failure(Pipe::new(), &frames).await;
    assert_eq!(
        err,
        RewriteError::BlockTooLarge {
            stream: 1,
            limit: 16 * 1024 + 1024
        }
    );
}

#[tokio::test]
async fn a_flood_of_empty_continuation_frames_is_refused() {
    // Empty CONTINUATION frames grow no buffer, so the size limit never stops them: the
    // number of frames per block is capped, and the block up to it is still accepted.
    let block = request(Some(SOCKET_PATH));
    let mut frames = vec![frame(HEADERS, 0, 1, &block)];
    for _ in 0..31 {
        frames.push(frame(CONTINUATION, 0, 1, &[]));
    }
    frames.push(frame(CONTINUATION, END_HEADERS, 1, &[]));
    assert_eq!(rewritten(&frames).await, vec![(1, expected_request())]);
    let mut frames = vec![frame(HEADERS, 0, 1, &block)];
    for _ in 0..10_000 {
        frames.push(frame(CONTINUATION, 0, 1, &[]));
    }
    let err = failure(Pipe::new(), &frames).await;
    assert_eq!(
        err,
        RewriteError::TooManyContinuations { stream: 1, max: 32 }
    );
}

#[tokio::test]
async fn malformed_frame_sequences_are_connection_errors() {
    let block = request(Some(SOCKET_PATH));
    type Case = (Vec<Vec<u8>>, fn(&RewriteError) -> bool);
    let cases: Vec<Case> = vec![
        (
            vec![frame(HEADERS, 0, 1, &block[..5]), frame(0x6, 0, 0, &[0; 8])],
            |e| matches!(e, RewriteError::ContinuationExpected { kind: "PING", .. }),
        ),
        (
            vec![
                frame(HEADERS, 0, 1, &block[..5]),
                frame(CONTINUATION, END_HEADERS, 3, &block[5..]),
            ],
            |e| {
                matches!(
                    e,
                    RewriteError::ContinuationExpected {
                        stream: 3,
                        expected: 1,
                        ..
                    }
                )
            },
        ),
        (vec![frame(CONTINUATION, END_HEADERS, 1, &block)], |e| {
            matches!(e, RewriteError::UnexpectedContinuation { stream: 1 })
        }),
        (vec![frame(HEADERS, END_HEADERS, 0, &block)], |e| {
            matches!(e, RewriteError::MalformedHeaders { stream: 0, .. })
        }),
        (
            vec![frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 1, 2])],
            |e| matches!(e, RewriteError::MalformedHeaders { stream: 1, .. }),
        ),
        (
            vec![frame(HEADERS, END_HEADERS | PRIORITY, 1, &[1, 2])],
            |e| matches!(e, RewriteError::MalformedHeaders { stream: 1, .. }),
        ),
        (vec![frame(HEADERS, END_HEADERS, 1, &[0; 20_000])], |e| {
            matches!(
                e,
                RewriteError::FrameTooLarge {
                    len: 20_000,
                    max: 16_384,
                    ..
                }
            )
        }),
        // Index 0, an index past both tables, a truncated integer, a truncated string,
        // a size update at the end of a block, invalid Huffman padding.
        (vec![frame(HEADERS, END_HEADERS, 1, &[0x80])], |e| {
            matches!(e, RewriteError::Hpack { .. })
        }),
        (
            vec![frame(HEADERS, END_HEADERS, 1, &[0xff, 0x80, 0x01])],
            |e| matches!(e, RewriteError::Hpack { .. }),
        ),
        (
            vec![frame(
                HEADERS,
                END_HEADERS,
                1,
                &[0xff, 0xff, 0xff, 0xff, 0xff],
            )],
            |e| matches!(e, RewriteError::Hpack { .. }),
        ),
        (
            vec![frame(HEADERS, END_HEADERS, 1, &[0x00, 0x05, b'a'])],
            |e| matches!(e, RewriteError::Hpack { .. }),
        ),
        (vec![frame(HEADERS, END_HEADERS, 1, &[0x82, 0x20])], |e| {
            matches!(e, RewriteError::Hpack { .. })
        }),
        (
            vec![frame(HEADERS, END_HEADERS, 1, &[0x00, 0x81, 0x00, 0x00])],
            |e| matches!(e, RewriteError::Hpack { .. }),
        ),
    ];
    for (frames, is_expected) in cases {
        let err = failure(Pipe::new(), &frames).await;
        assert!(is_expected(&err), "{err}");
    }
}

#[tokio::test]
async fn error_messages_never_carry_a_header_value() {
    let mut block = Vec::new();
    hpack::request_start(&mut block, PATH);
    hpack::literal(&mut block, b"authorization", b"Bearer eyJsecret-token");
    block.push(0x80); // then a malformed field
    let err = failure(Pipe::new(), &[frame(HEADERS, END_HEADERS, 1, &block)]).await;
    let text = format!("{err} {err:?}");
    assert!(text.contains("stream 1"), "{text}");
    assert!(!text.contains("eyJ"), "{text}");
}

#[tokio::test]
async fn a_connection_that_is_not_http2_passes_untouched() {
    let request = b"GET / HTTP/1.1\r\nHost: /var/run/x.sock\r\n\r\n";
    let out = Pipe::new().through(request).await.unwrap();
    assert_eq!(out, request);
    // Also when the difference comes late in the preface.
    let almost = b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\nrest";
    assert_eq!(Pipe::new().through(almost).await.unwrap(), almost);
}

#[tokio::test]
async fn bytes_arriving_one_at_a_time_give_the_same_result() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bytes = connection(&[
        frame(HEADERS, 0, 1, &request(Some(SOCKET_PATH))[..9]),
        frame(
            CONTINUATION,
            END_HEADERS,
            1,
            &request(Some(SOCKET_PATH))[9..],
        ),
        frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02hi"),
    ]);
    let whole = Pipe::new().through(&bytes).await.unwrap();
    let Pipe {
        mut client,
        mut server,
    } = Pipe::new();
    let writer = tokio::spawn(async move {
        for b in bytes {
            client.write_all(&[b]).await.unwrap();
            client.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        client.shutdown().await.unwrap();
    });
    let mut out = Vec::new();
    server.read_to_end(&mut out).await.unwrap();
    writer.await.unwrap();
    assert_eq!(out, whole);
}

/// Drivers since v1.6 and the sync controller send `:authority localhost` already: their
/// connections' header blocks reach the server as they came, later requests indexing the
/// client's dynamic table included (no decoding, no re-encoding: the cached mount's path).
#[tokio::test]
async fn a_connection_whose_first_request_carries_the_authority_passes_untouched() {
    let mut first = Vec::new();
    hpack::request_start(&mut first, PATH);
    hpack::incremental_indexed_name(&mut first, 1, b"localhost");
    hpack::incremental(&mut first, b"user-agent", b"grpc-go/1.62.1");
    hpack::grpc_tail(&mut first);
    let mut later = Vec::new();
    hpack::request_start(&mut later, PATH);
    hpack::indexed(&mut later, 63);
    hpack::indexed(&mut later, 62);
    hpack::grpc_tail(&mut later);
    let frames: Vec<_> = std::iter::once(frame(HEADERS, END_HEADERS, 1, &first))
        .chain((1..20).map(|i| frame(HEADERS, END_HEADERS, 1 + 2 * i, &later)))
        .chain(std::iter::once(frame(0x0, END_STREAM, 39, b"\0\0\0\0\0")))
        .collect();
    let out = Pipe::new().through(&connection(&frames)).await.unwrap();
    assert_eq!(out, connection(&frames), "byte for byte");
    // A first request with another authority makes the connection's blocks rewritten.
    let mut other = Vec::new();
    hpack::request_start(&mut other, PATH);
    hpack::incremental_indexed_name(&mut other, 1, SOCKET_PATH);
    hpack::grpc_tail(&mut other);
    let mut again = Vec::new();
    hpack::request_start(&mut again, PATH);
    hpack::indexed(&mut again, 62);
    hpack::grpc_tail(&mut again);
    let blocks = rewritten(&[
        frame(HEADERS, END_HEADERS, 1, &other),
        frame(HEADERS, END_HEADERS, 3, &again),
    ])
    .await;
    assert_eq!(
        blocks,
        vec![(1, expected_request()), (3, expected_request())]
    );
}
