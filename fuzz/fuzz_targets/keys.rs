//! A secret's content, arbitrary, read for `keys` as a mount reads it
//! (`oci_csi_provider::fuzzing::extract_keys`: decoding, the bounded JSON or YAML parse, each
//! key copied within the mount's room): no panic, an error message of at most
//! `MAX_MESSAGE_BYTES`, and the peak heap within `K × input + C`.
//!
//! The input: the content; or, when it holds a NUL byte, a header before the first NUL and
//! the content after it. The header's first line picks the format (its first byte: `j`
//! JSON, `y` YAML, else JSON then YAML) and the encoding (its second: `b` base64, `h` hex,
//! else as it is); each further line is a key (at most 8, of 1 to 1024 bytes as the
//! parameters accept). Without a header: JSON then YAML, as it is, and the peak-heap
//! tests' keys `a`, `/l1/0` and `0`.
#![no_main]

use csi_grpc::FilePath;
use libfuzzer_sys::fuzz_target;
use oci_csi_fuzz::{check_message, show, within_heap_bound};
use provider::{Encoding, Format, KeySpec};

/// Keys of one entry at most here (the parameters allow up to the mount's file limit).
const MAX_KEYS: usize = 8;

fuzz_target!(|data: &[u8]| {
    let (header, content) = match data.iter().position(|b| *b == 0) {
        Some(at) => (
            String::from_utf8_lossy(&data[..at]).into_owned(),
            &data[at + 1..],
        ),
        None => ("\n\na\n/l1/0\n0".to_owned(), data),
    };
    let mut lines = header.split('\n');
    let options = lines.next().unwrap_or_default().as_bytes();
    let format = match options.first() {
        Some(b'j') => Some(Format::Json),
        Some(b'y') => Some(Format::Yaml),
        _ => None,
    };
    let encoding = match options.get(1) {
        Some(b'b') => Encoding::Base64,
        Some(b'h') => Encoding::Hex,
        _ => Encoding::Utf8,
    };
    let keys: Vec<KeySpec> = lines
        .filter(|key| !key.is_empty() && key.len() <= 1024)
        .take(MAX_KEYS)
        .enumerate()
        .filter_map(|(i, key)| {
            Some(KeySpec {
                key: key.to_owned(),
                path: FilePath::new(format!("k{i}")).ok()?,
                mode: None,
            })
        })
        .collect();
    if keys.is_empty() {
        return;
    }
    let extracted = within_heap_bound("keys", data.len(), || {
        provider::fuzzing::extract_keys(content, encoding, format, keys)
            .map_err(|e| e.message().to_owned())
    });
    show("keys", || match &extracted {
        Ok(r) => format!(
            "{} files, {} bytes",
            r.files.len(),
            r.files.iter().map(|f| f.contents.len()).sum::<usize>()
        ),
        Err(message) => message.clone(),
    });
    if let Err(message) = extracted {
        check_message("keys", &message);
    }
});
