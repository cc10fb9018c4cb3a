use std::collections::BTreeMap;

use csi_grpc::{ErrorKind, MountError, Pod};
use oci_csi_provider::{AuthSpec, MountParameters, Stage, VersionSelector};

pub(crate) fn pod() -> Pod {
    Pod {
        namespace: Some("app".into()),
        name: Some("web-0".into()),
        uid: Some("7d3c".into()),
        service_account: Some("web".into()),
    }
}

pub(crate) fn attrs(secrets: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = [
        ("secrets", secrets),
        ("vaultId", "ocid1.vault.oc1.iad.example"),
        ("authType", "workload"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in extra {
        if v.is_empty() && *k != "secrets" && *k != "authType" && *k != "vaultId" {
            map.remove(*k);
        } else {
            map.insert((*k).to_owned(), (*v).to_owned());
        }
    }
    map
}

fn error(secrets: &str, extra: &[(&str, &str)]) -> MountError {
    MountParameters::parse(&attrs(secrets, extra), &pod())
        .map_err(MountError::from)
        .unwrap_err()
}

#[test]
fn a_full_parameter_set_parses_to_the_typed_request() {
    let yaml = "- name: secret1\n  stage: PREVIOUS\n- name: secret2\n  versionNumber: 1\n  fileName: src-db-password\n- name: ' spaced '\n- name: quoted\n  versionNumber: \"2\"\n  fileName: '  '\n- name: sub\n  fileName: dir/file\n";
    let params = MountParameters::parse(&attrs(yaml, &[]), &pod()).unwrap();
    assert_eq!(
        params.vault_id.as_deref(),
        Some("ocid1.vault.oc1.iad.example")
    );
    assert_eq!(params.auth, AuthSpec::Workload);
    let got: Vec<_> = params
        .secrets()
        .iter()
        .map(|s| (s.source.display(), s.selector.clone(), s.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "secret1",
                VersionSelector::Stage(Stage::Previous),
                "secret1"
            ),
            ("secret2", VersionSelector::Number(1), "src-db-password"),
            (" spaced ", VersionSelector::Stage(Stage::Current), "spaced"),
            ("quoted", VersionSelector::Number(2), "quoted"),
            ("sub", VersionSelector::Stage(Stage::Current), "dir/file"),
        ]
    );
}

#[test]
fn each_auth_type_parses() {
    let one = "- name: a\n";
    let user = MountParameters::parse(
        &attrs(
            one,
            &[("authType", "user"), ("authSecretName", "oci-config")],
        ),
        &pod(),
    )
    .unwrap();
    assert_eq!(
        user.auth,
        AuthSpec::User {
            secret_name: "oci-config".into()
        }
    );
    let instance =
        MountParameters::parse(&attrs(one, &[("authType", "instance")]), &Pod::default()).unwrap();
    assert_eq!(instance.auth, AuthSpec::Instance);
}

/// Every rule: (secrets YAML, attribute overrides, fragments the message must contain).
/// An empty override value removes the attribute (except for `secrets`, `authType`, `vaultId`,
/// where it sets the empty string).
#[test]
fn every_bad_parameter_gets_invalid_argument_naming_it() {
    let one = "- name: a\n";
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        (
            "",
            vec![],
            vec!["missed content of SecretProviderClass parameter \"secrets\""],
        ),
        ("   \n", vec![], vec!["missed content"]),
        (
            "name: a\n",
            vec![],
            vec![
                "failed to unmarshal SecretProviderClass parameter \"secrets\"",
                "YAML list",
            ],
        ),
        (
            "- name: a\n  colour: blue\n",
            vec![],
            vec!["failed to unmarshal", "colour"],
        ),
        ("- [a, b]\n", vec![], vec!["failed to unmarshal"]),
        (
            "- name: a\n  stage: current\n",
            vec![],
            vec!["secrets[0].stage \"current\"", "CURRENT, PENDING"],
        ),
        (
            "- name: a\n- name: b\n  stage: NEWEST\n",
            vec![],
            vec!["secrets[1].stage \"NEWEST\""],
        ),
        (
            "- name: a\n  versionNumber: 0\n",
            vec![],
            vec!["secrets[0].versionNumber 0", "greater than 0"],
        ),
        (
            "- name: a\n  versionNumber: -3\n",
            vec![],
            vec!["secrets[0].versionNumber -3"],
        ),
        (
            "- name: a\n  versionNumber: 2.0\n",
            vec![],
            vec!["secrets[0].versionNumber 2.0"],
        ),
        (
            "- name: a\n  versionNumber: \"two\"\n",
            vec![],
            vec!["secrets[0].versionNumber \"two\""],
        ),
        (
            "- name: a\n  versionNumber: true\n",
            vec![],
            vec!["secrets[0].versionNumber true"],
        ),
        (
            "[]",
            vec![],
            vec!["requested secrets are missed", "empty list"],
        ),
        (
            "- stage: CURRENT\n",
            vec![],
            vec!["missed secret name", "secrets[0].name is empty"],
        ),
        (
            "- name: a\n- name: '  '\n",
            vec![],
            vec!["missed secret name", "secrets[1].name"],
        ),
        (
            "- name: a\n  stage: CURRENT\n  versionNumber: 2\n",
            vec![],
            vec![
                "either with a version number or with stage",
                "secrets[0]",
                "CURRENT",
                "2",
            ],
        ),
        (
            "- name: a\n- name: a\n",
            vec![],
            vec!["duplicated secret name: \"a\"", "secrets[0] and secrets[1]"],
        ),
        (
            "- name: a\n- name: b\n  fileName: a\n",
            vec![],
            vec![
                "duplicated fileName name: \"a\"",
                "secrets[0] and secrets[1]",
            ],
        ),
        (
            "- name: a\n  fileName: ../etc/passwd\n",
            vec![],
            vec!["invalid file name", "secrets[0].fileName", "\"..\" element"],
        ),
        (
            "- name: a\n  fileName: /etc/passwd\n",
            vec![],
            vec!["secrets[0].fileName", "absolute"],
        ),
        (
            "- name: a/\n",
            vec![],
            vec!["secrets[0].name", "clean form"],
        ),
        (
            "- name: ..data\n",
            vec![],
            vec!["secrets[0].name", "reserves"],
        ),
        (
            "- name: a\n- name: b\n  fileName: a/b\n",
            vec![],
            vec!["invalid file name", "also the directory of \"a/b\""],
        ),
        (
            one,
            vec![("authType", "")],
            vec!["missed \"authType\" SecretProviderClass parameters"],
        ),
        (
            one,
            vec![("authType", "Workload")],
            vec!["invalid auth principal type, \"Workload\"", "\"authType\""],
        ),
        (
            one,
            vec![("authType", "oidc")],
            vec!["invalid auth principal type, \"oidc\""],
        ),
        (
            one,
            vec![("authType", "user")],
            vec!["missed \"authSecretName\""],
        ),
        (
            one,
            vec![("authType", "user"), ("authSecretName", " ")],
            vec!["missed \"authSecretName\""],
        ),
        (one, vec![("vaultId", "")], vec!["missed \"vaultId\""]),
        (
            one,
            vec![("vaultId", " ocid1.vault ")],
            vec!["parameter \"vaultId\" \" ocid1.vault \""],
        ),
    ];
    for (yaml, extra, fragments) in cases {
        let err = error(yaml, &extra);
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidArgument,
            "{yaml:?} {extra:?}: {err}"
        );
        for fragment in fragments {
            assert!(
                err.message().contains(fragment),
                "{yaml:?} {extra:?}: {fragment:?} not in {:?}",
                err.message()
            );
        }
        assert!(
            !err.message().contains('\n'),
            "one line: {:?}",
            err.message()
        );
    }
}

