//! What one mount, and all mounts in flight, may hold in memory.

use std::sync::atomic::Ordering;

use csi_grpc::{ErrorKind, MountError};
use oci_csi_provider::{ByteBudget, MountContext, MountParameters};
use tower::ServiceExt;

use crate::fakes::{Auth, Behaviour, Vault};
use crate::fanout::request;

fn big(content_len: usize) -> Behaviour {
    Behaviour::Bundle {
        content: vec![b'x'; content_len],
        secret_id: "ocid1.vaultsecret.oc1..big".into(),
        version: 1,
    }
}

#[tokio::test]
async fn the_size_limit_fails_the_mount_as_soon_as_it_is_passed_and_cancels_the_rest() {
    // Two secrets of 2 MiB pass the 3.5 MiB limit; a third never answers. The mount must
    // not wait for it (it used to, holding both bundles, until its deadline).
    let vault = Vault::default()
        .with("a", big(2 << 20))
        .with("b", big(2 << 20))
        .with("slow", Behaviour::Hang);
    let service = crate::fakes::mount(
        Auth::default(),
        vault.clone(),
        oci_csi_provider::NoCertificates,
        crate::fakes::config(),
        None,
    );
    let err = service
        .oneshot(request("- name: a\n- name: b\n- name: slow\n"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    let message = err.message();
    assert!(message.contains("more than 3670016 bytes"), "{message}");
    assert!(
        message.contains("secrets[0] a (2097152 bytes)"),
        "{message}"
    );
    assert!(
        message.contains("secrets[1] b (2097152 bytes)"),
        "{message}"
    );
    assert_eq!(
        vault.in_flight.load(Ordering::SeqCst),
        0,
        "the hanging fetch was dropped"
    );
    assert_eq!(vault.dropped_unfinished.load(Ordering::SeqCst), 1);
}

#[test]
fn a_list_longer_than_the_cap_is_refused_without_building_it() {
    let pod = csi_grpc::Pod {
        namespace: Some("app".into()),
        name: Some("web-0".into()),
        uid: Some("uid".into()),
        service_account: Some("web".into()),
    };
    // 15,000 entries (within the parameter's 256 KiB); the 257th has a field no entry may
    // have. Were it parsed as an entry, the error would name the field: it names the count,
    // so the parser stopped at 256.
    let mut yaml = String::new();
    for i in 0..15_000 {
        if i == 256 {
            yaml.push_str("- notAField: 1\n");
        } else {
            yaml.push_str(&format!("- name: s{i}\n"));
        }
    }
    let attributes = [
        ("secrets".to_owned(), yaml),
        ("vaultId".to_owned(), "ocid1.vault.oc1..v".to_owned()),
        ("authType".to_owned(), "instance".to_owned()),
    ]
    .into_iter()
    .collect();
    let err = MountParameters::parse(&attributes, &pod).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("more than 256 entries"), "{message}");
    assert!(
        message.contains("server.max_secrets_per_mount"),
        "{message}"
    );
    assert!(!message.contains("notAField"), "{message}");
    assert_eq!(MountError::from(err).kind(), ErrorKind::InvalidArgument);
    // Exactly the cap is fine, and the cap is configurable.
    let mut yaml = String::new();
    for i in 0..256 {
        yaml.push_str(&format!("- name: s{i}\n"));
    }
    let mut attributes = attributes;
    attributes.insert("secrets".into(), yaml);
    assert_eq!(
        MountParameters::parse(&attributes, &pod)
            .unwrap()
            .secrets()
            .len(),
        256
    );
    let err = MountParameters::parse_limited(&attributes, &pod, 10).unwrap_err();
    assert!(err.to_string().contains("more than 10 entries"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_mounts_in_flight_stay_within_the_byte_budget() {
    // 300 mounts at once, each of two 100 KB secrets; each fetch reserves 256 KiB. A budget
    // of 8 MiB holds 32 fetches: the high-water mark never passes it, only the mounts that
    // found it full get ResourceExhausted (naming the budget), the others mount.
    let vault = Vault::default()
        .with("a", big(100_000))
        .with("b", big(100_000));
    let budget = ByteBudget::new(8 << 20);
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
    let mounts: Vec<_> = (0..300)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { service.oneshot(request("- name: a\n- name: b\n")).await })
        })
        .collect();
    let (mut mounted, mut refused) = (0, 0);
    for mount in mounts {
        match mount.await.unwrap() {
            Ok(response) => {
                assert_eq!(response.files.len(), 2);
                mounted += 1;
            }
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
                assert!(
                    err.message().contains("server.max_in_flight_bytes"),
                    "{err}"
                );
                refused += 1;
            }
        }
    }
    assert!(budget.high_water() <= budget.capacity(), "{budget:?}");
    assert!(
        budget.high_water() > budget.capacity() / 2,
        "the budget was used: {budget:?}"
    );
    assert!(refused > 0, "some mounts found the budget full");
    // 32 fetches of two per mount fit at once: at least 16 mounts got through.
    assert!(mounted >= 16, "{mounted} mounted");
    assert_eq!(mounted + refused, 300);
    assert_eq!(budget.used(), 0, "everything given back");
    // And with the budget back, the driver's retry mounts.
    let response = service
        .oneshot(request("- name: a\n- name: b\n"))
        .await
        .unwrap();
    assert_eq!(response.files.len(), 2);
}

