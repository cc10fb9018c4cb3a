//! `versions: N` through the real binary: the files `name/0` (current) to `name/N-1`, as the
//! sync controller's `sourcePath` reads them, from one ListSecretBundleVersions call and one
//! GetSecretBundle per version, none again within the cache's TTL.

use std::sync::Arc;

use clock::SystemClock;
use testkit::{Emulator, SecretSeed};

use super::{NAMESPACE, VAULT, files_of, provider, request, seed};

const HISTORY: &str = "ocid1.vaultsecret.oc1.iad.history";

#[tokio::test]
async fn versions_3_of_a_secret_with_5_mount_three_files_from_one_list_and_three_fetches() {
    let mut history = SecretSeed::new(HISTORY, VAULT, "rotated-password");
    for n in 1..=5 {
        let stages: &[&str] = match n {
            5 => &["CURRENT", "LATEST"],
            4 => &["PREVIOUS"],
            _ => &["DEPRECATED"],
        };
        history = history.version(n, format!("password-{n}"), stages);
    }
    let seed = seed(1).secret(history.allow_workload(NAMESPACE, "sa-0"));
    let emu = Emulator::start(seed, Arc::new(SystemClock)).await.unwrap();
    let provider = provider(&emu, &[], &[]).await;
    let mut client = provider.client().await;
    let entry = "- name: rotated-password\n  fileName: db\n  versions: 3\n";
    let response = client
        .mount(request("workload", "sa-0", 1, entry))
        .await
        .unwrap()
        .into_inner();
    let files: Vec<(&str, Vec<u8>)> = files_of(&response)
        .into_iter()
        .map(|(path, contents, _)| (path, contents))
        .collect();
    assert_eq!(
        files,
        [
            ("db/0", b"password-5".to_vec()),
            ("db/1", b"password-4".to_vec()),
            ("db/2", b"password-3".to_vec()),
        ]
    );
    let versions: Vec<&str> = response
        .object_version
        .iter()
        .map(|v| v.version.as_str())
        .collect();
    assert_eq!(versions, ["5", "4", "3"], "one object version per file");
    let calls = emu.secrets_calls();
    let lists = calls
        .iter()
        .filter(|c| c.target.contains("/versions?"))
        .count();
    assert_eq!((lists, calls.len() - lists), (1, 3), "{calls:#?}");
    // Within the cache's TTL (30 s by default) a second pod's mount makes no call.
    client
        .mount(request("workload", "sa-0", 2, entry))
        .await
        .unwrap();
    assert_eq!(emu.secrets_calls().len(), 4);
    provider.terminate().await;
}
