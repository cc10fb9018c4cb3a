//! Version histories (`versions: N`) and selections (`tag`, `namePrefix`): their parameters,
//! then the real stack (principals, signing, transport, the client's retries, the bundle
//! and listing caches, the byte budget, the mount service) against the emulator, counting
//! the exact upstream calls each makes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use auth::{Principals, PrincipalsConfig, Signing, SigningLayer};
use cache::{Cache, CacheConfig, CacheLayer, CacheService};
use clock::{ManualClock, SharedClock};
use csi_grpc::{ErrorKind, MountError, MountRequest, MountResponse};
use oci_csi_provider::{
    Budget, BudgetLayer, ByteBudget, EndpointOverrides, Endpoints, MountContext, MountParameters,
    OciMount,
};
use serde_json::json;
use testkit::{CompartmentSeed, Emulator, Endpoint, SecretSeed, Seed};
use tower::{Layer as _, ServiceExt as _};
use transport::{HttpService, Transport, TransportConfig};
use vault::{
    BundleKey, ListKey, Lister, ListerLayer, Listing, Retry, RetryLayer, RetryPolicy, SecretBundle,
    VaultClient,
};

use crate::params::{attrs, pod};

const VAULT: &str = "ocid1.vault.oc1..kinds";
const COMPARTMENT: &str = "ocid1.compartment.oc1..team";
const HISTORY: &str = "ocid1.vaultsecret.oc1..history";
const WAIT: Duration = Duration::from_secs(20);

type Client = Retry<VaultClient<Signing<HttpService>>>;
type Bundles = CacheService<Client, BundleKey, SecretBundle>;
type Listings = Budget<CacheService<Lister<Client>, ListKey, Listing>>;
type Mount = OciMount<
    Principals,
    oci_csi_provider::Failover<Budget<Bundles>>,
    Budget<oci_csi_provider::NoCertificates>,
    Listings,
>;

// --- parameters ---------------------------------------------------------------------------

fn refused(secrets: &str, extra: &[(&str, &str)]) -> String {
    let error = MountParameters::parse(&attrs(secrets, extra), &pod())
        .map_err(MountError::from)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    error.message().to_owned()
}

#[test]
fn versions_write_the_files_name_0_to_n_minus_1_each_counted_against_the_file_limit() {
    let params =
        MountParameters::parse(&attrs("- name: db\n  versions: 3\n", &[]), &pod()).unwrap();
    let files: Vec<&str> = params.secrets()[0].files().map(|f| f.as_str()).collect();
    assert_eq!(files, ["db/0", "db/1", "db/2"]);
    let limits = oci_csi_provider::ParseLimits {
        max_secrets: 10,
        max_files: 5,
    };
    let two = "- name: a\n  versions: 3\n- name: b\n  versions: 3\n- name: c\n";
    let err = MountParameters::parse_within(&attrs(two, &[]), &pod(), limits).unwrap_err();
    assert!(
        err.to_string().contains("more than 5 files")
            && err.to_string().contains("server.max_files_per_mount"),
        "counted as the list is read: {err}"
    );
}

#[test]
fn versions_out_of_bounds_or_with_another_selector_are_refused_naming_the_field() {
    for (versions, shown) in [("0", "0"), ("11", "11"), ("'x'", "\"x\""), ("2.5", "2.5")] {
        let message = refused(&format!("- name: db\n  versions: {versions}\n"), &[]);
        assert!(
            message.contains(&format!(
                "secrets[0].versions {shown} must be a whole number from 1 to 10"
            )),
            "{message}"
        );
    }
    for other in ["stage: PREVIOUS", "versionNumber: 2", "keys: [{key: a}]"] {
        let message = refused(&format!("- name: db\n  versions: 2\n  {other}\n"), &[]);
        let field = other.split(':').next().unwrap();
        assert!(
            message.contains("secrets[0].versions counts back from the CURRENT version")
                && message.contains(&format!("secrets[0].{field}")),
            "{message}"
        );
    }
    let message = refused(
        "- certificateId: ocid1.certificate.oc1..c\n  versions: 2\n",
        &[],
    );
    assert!(
        message.contains("secrets[0].versions does not apply"),
        "{message}"
    );
}