#[test]
fn a_missing_secrets_parameter_is_named() {
    let mut attributes = attrs("- name: a\n", &[]);
    attributes.remove("secrets");
    let err: MountError = MountParameters::parse(&attributes, &pod())
        .unwrap_err()
        .into();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message()
            .contains("missed \"secrets\" SecretProviderClass parameters")
    );
}

#[test]
fn identities_that_need_the_pod_say_so() {
    let one = "- name: a\n";
    let no_sa = Pod {
        service_account: None,
        ..pod()
    };
    let err: MountError = MountParameters::parse(&attrs(one, &[]), &no_sa)
        .unwrap_err()
        .into();
    assert!(
        err.message()
            .contains("csi.storage.k8s.io/serviceAccount.name"),
        "{err}"
    );
    let no_ns = Pod {
        namespace: None,
        ..pod()
    };
    let err: MountError = MountParameters::parse(
        &attrs(one, &[("authType", "user"), ("authSecretName", "s")]),
        &no_ns,
    )
    .unwrap_err()
    .into();
    assert!(
        err.message().contains("csi.storage.k8s.io/pod.namespace"),
        "{err}"
    );
}

#[test]
fn certificate_entries_parse_beside_secrets_keeping_their_positions() {
    let secrets = "- name: db\n- certificateId: ocid1.certificate.oc1.iad.web\n  privateKey: true\n  versionNumber: 3\n- caBundleId: ocid1.cabundle.oc1.iad.roots\n  directory: trust/\n  chainFileName: roots.pem\n- certificateAuthorityId: ocid1.certificateauthority.oc1.iad.ca\n  stage: PENDING\n  mode: \"0444\"\n- name: api\n";
    let params = MountParameters::parse(&attrs(secrets, &[]), &pod()).unwrap();
    assert_eq!(
        params.secrets().iter().map(|s| s.index).collect::<Vec<_>>(),
        [0, 4]
    );
    let files: Vec<Vec<&str>> = params
        .certificates()
        .iter()
        .map(|c| c.files().map(|f| f.as_str()).collect())
        .collect();
    assert_eq!(
        files,
        [
            vec!["web/tls.crt", "web/ca.crt", "web/tls.key"],
            vec!["trust/roots.pem"],
            vec!["ca/ca.crt"],
        ]
    );
    let web = &params.certificates()[0];
    assert_eq!((web.index, web.private_key), (1, true));
    assert_eq!(web.selector, VersionSelector::Number(3));
    assert_eq!(
        params.certificates()[2].selector,
        VersionSelector::Stage(Stage::Pending)
    );
    assert_eq!(params.certificates()[2].mode.map(|m| m.get()), Some(0o444));
    // Without privateKey no key file.
    let params = MountParameters::parse(
        &attrs("- certificateId: ocid1.certificate.oc1.iad.web\n", &[]),
        &pod(),
    )
    .unwrap();
    assert!(params.certificates()[0].key_path.is_none());
    // `directory: .` puts them at the top (the sync controller's sourcePath has no `/`).
    let params = MountParameters::parse(
        &attrs(
            "- certificateId: ocid1.certificate.oc1.iad.web\n  privateKey: true\n  directory: .\n\
             - caBundleId: ocid1.cabundle.oc1.iad.roots\n  directory: .\n  chainFileName: roots.pem\n",
            &[],
        ),
        &pod(),
    )
    .unwrap();
    assert_eq!(
        params
            .certificates()
            .iter()
            .map(|c| c.files().map(|f| f.as_str().to_owned()).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        vec![vec!["tls.crt", "ca.crt", "tls.key"], vec!["roots.pem"]]
    );
}

#[test]
fn misplaced_certificate_fields_are_refused_naming_what_applies() {
    let cases = [
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n  encoding: base64\n",
            "secrets[0].encoding does not apply to a certificateId entry",
        ),
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n  keys: [{key: a}]\n",
            "secrets[0].keys does not apply to a certificateId entry",
        ),
        (
            "- caBundleId: ocid1.cabundle.oc1.iad.roots\n  stage: CURRENT\n",
            "secrets[0].stage does not apply to a caBundleId entry",
        ),
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n  keyFileName: k.pem\n",
            "secrets[0].keyFileName needs privateKey: true",
        ),
        (
            "- name: db\n  privateKey: true\n",
            "secrets[0].privateKey applies to certificate entries only",
        ),
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n  caBundleId: ocid1.cabundle.oc1.iad.r\n",
            "has certificateId and caBundleId: give exactly one",
        ),
        (
            "- certificateId: ocid1.cabundle.oc1.iad.r\n",
            "is not a certificate OCID: it must start with ocid1.certificate.",
        ),
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n- certificateId: ocid1.certificate.oc1.iad.web\n  versionNumber: 1\n",
            "secrets[0] and secrets[1] would both be written to file \"web/tls.crt\"",
        ),
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n  directory: ../etc\n",
            "secrets[0].certFileName",
        ),
        (
            "- certificateId: ocid1.certificate.oc1.iad.web\n  versionNumber: 1\n  stage: CURRENT\n",
            "either with a version number or with stage",
        ),
    ];
    for (secrets, text) in cases {
        let err = error(secrets, &[]);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{secrets}");
        assert!(err.message().contains(text), "{secrets}: {}", err.message());
    }
}

