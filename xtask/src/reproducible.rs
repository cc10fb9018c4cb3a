//! Release builds that do not depend on where they run: the checkout, the target directory
//! and cargo's home are remapped in what rustc embeds (panic locations of our crates and of
//! the registry's, the generated protobuf file under `OUT_DIR`), so the same commit built in
//! two directories, or on two machines with one toolchain, gives the same binary, and the
//! image the same digest (reproducible-builds.org's sense). A leaf: the commands that build
//! release binaries (`image`, `dist`, the measuring commands) call it, it calls none of them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the build paths become in the binary.
const SOURCE: &str = "/build/src";
const TARGET: &str = "/build/target";
const CARGO_HOME: &str = "/build/cargo";

/// Cargo's home (`CARGO_HOME`, else `~/.cargo`), where the registry's sources are.
fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
}

/// The rustc flags that remap `root` (the checkout), `target_dir` and cargo's home; later
/// flags win, so the target directory inside the checkout maps to its own prefix.
pub(crate) fn remap_flags(root: &Path, target_dir: &Path) -> Vec<String> {
    let mut flags = vec![format!("--remap-path-prefix={}={SOURCE}", root.display())];
    if let Some(home) = cargo_home() {
        flags.push(format!(
            "--remap-path-prefix={}={CARGO_HOME}",
            home.display()
        ));
    }
    flags.push(format!(
        "--remap-path-prefix={}={TARGET}",
        target_dir.display()
    ));
    flags
}

/// Makes `command` (a `cargo build`) remap the build paths, keeping any flags the caller
/// set in `CARGO_ENCODED_RUSTFLAGS` or `RUSTFLAGS`.
pub(crate) fn remap(command: &mut Command, root: &Path, target_dir: &Path) {
    let mut flags: Vec<String> = match std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        Ok(encoded) if !encoded.is_empty() => encoded.split('\x1f').map(str::to_owned).collect(),
        _ => std::env::var("RUSTFLAGS")
            .map(|f| f.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
    };
    flags.extend(remap_flags(root, target_dir));
    command
        .env_remove("RUSTFLAGS")
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkout_the_target_directory_and_cargos_home_are_remapped_target_last() {
        let flags = remap_flags(Path::new("/src/here"), Path::new("/src/here/target"));
        assert_eq!(
            flags.first().unwrap(),
            "--remap-path-prefix=/src/here=/build/src"
        );
        assert_eq!(
            flags.last().unwrap(),
            "--remap-path-prefix=/src/here/target=/build/target"
        );
        assert!(
            flags.iter().any(|f| f.ends_with("=/build/cargo")),
            "{flags:?}"
        );
    }
}
