//! A mount's cost, measured in every resource: a counting global allocator records the peak
//! bytes allocated while one mount runs, and hostile inputs (anchors and aliases nested and
//! across keys and values, merge keys, deep nesting, thousands of keys, long scalars, JSON of
//! the same shapes, certificate bundles and keys, templates nested, comparing, looping and
//! filtering, selections and version histories) must keep it within
//!
//! `peak ≤ K × (request bytes + fetched bytes) + C`
//!
//! with [`K`] and [`C`] the figures of ARCHITECTURE.md's cost model; and every mount runs on
//! threads of [`STACK`] bytes (a recursion past it aborts the test binary), its CPU time is
//! at most [`CPU`], and its upstream calls (fetches and listing pages) at most [`CALLS`]. The
//! sources: the `secrets` parameter (through the wire translation and the mount service), the
//! user principal's Kubernetes Secret, a secret's content read with `keys`, certificate
//! material, templates, selections, version histories. `cargo xtask fuzz` runs these
//! properties with many more cases. A new parser or entry kind adds its generator here, and
//! is then metered on every resource.
//!
//! The allocator counts every thread of this process, so the measurements take one lock and
//! build their inputs inside it: nothing else of this binary allocates while one runs.
#![allow(unreachable_pub, missing_debug_implementations, dead_code)]

#[path = "../it/fakes.rs"]
mod fakes;
mod hostile;
mod listings;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use csi_grpc::MountRequest;
use futures_util::future::BoxFuture;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tower::{Layer as _, ServiceExt};

use fakes::{Auth, Behaviour, Vault};

#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

/// Bytes allocated at the peak per byte a mount reads (its request and what it fetched).
pub const K: usize = 48;
/// Bytes allocated at the peak whatever the mount reads (the runtime's task, the mount's
/// bookkeeping, the identity, spans).
pub const C: usize = 512 * 1024;
/// The stack of every thread a measured mount runs on (its runtime's and its blocking
/// pool's): half a tokio worker's 2 MiB. In this debug build the YAML parser's generic code
/// takes ~10 KiB a level of nesting (its 32 levels fit); a release build a fraction of it.
pub const STACK: usize = 1024 * 1024;
/// The CPU time one measured mount may take, in this (debug) build: generous (a release
/// build is ~20x faster; ARCHITECTURE.md gives the release figures), but a mount whose work
/// grows past its input (the deep comparisons of a review took minutes) passes it by far.
pub const CPU: std::time::Duration = std::time::Duration::from_secs(3);
/// The upstream calls one mount may make when nothing fails: one fetch per file it may write
/// (`server.max_files_per_mount`) and the listing pages of `MountContext::max_listing_pages`.
pub const CALLS: usize = 256 + vault::MAX_PAGES as usize;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The peak bytes allocated (above what was held before) while `f` runs.
fn peak_while<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let result = f();
    (result, HEAP.peak_usage().saturating_sub(before))
}

/// One measurement: what the mount read, its peak heap, its CPU time and its upstream calls.
#[derive(Debug)]
struct Measured {
    request: usize,
    fetched: usize,
    peak: usize,
    cpu: std::time::Duration,
    calls: usize,
}

impl Measured {
    fn bound(&self) -> usize {
        K * (self.request + self.fetched) + C
    }

    fn check(&self, what: &str) -> Result<(), TestCaseError> {
        if std::env::var_os("HEAP_REPORT").is_some() {
            eprintln!(
                "heap {what}: request {} fetched {} peak {} ({:.1} per byte read) cpu {:?} calls {}",
                self.request,
                self.fetched,
                self.peak,
                self.peak as f64 / (self.request + self.fetched).max(1) as f64,
                self.cpu,
                self.calls
            );
        }
        prop_assert!(self.cpu <= CPU, "{what}: {:?} of CPU > {CPU:?}", self.cpu);
        prop_assert!(
            self.calls <= CALLS,
            "{what}: {} upstream calls > {CALLS}",
            self.calls
        );
        prop_assert!(
            self.peak <= self.bound(),
            "{what}: peak {} bytes > {K} x ({} + {}) + {C} = {}",
            self.peak,
            self.request,
            self.fetched,
            self.bound()
        );
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .thread_stack_size(STACK)
        .build()
        .unwrap()
}

/// The CPU time this process has used.
fn cpu_now() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `f` on a thread of [`STACK`] bytes.
fn on_small_stack<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(STACK)
            .spawn_scoped(scope, f)
            .expect("a thread")
            .join()
            .expect("the measured mount panicked")
    })
}

