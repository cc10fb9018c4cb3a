//! The `SecretBundle` response (spec 2.3), decoded and validated.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer};
use zeroize::{Zeroize as _, Zeroizing};

use crate::request::Stage;

/// Secret bytes: wiped from memory on drop, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretContent(Zeroizing<Vec<u8>>);

impl SecretContent {
    /// Wraps bytes (they are wiped when this value is dropped).
    pub fn new(bytes: Zeroizing<Vec<u8>>) -> Self {
        Self(bytes)
    }

    /// The secret bytes. Do not log them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, still zeroizing.
    pub fn into_inner(self) -> Zeroizing<Vec<u8>> {
        self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretContent(<{} bytes redacted>)", self.0.len())
    }
}

/// One version of a secret, as OCI returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretBundle {
    /// The secret OCID.
    pub secret_id: String,
    /// The version number (OCI numbers versions from 1).
    pub version_number: u64,
    /// The version name, if the version has one.
    pub version_name: Option<String>,
    /// The stages this version holds.
    pub stages: Vec<Stage>,
    /// The decoded secret bytes (redacted in `Debug`).
    pub content: SecretContent,
    /// OCI's `opc-request-id` of the successful attempt.
    pub opc_request_id: Option<String>,
}

/// Why a 200 answer could not be used. Messages never quote the body: it holds the secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MalformedBundle {
    /// The body is not the JSON object expected (reported by position only).
    #[error(
        "the body is not a SecretBundle JSON object ({category} error at line {line}, column {column})"
    )]
    Json {
        /// serde_json's error category (`syntax`, `data`, `eof`, `io`), or `budget` (nested
        /// too deep, larger than the body limit).
        category: &'static str,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// `secretId` is missing, null or empty.
    #[error("secretId is missing")]
    MissingSecretId,
    /// `versionNumber` is missing or null.
    #[error("versionNumber is missing")]
    MissingVersionNumber,
    /// `versionNumber` is zero or negative.
    #[error("versionNumber {0} is not a positive number")]
    InvalidVersionNumber(i64),
    /// `secretBundleContent` is missing or null (the Go provider: `unable to cast secret content`).
    #[error("secretBundleContent is missing")]
    MissingContent,
    /// `secretBundleContent.contentType` is not `BASE64`.
    #[error("unknown secretBundleContent.contentType {0:?}: only BASE64 is defined")]
    UnknownContentType(String),
    /// `secretBundleContent.content` is missing or null.
    #[error("secretBundleContent.content is missing")]
    MissingContentField,
    /// The content is not standard padded base64.
    #[error("secretBundleContent.content is not valid base64")]
    InvalidBase64,
    /// A field the answer must have is missing or null (Certificates API answers).
    #[error("{0} is missing")]
    MissingField(&'static str),
    /// A `stages` entry is not one of the five stages.
    #[error("unknown stage {0:?}")]
    UnknownStage(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBundle {
    #[serde(default)]
    secret_id: Option<String>,
    #[serde(default)]
    version_number: Option<i64>,
    #[serde(default)]
    version_name: Option<String>,
    #[serde(default)]
    secret_bundle_content: Option<RawContent>,
    #[serde(default)]
    stages: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawContent {
    #[serde(default)]
    content_type: Option<String>,
    // Our copy of the encoded secret is wiped on drop too; serde_json's own scratch
    // buffers are out of reach.
    #[serde(default, deserialize_with = "zeroizing_string")]
    content: Option<Zeroizing<String>>,
}

fn zeroizing_string<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Zeroizing<String>>, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.map(Zeroizing::new))
}

/// A body that is not the JSON expected, by position only (the body holds secrets).
/// An OCI answer's JSON, parsed within its own length (the transport bounded the body).
/// Failures give the kind and position, never the body (it holds secret content).
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, MalformedBundle> {
    let budget = bounded::ParseBudget::new(body.len());
    bounded::json::from_slice(body, &budget).map_err(|e| {
        let (line, column) = e.position().unwrap_or((0, 0));
        MalformedBundle::Json {
            category: match &e {
                bounded::ParseError::Invalid { kind, .. } => match *kind {
                    "syntax error" => "syntax",
                    "unexpected end of input" => "eof",
                    "read error" => "io",
                    _ => "data",
                },
                _ => "budget",
            },
            line,
            column,
        }
    })
}

/// Parses and validates a SecretBundle body.
pub(crate) fn parse(
    body: &[u8],
    opc_request_id: Option<String>,
) -> Result<SecretBundle, MalformedBundle> {
    let raw: RawBundle = from_json(body)?;
    let secret_id = raw
        .secret_id
        .filter(|id| !id.is_empty())
        .ok_or(MalformedBundle::MissingSecretId)?;
    let version_number = raw
        .version_number
        .ok_or(MalformedBundle::MissingVersionNumber)?;
    let version_number = u64::try_from(version_number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or(MalformedBundle::InvalidVersionNumber(version_number))?;
    let stages = raw
        .stages
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            s.parse::<Stage>()
                .map_err(|_| MalformedBundle::UnknownStage(s))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let content = raw
        .secret_bundle_content
        .ok_or(MalformedBundle::MissingContent)?;
    match content.content_type.as_deref() {
        Some("BASE64") => {}
        other => {
            return Err(MalformedBundle::UnknownContentType(
                other.unwrap_or("").to_owned(),
            ));
        }
    }
    let encoded = content
        .content
        .ok_or(MalformedBundle::MissingContentField)?;
    Ok(SecretBundle {
        secret_id,
        version_number,
        version_name: raw.version_name,
        stages,
        content: SecretContent(decode_base64(encoded.as_bytes())?),
        opc_request_id,
    })
}

/// Decodes standard padded base64, skipping CR and LF like Go's decoder does.
fn decode_base64(encoded: &[u8]) -> Result<Zeroizing<Vec<u8>>, MalformedBundle> {
    let mut compact = Zeroizing::new(Vec::with_capacity(encoded.len()));
    compact.extend(
        encoded
            .iter()
            .copied()
            .filter(|b| *b != b'\r' && *b != b'\n'),
    );
    // Reserving the whole estimate up front keeps the decoder from reallocating, which
    // would leave an unwiped copy of part of the secret behind.
    let mut decoded = Zeroizing::new(Vec::with_capacity(base64::decoded_len_estimate(
        compact.len(),
    )));
    if STANDARD
        .decode_vec(compact.as_slice(), &mut decoded)
        .is_err()
    {
        decoded.zeroize();
        return Err(MalformedBundle::InvalidBase64);
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(content: &str) -> String {
        format!(
            r#"{{"secretId":"ocid1.vaultsecret.oc1..s","versionNumber":2,"versionName":null,
               "timeCreated":"2020-03-18T16:51:38.851Z","metadata":null,
               "secretBundleContent":{{"contentType":"BASE64","content":"{content}"}},
               "stages":["CURRENT","LATEST"]}}"#
        )
    }

    #[test]
    fn parses_the_documented_example() {
        let bundle = parse(body("aGVsbG8h").as_bytes(), Some("rid".into())).unwrap();
        assert_eq!(bundle.secret_id, "ocid1.vaultsecret.oc1..s");
        assert_eq!(bundle.version_number, 2);
        assert_eq!(bundle.version_name, None);
        assert_eq!(bundle.stages, [Stage::Current, Stage::Latest]);
        assert_eq!(bundle.content.expose(), b"hello!");
        assert_eq!(bundle.opc_request_id.as_deref(), Some("rid"));
    }

    #[test]
    fn base64_with_line_breaks_decodes_like_go() {
        let bundle = parse(body(r"aGVs\r\nbG8h\n").as_bytes(), None).unwrap();
        assert_eq!(bundle.content.expose(), b"hello!");
    }

    #[test]
    fn debug_never_shows_the_content() {
        let bundle = parse(body("c3VwZXJzZWNyZXQ=").as_bytes(), None).unwrap();
        assert_eq!(bundle.content.expose(), b"supersecret");
        let debug = format!("{bundle:?}");
        assert!(!debug.contains("supersecret"), "{debug}");
        assert!(!debug.contains("c3VwZXJzZWNyZXQ"), "{debug}");
        assert!(debug.contains("11 bytes redacted"), "{debug}");
    }

    #[test]
    fn malformed_bodies_get_specific_errors() {
        let cases: [(String, MalformedBundle); 9] = [
            (
                r#"{"versionNumber":1,"secretBundleContent":{"contentType":"BASE64","content":""}}"#.into(),
                MalformedBundle::MissingSecretId,
            ),
            (
                r#"{"secretId":"s","secretBundleContent":{"contentType":"BASE64","content":""}}"#.into(),
                MalformedBundle::MissingVersionNumber,
            ),
            (
                r#"{"secretId":"s","versionNumber":-1,"secretBundleContent":{"contentType":"BASE64","content":""}}"#.into(),
                MalformedBundle::InvalidVersionNumber(-1),
            ),
            (
                r#"{"secretId":"s","versionNumber":1,"secretBundleContent":null}"#.into(),
                MalformedBundle::MissingContent,
            ),
            (
                r#"{"secretId":"s","versionNumber":1,"secretBundleContent":{"contentType":"TEXT","content":"x"}}"#.into(),
                MalformedBundle::UnknownContentType("TEXT".into()),
            ),
            (
                r#"{"secretId":"s","versionNumber":1,"secretBundleContent":{"contentType":"BASE64"}}"#.into(),
                MalformedBundle::MissingContentField,
            ),
            (body("not base64!"), MalformedBundle::InvalidBase64),
            (
                r#"{"secretId":"s","versionNumber":1,"stages":["current"],"secretBundleContent":{"contentType":"BASE64","content":""}}"#.into(),
                MalformedBundle::UnknownStage("current".into()),
            ),
            (
                "not json".into(),
                MalformedBundle::Json {
                    category: "syntax",
                    line: 1,
                    column: 2,
                },
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(parse(body.as_bytes(), None), Err(expected), "{body}");
        }
    }

    #[test]
    fn json_errors_do_not_quote_the_body() {
        // A wrong type for a field makes serde_json quote the value; we report position only.
        let err = parse(br#"{"secretId": 12345678, "versionNumber": 1}"#, None).unwrap_err();
        assert!(!err.to_string().contains("12345678"), "{err}");
    }
}
