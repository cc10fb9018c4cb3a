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
}

/// The parsed document: JSON first, then YAML, unless `format` forces one.
pub(crate) fn parse(content: &[u8], format: Option<Format>) -> Result<Value, ExtractError> {
    let json = || {
        serde_json::from_slice::<Value>(content).map_err(|e| {
            let kind = match e.classify() {
                serde_json::error::Category::Eof => "unexpected end",
                serde_json::error::Category::Syntax => "syntax error",
                serde_json::error::Category::Data => "data error",
                serde_json::error::Category::Io => "read error",
            };
            format!("JSON {kind} at line {}, column {}", e.line(), e.column())
        })
    };
    let yaml = || {
        let text = std::str::from_utf8(content)
            .map_err(|e| format!("YAML: not UTF-8 at byte {}", e.valid_up_to()))?;
        serde_saphyr::from_str::<Value>(text).map_err(|e| match e.location() {
            Some(at) => format!("YAML error at line {}, column {}", at.line(), at.column()),
            None => "YAML error".to_owned(),
        })
    };
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

/// The bytes of one key: a string as it is, anything else as compact JSON.
pub(crate) fn value_of(document: &Value, key: &str) -> Result<Vec<u8>, ExtractError> {
    let found = if key.starts_with('/') {
        document.pointer(key)
    } else {
        document.as_object().and_then(|o| o.get(key))
    };
    match found {
        Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
        Some(other) => serde_json::to_vec(other).map_err(|_| ExtractError::Missing),
        None => Err(ExtractError::Missing),
    }
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
        assert_eq!(value_of(&doc, "/db/password").unwrap(), b"p");
        assert_eq!(value_of(&doc, "/db/port").unwrap(), b"5432");
        assert_eq!(
            value_of(&doc, "db").unwrap(),
            br#"{"password":"p","port":5432}"#
        );
        assert_eq!(value_of(&doc, "a.b").unwrap(), b"dotted");
        assert!(matches!(value_of(&doc, "nope"), Err(ExtractError::Missing)));
        let yaml = parse(b"user: admin\nlist: [1, 2]\n", None).unwrap();
        assert_eq!(value_of(&yaml, "user").unwrap(), b"admin");
        assert_eq!(value_of(&yaml, "list").unwrap(), b"[1,2]");
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