#[test]
fn a_tag_or_name_prefix_entry_takes_its_compartment_from_the_entry_or_the_class() {
    let secrets = "- tag: team=payments\n  directory: pay\n  mode: \"0400\"\n\
                   - namePrefix: app-\n  compartmentId: ocid1.tenancy.oc1..root\n  tag: env\n";
    let params =
        MountParameters::parse(&attrs(secrets, &[("compartmentId", COMPARTMENT)]), &pod()).unwrap();
    let [first, second] = &params.selections()[..] else {
        panic!("{:?}", params.selections())
    };
    assert_eq!(first.compartment_id, COMPARTMENT);
    assert_eq!(
        first.vault_id, "ocid1.vault.oc1.iad.example",
        "the class vault"
    );
    assert_eq!(first.directory.as_deref(), Some("pay"));
    assert_eq!(first.describe(), "tag \"team=payments\"");
    assert_eq!(
        second.compartment_id, "ocid1.tenancy.oc1..root",
        "a tenancy is a compartment"
    );
    assert_eq!(second.describe(), "tag \"env\" and namePrefix \"app-\"");
    assert!(params.secrets().is_empty());
}

#[test]
fn a_tag_entry_without_a_compartment_or_with_a_secrets_field_names_every_problem() {
    let message = refused(
        "- tag: \"=x\"\n  fileName: f\n- namePrefix: ''\n- name: db\n  compartmentId: c\n",
        &[],
    );
    for needle in [
        "secrets[0].fileName does not apply to a tag or namePrefix entry: tag and namePrefix \
         entries take vaultId, encoding, tag, namePrefix, compartmentId, directory and mode",
        "secrets[0].tag \"=x\" is not a freeform tag",
        "secrets[0] selects secrets by tag or namePrefix: it needs compartmentId",
        "secrets[1].namePrefix \"\" must be 1 to 255 characters",
        "secrets[2].compartmentId applies to tag and namePrefix entries only",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
}

// --- the stack against the emulator -------------------------------------------------------

struct Stack {
    emu: Emulator,
    clock: Arc<ManualClock>,
    mount: Mount,
}

fn clock() -> Arc<ManualClock> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(now)))
}

/// `app/a` reads every secret of `secrets` and may list the compartment.
fn seed(secrets: Vec<SecretSeed>) -> Seed {
    let mut seed = Seed::default()
        .vault(VAULT)
        .service_account("app", "a")
        .compartment(CompartmentSeed::new(COMPARTMENT).allow_workload("app", "a"));
    for secret in secrets {
        seed = seed.secret(
            secret
                .in_compartment(COMPARTMENT)
                .allow_workload("app", "a"),
        );
    }
    seed
}

async fn stack(seed: Seed, config: MountContext) -> Stack {
    stack_within(seed, config, 16 << 20).await
}

/// The stack with a byte budget of `budget` bytes, every fetch and listing reserving
/// [`crate::fakes::RESERVE`] of it.
async fn stack_within(seed: Seed, config: MountContext, budget: usize) -> Stack {
    let clock = clock();
    let shared: SharedClock = clock.clone();
    let emu = Emulator::start(seed, shared.clone()).await.unwrap();
    let ca = emu.files().ca.clone();
    let principals_config = PrincipalsConfig {
        region: Some("us-ashburn-1".into()),
        proxymux: Some(emu.url(Endpoint::Proxymux)),
        kubernetes_api: Some(emu.url(Endpoint::Kube)),
        service_account_token_file: emu.files().provider_token.clone(),
        token_request: false,
        ..PrincipalsConfig::default()
    };
    let transport = TransportConfig {
        oci_ca_files: vec![ca.clone()],
        ..TransportConfig::default()
    }
    .trust_only(emu.addr(Endpoint::Proxymux).to_string(), ca.clone())
    .trust_only(emu.addr(Endpoint::Kube).to_string(), ca);
    let http = Transport::new(transport).unwrap().service();
    let principals = Principals::new(principals_config, http.clone(), shared.clone()).unwrap();
    let client: Client = RetryLayer::new(RetryPolicy::default()).layer(VaultClient::new(
        SigningLayer::new(shared.clone()).layer(http),
    ));
    let ttl = |kind| CacheConfig {
        ttl: Some(Duration::from_secs(30)),
        ..CacheConfig::new(kind)
    };
    let bundles = CacheLayer::new(Cache::new(ttl("bundle"), shared.clone())).layer(client.clone());
    let listings =
        CacheLayer::new(Cache::new(ttl("listing"), shared)).layer(ListerLayer.layer(client));
    let overrides = EndpointOverrides {
        secrets: Some(emu.url(Endpoint::Secrets)),
        certificates: Some(emu.url(Endpoint::Certificates)),
        vaults: Some(emu.url(Endpoint::Vaults)),
        ..EndpointOverrides::default()
    };
    let endpoints = Endpoints::new(regions::Regions::default(), None, overrides).unwrap();
    let budget = ByteBudget::new(budget);
    let mount = crate::fakes::mount(
        principals,
        bundles,
        oci_csi_provider::NoCertificates,
        MountContext {
            endpoints: Arc::new(endpoints),
            byte_budget: Some(budget.clone()),
            ..config
        },
        Some(budget.clone()),
    )
    .with_listings(BudgetLayer::new(Some(budget), crate::fakes::RESERVE).layer(listings));
    Stack { emu, clock, mount }
}

