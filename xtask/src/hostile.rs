//! `cargo xtask hostile`: what hostile documents cost the release binary, measured. The
//! emulator and the provider run as processes; N mounts carrying one hostile document are
//! fired at once, and the provider's peak resident memory (`VmHWM`) is read before and
//! after, with the outcome of each mount.
//!
//! The cases are the reviews' findings:
//! - `aliases`: the `secrets` parameter, one scalar anchored once and aliased from every
//!   field of 256 entries (`--scalar` characters; the review used 14 000, ~97 KB);
//! - `keys`: a 15 KB secret of nested anchors mounted with `keys: [{key: a}]`;
//! - `compares`: `--templates` template entries each comparing two 24 KB documents of
//!   nested lists (under one top-level item) in a loop over a list of 4000 (the review's class had ~250; a class may
//!   now hold 32). Also measured: the provider's CPU time during the mounts, and in the
//!   second after they were answered (a render that outlives its mount shows there).
//!
//! `--provider-bin` runs another build (an older release) for a "before" figure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::json;

use crate::procs::{Emulator, PROVIDER_BIN, Provider, build, build_emulator, mount_request, root};

const HELP: &str = "usage: cargo xtask hostile [--case aliases|keys|compares] [--mounts N]
                           [--scalar C] [--templates T] [--provider-bin PATH] [--debug]

  --case aliases|keys|compares  which input (default: all, one provider each)
  --mounts N           mounts fired at once (default 8; the review used 8 for aliases and 16
                       for keys)
  --scalar C           characters of the aliased scalar (default 14000)
  --templates T        template entries of the compares class (default 32)
  --provider-bin PATH  the provider binary to run (default: this workspace's build)
  --debug              use debug builds (default: release)
";

struct Options {
    cases: Vec<String>,
    mounts: usize,
    scalar: usize,
    templates: usize,
    provider_bin: Option<PathBuf>,
    release: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        cases: vec!["aliases".into(), "keys".into(), "compares".into()],
        mounts: 8,
        scalar: 14_000,
        templates: 32,
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
                if !["aliases", "keys", "compares"].contains(&case.as_str()) {
                    bail!("--case is aliases, keys or compares, not {case:?}");
                }
                o.cases = vec![case];
            }
            "--mounts" => o.mounts = value("--mounts")?.parse::<usize>()?.max(1),
            "--scalar" => o.scalar = value("--scalar")?.parse()?,
            "--templates" => o.templates = value("--templates")?.parse::<usize>()?.max(1),
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

/// The emulator's seed: the vault and its secrets, `(name, content)`.
fn seed(secrets: &[(&str, &str)]) -> String {
    let mut seed = "region = \"us-ashburn-1\"\nworkload_tenancy = \"ocid1.tenancy.oc1..hostile\"\n\
         [[vaults]]\nid = \"ocid1.vault.oc1.iad.hostile\"\n\
         [instance]\ntenancy = \"ocid1.tenancy.oc1..hostileinstance\"\n\
         instance_id = \"ocid1.instance.oc1.iad.hostile\"\n\
         [[service_accounts]]\nnamespace = \"hostile\"\nname = \"web\"\n"
        .to_owned();
    for (name, content) in secrets {
        let content = toml_string(content);
        seed.push_str(&format!(
            "[[secrets]]\nid = \"ocid1.vaultsecret.oc1.iad.{name}\"\nname = \"{name}\"\n\
             vault_id = \"ocid1.vault.oc1.iad.hostile\"\n\
             [[secrets.versions]]\nnumber = 1\nstages = [\"CURRENT\", \"LATEST\"]\n\
             content = {{ text = {content} }}\n\
             [secrets.access]\nworkloads = [{{ namespace = \"hostile\", service_account = \"web\" }}]\n"
        ));
    }
    seed
}

/// Two documents of 24 KB of nested one-item lists and a list of 4000, and `templates`
/// template entries comparing the documents in a loop over the list.
fn compares(templates: usize) -> (Vec<(&'static str, String)>, String) {
    let items: Vec<String> = (0..3400).map(|i| format!("[{}]", i % 10)).collect();
    // One top-level item holding all the others: minijinja 3.1 charges a comparison by the
    // top-level items only.
    let doc = format!("{{\"k\": [[{}]]}}", items.join(","));
    let list = format!("{{\"k\": [{}]}}", vec!["0"; 4000].join(","));
    let mut secrets = "- name: a\n  writeFile: false\n- name: b\n  writeFile: false\n\
                       - name: l\n  writeFile: false\n"
        .to_owned();
    for i in 0..templates {
        secrets.push_str(&format!(
            "- fileName: out{i}\n  template: \"{{% for i in json('l').k %}}{{% if json('a').k == \
             json('b').k %}}{{% endif %}}{{% endfor %}}\"\n"
        ));
    }
    (vec![("a", doc.clone()), ("b", doc), ("l", list)], secrets)
}

/// The CPU time the process `pid` has used (user and system), from `/proc`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces, in parentheses).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
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
    let (seeded, secrets) = match case {
        "aliases" => (vec![], aliased_list(options.scalar)),
        "compares" => compares(options.templates),
        _ => (
            vec![("nested", content.clone())],
            "- name: nested\n  keys: [{key: a}]\n".to_owned(),
        ),
    };
    let seeded: Vec<(&str, &str)> = seeded.iter().map(|(n, c)| (*n, c.as_str())).collect();
    let seed_path = dir.join("seed.toml");
    std::fs::write(&seed_path, seed(&seeded))?;
    let emulator = Emulator::start(emulator_dir, &seed_path, &dir.join("emulator")).await?;
    let env = [("OCI_PROVIDER_LOG__LEVEL", "error")];
    let provider = Provider::start_binary(provider_bin, &emulator.config, &dir, &env).await?;
    let pid = provider.pid().context("the provider has no pid")?;
    let client = csi_grpc::client::connect_unix(&provider.socket).await?;
    let before = peak_rss_kib(pid);
    let cpu_before = cpu_seconds(pid);
    let started = std::time::Instant::now();
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
            // The driver's deadline.
            let mut request = tonic::Request::new(mount_request(attributes));
            request.set_timeout(std::time::Duration::from_secs(20));
            match client.mount(request).await {
                Ok(_) => "OK".to_owned(),
                Err(status) => format!("{:?}", status.code()),
            }
        }));
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for mount in mounts {
        *outcomes.entry(mount.await?).or_default() += 1;
    }
    let answered = started.elapsed();
    let cpu_answered = cpu_seconds(pid);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let cpu_idle = cpu_seconds(pid) - cpu_answered;
    let after = peak_rss_kib(pid);
    println!(
        "hostile {case}: answered in {answered:.2?}; provider CPU {:.2} s during the mounts \
         ({:.3} s a mount), {cpu_idle:.2} s in the second after",
        cpu_answered - cpu_before,
        (cpu_answered - cpu_before) / options.mounts as f64
    );
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
