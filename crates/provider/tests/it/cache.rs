//! The bundle cache in the real stack (principals, signing, transport, the Secrets client,
//! the cache layer, the mount service) against the emulator, on one `ManualClock` shared
//! with it: single flight, isolation between credentials, TTL and rotation.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use auth::{Principals, PrincipalsConfig, Signing, SigningLayer};
use cache::{Cache, CacheConfig, CacheLayer, CacheService};
use clock::{ManualClock, SharedClock};
use csi_grpc::{ErrorKind, MountError, MountRequest, MountResponse};
use oci_csi_provider::MountContext;
use serde_json::json;
use testkit::{Emulator, Endpoint, KubeSecretSeed, SecretSeed, Seed, UserSeed};
use tower::{Layer as _, ServiceExt as _};
use transport::{HttpService, Transport, TransportConfig};
use vault::{BundleKey, Retry, RetryLayer, RetryPolicy, SecretBundle, VaultClient};

const VAULT: &str = "ocid1.vault.oc1..cache";
const SECRET_ID: &str = "ocid1.vaultsecret.oc1..db";
const SECRET: &str = "db";
const CONTENT: &str = "cached-secret-value-never-shown";
const USER_A: &str = "ocid1.user.oc1..alice";
const USER_B: &str = "ocid1.user.oc1..bob";
const TENANCY: &str = "ocid1.tenancy.oc1..cachetenancy";
const WAIT: Duration = Duration::from_secs(20);

type Bundles = CacheService<Retry<VaultClient<Signing<HttpService>>>, BundleKey, SecretBundle>;
type Mount = crate::fakes::Mount<Principals, Bundles>;

struct Stack {
    emu: Emulator,
    clock: Arc<ManualClock>,
    mount: Mount,
    bundles: Cache<BundleKey, SecretBundle>,
}

fn data(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../auth/tests/data")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fingerprint() -> String {
    use base64::Engine as _;
    let pem: String = data("rsa-public.pem")
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(pem)
        .unwrap();
    testkit::api_key_fingerprint(&der)
}

fn user_secret(namespace: &str, name: &str, user: &str, private_key: &str) -> KubeSecretSeed {
    let config = format!(
        "auth:\n  region: us-ashburn-1\n  tenancy: {TENANCY}\n  user: {user}\n  fingerprint: {}\n",
        fingerprint()
    );
    KubeSecretSeed::new(namespace, name)
        .data("config", config)
        .data("private-key", private_key)
}

/// `app/a`, alice and the instance tenancy may read the secret; `app/b`, `other/a` and bob
/// may not.
fn seed() -> Seed {
    let mut seed = Seed::default()
        .vault(VAULT)
        .service_account("app", "a")
        .service_account("app", "b")
        .service_account("other", "a");
    seed.instance.tenancy = TENANCY.into();
    for user in [USER_A, USER_B] {
        seed = seed.user(UserSeed {
            tenancy: TENANCY.into(),
            user: user.into(),
            public_key_pem: data("rsa-public.pem"),
        });
    }
    let secret = SecretSeed::new(SECRET_ID, VAULT, SECRET)
        .version(1, CONTENT, &["CURRENT", "LATEST"])
        .allow_workload("app", "a")
        .allow_user(USER_A)
        .allow_instance_tenancy(TENANCY);
    let key = data("rsa-pkcs1.pem");
    seed.secret(secret)
        .kube_secret(user_secret("app", "oci-alice", USER_A, &key))
        .kube_secret(user_secret("app", "oci-bob", USER_B, &key))
        // Another namespace's Secret claiming alice, with a key that is not hers.
        .kube_secret(user_secret(
            "other",
            "oci-alice",
            USER_A,
            &data("rsa-1024-pkcs1.pem"),
        ))
}

/// A clock on a whole second, so token `exp` claims line up exactly.
fn clock() -> Arc<ManualClock> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(now)))
}

