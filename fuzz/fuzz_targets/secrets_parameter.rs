//! A SecretProviderClass's attributes, arbitrary, through `MountParameters::parse_within`
//! (the mount's first step): no panic, an error message of at most `MAX_MESSAGE_BYTES`, the
//! entry and file limits held by what it accepts, the peak heap within `K × input + C`, and
//! the stack within 256 KiB (templates nested, checked before anything renders).
//!
//! The input: the `secrets` YAML, then, each after a NUL byte, `authType`, `vaultId`,
//! `region`, `failoverRegion`, `failoverVaultId`, `authSecretName`, the pod's namespace
//! and its service account. One not given takes the value of a valid workload class; one
//! given empty is left out. Bytes that are not UTF-8 are replaced (the driver sends JSON).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use oci_csi_fuzz::{check_message, parts, show, within_heap_bound};
use provider::{MountParameters, ParseLimits};

/// The attributes after `secrets`, in input order, and their values when not given.
const ATTRIBUTES: [(&str, &str); 6] = [
    ("authType", "workload"),
    ("vaultId", "ocid1.vault.oc1..v"),
    ("region", ""),
    ("failoverRegion", ""),
    ("failoverVaultId", ""),
    ("authSecretName", ""),
];

fuzz_target!(|data: &[u8]| {
    let mut given = parts(data);
    let mut attributes = BTreeMap::new();
    let keys = std::iter::once(("secrets", "")).chain(ATTRIBUTES);
    for (key, default) in keys {
        let value = given.next().unwrap_or_else(|| default.to_owned());
        if !value.is_empty() {
            attributes.insert(key.to_owned(), value);
        }
    }
    let mut pod_field = |default: &str| {
        Some(given.next().unwrap_or_else(|| default.to_owned())).filter(|v| !v.is_empty())
    };
    let pod = csi_grpc::Pod {
        namespace: pod_field("app"),
        service_account: pod_field("web"),
        name: Some("web-0".to_owned()),
        uid: Some("uid".to_owned()),
    };
    let limits = ParseLimits::default();
    // On a thread of 256 KiB, the stack a worker has to spare for a parse: a template (or
    // a document) nested past its bound overflows it, a crash libFuzzer keeps.
    let checked = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn_scoped(scope, || {
                within_heap_bound("secrets parameter", data.len(), || {
                    MountParameters::parse_within(&attributes, &pod, limits)
                        .map_err(|e| e.to_string())
                })
            })
            .expect("a parse thread starts")
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    show("secrets parameter", || match &checked {
        Ok(p) => format!(
            "{} secrets, {} certificates",
            p.secrets().len(),
            p.certificates().len()
        ),
        Err(message) => message.clone(),
    });
    match checked {
        Ok(params) => {
            let entries = params.entries.len();
            assert!(entries <= limits.max_secrets, "{entries} entries accepted");
            let files = params
                .entries
                .iter()
                .map(|e| e.files().len())
                .sum::<usize>();
            assert!(files <= limits.max_files, "{files} files accepted");
        }
        Err(message) => check_message("secrets parameter", &message),
    }
});
