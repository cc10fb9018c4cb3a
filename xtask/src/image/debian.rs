//! The image's base layer from Debian packages: the libraries the binary links (by `ldd`),
//! the CA bundle, the users, os-release, each package's copyright and its dpkg status entry
//! (so scanners see what is inside, as in distroless). Packages come from the archive
//! through `apt-get download`, checked against the committed lock, and are unpacked with
//! `dpkg-deb -x`; nothing is installed and no maintainer script runs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::tar::{Entry, Tree};
use crate::artefacts::sha256_hex;

/// Always in the base layer, whatever the binary links: the CA bundle's source and
/// os-release's.
const ALWAYS: [&str; 2] = ["base-files", "ca-certificates"];

/// One line of the lock: a package pinned to a version and the SHA-256 of its `.deb`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Locked {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) arch: String,
    pub(crate) sha256: String,
}

/// How the lock is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// A stale lock (a package the archive has moved past, or one the binary now needs
    /// and the lock lacks) is a warning; the archive's version is used where the locked
    /// one cannot be had.
    Warn,
    /// A release: a stale lock fails the build.
    Strict,
    /// `--update-lock`: the archive's current versions, written back to the lock.
    Update,
}

/// A package as it went into the image.
#[derive(Clone, Debug)]
pub(crate) struct Package {
    pub(crate) locked: Locked,
    /// The `DEBIAN/control` text, with `Status: install ok installed` after `Package:`.
    pub(crate) status: String,
    pub(crate) source: Option<String>,
    dir: PathBuf,
}

impl Package {
    /// `VERSION_ID` of the os-release this package ships (base-files does), for purls'
    /// `distro` qualifier.
    pub(crate) fn os_version_id(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join("usr/lib/os-release")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("VERSION_ID="))
            .map(|v| v.trim_matches('"').to_owned())
    }

    #[cfg(test)]
    pub(crate) fn for_tests(name: &str, version: &str, source: Option<&str>) -> Self {
        Self {
            locked: Locked {
                name: name.to_owned(),
                version: version.to_owned(),
                arch: "amd64".to_owned(),
                sha256: "ab".repeat(32),
            },
            status: String::new(),
            source: source.map(str::to_owned),
            dir: PathBuf::new(),
        }
    }
}

/// The base layer's tree, its packages and what was stale about the lock.
#[derive(Debug)]
pub(crate) struct Base {
    pub(crate) tree: Tree,
    pub(crate) packages: Vec<Package>,
    pub(crate) warnings: Vec<String>,
}

pub(crate) fn read_lock(path: &Path) -> anyhow::Result<BTreeMap<String, Locked>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut lock = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, version, arch, sha256] = fields.as_slice() else {
            bail!(
                "{}:{}: expected `package version architecture sha256`",
                path.display(),
                number + 1
            );
        };
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!(
                "{}:{}: {sha256} is not a SHA-256",
                path.display(),
                number + 1
            );
        }
        lock.insert(
            (*name).to_owned(),
            Locked {
                name: (*name).to_owned(),
                version: (*version).to_owned(),
                arch: (*arch).to_owned(),
                sha256: sha256.to_ascii_lowercase(),
            },
        );
    }
    Ok(lock)
}

