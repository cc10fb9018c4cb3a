//! The parameters beyond the Go provider's (`secretId`, per-entry `vaultId`,
//! `versionName`, `mode`, `encoding`): each parsed, and each invalid form refused with an
//! error naming `secrets[i].field` and the value, before any network call.

use csi_grpc::{ErrorKind, FileMode, MountError};
use oci_csi_provider::{Encoding, MountParameters, SecretSource, VersionSelector};

use crate::params::{attrs, pod};

fn parse(secrets: &str, extra: &[(&str, &str)]) -> MountParameters {
    MountParameters::parse(&attrs(secrets, extra), &pod()).unwrap()
}

fn refused(secrets: &str, extra: &[(&str, &str)], needles: &[&str]) {
    let error = MountParameters::parse(&attrs(secrets, extra), &pod())
        .map_err(MountError::from)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    for needle in needles {
        assert!(
            error.message().contains(needle),
            "{needle:?} not in {error:?}"
        );
    }
}

const SECRET_OCID: &str = "ocid1.vaultsecret.oc1.iad.amaaaaaaexample";

#[test]
fn an_entry_may_name_a_secret_by_ocid_without_any_vault() {
    let params = parse(
        &format!(
            "- secretId: {SECRET_OCID}\n- secretId: {SECRET_OCID}\n  versionNumber: 2\n  fileName: old\n"
        ),
        &[("vaultId", "")],
    );
    assert_eq!(params.vault_id, None);
    assert_eq!(
        params.secrets()[0].source,
        SecretSource::Id(SECRET_OCID.into())
    );
    // The file is named after the OCID's last segment unless fileName says.
    assert_eq!(params.secrets()[0].path.as_str(), "amaaaaaaexample");
    assert_eq!(params.secrets()[1].path.as_str(), "old");
}

#[test]
fn secret_ids_and_names_are_exclusive_and_checked() {
    refused(
        &format!("- name: db\n  secretId: {SECRET_OCID}\n"),
        &[],
        &["secrets[0]", "both name \"db\" and secretId", SECRET_OCID],
    );
    refused(
        "- secretId: ocid1.vault.oc1..notasecret\n",
        &[],
        &[
            "secrets[0].secretId",
            "ocid1.vault.oc1..notasecret",
            "ocid1.vaultsecret.",
        ],
    );
    refused(
        &format!("- secretId: {SECRET_OCID}\n  vaultId: ocid1.vault.oc1..v\n"),
        &[],
        &["secrets[0].vaultId", "applies to name entries only"],
    );
    refused(
        "- fileName: x\n",
        &[],
        &["secrets[0].name is empty", "secretId"],
    );
}

