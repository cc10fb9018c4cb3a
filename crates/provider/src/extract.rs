//! `keys`: files made from the top-level keys or JSON Pointers of a JSON or YAML secret.
//!
//! Parse failures are reported by position and kind only: serde's and the YAML parser's
//! messages quote the offending text, which is secret content.

use csi_grpc::{FileMode, FilePath};
use serde_json::Value;

/// How a secret's content is parsed for `keys` (`format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// JSON.
    Json,
    /// YAML (1.2, with the same alias and size budgets as the `secrets` parameter).
    Yaml,
}

/// One `keys` item: which value, written where, with which mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    /// A top-level key taken literally, or an RFC 6901 JSON Pointer when it starts with `/`.
    pub key: String,
    /// Where the value is written.
    pub path: FilePath,
    /// Its mode; `None`: the entry's, else the request's.
    pub mode: Option<FileMode>,
}

impl KeySpec {
    /// The file name a key gets when `fileName` is not given: the key itself, or the
    /// pointer's last segment, unescaped (`~1` is `/`, `~0` is `~`).
    pub fn default_file_name(key: &str) -> String {
        match key.strip_prefix('/') {
            Some(pointer) => pointer
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .replace("~1", "/")
                .replace("~0", "~"),
            None => key.to_owned(),
        }
    }
}

/// Why content could not be used; never holds content.
#[derive(Debug)]
pub(crate) enum ExtractError {
    /// Not JSON (or not YAML, as forced or tried).
    Parse(String),
    /// The key is absent.
    Missing,
    /// The value is larger than the room left in the mount.
    TooLarge,
}

/// What a parsed document may hold at most, per byte of content: the budget's bounds
/// (expanded text at most twice the content, a node per byte) times what a
/// `serde_json::Value` node costs, as measured by the peak-heap tests
/// (`crates/provider/tests/heap`). A parse reserves this many bytes per byte of content from
/// the byte budget while it lasts.
pub(crate) const PARSE_BYTES_PER_BYTE: usize = 48;

/// The budget of one parse of `content_len` bytes: its aliases expand it to twice its
/// size at most, 32 levels deep.
fn budget(content_len: usize) -> bounded::ParseBudget {
    bounded::ParseBudget::new(content_len)
}

/// The parsed document: JSON first, then YAML, unless `format` forces one; both within
/// the content's [`budget`]. Errors give the position and kind only.
pub(crate) fn parse(content: &[u8], format: Option<Format>) -> Result<Value, ExtractError> {
    parse_as(content, format)
}

/// [`parse`] into any document type (a template's reads parse straight into its values,
/// without a `serde_json::Value` alongside).
pub(crate) fn parse_as<T: serde::de::DeserializeOwned>(
    content: &[u8],
    format: Option<Format>,
) -> Result<T, ExtractError> {
    let budget = budget(content.len());
    let json = || bounded::json::from_slice::<T>(content, &budget).map_err(|e| e.to_string());
    let yaml = || bounded::yaml::from_slice::<T>(content, &budget).map_err(|e| e.to_string());
    match format {
        Some(Format::Json) => json().map_err(ExtractError::Parse),
        Some(Format::Yaml) => yaml().map_err(ExtractError::Parse),
        None => json().or_else(|json_error| {
            yaml().map_err(|yaml_error| {
                ExtractError::Parse(format!(
                    "neither JSON ({json_error}) nor YAML ({yaml_error})"
                ))
            })
        }),
    }
}

/// The bytes of one key: a string as it is, anything else as compact JSON; refused
/// (`TooLarge`) before anything past `room` bytes is copied.
pub(crate) fn value_of(document: &Value, key: &str, room: usize) -> Result<Vec<u8>, ExtractError> {
    let found = if key.starts_with('/') {
        document.pointer(key)
    } else {
        document.as_object().and_then(|o| o.get(key))
    };
    match found {
        Some(Value::String(s)) if s.len() > room => Err(ExtractError::TooLarge),
        Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
        Some(other) => {
            let mut out = Bounded {
                bytes: Vec::new(),
                room,
            };
            match serde_json::to_writer(&mut out, other) {
                Ok(()) => Ok(out.bytes),
                Err(e) if e.is_io() => Err(ExtractError::TooLarge),
                Err(_) => Err(ExtractError::Missing),
            }
        }
        None => Err(ExtractError::Missing),
    }
}

