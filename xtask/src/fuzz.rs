//! `cargo xtask fuzz [--cases N]`: every property test over tenant or upstream input, for
//! longer than the test suite runs them.
//!
//! The properties are the `fuzz` tests of the crates (proptest, stable Rust), certificate
//! keys and certificate PEMs among them: the HPACK
//! adapter (`h2-authority`), the driver's request fields and `grpc-timeout` (`csi-grpc`),
//! SecretProviderClass parameters (`provider`), JWTs, the mount's service-account token,
//! the proxymux reply, private keys (PEM, DER, PKCS#1, PKCS#8, encrypted) and the instance
//! certificate's subject (`auth`), SecretBundle bodies and Retry-After delays (`vault`).
//! Each asserts no panic and a typed error; proptest shrinks any failure it finds. With them
//! run the peak-heap tests (the `heap` binary of `provider`): a mount's peak heap within
//! `K × bytes read + C` over hostile documents.
//!
//! `cargo xtask fuzz-guided [--seconds N] [--target T] [--build-only]`: the coverage-guided
//! targets of `fuzz/` (cargo-fuzz, libFuzzer, nightly Rust), each run for a bounded time.
//!
//! The targets: `secrets_parameter` (a SecretProviderClass's attributes through
//! `MountParameters::parse_within`) and `keys` (a secret's content read for `keys` as a
//! mount reads it). Each asserts no panic, a bounded error message, and a peak heap within
//! the peak-heap tests' `K × input + C`, so libFuzzer finds amplifications as well as
//! crashes. The committed corpus (`fuzz/corpus/<target>/`) is read only: libFuzzer writes
//! what it finds to the first corpus directory it is given, a temporary one here, so runs
//! never grow the repository. A crash leaves its input in `fuzz/artifacts/<target>/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::procs::root;

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut cases: u64 = 10_000;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cases" => {
                cases = args
                    .next()
                    .context("--cases needs a number")?
                    .parse()
                    .context("--cases needs a number")?;
            }
            "--help" | "-h" => {
                eprintln!("usage: cargo xtask fuzz [--cases N (10000 per property)]");
                return Ok(());
            }
            other => bail!("unknown option {other:?} (see --help)"),
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    println!("running every fuzz property with {cases} cases each");
    let started = std::time::Instant::now();
    let status = std::process::Command::new(cargo)
        .current_dir(root())
        .args([
            "nextest",
            "run",
            "--workspace",
            "--no-fail-fast",
            "--release",
            "-E",
            "test(/fuzz/) | binary(heap)",
        ])
        .env("PROPTEST_CASES", cases.to_string())
        .status()
        .context("cannot run cargo nextest")?;
    if !status.success() {
        bail!("a fuzz property failed (proptest printed the shrunk input above)");
    }
    println!(
        "all fuzz properties held for {cases} cases each, 0 panics, in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

const TARGETS: [&str; 2] = ["secrets_parameter", "keys"];

/// libFuzzer's limits: the process's RSS (AddressSanitizer's shadow and quarantine
/// included), one allocation, one input's time, and the longest input (the peak-heap
/// bound's constant dominates below a few KiB; the property tests cover the large sizes).
const LIMITS: [&str; 4] = [
    "-rss_limit_mb=2048",
    "-malloc_limit_mb=64",
    "-timeout=10",
    "-max_len=32768",
];

const GUIDED_USAGE: &str =
    "usage: cargo xtask fuzz-guided [--seconds N (60 a target)] [--target T] [--build-only]

targets: secrets_parameter, keys";

pub(crate) fn run_guided(args: &[String]) -> anyhow::Result<()> {
    let mut seconds: u64 = 60;
    let mut targets: Vec<&str> = TARGETS.to_vec();
    let mut build_only = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s| *s > 0)
                    .context("--seconds needs a number of seconds")?;
            }
            "--target" => {
                let target = args.next().context("--target needs a target")?;
                let Some(known) = TARGETS.iter().find(|t| *t == target) else {
                    bail!("unknown target {target:?}: {}", TARGETS.join(", "));
                };
                targets = vec![known];
            }
            "--build-only" => build_only = true,
            "--help" | "-h" => {
                eprintln!("{GUIDED_USAGE}");
                return Ok(());
            }
            other => bail!("unknown option {other:?}\n{GUIDED_USAGE}"),
        }
    }
    check_tools()?;
    check_lock()?;
    let started = std::time::Instant::now();
    cargo_fuzz(&["build"], &targets_args(&targets))?;
    println!("built {} in {:.0?}", targets.join(", "), started.elapsed());
    if build_only {
        return Ok(());
    }
    let mut failed = Vec::new();
    for target in &targets {
        if let Err(err) = fuzz(target, seconds) {
            eprintln!("{target}: {err:#}");
            failed.push(*target);
        }
    }
    if !failed.is_empty() {
        bail!("fuzzing found a failure in {}", failed.join(", "));
    }
    Ok(())
}

