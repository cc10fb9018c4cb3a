//! No tenant can exhaust, stall or out-rank another: every fetch kind, key kind and file
//! kind passes through the same bounds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use csi_grpc::ErrorKind;
use futures_util::future::BoxFuture;
use oci_csi_provider::{AuthType, ByteBudget, MountContext, MountParameters, ParseLimits};
use serde_json::json;
use tower::ServiceExt;

use crate::fakes::{Auth, Behaviour, Vault};
use crate::fanout::request;

/// A Certificates service answering every request with one bundle (after `delay`),
/// counting calls.
#[derive(Clone)]
pub(crate) struct Certs {
    bundle: Arc<vault::CertificateBundle>,
    pub(crate) calls: Arc<AtomicUsize>,
    budget_seen: Arc<Mutex<Vec<usize>>>,
    budget: Option<ByteBudget>,
    delay: std::time::Duration,
}

impl Certs {
    pub(crate) fn new(bundle: vault::CertificateBundle, budget: Option<ByteBudget>) -> Self {
        Self {
            bundle: Arc::new(bundle),
            calls: Arc::default(),
            budget_seen: Arc::default(),
            budget,
            delay: std::time::Duration::ZERO,
        }
    }

    pub(crate) fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }
}

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
        self.calls.fetch_add(1, Ordering::SeqCst);
        // What the budget holds while this fetch runs: its own reservation included.
        if let Some(budget) = &self.budget {
            self.budget_seen.lock().unwrap().push(budget.used());
        }
        let bundle = (*self.bundle).clone();
        let delay = self.delay;
        Box::pin(async move {
            tokio::task::yield_now().await;
            tokio::time::sleep(delay).await;
            Ok(bundle)
        })
    }
}

pub(crate) fn bundle(id: &str, certificate_pem: String) -> vault::CertificateBundle {
    vault::CertificateBundle {
        id: id.into(),
        name: "web".into(),
        version_number: Some(1),
        version_name: None,
        stages: vec!["CURRENT".into()],
        certificate_pem,
        chain_pem: None,
        private_key_pem: None,
        private_key_passphrase: None,
        revoked: None,
        bundle_type: None,
        opc_request_id: None,
    }
}

