//! What a mount costs besides heap: stack (templates nested past the bound are refused before
//! anything parses them, on a small thread), CPU (one fuel for all of a mount's templates,
//! comparisons of documents charged node by node, renders off the async workers behind a
//! gate), and the number of template entries a class may hold.

use std::sync::Arc;

use csi_grpc::{ErrorKind, MountError, MountResponse};
use oci_csi_provider::MountContext;
use tower::ServiceExt;

use crate::fakes::{Auth, Behaviour, Vault};
use crate::fanout::request;

fn bundle(content: &str) -> Behaviour {
    Behaviour::Bundle {
        content: content.as_bytes().to_vec(),
        secret_id: format!("ocid1.vaultsecret.oc1..{}", content.len()),
        version: 1,
    }
}

/// A class whose entries are `inputs` (read by templates only) and `templates`.
fn class(inputs: &[&str], templates: &[String]) -> String {
    let mut secrets = String::new();
    for name in inputs {
        secrets.push_str(&format!("- name: {name}\n  writeFile: false\n"));
    }
    for (i, template) in templates.iter().enumerate() {
        secrets.push_str(&format!(
            "- fileName: out{i}\n  template: {}\n",
            serde_json::to_string(template).unwrap()
        ));
    }
    secrets
}

async fn mount_with(
    vault: Vault,
    config: MountContext,
    secrets: &str,
) -> Result<MountResponse, MountError> {
    crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        config,
        None,
    )
    .oneshot(request(secrets))
    .await
}

/// The templates a review found abort the process (16 KiB, no credentials needed): runs of
/// unary operators and chains of attributes, filters and tests.
fn too_deep() -> Vec<String> {
    vec![
        format!("{{{{ {}x }}}}", "-".repeat(16_000)),
        format!("{{{{ {}x }}}}", "not ".repeat(4_000)),
        format!("{{{{ x{} }}}}", ".a".repeat(8_000)),
        format!("{{{{ x{} }}}}", "|trim".repeat(3_200)),
        format!("{{{{ x{} }}}}", " is string".repeat(1_600)),
    ]
}

#[test]
fn templates_nested_past_the_bound_are_refused_by_a_mount_on_a_256_kib_stack() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_stack_size(256 * 1024)
        .enable_all()
        .build()
        .unwrap();
    let vault = Vault::default().with("f", bundle("v"));
    runtime.block_on(async {
        // Run on the runtime's own (small) threads, not the test's.
        let outcome = tokio::spawn(async move {
            for template in too_deep() {
                let secrets = class(&["f"], &[template]);
                let err = mount_with(vault.clone(), crate::fakes::config(), &secrets)
                    .await
                    .unwrap_err();
                assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                assert!(
                    err.message().contains("nests deeper than 48 levels"),
                    "{err}"
                );
            }
            // The deepest a class may hold parses, checks and renders on the same stack.
            let deepest = format!(
                "{}{{{{ text(\"f\"){} }}}}{}",
                "{% if true %}".repeat(20),
                " | trim".repeat(20),
                "{% endif %}".repeat(20)
            );
            let response = mount_with(vault, crate::fakes::config(), &class(&["f"], &[deepest]))
                .await
                .unwrap();
            assert_eq!(response.files[0].contents.as_bytes(), b"v");
        });
        outcome.await.expect("no overflow, no panic");
    });
}

/// Two documents of one key over 4000 nested one-item lists: minijinja charges one item a
/// comparison; compared in a loop of 4000 that is 16 million nodes within ~12 000 fuel.
fn deep_documents() -> (String, String) {
    let items = (0..4000)
        .map(|i| format!("[{}]", i % 10))
        .collect::<Vec<_>>()
        .join(",");
    let doc = format!("{{\"k\": [{items}]}}");
    let list = format!("{{\"k\": [{}]}}", vec!["0"; 4000].join(","));
    (doc, list)
}

