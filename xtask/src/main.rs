//! `cargo xtask <command>`: project chores that are easier in Rust than in shell.
#![allow(clippy::print_stdout)] // reason: a command-line tool reporting to its user
#![allow(clippy::disallowed_methods)] // reason: the project's own files, not tenant input

mod artefacts;
mod compat;
#[cfg(test)]
mod cycles;
mod demo;
mod deps;
mod dist;
mod fuzz;
mod hostile;
mod image;
mod instructions;
mod plot;
mod procs;
mod release;
mod reproducible;
#[cfg(test)]
mod sizes;
mod soak;
mod storm;
#[cfg(test)]
mod tidy;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  demo [--release]   run the provider against the bundled OCI emulator: mount through the
                     real socket as the driver would, write and print the files
  soak [options]     benchmark: many mounts through the socket against the emulator
                     (its own process), reporting mounts/s, latency, RSS slope, connections
                     and upstream requests per mount; `cargo xtask soak --help`
  storm [--mounts N] [--rounds R] [--provider-bin PATH] [--debug]
                     a pod storm on a warm node: N mounts (64) of one secret by one identity
                     fired at once through the socket, R times; succeeded, failed by gRPC
                     code, latency p50/p99/max; --provider-bin runs another build (before/after)
  hostile [options] what hostile documents (YAML aliases in the secrets parameter, nested
                     anchors in a secret read for keys) cost the release binary: N mounts
                     at once, peak RSS before and after; `cargo xtask hostile --help`
  instructions [options]
                     instructions a mount costs (cached, uncached) under callgrind, and
                     where they go; `cargo xtask instructions --help`
  compat [options]   the real grpc-go client against the provider and the emulator, dialled
                     as drivers v1.0-v1.5 (socket path as :authority) and v1.6 (localhost):
                     Mount latency p50/p99 per mode; `cargo xtask compat --help`
  fuzz [--cases N]   every property test over tenant or upstream input (HPACK, request
                     fields, parameters, JWTs, keys, bundles, ...) and the peak-heap tests,
                     with N cases each
  fuzz-guided [--seconds N] [--target T] [--build-only]
                     the coverage-guided targets of fuzz/ (cargo-fuzz, nightly):
                     secrets_parameter and keys, N seconds each (60) on the committed corpus;
                     no panic, bounded messages, peak heap within the heap tests' bound
  release <version> [--dry-run]
                     bump every version, write the changelog, run the checks, dry-run the
                     crates.io publication, build tarballs + image + SBOM + SHA256SUMS, pin
                     deploy/ to the image's digest, tag (never pushes); `--help`
  dist [--target T]  release tarballs, the image of this machine's target, a CycloneDX SBOM
                     and SHA256SUMS for the installed targets, in target/dist/v<version>/
  image [options]    the OCI image (layout and oci-archive) of the release binary on Debian
                     packages checked against xtask/image/debian-<arch>.lock; --run-test
                     runs it under runc; `cargo xtask image --help`
  check-deps         fail if the dependency graph (default and `fips` builds) has a second
                     crypto or TLS stack (ring, openssl, openssl-sys, native-tls, reqwest, rsa)
                     or duplicate major versions of tonic, hyper, rustls, tower, tower-http,
                     prost, aws-lc-rs; `--binary PATH [--fips]` also checks that a built
                     binary links exactly one AWS-LC (the FIPS module with --fips)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo::run(rest.iter().any(|a| a == "--release")),
        Some("soak") => soak::run(rest),
        Some("hostile") => hostile::run(rest),
        Some("instructions") => instructions::run(rest),
        Some("storm") => storm::run(rest),
        Some("compat") => compat::run(rest),
        Some("fuzz") => fuzz::run(rest),
        Some("fuzz-guided") => fuzz::run_guided(rest),
        Some("check-deps") => deps::check(rest),
        Some("release") => release::run(rest),
        Some("dist") => dist::run(rest),
        Some("image") => image::run(rest),
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