/// The driver's request for a class with `secrets` (and `extra` parameters), as JSON on
/// the wire.
fn wire_request(secrets: &str, extra: &[(&str, &str)]) -> csi_grpc::proto::MountRequest {
    let mut attributes: BTreeMap<&str, &str> = [
        ("secrets", secrets),
        ("vaultId", "ocid1.vault.oc1..v"),
        ("authType", "workload"),
        ("secretProviderClass", "spc"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "app"),
        ("csi.storage.k8s.io/pod.uid", "uid"),
        ("csi.storage.k8s.io/serviceAccount.name", "web"),
    ]
    .into_iter()
    .collect();
    attributes.extend(extra.iter().copied());
    csi_grpc::proto::MountRequest {
        attributes: serde_json::to_string(&attributes).unwrap(),
        secrets: "{}".into(),
        target_path: "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/v/mount".into(),
        permission: "420".into(),
        current_object_version: vec![],
    }
}

/// One mount of `wire` through the wire translation and the mount service, over `vault`
/// and `certificates`, measured. `fetched` is what the fakes answer.
fn measure_mount<C>(
    wire: csi_grpc::proto::MountRequest,
    vault: Vault,
    certificates: C,
    fetched: usize,
) -> Measured
where
    oci_csi_provider::Budget<C>: oci_csi_provider::CertificateService,
    C: Send,
{
    measure_with_listings(
        wire,
        vault,
        certificates,
        fetched,
        listings::Pages::default(),
    )
}

/// [`measure_mount`] with `pages` answering the mount's listings.
fn measure_with_listings<C>(
    wire: csi_grpc::proto::MountRequest,
    vault: Vault,
    certificates: C,
    fetched: usize,
    pages: listings::Pages,
) -> Measured
where
    oci_csi_provider::Budget<C>: oci_csi_provider::CertificateService,
    C: Send,
{
    let request = wire.attributes.len();
    let requests = vault.requests.clone();
    let behaviours = vault.behaviours.clone();
    let listed = pages.served.clone();
    let listed_bytes = pages.bytes.clone();
    // The binary's wiring: one budget for the fetches, the listings and the parses.
    let budget = oci_csi_provider::ByteBudget::new(64 << 20);
    let service = fakes::mount(
        Auth::default(),
        vault,
        certificates,
        oci_csi_provider::MountContext {
            byte_budget: Some(budget.clone()),
            endpoints: Arc::new(vaults_too()),
            ..fakes::config()
        },
        Some(budget.clone()),
    )
    .with_listings(
        oci_csi_provider::BudgetLayer::new(Some(budget), fakes::RESERVE)
            .layer(vault::ListerLayer.layer(pages)),
    );
    let started = cpu_now();
    let (_, peak) = peak_while(|| {
        on_small_stack(move || {
            let rt = runtime();
            rt.block_on(async {
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
                let Ok(request) = MountRequest::from_proto(wire, deadline) else {
                    return;
                };
                let answer = service.oneshot(request).await;
                // `HEAP_REPORT=1 cargo nextest run -p oci-csi-provider --test heap
                // --no-capture` prints what each case measured and how the mount ended.
                if std::env::var_os("HEAP_REPORT").is_some() {
                    let ended = answer
                        .as_ref()
                        .map(|r| format!("{} files", r.files.len()))
                        .unwrap_or_else(|e| e.message().chars().take(160).collect());
                    eprintln!("mount: {ended}");
                }
            })
        })
    });
    let cpu = cpu_now().saturating_sub(started);
    let requests = requests.lock().unwrap();
    let calls = requests.len() + listed.load(std::sync::atomic::Ordering::SeqCst);
    // What the fake vault answered by default (a secret's name as its content) and the
    // listings' pages are read too; the caller counted the content it configured.
    let behaviours = behaviours.lock().unwrap();
    let default_bundles: usize = requests
        .iter()
        .filter_map(|r| match &r.secret {
            vault::SecretRef::ByName { name, .. } if !behaviours.contains_key(name) => {
                Some(name.len())
            }
            vault::SecretRef::ById { secret_id } if !behaviours.contains_key(secret_id) => {
                Some(secret_id.len())
            }
            _ => None,
        })
        .sum();
    Measured {
        request,
        fetched: fetched + default_bundles + listed_bytes.load(std::sync::atomic::Ordering::SeqCst),
        peak,
        cpu,
        calls,
    }
}