impl Stack {
    fn request(&self, secrets: &str) -> MountRequest {
        let token = self
            .emu
            .issue_service_account_token("app", "a", Duration::from_secs(3600), None)
            .unwrap();
        let attributes = json!({
            "secrets": secrets,
            "vaultId": VAULT,
            "compartmentId": COMPARTMENT,
            "authType": "workload",
            "csi.storage.k8s.io/pod.name": "pod",
            "csi.storage.k8s.io/pod.namespace": "app",
            "csi.storage.k8s.io/pod.uid": "00000000-0000-0000-0000-000000000001",
            "csi.storage.k8s.io/serviceAccount.name": "a",
            "csi.storage.k8s.io/serviceAccount.tokens":
                json!({ "": { "token": token } }).to_string(),
        });
        MountRequest::from_proto(
            csi_grpc::proto::MountRequest {
                attributes: attributes.to_string(),
                secrets: "{}".into(),
                target_path: String::new(),
                permission: "420".into(),
                current_object_version: vec![],
            },
            tokio::time::Instant::now() + WAIT,
        )
        .unwrap()
    }

    async fn mount(&self, secrets: &str) -> Result<MountResponse, MountError> {
        self.mount.clone().oneshot(self.request(secrets)).await
    }

    /// (list calls, bundle calls) the Secrets endpoint answered, and the Vault endpoint's.
    fn calls(&self) -> (usize, usize, usize) {
        let secrets = self.emu.secrets_calls();
        let lists = secrets
            .iter()
            .filter(|c| c.target.contains("/versions"))
            .count();
        (lists, secrets.len() - lists, self.emu.vaults_calls().len())
    }
}

fn files(response: &MountResponse) -> Vec<(&str, &str)> {
    response
        .files
        .iter()
        .map(|f| {
            (
                f.path.as_str(),
                std::str::from_utf8(f.contents.as_bytes()).unwrap(),
            )
        })
        .collect()
}

fn five_versions() -> SecretSeed {
    SecretSeed::new(HISTORY, VAULT, "db")
        .version(1, "v1", &["DEPRECATED"])
        .version(2, "v2", &["DEPRECATED"])
        .version(3, "v3", &["DEPRECATED"])
        .version(4, "v4", &["PREVIOUS"])
        .version(5, "v5", &["CURRENT", "LATEST"])
}

