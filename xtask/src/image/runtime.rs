//! `cargo xtask image --run-test`: the image checked by independent readers and run as a
//! node runs it. skopeo inspects the layout and the archive, umoci reads it, the
//! image-spec's schemas validate it (`xtask/image/check_schemas.py`); umoci unpacks it and
//! runc runs it with a read-only root, no capabilities, `noNewPrivileges`, the host's
//! network namespace and the socket directory bind-mounted as the chart mounts it:
//! `--version`, then serving against the emulator — `/healthz` and `/readyz` from outside,
//! a Mount through the socket answering the real secret, SIGTERM removing the socket and
//! exiting 0.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

use super::Built;
use crate::artefacts::BINARY;
use crate::procs::{Emulator, build_emulator, free_port, mount_request};

/// Where the chart mounts the socket directory in the container (`provider.endpoint`).
const SOCKET_DIR: &str = "/opt/provider/sockets";
/// What the demo seed holds for `db-password` (xtask/demo/seed.toml, version 2: CURRENT).
const SECRET: &str = "correct horse battery staple (v2)";

pub(super) fn test(root: &Path, built: &Built) -> anyhow::Result<()> {
    let started = Instant::now();
    readers(root, built)?;
    let temp = tempfile::Builder::new().prefix("xtask-image-").tempdir()?;
    let bundle = temp.path().join("bundle");
    let reference = format!("{}:{}", built.layout.display(), built.tag);
    run(Command::new("umoci")
        .args(["unpack", "--image", &reference])
        .arg(&bundle))
    .context("umoci unpack")?;
    let runc = Runc::new(temp.path().join("runc"), &bundle)?;
    let version = runc.output("version", &["--version"], &[], &[])?;
    ensure!(
        version.contains(&built.tag),
        "--version in the container printed {version:?}, not {}",
        built.tag
    );
    println!("image: runc: --version: {}", version.trim());
    let emulator_bin = build_emulator(false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(root, &runc, &emulator_bin, temp.path()))?;
    println!(
        "image: the image ran under runc and mounted a secret through its socket ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// skopeo (layout and archive), umoci stat, the image-spec schemas.
fn readers(root: &Path, built: &Built) -> anyhow::Result<()> {
    let reference = format!("{}:{}", built.layout.display(), built.tag);
    for source in [
        format!("oci:{reference}"),
        format!("oci-archive:{}", built.archive.display()),
    ] {
        let text = run(Command::new("skopeo").args(["inspect", &source]))?;
        let inspect: Value = serde_json::from_slice(&text)?;
        ensure!(
            inspect["Digest"] == built.digest,
            "skopeo inspect {source}: digest {}, built {}",
            inspect["Digest"],
            built.digest
        );
        let labels = &inspect["Labels"];
        ensure!(
            labels["org.opencontainers.image.revision"] == built.revision.as_str()
                && labels["org.opencontainers.image.version"] == built.tag.as_str(),
            "skopeo inspect {source}: labels {labels}"
        );
        ensure!(
            inspect["Os"] == "linux",
            "skopeo inspect {source}: {inspect}"
        );
        println!(
            "image: skopeo inspect {}: {} {}/{}, {} layers",
            source.split(':').next().unwrap_or_default(),
            inspect["Digest"].as_str().unwrap_or_default(),
            inspect["Os"].as_str().unwrap_or_default(),
            inspect["Architecture"].as_str().unwrap_or_default(),
            inspect["Layers"].as_array().map_or(0, Vec::len),
        );
    }
    let stat: Value = serde_json::from_slice(&run(
        Command::new("umoci").args(["stat", "--json", "--image", &reference])
    )?)?;
    let history = stat["history"].as_array().map_or(0, Vec::len);
    ensure!(
        history == 2,
        "umoci stat: {history} history entries: {stat}"
    );
    println!("image: umoci stat: {history} layers with their history");
    let out = run(Command::new("python3")
        .arg(root.join("xtask/image/check_schemas.py"))
        .arg(&built.layout))?;
    print!("image: {}", String::from_utf8_lossy(&out));
    Ok(())
}

/// The emulator in its own process, the image serving under runc, a Mount, SIGTERM.
async fn serve(root: &Path, runc: &Runc, emulator_bin: &Path, dir: &Path) -> anyhow::Result<()> {
    let emulator_dir = dir.join("emulator");
    let emulator = Emulator::start(
        emulator_bin,
        &root.join("xtask/demo/seed.toml"),
        &emulator_dir,
    )
    .await?;
    let sockets = dir.join("sockets");
    std::fs::create_dir_all(&sockets)?;
    let (healthz, metrics) = (free_port()?, free_port()?);
    let args = [
        format!("--config={}", emulator.config.display()),
        format!("--healthz-port={healthz}"),
        format!("--metrics-port={metrics}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let emulator_dir = path_str(&emulator_dir)?;
    let sockets_str = path_str(&sockets)?;
    let mut child = runc.spawn(
        "serve",
        &args,
        &["OCI_PROVIDER_SERVER__BIND_ADDRESS=127.0.0.1"],
        &[
            (sockets_str.as_str(), SOCKET_DIR, "rw"),
            (emulator_dir.as_str(), emulator_dir.as_str(), "ro"),
        ],
    )?;
    let result = async {
        wait_for(&mut child, Duration::from_secs(30), || {
            http_get(healthz, "/healthz").is_ok_and(|(s, _)| s == 200)
        })
        .await
        .context("/healthz")?;
        wait_for(&mut child, Duration::from_secs(30), || {
            http_get(healthz, "/readyz").is_ok_and(|(s, _)| s == 200)
        })
        .await
        .context("/readyz")?;
        println!("image: runc: /healthz and /readyz answer 200 from outside the container");
        locked_down(runc.pid("serve")?)?;
        mount(&sockets.join("oci.sock")).await
    }
    .await;
    let stopped = runc.terminate("serve", &mut child).await;
    emulator.stop().await;
    result?;
    stopped?;
    ensure!(
        !sockets.join("oci.sock").exists(),
        "the provider exited and left its socket behind"
    );
    println!("image: runc: SIGTERM: exit 0, the socket removed");
    Ok(())
}

/// The container's process as the kernel sees it: no capability in any set, no new
/// privileges, a read-only root, and this process's network namespace.
fn locked_down(pid: u32) -> anyhow::Result<()> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or_default()
    };
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        ensure!(
            field(set).bytes().all(|b| b == b'0'),
            "the container's {set} is {}",
            field(set)
        );
    }
    ensure!(
        field("NoNewPrivs") == "1",
        "NoNewPrivs is {}",
        field("NoNewPrivs")
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .context("the container has no / in its mountinfo")?;
    ensure!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|options| options.split(',').any(|o| o == "ro")),
        "the container's root is not read-only: {root}"
    );
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net"));
    ensure!(
        ns(&pid.to_string())? == ns("self")?,
        "the container has its own network namespace"
    );
    println!(
        "image: runc: the provider runs with no capabilities, no new privileges, a read-only root, the host's network"
    );
    Ok(())
}

