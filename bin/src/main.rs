//! The OCI Vault provider for the Kubernetes Secrets Store CSI driver (DaemonSet binary).

use std::process::ExitCode;

/// With the `jemalloc` feature, jemalloc is the allocator, so that the debug server can
/// take heap profiles (configured by `_RJEM_MALLOC_CONF`: `unsafe_code = "forbid"` rules
/// out exporting `malloc_conf`).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    oci_secrets_store_csi_driver_provider::main(args, env)
}