pub(crate) fn write_lock(path: &Path, packages: &[Package]) -> anyhow::Result<()> {
    let mut text = String::from(
        "# The Debian packages of the image's base layer (`cargo xtask image`): each .deb is\n\
         # checked against its SHA-256 here on every build. `cargo xtask image --update-lock`\n\
         # rewrites this file from the archive's current versions (apt's candidates).\n\
         # package version architecture sha256\n",
    );
    for p in packages {
        let l = &p.locked;
        writeln!(text, "{} {} {} {}", l.name, l.version, l.arch, l.sha256)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// Builds the base layer for `binary` from the packages in `cache` (downloaded there
/// when missing), checked against the lock at `lock_path`.
pub(crate) fn base(
    binary: &Path,
    cache: &Path,
    lock_path: &Path,
    mode: LockMode,
) -> anyhow::Result<Base> {
    std::fs::create_dir_all(cache)?;
    let lock = read_lock(lock_path)?;
    let mut warnings = Vec::new();
    let libraries: Vec<(String, String)> = linked_libraries(binary)?
        .iter()
        .map(|lib| owner(lib))
        .collect::<anyhow::Result<_>>()?;
    let mut wanted: BTreeSet<String> = ALWAYS.iter().map(|s| (*s).to_owned()).collect();
    wanted.extend(libraries.iter().map(|(package, _)| package.clone()));
    let mut packages: BTreeMap<String, Package> = BTreeMap::new();
    // A package whose doc directory is a link to another's (libgcc-s1 → gcc-12-base) has
    // its copyright there: that package comes too.
    while let Some(name) = wanted.iter().find(|n| !packages.contains_key(*n)).cloned() {
        let package = fetch(&name, lock.get(&name), cache, mode, &mut warnings)?;
        let doc = package.dir.join("usr/share/doc").join(&name);
        if let Ok(target) = std::fs::read_link(&doc) {
            let target = target.to_string_lossy().trim_end_matches('/').to_owned();
            if !target.contains('/') {
                wanted.insert(target);
            }
        }
        packages.insert(name, package);
    }
    for name in lock.keys() {
        if !packages.contains_key(name) {
            warnings.push(format!(
                "the lock names {name}, which the image no longer needs (--update-lock drops it)"
            ));
        }
    }
    if mode == LockMode::Strict && !warnings.is_empty() {
        bail!(
            "the base layer's lock is stale (a release needs it current; run `cargo xtask image \
             --update-lock` and commit the lock):\n  {}",
            warnings.join("\n  ")
        );
    }
    let packages: Vec<Package> = packages.into_values().collect();
    let tree = layer(&packages, &libraries)?;
    if mode == LockMode::Update {
        write_lock(lock_path, &packages)?;
    }
    Ok(Base {
        tree,
        packages,
        warnings,
    })
}

/// The base layer's files from the unpacked packages.
fn layer(packages: &[Package], libraries: &[(String, String)]) -> anyhow::Result<Tree> {
    let by_name: BTreeMap<&str, &Package> = packages
        .iter()
        .map(|p| (p.locked.name.as_str(), p))
        .collect();
    let mut tree = Tree::default();
    for (package, path) in libraries {
        let dirs: Vec<&Path> = packages.iter().map(|p| p.dir.as_path()).collect();
        let first = by_name
            .get(package.as_str())
            .with_context(|| format!("{package} was not fetched"))?;
        copy_following_links(&mut tree, &first.dir, &dirs, path)?;
    }
    let certificates = by_name
        .get("ca-certificates")
        .context("ca-certificates was not fetched")?;
    tree.add(Entry::file(
        "etc/ssl/certs/ca-certificates.crt",
        0o644,
        ca_bundle(&certificates.dir)?,
    ))?;
    let base_files = by_name
        .get("base-files")
        .context("base-files was not fetched")?;
    copy_following_links(
        &mut tree,
        &base_files.dir,
        &[&base_files.dir],
        "/etc/os-release",
    )?;
    for package in packages {
        let name = &package.locked.name;
        let doc = format!("usr/share/doc/{name}");
        let dir = package.dir.join(&doc);
        if let Ok(target) = std::fs::read_link(&dir) {
            tree.add(Entry::symlink(&doc, &target.to_string_lossy()))?;
        } else {
            let copyright = std::fs::read(dir.join("copyright"))
                .with_context(|| format!("{name} has no {doc}/copyright"))?;
            tree.add(Entry::file(&format!("{doc}/copyright"), 0o644, copyright))?;
        }
        tree.add(Entry::file(
            &format!("var/lib/dpkg/status.d/{name}"),
            0o644,
            package.status.clone().into_bytes(),
        ))?;
    }
    users(&mut tree)?;
    Ok(tree)
}

/// passwd, group and nsswitch.conf with root, nobody and nonroot (65532, distroless's),
/// their homes, and a `/tmp` anyone may write.
fn users(tree: &mut Tree) -> anyhow::Result<()> {
    tree.add(Entry::file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/sbin/nologin\n\
          nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
          nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
            .to_vec(),
    ))?;
    tree.add(Entry::file(
        "etc/group",
        0o644,
        b"root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n".to_vec(),
    ))?;
    tree.add(Entry::file(
        "etc/nsswitch.conf",
        0o644,
        b"passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
          protocols: files\nservices: files\n"
            .to_vec(),
    ))?;
    tree.add(Entry::dir("root", 0o700))?;
    tree.add(Entry::dir("home/nonroot", 0o700).owner(65532, 65532))?;
    tree.add(Entry::dir("tmp", 0o1777))?;
    Ok(())
}

/// Adds `path` from `dir` (an unpacked package); a symbolic link is added as one and its
/// target followed, in any of the unpacked packages, until a file.
fn copy_following_links(
    tree: &mut Tree,
    dir: &Path,
    dirs: &[&Path],
    path: &str,
) -> anyhow::Result<()> {
    let mut path = path.trim_start_matches('/').to_owned();
    for _ in 0..16 {
        let source = std::iter::once(dir)
            .chain(dirs.iter().copied())
            .map(|d| d.join(&path))
            .find(|p| p.symlink_metadata().is_ok())
            .with_context(|| format!("/{path} is in none of the base layer's packages"))?;
        let meta = source.symlink_metadata()?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&source)?.to_string_lossy().into_owned();
            tree.add(Entry::symlink(&path, &target))?;
            path = match target.strip_prefix('/') {
                Some(absolute) => absolute.to_owned(),
                None => {
                    let parent = Path::new(&path).parent().unwrap_or(Path::new(""));
                    normalize(&parent.join(&target))?
                }
            };
            continue;
        }
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o7777;
        tree.add(Entry::file(&path, mode, std::fs::read(&source)?))?;
        return Ok(());
    }
    bail!("/{path}: too many symbolic links")
}

