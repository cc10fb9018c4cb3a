//! `check`: golden outputs (text and JSON), standard input, exit codes.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/check")
}

fn check(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oci-secrets-store-csi-driver-provider"))
        .arg("check")
        .args(args)
        .current_dir(fixtures())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn golden(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

#[test]
fn valid_classes_print_the_files_they_would_mount() {
    let (code, out, _) = check(&["good.yaml"], None);
    assert_eq!(code, 0);
    assert_eq!(out, golden("good.txt"));
}

#[test]
fn every_error_of_every_class_is_printed_and_the_exit_code_is_1() {
    let (code, out, _) = check(&["bad.yaml"], None);
    assert_eq!(code, 1);
    assert_eq!(out, golden("bad.txt"));
    // Not only the first error of a class: one per broken entry.
    assert!(
        out.contains("secrets[0].mode")
            && out.contains("secrets[1].stage")
            && out.contains("secrets[2].secretId")
    );
}

#[test]
fn json_output_for_machines() {
    let (code, out, _) = check(&["--output", "json", "good.yaml", "bad.yaml"], None);
    assert_eq!(code, 1);
    assert_eq!(out, golden("all.json"));
    let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let valid: Vec<bool> = parsed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["valid"].as_bool().unwrap())
        .collect();
    assert_eq!(valid, [true, true, false, false]);
}

#[test]
fn standard_input_and_the_namespace_override() {
    let (code, out, _) = check(&["-", "--namespace", "prod"], Some(&golden("good.yaml")));
    assert_eq!(code, 0);
    assert_eq!(
        out,
        golden("good.txt").replace("good.yaml: app/", "-: prod/")
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(check(&[], None).0, 2);
    assert_eq!(check(&["--output", "xml", "good.yaml"], None).0, 2);
    let (code, _, err) = check(&["missing.yaml"], None);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read missing.yaml"), "{err}");
    // Not YAML at all is a finding (1), not a usage error.
    let (code, out, _) = check(&["-"], Some("key: [unclosed\n"));
    assert_eq!(code, 1);
    assert!(
        out.contains("not valid YAML: syntax error at line 1"),
        "{out}"
    );
}

/// The binary run with `args` (no `check` in front): exit code and standard output.
fn binary(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_oci-secrets-store-csi-driver-provider"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[test]
fn check_is_found_from_the_binarys_help_and_names_the_binary() {
    for args in [&["--help"][..], &["help"]] {
        let (code, out) = binary(args);
        assert_eq!(code, 0, "{args:?}");
        assert!(
            out.contains("Usage: oci-secrets-store-csi-driver-provider [OPTIONS] [COMMAND]"),
            "{out}"
        );
        assert!(
            out.contains("\n  check  Validate SecretProviderClass manifests offline"),
            "{out}"
        );
    }
    for args in [&["check", "--help"][..], &["help", "check"]] {
        let (code, out) = binary(args);
        assert_eq!(code, 0, "{args:?}");
        assert!(
            out.contains("Usage: oci-secrets-store-csi-driver-provider check [OPTIONS] <FILES>..."),
            "{out}"
        );
        assert!(out.contains("--service-account"), "{out}");
    }
}

#[test]
fn empty_input_says_so_and_one_file_is_one_file() {
    for empty in ["", "\n", "---\n"] {
        let (code, out, _) = check(&["-"], Some(empty));
        assert_eq!(code, 1, "{empty:?}: {out}");
        assert!(out.contains("no SecretProviderClass in it"), "{out}");
    }
    let one = "kind: SecretProviderClass\nmetadata: {name: one, namespace: ns}\nspec:\n  provider: oci\n  parameters:\n    authType: instance\n    vaultId: ocid1.vault.oc1.iad.x\n    secrets: \"- name: a\"\n";
    let (code, out, _) = check(&["-"], Some(one));
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("-: ns/one: valid, 1 file\n"), "{out}");
}

#[test]
fn a_misspelt_field_or_parameter_is_named_once_with_what_was_meant() {
    let class = |parameters: &str, entries: &str| {
        format!(
            "kind: SecretProviderClass\nmetadata: {{name: c, namespace: ns}}\nspec:\n  provider: oci\n  parameters:\n{parameters}    secrets: |\n{entries}"
        )
    };
    // An unknown entry field: once, where, and what was meant; no stale list of fields.
    let (code, out, _) = check(
        &["-"],
        Some(&class(
            "    authType: instance\n    vaultId: ocid1.vault.oc1.iad.x\n",
            "      - name: a\n        encodng: base64\n",
        )),
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("-: ns/c: 1 error\n"), "{out}");
    assert!(
        out.contains(
            "line 2, column 3: unknown field \"encodng\" in an entry; did you mean \"encoding\"?"
        ),
        "{out}"
    );
    assert!(!out.contains("expected a YAML list"), "{out}");
    // In a keys item, and far from any name: the item's fields are listed.
    let (_, out, _) = check(
        &["-"],
        Some(&class(
            "    authType: instance\n    vaultId: ocid1.vault.oc1.iad.x\n",
            "      - name: a\n        keys:\n        - key: k\n          colour: red\n",
        )),
    );
    assert!(
        out.contains(
            "unknown field \"colour\" in a keys item; a keys item takes key, fileName, mode"
        ),
        "{out}"
    );
    // A misspelt class parameter: a warning, never an error.
    let (code, out, _) = check(
        &["-"],
        Some(&class(
            "    authType: instance\n    vaultId: ocid1.vault.oc1.iad.x\n    regoin: iad\n    failoverregion: phx\n",
            "      - name: a\n",
        )),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("  warning: parameter \"regoin\" is not one the provider reads (ignored); did you mean \"region\"?\n"),
        "{out}"
    );
    assert!(out.contains("did you mean \"failoverRegion\"?"), "{out}");
}

#[test]
fn every_problem_of_one_class_is_named_in_one_run() {
    // A bad region, an unquoted mode, an escaping fileName and both versionNumber and stage:
    // four problems, each on its line (it used to stop at the region).
    let class = r#"apiVersion: secrets-store.csi.x-k8s.io/v1
kind: SecretProviderClass
metadata: {name: four, namespace: app}
spec:
  provider: oci
  parameters:
    authType: workload
    vaultId: ocid1.vault.oc1.iad.example
    region: "not a region!"
    secrets: |
      - name: a
        mode: 400
      - name: b
        fileName: ../escape
      - name: c
        versionNumber: 2
        stage: CURRENT
"#;
    let (code, out, _) = check(&["-"], Some(class));
    assert_eq!(code, 1);
    assert!(out.contains("app/four: 4 errors"), "{out}");
    for fragment in [
        "secrets[0].mode 400 is a YAML number",
        "secrets[1].fileName",
        "either with a version number or with stage: secrets[2]",
        "parameter \"region\" \"not a region!\"",
    ] {
        assert!(out.contains(fragment), "{fragment:?} not in {out}");
    }
}

#[test]
fn certificate_entries_show_their_files_and_their_errors() {
    let (code, out, _) = check(&["certificates.yaml"], None);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out, golden("certificates.txt"));
}

#[test]
fn template_entries_show_what_they_read_and_every_refusal() {
    let (code, out, _) = check(&["templates.yaml"], None);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out, golden("templates.txt"));
    let (_, json, _) = check(&["--output", "json", "templates.yaml"], None);
    let reports: serde_json::Value = serde_json::from_str(&json).unwrap();
    let written: Vec<bool> = reports[0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["written"].as_bool().unwrap())
        .collect();
    assert_eq!(written, [false, true, true]);
}