/// A writer that fails rather than grow past `room` bytes.
struct Bounded {
    bytes: Vec<u8>,
    room: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.room {
            return Err(std::io::Error::other("past the mount's size limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Wipes the strings of a parsed secret (keys and values) and drops it: serde_json's
/// numbers and the parsers' intermediate buffers are out of reach.
pub(crate) fn wipe(mut document: Value) {
    use zeroize::Zeroize as _;
    fn walk(value: &mut Value) {
        match value {
            Value::String(s) => s.zeroize(),
            Value::Array(items) => items.iter_mut().for_each(walk),
            Value::Object(map) => {
                for (_, v) in map.iter_mut() {
                    walk(v);
                }
                // The keys are secret content too; a map's keys cannot be changed in place.
                for (mut key, _) in std::mem::take(map) {
                    key.zeroize();
                }
            }
            _ => {}
        }
    }
    walk(&mut document);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_then_yaml_and_values_as_written() {
        let doc = parse(
            br#"{"db": {"password": "p", "port": 5432}, "a.b": "dotted"}"#,
            None,
        )
        .unwrap();
        assert_eq!(value_of(&doc, "/db/password", usize::MAX).unwrap(), b"p");
        assert_eq!(value_of(&doc, "/db/port", usize::MAX).unwrap(), b"5432");
        assert_eq!(
            value_of(&doc, "db", usize::MAX).unwrap(),
            br#"{"password":"p","port":5432}"#
        );
        assert_eq!(value_of(&doc, "a.b", usize::MAX).unwrap(), b"dotted");
        assert!(matches!(
            value_of(&doc, "nope", usize::MAX),
            Err(ExtractError::Missing)
        ));
        let yaml = parse(b"user: admin\nlist: [1, 2]\n", None).unwrap();
        assert_eq!(value_of(&yaml, "user", usize::MAX).unwrap(), b"admin");
        assert_eq!(value_of(&yaml, "list", usize::MAX).unwrap(), b"[1,2]");
        // Nothing past the room is copied: strings are measured, other values written
        // through a bounded writer.
        assert!(matches!(
            value_of(&yaml, "user", 4),
            Err(ExtractError::TooLarge)
        ));
        assert_eq!(value_of(&yaml, "user", 5).unwrap(), b"admin");
        assert!(matches!(
            value_of(&yaml, "list", 4),
            Err(ExtractError::TooLarge)
        ));
    }

    #[test]
    fn parse_errors_give_positions_never_content() {
        let Err(ExtractError::Parse(m)) = parse(b"{\"pw\": \"hunter2\"", Some(Format::Json)) else {
            panic!()
        };
        assert!(m.contains("line 1") && !m.contains("hunter2"), "{m}");
        let Err(ExtractError::Parse(m)) = parse(b"key: [hunter2\n", Some(Format::Yaml)) else {
            panic!()
        };
        assert!(m.contains("YAML") && !m.contains("hunter2"), "{m}");
        // An alias bomb in a secret is refused by the parse budget, not expanded.
        let mut bomb = "a: &a [\"lol\", \"lol\", \"lol\", \"lol\"]\n".to_owned();
        for level in 1..8 {
            let previous = format!(
                "*a{}",
                if level == 1 {
                    String::new()
                } else {
                    (level - 1).to_string()
                }
            );
            bomb.push_str(&format!(
                "a{level}: &a{level} [{}]\n",
                vec![previous; 10].join(", ")
            ));
        }
        let Err(ExtractError::Parse(m)) = parse(bomb.as_bytes(), Some(Format::Yaml)) else {
            panic!()
        };
        assert!(m.contains("refused by the parse budget"), "{m}");
        let Err(ExtractError::Parse(m)) = parse(b"a: [\"hunter2\"\n{", None) else {
            panic!()
        };
        assert!(m.contains("neither JSON") && !m.contains("hunter2"), "{m}");
    }

    #[test]
    fn default_file_names_unescape_the_last_pointer_segment() {
        assert_eq!(KeySpec::default_file_name("/db/pass~1word"), "pass/word");
        assert_eq!(KeySpec::default_file_name("/a/b~0c"), "b~c");
        assert_eq!(KeySpec::default_file_name("top.key"), "top.key");
    }
}