/// The tests' endpoints, with the Vault API's too (for listings).
fn vaults_too() -> oci_csi_provider::Endpoints {
    let overrides = oci_csi_provider::EndpointOverrides {
        secrets: Some("https://secrets.example".into()),
        certificates: Some("https://certificates.example".into()),
        vaults: Some("https://vaults.example".into()),
        ..oci_csi_provider::EndpointOverrides::default()
    };
    oci_csi_provider::Endpoints::new(regions::Regions::default(), None, overrides).unwrap()
}

fn runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Runs `property` over `strategy` with the lock held for the whole run.
fn run<S: Strategy>(
    cases: u32,
    strategy: S,
    property: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let result = runner(cases).run(&strategy, property);
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------
// The `secrets` parameter.

#[test]
fn fuzz_the_secrets_parameter_peak_heap_is_bounded_by_what_the_mount_reads() {
    let either = prop_oneof![
        hostile::shape().prop_map(|s| s.render(240 * 1024)),
        hostile::hostile_list().prop_map(|l| l.render(240 * 1024)),
    ];
    run(64, either, |secrets| {
        let wire = wire_request(&secrets, &[]);
        measure_mount(wire, Vault::default(), oci_csi_provider::NoCertificates, 0)
            .check("secrets parameter")
    });
}

/// The review's finding, fixed: one scalar anchored once and aliased from every field of
/// 256 entries took ~65 MB per mount on the default parser budget.
#[test]
fn the_reviews_aliased_secrets_parameter_stays_within_the_bound() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    for scalar in [1_000, 14_000] {
        let secrets = hostile::HostileList {
            entries: 256,
            scalar,
            aliases_per_entry: 9,
            keys_per_entry: 0,
            nested: false,
        }
        .render(usize::MAX);
        let measured = measure_mount(
            wire_request(&secrets, &[]),
            Vault::default(),
            oci_csi_provider::NoCertificates,
            0,
        );
        assert!(
            measured.peak <= measured.bound(),
            "{scalar}: {measured:?} over {}",
            measured.bound()
        );
        // And far below what the default budget allowed (tens of megabytes).
        assert!(measured.peak < 8 << 20, "{measured:?}");
    }
}

// ---------------------------------------------------------------------------------------
// A secret's content read with `keys`.

fn keys_mount(content: Vec<u8>, format: &str) -> Measured {
    let fetched = content.len();
    let vault = Vault::default().with(
        "s",
        Behaviour::Bundle {
            content,
            secret_id: "ocid1.vaultsecret.oc1..s".into(),
            version: 1,
        },
    );
    let secrets = format!(
        "- name: s\n  keys: [{{key: a}}, {{key: /l1/0, fileName: p}}, {{key: \"0\", fileName: z}}]{format}\n"
    );
    let requests = vault.requests.clone();
    let measured = measure_mount(
        wire_request(&secrets, &[]),
        vault,
        oci_csi_provider::NoCertificates,
        fetched,
    );
    // The content was fetched, so the parse for keys ran.
    if !requests.lock().unwrap().is_empty() {
        EXERCISED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    measured
}

/// Cases that reached the part under test (a measurement that never parsed would prove
/// nothing).
static EXERCISED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn fuzz_secret_content_read_for_keys_peak_heap_is_bounded_by_what_the_mount_reads() {
    let formats = prop_oneof![
        Just(String::new()),
        Just("\n  format: yaml".to_owned()),
        Just("\n  format: json".to_owned()),
    ];
    let before = EXERCISED.load(std::sync::atomic::Ordering::Relaxed);
    run(64, (hostile::shape(), formats), |(shape, format)| {
        // OCI secrets hold 25 KB; the body limit lets a bundle carry up to ~190 KB.
        let content = shape.render(190 * 1024).into_bytes();
        keys_mount(content, &format).check("keys")
    });
    assert!(EXERCISED.load(std::sync::atomic::Ordering::Relaxed) > before);
}

/// The review's finding, fixed: a 15 KB secret of nested anchors mounted with
/// `keys: [{key: a}]` built a ~62 MB document.
#[test]
fn the_reviews_nested_anchor_secret_stays_within_the_bound() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let content = hostile::Shape::Laughs {
        levels: 9,
        fanout: 10,
        leaf: 10,
    }
    .render(15 * 1024)
    .into_bytes();
    let measured = keys_mount(content, "");
    assert!(
        measured.peak <= measured.bound(),
        "{measured:?} over {}",
        measured.bound()
    );
    assert!(measured.peak < 4 << 20, "{measured:?}");
}

