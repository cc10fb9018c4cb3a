//! Generated parameter sets: valid ones parse to the expected typed request; each mutation
//! reaches its validation stage and gets InvalidArgument with that stage's message.

use std::collections::BTreeMap;

use csi_grpc::{ErrorKind, MountError};
use oci_csi_provider::{MountParameters, Stage, VersionSelector};
use proptest::prelude::*;
use tower::ServiceExt;

use crate::params::pod;

#[derive(Clone, Debug)]
struct Item {
    name: String,
    stage: Option<Stage>,
    number: Option<(u64, bool)>,
    file_name: Option<String>,
}

const STAGES: [Stage; 5] = [
    Stage::Current,
    Stage::Pending,
    Stage::Latest,
    Stage::Previous,
    Stage::Deprecated,
];

fn item(index: usize) -> impl Strategy<Value = Item> {
    (
        "[a-z][a-z0-9-]{0,10}",
        0..3u8,
        0..5usize,
        (1..100_000u64, any::<bool>()),
        proptest::option::of("[a-z][a-z0-9_.-]{0,10}"),
    )
        .prop_map(move |(base, selector, stage, number, file)| Item {
            name: format!("n{index}-{base}"),
            stage: (selector == 1).then_some(STAGES[stage]),
            number: (selector == 2).then_some(number),
            file_name: file.map(|f| format!("f{index}-{f}")),
        })
}

fn items() -> impl Strategy<Value = Vec<Item>> {
    (1..6usize).prop_flat_map(|n| (0..n).map(item).collect::<Vec<_>>())
}

fn render(items: &[Item]) -> String {
    let mut yaml = String::new();
    for item in items {
        yaml.push_str(&format!("- name: {}\n", item.name));
        if let Some(stage) = item.stage {
            yaml.push_str(&format!("  stage: {stage}\n"));
        }
        if let Some((n, quoted)) = item.number {
            if quoted {
                yaml.push_str(&format!("  versionNumber: \"{n}\"\n"));
            } else {
                yaml.push_str(&format!("  versionNumber: {n}\n"));
            }
        }
        if let Some(f) = &item.file_name {
            yaml.push_str(&format!("  fileName: {f}\n"));
        }
    }
    yaml
}

