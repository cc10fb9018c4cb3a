//! A secret's answer into its files (its encoding removed, its `keys` extracted), the
//! object versions of a mount, and the mount's one size check.

use std::collections::BTreeMap;

use bounded::quote;
use csi_grpc::{ErrorKind, File, FileContents, FileMode, FilePath, MountError, ObjectVersion};

use crate::contract::MountContext;
use crate::params::{Encoding, SecretSpec};

/// A secret entry's files from its bundle: the whole secret (decoded), and its `keys`, each
/// copied only within `max_total_bytes`; a parse for keys first reserves what it may take
/// from the byte budget (in `namespace`'s share) while it runs. The bytes move from the
/// bundle's zeroizing buffer into the file's; a decoded encoding is written to a new buffer,
/// the encoded one wiped.
pub(crate) fn secret_files(
    spec: &SecretSpec,
    content: zeroize::Zeroizing<Vec<u8>>,
    mode: FileMode,
    config: &MountContext,
    namespace: &str,
) -> Result<Vec<File>, MountError> {
    let index = spec.index;
    let mut content = decode(index, spec, content)?;
    let entry_mode = spec.mode.unwrap_or(mode);
    let mut files = Vec::with_capacity(spec.keys.len() + 1);
    if !spec.keys.is_empty() {
        let _parsing = config.reserve(
            namespace,
            content
                .len()
                .saturating_mul(crate::extract::PARSE_BYTES_PER_BYTE),
            &format!("secrets[{index}]: reading its keys"),
        )?;
        extract_keys(
            index,
            spec,
            &content,
            entry_mode,
            &mut files,
            config.max_total_bytes,
        )?;
    }
    if spec.whole {
        files.push(File {
            path: spec.path.clone(),
            mode: entry_mode,
            contents: FileContents::new(std::mem::take(&mut *content)),
        });
    }
    Ok(files)
}

/// The one check of a mount's size: its files together (secrets, extracted keys,
/// certificate files) fit in one response to the driver; the error lists the largest.
pub(crate) fn check_size(files: &[File], max_total_bytes: usize) -> Result<(), MountError> {
    let total: usize = files.iter().map(|f| f.contents.len()).sum();
    if total <= max_total_bytes {
        return Ok(());
    }
    let mut sizes: Vec<(usize, &csi_grpc::FilePath)> =
        files.iter().map(|f| (f.contents.len(), &f.path)).collect();
    sizes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.as_str().cmp(b.1.as_str())));
    let listed: Vec<String> = sizes
        .iter()
        .take(20)
        .map(|(size, path)| format!("{path} ({size} bytes)"))
        .collect();
    Err(MountError::new(
        ErrorKind::ResourceExhausted,
        format!(
            "the files of this mount take {total} bytes, more than the {max_total_bytes} bytes \
             the driver accepts in one response: {}{}",
            listed.join(", "),
            if sizes.len() > listed.len() {
                ", ..."
            } else {
                ""
            }
        ),
    ))
}

/// With selections, what only the listings told: the files together stay within
/// `max_files` (each listing was bounded alone) and no selected secret's file is another's.
pub(super) fn check_selected(files: &[File], max_files: usize) -> Result<(), MountError> {
    if files.len() > max_files {
        return Err(MountError::invalid_argument(format!(
            "unable to retrieve secrets: the mount would write {} files with the secrets its \
             tag and namePrefix entries select, more than the {max_files} one mount may write \
             (server.max_files_per_mount); narrow the selections or split them over several \
             SecretProviderClasses",
            files.len()
        )));
    }
    csi_grpc::validate_file_set(files.iter().map(|f| &f.path)).map_err(|e| {
        MountError::invalid_argument(format!(
            "unable to retrieve secrets: a secret selected by tag or namePrefix would be \
             written where another entry writes: {e}; give the selection a directory"
        ))
    })
}

/// The object versions of a mount's secret entries, each `(file, secret OCID, version)`.
/// The driver keys versions by id; one OCID mounted twice (two versions, two files) would
/// collapse, so such ids carry the file path.
pub(super) fn object_versions(secrets: &[(&FilePath, &str, u64)]) -> Vec<ObjectVersion> {
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, id, _) in secrets {
        *ids.entry(id).or_default() += 1;
    }
    secrets
        .iter()
        .map(|(path, id, version)| ObjectVersion {
            id: if ids.get(id).copied().unwrap_or(0) > 1 {
                format!("{id}/{path}")
            } else {
                (*id).to_owned()
            },
            version: version.to_string(),
        })
        .collect()
}

