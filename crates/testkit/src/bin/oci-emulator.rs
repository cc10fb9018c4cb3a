//! `oci-emulator`: runs the testkit emulator as a standalone process for demos.
//!
//! ```text
//! oci-emulator [--seed SEED.toml] [--out-dir DIR]
//! ```
//!
//! Writes `ca.pem`, `token`, `kubeconfig` and `provider.toml` (with an `[endpoints]` table)
//! into DIR (default: a fresh temporary directory that is kept), prints the provider
//! configuration on stdout, and serves until interrupted.
#![allow(clippy::print_stdout)] // reason: a command-line tool reporting where it listens

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clock::SystemClock;
use oci_csi_testkit::{Emulator, Seed};

fn usage() -> &'static str {
    "usage: oci-emulator [--seed SEED.toml] [--out-dir DIR]"
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut seed_path: Option<PathBuf> = None;
    let mut out_dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => seed_path = args.next().map(PathBuf::from),
            "--out-dir" => out_dir = args.next().map(PathBuf::from),
            "-h" | "--help" => {
                println!("{}", usage());
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument {other}\n{}", usage());
                return ExitCode::from(2);
            }
        }
    }
    let seed = match seed_path {
        None => Seed::default(),
        Some(p) => {
            let text = match std::fs::read_to_string(&p) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("cannot read {}: {e}", p.display());
                    return ExitCode::FAILURE;
                }
            };
            match toml::from_str::<Seed>(&text) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("invalid seed {}: {e}", p.display());
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let out_dir = match out_dir {
        Some(d) => d,
        None => match tempfile::Builder::new().prefix("oci-emulator").tempdir() {
            Ok(t) => t.keep(),
            Err(e) => {
                eprintln!("cannot create a temporary directory: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let region = seed.region.clone();
    let emu = match Emulator::start_in(seed, Arc::new(SystemClock), Some(out_dir)).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("emulator failed to start: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", emu.provider_config(&region));
    // Run by hand (a terminal on standard input), say how to stop it; run by a program
    // (the demo), that program stops it.
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!(
            "oci-emulator: files in {}; press Ctrl-C to stop",
            emu.files().dir.display()
        );
    }
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