async fn stack(ttl: Duration) -> Stack {
    let clock = clock();
    let shared: SharedClock = clock.clone();
    let emu = Emulator::start(seed(), shared.clone()).await.unwrap();
    let ca = emu.files().ca.clone();
    let config = PrincipalsConfig {
        region: Some("us-ashburn-1".into()),
        federation_endpoint: Some(emu.url(Endpoint::Auth)),
        instance_metadata: emu.url(Endpoint::Imds),
        proxymux: Some(emu.url(Endpoint::Proxymux)),
        kubernetes_api: Some(emu.url(Endpoint::Kube)),
        service_account_token_file: emu.files().provider_token.clone(),
        token_request: false,
        ..PrincipalsConfig::default()
    };
    let authority = |url: &str| {
        url.parse::<http::Uri>()
            .unwrap()
            .authority()
            .unwrap()
            .to_string()
    };
    let transport = TransportConfig {
        oci_ca_files: vec![ca.clone()],
        ..TransportConfig::default()
    }
    .trust_only(authority(config.proxymux.as_deref().unwrap()), ca.clone())
    .trust_only(emu.addr(Endpoint::Kube).to_string(), ca)
    .allow_plain_http(authority(&config.instance_metadata));
    let http = Transport::new(transport).unwrap().service();
    let principals = Principals::new(config, http.clone(), shared.clone()).unwrap();
    let signed = SigningLayer::new(shared.clone()).layer(http);
    let vault = RetryLayer::new(RetryPolicy::default()).layer(VaultClient::new(signed));
    let bundles = Cache::new(
        CacheConfig {
            ttl: Some(ttl),
            ..CacheConfig::new("bundle")
        },
        shared,
    );
    let vault = CacheLayer::new(bundles.clone()).layer(vault);
    let mount = crate::fakes::mount(
        principals,
        vault,
        oci_csi_provider::NoCertificates,
        MountContext {
            endpoints: Arc::new(crate::fakes::endpoints(
                &emu.url(Endpoint::Secrets),
                &emu.url(Endpoint::Certificates),
            )),
            ..MountContext::default()
        },
        None,
    );
    Stack {
        emu,
        clock,
        mount,
        bundles,
    }
}

/// Who mounts.
#[derive(Clone, Copy, Debug)]
enum As<'a> {
    Workload(&'a str, &'a str),
    User(&'a str, &'a str),
    Instance,
}

impl Stack {
    fn request(&self, who: As<'_>, timeout: Duration) -> MountRequest {
        let (namespace, service_account) = match who {
            As::Workload(ns, sa) => (ns, sa),
            As::User(ns, _) => (ns, "default"),
            As::Instance => ("app", "default"),
        };
        let mut attributes = json!({
            "secrets": format!("- name: {SECRET}\n"),
            "vaultId": VAULT,
            "csi.storage.k8s.io/pod.name": "pod",
            "csi.storage.k8s.io/pod.namespace": namespace,
            "csi.storage.k8s.io/pod.uid": "00000000-0000-0000-0000-000000000001",
            "csi.storage.k8s.io/serviceAccount.name": service_account,
        });
        match who {
            As::Workload(ns, sa) => {
                let token = self
                    .emu
                    .issue_service_account_token(ns, sa, Duration::from_secs(3600), None)
                    .unwrap();
                attributes["authType"] = json!("workload");
                attributes["csi.storage.k8s.io/serviceAccount.tokens"] =
                    json!(json!({ "": { "token": token } }).to_string());
            }
            As::User(_, secret) => {
                attributes["authType"] = json!("user");
                attributes["authSecretName"] = json!(secret);
            }
            As::Instance => attributes["authType"] = json!("instance"),
        }
        MountRequest::from_proto(
            csi_grpc::proto::MountRequest {
                attributes: attributes.to_string(),
                secrets: "{}".into(),
                target_path: String::new(),
                permission: "420".into(),
                current_object_version: vec![],
            },
            tokio::time::Instant::now() + timeout,
        )
        .unwrap()
    }

    async fn mount(&self, who: As<'_>) -> Result<MountResponse, MountError> {
        self.mount.clone().oneshot(self.request(who, WAIT)).await
    }

    fn secrets_calls(&self) -> u64 {
        self.emu.stats().arrived(Endpoint::Secrets)
    }

