//! What the adapter costs per request: `cargo bench -p h2-authority`.
//!
//! Replays a connection of grpc-go-like requests (the socket path as `:authority`, indexed
//! from the dynamic table after the first request, a 2 KiB DATA frame each) through
//! `RewriteAuthority` in memory and through a plain reader, and prints the time per
//! request of each and their difference. No framework: a timing loop, best of five.
#![allow(clippy::print_stdout)] // reason: a benchmark reporting its numbers

use std::time::{Duration, Instant};

use h2_authority::RewriteAuthority;
use tokio::io::AsyncReadExt;

const REQUESTS: usize = 20_000;

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

fn connection() -> Vec<u8> {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut bytes, 0x4, 0, 0, &[]);
    let data = vec![7u8; 2048];
    for i in 0..REQUESTS {
        let mut block = vec![0x83, 0x86, 0x04];
        string(&mut block, b"/v1alpha1.CSIDriverProvider/Mount");
        if i == 0 {
            block.push(0x41);
            string(&mut block, b"/var/run/secrets-store-csi-providers/oci.sock");
            block.push(0x40);
            string(&mut block, b"user-agent");
            string(&mut block, b"grpc-go/1.56.3");
            block.push(0x40);
            string(&mut block, b"content-type");
            string(&mut block, b"application/grpc");
            block.push(0x40);
            string(&mut block, b"te");
            string(&mut block, b"trailers");
            block.push(0x40);
            string(&mut block, b"grpc-timeout");
            string(&mut block, b"119999m");
        } else {
            block.extend_from_slice(&[0x80 | 66, 0x80 | 65, 0x80 | 64, 0x80 | 63, 0x80 | 62]);
        }
        let stream = 1 + 2 * i as u32;
        frame(&mut bytes, 0x1, 0x4, stream, &block);
        frame(&mut bytes, 0x0, 0x1, stream, &data);
    }
    bytes
}

fn best_of_five(mut run: impl FnMut() -> usize) -> Duration {
    (0..5)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(run());
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let bytes = connection();
    let plain = best_of_five(|| {
        rt.block_on(async {
            let mut out = Vec::with_capacity(bytes.len());
            let mut reader = &bytes[..];
            reader.read_to_end(&mut out).await.expect("read");
            out.len()
        })
    });
    let adapted = best_of_five(|| {
        rt.block_on(async {
            let io = tokio::io::join(&bytes[..], tokio::io::sink());
            let mut adapter = RewriteAuthority::new(io);
            let mut out = Vec::with_capacity(bytes.len());
            adapter.read_to_end(&mut out).await.expect("rewrite");
            out.len()
        })
    });
    let per = |d: Duration| d.as_nanos() as f64 / REQUESTS as f64;
    println!(
        "{REQUESTS} requests ({} bytes): plain read {:.0} ns/request, through RewriteAuthority {:.0} ns/request, added {:.0} ns/request",
        bytes.len(),
        per(plain),
        per(adapted),
        per(adapted) - per(plain)
    );
}
