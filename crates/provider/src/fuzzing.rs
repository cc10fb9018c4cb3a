//! Entry points of the coverage-guided fuzz targets (`fuzz/`, cargo-fuzz), for code a
//! target cannot reach through the public API. Each runs the code a mount runs, not a copy.
//! Hidden from the documentation: not an API to build on.

use std::sync::Arc;

use csi_grpc::{FileMode, FilePath, MountError, MountResponse};

use crate::budget::ByteBudget;
use crate::contract::MountContext;
use crate::entries::SecretSpec;
use crate::entries::secret_files;
use crate::extract::{Format, KeySpec};
use crate::params::{Encoding, SecretSource, VersionSelector};
use crate::service::check_size;

/// The process byte budget the entry points reserve from: the default
/// `server.max_in_flight_bytes`.
const IN_FLIGHT_BYTES: usize = 32 << 20;

/// The files of one secret entry with `keys` whose bundle holds `content`, as a mount
/// makes them: the content decoded from `encoding`, parsed as `format` (JSON, then YAML,
/// when `None`) with the parse's bytes reserved from the byte budget, each key copied
/// within the default mount size, and the mount's size check.
pub fn extract_keys(
    content: &[u8],
    encoding: Encoding,
    format: Option<Format>,
    keys: Vec<KeySpec>,
) -> Result<MountResponse, MountError> {
    let path = |p: &str| FilePath::new(p).map_err(|e| MountError::internal(e.to_string()));
    let spec = SecretSpec {
        index: 0,
        source: SecretSource::Name {
            name: "s".to_owned(),
            vault_id: "ocid1.vault.oc1..v".to_owned(),
        },
        selector: VersionSelector::Stage(vault::Stage::Current),
        path: path("s")?,
        mode: None,
        encoding,
        keys,
        format,
        // As without a `fileName` of the entry's own: the keys alone are written.
        whole: false,
        failover: None,
        history: Vec::new(),
        write: true,
    };
    // The answer is held in the budget as `Budget` holds it (its weight), for a namespace
    // as a mount's is; the parse for keys reserves beside it.
    let budget = ByteBudget::new(IN_FLIGHT_BYTES);
    let _held = budget
        .try_reserve_for(&Arc::from("fuzz"), content.len())
        .map_err(|refusal| MountError::internal(refusal.to_string()))?;
    let config = MountContext {
        byte_budget: Some(budget.clone()),
        ..MountContext::default()
    };
    let mode = FileMode::new(0o644).ok_or_else(|| MountError::internal("no mode 0644"))?;
    let content = zeroize::Zeroizing::new(content.to_vec());
    let files = secret_files(&spec, content, mode, &config, "fuzz")?;
    check_size(&files, config.max_total_bytes)?;
    Ok(MountResponse {
        files,
        object_versions: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(key: &str, file: &str) -> KeySpec {
        KeySpec {
            key: key.to_owned(),
            path: FilePath::new(file).unwrap(),
            mode: None,
        }
    }

    #[test]
    fn extract_keys_writes_each_key_as_a_mount_does_and_names_a_missing_one() {
        let content = br#"{"db": {"password": "p"}, "user": "u"}"#;
        let keys = vec![key("/db/password", "pw"), key("user", "user")];
        let response = extract_keys(content, Encoding::Utf8, None, keys).unwrap();
        let files: Vec<(&str, &[u8])> = response
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.contents.as_bytes()))
            .collect();
        assert_eq!(files, [("pw", &b"p"[..]), ("user", &b"u"[..])]);
        let hex = hex_of(b"a: 1\n");
        let response =
            extract_keys(&hex, Encoding::Hex, Some(Format::Yaml), vec![key("a", "a")]).unwrap();
        assert_eq!(response.files[0].contents.as_bytes(), b"1");
        let err = extract_keys(content, Encoding::Utf8, None, vec![key("nope", "n")]).unwrap_err();
        assert!(err.message().contains("has no key \"nope\""), "{err:?}");
    }

    fn hex_of(bytes: &[u8]) -> Vec<u8> {
        bytes
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect()
    }
}
