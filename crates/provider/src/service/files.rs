//! What the answer of a mount checks and carries: its object versions, the files its
//! selections brought, and the mount's one size check.

use std::collections::BTreeMap;

use csi_grpc::{ErrorKind, File, FilePath, MountError, ObjectVersion};

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
