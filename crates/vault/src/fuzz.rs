//! Property tests over the parsers of upstream input in this crate: SecretBundle bodies and
//! `Retry-After`-driven delays never panic and end in a typed result. `cargo xtask fuzz`
//! runs them longer (`PROPTEST_CASES`).

use std::time::Duration;

use proptest::prelude::*;

use crate::RetryPolicy;
use crate::bundle;

const SAMPLE: &str = r#"{"secretId":"ocid1.vaultsecret.oc1..a","versionNumber":3,"versionName":"v3","stages":["CURRENT","LATEST"],"timeCreated":"2026-01-01T00:00:00Z","secretBundleContent":{"contentType":"BASE64","content":"c2VjcmV0"}}"#;

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases, or PROPTEST_CASES

    #[test]
    fn fuzz_secret_bundles(body in proptest::collection::vec(any::<u8>(), 0..400),
                           edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..10)) {
        let _ = bundle::parse(&body, None);
        let mut mutated = SAMPLE.as_bytes().to_vec();
        for (at, value) in edits {
            let i = at.index(mutated.len());
            mutated[i] = value;
        }
        if let Err(e) = bundle::parse(&mutated, Some("rid".into())) {
            // The message never quotes the body (it may hold the secret).
            prop_assert!(!e.to_string().contains("c2VjcmV0"));
        }
    }

    #[test]
    fn fuzz_retry_delays(failed in any::<u32>(), retry_after in any::<u64>(), random in any::<f64>()) {
        let policy = RetryPolicy::default();
        let delay = policy.delay(failed, Some(Duration::from_secs(retry_after)), random);
        prop_assert!(delay >= Duration::from_secs(retry_after));
        let _ = policy.delay(failed, None, random);
    }
}

#[test]
fn the_sample_bundle_is_valid() {
    assert!(bundle::parse(SAMPLE.as_bytes(), None).is_ok());
}