#[tokio::test]
async fn comparisons_of_documents_are_charged_every_node_and_the_mount_is_refused() {
    let (doc, list) = deep_documents();
    let vault = Vault::default()
        .with("a", bundle(&doc))
        .with("b", bundle(&doc))
        .with("l", bundle(&list));
    let template = "{% for i in json(\"l\").k %}{% if json(\"a\").k == json(\"b\").k %}\
                    {% endif %}{% endfor %}"
        .to_owned();
    let err = mount_with(
        vault.clone(),
        crate::fakes::config(),
        &class(&["a", "b", "l"], &[template]),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("does more work than"), "{err}");
    // Once is fine: one comparison of the two documents is ~8000 nodes of 200 000.
    let once = "{% if json(\"a\").k == json(\"b\").k %}same{% endif %}".to_owned();
    let response = mount_with(vault, crate::fakes::config(), &class(&["a", "b"], &[once]))
        .await
        .unwrap();
    assert_eq!(response.files[0].contents.as_bytes(), b"same");
}

#[tokio::test]
async fn a_mounts_templates_share_one_fuel() {
    let list = format!("[{}]", vec!["1"; 10_000].join(","));
    let vault = Vault::default().with("l", bundle(&list));
    // A loop of 10 000 empty iterations burns some 40 000 fuel (four an iteration; the
    // list's one parse 10 000 more): four fit in a mount's 200 000, eight do not, though
    // each alone would.
    let busy = "{% for a in json(\"l\") %}{% endfor %}x".to_owned();
    let four = mount_with(
        vault.clone(),
        crate::fakes::config(),
        &class(&["l"], &vec![busy.clone(); 4]),
    )
    .await
    .unwrap();
    assert_eq!(four.files.len(), 4);
    let err = mount_with(
        vault,
        crate::fakes::config(),
        &class(&["l"], &vec![busy; 8]),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("more work"), "{err}");
}

#[tokio::test]
async fn a_class_may_hold_at_most_32_template_entries() {
    let vault = Vault::default().with("f", bundle("v"));
    let template = "{{ text(\"f\") }}".to_owned();
    let ok = mount_with(
        vault.clone(),
        crate::fakes::config(),
        &class(&["f"], &vec![template.clone(); 32]),
    )
    .await
    .unwrap();
    assert_eq!(ok.files.len(), 32);
    let err = mount_with(
        vault,
        crate::fakes::config(),
        &class(&["f"], &vec![template; 33]),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.message()
            .contains("has 33 template entries; a class may have at most 32"),
        "{err}"
    );
}

#[tokio::test]
async fn a_mount_renders_only_with_a_permit_of_the_render_gate() {
    let gate = Arc::new(tokio::sync::Semaphore::new(1));
    let config = MountContext {
        template_renders: gate.clone(),
        ..crate::fakes::config()
    };
    let vault = Vault::default().with("f", bundle("v"));
    let secrets = class(&["f"], &["{{ text(\"f\") }}".to_owned()]);
    let held = gate.clone().acquire_owned().await.unwrap();
    let mount = tokio::spawn(async move { mount_with(vault, config, &secrets).await });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!mount.is_finished(), "it waits for the render permit");
    drop(held);
    let response = mount.await.unwrap().unwrap();
    assert_eq!(response.files[0].contents.as_bytes(), b"v");
    assert_eq!(gate.available_permits(), 1, "the permit is given back");
}

#[tokio::test]
async fn a_class_mounted_again_is_served_from_the_classes_parsed_lately() {
    let classes = Arc::new(oci_csi_provider::ParsedClasses::new(8, 1 << 20));
    let config = MountContext {
        classes: classes.clone(),
        ..crate::fakes::config()
    };
    let vault = Vault::default().with("f", bundle("v"));
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        config,
        None,
    );
    for _ in 0..3 {
        let response = service
            .clone()
            .oneshot(request("- name: f\n"))
            .await
            .unwrap();
        assert_eq!(response.files[0].contents.as_bytes(), b"v");
    }
    assert_eq!(classes.len_and_bytes().0, 1, "one class, parsed once");
    service
        .oneshot(request("- name: f\n  fileName: g\n"))
        .await
        .unwrap();
    assert_eq!(classes.len_and_bytes().0, 2, "another class, parsed too");
}