    /// Waits (bounded) until `done` holds.
    async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(self) {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

type Pending = tokio::task::JoinHandle<Result<MountResponse, MountError>>;

impl Stack {
    /// Establishes `app/a`, lets its bundle expire, holds the Secrets API, and starts one
    /// mount (the leader, with `timeout`) whose fetch is then held; returns it with the
    /// Secrets call count before it.
    async fn held_leader(self: &Arc<Self>, timeout: Duration) -> (Pending, u64) {
        self.mount(As::Workload("app", "a")).await.unwrap();
        self.clock.advance(Duration::from_secs(30));
        let before = self.secrets_calls();
        self.emu.close_gate(Endpoint::Secrets);
        let request = self.request(As::Workload("app", "a"), timeout);
        let leader = tokio::spawn(self.mount.clone().oneshot(request));
        self.until("the leader's fetch is held", |s| {
            s.emu.stats().held.get(&Endpoint::Secrets).copied() == Some(1)
        })
        .await;
        (leader, before)
    }

    /// Starts `n` more mounts of `app/a`.
    fn followers(self: &Arc<Self>, n: usize) -> Vec<Pending> {
        (0..n)
            .map(|_| {
                let request = self.request(As::Workload("app", "a"), WAIT);
                tokio::spawn(self.mount.clone().oneshot(request))
            })
            .collect()
    }
}

async fn all_get_the_secret(mounts: Vec<Pending>) {
    for mount in mounts {
        let response = mount.await.unwrap().unwrap();
        assert_eq!(contents(&response), CONTENT.as_bytes());
    }
}

fn contents(response: &MountResponse) -> &[u8] {
    response.files[0].contents.as_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_mounts_of_one_secret_make_one_fetch() {
    let stack = Arc::new(stack(Duration::from_secs(30)).await);
    // The identity is established first (its own single flight is auth's test), so that
    // every mount waits on the bundle while the emulator holds the first answer.
    let (leader, before) = stack.held_leader(WAIT).await;
    let mut mounts = stack.followers(999);
    mounts.push(leader);
    stack
        .until("every mount in the flight", |s| {
            s.bundles.stats().in_flight == 1000
        })
        .await;
    stack.emu.open_gate(Endpoint::Secrets);
    all_get_the_secret(mounts).await;
    assert_eq!(
        stack.secrets_calls() - before,
        1,
        "exactly one upstream fetch"
    );
    let stats = stack.bundles.stats();
    assert_eq!(stats.joined, 999, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_cancellation_does_not_fail_the_others() {
    let stack = Arc::new(stack(Duration::from_secs(30)).await);
    let (leader, before) = stack.held_leader(WAIT).await;
    let others = stack.followers(10);
    stack
        .until("the others wait on the leader", |s| {
            s.bundles.stats().in_flight == 11
        })
        .await;
    // The driver gave up on the leader's call.
    leader.abort();
    stack.emu.open_gate(Endpoint::Secrets);
    all_get_the_secret(others).await;
    let fetches = stack.secrets_calls() - before;
    assert!(fetches <= 2, "one more fetch at most, made {fetches}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_a_shorter_deadline_does_not_pass_it_on() {
    let stack = Arc::new(stack(Duration::from_secs(30)).await);
    let (leader, before) = stack.held_leader(Duration::from_millis(500)).await;
    let others = stack.followers(10);
    let failed = leader.await.unwrap().unwrap_err();
    assert_eq!(failed.kind(), ErrorKind::DeadlineExceeded, "{failed:?}");
    stack.emu.open_gate(Endpoint::Secrets);
    all_get_the_secret(others).await;
    let fetches = stack.secrets_calls() - before;
    assert!(fetches <= 2, "one more fetch at most, made {fetches}");
}

/// Right after `allowed`'s mount is cached, `denied` mounting the same secret is refused
/// by OCI: it never gets `allowed`'s bytes.
async fn isolated(allowed: As<'_>, denied: As<'_>) {
    let stack = stack(Duration::from_secs(300)).await;
    let response = stack.mount(allowed).await.unwrap();
    assert_eq!(contents(&response), CONTENT.as_bytes());
    let before = stack.secrets_calls();
    let error = stack.mount(denied).await.unwrap_err();
    assert!(
        matches!(
            error.kind(),
            ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::Unauthenticated
        ),
        "{allowed:?} then {denied:?}: {error:?}"
    );
    assert!(!error.message().contains(CONTENT), "{error:?}");
    assert!(
        stack.secrets_calls() > before || error.kind() == ErrorKind::Unauthenticated,
        "{denied:?} asked OCI itself"
    );
    // And the allowed one is still served from the cache.
    let hits = stack.bundles.stats().hits;
    stack.mount(allowed).await.unwrap();
    assert_eq!(stack.bundles.stats().hits, hits + 1);
}

#[tokio::test]
async fn two_service_accounts_of_one_namespace_never_share_an_entry() {
    isolated(As::Workload("app", "a"), As::Workload("app", "b")).await;
}

#[tokio::test]
async fn one_service_account_name_in_two_namespaces_never_shares_an_entry() {
    isolated(As::Workload("app", "a"), As::Workload("other", "a")).await;
}

#[tokio::test]
async fn two_user_principals_never_share_an_entry() {
    isolated(As::User("app", "oci-alice"), As::User("app", "oci-bob")).await;
}

#[tokio::test]
async fn a_secret_claiming_the_same_user_with_another_key_misses() {
    let stack = stack(Duration::from_secs(300)).await;
    stack.mount(As::User("app", "oci-alice")).await.unwrap();
    let error = stack
        .mount(As::User("other", "oci-alice"))
        .await
        .unwrap_err();
    assert!(!error.message().contains(CONTENT), "{error:?}");
    assert_ne!(error.kind(), ErrorKind::Internal, "{error:?}");
    assert_eq!(stack.bundles.stats().hits, 0);
}

#[tokio::test]
async fn the_instance_principal_and_a_workload_never_share_an_entry() {
    isolated(As::Instance, As::Workload("app", "b")).await;
}

#[tokio::test]
async fn a_recreated_service_account_misses() {
    let stack = stack(Duration::from_secs(300)).await;
    stack.mount(As::Workload("app", "a")).await.unwrap();
    stack.mount(As::Workload("app", "a")).await.unwrap();
    assert_eq!(stack.bundles.stats().hits, 1);
    let before = stack.secrets_calls();
    stack
        .emu
        .recreate_service_account("app", "a", "00000000-0000-4000-8000-00000000beef");
    // Its policy names it, so OCI serves it; but with its own fetch.
    stack.mount(As::Workload("app", "a")).await.unwrap();
    assert_eq!(stack.secrets_calls() - before, 1);
    let calls = stack.emu.secrets_calls();
    let last = calls.last().unwrap();
    match &last.identity {
        Some(testkit::Principal::Workload {
            service_account_uid,
            ..
        }) => assert_eq!(service_account_uid, "00000000-0000-4000-8000-00000000beef"),
        other => panic!("{other:?}"),
    }
    stack.bundles.sync().await;
    assert_eq!(stack.bundles.stats().entries, 2, "one entry per uid");
}

#[tokio::test]
async fn a_rotation_is_seen_once_the_ttl_has_passed() {
    let stack = stack(Duration::from_secs(30)).await;
    let first = stack.mount(As::Workload("app", "a")).await.unwrap();
    assert_eq!(first.object_versions[0].version, "1");
    stack
        .emu
        .rotate_secret(SECRET_ID, b"rotated".to_vec())
        .unwrap();
    stack.clock.advance(Duration::from_secs(29));
    let cached = stack.mount(As::Workload("app", "a")).await.unwrap();
    assert_eq!(contents(&cached), CONTENT.as_bytes());
    assert_eq!(cached.object_versions[0].version, "1");
    stack.clock.advance(Duration::from_secs(1));
    let fresh = stack.mount(As::Workload("app", "a")).await.unwrap();
    assert_eq!(contents(&fresh), b"rotated");
    assert_eq!(fresh.object_versions[0].version, "2");
}

#[tokio::test]
async fn with_a_zero_ttl_the_next_mount_sees_a_rotation() {
    let stack = stack(Duration::ZERO).await;
    stack.mount(As::Workload("app", "a")).await.unwrap();
    stack
        .emu
        .rotate_secret(SECRET_ID, b"rotated".to_vec())
        .unwrap();
    let fresh = stack.mount(As::Workload("app", "a")).await.unwrap();
    assert_eq!(contents(&fresh), b"rotated");
    assert_eq!(stack.bundles.stats().hits, 0);
    stack.bundles.sync().await;
    assert_eq!(stack.bundles.stats().entries, 0, "nothing kept");
}

#[tokio::test]
async fn expired_bundles_are_purged_without_a_read() {
    let stack = stack(Duration::from_secs(30)).await;
    stack.mount(As::Workload("app", "a")).await.unwrap();
    stack.mount(As::Instance).await.unwrap();
    stack.bundles.sync().await;
    let stats = stack.bundles.stats();
    assert_eq!(stats.entries, 2);
    assert!(stats.bytes >= 2 * CONTENT.len() as u64, "{stats:?}");
    stack.clock.advance(Duration::from_secs(30));
    assert_eq!(stack.bundles.purge_expired().await, 2);
    assert_eq!(stack.bundles.stats().bytes, 0);
}