/// The review's payload: one scalar anchored once and aliased from every field of 256
/// entries (with 14,000 characters, ~97 KB; the default parser budget built ~65 MB of it per
/// mount).
pub(crate) fn aliased_secrets_parameter(scalar: usize) -> String {
    let mut yaml = format!("- name: &s {}\n", "x".repeat(scalar));
    for _ in 1..256 {
        yaml.push_str(
            "- {name: *s, fileName: *s, vaultId: *s, stage: *s, encoding: *s, format: *s, \
             versionName: *s, failoverVaultId: *s, directory: *s, chainFileName: *s}\n",
        );
    }
    yaml
}

#[test]
fn an_aliased_secrets_parameter_is_refused_by_its_budget_before_the_list_is_built() {
    // As the review wrote it, the scalar is longer than any field takes: refused as read.
    let yaml = aliased_secrets_parameter(14_000);
    assert!(yaml.len() < 100_000, "{}", yaml.len());
    let err = error(&yaml, &[]);
    assert!(err.message().contains("a string of 14000 bytes"), "{err}");
    // Within the field's length, the aliases are stopped by the expansion budget.
    let yaml = aliased_secrets_parameter(1_000);
    let err = error(&yaml, &[]);
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let message = err.message();
    assert!(message.contains("refused by the parse budget"), "{message}");
    assert!(message.contains("at line"), "{message}");
    // Nothing of the value is echoed.
    assert!(!message.contains("xxxxxxxx"), "{message}");
    assert!(message.len() < 1024, "{}", message.len());
}