// ---------------------------------------------------------------------------------------
// Template entries over a hostile input.

#[test]
fn fuzz_templates_peak_heap_is_bounded_by_what_the_mount_reads() {
    let templates = prop_oneof![
        Just("{% for x in json('doc') %}{{ x }}{% endfor %}".to_owned()),
        Just("{{ json('doc') | tojson }}".to_owned()),
        Just("{{ text('doc') | b64encode }}".to_owned()),
        Just(
            "{% for k, v in json('doc') | items %}{{ k }}={{ v | tojson }}\n{% endfor %}"
                .to_owned()
        ),
        Just("{{ json('doc') | join(',') }}".to_owned()),
        Just(
            "{% for a in json('doc') %}{% for b in json('doc') %}{{ b }}{% endfor %}{% endfor %}"
                .to_owned()
        ),
        hostile::template(),
    ];
    run(64, (templates, hostile::shape()), |(template, shape)| {
        let content = shape.render(60 * 1024).into_bytes();
        let list = format!("[{}]", vec!["0"; 4000].join(",")).into_bytes();
        let fetched = 2 * content.len() + list.len();
        let bundle = |content: Vec<u8>, name: &str| Behaviour::Bundle {
            content,
            secret_id: format!("ocid1.vaultsecret.oc1..{name}"),
            version: 1,
        };
        let vault = Vault::default()
            .with("doc", bundle(content.clone(), "doc"))
            .with("same", bundle(content, "same"))
            .with("list", bundle(list, "list"));
        let secrets = format!(
            "- name: doc\n  writeFile: false\n- name: same\n  writeFile: false\n\
             - name: list\n  writeFile: false\n- fileName: out\n  template: {}\n",
            serde_json::to_string(&template).unwrap()
        );
        let m = measure_mount(
            wire_request(&secrets, &[]),
            vault,
            oci_csi_provider::NoCertificates,
            fetched,
        );
        m.check("template")
    });
}

// ---------------------------------------------------------------------------------------
// Selections and version histories: listings and the fetches they start.

#[test]
fn fuzz_selections_and_version_histories_cost_is_bounded_in_every_resource() {
    let vaults = (0..2_000usize, 1..60u64);
    run(
        32,
        (hostile::listings(), vaults),
        |(class, (secrets, versions))| {
            let pages = listings::Pages {
                secrets,
                versions,
                ..listings::Pages::default()
            };
            let m = measure_with_listings(
                wire_request(
                    &class.render(),
                    &[("compartmentId", "ocid1.compartment.oc1..c")],
                ),
                Vault::default(),
                oci_csi_provider::NoCertificates,
                0,
                pages,
            );
            m.check("selections and version histories")
        },
    );
}

// ---------------------------------------------------------------------------------------
// The user principal's Secret.

fn user_secret_body(config: &str, key_pem: &[u8], junk: usize) -> Vec<u8> {
    let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
    serde_json::json!({
        "metadata": {"resourceVersion": "1"},
        "data": {
            "config": b64(config.as_bytes()),
            "private-key": b64(key_pem),
            "junk": b64(&vec![b'j'; junk]),
        }
    })
    .to_string()
    .into_bytes()
}

#[test]
fn fuzz_the_user_secret_peak_heap_is_bounded_by_what_the_mount_reads() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)
        .map(|k| k.serialize_pem())
        .unwrap_or_default();
    let config = prop_oneof![
        hostile::shape().prop_map(|s| format!("auth:\n  x: &x 1\n{}", s.render(15 * 1024))),
        (1..4_000usize).prop_map(|n| {
            let v = "o".repeat(n);
            format!(
                "v: &v {v}\nauth:\n  region: *v\n  tenancy: *v\n  user: *v\n  fingerprint: *v\n  passphrase: *v\n"
            )
        }),
        Just(
            "auth:\n  region: iad\n  tenancy: ocid1.tenancy.oc1..t\n  user: ocid1.user.oc1..u\n  \
             fingerprint: 12:34:56:78:9a:bc:de:f0:12:34:56:78:9a:bc:de:f0\n"
            .to_owned()
        ),
    ];
    run(32, (config, 0..200_000usize), |(config, junk)| {
        let body = user_secret_body(&config, key.as_bytes(), junk);
        let started = cpu_now();
        let (_, peak) =
            peak_while(|| on_small_stack(|| auth::load_user_secret_for_tests(&body).is_ok()));
        Measured {
            request: 0,
            fetched: body.len(),
            peak,
            cpu: cpu_now().saturating_sub(started),
            calls: 0,
        }
        .check("user secret")
    });
}