fn attributes(secrets: &str) -> BTreeMap<String, String> {
    [
        ("secrets", secrets),
        ("vaultId", "ocid1.vault.oc1.iad.prop"),
        ("authType", "workload"),
        ("secretProviderClass", "spc"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "app"),
        ("csi.storage.k8s.io/pod.uid", "7d3c"),
        ("csi.storage.k8s.io/serviceAccount.name", "web"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Sends the attributes through the whole edge: driver JSON, csi-grpc translation, the
/// OCI mount service.
fn mount(attributes: &BTreeMap<String, String>) -> MountError {
    let request = csi_grpc::MountRequest::from_proto(
        csi_grpc::proto::MountRequest {
            attributes: serde_json::to_string(attributes).unwrap(),
            secrets: "{}".into(),
            target_path: String::new(),
            permission: "420".into(),
            current_object_version: vec![],
        },
        tokio::time::Instant::now() + std::time::Duration::from_secs(30),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match rt.block_on(crate::fakes::mount_service(crate::fakes::Vault::default()).oneshot(request))
    {
        Ok(response) => MountError::new(
            ErrorKind::Unavailable,
            format!("mounted {} files", response.files.len()),
        ),
        Err(err) => err,
    }
}

/// Mutations of a valid parameter set, each with the fragment of the stage that must catch it.
const MUTATIONS: usize = 16;

fn mutate(
    items: &mut [Item],
    attrs: &mut BTreeMap<String, String>,
    which: usize,
    k: usize,
) -> Option<&'static str> {
    let k = k % items.len();
    let mut yaml_override = None;
    let fragment = match which {
        0 => None,
        1 => {
            yaml_override = Some(render(items).replacen("- name:", "- colour: blue\n  name:", 1));
            Some("failed to unmarshal")
        }
        2 => {
            items[0].stage = None;
            items[0].number = None;
            yaml_override = Some(format!("{}  stage: current\n", render(&items[..1])));
            Some(".stage \"current\"")
        }
        3 => {
            items[k].stage = None;
            items[k].number = Some((0, false));
            Some(".versionNumber 0")
        }
        4 => {
            items[k].stage = None;
            items[k].number = None;
            yaml_override = Some(render(items).replacen(
                &format!("- name: {}\n", items[k].name),
                &format!("- name: {}\n  versionNumber: 2.5\n", items[k].name),
                1,
            ));
            Some(".versionNumber 2.5")
        }
        5 => {
            items[k].name = "''".into();
            Some("missed secret name")
        }
        6 => {
            items[k].stage = Some(Stage::Latest);
            items[k].number = Some((3, false));
            Some("either with a version number or with stage")
        }
        7 => {
            if items.len() < 2 {
                return mutate(items, attrs, 10, k);
            }
            let other = (k + 1) % items.len();
            items[k].file_name = Some(
                items[other]
                    .file_name
                    .clone()
                    .unwrap_or_else(|| items[other].name.clone()),
            );
            Some("duplicated")
        }
        8 => {
            items[k].file_name = Some("../escape".into());
            Some("invalid file name")
        }
        9 => {
            yaml_override = Some("name: not-a-list\n".into());
            Some("failed to unmarshal")
        }
        10 => {
            yaml_override = Some("[]".into());
            Some("requested secrets are missed")
        }
        11 => {
            attrs.remove("authType");
            Some("missed \"authType\"")
        }
        12 => {
            attrs.insert("authType".into(), "Instance".into());
            Some("invalid auth principal type, \"Instance\"")
        }
        13 => {
            attrs.insert("authType".into(), "user".into());
            Some("missed \"authSecretName\"")
        }
        14 => {
            attrs.remove("vaultId");
            Some("missed \"vaultId\"")
        }
        _ => {
            yaml_override = Some(String::new());
            Some("missed content")
        }
    };
    attrs.insert(
        "secrets".into(),
        yaml_override.unwrap_or_else(|| render(items)),
    );
    fragment
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn valid_parameter_sets_parse_to_the_expected_request(items in items()) {
        let params = MountParameters::parse(&attributes(&render(&items)), &pod()).unwrap();
        prop_assert_eq!(params.secrets().len(), items.len());
        for (spec, item) in params.secrets().iter().zip(&items) {
            prop_assert_eq!(spec.source.display(), item.name.as_str());
            let expected = match (item.stage, item.number) {
                (Some(stage), _) => VersionSelector::Stage(stage),
                (None, Some((n, _))) => VersionSelector::Number(n),
                (None, None) => VersionSelector::Stage(Stage::Current),
            };
            prop_assert_eq!(&spec.selector, &expected);
            prop_assert_eq!(spec.path.as_str(), item.file_name.as_deref().unwrap_or(&item.name));
        }
    }

    #[test]
    fn each_mutation_is_caught_by_its_stage(mut items in items(), which in 0..MUTATIONS, k in 0..8usize) {
        let mut attrs = attributes("");
        let fragment = mutate(&mut items, &mut attrs, which, k);
        let err = mount(&attrs);
        match fragment {
            None => {
                prop_assert!(err.message().starts_with(&format!("mounted {} files", items.len())), "{}", err);
            }
            Some(fragment) => {
                prop_assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{}", err);
                prop_assert!(err.message().contains(fragment), "mutation {}: {:?} not in {:?}", which, fragment, err.message());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases, or PROPTEST_CASES

    /// Arbitrary text as the `secrets` parameter and the auth fields: a typed
    /// InvalidArgument (or a parse) and never a panic.
    #[test]
    fn fuzz_arbitrary_parameters(secrets in ".{0,300}", auth in ".{0,12}", vault in ".{0,40}",
                                 yaml in "(- |  |name: |stage: |versionNumber: |fileName: |\n|[a-z0-9\"'{}\\[\\],:&*!|>-]){0,60}") {
        for secrets in [secrets, yaml] {
            let attributes: BTreeMap<String, String> = [
                ("secrets".to_owned(), secrets),
                ("authType".to_owned(), auth.clone()),
                ("vaultId".to_owned(), vault.clone()),
                ("authSecretName".to_owned(), "s".to_owned()),
            ]
            .into_iter()
            .collect();
            if let Err(e) = MountParameters::parse(&attributes, &pod()) {
                prop_assert_eq!(MountError::from(e).kind(), ErrorKind::InvalidArgument);
            }
        }
    }
}