/// `a/b/../c` → `a/c`, refusing to leave the root.
fn normalize(path: &Path) -> anyhow::Result<String> {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            std::path::Component::ParentDir => {
                parts
                    .pop()
                    .with_context(|| format!("{} leaves the root", path.display()))?;
            }
            _ => {}
        }
    }
    Ok(parts.join("/"))
}

/// `/etc/ssl/certs/ca-certificates.crt` as `update-ca-certificates` makes it from the
/// package's defaults: every certificate of `usr/share/ca-certificates`, in byte order of
/// their names, each ending in a newline.
fn ca_bundle(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let root = dir.join("usr/share/ca-certificates");
    let mut names = Vec::new();
    for sub in std::fs::read_dir(&root)? {
        let sub = sub?.path();
        for file in std::fs::read_dir(&sub)? {
            let file = file?.path();
            if file.extension().is_some_and(|e| e == "crt") {
                names.push(file.strip_prefix(&root)?.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    if names.is_empty() {
        bail!("ca-certificates holds no certificates");
    }
    let mut bundle = Vec::new();
    for name in names {
        let mut pem = std::fs::read(root.join(&name))?;
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        bundle.extend_from_slice(&pem);
    }
    Ok(bundle)
}

/// The shared objects the loader maps for `binary` (the interpreter included), as `ldd`
/// resolves them on this machine.
pub(crate) fn linked_libraries(binary: &Path) -> anyhow::Result<Vec<String>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        if text.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_ldd(&text)
}

fn parse_ldd(text: &str) -> anyhow::Result<Vec<String>> {
    let mut libraries = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("ldd: a library is missing: {line}");
        }
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libraries.push(path.to_owned());
        }
    }
    libraries.sort();
    libraries.dedup();
    Ok(libraries)
}

/// The package holding `path`, and the path as that package ships it (a merged-/usr
/// machine resolves `/lib` to `/usr/lib`; the package may say either).
fn owner(path: &str) -> anyhow::Result<(String, String)> {
    let mut candidates = vec![path.to_owned()];
    if let Some(rest) = path.strip_prefix("/usr") {
        candidates.push(rest.to_owned());
    } else {
        candidates.push(format!("/usr{path}"));
    }
    for candidate in &candidates {
        let output = Command::new("dpkg")
            .args(["-S", candidate])
            .output()
            .context("cannot run dpkg -S")?;
        if !output.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&output.stdout);
        for line in text.lines() {
            if line.starts_with("diversion by") {
                continue;
            }
            if let Some((packages, shipped)) = line.split_once(": ")
                && shipped == candidate
            {
                let package = packages.split(',').next().unwrap_or(packages).trim();
                let package = package.split(':').next().unwrap_or(package);
                return Ok((package.to_owned(), candidate.clone()));
            }
        }
    }
    bail!("no Debian package ships {path} (dpkg -S)")
}

/// An `apt-cache show` stanza's fields.
fn apt_show(spec: &str) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let output = Command::new("apt-cache")
        .args(["show", "--no-all-versions", spec])
        .output()
        .context("cannot run apt-cache")?;
    if !output.status.success() || output.stdout.is_empty() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let stanza = text.split("\n\n").next().unwrap_or_default();
    Ok(Some(
        stanza
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
            .collect(),
    ))
}

