//! Region and realm resolution (spec 2.1, appendix A).

use oci_csi_regions::{RegionError, Regions};

#[test]
fn short_codes_full_ids_and_realms_resolve_to_ids_and_domains() {
    let regions = Regions::default();
    let cases = [
        ("iad", "us-ashburn-1", Some("oraclecloud.com")),
        ("US-PHOENIX-1", "us-phoenix-1", Some("oraclecloud.com")),
        ("ric", "us-gov-ashburn-1", Some("oraclegovcloud.com")),
        ("ltn", "uk-gov-london-1", Some("oraclegovcloud.uk")),
        ("eu-frankfurt-2", "eu-frankfurt-2", Some("oraclecloud.eu")),
        ("us-somerset-1", "us-somerset-1", Some("oraclecloud23.com")),
        ("xsp", "ap-singapore-2", Some("oraclecloud.com")),
        // Unknown, without a default realm: the commercial realm, as the SDK does.
        ("mars-olympus-1", "mars-olympus-1", Some("oraclecloud.com")),
        // Dotted: itself a domain.
        ("region.example.com", "region.example.com", None),
    ];
    for (input, id, domain) in cases {
        let region = regions.resolve(input).unwrap();
        assert_eq!((region.id(), region.domain()), (id, domain), "{input}");
        assert_eq!(region.to_string(), id);
    }
}

#[test]
fn empty_or_spaced_regions_are_rejected() {
    for input in ["", " iad", "us ashburn-1", "iad\n", "\t"] {
        let error = Regions::default().resolve(input).unwrap_err();
        assert!(matches!(error, RegionError::Invalid(_)), "{input:?}");
        assert!(
            error
                .to_string()
                .starts_with("region can not be empty or have spaces")
        );
    }
}

#[test]
fn region_metadata_config_file_and_default_realm_describe_unknown_regions() {
    let metadata = r#"{"realmKey":"OC99","realmDomainComponent":"example99.com","regionKey":"XYZ","regionIdentifier":"xx-new-1"}"#;
    let file = br#"[{"realmKey":"oc98","realmDomainComponent":"example98.com","regionKey":"abc","regionIdentifier":"yy-file-1"}]"#;
    let path = std::path::Path::new("regions-config.json");
    let regions =
        Regions::new(Some(metadata), Some((path, file)), Some("default.example")).unwrap();
    let by_key = regions.resolve("xyz").unwrap();
    assert_eq!(by_key.id(), "xx-new-1");
    assert_eq!(by_key.domain(), Some("example99.com"));
    assert_eq!(
        regions.resolve("yy-file-1").unwrap().domain(),
        Some("example98.com")
    );
    assert_eq!(regions.resolve("ABC").unwrap().id(), "yy-file-1");
    // Unknown to everything: the default realm is the domain.
    assert_eq!(
        regions.resolve("zz-unknown-1").unwrap().domain(),
        Some("default.example")
    );
    // The built-in table wins over metadata.
    assert_eq!(
        regions.resolve("iad").unwrap().domain(),
        Some("oraclecloud.com")
    );
}

#[test]
fn malformed_region_metadata_is_an_error() {
    let missing = r#"{"realmKey":"oc1","regionKey":"x","regionIdentifier":"x-1"}"#;
    assert!(matches!(
        Regions::new(Some(missing), None, None),
        Err(RegionError::Metadata(_))
    ));
    let empty =
        r#"{"realmKey":"","realmDomainComponent":"d","regionKey":"x","regionIdentifier":"x-1"}"#;
    assert!(Regions::new(Some(empty), None, None).is_err());
    let path = std::path::Path::new("regions-config.json");
    let error = Regions::new(None, Some((path, b"{}")), None).unwrap_err();
    assert!(matches!(error, RegionError::ConfigFile { .. }));
    // A configured but absent file is ignored, as by the SDK.
    let absent = std::path::Path::new("/nonexistent/regions-config.json");
    assert!(Regions::from_files(None, Some(absent), None).is_ok());
}

#[test]
fn a_tenants_region_must_be_one_the_provider_knows() {
    let metadata = r#"{"realmKey":"OC99","realmDomainComponent":"example99.com","regionKey":"XYZ","regionIdentifier":"xx-new-1"}"#;
    let file = br#"[{"realmKey":"oc98","realmDomainComponent":"example98.com","regionKey":"abc","regionIdentifier":"yy-file-1"}]"#;
    let path = std::path::Path::new("regions-config.json");
    let regions =
        Regions::new(Some(metadata), Some((path, file)), Some("default.example")).unwrap();
    for (known, id) in [
        ("iad", "us-ashburn-1"),
        ("US-Ashburn-1", "us-ashburn-1"),
        ("XYZ", "xx-new-1"),
        ("yy-file-1", "yy-file-1"),
    ] {
        assert_eq!(regions.resolve_known(known).unwrap().id(), id, "{known}");
    }
    for hostile in [
        "a@127.0.0.1:9",
        "secrets.example.com",
        "us-ashburn-1.evil.example",
        "127.0.0.1",
        "iad:443",
        "zz-unknown-1",
        "iad/x",
    ] {
        let err = regions.resolve_known(hostile).unwrap_err();
        assert!(matches!(err, RegionError::Unknown(_)), "{hostile}: {err}");
        assert!(err.to_string().contains("OCI_REGION_METADATA"), "{err}");
    }
    // A long value is quoted only in part.
    let long = "x".repeat(10_000);
    assert!(regions.resolve_known(&long).unwrap_err().to_string().len() < 600);
}
