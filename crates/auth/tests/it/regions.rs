//! Region and realm resolution (spec 2.1, appendix A).

use oci_csi_auth::region::{RegionError, Regions};

#[test]
fn short_codes_full_ids_and_realms_resolve_to_endpoints() {
    let regions = Regions::default();
    let cases = [
        // (input, secrets endpoint, federation endpoint)
        (
            "iad",
            "https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com",
            "https://auth.us-ashburn-1.oraclecloud.com",
        ),
        (
            "US-PHOENIX-1",
            "https://secrets.vaults.us-phoenix-1.oci.oraclecloud.com",
            "https://auth.us-phoenix-1.oraclecloud.com",
        ),
        (
            "ric",
            "https://secrets.vaults.us-gov-ashburn-1.oci.oraclegovcloud.com",
            "https://auth.us-gov-ashburn-1.oraclegovcloud.com",
        ),
        (
            "ltn",
            "https://secrets.vaults.uk-gov-london-1.oci.oraclegovcloud.uk",
            "https://auth.uk-gov-london-1.oraclegovcloud.uk",
        ),
        (
            "eu-frankfurt-2",
            "https://secrets.vaults.eu-frankfurt-2.oci.oraclecloud.eu",
            "https://auth.eu-frankfurt-2.oraclecloud.eu",
        ),
        (
            "us-somerset-1",
            "https://secrets.vaults.us-somerset-1.oci.oraclecloud23.com",
            "https://auth.us-somerset-1.oraclecloud23.com",
        ),
        (
            "xsp",
            "https://secrets.vaults.ap-singapore-2.oci.oraclecloud.com",
            "https://auth.ap-singapore-2.oraclecloud.com",
        ),
        (
            "mars-olympus-1",
            "https://secrets.vaults.mars-olympus-1.oci.oraclecloud.com",
            "https://auth.mars-olympus-1.oraclecloud.com",
        ),
        (
            "region.example.com",
            "https://secrets.region.example.com",
            "https://auth.region.example.com",
        ),
    ];
    for (input, secrets, federation) in cases {
        let region = regions.resolve(input).unwrap();
        assert_eq!(region.secrets_endpoint(), secrets, "{input}");
        assert_eq!(region.federation_endpoint(), federation, "{input}");
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
    assert_eq!(
        by_key.secrets_endpoint(),
        "https://secrets.vaults.xx-new-1.oci.example99.com"
    );
    assert_eq!(
        regions.resolve("yy-file-1").unwrap().federation_endpoint(),
        "https://auth.yy-file-1.example98.com"
    );
    assert_eq!(regions.resolve("ABC").unwrap().id(), "yy-file-1");
    // Unknown to everything: the default realm is the domain.
    assert_eq!(
        regions.resolve("zz-unknown-1").unwrap().secrets_endpoint(),
        "https://secrets.vaults.zz-unknown-1.oci.default.example"
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