// ---------------------------------------------------------------------------------------
// Certificate material.

/// A Certificates service answering every request with one bundle.
#[derive(Clone)]
struct Certs(Arc<vault::CertificateBundle>);

impl tower::Service<vault::CertificateRequest> for Certs {
    type Response = vault::CertificateBundle;
    type Error = vault::VaultError;
    type Future = BoxFuture<'static, Result<vault::CertificateBundle, vault::VaultError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: vault::CertificateRequest) -> Self::Future {
        let bundle = (*self.0).clone();
        Box::pin(async move { Ok(bundle) })
    }
}

/// Hostile certificate material: many certificates in one chain, PEM blocks of garbage,
/// one huge block, a key that is not one.
#[derive(Clone, Debug)]
enum Material {
    ManyCertificates(usize),
    GarbageBlocks(usize, usize),
    HugeBlock(usize),
    KeyGarbage(usize),
}

fn pem_block(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn certificate_bundle(material: &Material, leaf: &str) -> vault::CertificateBundle {
    let (chain, key) = match material {
        Material::ManyCertificates(n) => (leaf.repeat(*n), None),
        Material::GarbageBlocks(n, len) => (
            (0..*n)
                .map(|i| pem_block("CERTIFICATE", &vec![i as u8; *len]))
                .collect(),
            None,
        ),
        Material::HugeBlock(len) => (pem_block("CERTIFICATE", &vec![0x30; *len]), None),
        Material::KeyGarbage(len) => (
            leaf.to_owned(),
            Some(pem_block("PRIVATE KEY", &vec![0x30; *len])),
        ),
    };
    vault::CertificateBundle {
        id: "ocid1.certificate.oc1..c".into(),
        name: "web".into(),
        version_number: Some(1),
        version_name: None,
        stages: vec!["CURRENT".into()],
        certificate_pem: leaf.to_owned(),
        chain_pem: Some(chain),
        private_key_pem: key
            .map(|k| vault::SecretContent::new(zeroize::Zeroizing::new(k.into_bytes()))),
        private_key_passphrase: None,
        revoked: None,
        bundle_type: None,
        opc_request_id: None,
    }
}

#[test]
fn fuzz_certificate_material_peak_heap_is_bounded_by_what_the_mount_reads() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["web.example.com".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let material = prop_oneof![
        (1..200usize).prop_map(Material::ManyCertificates),
        (1..200usize, 1..2_000usize).prop_map(|(n, len)| Material::GarbageBlocks(n, len)),
        (1..150_000usize).prop_map(Material::HugeBlock),
        (1..100_000usize).prop_map(Material::KeyGarbage),
    ];
    run(32, material, |material| {
        let bundle = certificate_bundle(&material, &leaf);
        let fetched = bundle.certificate_pem.len()
            + bundle.chain_pem.as_ref().map_or(0, String::len)
            + bundle.private_key_pem.as_ref().map_or(0, |k| k.len());
        let private_key = matches!(material, Material::KeyGarbage(_));
        let secrets =
            format!("- certificateId: ocid1.certificate.oc1..c\n  privateKey: {private_key}\n");
        measure_mount(
            wire_request(&secrets, &[]),
            Vault::default(),
            Certs(Arc::new(bundle)),
            fetched,
        )
        .check("certificate material")
    });
}

/// A list of the most entries a mount may have, each as small as an entry can be: what a
/// mount holds per entry is bounded by its fan-out, not by the list's length (entries wait
/// for their turn as a few bytes each, not as a started fetch).
#[test]
fn the_most_entries_of_the_smallest_kind_stay_within_the_bound() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let mut vault = Vault::default();
    let mut secrets = String::new();
    for i in 0..256 {
        let name = format!("s{i}");
        secrets.push_str(&format!("- name: {name}\n"));
        vault = vault.with(
            &name,
            Behaviour::Bundle {
                content: b"v".to_vec(),
                secret_id: format!("ocid1.vaultsecret.oc1..{name}"),
                version: 1,
            },
        );
    }
    let measured = measure_mount(
        wire_request(&secrets, &[]),
        vault,
        oci_csi_provider::NoCertificates,
        256,
    );
    if std::env::var_os("HEAP_REPORT").is_some() {
        eprintln!("256 minimal entries: {measured:?}");
    }
    assert!(
        measured.peak <= measured.bound(),
        "{measured:?} over {}",
        measured.bound()
    );
}
