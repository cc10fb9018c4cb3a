//! `cargo xtask hostile`: what hostile documents cost the release binary, measured. The
//! emulator and the provider run as processes; N mounts carrying one hostile document are
//! fired at once, and the provider's peak resident memory (`VmHWM`) is read before and
//! after, with the outcome of each mount.
//!
//! The cases are the review's findings of issue 35:
//! - `aliases`: the `secrets` parameter, one scalar anchored once and aliased from every
//!   field of 256 entries (`--scalar` characters; the review used 14 000, ~97 KB);
//! - `keys`: a 15 KB secret of nested anchors mounted with `keys: [{key: a}]`.
//!
//! `--provider-bin` runs another build (an older release) for a "before" figure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::json;

use crate::procs::{Emulator, PROVIDER_BIN, Provider, build, build_emulator, mount_request, root};

const HELP: &str = "usage: cargo xtask hostile [--case aliases|keys] [--mounts N] [--scalar C]
                           [--provider-bin PATH] [--debug]

  --case aliases|keys  which document (default: both, one provider each)
  --mounts N           mounts fired at once (default 8; the review used 8 for aliases and 16
                       for keys)
  --scalar C           characters of the aliased scalar (default 14000)
  --provider-bin PATH  the provider binary to run (default: this workspace's build)
  --debug              use debug builds (default: release)
";

struct Options {
    cases: Vec<String>,
    mounts: usize,
    scalar: usize,
    provider_bin: Option<PathBuf>,
    release: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        cases: vec!["aliases".into(), "keys".into()],
        mounts: 8,
        scalar: 14_000,
        provider_bin: None,
        release: true,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> anyhow::Result<String> {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--case" => {
                let case = value("--case")?;
                if case != "aliases" && case != "keys" {
                    bail!("--case is aliases or keys, not {case:?}");
                }
                o.cases = vec![case];
            }
            "--mounts" => o.mounts = value("--mounts")?.parse::<usize>()?.max(1),
            "--scalar" => o.scalar = value("--scalar")?.parse()?,
            "--provider-bin" => o.provider_bin = Some(value("--provider-bin")?.into()),
            "--debug" => o.release = false,
            "-h" | "--help" => {
                eprint!("{HELP}");
                return Ok(None);
            }
            other => bail!("unknown option {other:?}\n{HELP}"),
        }
    }
    Ok(Some(o))
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = parse(args)? else {
        return Ok(());
    };
    let (emulator_dir, provider) = match &options.provider_bin {
        Some(path) => {
            let path = std::fs::canonicalize(path)
                .with_context(|| format!("--provider-bin {}", path.display()))?;
            (build_emulator(options.release)?, path)
        }
        None => {
            let bin = build(options.release)?;
            let provider = bin.join(PROVIDER_BIN);
            (bin, provider)
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    for case in &options.cases {
        runtime.block_on(measure(&emulator_dir, &provider, case, &options))?;
    }
    Ok(())
}

/// Nested anchors, ten per level, to about `max` bytes: each level a list of the previous.
fn nested_anchors(max: usize) -> String {
    let mut yaml = format!("a: &l0 [{}]\n", ["\"lol\""; 10].join(", "));
    for level in 1.. {
        let line = format!(
            "l{level}: &l{level} [{}]\n",
            vec![format!("*l{}", level - 1); 10].join(", ")
        );
        if yaml.len() + line.len() > max {
            break;
        }
        yaml.push_str(&line);
    }
    yaml
}

/// One scalar of `scalar` characters aliased from every text field of 256 entries.
fn aliased_list(scalar: usize) -> String {
    let mut yaml = format!("- name: &s {}\n", "x".repeat(scalar));
    for _ in 1..256 {
        yaml.push_str(
            "- {name: *s, secretId: *s, vaultId: *s, stage: *s, versionNumber: *s, \
             versionName: *s, fileName: *s, mode: *s, encoding: *s, format: *s, \
             failoverVaultId: *s, certificateId: *s, certificateAuthorityId: *s, \
             caBundleId: *s, directory: *s, certFileName: *s, chainFileName: *s, \
             keyFileName: *s}\n",
        );
    }
    yaml
}

fn seed(content: &str) -> String {
    let content = toml_string(content);
    format!(
        "region = \"us-ashburn-1\"\nworkload_tenancy = \"ocid1.tenancy.oc1..hostile\"\n\
         [[vaults]]\nid = \"ocid1.vault.oc1.iad.hostile\"\n\
         [instance]\ntenancy = \"ocid1.tenancy.oc1..hostileinstance\"\n\
         instance_id = \"ocid1.instance.oc1.iad.hostile\"\n\
         [[secrets]]\nid = \"ocid1.vaultsecret.oc1.iad.nested\"\nname = \"nested\"\n\
         vault_id = \"ocid1.vault.oc1.iad.hostile\"\n\
         [[secrets.versions]]\nnumber = 1\nstages = [\"CURRENT\", \"LATEST\"]\n\
         content = {{ text = {content} }}\n\
         [secrets.access]\nworkloads = [{{ namespace = \"hostile\", service_account = \"web\" }}]\n\
         [[service_accounts]]\nnamespace = \"hostile\"\nname = \"web\"\n"
    )
}

/// A TOML basic string of `text`.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The provider's peak resident set so far, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    crate::procs::status_kib(pid, "VmHWM")
}

