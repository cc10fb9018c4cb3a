//! `cargo xtask <command>`: project chores that are easier in Rust than in shell.

mod deps;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  check-deps   fail if the dependency graph has a second crypto or TLS stack
               (ring, openssl, openssl-sys, native-tls, reqwest) or duplicate major
               versions of tonic, hyper, rustls, tower, tower-http, prost
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("check-deps") => deps::check(),
        Some("help" | "--help" | "-h") | None => {
            eprint!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}