#[tokio::test]
async fn versions_3_of_a_secret_with_5_make_1_list_and_3_fetches_then_none_within_the_ttl() {
    let stack = stack(seed(vec![five_versions()]), MountContext::default()).await;
    let entry = format!("- secretId: {HISTORY}\n  fileName: db\n  versions: 3\n");
    let response = stack.mount(&entry).await.unwrap();
    assert_eq!(
        files(&response),
        [("db/0", "v5"), ("db/1", "v4"), ("db/2", "v3")]
    );
    assert_eq!(
        stack.calls(),
        (1, 3, 0),
        "1 list call and 3 GetSecretBundle calls"
    );
    let list = stack
        .emu
        .secrets_calls()
        .into_iter()
        .find(|c| c.target.contains("/versions"))
        .unwrap();
    assert!(
        list.target
            .ends_with("/versions?limit=4&sortBy=VERSION_NUMBER&sortOrder=DESC"),
        "{}",
        list.target
    );
    let versions: Vec<(&str, &str)> = response
        .object_versions
        .iter()
        .map(|v| (v.id.as_str(), v.version.as_str()))
        .collect();
    assert_eq!(
        versions,
        [
            (format!("{HISTORY}/db/0").as_str(), "5"),
            (format!("{HISTORY}/db/1").as_str(), "4"),
            (format!("{HISTORY}/db/2").as_str(), "3"),
        ]
    );
    // A second mount within the TTL: every version and the list from the caches.
    let again = stack.mount(&entry).await.unwrap();
    assert_eq!(files(&again), files(&response));
    assert_eq!(stack.calls(), (1, 3, 0), "no upstream call");
    // A rotation, seen once the TTL passes: every file moves one version back; the list and
    // the three versions are read again (the cache keeps nothing past its TTL).
    stack.emu.rotate_secret(HISTORY, "v6").unwrap();
    stack.clock.advance(Duration::from_secs(31));
    let rotated = stack.mount(&entry).await.unwrap();
    assert_eq!(
        files(&rotated),
        [("db/0", "v6"), ("db/1", "v5"), ("db/2", "v4")]
    );
    assert_eq!(stack.calls(), (2, 6, 0));
    assert_ne!(rotated.object_versions, response.object_versions);
}

#[tokio::test]
async fn versions_of_a_name_entry_list_by_the_ocid_of_its_bundle_and_mount_what_exists() {
    let two = SecretSeed::new("ocid1.vaultsecret.oc1..two", VAULT, "api-key")
        .version(1, "first", &["PREVIOUS"])
        .version(2, "second", &["CURRENT"])
        .version(3, "pending", &["PENDING"]);
    let stack = stack(seed(vec![two]), MountContext::default()).await;
    let response = stack
        .mount("- name: api-key\n  versions: 5\n")
        .await
        .unwrap();
    assert_eq!(
        files(&response),
        [("api-key/0", "second"), ("api-key/1", "first")],
        "fewer versions than asked mount what exists; a pending one is not current"
    );
    let calls = stack.emu.secrets_calls();
    assert!(
        calls[0].target.contains("actions/getByName"),
        "{}",
        calls[0].target
    );
    assert!(
        calls[1]
            .target
            .starts_with("/20190301/secretbundles/ocid1.vaultsecret.oc1..two/versions?"),
        "{}",
        calls[1].target
    );
    assert_eq!(stack.calls(), (1, 2, 0));
}

/// Seven secrets of the vault: three tagged team=payments (one by a prefix it misses),
/// one tagged but scheduled for deletion, three others.
fn seven() -> Vec<SecretSeed> {
    [
        ("app-db", "payments", "ACTIVE"),
        ("app-queue", "payments", "ACTIVE"),
        ("app-cache", "billing", "ACTIVE"),
        ("app-old", "payments", "PENDING_DELETION"),
        ("web-cert", "payments", "ACTIVE"),
        ("web-key", "web", "ACTIVE"),
        ("zz", "ops", "ACTIVE"),
    ]
    .into_iter()
    .map(|(name, team, state)| {
        SecretSeed::new(format!("ocid1.vaultsecret.oc1..{name}"), VAULT, name)
            .tag("team", team)
            .lifecycle(state)
            .version(1, format!("{name}-value"), &["CURRENT"])
    })
    .collect()
}