#[test]
fn with_the_providers_config_a_switched_off_auth_type_and_an_unlisted_region_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("provider.toml");
    std::fs::write(
        &config,
        "[auth]\nallowed_types = [\"workload\"]\nallowed_regions = [\"iad\"]\n",
    )
    .unwrap();
    let class = "apiVersion: secrets-store.csi.x-k8s.io/v1\nkind: SecretProviderClass\n\
                 metadata: {name: node, namespace: app}\nspec:\n  provider: oci\n  parameters:\n\
                 \x20   authType: instance\n    region: phx\n    vaultId: ocid1.vault.oc1..v\n\
                 \x20   secrets: |\n      - name: db\n";
    let (code, out, _) = check(&["-"], Some(class));
    assert_eq!(code, 0, "valid without the provider's config: {out}");
    let config = config.to_str().unwrap();
    let (code, out, _) = check(&["--config", config, "-"], Some(class));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("auth.allowed_types [workload]"), "{out}");
    assert!(out.contains("auth.allowed_regions (iad)"), "{out}");
}

#[test]
fn with_a_federation_config_workload_classes_are_told_what_serves_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("provider.toml");
    std::fs::write(
        &config,
        "region = \"us-ashburn-1\"\n[auth]\nworkload_audience = \"oci-federation\"\n\
         [auth.workload]\nmechanism = \"federation\"\n[auth.workload.federation]\n\
         domain_url = \"https://idcs-0123.identity.oraclecloud.com\"\n\
         use_instance_principal = true\n\
         requested_token_type = \"urn:oci:token-type:oci-rpst\"\nresource_type = \"k8sworkload\"\n",
    )
    .unwrap();
    let class = "apiVersion: secrets-store.csi.x-k8s.io/v1\nkind: SecretProviderClass\n\
                 metadata: {name: web, namespace: app}\nspec:\n  provider: oci\n  parameters:\n\
                 \x20   authType: workload\n    vaultId: ocid1.vault.oc1..v\n\
                 \x20   secrets: |\n      - name: db\n";
    let config = config.to_str().unwrap();
    let (code, out, err) = check(
        &["--config", config, "--service-account", "web", "-"],
        Some(class),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "  identity: service account app/web through workload identity federation at \
             https://idcs-0123.identity.oraclecloud.com (RPST, the instance principal's \
             signature), its token for audience \"oci-federation\""
        ),
        "{out}"
    );
    // Without a configuration nothing is said of the identity; a broken one is named.
    let (_, out, _) = check(&["-"], Some(class));
    assert!(!out.contains("identity:"), "{out}");
    std::fs::write(config, "[auth.workload]\nmechanism = \"federation\"\n").unwrap();
    let (code, _, err) = check(&["--config", config, "-"], Some(class));
    assert_eq!(code, 2);
    assert!(err.contains("needs region"), "{err}");
}

