//! What the fuzz targets share: the counting allocator and the memory bound of the
//! peak-heap tests (`crates/provider/tests/heap`), so that libFuzzer finds amplifications
//! as well as panics, and the bound on an error message.

use std::sync::atomic::{AtomicUsize, Ordering};

#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

/// Bytes allocated at the peak per byte of input: `K` of `crates/provider/tests/heap/main.rs`
/// (keep the two equal).
pub const K: usize = 48;
/// Bytes allocated at the peak whatever the input: `C` of the same file.
pub const C: usize = 512 * 1024;
/// The longest error message any input may get: it reaches pod events and logs.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;

/// Inputs this long or longer are reported by [`within_heap_bound`] (below, `C` dominates).
const REPORTED_FROM: usize = 4 * 1024;

/// The highest peak per byte of input seen so far (hundredths), for `FUZZ_HEAP_REPORT`.
static WORST: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` and panics, a crash for libFuzzer (which saves the input as an artifact), if
/// the bytes it allocated at its peak, above what was held before, pass `K × input + C`.
/// With `FUZZ_HEAP_REPORT` set, prints each new highest peak per byte of an input of at
/// least 4 KiB.
pub fn within_heap_bound<R>(what: &str, input: usize, f: impl FnOnce() -> R) -> R {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let result = f();
    let peak = HEAP.peak_usage().saturating_sub(before);
    let bound = K.saturating_mul(input).saturating_add(C);
    assert!(
        peak <= bound,
        "{what}: peak {peak} bytes > {K} x {input} + {C} = {bound} (an amplification)"
    );
    if input >= REPORTED_FROM && std::env::var_os("FUZZ_HEAP_REPORT").is_some() {
        let per_byte = peak * 100 / input;
        if WORST.fetch_max(per_byte, Ordering::Relaxed) < per_byte {
            eprintln!(
                "{what}: new highest peak per byte: {peak} bytes for {input} ({:.2} per byte)",
                per_byte as f64 / 100.0
            );
        }
    }
    result
}

/// Panics if `message` is longer than [`MAX_MESSAGE_BYTES`].
pub fn check_message(what: &str, message: &str) {
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "{what}: an error message of {} bytes, more than {MAX_MESSAGE_BYTES}: {}...",
        message.len(),
        message.chars().take(400).collect::<String>()
    );
}

/// With `FUZZ_SHOW` set, prints how an input ended (to check what the seeds reach:
/// `FUZZ_SHOW=1 fuzz/target/<triple>/release/<target> fuzz/corpus/<target>/*`).
pub fn show(what: &str, outcome: impl FnOnce() -> String) {
    if std::env::var_os("FUZZ_SHOW").is_some() {
        eprintln!("{what}: {}", outcome());
    }
}

/// The parts of `data` between NUL bytes, as text (bytes that are not UTF-8 replaced).
pub fn parts(data: &[u8]) -> impl Iterator<Item = String> + '_ {
    data.split(|b| *b == 0)
        .map(|part| String::from_utf8_lossy(part).into_owned())
}