#[test]
fn an_entry_vault_overrides_the_class_vault_which_is_then_optional() {
    let params = parse(
        "- name: a\n  vaultId: ocid1.vault.oc1..one\n- name: b\n",
        &[],
    );
    let vaults: Vec<_> = params
        .secrets()
        .iter()
        .map(|s| match &s.source {
            SecretSource::Name { vault_id, .. } => vault_id.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        vaults,
        ["ocid1.vault.oc1..one", "ocid1.vault.oc1.iad.example"]
    );
    parse(
        "- name: a\n  vaultId: ocid1.vault.oc1..one\n",
        &[("vaultId", "")],
    );
    refused(
        "- name: a\n  vaultId: ocid1.vault.oc1..one\n- name: b\n",
        &[("vaultId", "")],
        &["missed \"vaultId\"", "secrets[1] \"b\" has no vaultId"],
    );
    refused(
        "- name: a\n  vaultId: ' ocid1.vault.oc1..one'\n",
        &[],
        &["secrets[0].vaultId", "no surrounding spaces"],
    );
}

#[test]
fn version_names_are_one_of_three_selectors() {
    let params = parse("- name: a\n  versionName: blue\n", &[]);
    assert_eq!(
        params.secrets()[0].selector,
        VersionSelector::Name("blue".into())
    );
    refused(
        "- name: a\n  versionName: blue\n  stage: CURRENT\n",
        &[],
        &[
            "secrets[0]",
            "versionName \"blue\"",
            "stage CURRENT",
            "at most one of",
        ],
    );
    refused(
        "- name: a\n  versionName: blue\n  versionNumber: 3\n",
        &[],
        &["versionNumber 3"],
    );
}

#[test]
fn modes_are_quoted_octal_strings() {
    let params = parse(
        "- name: a\n  mode: \"0400\"\n- name: b\n  mode: '640'\n- name: c\n",
        &[],
    );
    let modes: Vec<_> = params
        .secrets()
        .iter()
        .map(|s| s.mode.map(FileMode::get))
        .collect();
    assert_eq!(modes, [Some(0o400), Some(0o640), None]);
    refused(
        "- name: a\n  mode: 0400\n",
        &[],
        &["secrets[0].mode", "is a YAML number: quote it", "\"0400\""],
    );
    for bad in ["\"0800\"", "\"1777\"", "\"40\"", "\"00400\"", "\"rw\""] {
        refused(
            &format!("- name: a\n  mode: {bad}\n"),
            &[],
            &["secrets[0].mode", "3 or 4 octal digits, at most 0777"],
        );
    }
}

#[test]
fn encodings_are_named() {
    let params = parse(
        "- name: a\n  encoding: base64\n- name: b\n  encoding: HEX\n- name: c\n  encoding: utf-8\n",
        &[],
    );
    let encodings: Vec<_> = params.secrets().iter().map(|s| s.encoding).collect();
    assert_eq!(encodings, [Encoding::Base64, Encoding::Hex, Encoding::Utf8]);
    refused(
        "- name: a\n  encoding: rot13\n",
        &[],
        &["secrets[0].encoding \"rot13\"", "utf-8, base64, hex"],
    );
}

#[test]
fn sub_directories_follow_the_drivers_path_rules() {
    let params = parse("- name: a\n  fileName: db/password\n", &[]);
    assert_eq!(params.secrets()[0].path.as_str(), "db/password");
    refused(
        "- name: a\n  fileName: ../x\n",
        &[],
        &["secrets[0].fileName"],
    );
    refused(
        "- name: a\n  fileName: /etc/x\n",
        &[],
        &["secrets[0].fileName"],
    );
    refused(
        "- name: a\n  fileName: a//b\n",
        &[],
        &["secrets[0].fileName"],
    );
    refused(
        "- name: a\n  fileName: db\n- name: b\n  fileName: db/password\n",
        &[],
        &["db"],
    );
}

#[test]
fn keys_name_files_and_the_whole_secret_only_with_its_own_file_name() {
    let params = parse(
        "- name: cfg\n  keys:\n  - key: user\n  - key: /db/pass~1word\n  - key: a.b\n    fileName: sub/ab\n    mode: \"0400\"\n\
         - name: both\n  fileName: both.json\n  format: json\n  keys:\n  - key: x\n",
        &[],
    );
    let cfg = &params.secrets()[0];
    assert!(!cfg.whole, "keys without fileName: no whole file");
    let files: Vec<_> = cfg
        .keys
        .iter()
        .map(|k| (k.key.as_str(), k.path.as_str(), k.mode.map(FileMode::get)))
        .collect();
    assert_eq!(
        files,
        [
            ("user", "user", None),
            ("/db/pass~1word", "pass/word", None),
            ("a.b", "sub/ab", Some(0o400))
        ]
    );
    let both = &params.secrets()[1];
    assert!(both.whole);
    assert_eq!(both.format, Some(oci_csi_provider::Format::Json));
    let all: Vec<_> = params
        .secrets()
        .iter()
        .flat_map(|s| s.files())
        .map(|p| p.as_str())
        .collect();
    assert_eq!(all, ["user", "pass/word", "sub/ab", "both.json", "x"]);
}

#[test]
fn invalid_keys_are_named() {
    refused(
        "- name: a\n  keys: []\n",
        &[],
        &["secrets[0].keys is an empty list"],
    );
    refused(
        "- name: a\n  keys:\n  - fileName: f\n",
        &[],
        &["secrets[0].keys[0].key"],
    );
    refused(
        "- name: a\n  keys:\n  - key: /x/..\n",
        &[],
        &["secrets[0].keys[0].key", "\"..\""],
    );
    refused(
        "- name: a\n  keys:\n  - key: k\n    mode: 0400\n",
        &[],
        &["secrets[0].keys[0].mode", "quote it"],
    );
    refused(
        "- name: a\n  format: toml\n  keys:\n  - key: k\n",
        &[],
        &["secrets[0].format \"toml\""],
    );
    refused(
        "- name: a\n  format: json\n",
        &[],
        &["secrets[0].format applies with keys only"],
    );
    refused(
        "- name: a\n  keys:\n  - key: k\n- name: b\n  keys:\n  - key: k\n",
        &[],
        &["secrets[0] and secrets[1].keys[0]", "\"k\""],
    );
    refused(
        "- name: a\n  keys:\n  - key: k\n    fileName: a\n- name: a\n",
        &[],
        &["\"a\""],
    );
}

#[test]
fn regions_are_ids_or_short_codes_never_hosts() {
    let params = parse(
        "- name: a\n- secretId: ocid1.vaultsecret.oc1.iad.x\n",
        &[
            ("region", "IAD"),
            ("failoverRegion", "us-phoenix-1"),
            ("failoverVaultId", "ocid1.vault.oc1.phx.r"),
        ],
    );
    assert_eq!(params.region.as_deref(), Some("iad"));
    assert_eq!(params.failover_region.as_deref(), Some("us-phoenix-1"));
    assert_eq!(
        params.secrets()[0].failover,
        Some(SecretSource::Name {
            name: "a".into(),
            vault_id: "ocid1.vault.oc1.phx.r".into()
        })
    );
    assert_eq!(
        params.secrets()[1].failover,
        Some(SecretSource::Id("ocid1.vaultsecret.oc1.iad.x".into()))
    );
    assert_eq!(parse("- name: a\n", &[]).secrets()[0].failover, None);
    for bad in [
        "secrets.example.com",
        "https://x",
        "us ashburn",
        "10.0.0.1:443",
    ] {
        refused(
            "- name: a\n",
            &[("region", bad)],
            &["parameter \"region\"", "never a host"],
        );
    }
    refused(
        "- name: a\n",
        &[("failoverRegion", "us-phoenix-1")],
        &["secrets[0] \"a\" is read by name", "failoverVaultId"],
    );
    refused(
        "- name: a\n",
        &[("failoverVaultId", "ocid1.vault.oc1.phx.r")],
        &["\"failoverVaultId\" needs \"failoverRegion\""],
    );
    refused(
        "- name: a\n  failoverVaultId: ocid1.vault.oc1.phx.r\n",
        &[],
        &["secrets[0].failoverVaultId needs"],
    );
    refused(
        "- name: a\n",
        &[
            ("region", "us-phoenix-1"),
            ("failoverRegion", "us-phoenix-1"),
            ("failoverVaultId", "ocid1.vault.oc1.phx.r"),
        ],
        &["is the primary region"],
    );
    // An entry's own replica vault.
    let params = parse(
        "- name: a\n  failoverVaultId: ocid1.vault.oc1.phx.own\n",
        &[("failoverRegion", "us-phoenix-1")],
    );
    assert_eq!(
        params.secrets()[0].failover,
        Some(SecretSource::Name {
            name: "a".into(),
            vault_id: "ocid1.vault.oc1.phx.own".into()
        })
    );
}