/// `cargo fuzz build` builds every target when none is named.
fn targets_args<'a>(targets: &[&'a str]) -> Vec<&'a str> {
    if targets.len() == TARGETS.len() {
        Vec::new()
    } else {
        targets.to_vec()
    }
}

/// Says what to install when the nightly toolchain or cargo-fuzz is missing; installs
/// nothing itself.
fn check_tools() -> anyhow::Result<()> {
    let works = |args: &[&str]| {
        Command::new("cargo")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !works(&["+nightly", "--version"]) {
        bail!(
            "the nightly toolchain is missing (libFuzzer's instrumentation needs it): \
             rustup toolchain install nightly --profile minimal"
        );
    }
    if !works(&["+nightly", "fuzz", "--version"]) {
        bail!("cargo-fuzz is missing: cargo install cargo-fuzz --locked");
    }
    Ok(())
}

/// cargo-fuzz has no `--locked`: refuse a `fuzz/Cargo.lock` that its build would change.
fn check_lock() -> anyhow::Result<()> {
    let status = Command::new("cargo")
        .current_dir(root())
        .env_remove("CARGO")
        .args(["+nightly", "metadata", "--locked", "--format-version", "1"])
        .args(["--manifest-path", "fuzz/Cargo.toml"])
        .stdout(Stdio::null())
        .status()
        .context("cannot run cargo metadata")?;
    if !status.success() {
        bail!(
            "fuzz/Cargo.lock is out of date (it is not the workspace's): \
             cargo update --manifest-path fuzz/Cargo.toml --workspace, then commit it"
        );
    }
    Ok(())
}

/// `cargo +nightly fuzz <command> --fuzz-dir fuzz [args]` from the workspace root, with
/// cargo-fuzz's default build, the same for `build` and `run` (so a run reuses the build):
/// optimized, AddressSanitizer, and debug assertions with overflow checks, so an overflow a
/// release binary would wrap is a crash here, as in the test suite. (A `--dev` build takes
/// half the CPU time to build but runs some 20 times slower.)
fn cargo_fuzz(command: &[&str], args: &[&str]) -> anyhow::Result<()> {
    let status = fuzz_command(command, args)
        .status()
        .context("cannot run cargo fuzz")?;
    if !status.success() {
        bail!("cargo fuzz {} failed", command.join(" "));
    }
    Ok(())
}

fn fuzz_command(command: &[&str], args: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        // The stable toolchain's cargo may have set these for `cargo xtask`.
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        // cargo-fuzz's own build directory, fuzz/target: its nightly, instrumented builds
        // share nothing with the workspace's.
        .env_remove("CARGO_TARGET_DIR")
        .arg("+nightly")
        .arg("fuzz")
        .args(command)
        .args(["--fuzz-dir", "fuzz"])
        .args(args);
    cmd
}

/// Runs `target` for `seconds` on a temporary corpus seeded by the committed one, reports
/// executions and coverage, and fails with the crash's artifact if libFuzzer found one.
fn fuzz(target: &str, seconds: u64) -> anyhow::Result<()> {
    let work = tempfile::tempdir().context("cannot make a temporary directory")?;
    let found = work.path().join("corpus");
    std::fs::create_dir(&found)?;
    let seeds = root().join("fuzz/corpus").join(target);
    let dict = root().join("fuzz/dict").join(format!("{target}.dict"));
    let log_path = work.path().join("libfuzzer.log");
    let log = std::fs::File::create(&log_path)?;
    println!(
        "fuzzing {target} for {seconds} s (seeds: {})",
        seeds.display()
    );
    let time = format!("-max_total_time={seconds}");
    let dict_arg = format!("-dict={}", dict.display());
    let (found_arg, seeds_arg) = (path_str(&found)?, path_str(&seeds)?);
    let mut libfuzzer = vec![time.as_str(), "-print_final_stats=1"];
    libfuzzer.extend(LIMITS);
    if dict.exists() {
        libfuzzer.push(&dict_arg);
    }
    let mut args = vec![target, found_arg, seeds_arg, "--"];
    args.extend(libfuzzer);
    let status = fuzz_command(&["run"], &args)
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .context("cannot run cargo fuzz run")?;
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let new_inputs = std::fs::read_dir(&found).map_or(0, |d| d.count());
    report(target, &text, new_inputs);
    if !status.success() {
        return Err(failure(target, &text, &log_path, status));
    }
    Ok(())
}

/// What went wrong (a panic's message, a sanitizer's or libFuzzer's error), the input that
/// did it, and the whole log kept beside it.
fn failure(
    target: &str,
    text: &str,
    log_path: &Path,
    status: std::process::ExitStatus,
) -> anyhow::Error {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            eprintln!("  {line}\n  {}", lines.next().unwrap_or_default());
        } else if line.starts_with("==") || line.starts_with("SUMMARY:") {
            eprintln!("  {line}");
        }
    }
    let artifacts = root().join("fuzz/artifacts").join(target);
    let kept = artifacts.join(format!("libfuzzer-{}.log", std::process::id()));
    let _ = std::fs::create_dir_all(&artifacts).and_then(|()| std::fs::copy(log_path, &kept));
    let artifact = artifact(text).unwrap_or_else(|| format!("fuzz/artifacts/{target}/"));
    anyhow::anyhow!(
        "libFuzzer stopped with {status}: the input is {artifact} (the log: {}); reproduce \
         with `cargo +nightly fuzz run --fuzz-dir fuzz {target} {artifact}`",
        kept.display()
    )
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// Executions, their rate, coverage, new inputs and peak RSS from libFuzzer's output.
fn report(target: &str, log: &str, new_inputs: usize) {
    let stat = |name: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .map_or("?", str::trim)
    };
    // The last status line (`#N DONE cov: ... ft: ... corp: ...`) has the coverage reached.
    let status = log
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains("cov: "))
        .unwrap_or("");
    let field = |name: &str| {
        status
            .split_whitespace()
            .skip_while(|w| *w != name)
            .nth(1)
            .unwrap_or("?")
    };
    println!(
        "{target}: {} executions ({} exec/s), coverage {} edges, {} features, corpus {}, \
         {new_inputs} new inputs (not kept), peak RSS {} MB",
        stat("number_of_executed_units"),
        stat("average_exec_per_sec"),
        field("cov:"),
        field("ft:"),
        field("corp:"),
        stat("peak_rss_mb"),
    );
}

/// The crash input libFuzzer wrote (`Test unit written to <path>`).
fn artifact(log: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .map(|p| {
            let full = PathBuf::from(p);
            full.strip_prefix(root())
                .map(Path::to_path_buf)
                .unwrap_or(full)
                .display()
                .to_string()
        })
}