async fn measure(
    emulator_dir: &Path,
    provider_bin: &Path,
    case: &str,
    options: &Options,
) -> anyhow::Result<()> {
    let dir = root().join("target").join("hostile").join(case);
    std::fs::create_dir_all(&dir)?;
    let content = nested_anchors(15 * 1024);
    let seed_path = dir.join("seed.toml");
    std::fs::write(&seed_path, seed(&content))?;
    let emulator = Emulator::start(emulator_dir, &seed_path, &dir.join("emulator")).await?;
    let env = [("OCI_PROVIDER_LOG__LEVEL", "error")];
    let provider = Provider::start_binary(provider_bin, &emulator.config, &dir, &env).await?;
    let pid = provider.pid().context("the provider has no pid")?;
    let secrets = match case {
        "aliases" => aliased_list(options.scalar),
        _ => "- name: nested\n  keys: [{key: a}]\n".to_owned(),
    };
    let client = csi_grpc::client::connect_unix(&provider.socket).await?;
    let before = peak_rss_kib(pid);
    let mut mounts = Vec::new();
    for pod in 0..options.mounts {
        let mut client = client.clone();
        let attributes = json!({
            "secrets": secrets,
            "vaultId": "ocid1.vault.oc1.iad.hostile",
            "authType": "workload",
            "secretProviderClass": "hostile",
            "csi.storage.k8s.io/pod.name": format!("web-{pod}"),
            "csi.storage.k8s.io/pod.namespace": "hostile",
            "csi.storage.k8s.io/pod.uid": format!("00000000-0000-0000-0000-{pod:012}"),
            "csi.storage.k8s.io/serviceAccount.name": "web",
        });
        mounts.push(tokio::spawn(async move {
            match client.mount(mount_request(attributes)).await {
                Ok(_) => "OK".to_owned(),
                Err(status) => format!("{:?}", status.code()),
            }
        }));
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for mount in mounts {
        *outcomes.entry(mount.await?).or_default() += 1;
    }
    let after = peak_rss_kib(pid);
    println!(
        "hostile {case}: {} concurrent mounts ({} bytes of secrets parameter{}), provider {}\n  \
         outcomes {outcomes:?}\n  peak RSS {:.1} MiB before the mounts, {:.1} MiB after",
        options.mounts,
        secrets.len(),
        if case == "keys" {
            format!(", a secret of {} bytes", content.len())
        } else {
            String::new()
        },
        provider_bin.display(),
        before as f64 / 1024.0,
        after as f64 / 1024.0,
    );
    let stopped = provider.stop().await;
    emulator.stop().await;
    stopped
}
