//! The mount service against a `tower-test` mock of the identity service: what it asks,
//! and that it waits for the answer before fetching.

use std::sync::atomic::Ordering;

use oci_csi_provider::MountContext;
use tower::ServiceExt;

use crate::fakes::Vault;
use crate::fanout::request;

/// The mount service over `identity`, reading from `vault` at the mock endpoints.
fn mount_service<I: oci_csi_provider::IdentityService>(
    identity: I,
    vault: Vault,
) -> crate::fakes::Mount<I, Vault> {
    let endpoints = crate::fakes::endpoints("https://secrets.mock", "https://certificates.mock");
    crate::fakes::mount(
        identity,
        vault,
        oci_csi_provider::NoCertificates,
        MountContext {
            endpoints: std::sync::Arc::new(endpoints),
            ..MountContext::default()
        },
        None,
    )
}

#[tokio::test]
async fn a_mount_asks_the_identity_service_once_and_fetches_as_the_identity_it_answers() {
    let (mock, mut handle) = tower_test::mock::pair::<auth::IdentityRequest, auth::Established>();
    let identity = mock.map_err(|_| auth::AuthError::Internal("the mock failed"));
    let vault = Vault::default();
    let service = mount_service(identity, vault.clone());
    let mount = tokio::spawn(service.oneshot(request("- name: a\n- name: b\n")));

    let (asked, answer) = handle.next_request().await.expect("one identity request");
    assert_eq!(asked.kind, auth::PrincipalKind::Workload);
    assert_eq!(asked.namespace.as_deref(), Some("app"));
    assert_eq!(asked.service_account.as_deref(), Some("web"));
    assert_eq!(asked.pod_name.as_deref(), Some("web-0"));
    assert!(
        vault.requests.lock().unwrap().is_empty(),
        "nothing fetched before the identity"
    );
    let credential = auth::Credential::Workload {
        namespace: "app".into(),
        service_account: "web".into(),
        service_account_uid: Some("uid-1".into()),
    };
    let identity = credential.identity();
    answer.send_response(auth::Established {
        region: None,
        session: auth::Session::for_tests(credential.clone()),
    });

    let response = mount.await.unwrap().unwrap();
    assert_eq!(response.files.len(), 2);
    let requests = vault.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.identity(), identity, "fetched as the answered identity");
        assert_eq!(r.session.credential(), &credential);
        assert_eq!(r.base_url, "https://secrets.mock");
    }
    assert_eq!(vault.in_flight.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_identity_failure_fails_the_mount_before_any_fetch() {
    let (mock, mut handle) = tower_test::mock::pair::<auth::IdentityRequest, auth::Established>();
    let identity = mock.map_err(|_| auth::AuthError::MissingRequestField("namespace"));
    let vault = Vault::default();
    let service = mount_service(identity, vault.clone());
    let mount = tokio::spawn(service.oneshot(request("- name: a\n")));
    let (_, answer) = handle.next_request().await.unwrap();
    answer.send_error(std::io::Error::other("refused"));
    let err = mount.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), csi_grpc::ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.message().contains("the mount request has no namespace"),
        "{err}"
    );
    assert!(vault.requests.lock().unwrap().is_empty());
}