#[test]
fn versions_and_tag_selections_print_each_version_file_and_what_they_select() {
    let (code, out, _) = check(&["kinds.yaml"], None);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out, golden("kinds.txt"));
    let (_, json, _) = check(&["--output", "json", "kinds.yaml"], None);
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    let files = parsed[0]["files"].as_array().unwrap();
    let selection = &files[3];
    assert_eq!(selection["path"], "payments/<each secret's name>");
    assert_eq!(
        selection["selection"],
        "tag \"team=payments\" and namePrefix \"app-\""
    );
    assert_eq!(files[1]["selector"], "the version before the current");
}

/// Every SecretProviderClass the README shows, and every fragment of one (`parameters:`,
/// `secrets: |` or an entry list), is one `check` finds valid: the examples stay true.
#[test]
fn every_secret_provider_class_of_the_readme_is_valid() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let indent = |text: &str, by: usize| -> String {
        text.lines()
            .map(|l| format!("{}{l}\n", " ".repeat(by)))
            .collect()
    };
    let class = |parameters: &str| {
        // The class's own parameters are the fragment's unindented lines.
        let has = |p: &str| parameters.lines().any(|l| l.starts_with(p));
        let mut defaults = String::new();
        if !has("authType:") {
            defaults.push_str("authType: workload\n");
        }
        if !has("vaultId:") {
            defaults.push_str("vaultId: ocid1.vault.oc1.iad.readme\n");
        }
        format!(
            "apiVersion: secrets-store.csi.x-k8s.io/v1\nkind: SecretProviderClass\nmetadata: {{ name: readme, namespace: app }}\nspec:\n  provider: oci\n  parameters:\n{}{}",
            indent(&defaults, 4),
            indent(parameters, 4)
        )
    };
    let mut checked = 0;
    for block in readme.split("```yaml\n").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        // Outdent a fragment cut from an indented manifest.
        let margin = block
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        let block: String = block
            .lines()
            .map(|l| format!("{}\n", l.get(margin..).unwrap_or("")))
            .collect();
        let classes: Vec<String> = if block.contains("kind: SecretProviderClass") {
            block
                .split("\n---\n")
                .filter(|doc| doc.contains("kind: SecretProviderClass"))
                .map(str::to_owned)
                .collect()
        } else if let Some(parameters) = block.strip_prefix("parameters:\n") {
            vec![class(
                &parameters
                    .lines()
                    .map(|l| format!("{}\n", l.get(2..).unwrap_or("")))
                    .collect::<String>(),
            )]
        } else if block.starts_with("secrets: |") {
            vec![class(&block)]
        } else if block.starts_with("- ") && !block.starts_with("- alert") {
            vec![class(&format!("secrets: |\n{}", indent(&block, 2)))]
        } else {
            continue;
        };
        for class in classes {
            let (code, out, err) = check(&["-"], Some(&class));
            assert_eq!(code, 0, "README block:\n{class}\n{out}{err}");
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} classes checked");
}
