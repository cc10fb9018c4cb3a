//! `template` entries: one file from other entries of the class, in the sandboxed subset;
//! hostile templates are refused by the subset, fuel and the mount's room, with errors that
//! name the entry, the line and the column and never a value.

use csi_grpc::{ErrorKind, MountError};
use oci_csi_provider::MountContext;
use tower::ServiceExt;

use crate::fakes::{Auth, Behaviour, Vault};
use crate::fanout::request;

fn bundle(content: &str, version: u64) -> Behaviour {
    Behaviour::Bundle {
        content: content.as_bytes().to_vec(),
        secret_id: format!("ocid1.vaultsecret.oc1..{}", content.len()),
        version,
    }
}

fn vault(db_version: u64) -> Vault {
    Vault::default()
        .with(
            "db",
            bundle(
                r#"{"host": "db.internal", "port": 5432, "user": "app"}"#,
                db_version,
            ),
        )
        .with("pw", bundle("s3cr3t-pw", 1))
}

const PROPERTIES: &str = "- name: db\n  fileName: db.json\n  writeFile: false\n\
    - name: pw\n  writeFile: false\n\
    - fileName: application.properties\n  template: |\n    \
    url=jdbc:postgresql://{{ json(\"db.json\").host }}:{{ json(\"db.json\").port }}/app\n    \
    user={{ json(\"db.json\").user }}\n    password={{ text(\"pw\") }}\n";

async fn mount(vault: Vault, secrets: &str) -> Result<csi_grpc::MountResponse, MountError> {
    crate::fakes::mount_service(vault)
        .oneshot(request(secrets))
        .await
}

#[tokio::test]
async fn a_template_renders_one_file_from_entries_read_for_it_only() {
    let response = mount(vault(1), PROPERTIES).await.unwrap();
    assert_eq!(response.files.len(), 1, "the inputs are not written");
    let file = &response.files[0];
    assert_eq!(file.path.as_str(), "application.properties");
    assert_eq!(
        std::str::from_utf8(file.contents.as_bytes()).unwrap(),
        "url=jdbc:postgresql://db.internal:5432/app\nuser=app\npassword=s3cr3t-pw\n"
    );
    assert_eq!(response.object_versions.len(), 1);
    assert_eq!(
        response.object_versions[0].id,
        "template:application.properties"
    );
}

#[tokio::test]
async fn a_templates_object_version_changes_with_an_inputs_version() {
    let first = mount(vault(1), PROPERTIES).await.unwrap();
    let again = mount(vault(1), PROPERTIES).await.unwrap();
    let rotated = mount(vault(2), PROPERTIES).await.unwrap();
    assert_eq!(first.object_versions, again.object_versions);
    assert_ne!(
        first.object_versions[0].version,
        rotated.object_versions[0].version
    );
}

#[tokio::test]
async fn inputs_written_too_keep_their_files_and_versions() {
    let secrets = "- name: pw\n- fileName: env\n  template: \"PW={{ text('pw') }}\"\n";
    let response = mount(vault(1), secrets).await.unwrap();
    let paths: Vec<&str> = response.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["pw", "env"]);
    assert_eq!(response.files[0].contents.as_bytes(), b"s3cr3t-pw");
    assert_eq!(response.object_versions.len(), 2);
}

/// Hostile templates: what the subset refuses is refused as the class is read (before any
/// fetch), what it allows is bounded by fuel and by the mount's room; every message names
/// the entry, the line and the column and quotes neither a rendered value nor an input.
#[tokio::test]
async fn hostile_templates_are_refused_by_the_subset_fuel_and_the_room() {
    let big = "x".repeat(600 * 1024);
    let vault = vault(1).with("big", bundle(&big, 1)).with(
        "list",
        bundle(&format!("[{}]", vec!["1"; 5000].join(",")), 1),
    );
    let inputs = "- name: pw\n  writeFile: false\n- name: big\n  writeFile: false\n\
                  - name: list\n  writeFile: false\n";
    let cases = [
        // Reading outside the class: no such file, no loader.
        (
            "{{ text('/etc/passwd') }}",
            ErrorKind::InvalidArgument,
            "no entry of this class has the file \"/etc/passwd\"",
        ),
        (
            "{% include 'x' %}",
            ErrorKind::InvalidArgument,
            "not a template",
        ),
        ("{{ env }}", ErrorKind::InvalidArgument, "undefined value"),
        // Growing a value: refused by the subset.
        (
            "{% set a = text('pw') %}{{ a }}",
            ErrorKind::InvalidArgument,
            "`set` is not allowed",
        ),
        (
            "{{ text('pw') ~ text('pw') }}",
            ErrorKind::InvalidArgument,
            "arithmetic and `~`",
        ),
        (
            "{{ text('pw') * 100000 }}",
            ErrorKind::InvalidArgument,
            "arithmetic",
        ),
        // Endless work: fuel.
        (
            "{% for a in json('list') %}{% for b in json('list') %}.{% endfor %}{% endfor %}",
            ErrorKind::InvalidArgument,
            "it does more work than a template may",
        ),
        // Huge output: the mount's room.
        (
            "{% for a in json('list') %}{{ text('big') }}{% endfor %}",
            ErrorKind::ResourceExhausted,
            "past the bytes the driver accepts",
        ),
        // Deep nesting: the parser's limit.
        (
            &format!(
                "{}x{}",
                "{% if true %}".repeat(600),
                "{% endif %}".repeat(600)
            ),
            ErrorKind::InvalidArgument,
            "line 1",
        ),
    ];
    for (template, kind, fragment) in cases {
        let secrets = format!(
            "{inputs}- fileName: out\n  template: {}\n",
            serde_json::to_string(template).unwrap()
        );
        let err = mount(vault.clone(), &secrets).await.unwrap_err();
        let message = err.message();
        assert_eq!(err.kind(), kind, "{template:.60}: {message}");
        assert!(message.contains(fragment), "{template:.60}: {message}");
        assert!(message.contains("secrets[3].template"), "{message}");
        // Where it went wrong, but for the output's size, which is the whole template's.
        assert!(
            message.contains("line ") || kind == ErrorKind::ResourceExhausted,
            "{message}"
        );
        assert!(!message.contains("s3cr3t"), "{message}");
        assert!(!message.contains("xxxxxxxx"), "{message}");
        assert!(message.len() < 2048, "{}", message.len());
    }
}

