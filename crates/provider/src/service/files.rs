//! Answers into files: decoding, key extraction and the mount's size limit.

use super::*;
use bounded::quote;

/// The mount's files from its bundles, in request order: whole secrets and extracted
/// keys, each key copied only within the room left of `max_total_bytes`. A parse for keys
/// first reserves what it may take from the byte budget `held` came from (its namespace's
/// share; `None`: no process budget).
pub(crate) fn assemble(
    params: &MountParameters,
    bundles: Vec<vault::SecretBundle>,
    mode: csi_grpc::FileMode,
    max_total_bytes: usize,
    held: Option<&Reservation>,
) -> Result<MountResponse, MountError> {
    let object_versions = object_versions(params, &bundles);
    let mut files = Vec::with_capacity(bundles.len());
    // The bytes of the files so far: each extracted value is checked against the room
    // left before it is copied.
    let mut written = 0usize;
    for (spec, bundle) in params.secrets.iter().zip(bundles) {
        let index = spec.index;
        // The bytes move from the bundle's zeroizing buffer into the file's; no copy (a
        // decoded encoding is written to a new buffer, the encoded one wiped).
        let mut content = decode(index, spec, bundle.content.into_inner())?;
        let entry_mode = spec.mode.unwrap_or(mode);
        if !spec.keys.is_empty() {
            written += extract_keys(
                index,
                spec,
                &content,
                entry_mode,
                &mut files,
                max_total_bytes.saturating_sub(written),
                held,
            )?;
        }
        if spec.whole {
            written += content.len();
            files.push(File {
                path: spec.path.clone(),
                mode: entry_mode,
                contents: FileContents::new(std::mem::take(&mut *content)),
            });
        }
    }
    Ok(MountResponse {
        files,
        object_versions,
    })
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

/// The object version of each entry. The driver keys versions by id; one OCID mounted
/// twice (two versions, two files) would collapse, so such ids carry the file path.
fn object_versions(
    params: &MountParameters,
    bundles: &[vault::SecretBundle],
) -> Vec<ObjectVersion> {
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for bundle in bundles {
        *ids.entry(bundle.secret_id.as_str()).or_default() += 1;
    }
    params
        .secrets
        .iter()
        .zip(bundles)
        .map(|(spec, bundle)| ObjectVersion {
            id: if ids.get(bundle.secret_id.as_str()).copied().unwrap_or(0) > 1 {
                format!("{}/{}", bundle.secret_id, spec.path)
            } else {
                bundle.secret_id.clone()
            },
            version: bundle.version_number.to_string(),
        })
        .collect()
}

/// The files of an entry's `keys`, at most `room` bytes in all (checked before each copy);
/// answers the bytes written. Errors name the secret and the keys, and for content that
/// does not parse only the position and kind. The parsed document is wiped as soon as the
/// keys are taken.
#[allow(clippy::too_many_arguments)] // reason: the entry, its content, and where files go
pub(super) fn extract_keys(
    index: usize,
    spec: &SecretSpec,
    content: &[u8],
    mode: csi_grpc::FileMode,
    files: &mut Vec<File>,
    room: usize,
    held: Option<&Reservation>,
) -> Result<usize, MountError> {
    use crate::extract::{ExtractError, PARSE_BYTES_PER_BYTE, parse, value_of, wipe};
    let secret = quote(spec.source.display());
    // What the parse may take is held in the budget while it lasts.
    let _parsing = held
        .map(|held| held.reserve_more(content.len().saturating_mul(PARSE_BYTES_PER_BYTE)))
        .transpose()
        .map_err(|refusal| {
            MountError::new(
                ErrorKind::ResourceExhausted,
                format!("secrets[{index}] {secret}: reading its keys: {refusal}"),
            )
        })?;
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
pub(super) fn decode(
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
