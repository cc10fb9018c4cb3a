//! `cargo xtask release <version> [--dry-run]`: bump every version, write the changelog,
//! run the checks, dry-run the crates.io publication, build the artefacts and the image, pin
//! the deployments to the image's digest, tag. Never pushes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::artefacts;
use crate::dist;
use crate::image::LockMode;
use crate::procs::root;

const USAGE: &str = "usage: cargo xtask release <version> [--dry-run] [--skip-tests]

Refuses a dirty tree or an existing tag v<version>. Then: bumps the workspace's version (every
crate, the path dependencies' requirements, Cargo.lock), the chart's version and appVersion
and the image tags in deploy/; writes a CHANGELOG.md section from the commits since the last
tag; commits \"release: v<version>\"; runs fmt, clippy, check-deps, the deploy checks and the
tests; `cargo publish --workspace --dry-run`; builds the release tarballs, the OCI image of
this machine's target (its Debian lock must be current), the SBOM and SHA256SUMS (`cargo
xtask dist`) into target/dist/v<version>/; pins the chart's own image (Chart.yaml),
deploy/provider.yaml and the sync-controller block to its tag@digest and commits that (the
image's revision label names the first commit, whose sources the second keeps); creates the
annotated tag on it.
Nothing is pushed: push the commits, the tag and the image (skopeo copy) yourself.

--dry-run does all of it on a temporary clone and lists the artefacts; the tree, its refs
and its tags stay as they were. --skip-tests leaves out the test run.";

const CHART: &str = "deploy/helm/oci-secrets-store-csi-driver-provider/Chart.yaml";
const PLAIN: &str = "deploy/provider.yaml";
/// The sync controller's sidecar block names our image too.
const SIDECAR: &str = "deploy/sync-controller/values.yaml";

/// Which of the heavy steps run (all of them from the command line; the fixture tests
/// run the bookkeeping alone).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Steps {
    pub(crate) checks: bool,
    pub(crate) tests: bool,
    pub(crate) publish: bool,
    pub(crate) build: bool,
}

impl Steps {
    #[cfg(test)]
    const BOOKKEEPING: Self = Self {
        checks: false,
        tests: false,
        publish: false,
        build: false,
    };
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut version = None;
    let mut dry_run = false;
    let mut tests = true;
    for arg in args {
        match arg.as_str() {
            "--dry-run" => dry_run = true,
            "--skip-tests" => tests = false,
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other if other.starts_with('-') => bail!("unknown option {other:?}\n\n{USAGE}"),
            other => version = Some(other.trim_start_matches('v').to_owned()),
        }
    }
    let version = version.with_context(|| format!("which version?\n\n{USAGE}"))?;
    let steps = Steps {
        checks: true,
        tests,
        publish: true,
        build: true,
    };
    let root = root();
    let report = if dry_run {
        dry_run_release(&root, &version, steps)?
    } else {
        let out = root.join("target").join("dist").join(format!("v{version}"));
        release(&root, &version, steps, &out, None)?
    };
    println!("{}", report.summary(dry_run));
    dist::print_artefacts(&report.artefacts)?;
    Ok(())
}

/// What a release did.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) version: String,
    pub(crate) previous: String,
    pub(crate) tag: String,
    pub(crate) changed: Vec<String>,
    pub(crate) changelog: String,
    pub(crate) steps_run: Vec<String>,
    pub(crate) artefacts: Vec<PathBuf>,
    /// `repository:tag@digest` of the image built, and its oci-archive.
    pub(crate) image: Option<(String, PathBuf)>,
}

impl Report {
    fn summary(&self, dry_run: bool) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\nrelease {} -> {}{}",
            self.previous,
            self.version,
            if dry_run {
                " (dry run: on a temporary clone; nothing here changed)"
            } else {
                ""
            }
        );
        let _ = writeln!(s, "files bumped: {}", self.changed.join(", "));
        let _ = writeln!(s, "steps: {}", self.steps_run.join("; "));
        let _ = writeln!(
            s,
            "tag: {} (not pushed){}",
            self.tag,
            if dry_run {
                " — in the clone only"
            } else {
                ""
            }
        );
        if let Some((reference, archive)) = &self.image {
            let (name, _) = reference.split_once('@').unwrap_or((reference, ""));
            let _ = writeln!(
                s,
                "image: {reference} (the chart, deploy/provider.yaml and the sync-controller \
                 block pin it)\n  push it: skopeo copy oci-archive:{} docker://{name}",
                archive.display()
            );
        }
        let _ = writeln!(s, "\nCHANGELOG.md section:\n{}", self.changelog);
        let _ = write!(s, "artefacts:");
        s
    }
}

/// The release on a temporary clone of `root`'s HEAD (refused when `root` is dirty, since
/// the clone would not have the changes). The build cache is `root/target/xtask-release`,
/// kept between runs and apart from the tree's own builds.
pub(crate) fn dry_run_release(root: &Path, version: &str, steps: Steps) -> anyhow::Result<Report> {
    preflight(root, version)?;
    let temp = tempfile::Builder::new()
        .prefix("xtask-release-")
        .tempdir()?;
    let clone = temp.path().join("repo");
    git(
        root,
        &[
            "clone",
            "--quiet",
            "--no-hardlinks",
            ".",
            &path_str(&clone)?,
        ],
    )?;
    for key in ["user.name", "user.email"] {
        let value =
            git(root, &["config", key]).unwrap_or_else(|_| "xtask release dry run".to_owned());
        git(&clone, &["config", key, value.trim()])?;
    }
    let out = temp.path().join("dist");
    let cache = root.join("target").join("xtask-release");
    let mut report = release(&clone, version, steps, &out, Some(&cache))?;
    // Keep the artefacts past the temporary directory for the listing.
    let keep = root
        .join("target")
        .join("xtask-release")
        .join(format!("dist-v{version}"));
    if keep.exists() {
        std::fs::remove_dir_all(&keep)?;
    }
    std::fs::create_dir_all(&keep)?;
    let mut kept = Vec::new();
    for file in &report.artefacts {
        let to = keep.join(file.file_name().context("artefact without a name")?);
        std::fs::copy(file, &to)?;
        if let Some((_, archive)) = &mut report.image
            && archive == file
        {
            *archive = to.clone();
        }
        kept.push(to);
    }
    let changelog = keep.join("CHANGELOG.md");
    std::fs::copy(clone.join("CHANGELOG.md"), &changelog)?;
    kept.push(changelog);
    report.artefacts = kept;
    Ok(report)
}

/// Refusals that come before anything changes.
fn preflight(root: &Path, version: &str) -> anyhow::Result<String> {
    // No optional locks: a status must not even refresh the index (the dry run's promise).
    let status = git(root, &["--no-optional-locks", "status", "--porcelain"])?;
    if !status.trim().is_empty() {
        bail!(
            "the tree is dirty; commit or stash first:\n{}",
            status.trim_end()
        );
    }
    let tag = format!("v{version}");
    if git(
        root,
        &["rev-parse", "-q", "--verify", &format!("refs/tags/{tag}")],
    )
    .is_ok()
    {
        bail!("tag {tag} already exists");
    }
    let new = parse_version(version)?;
    let previous = artefacts::workspace_version(root)?;
    if new <= parse_version(&previous)? {
        bail!("version {version} is not above the current {previous}");
    }
    Ok(previous)
}

/// The release in `dir`, a clean work tree.
pub(crate) fn release(
    dir: &Path,
    version: &str,
    steps: Steps,
    out: &Path,
    target_dir: Option<&Path>,
) -> anyhow::Result<Report> {
    let previous = preflight(dir, version)?;
    let tag = format!("v{version}");
    let mut changed = bump(dir, &previous, version)?;
    let last_tag = git(dir, &["describe", "--tags", "--abbrev=0"])
        .ok()
        .map(|t| t.trim().to_owned());
    let commits = commits_since(dir, last_tag.as_deref())?;
    let section = changelog_section(version, &today(dir)?, last_tag.as_deref(), &commits);
    write_changelog(dir, &section)?;
    changed.push("CHANGELOG.md".to_owned());
    let mut steps_run = vec![format!(
        "bumped {previous} -> {version}, {} commits in the changelog",
        commits.len()
    )];
    let cargo = artefacts::cargo();
    let run = |what: &str, program: &str, args: &[&str]| -> anyhow::Result<()> {
        println!("release: {what}");
        let mut command = Command::new(program);
        command.current_dir(dir).args(args);
        if let Some(target_dir) = target_dir {
            command.env("CARGO_TARGET_DIR", target_dir);
        }
        let status = command
            .status()
            .with_context(|| format!("cannot run {program}"))?;
        if !status.success() {
            bail!("release stopped: {what} failed ({status})");
        }
        Ok(())
    };
    if steps.checks {
        // The chart's renderings carry the version: regenerate, then check them.
        run(
            "regenerate deploy/ from the chart",
            "python3",
            &["deploy/check.py", "--write"],
        )?;
    }
    git(dir, &["add", "--all"])?;
    git(
        dir,
        &["commit", "--quiet", "-m", &format!("release: {tag}")],
    )?;
    steps_run.push(format!("committed \"release: {tag}\""));
    if steps.checks {
        run("cargo fmt --check", &cargo, &["fmt", "--all", "--check"])?;
        run(
            "cargo clippy",
            &cargo,
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        )?;
        run("check-deps", &cargo, &["xtask", "check-deps"])?;
        run("deploy checks", "python3", &["deploy/check.py"])?;
        steps_run.push("fmt, clippy, check-deps, deploy checks passed".to_owned());
    }
    if steps.tests {
        run(
            "tests",
            &cargo,
            &["nextest", "run", "--workspace", "--locked"],
        )?;
        steps_run.push("tests passed".to_owned());
    }
    if steps.publish {
        run(
            "cargo publish --workspace --dry-run",
            &cargo,
            &["publish", "--workspace", "--dry-run", "--locked"],
        )?;
        steps_run.push("cargo publish --dry-run of every publishable crate passed".to_owned());
    }
    let mut artefacts = Vec::new();
    let mut image = None;
    if steps.build {
        let targets = dist::installed_targets()?;
        let built = dist::build(
            dir,
            version,
            &targets,
            out,
            target_dir,
            Some(LockMode::Strict),
        )?;
        artefacts = built.artefacts;
        steps_run.push(format!(
            "built {} for {}",
            artefacts::BINARY,
            targets.join(", ")
        ));
        if let Some(built) = built.image {
            let reference = built.reference();
            pin_image(dir, version, &built.digest)?;
            if steps.checks {
                run(
                    "regenerate deploy/ with the pinned image",
                    "python3",
                    &["deploy/check.py", "--write"],
                )?;
                run("deploy checks", "python3", &["deploy/check.py"])?;
            }
            git(dir, &["add", "--all"])?;
            git(
                dir,
                &[
                    "commit",
                    "--quiet",
                    "-m",
                    &format!(
                        "release: {tag}: pin the image\n\n{reference}\n\nBuilt from the previous commit (its revision label); this one only pins\nthe chart, deploy/provider.yaml and the sync-controller block to it."
                    ),
                ],
            )?;
            steps_run.push(format!(
                "built the image {reference} and pinned deploy/ to it"
            ));
            image = Some((reference, built.archive));
        }
    }
    git(
        dir,
        &[
            "tag",
            "--annotate",
            &tag,
            "-m",
            &format!("{tag}\n\n{section}"),
        ],
    )?;
    steps_run.push(format!("tagged {tag}"));
    Ok(Report {
        version: version.to_owned(),
        previous,
        tag,
        changed,
        changelog: section,
        steps_run,
        artefacts,
        image,
    })
}

/// Pins the chart's own image (Chart.yaml's annotation), the plain manifests' and the
/// sync-controller block's to `digest`: `repository:tag@digest`.
pub(crate) fn pin_image(dir: &Path, version: &str, digest: &str) -> anyhow::Result<()> {
    let image = format!("{}:{version}", artefacts::BINARY);
    for file in [CHART, PLAIN, SIDECAR] {
        let path = dir.join(file);
        if !path.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let replaced = retag(&text, &image, &format!("{image}@{digest}"));
        if replaced == text {
            bail!("{file} names no {image} image to pin");
        }
        std::fs::write(&path, replaced)?;
    }
    Ok(())
}

/// `text` with every `image` (a `name:tag`), and any `@sha256:…` after it, as `with`.
fn retag(text: &str, image: &str, with: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(image) {
        out.push_str(&rest[..at]);
        out.push_str(with);
        rest = &rest[at + image.len()..];
        if let Some(pinned) = rest.strip_prefix("@sha256:")
            && pinned.len() >= 64
            && pinned.as_bytes()[..64].iter().all(u8::is_ascii_hexdigit)
        {
            rest = &pinned[64..];
        }
    }
    out.push_str(rest);
    out
}

/// `MAJOR.MINOR.PATCH` with an optional `-pre` (ordered before the release).
fn parse_version(text: &str) -> anyhow::Result<(u64, u64, u64, u8, String)> {
    let (core, pre) = text.split_once('-').unwrap_or((text, ""));
    let parts: Vec<&str> = core.split('.').collect();
    let number = |s: &str| -> anyhow::Result<u64> {
        if s.is_empty()
            || (s.len() > 1 && s.starts_with('0'))
            || !s.bytes().all(|b| b.is_ascii_digit())
        {
            bail!("version {text:?}: not MAJOR.MINOR.PATCH[-PRE]");
        }
        Ok(s.parse()?)
    };
    let [major, minor, patch] = parts.as_slice() else {
        bail!("version {text:?}: not MAJOR.MINOR.PATCH[-PRE]");
    };
    if !pre
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        bail!("version {text:?}: the pre-release part may hold [0-9A-Za-z.-] only");
    }
    Ok((
        number(major)?,
        number(minor)?,
        number(patch)?,
        u8::from(pre.is_empty()),
        pre.to_owned(),
    ))
}

/// Rewrites every version: returns the files changed.
fn bump(dir: &Path, previous: &str, version: &str) -> anyhow::Result<Vec<String>> {
    let mut changed = Vec::new();
    // Cargo.toml: [workspace.package] version, and the requirement of every path dependency
    // in [workspace.dependencies] (the crates publish against each other's new version).
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)?;
    let old = format!("version = \"{previous}\"");
    let new = format!("version = \"{version}\"");
    let mut section = String::new();
    let mut out = String::new();
    let mut edits = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            section = trimmed.to_owned();
        }
        let bumps = match section.as_str() {
            "[workspace.package]" => trimmed.starts_with("version = "),
            "[workspace.dependencies]" => trimmed.contains("path = \"") && line.contains(&old),
            _ => false,
        };
        if bumps && line.contains(&old) {
            out.push_str(&line.replacen(&old, &new, 1));
            edits += 1;
        } else {
            out.push_str(line);
        }
    }
    if edits == 0 {
        bail!("Cargo.toml has no {old} to bump");
    }
    std::fs::write(&manifest, out)?;
    changed.push("Cargo.toml".to_owned());
    // Cargo.lock follows the workspace's versions.
    let status = Command::new(artefacts::cargo())
        .current_dir(dir)
        .args(["update", "--workspace", "--offline", "--quiet"])
        .status()?;
    if !status.success() {
        bail!("cargo update --workspace failed");
    }
    changed.push("Cargo.lock".to_owned());
    // The chart.
    let chart = dir.join(CHART);
    if chart.exists() {
        let text = std::fs::read_to_string(&chart)?;
        let mut out = String::new();
        // The annotation naming the chart's own image: the new tag, the old digest dropped.
        let text = retag(
            &text,
            &format!("{}:{previous}", artefacts::BINARY),
            &format!("{}:{version}", artefacts::BINARY),
        );
        for line in text.split_inclusive('\n') {
            if line.starts_with("version: ") {
                out.push_str(&format!("version: {version}\n"));
            } else if line.starts_with("appVersion: ") {
                out.push_str(&format!("appVersion: \"{version}\"\n"));
            } else {
                out.push_str(line);
            }
        }
        std::fs::write(&chart, out)?;
        changed.push(CHART.to_owned());
    }
    // The plain manifests: image tag and the version labels (deploy/check.py regenerates
    // and checks them when the checks run).
    let plain = dir.join(PLAIN);
    if plain.exists() {
        let text = std::fs::read_to_string(&plain)?;
        // The previous release's digest goes with its tag (the new one is pinned after
        // the image is built).
        let replaced = retag(
            &text,
            &format!("{}:{previous}", artefacts::BINARY),
            &format!("{}:{version}", artefacts::BINARY),
        )
        .replace(
            &format!("app.kubernetes.io/version: {previous}\n"),
            &format!("app.kubernetes.io/version: {version}\n"),
        )
        .replace(
            &format!("app.kubernetes.io/version: '{previous}'"),
            &format!("app.kubernetes.io/version: '{version}'"),
        )
        .replace(
            &format!("{}-{previous}", artefacts::BINARY),
            &format!("{}-{version}", artefacts::BINARY),
        );
        if replaced == text {
            bail!("{PLAIN} names no {}:{previous} image", artefacts::BINARY);
        }
        std::fs::write(&plain, replaced)?;
        changed.push(PLAIN.to_owned());
    }
    let sidecar = dir.join(SIDECAR);
    if sidecar.exists() {
        let text = std::fs::read_to_string(&sidecar)?;
        let image = |v: &str| format!("{}:{v}", artefacts::BINARY);
        let replaced = retag(&text, &image(previous), &image(version));
        if replaced == text {
            bail!("{SIDECAR} names no {}:{previous} image", artefacts::BINARY);
        }
        std::fs::write(&sidecar, replaced)?;
        changed.push(SIDECAR.to_owned());
    }
    Ok(changed)
}

/// A commit: its subject and whether its body declares a breaking change.
#[derive(Debug)]
pub(crate) struct Commit {
    pub(crate) hash: String,
    pub(crate) subject: String,
    pub(crate) breaking: bool,
}

fn commits_since(dir: &Path, tag: Option<&str>) -> anyhow::Result<Vec<Commit>> {
    let range = tag.map_or_else(|| "HEAD".to_owned(), |t| format!("{t}..HEAD"));
    let log = git(
        dir,
        &["log", "--no-merges", "--format=%h%x1f%s%x1f%b%x1e", &range],
    )?;
    Ok(log
        .split('\u{1e}')
        .filter_map(|record| {
            let mut fields = record.trim_start_matches('\n').split('\u{1f}');
            let hash = fields.next()?.trim().to_owned();
            let subject = fields.next()?.trim().to_owned();
            let body = fields.next().unwrap_or_default();
            if hash.is_empty() || subject.starts_with("release: ") {
                return None;
            }
            Some(Commit {
                hash,
                breaking: body.contains("BREAKING CHANGE") || body.contains("BREAKING-CHANGE"),
                subject,
            })
        })
        .collect())
}

/// Conventional-commit groups, in the order a reader wants them.
const GROUPS: &[(&str, &str)] = &[
    ("feat", "Features"),
    ("fix", "Fixes"),
    ("perf", "Performance"),
    ("security", "Security"),
    ("refactor", "Refactoring"),
    ("docs", "Documentation"),
    ("test", "Tests"),
    ("build", "Build and CI"),
    ("ci", "Build and CI"),
    ("chore", "Chores"),
];

/// The changelog section for `version`: breaking changes first, then the conventional
/// groups; subjects that are not conventional (`area: text` with another word, or none)
/// go under "Other changes" as they are.
pub(crate) fn changelog_section(
    version: &str,
    date: &str,
    since: Option<&str>,
    commits: &[Commit],
) -> String {
    let mut groups: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut breaking = Vec::new();
    let other = GROUPS.len();
    for commit in commits {
        let (kind, scope, bang, text) = conventional(&commit.subject);
        let index = kind.and_then(|k| GROUPS.iter().position(|(t, _)| *t == k));
        let line = match (index, scope) {
            (Some(_), Some(scope)) => format!("- **{scope}**: {text} ({})", commit.hash),
            (Some(_), None) => format!("- {text} ({})", commit.hash),
            (None, _) => format!("- {} ({})", commit.subject, commit.hash),
        };
        if bang || commit.breaking {
            breaking.push(line.clone());
        }
        // Both "build" and "ci" land in one heading.
        let index = index.map(|i| GROUPS.iter().position(|g| g.1 == GROUPS[i].1).unwrap_or(i));
        groups.entry(index.unwrap_or(other)).or_default().push(line);
    }
    let mut s = format!("## [{version}] - {date}\n");
    if let Some(since) = since {
        let _ = writeln!(s, "\nChanges since {since}.");
    }
    if !breaking.is_empty() {
        let _ = writeln!(s, "\n### Breaking changes\n");
        for line in &breaking {
            let _ = writeln!(s, "{line}");
        }
    }
    for (index, lines) in &groups {
        let title = GROUPS.get(*index).map_or("Other changes", |g| g.1);
        let _ = writeln!(s, "\n### {title}\n");
        for line in lines.iter().rev() {
            let _ = writeln!(s, "{line}");
        }
    }
    if commits.is_empty() {
        let _ = writeln!(s, "\nNo changes.");
    }
    s
}

/// `type(scope)!: text` → (type, scope, breaking, text) when `type` is a conventional one.
fn conventional(subject: &str) -> (Option<&str>, Option<&str>, bool, &str) {
    let Some((head, text)) = subject.split_once(": ") else {
        return (None, None, false, subject);
    };
    let (head, bang) = head.strip_suffix('!').map_or((head, false), |h| (h, true));
    let (kind, scope) = match head.split_once('(') {
        Some((kind, rest)) => (kind, rest.strip_suffix(')')),
        None => (head, None),
    };
    if GROUPS.iter().any(|(t, _)| *t == kind) {
        (Some(kind), scope, bang, text)
    } else {
        (None, None, false, subject)
    }
}

fn write_changelog(dir: &Path, section: &str) -> anyhow::Result<()> {
    let path = dir.join("CHANGELOG.md");
    let header = "# Changelog\n\nEvery release's changes, newest first, written by `cargo xtask release` from\nthe commits since the previous tag (conventional types grouped; others as they are).\n";
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    let rest = existing
        .split_once("\n## ")
        .map(|(_, rest)| format!("\n## {rest}"))
        .unwrap_or_default();
    std::fs::write(&path, format!("{header}\n{section}{rest}"))?;
    Ok(())
}

/// The date of HEAD's commit (so a re-run on the same commit writes the same section).
fn today(dir: &Path) -> anyhow::Result<String> {
    Ok(git(dir, &["log", "-1", "--format=%cs"])?.trim().to_owned())
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .context("cannot run git")?;
    if !output.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn path_str(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small workspace shaped like ours: two crates (one a path dependency of the other),
    /// the chart, the plain manifests; history with a tag and conventional and other commits.
    fn fixture() -> tempfile::TempDir {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let write = |path: &str, text: &str| {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"crates/a\", \"crates/b\"]\nresolver = \"3\"\n\n[workspace.package]\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace.dependencies]\na = { path = \"crates/a\", version = \"0.1.0\" }\nunrelated = { version = \"0.1.0\", default-features = false }\n",
        );
        write(
            "crates/a/Cargo.toml",
            "[package]\nname = \"a\"\nversion.workspace = true\nedition.workspace = true\n",
        );
        write("crates/a/src/lib.rs", "");
        write(
            "crates/b/Cargo.toml",
            "[package]\nname = \"b\"\nversion.workspace = true\nedition.workspace = true\n\n[dependencies]\na.workspace = true\n",
        );
        write("crates/b/src/lib.rs", "");
        write(
            CHART,
            "apiVersion: v2\nname: oci-secrets-store-csi-driver-provider\nversion: 0.1.0\nappVersion: \"0.1.0\"\nannotations:\n  oci-vault-csi.github.io/image: ghcr.io/x/oci-secrets-store-csi-driver-provider:0.1.0\n",
        );
        write(
            PLAIN,
            "metadata:\n  labels:\n    app.kubernetes.io/version: 0.1.0\n    other: {app.kubernetes.io/version: '0.1.0'}\n    helm.sh/chart: oci-secrets-store-csi-driver-provider-0.1.0\nspec:\n  image: ghcr.io/x/oci-secrets-store-csi-driver-provider:0.1.0\n",
        );
        write(
            SIDECAR,
            "providerContainer:\n  - image: ghcr.io/x/oci-secrets-store-csi-driver-provider:0.1.0\n",
        );
        write(".gitignore", "/target\n");
        let status = Command::new(artefacts::cargo())
            .current_dir(dir)
            .args(["generate-lockfile", "--offline", "--quiet"])
            .status()
            .unwrap();
        assert!(status.success());
        git(dir, &["init", "--quiet", "-b", "main"]).unwrap();
        git(dir, &["config", "user.name", "Fixture"]).unwrap();
        git(dir, &["config", "user.email", "fixture@example.com"]).unwrap();
        let commit = |message: &str| {
            std::fs::write(dir.join("history.txt"), message).unwrap();
            git(dir, &["add", "--all"]).unwrap();
            git(dir, &["commit", "--quiet", "-m", message]).unwrap();
        };
        commit("feat: the first version");
        git(dir, &["tag", "v0.1.0"]).unwrap();
        commit("feat(auth): workload identity caches per pod");
        commit("fix: socket mode read as Go reads it");
        commit("refactor!: one stack built in one place");
        commit("docs: install from the chart");
        commit("chart: values keep the Go chart's names");
        commit("perf(cache): join concurrent fetches\n\nBREAKING CHANGE: cache keys changed");
        temp
    }

    /// Every file of the tree and of .git, with its bytes.
    fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    files.insert(path.clone(), std::fs::read(&path).unwrap());
                }
            }
        }
        files
    }

    #[test]
    fn a_release_bumps_every_version_writes_the_changelog_commits_and_tags() {
        let temp = fixture();
        let dir = temp.path();
        let out = dir.join("target").join("dist");
        let report = release(dir, "0.2.0", Steps::BOOKKEEPING, &out, None).unwrap();
        assert_eq!(report.previous, "0.1.0");
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains("[workspace.package]\nversion = \"0.2.0\""),
            "{manifest}"
        );
        assert!(manifest.contains("a = { path = \"crates/a\", version = \"0.2.0\" }"));
        assert!(
            manifest.contains("unrelated = { version = \"0.1.0\""),
            "a registry dependency's requirement is not ours to bump"
        );
        let lock = std::fs::read_to_string(dir.join("Cargo.lock")).unwrap();
        assert!(lock.contains("name = \"a\"\nversion = \"0.2.0\""), "{lock}");
        assert!(lock.contains("name = \"b\"\nversion = \"0.2.0\""), "{lock}");
        let chart = std::fs::read_to_string(dir.join(CHART)).unwrap();
        assert!(chart.contains("\nversion: 0.2.0\n") && chart.contains("appVersion: \"0.2.0\""));
        let sidecar = std::fs::read_to_string(dir.join(SIDECAR)).unwrap();
        assert!(
            sidecar.contains("oci-secrets-store-csi-driver-provider:0.2.0\n"),
            "{sidecar}"
        );
        let plain = std::fs::read_to_string(dir.join(PLAIN)).unwrap();
        assert!(
            plain.contains("oci-secrets-store-csi-driver-provider:0.2.0"),
            "{plain}"
        );
        assert!(plain.contains("app.kubernetes.io/version: 0.2.0\n"));
        assert!(plain.contains("app.kubernetes.io/version: '0.2.0'"));
        assert!(plain.contains("helm.sh/chart: oci-secrets-store-csi-driver-provider-0.2.0"));
        assert!(!plain.contains("0.1.0"), "{plain}");

        let changelog = std::fs::read_to_string(dir.join("CHANGELOG.md")).unwrap();
        let section = &report.changelog;
        assert!(changelog.starts_with("# Changelog\n"), "{changelog}");
        assert!(changelog.contains(section.as_str()));
        assert!(section.starts_with("## [0.2.0] - "), "{section}");
        assert!(section.contains("Changes since v0.1.0."));
        assert!(
            !section.contains("the first version"),
            "before the tag: {section}"
        );
        let position = |text: &str| {
            section
                .find(text)
                .unwrap_or_else(|| panic!("{text:?} missing from {section}"))
        };
        // Breaking changes first (the `!` and the BREAKING CHANGE footer), then the groups
        // in order, the non-conventional subject as it is under "Other changes".
        assert!(position("### Breaking changes") < position("### Features"));
        assert!(position("### Features") < position("### Fixes"));
        assert!(position("### Fixes") < position("### Performance"));
        assert!(position("### Performance") < position("### Refactoring"));
        assert!(position("### Refactoring") < position("### Documentation"));
        assert!(position("### Documentation") < position("### Other changes"));
        position("- **auth**: workload identity caches per pod (");
        position("- socket mode read as Go reads it (");
        position("- **cache**: join concurrent fetches (");
        position("- chart: values keep the Go chart's names (");
        let breaking = &section[position("### Breaking changes")..position("### Features")];
        assert!(
            breaking.contains("one stack built in one place"),
            "{breaking}"
        );
        assert!(breaking.contains("join concurrent fetches"), "{breaking}");
        assert!(!breaking.contains("socket mode"), "{breaking}");

        assert_eq!(
            git(dir, &["log", "-1", "--format=%s"]).unwrap().trim(),
            "release: v0.2.0"
        );
        assert!(
            git(dir, &["status", "--porcelain"])
                .unwrap()
                .trim()
                .is_empty()
        );
        assert_eq!(
            git(dir, &["describe", "--tags", "--exact-match"])
                .unwrap()
                .trim(),
            "v0.2.0"
        );
        assert_eq!(
            git(dir, &["cat-file", "-t", "v0.2.0"]).unwrap().trim(),
            "tag",
            "annotated"
        );
        // The next release's changelog starts after this tag and keeps this section below.
        let next = release(dir, "0.2.1", Steps::BOOKKEEPING, &out, None).unwrap();
        assert!(next.changelog.contains("Changes since v0.2.0."));
        assert!(next.changelog.contains("No changes."), "{}", next.changelog);
        let changelog = std::fs::read_to_string(dir.join("CHANGELOG.md")).unwrap();
        assert!(changelog.find("## [0.2.1]").unwrap() < changelog.find("## [0.2.0]").unwrap());
    }

    #[test]
    fn a_dirty_tree_an_existing_tag_and_a_lower_version_are_refused() {
        let temp = fixture();
        let dir = temp.path();
        let out = dir.join("target").join("dist");
        std::fs::write(dir.join("crates/a/src/lib.rs"), "// edited\n").unwrap();
        let err = release(dir, "0.2.0", Steps::BOOKKEEPING, &out, None).unwrap_err();
        assert!(err.to_string().contains("dirty"), "{err}");
        assert!(err.to_string().contains("crates/a/src/lib.rs"), "{err}");
        git(dir, &["checkout", "--", "."]).unwrap();

        let err = release(dir, "0.1.0", Steps::BOOKKEEPING, &out, None).unwrap_err();
        assert!(
            err.to_string().contains("tag v0.1.0 already exists"),
            "{err}"
        );
        git(dir, &["tag", "v0.3.0"]).unwrap();
        let err = release(dir, "0.3.0", Steps::BOOKKEEPING, &out, None).unwrap_err();
        assert!(
            err.to_string().contains("tag v0.3.0 already exists"),
            "{err}"
        );
        let err = release(dir, "0.0.9", Steps::BOOKKEEPING, &out, None).unwrap_err();
        assert!(
            err.to_string().contains("not above the current 0.1.0"),
            "{err}"
        );
        let err = release(dir, "0.2", Steps::BOOKKEEPING, &out, None).unwrap_err();
        assert!(err.to_string().contains("MAJOR.MINOR.PATCH"), "{err}");
        // Nothing was changed by the refusals.
        assert!(
            git(dir, &["status", "--porcelain"])
                .unwrap()
                .trim()
                .is_empty()
        );
        assert!(
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .unwrap()
                .contains("version = \"0.1.0\"")
        );
    }

    #[test]
    fn a_dry_run_leaves_the_tree_byte_identical() {
        let temp = fixture();
        let dir = temp.path();
        let before = snapshot(dir);
        let report = dry_run_release(dir, "0.2.0", Steps::BOOKKEEPING).unwrap();
        assert_eq!(report.tag, "v0.2.0");
        assert!(
            report
                .changelog
                .contains("workload identity caches per pod")
        );
        // The listing's copies live under target/ (ignored), nothing else moved.
        let after: BTreeMap<PathBuf, Vec<u8>> = snapshot(dir)
            .into_iter()
            .filter(|(p, _)| !p.starts_with(dir.join("target")))
            .collect();
        let before: BTreeMap<PathBuf, Vec<u8>> = before
            .into_iter()
            .filter(|(p, _)| !p.starts_with(dir.join("target")))
            .collect();
        assert_eq!(
            before.keys().collect::<Vec<_>>(),
            after.keys().collect::<Vec<_>>()
        );
        for (path, bytes) in &before {
            assert!(after[path] == *bytes, "{} changed", path.display());
        }
        assert!(git(dir, &["rev-parse", "-q", "--verify", "refs/tags/v0.2.0"]).is_err());
        // A dirty tree is refused for a dry run too (the clone would not have the edit).
        std::fs::write(dir.join("crates/a/src/lib.rs"), "// edited\n").unwrap();
        let err = dry_run_release(dir, "0.2.0", Steps::BOOKKEEPING).unwrap_err();
        assert!(err.to_string().contains("dirty"), "{err}");
    }

    #[test]
    fn the_image_is_pinned_by_digest_and_the_next_release_unpins_it() {
        let temp = fixture();
        let dir = temp.path();
        let out = dir.join("target").join("dist");
        release(dir, "0.2.0", Steps::BOOKKEEPING, &out, None).unwrap();
        let digest = format!("sha256:{}", "ab".repeat(32));
        pin_image(dir, "0.2.0", &digest).unwrap();
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
        let pinned = format!("oci-secrets-store-csi-driver-provider:0.2.0@{digest}");
        assert!(
            read(SIDECAR).contains(&format!("{pinned}\n")),
            "{}",
            read(SIDECAR)
        );
        assert!(
            read(PLAIN).contains(&format!("{pinned}\n")),
            "{}",
            read(PLAIN)
        );
        let chart = read(CHART);
        assert!(chart.contains(&format!("{pinned}\n")), "{chart}");
        assert!(chart.contains("\nappVersion: \"0.2.0\"\n"), "{chart}");
        git(
            dir,
            &[
                "commit",
                "--quiet",
                "--all",
                "-m",
                "release: v0.2.0: pin the image",
            ],
        )
        .unwrap();
        // The next release drops the old digest with the old tag.
        release(dir, "0.3.0", Steps::BOOKKEEPING, &out, None).unwrap();
        for file in [SIDECAR, PLAIN, CHART] {
            let text = read(file);
            assert!(
                text.contains("oci-secrets-store-csi-driver-provider:0.3.0\n"),
                "{text}"
            );
            assert!(!text.contains("sha256:"), "{text}");
        }
        // Pinning twice replaces the digest rather than stacking it.
        pin_image(dir, "0.3.0", &digest).unwrap();
        let other = format!("sha256:{}", "cd".repeat(32));
        pin_image(dir, "0.3.0", &other).unwrap();
        assert!(
            read(SIDECAR).contains(&format!(":0.3.0@{other}\n")),
            "{}",
            read(SIDECAR)
        );
    }

    #[test]
    fn versions_order_as_semver_with_pre_releases_first() {
        assert!(parse_version("0.2.0").unwrap() > parse_version("0.1.9").unwrap());
        assert!(parse_version("1.0.0").unwrap() > parse_version("1.0.0-rc.1").unwrap());
        assert!(parse_version("0.10.0").unwrap() > parse_version("0.9.0").unwrap());
        for bad in ["1", "1.2", "1.2.3.4", "01.2.3", "1.2.x", "1.2.3-ü"] {
            assert!(parse_version(bad).is_err(), "{bad}");
        }
    }
}
