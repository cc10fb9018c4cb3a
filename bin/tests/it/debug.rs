//! The debug server (`--enable-pprof`): loopback only, profiles that `go tool pprof`
//! reads, `/debug/stats` with counts and never a credential.

use std::time::Duration;

use crate::process::{Provider, free_port, http_get, http_get_bytes};
use crate::{mount_request, valid_workload_attributes};
use serde_json::json;

/// `go tool pprof -raw` over `profile`: what it printed, or why it could not read it.
fn go_pprof_raw(profile: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.pb");
    std::fs::write(&path, profile).unwrap();
    let output = std::process::Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&path)
        .env("HOME", dir.path())
        .env("PPROF_TMPDIR", dir.path())
        .env("GOFLAGS", "")
        .output()
        .expect("`go tool pprof` reads the profiles: Debian's golang-go (.ci/run installs it)");
    assert!(
        output.status.success(),
        "go tool pprof could not read the profile: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
#[ignore = "needs Go for go tool pprof (Debian: golang-go)"]
async fn the_debug_server_serves_cpu_profiles_stats_and_explains_heap_profiles() {
    let port = free_port();
    let port_flag = format!("--pprof-port={port}");
    let provider = Provider::start(
        &["--enable-pprof", &port_flag],
        &[("OCI_PROVIDER_SERVER__MAX_PROFILE_SECONDS", "5")],
    )
    .await;

    // Stats: counts only.
    let (code, body) = http_get(port, "/debug/stats").await;
    assert_eq!(code, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(stats["tasks_alive"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["mounts_in_flight"], 0, "{stats}");
    assert_eq!(stats["mounts_queued"], 0, "{stats}");
    assert!(stats["upstream_connections"].is_object(), "{stats}");
    assert_eq!(stats["bundle_cache"]["entries"], 0, "{stats}");
    for kind in ["user", "rpst", "instance"] {
        assert_eq!(stats["credentials_cached"][kind]["entries"], 0, "{stats}");
    }
    let allocator = if cfg!(feature = "jemalloc") {
        "jemalloc"
    } else {
        "system"
    };
    assert_eq!(stats["allocator"], allocator);

    // A CPU profile while mounts keep the process busy; a second one at the same time is
    // refused, and bad durations are named.
    let profile =
        tokio::spawn(async move { http_get_bytes(port, "/debug/pprof/profile?seconds=2").await });
    let mut client = provider.client().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, body) = http_get(port, "/debug/pprof/profile?seconds=1").await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("one at a time"), "{body}");
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < until {
        let _ = client
            .mount(mount_request(valid_workload_attributes(json!({}))))
            .await;
    }
    let (code, bytes) = profile.await.unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&bytes));
    let raw = go_pprof_raw(&bytes);
    assert!(raw.contains("PeriodType: cpu nanoseconds"), "{raw}");
    assert!(raw.contains("samples/count cpu/nanoseconds"), "{raw}");

    for bad in ["seconds=0", "seconds=6", "seconds=abc"] {
        let (code, body) = http_get(port, &format!("/debug/pprof/profile?{bad}")).await;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("from 1 to 5"), "{bad}: {body}");
    }

    // Without the jemalloc feature the heap profile says how to get one; with it but
    // without _RJEM_MALLOC_CONF, how to turn jemalloc's profiler on.
    let (code, body) = http_get(port, "/debug/pprof/heap").await;
    if cfg!(feature = "jemalloc") {
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("_RJEM_MALLOC_CONF=prof:true"), "{body}");
    } else {
        assert_eq!(code, 501, "{body}");
        assert!(body.contains("--features jemalloc"), "{body}");
    }
    let (code, body) = http_get(port, "/debug/pprof/").await;
    assert_eq!(code, 200);
    assert!(body.contains("/debug/stats"), "{body}");

    let output = provider.terminate().await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stderr.contains("debug server listening"),
        "{}",
        output.stderr
    );
}

/// With the `jemalloc` feature (`.ci/run` runs this test so) and jemalloc's profiler on,
/// `/debug/pprof/heap` is a heap profile `go tool pprof` reads.
#[cfg(feature = "jemalloc")]
#[tokio::test]
#[ignore = "needs Go for go tool pprof (Debian: golang-go)"]
async fn with_jemalloc_the_heap_profile_is_a_pprof_profile() {
    let port = free_port();
    let port_flag = format!("--pprof-port={port}");
    let provider = Provider::start(
        &["--enable-pprof", &port_flag],
        &[(
            "_RJEM_MALLOC_CONF",
            "prof:true,prof_active:true,lg_prof_sample:12",
        )],
    )
    .await;
    let mut client = provider.client().await;
    for _ in 0..200 {
        let _ = client
            .mount(mount_request(valid_workload_attributes(json!({}))))
            .await;
    }
    let (code, bytes) = http_get_bytes(port, "/debug/pprof/heap").await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&bytes));
    let raw = go_pprof_raw(&bytes);
    assert!(raw.contains("PeriodType: space bytes"), "{raw}");
    assert!(raw.contains("Samples:"), "{raw}");
    assert!(provider.terminate().await.status.success());
}
