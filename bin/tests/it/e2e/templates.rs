//! Template entries through the real binary: one file rendered from other entries of the
//! class, its object version following its inputs' versions, and the refusals a tenant
//! sees, none of which quotes an input.

use super::*;

const DB_JSON: &str = r#"{"host": "db.internal", "port": 5432, "user": "app"}"#;

fn config_secrets() -> [SecretSeed; 2] {
    let db = SecretSeed::new("ocid1.vaultsecret.oc1.iad.dbjson", VAULT, "db-config")
        .version(1, DB_JSON, &["CURRENT"])
        .allow_workload(NAMESPACE, "sa-0");
    let token = SecretSeed::new("ocid1.vaultsecret.oc1.iad.token", VAULT, "api-token")
        .version(1, "tok-1-never-quoted", &["CURRENT"])
        .allow_workload(NAMESPACE, "sa-0");
    [db, token]
}

const CLASS: &str = "- name: db-config\n  fileName: db.json\n  writeFile: false\n\
                     - name: api-token\n  writeFile: false\n\
                     - fileName: app.env\n  mode: \"0400\"\n  template: |\n    \
                     DB_URL=postgres://{{ json(\"db.json\").user }}@{{ json(\"db.json\").host }}:{{ json(\"db.json\").port }}/app\n    \
                     API_TOKEN={{ text(\"api-token\") }}\n";

#[tokio::test]
async fn a_template_mounts_one_file_whose_version_follows_its_inputs() {
    let [db, token] = config_secrets();
    let emu = Emulator::start(seed(1).secret(db).secret(token), Arc::new(SystemClock))
        .await
        .unwrap();
    let provider = provider(&emu, &[], &[NO_CACHE]).await;
    let mut client = provider.client().await;
    let mount = |pod| request("workload", "sa-0", pod, CLASS);
    let first = client.mount(mount(1)).await.unwrap().into_inner();
    assert_eq!(
        files_of(&first),
        vec![(
            "app.env",
            b"DB_URL=postgres://app@db.internal:5432/app\nAPI_TOKEN=tok-1-never-quoted\n".to_vec(),
            0o400
        )]
    );
    let versions = versions_of(&first);
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(versions[0].0, "template:app.env");
    let first_version = versions[0].1.to_owned();
    // The same inputs: the same version; a rotated input: a new one.
    let again = client.mount(mount(2)).await.unwrap().into_inner();
    assert_eq!(versions_of(&again)[0].1, first_version);
    emu.rotate_secret("ocid1.vaultsecret.oc1.iad.token", "tok-2-never-quoted")
        .unwrap();
    let rotated = client.mount(mount(3)).await.unwrap().into_inner();
    assert_ne!(versions_of(&rotated)[0].1, first_version);
    assert!(
        String::from_utf8_lossy(&rotated.files[0].contents)
            .contains("API_TOKEN=tok-2-never-quoted")
    );
    // A refusal names the entry, line and column, never an input.
    let broken = CLASS.replace("json(\"db.json\").port", "json(\"db.json\").port.nope");
    let status = client
        .mount(request("workload", "sa-0", 4, &broken))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("secrets[2].template line 1"),
        "{status:?}"
    );
    assert!(!status.message().contains("never-quoted"), "{status:?}");
    assert!(!status.message().contains("db.internal"), "{status:?}");
    let out = provider.terminate().await;
    assert!(out.status.success());
    assert!(!out.stderr.contains("never-quoted"));
}

/// The README's template examples (the `secrets: |` blocks of its Templates section), with
/// the placeholder CA bundle made the emulator's.
fn readme_examples() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find("### Templates").unwrap();
    let section = &readme[start..];
    let section = &section[..section[4..].find("\n#").map_or(section.len(), |i| i + 4)];
    section
        .split("```yaml\n")
        .skip(1)
        .map(|block| {
            let block = &block[..block.find("```").unwrap()];
            let secrets = block.split_once("secrets: |\n").unwrap().1;
            // The block's entries, as the `secrets` parameter holds them.
            secrets
                .lines()
                .map(|l| l.strip_prefix("      ").unwrap_or(l))
                .collect::<Vec<_>>()
                .join("\n")
                .replace("ocid1.cabundle.oc1.iad.amaaaaexample", CA_BUNDLE)
        })
        .collect()
}

#[tokio::test]
async fn the_readmes_three_template_examples_mount_what_they_promise() {
    let examples = readme_examples();
    assert_eq!(examples.len(), 3, "{examples:#?}");
    let secret = |id: &str, name: &str, content: &str| {
        SecretSeed::new(format!("ocid1.vaultsecret.oc1.iad.{id}"), VAULT, name)
            .version(1, content, &["CURRENT"])
            .allow_workload(NAMESPACE, "sa-0")
    };
    let seed = seed(1)
        .secret(secret(
            "readmedb",
            "db",
            r#"{"host": "db.internal", "port": 5432, "user": "app@corp", "password": "pw-9"}"#,
        ))
        .secret(secret("readmeapi", "api-token", "tok-9"))
        .secret(secret(
            "readmeflags",
            "feature-flags",
            r#"{"checkout": true, "search": "beta"}"#,
        ))
        .secret(secret("readmedeploy", "deploy-token", "deploy-9\n"));
    let emu = Emulator::start(seed, Arc::new(SystemClock)).await.unwrap();
    let provider = provider(&emu, &[], &[]).await;
    let mut client = provider.client().await;
    let mut rendered = Vec::new();
    for (pod, secrets) in examples.iter().enumerate() {
        let response = client
            .mount(request("workload", "sa-0", pod, secrets))
            .await
            .unwrap_or_else(|s| panic!("{secrets}\n{s:?}"))
            .into_inner();
        assert_eq!(response.files.len(), 1, "only the template is written");
        let file = &response.files[0];
        rendered.push((
            file.path.clone(),
            String::from_utf8(file.contents.clone()).unwrap(),
        ));
    }
    assert_eq!(
        rendered[0],
        (
            "app.env".to_owned(),
            "DB_HOST=db.internal\nDB_PORT=5432\nAPI_TOKEN=tok-9\n".to_owned()
        )
    );
    assert_eq!(rendered[1].0, "application.properties");
    assert_eq!(
        rendered[1].1,
        "spring.datasource.url=jdbc:postgresql://db.internal:5432/app?sslmode=require\n\
         spring.datasource.username=app%40corp\n\
         spring.datasource.password=pw-9\n\
         flags.checkout=true\n\
         flags.search=\"beta\"\n"
    );
    assert_eq!(rendered[2].0, "kubeconfig");
    let kubeconfig = &rendered[2].1;
    assert!(
        kubeconfig.contains("\n    token: deploy-9\n"),
        "{kubeconfig}"
    );
    let ca = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .unwrap();
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .unwrap();
    assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
    assert!(provider.terminate().await.status.success());
}
