//! `cargo xtask fuzz [--cases N]`: every property test over tenant or upstream input, for
//! longer than the test suite runs them.
//!
//! The properties are the `fuzz` tests of the crates (proptest, stable Rust), certificate
//! keys and certificate PEMs among them: the HPACK
//! adapter (`h2-authority`), the driver's request fields and `grpc-timeout` (`csi-grpc`),
//! SecretProviderClass parameters (`provider`), JWTs, the mount's service-account token,
//! the proxymux reply, private keys (PEM, DER, PKCS#1, PKCS#8, encrypted) and the instance
//! certificate's subject (`auth`), SecretBundle bodies and Retry-After delays (`vault`).
//! Each asserts no panic and a typed error; proptest shrinks any failure it finds.

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
            "test(/fuzz/)",
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