#[tokio::test]
async fn a_templates_json_parse_reserves_from_the_byte_budget() {
    let budget = oci_csi_provider::ByteBudget::new(crate::fakes::RESERVE + 16 * 1024);
    let doc = format!("{{\"a\": \"{}\"}}", "y".repeat(8 * 1024));
    let vault = Vault::default().with("doc", bundle(&doc, 1));
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        MountContext {
            byte_budget: Some(budget.clone()),
            ..crate::fakes::config()
        },
        Some(budget.clone()),
    );
    let err = service
        .oneshot(request(
            "- name: doc\n  writeFile: false\n- fileName: out\n  template: \"{{ json('doc').a }}\"\n",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.message().contains("reading it for json()"), "{err}");
    assert_eq!(budget.used(), 0);
}

#[tokio::test]
async fn a_file_read_many_times_for_json_is_parsed_and_reserved_once() {
    let doc = format!("{{\"a\": \"{}\", \"b\": 1}}", "y".repeat(8 * 1024));
    // Room for one parse of the document, not for two.
    // A parse reserves 48 bytes per byte (the provider's `extract::PARSE_BYTES_PER_BYTE`).
    let one_parse = doc.len() * 48;
    let budget = oci_csi_provider::ByteBudget::new(crate::fakes::RESERVE + one_parse * 3 / 2);
    let vault = Vault::default().with("doc", bundle(&doc, 1));
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        MountContext {
            byte_budget: Some(budget.clone()),
            ..crate::fakes::config()
        },
        Some(budget.clone()),
    );
    let response = service
        .oneshot(request(
            "- name: doc\n  writeFile: false\n- fileName: out\n  \
             template: \"{{ json('doc').b }}{% for k, v in json('doc') | items %}{{ k }}{% endfor %}{{ json('doc').b }}\"\n",
        ))
        .await
        .unwrap();
    assert_eq!(response.files[0].contents.as_bytes(), b"1ab1");
    assert_eq!(budget.used(), 0);
}

#[tokio::test]
async fn a_templates_output_is_at_most_four_times_what_it_is_made_of() {
    let list = format!("[{}]", vec!["1"; 2000].join(","));
    let vault = vault(1).with("list", bundle(&list, 1));
    let inputs = "- name: pw\n  writeFile: false\n- name: list\n  writeFile: false\n";
    // 2000 x 9 bytes = 18 000 bytes from about 4 KB: more than four times.
    let grows = format!(
        "{inputs}- fileName: out\n  template: \"{{% for a in json('list') %}}{{{{ text('pw') }}}}{{% endfor %}}\"\n"
    );
    let err = mount(vault.clone(), &grows).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.message().contains("four times its text"), "{err}");
    // Twice what it is made of is fine.
    let doubles = format!(
        "{inputs}- fileName: out\n  template: \"{{% for a in json('list') %}}{{{{ a }}}}-{{% endfor %}}\"\n"
    );
    let response = mount(vault.clone(), &doubles).await.unwrap();
    assert_eq!(response.files[0].contents.as_bytes().len(), 4000);
    // `items` is for mappings only, and says so.
    let items = format!(
        "{inputs}- fileName: out\n  template: \"{{% for k, v in json('list') | items %}}{{{{ k }}}}{{% endfor %}}\"\n"
    );
    let err = mount(vault, &items).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.message()
            .contains("items of a value that is not a mapping"),
        "{err}"
    );
}