pub(crate) fn self_signed() -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    rcgen::CertificateParams::new(vec!["web.example.com".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem()
}

/// A well-formed ENCRYPTED PRIVATE KEY whose scrypt parameters (N = 2^20, r = 8) would make
/// the derivation allocate 1 GiB.
fn scrypt_key_n_2_20() -> String {
    use pkcs8::der::Encode as _;
    use pkcs8::pkcs5::{self, pbes2};
    let params = pbes2::Parameters {
        kdf: pbes2::Kdf::Scrypt(pbes2::ScryptParams {
            salt: pbes2::Salt::new([0u8; 16]).unwrap(),
            cost_parameter: 1 << 20,
            block_size: 8,
            parallelization: 1,
            key_length: None,
        }),
        encryption: pbes2::EncryptionScheme::Aes256Cbc { iv: [7; 16] },
    };
    let info = pkcs8::EncryptedPrivateKeyInfo {
        encryption_algorithm: pkcs5::EncryptionScheme::Pbes2(params),
        encrypted_data: pkcs8::der::asn1::OctetString::new(vec![0u8; 160]).unwrap(),
    };
    pem_rfc7468::encode_string(
        "ENCRYPTED PRIVATE KEY",
        pem_rfc7468::LineEnding::LF,
        &info.to_der().unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_key_asking_for_scrypt_n_2_20_is_refused_before_deriving_through_the_gate() {
    let mut answer = bundle("ocid1.certificate.oc1..web", self_signed());
    answer.private_key_pem = Some(vault::SecretContent::new(zeroize::Zeroizing::new(
        scrypt_key_n_2_20().into_bytes(),
    )));
    answer.private_key_passphrase = Some(vault::SecretContent::new(zeroize::Zeroizing::new(
        b"oci-made-passphrase".to_vec(),
    )));
    let config = crate::fakes::config();
    let keys = config.tenant_keys.clone();
    let service = crate::fakes::mount(
        Auth::default(),
        Vault::default(),
        Certs::new(answer, None),
        config,
        None,
    );
    let err = service
        .oneshot(request(
            "- certificateId: ocid1.certificate.oc1..web\n  privateKey: true\n",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let message = err.message();
    assert!(message.contains("secrets[0] certificateId"), "{message}");
    assert!(message.contains("exceed limits"), "{message}");
    assert!(message.contains("N=1048576"), "{message}");
    assert!(!message.contains("oci-made-passphrase"), "{message}");
    // The key went through the one gate of tenant keys (on the blocking pool).
    assert_eq!(keys.loads(), 1);
    assert_eq!(keys.running(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_fetches_reserve_from_the_byte_budget_and_stop_at_the_mount_limit() {
    // 256 caBundleId entries of one 250 KB bundle: each fetch reserves its 256 KiB, counts
    // against the mount's running total, and the mount stops once it passes 3.5 MiB.
    let mut pem = self_signed();
    pem.push_str(&"\n".repeat(250_000));
    let budget = ByteBudget::new(32 << 20);
    let certs = Certs::new(bundle("ocid1.cabundle.oc1..ca", pem), Some(budget.clone()));
    let config = MountContext {
        ..crate::fakes::config()
    };
    let service = crate::fakes::mount(
        Auth::default(),
        Vault::default(),
        certs.clone(),
        config,
        Some(budget.clone()),
    );
    let mut yaml = String::new();
    for i in 0..256 {
        yaml.push_str(&format!(
            "- caBundleId: ocid1.cabundle.oc1..ca\n  directory: ca{i}\n"
        ));
    }
    let err = service.oneshot(request(&yaml)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.message().contains("more than 3670016 bytes"), "{err}");
    let calls = certs.calls.load(Ordering::SeqCst);
    // 3.5 MiB is passed at the 15th bundle; at most a fan-out more were started.
    assert!((15..=15 + 8).contains(&calls), "{calls} fetches");
    let seen = certs.budget_seen.lock().unwrap().clone();
    assert!(seen.iter().all(|used| *used >= 256 * 1024), "{seen:?}");
    assert_eq!(budget.used(), 0, "everything given back");
    assert!(
        budget.high_water() <= 9 * 256 * 1024 + 15 * 250_000,
        "{budget:?}"
    );
}

#[tokio::test]
async fn a_full_budget_refuses_certificate_fetches_as_it_refuses_secrets() {
    let budget = ByteBudget::new(256 * 1024);
    let held = budget.try_reserve(1).unwrap();
    let certs = Certs::new(
        bundle("ocid1.cabundle.oc1..ca", self_signed()),
        Some(budget.clone()),
    );
    let config = MountContext {
        ..crate::fakes::config()
    };
    let service = crate::fakes::mount(
        Auth::default(),
        Vault::default(),
        certs.clone(),
        config,
        Some(budget.clone()),
    );
    let err = service
        .oneshot(request("- caBundleId: ocid1.cabundle.oc1..ca\n"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("server.max_in_flight_bytes"),
        "{err}"
    );
    assert_eq!(
        certs.calls.load(Ordering::SeqCst),
        0,
        "no call without bytes"
    );
    drop(held);
}

#[tokio::test]
async fn one_namespace_cannot_take_the_whole_byte_budget() {
    // Namespace app's mounts hang: alone, it may hold six of a budget of eight fetches
    // (all but one share of two), then it is refused; namespace other still mounts.
    let reserve = 256 * 1024;
    let budget = ByteBudget::with_namespace_share(8 * reserve, 2 * reserve);
    let vault = Vault::default().with("slow", Behaviour::Hang);
    let config = MountContext {
        ..crate::fakes::config()
    };
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        config,
        Some(budget.clone()),
    );
    let stalled: Vec<_> = (0..6)
        .map(|_| tokio::spawn(service.clone().oneshot(request("- name: slow\n"))))
        .collect();
    while budget.used_by("app") < 6 * reserve {
        tokio::task::yield_now().await;
    }
    let err = service
        .clone()
        .oneshot(request("- name: fast\n"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.message().contains("namespace app"), "{err}");
    assert!(
        err.message()
            .contains("server.max_in_flight_bytes_per_namespace"),
        "{err}"
    );
    let mut other = request("- name: fast\n");
    other.pod.namespace = Some("other".into());
    let response = service.oneshot(other).await.unwrap();
    assert_eq!(response.files.len(), 1);
    for task in stalled {
        task.abort();
    }
}

/// The parameters of an instance-principal class whose `secrets` is `yaml`.
fn instance_class(yaml: &str) -> std::collections::BTreeMap<String, String> {
    serde_json::from_value(json!({
        "secrets": yaml,
        "vaultId": "ocid1.vault.oc1..v",
        "authType": "instance",
    }))
    .unwrap()
}

#[test]
fn a_keys_list_past_the_file_cap_is_refused_while_it_is_parsed() {
    // 257 keys, then YAML that does not parse: the parser must stop at the cap, before it
    // reaches the broken part (today's parser built the whole list first).
    let mut yaml = String::from("- name: config\n  keys:\n");
    for i in 0..257 {
        yaml.push_str(&format!("  - key: k{i}\n"));
    }
    yaml.push_str("  - key: [unterminated\n");
    let attributes = instance_class(&yaml);
    let err = MountParameters::parse(&attributes, &csi_grpc::Pod::default()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("more than 256 files"), "{message}");
    assert!(message.contains("server.max_files_per_mount"), "{message}");
}

#[test]
fn entries_with_keys_are_not_counted_twice() {
    // 200 entries of one key each write 200 files: within the cap of 256.
    let mut yaml = String::new();
    for i in 0..200 {
        yaml.push_str(&format!(
            "- name: s{i}\n  keys:\n  - key: k\n    fileName: f{i}\n"
        ));
    }
    let attributes = instance_class(&yaml);
    let params = MountParameters::parse(&attributes, &csi_grpc::Pod::default()).unwrap();
    assert_eq!(params.secrets().len(), 200);
}

#[test]
fn every_kind_of_file_counts_against_the_cap() {
    // Four whole secrets, two keys and a certificate with its key (tls.crt, ca.crt,
    // tls.key): nine files.
    let yaml = "- name: a\n- name: b\n- name: c\n- name: d\n\
                - name: e\n  keys:\n  - key: x\n  - key: y\n\
                - certificateId: ocid1.certificate.oc1..web\n  privateKey: true\n";
    let attributes = instance_class(yaml);
    let pod = csi_grpc::Pod::default();
    let within = |max_files| {
        MountParameters::parse_within(
            &attributes,
            &pod,
            ParseLimits {
                max_files,
                ..ParseLimits::default()
            },
        )
    };
    assert!(within(9).is_ok());
    let err = within(8).unwrap_err().to_string();
    assert!(err.contains("would write 9 files"), "{err}");
    assert!(err.contains("more than the 8"), "{err}");
}

#[tokio::test]
async fn key_extraction_checks_the_running_total_before_each_copy() {
    // One secret of 21 KB whose one value is 20 KB, and 200 keys naming it: 4 MB of copies.
    // The room is checked before each copy: the mount fails at the key that would pass.
    let big = "v".repeat(20_000);
    let content = serde_json::to_vec(&json!({ "big": big })).unwrap();
    let vault = Vault::default().with(
        "doc",
        Behaviour::Bundle {
            content,
            secret_id: "ocid1.vaultsecret.oc1..doc".into(),
            version: 1,
        },
    );
    let config = MountContext {
        max_files: 1000,
        ..crate::fakes::config()
    };
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        config,
        None,
    );
    let mut yaml = String::from("- name: doc\n  keys:\n");
    for i in 0..200 {
        yaml.push_str(&format!("  - key: big\n    fileName: f{i}\n"));
    }
    let err = service.oneshot(request(&yaml)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    // 3 670 016 / 20 000: keys[0..=182] fit, keys[183] would not.
    assert!(err.message().contains("secrets[0].keys[183]"), "{err}");
}

#[tokio::test]
async fn a_keys_entry_that_is_not_json_or_yaml_names_the_secret_and_the_keys() {
    let vault = Vault::default().with(
        "doc",
        Behaviour::Bundle {
            content: b"{ not: json: nor yaml".to_vec(),
            secret_id: "ocid1.vaultsecret.oc1..doc".into(),
            version: 1,
        },
    );
    let service = crate::fakes::mount(
        Auth::default(),
        vault,
        oci_csi_provider::NoCertificates,
        crate::fakes::config(),
        None,
    );
    let err = service
        .oneshot(request(
            "- name: doc\n  keys:\n  - key: user\n  - key: /db/password\n",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let message = err.message();
    assert!(message.contains("\"doc\""), "{message}");
    assert!(
        message.contains("[\"user\", \"/db/password\"]"),
        "{message}"
    );
}

#[tokio::test]
async fn an_auth_type_the_operator_switched_off_is_permission_denied_before_any_call() {
    let auth = Auth::default();
    let vault = Vault::default();
    let config = MountContext {
        allowed_types: vec![AuthType::Workload, AuthType::User],
        ..crate::fakes::config()
    };
    let service = crate::fakes::mount(
        auth.clone(),
        vault.clone(),
        oci_csi_provider::NoCertificates,
        config,
        None,
    );
    let mut mount = request("- name: a\n");
    mount
        .attributes
        .insert("authType".into(), "instance".into());
    let err = service.clone().oneshot(mount).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.message().contains("auth.allowed_types"), "{err}");
    assert!(err.message().contains("[workload, user]"), "{err}");
    assert_eq!(
        auth.calls.load(Ordering::SeqCst),
        0,
        "no identity was established"
    );
    assert!(vault.requests.lock().unwrap().is_empty(), "nothing fetched");
    // An allowed type mounts.
    service.oneshot(request("- name: a\n")).await.unwrap();
}

#[tokio::test]
async fn a_tenants_region_stays_in_the_principals_realm_and_in_the_operators_list() {
    let with_region = |region: &str| {
        let mut mount = request("- name: a\n");
        mount.attributes.insert("region".into(), region.into());
        mount
    };
    let mount_service = |allowed_regions: Vec<String>| {
        // The principal was established in us-ashburn-1 (realm oc1).
        let in_ashburn = Auth {
            region: Some(regions::Regions::default().resolve("iad").unwrap()),
            ..Auth::default()
        };
        crate::fakes::mount(
            in_ashburn,
            Vault::default(),
            oci_csi_provider::NoCertificates,
            MountContext {
                allowed_regions,
                ..crate::fakes::config()
            },
            None,
        )
    };
    // Another realm than the principal's: refused before any call.
    let err = mount_service(Vec::new())
        .oneshot(with_region("us-langley-1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("realm oraclegovcloud.com"), "{err}");
    // The same realm is fine without a list.
    mount_service(Vec::new())
        .oneshot(with_region("phx"))
        .await
        .unwrap();
    // With a list, only its regions (by id or short code).
    let listed = mount_service(vec!["iad".into()]);
    let err = listed
        .clone()
        .oneshot(with_region("us-phoenix-1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.message().contains("auth.allowed_regions"), "{err}");
    listed.oneshot(with_region("us-ashburn-1")).await.unwrap();
}

/// The user principal's region comes from the tenant's Secret: with `allowed_regions`, a
/// Secret naming another region (or one of another realm) is refused before any call, as
/// a class's `region` would be.
#[tokio::test]
async fn a_user_principals_own_region_passes_the_operators_list_too() {
    let user_in = |region: &str| {
        let vault = Vault::default();
        let service = crate::fakes::mount(
            Auth {
                region: Some(regions::Regions::default().resolve(region).unwrap()),
                ..Auth::default()
            },
            vault.clone(),
            oci_csi_provider::NoCertificates,
            MountContext {
                allowed_regions: vec!["us-ashburn-1".into()],
                ..crate::fakes::config()
            },
            None,
        );
        (service, vault)
    };
    let user_request = || {
        let mut mount = request("- name: a\n");
        mount.attributes.insert("authType".into(), "user".into());
        mount
            .attributes
            .insert("authSecretName".into(), "oci-config".into());
        mount
    };
    for elsewhere in ["eu-frankfurt-1", "us-langley-1"] {
        let (service, vault) = user_in(elsewhere);
        let err = service.oneshot(user_request()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        assert!(
            err.message().contains(&format!(
                "the user principal's region (auth.region of its Secret) \"{elsewhere}\" is not \
                 among the regions this provider's auth.allowed_regions lists (us-ashburn-1)"
            )),
            "{err}"
        );
        assert!(vault.requests.lock().unwrap().is_empty(), "nothing fetched");
    }
    let (service, vault) = user_in("iad");
    service.oneshot(user_request()).await.unwrap();
    assert_eq!(vault.requests.lock().unwrap().len(), 1);
    // A class's own region decides where the mount goes, and it is the one checked: the
    // Secret's Frankfurt is not contacted (same realm, listed region: mounted).
    let (service, vault) = user_in("eu-frankfurt-1");
    let mut mount = user_request();
    mount
        .attributes
        .insert("region".into(), "us-ashburn-1".into());
    service.oneshot(mount).await.unwrap();
    assert_eq!(vault.requests.lock().unwrap().len(), 1);
}