/// Fetches and unpacks one package: the locked version when the archive still has it
/// (else, outside a release, the archive's), its `.deb` checked against the lock.
fn fetch(
    name: &str,
    locked: Option<&Locked>,
    cache: &Path,
    mode: LockMode,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Package> {
    let candidate = apt_show(name)?
        .with_context(|| format!("apt knows no package {name} (is `apt-get update` needed?)"))?;
    let field = |stanza: &BTreeMap<String, String>, key: &str| {
        stanza
            .get(key)
            .cloned()
            .with_context(|| format!("apt-cache show {name}: no {key}"))
    };
    let current = field(&candidate, "Version")?;
    let mut chosen = candidate.clone();
    match (locked, mode) {
        (_, LockMode::Update) => {}
        (None, _) => warnings.push(format!(
            "{name} is not in the lock: the archive's {current} is used unchecked"
        )),
        (Some(l), _) => {
            if l.version != current {
                warnings.push(format!(
                    "{name}: the lock has {}, the archive now {current}",
                    l.version
                ));
            }
            match apt_show(&format!("{name}={}", l.version))? {
                Some(stanza) => chosen = stanza,
                None if mode == LockMode::Strict => {
                    bail!("{name} {} (locked) is no longer in the archive", l.version)
                }
                None => warnings.push(format!(
                    "{name} {} (locked) is no longer in the archive: {current} is used",
                    l.version
                )),
            }
        }
    }
    let version = field(&chosen, "Version")?;
    let arch = field(&chosen, "Architecture")?;
    let index_sha = field(&chosen, "SHA256")?.to_ascii_lowercase();
    let deb = download(name, &version, &arch, cache)?;
    let sha256 = sha256_hex(&std::fs::read(&deb)?);
    if sha256 != index_sha {
        bail!(
            "{} has SHA-256 {sha256}, the archive's index says {index_sha}",
            deb.display()
        );
    }
    if let Some(l) = locked.filter(|l| l.version == version && mode != LockMode::Update)
        && l.sha256 != sha256
    {
        bail!(
            "{name} {version}: the .deb's SHA-256 is {sha256}, the lock says {}",
            l.sha256
        );
    }
    let dir = cache
        .join("unpacked")
        .join(format!("{name}_{version}_{arch}"));
    if !dir.join(".done").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
        std::fs::write(dir.join(".done"), "")?;
    }
    let control = String::from_utf8(run(Command::new("dpkg-deb")
        .arg("-I")
        .arg(&deb)
        .arg("control"))?)
    .context("the control file is not UTF-8")?;
    let source = control
        .lines()
        .find_map(|l| l.strip_prefix("Source: "))
        .map(|s| s.split_whitespace().next().unwrap_or(s).to_owned());
    Ok(Package {
        locked: Locked {
            name: name.to_owned(),
            version,
            arch,
            sha256,
        },
        status: status_entry(&control),
        source,
        dir,
    })
}

/// The control file as a dpkg status entry: `Status: install ok installed` after the
/// `Package:` line.
fn status_entry(control: &str) -> String {
    let mut out = String::new();
    for line in control.lines() {
        out.push_str(line);
        out.push('\n');
        if line.starts_with("Package: ") {
            out.push_str("Status: install ok installed\n");
        }
    }
    out
}

/// `apt-get download name=version` into `cache` unless it is there already.
fn download(name: &str, version: &str, arch: &str, cache: &Path) -> anyhow::Result<PathBuf> {
    let file = cache.join(format!("{name}_{}_{arch}.deb", version.replace(':', "%3a")));
    if file.exists() {
        return Ok(file);
    }
    let mut command = Command::new("apt-get");
    command.current_dir(cache).arg("download").arg("-q");
    if is_root() {
        // apt's sandbox user cannot write to a directory of ours.
        command.args(["-o", "APT::Sandbox::User=root"]);
    }
    run(command.arg(format!("{name}={version}")))
        .with_context(|| format!("cannot download {name} {version}"))?;
    if !file.exists() {
        bail!("apt-get download left no {}", file.display());
    }
    Ok(file)
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn run(command: &mut Command) -> anyhow::Result<Vec<u8>> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_loader_and_each_library_once() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd5a1e6000)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f2b1c000000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2b1be1f000)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f2b1d6a1000)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
        assert!(parse_ldd("\tlibssl.so.3 => not found\n").is_err());
    }

    #[test]
    fn the_lock_reads_back_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let package = |name: &str| Package {
            locked: Locked {
                name: name.to_owned(),
                version: "1:2.36-9+deb12u14".to_owned(),
                arch: "amd64".to_owned(),
                sha256: "ab".repeat(32),
            },
            status: String::new(),
            source: None,
            dir: PathBuf::new(),
        };
        write_lock(&path, &[package("libc6"), package("libgcc-s1")]).unwrap();
        let lock = read_lock(&path).unwrap();
        assert_eq!(lock.len(), 2);
        assert_eq!(lock["libc6"], package("libc6").locked);
        std::fs::write(&path, "libc6 2.36 amd64 nothex\n").unwrap();
        assert!(read_lock(&path).is_err());
    }

    #[test]
    fn a_status_entry_is_the_control_file_marked_installed() {
        let entry = status_entry("Package: libc6\nSource: glibc\nVersion: 2.36\n");
        assert_eq!(
            entry,
            "Package: libc6\nStatus: install ok installed\nSource: glibc\nVersion: 2.36\n"
        );
    }

    #[test]
    fn relative_link_targets_are_resolved_inside_the_root() {
        assert_eq!(
            normalize(Path::new("etc/../usr/lib/os-release")).unwrap(),
            "usr/lib/os-release"
        );
        assert!(normalize(Path::new("../../x")).is_err());
    }
}