/// The files of an entry's `keys`, at most `room` bytes in all (checked before each copy);
/// answers the bytes written. Errors name the secret and the keys, and for content that
/// does not parse only the position and kind. The parsed document is wiped as soon as the
/// keys are taken.
fn extract_keys(
    index: usize,
    spec: &SecretSpec,
    content: &[u8],
    mode: FileMode,
    files: &mut Vec<File>,
    room: usize,
) -> Result<usize, MountError> {
    use crate::extract::{ExtractError, parse, value_of, wipe};
    let secret = quote(spec.source.display());
    let document = parse(content, spec.format).map_err(|e| match e {
        ExtractError::Parse(why) => {
            let asked: Vec<String> = spec
                .keys
                .iter()
                .map(|k| quote(&k.key).to_string())
                .collect();
            MountError::invalid_argument(format!(
                "secrets[{index}] {secret}: its content cannot be read for keys [{}] \
                 (secrets[{index}].keys): {why}",
                asked.join(", ")
            ))
        }
        _ => MountError::internal("internal error: a parse without a key"),
    })?;
    let mut written = 0usize;
    let mut taken = Ok(());
    for (k, key) in spec.keys.iter().enumerate() {
        match value_of(&document, &key.key, room.saturating_sub(written)) {
            Ok(value) => {
                written += value.len();
                files.push(File {
                    path: key.path.clone(),
                    mode: key.mode.unwrap_or(mode),
                    contents: FileContents::new(value),
                });
            }
            Err(ExtractError::TooLarge) => {
                taken = Err(MountError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "secrets[{index}] {secret}: the value of key {} \
                         (secrets[{index}].keys[{k}]) would take the mount's files past the \
                         bytes the driver accepts in one response; the keys before it took \
                         {written} of the {room} bytes left",
                        quote(&key.key)
                    ),
                ));
                break;
            }
            Err(_) => {
                taken = Err(MountError::invalid_argument(format!(
                    "secrets[{index}] {secret} has no key {} (secrets[{index}].keys[{k}].key)",
                    quote(&key.key)
                )));
                break;
            }
        }
    }
    wipe(document);
    taken.map(|()| written)
}

/// The entry's `encoding` removed. Failures name the entry and the encoding, never the
/// content.
fn decode(
    index: usize,
    spec: &SecretSpec,
    content: zeroize::Zeroizing<Vec<u8>>,
) -> Result<zeroize::Zeroizing<Vec<u8>>, MountError> {
    use base64::Engine as _;
    let invalid = |why: &str| {
        MountError::invalid_argument(format!(
            "secrets[{index}] {}: its content is not valid {} (secrets[{index}].encoding): {why}",
            quote(spec.source.display()),
            spec.encoding.as_str()
        ))
    };
    match spec.encoding {
        Encoding::Utf8 => Ok(content),
        Encoding::Base64 => {
            let text: Vec<u8> = content
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            let text = zeroize::Zeroizing::new(text);
            let engine = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
            );
            engine
                .decode(text.as_slice())
                .map(zeroize::Zeroizing::new)
                .map_err(|e| match e {
                    base64::DecodeError::InvalidByte(at, _) => {
                        invalid(&format!("an invalid character at offset {at}"))
                    }
                    base64::DecodeError::InvalidLength(_) => invalid("its length is wrong"),
                    _ => invalid("it does not end as base64 does"),
                })
        }
        Encoding::Hex => {
            let digits: zeroize::Zeroizing<Vec<u8>> = zeroize::Zeroizing::new(
                content
                    .iter()
                    .copied()
                    .filter(|b| !b.is_ascii_whitespace())
                    .collect(),
            );
            if !digits.len().is_multiple_of(2) {
                return Err(invalid("it has an odd number of digits"));
            }
            let value = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
            let mut out = zeroize::Zeroizing::new(Vec::with_capacity(digits.len() / 2));
            for (at, pair) in digits.chunks_exact(2).enumerate() {
                match (value(pair[0]), value(pair[1])) {
                    (Some(high), Some(low)) => out.push(high << 4 | low),
                    _ => return Err(invalid(&format!("a non-hex digit at pair {at}"))),
                }
            }
            Ok(out)
        }
    }
}
