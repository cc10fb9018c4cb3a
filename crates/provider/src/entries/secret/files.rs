//! A secret's answer into its files: its encoding removed, its `keys` extracted (each parse
//! reserving what it may take from the byte budget), the bytes moved, never copied twice.

use bounded::quote;
use csi_grpc::{ErrorKind, File, FileContents, FileMode, MountError};

use super::SecretSpec;
use crate::contract::MountContext;
use crate::params::spec::Encoding;

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
