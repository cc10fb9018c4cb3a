//! Property tests over what the driver sends: the request's JSON fields and `grpc-timeout`
//! never panic and end in a typed result. `cargo xtask fuzz` runs them longer.

use proptest::prelude::*;
use tokio::time::Instant;

use crate::proto;
use crate::request::MountRequest;

const ATTRIBUTES: &str = r#"{"secrets":"- name: a","csi.storage.k8s.io/pod.name":"p","csi.storage.k8s.io/pod.namespace":"n","csi.storage.k8s.io/serviceAccount.tokens":"{\"\":{\"token\":\"eyJ.x.y\",\"expirationTimestamp\":\"2030-01-01T00:00:00Z\"}}"}"#;

fn mutate(sample: &str, edits: &[(prop::sample::Index, u8)]) -> String {
    let mut bytes = sample.as_bytes().to_vec();
    for (at, value) in edits {
        let i = at.index(bytes.len());
        bytes[i] = *value;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases, or PROPTEST_CASES

    #[test]
    fn fuzz_mount_requests(attributes in ".{0,200}", secrets in ".{0,100}", permission in ".{0,12}",
                           edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        for attributes in [attributes, mutate(ATTRIBUTES, &edits)] {
            let request = proto::MountRequest {
                attributes,
                secrets: secrets.clone(),
                target_path: String::new(),
                permission: permission.clone(),
                current_object_version: vec![],
            };
            if let Err(e) = MountRequest::from_proto(request, Instant::now()) {
                prop_assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
                prop_assert!(!e.to_string().contains("eyJ.x.y"), "a token in {}", e);
            }
        }
    }

    #[test]
    fn fuzz_grpc_timeouts(value in ".{0,12}", digits in "[0-9]{1,9}", unit in "[HMSmunx]") {
        let _ = crate::server::fuzz_grpc_timeout(&value);
        let _ = crate::server::fuzz_grpc_timeout(&format!("{digits}{unit}"));
    }
}

#[test]
fn the_sample_request_is_valid() {
    let request = proto::MountRequest {
        attributes: ATTRIBUTES.into(),
        secrets: "{}".into(),
        target_path: String::new(),
        permission: "420".into(),
        current_object_version: vec![],
    };
    assert!(MountRequest::from_proto(request, Instant::now()).is_ok());
}