#[tokio::test]
async fn what_a_fetch_did_not_use_goes_back_to_the_budget_at_once() {
    let vault = Vault::default().with("a", big(1000));
    let budget = ByteBudget::new(1 << 20);
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
    let response = service.oneshot(request("- name: a\n")).await.unwrap();
    assert_eq!(response.files[0].contents.len(), 1000);
    assert_eq!(budget.used(), 0);
    assert_eq!(budget.high_water(), 256 * 1024);
}

#[tokio::test]
async fn files_past_the_limit_fail_the_mount_even_when_the_fetched_bytes_fit() {
    // 2.5 MiB of JSON fetched (within 3.5 MiB), written whole and again as its one key's
    // 1.5 MiB value: 4 MiB of files, more than one response may carry.
    let value = "v".repeat(1536 * 1024);
    let padding = "p".repeat(1024 * 1024);
    let json = format!(r#"{{"big": "{value}", "padding": "{padding}"}}"#);
    let vault = Vault::default().with(
        "doc",
        Behaviour::Bundle {
            content: json.into_bytes(),
            secret_id: "ocid1.vaultsecret.oc1..doc".into(),
            version: 1,
        },
    );
    let err = crate::fakes::mount_service(vault)
        .oneshot(request(
            "- name: doc\n  fileName: doc.json\n  keys:\n    - key: big\n",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    let message = err.message();
    assert!(
        message.contains("the files of this mount take"),
        "{message}"
    );
    assert!(message.contains("more than the 3670016 bytes"), "{message}");
    // The largest file first, each named with its size; never a value.
    assert!(
        message.contains("doc.json (") && message.contains("big (1572864 bytes)"),
        "{message}"
    );
    assert!(!message.contains("vvvv"), "{message}");
}

/// What parsing a class and a secret read for keys may allocate is reserved from the same
/// byte budget as the fetches, in the mount's namespace share, while the parse runs.
#[tokio::test]
async fn parses_of_parameters_and_of_keys_reserve_from_the_byte_budget() {
    let budget = ByteBudget::new(crate::fakes::RESERVE + 16 * 1024);
    // A 1 KB document, and an 8 KB one whose parse would reserve 48 x 8 KB.
    let document = |len: usize| Behaviour::Bundle {
        content: format!("{{\"a\": \"{}\"}}", "x".repeat(len)).into_bytes(),
        secret_id: "ocid1.vaultsecret.oc1..doc".into(),
        version: 1,
    };
    let vault = Vault::default()
        .with("doc", document(1024))
        .with("big", document(8 * 1024));
    let service = crate::fakes::mount(
        Auth::default(),
        vault.clone(),
        oci_csi_provider::NoCertificates,
        MountContext {
            byte_budget: Some(budget.clone()),
            ..crate::fakes::config()
        },
        Some(budget.clone()),
    );
    // A class of ~80 KB reserves four times that to be parsed: more than the budget.
    let long_list: String = (0..100)
        .map(|i| format!("- name: s{i:03}\n  fileName: {}\n", "f".repeat(800)))
        .collect();
    let err = service
        .clone()
        .oneshot(request(&long_list))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(
        err.message()
            .starts_with("reading the SecretProviderClass parameters: the provider is holding"),
        "{err}"
    );
    assert!(vault.requests.lock().unwrap().is_empty(), "nothing fetched");
    assert_eq!(budget.used(), 0, "the reservation is given back");
    // The 8 KB document fetched, its parse for keys does not fit what is left.
    let err = service
        .clone()
        .oneshot(request("- name: big\n  keys: [{key: a}]\n"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(
        err.message()
            .starts_with("secrets[0]: reading its keys: the provider is holding"),
        "{err}"
    );
    assert_eq!(budget.used(), 0);
    // The 1 KB one mounts.
    let response = service
        .oneshot(request("- name: doc\n  keys: [{key: a}]\n"))
        .await
        .unwrap();
    assert_eq!(response.files.len(), 1);
    assert_eq!(budget.used(), 0);
}
