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
        .secrets
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
            vec!["duplicated secret name: a", "secrets[0] and secrets[1]"],
        ),
        (
            "- name: a\n- name: b\n  fileName: a\n",
            vec![],
            vec!["duplicated fileName name: a", "secrets[0] and secrets[1]"],
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
            vec!["invalid auth principal type, Workload", "\"authType\""],
        ),
        (
            one,
            vec![("authType", "oidc")],
            vec!["invalid auth principal type, oidc"],
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