/// A Mount as the driver sends it, through the bind-mounted socket.
async fn mount(socket: &Path) -> anyhow::Result<()> {
    let mut client = csi_grpc::client::connect_unix(socket).await?;
    let attributes = json!({
        "secrets": "- name: db-password\n",
        "vaultId": "ocid1.vault.oc1.iad.demo",
        "authType": "instance",
        "secretProviderClass": "image-test",
        "csi.storage.k8s.io/pod.name": "image-test-0",
        "csi.storage.k8s.io/pod.namespace": "demo",
        "csi.storage.k8s.io/pod.uid": "00000000-0000-0000-0000-000000000001",
        "csi.storage.k8s.io/serviceAccount.name": "demo-app",
    });
    let response = client
        .mount(mount_request(attributes))
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "Mount through the image's socket: {:?}: {}",
                s.code(),
                s.message()
            )
        })?
        .into_inner();
    let file = response
        .files
        .iter()
        .find(|f| f.path == "db-password")
        .context("the Mount answered no db-password file")?;
    ensure!(
        file.contents == SECRET.as_bytes(),
        "the Mount answered {} bytes that are not the seeded secret",
        file.contents.len()
    );
    println!("image: runc: a Mount through the socket answered the secret from the emulator");
    Ok(())
}

/// runc with its own state directory, over one unpacked bundle.
struct Runc {
    state: PathBuf,
    bundle: PathBuf,
    config: Value,
}

