//! The OCI Vault provider for the Kubernetes Secrets Store CSI driver (DaemonSet binary).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    oci_secrets_store_csi_driver_provider::main(args, env)
}