#[tokio::test]
async fn a_tag_selecting_3_of_7_secrets_over_2_pages_makes_2_list_calls_and_3_fetches() {
    let stack = stack(seed(seven()), MountContext::default()).await;
    stack.emu.set_list_page_size(4);
    let entry = "- tag: team=payments\n  directory: pay\n";
    let response = stack.mount(entry).await.unwrap();
    assert_eq!(
        files(&response),
        [
            ("pay/app-db", "app-db-value"),
            ("pay/app-queue", "app-queue-value"),
            ("pay/web-cert", "web-cert-value")
        ]
    );
    assert_eq!(
        stack.calls(),
        (0, 3, 2),
        "2 ListSecrets pages and 3 fetches"
    );
    let first = &stack.emu.vaults_calls()[0].target;
    assert_eq!(
        first,
        &format!(
            "/20180608/secrets?compartmentId={COMPARTMENT}&lifecycleState=ACTIVE&limit=50\
             &sortBy=NAME&sortOrder=ASC&vaultId={VAULT}"
        )
    );
    assert_eq!(response.object_versions.len(), 3, "one per selected secret");
    stack.mount(entry).await.unwrap();
    assert_eq!(
        stack.calls(),
        (0, 3, 2),
        "the listing is cached like a bundle"
    );
    // A prefix narrows the tag; a newly tagged secret is seen once the TTL passes.
    stack
        .emu
        .set_secret_tag("ocid1.vaultsecret.oc1..app-cache", "team", Some("payments"))
        .unwrap();
    stack.clock.advance(Duration::from_secs(31));
    let narrowed = stack
        .mount("- tag: team=payments\n  namePrefix: app-\n")
        .await
        .unwrap();
    let names: Vec<&str> = narrowed.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["app-cache", "app-db", "app-queue"]);
}

#[tokio::test]
async fn ten_selections_of_one_vault_make_one_listings_pages() {
    let stack = stack(seed(seven()), MountContext::default()).await;
    stack.emu.set_list_page_size(4);
    // Ten entries selecting differently from one vault: one listing, filtered ten ways.
    let entries: String = (0..10)
        .map(|i| match i % 3 {
            0 => format!("- tag: team=payments\n  directory: d{i}\n"),
            1 => format!("- namePrefix: app-\n  directory: d{i}\n"),
            _ => format!("- tag: team\n  namePrefix: web-\n  directory: d{i}\n"),
        })
        .collect();
    let response = stack.mount(&entries).await.unwrap();
    assert_eq!(response.files.len(), 4 * 3 + 3 * 3 + 3 * 2);
    assert_eq!(
        stack.calls(),
        (0, 5, 2),
        "the vault's 2 ListSecrets pages once, and each of the 5 secrets selected fetched once"
    );
    stack.mount(&entries).await.unwrap();
    assert_eq!(stack.calls(), (0, 5, 2), "and once in the cache");
}

#[tokio::test]
async fn a_mounts_selections_share_the_files_it_may_write_before_they_fetch() {
    let config = MountContext {
        max_files: 4,
        ..MountContext::default()
    };
    let stack = stack(seed(seven()), config).await;
    // Three and three: each fits the four files alone, not together.
    let err = stack
        .mount("- tag: team=payments\n  directory: pay\n- namePrefix: app-\n  directory: app\n")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.message().contains("selects more than 1 secrets"),
        "{err}"
    );
    let (_, fetches, _) = stack.calls();
    assert!(
        fetches <= 3,
        "the selection refused fetched nothing: {fetches}"
    );
}

#[tokio::test]
async fn a_mounts_listing_pages_are_capped_over_all_its_entries() {
    let config = MountContext {
        max_listing_pages: 3,
        ..MountContext::default()
    };
    let stack = stack(seed(seven()), config).await;
    stack.emu.set_list_page_size(1);
    // The vault's six active secrets take six pages: past the mount's three.
    let err = stack
        .mount("- tag: team=payments\n  directory: pay\n")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(
        err.message()
            .contains("stopped after 3 pages: the mount has sent all the listing pages"),
        "{err}"
    );
    assert_eq!(
        stack.calls(),
        (0, 0, 3),
        "no fourth page, and nothing cached"
    );
    let err = stack
        .mount("- tag: team=payments\n  directory: pay\n")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert_eq!(stack.calls(), (0, 0, 6), "a refused listing is not cached");
}