#[test]
fn a_field_longer_than_any_field_takes_is_refused_as_it_is_read() {
    let long = "n".repeat(5_000);
    let err = error(&format!("- name: {long}\n- name: other\n"), &[]);
    let message = err.message();
    assert!(
        message.contains("a string of 5000 bytes, longer than the 1024 this field takes"),
        "{message}"
    );
    assert!(message.contains("line 1"), "{message}");
    assert!(!message.contains(&long[..200]), "{message}");
    let err = error(&format!("- name: a\n  mode: \"{long}\"\n"), &[]);
    assert!(err.message().contains("a string of 5000 bytes"), "{err}");
}

#[test]
fn every_problem_of_a_class_is_named_in_one_error() {
    // Four problems in one class: a bad region, an unquoted mode, an escaping fileName, and
    // both versionNumber and stage. Each is named, in the order of the class.
    let yaml = "- name: a\n  mode: 400\n- name: b\n  fileName: ../escape\n\
                - name: c\n  versionNumber: 2\n  stage: CURRENT\n";
    let err =
        MountParameters::parse(&attrs(yaml, &[("region", "not a region!")]), &pod()).unwrap_err();
    assert_eq!(err.count(), 4, "{err}");
    let expected = [
        "secrets[0].mode 400 is a YAML number",
        "secrets[1].fileName",
        "either with a version number or with stage: secrets[2]",
        "parameter \"region\" \"not a region!\" is not a region id",
    ];
    for fragment in expected {
        assert!(
            err.problems().iter().any(|p| p.contains(fragment)),
            "{fragment:?} not in {:#?}",
            err.problems()
        );
    }
    let message = MountError::from(err).message().to_owned();
    assert!(
        message.starts_with("the SecretProviderClass has 4 problems: (1) "),
        "{message}"
    );
    for fragment in expected {
        assert!(message.contains(fragment), "{fragment:?} not in {message}");
    }
    // One problem reads as it always did.
    let one = error("- name: a\n  mode: 400\n", &[]);
    assert!(
        one.message()
            .starts_with("unable to retrieve secrets: secrets[0].mode 400")
    );
}

#[test]
fn a_class_with_hundreds_of_problems_lists_a_bounded_number() {
    let mut yaml = String::new();
    for i in 0..200 {
        yaml.push_str(&format!("- name: s{i}\n  mode: {i}\n  stage: nope\n"));
    }
    let err = MountParameters::parse(&attrs(&yaml, &[]), &pod()).unwrap_err();
    assert_eq!(err.count(), 400);
    assert_eq!(err.problems().len(), oci_csi_provider::MAX_PROBLEMS);
    let message = MountError::from(err).message().to_owned();
    assert!(message.contains("and 392 more"), "{message}");
    assert!(message.len() < 4096, "{}", message.len());
}

/// A slip of a class parameter is warned about with the name meant; the driver's own
/// attributes and anything far from every name are not.
#[test]
fn misspelt_class_parameters_are_warned_and_the_drivers_attributes_are_not() {
    let attributes: BTreeMap<String, String> = [
        ("vaultid", "ocid1.vault.oc1.iad.x"),
        ("REGION", "iad"),
        ("secretProviderClass", "app-secrets"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("color", "blue"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let warnings = MountParameters::warnings(&attributes);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"REGION\"") && w.contains("did you mean \"region\""))
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"vaultid\"") && w.contains("did you mean \"vaultId\""))
    );
}

/// A new user fixing one problem at a time would meet the next only on the next run: an
/// entry whose vault is missing still has its own fileName checked.
#[test]
fn an_entry_missing_its_vault_still_names_its_escaping_file_name() {
    let mut attributes = attrs("- name: a\n  fileName: ../escape\n", &[]);
    attributes.remove("vaultId");
    let err = MountParameters::parse(&attributes, &pod()).unwrap_err();
    assert_eq!(err.count(), 2, "{err}");
    for fragment in [
        "missed \"vaultId\" SecretProviderClass parameters",
        "invalid file name: secrets[0].fileName",
    ] {
        assert!(
            err.problems().iter().any(|p| p.contains(fragment)),
            "{fragment:?} not in {:#?}",
            err.problems()
        );
    }
}