impl Runc {
    fn new(state: PathBuf, bundle: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&state)?;
        let config: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
        Ok(Self {
            state,
            bundle: bundle.to_path_buf(),
            config,
        })
    }

    fn id(name: &str) -> String {
        format!("xtask-image-{}-{name}", std::process::id())
    }

    /// The bundle's config.json for one run: the image's entrypoint with `args`, `env`
    /// added, the locked-down process and root, the host network, and `mounts` (host
    /// path, container path, `rw` or `ro`) as bind mounts.
    fn configure(
        &self,
        args: &[&str],
        env: &[&str],
        mounts: &[(&str, &str, &str)],
    ) -> anyhow::Result<()> {
        let mut config = self.config.clone();
        let process = &mut config["process"];
        let mut argv: Vec<Value> = process["args"].as_array().cloned().unwrap_or_default();
        ensure!(
            argv.first().and_then(Value::as_str) == Some(&format!("/{BINARY}")),
            "umoci made the process {argv:?}, not the entrypoint"
        );
        argv.truncate(1);
        argv.extend(args.iter().map(|a| Value::from(*a)));
        process["args"] = Value::from(argv);
        process["terminal"] = Value::from(false);
        if let Some(list) = process["env"].as_array_mut() {
            list.extend(env.iter().map(|e| Value::from(*e)));
        }
        let none: Vec<String> = Vec::new();
        process["capabilities"] = json!({
            "bounding": none, "effective": none, "inheritable": none, "permitted": none, "ambient": none,
        });
        process["noNewPrivileges"] = Value::from(true);
        config["root"]["readonly"] = Value::from(true);
        if let Some(namespaces) = config["linux"]["namespaces"].as_array_mut() {
            namespaces.retain(|n| n["type"] != "network");
        }
        let mounts_list = config["mounts"]
            .as_array_mut()
            .context("config.json has no mounts")?;
        // The chart's emptyDir at /tmp under the read-only root.
        mounts_list.push(json!({
            "destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", "size=65536k"],
        }));
        for (source, destination, mode) in mounts {
            mounts_list.push(json!({
                "destination": destination, "type": "bind", "source": source,
                "options": ["rbind", mode],
            }));
        }
        std::fs::write(
            self.bundle.join("config.json"),
            serde_json::to_vec_pretty(&config)?,
        )?;
        Ok(())
    }

    fn command(&self) -> Command {
        let mut command = Command::new("runc");
        command.arg("--root").arg(&self.state);
        command
    }

    /// The host pid of a running container's process.
    fn pid(&self, name: &str) -> anyhow::Result<u32> {
        let state: Value =
            serde_json::from_slice(&run(self.command().args(["state", &Self::id(name)]))?)?;
        state["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .with_context(|| format!("runc state: no pid in {state}"))
    }

    /// Runs the container to its end; its standard output.
    fn output(
        &self,
        name: &str,
        args: &[&str],
        env: &[&str],
        mounts: &[(&str, &str, &str)],
    ) -> anyhow::Result<String> {
        self.configure(args, env, mounts)?;
        let id = Self::id(name);
        let out = run(self
            .command()
            .arg("run")
            .arg("--bundle")
            .arg(&self.bundle)
            .arg(&id)
            .stdin(Stdio::null()));
        let _ = self.command().args(["delete", "--force", &id]).output();
        Ok(String::from_utf8_lossy(&out?).into_owned())
    }

    /// Starts the container; it runs until [`Runc::terminate`].
    fn spawn(
        &self,
        name: &str,
        args: &[&str],
        env: &[&str],
        mounts: &[(&str, &str, &str)],
    ) -> anyhow::Result<tokio::process::Child> {
        self.configure(args, env, mounts)?;
        let mut command = tokio::process::Command::from(self.command());
        command
            .arg("run")
            .arg("--bundle")
            .arg(&self.bundle)
            .arg(Self::id(name))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        command.spawn().context("cannot run runc")
    }

    /// SIGTERM to the container's process (as the kubelet stops a pod); its exit status.
    async fn terminate(&self, name: &str, child: &mut tokio::process::Child) -> anyhow::Result<()> {
        let id = Self::id(name);
        let killed = run(self.command().args(["kill", &id, "TERM"]));
        let status = tokio::time::timeout(Duration::from_secs(40), child.wait()).await;
        let _ = self.command().args(["delete", "--force", &id]).output();
        killed.context("runc kill TERM")?;
        let status = status.context("the container did not exit within 40 s of SIGTERM")??;
        ensure!(
            status.success(),
            "the container exited with {status} after SIGTERM"
        );
        Ok(())
    }
}

/// Polls `ready` until it holds, the container exits, or `limit` passes.
async fn wait_for(
    child: &mut tokio::process::Child,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the container exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("no answer within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One HTTP/1.0 GET to 127.0.0.1:`port`: the status and the body.
fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn run(command: &mut Command) -> anyhow::Result<Vec<u8>> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?} (is it installed?)"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output.stdout)
}

fn path_str(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", path.display()))
}