#[tokio::test]
async fn a_tag_selecting_more_than_the_file_limit_is_refused_naming_the_setting() {
    let config = MountContext {
        max_files: 3,
        ..MountContext::default()
    };
    let stack = stack(seed(seven()), config).await;
    let err = stack.mount("- name: zz\n- tag: team\n").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message().contains(
            "secrets[1].tag \"team\" selects more than 2 secrets of vault ocid1.vault.oc1..kinds, \
             the files this mount may still write (server.max_files_per_mount is 3)"
        ),
        "{}",
        err.message()
    );
    let fetched = stack.emu.secrets_calls();
    assert!(
        fetched.iter().all(|c| c.target.contains("secretName=zz&")),
        "no secret of the selection was fetched: {fetched:?}"
    );
}

#[tokio::test]
async fn a_tag_listing_the_principal_may_not_inspect_names_the_missing_policy_statement() {
    let mut seed = seed(seven());
    seed.compartments.clear();
    let stack = stack(seed, MountContext::default()).await;
    let err = stack.mount("- tag: team=payments\n").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let message = err.message();
    for needle in [
        "secrets[0].tag \"team=payments\": cannot list the secrets of vault \
         ocid1.vault.oc1..kinds in compartment ocid1.compartment.oc1..team",
        "NotAuthorizedOrNotFound",
        &format!("to inspect secrets in compartment id {COMPARTMENT}\""),
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
}

#[tokio::test]
async fn a_tag_listing_reserves_from_the_byte_budget_like_any_fetch() {
    // Room for the parse of the parameters, not for one fetch's reservation.
    let stack = stack_within(
        seed(seven()),
        MountContext::default(),
        crate::fakes::RESERVE - 1,
    )
    .await;
    let err = stack.mount("- tag: team=payments\n").await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::ResourceExhausted,
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("server.max_in_flight_bytes"),
        "{}",
        err.message()
    );
    assert_eq!(
        stack.calls(),
        (0, 0, 0),
        "refused before the listing was sent"
    );
}

#[tokio::test]
async fn a_tag_selecting_no_secret_fails_the_mount_as_a_missing_secret_does() {
    let stack = stack(seed(seven()), MountContext::default()).await;
    let err = stack.mount("- tag: team=nobody\n").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(
        err.message(),
        format!(
            "secrets[0].tag \"team=nobody\" selects no ACTIVE secret of vault {VAULT} in \
             compartment {COMPARTMENT}"
        )
    );
}

/// The class `cargo xtask demo` mounts (its `SECRETS`, read from the source).
fn demo_class() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let demo = std::fs::read_to_string(root.join("xtask/src/demo.rs")).unwrap();
    let start = demo
        .find("pub(crate) const SECRETS: &str = \"\\\n")
        .expect("the demo's SECRETS");
    let text = &demo[start..];
    let text = &text[text.find('\n').unwrap() + 1..];
    let end = text.find("\";\n").expect("the end of SECRETS");
    text[..end].replace("\\\"", "\"").replace("\\\\", "\\")
}

/// A new kind is a module and an arm of `Entry`; what would be forgotten besides is held
/// here: `check` describes it, the README's table of kinds lists it with the fields that
/// make it, and the demo mounts one.
#[test]
fn every_entry_kind_is_described_by_check_listed_in_the_readme_and_mounted_by_the_demo() {
    let mut attributes = crate::params::attrs(&demo_class(), &[]);
    attributes.insert("compartmentId".into(), COMPARTMENT.into());
    let params = MountParameters::parse(&attributes, &crate::params::pod()).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| kind | made by |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(table.len() > 2, "the README's table of entry kinds");
    for (kind, fields) in oci_csi_provider::KINDS {
        let entries: Vec<&oci_csi_provider::Entry> =
            params.entries.iter().filter(|e| e.kind() == kind).collect();
        assert!(!entries.is_empty(), "the demo mounts no {kind} entry");
        for entry in entries {
            assert!(
                !entry.describe().is_empty(),
                "check describes no file of {entry:?}"
            );
        }
        let row = table
            .iter()
            .find(|row| row.starts_with(&format!("| {kind} |")))
            .unwrap_or_else(|| panic!("the README's table of kinds has no row for {kind}"));
        for field in fields {
            assert!(
                row.contains(&format!("`{field}`")),
                "{kind}: {field} not in {row}"
            );
        }
    }
}
