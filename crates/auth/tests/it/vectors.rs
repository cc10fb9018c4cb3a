//! The worked examples of spec section 1.5, byte for byte.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use oci_csi_auth::signature::{EMPTY_BODY_SHA256, SignatureProfile, sign_request, signing_string};
use oci_csi_auth::{Identity, KeyId, PrivateKey, SigningKey};

use crate::{SPEC_KEY, spec_date};

const TENANCY: &str = "ocid1.tenancy.oc1..aaaaaaaaexampletenancy";
const USER: &str = "ocid1.user.oc1..aaaaaaaaexampleuser";
const SPEC_FINGERPRINT: &str = "52:27:47:a7:f2:d3:5f:7f:1b:56:30:21:2a:7a:ef:8f";

const SIGNATURE_A: &str = "LU/yXy5gPkMHJl8REjEvusyWmVgp2UL3mjbXQaGcci/67sTNaatNuN2s17pcTEGYUguFAC7tfK+g51b9TdgGYyPpH+ft+FuPblJhcqYx0Wct8ZaYUOQivG60ava0p5OSrv7Vn2D1jeN7z4pn96XeWAdT6PkLI0Mlap6v8L+DkJECxXtA0iEqyAS/Z2tqHutx1bSqqpwGpuX0yRmx9G+YmWfTRxhgoDVTnSIdYtaif6G8juByzp4NGr+NVA4v5gWll/4B+1JjzLkExUEP/9Z6M+4bTLZsW1gMAjJUiQWXnsSSEOE68wZNq0UEk5mxIkBVsrt8d2h2CWajk3Bt3NIG3Q==";
const SIGNATURE_B: &str = "zTorEtpO99Jd90pNDOknHUf9iYkrdkkg72+5NWLGGdNbfZeoFw/oFoOpVXYzfW5ni73VrBM26lWvw2qQB+erOZRNzvCOWim/zgFQ19JU/aH7jmO1Gafm0suUHFTcy0e8zj/80X61jgRaTtiaXZhjc39ltfmTJZYzybNuLLhcmIZvr5bwQDZESOfIwhuIDz31XeHbC/oEZXAxa3WP3IhTZWn2rfVo9IcV+ifv+gjJx7zVdcEAmphzEHL7hxzpl+w/2ImduiPHWHMOIJUxsDYidbgU5c3LdkHK+zZ+YEldnbEi0wA3RQ28RxUY0oFayyMLRASXO+erryRfT1AhHuso5Q==";
const SIGNATURE_C: &str = "x/qB+doxzKyYhFMFSaQActjPLiEEX5uqgi6UAyZW7n7O7sZA/Xs4M3VCbKnSD9Y1aWqddFj9Mbq0Awyp9+DZVjoIDfmTu1E+Xl8uqwRzqXV3Z6FH+shqRliBO7Os/98MU8S7cU9XyRcC0a9y3zHfCEDMjDXy9hBskZy/sMPjBE2ZUV9V9LWr02RvCcmVPnWqjNvsSK+nCqSXqCiNCCg6OElM3k8dODEJrNuiITDWNsoBFUynjOm/onNKpSWMJsFOfKRArVJvQqLw5f3jUpYv+Sycdq6kcuJDW8bmzL1uxekpuGZrwT2nMPNb0M3+M5sjPtcsMWu17bimTRfsGJwUDw==";

fn spec_key() -> Arc<PrivateKey> {
    Arc::new(PrivateKey::from_pem(SPEC_KEY.as_bytes(), None).unwrap())
}

fn user_key_id() -> KeyId {
    KeyId::new(format!("{TENANCY}/{USER}/{SPEC_FINGERPRINT}"))
}

fn user_identity() -> Identity {
    Identity::User {
        namespace: "ns".into(),
        secret_name: "oci-config".into(),
    }
}

fn signature_of(request: &Request<Bytes>) -> String {
    let header = request.headers()["authorization"].to_str().unwrap();
    let start = header.find("signature=\"").unwrap() + "signature=\"".len();
    header[start..header.len() - 1].to_owned()
}

#[test]
fn spec_key_fingerprint_matches_spec() {
    assert_eq!(spec_key().fingerprint(), SPEC_FINGERPRINT);
}

#[test]
fn vector_a_post_with_empty_body_matches_spec_byte_for_byte() {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com/20190301/secretbundles/actions/getByName?secretName=db-password&stage=CURRENT&vaultId=ocid1.vault.oc1.iad.exampleuniqueid")
        .body(Bytes::new())
        .unwrap();
    let key = SigningKey::new(user_key_id(), spec_key());
    sign_request(
        &mut request,
        &user_identity(),
        &key,
        spec_date(),
        SignatureProfile::Standard,
    )
    .unwrap();

    let expected = "date: Thu, 05 Jan 2023 21:31:40 GMT
(request-target): post /20190301/secretbundles/actions/getByName?secretName=db-password&stage=CURRENT&vaultId=ocid1.vault.oc1.iad.exampleuniqueid
host: secrets.vaults.us-ashburn-1.oci.oraclecloud.com
content-length: 0
content-type: application/json
x-content-sha256: 47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";
    let to_sign = signing_string(&request, SignatureProfile::Standard).unwrap();
    assert_eq!(String::from_utf8_lossy(to_sign.as_bytes()), expected);
    assert_eq!(signature_of(&request), SIGNATURE_A);
    assert_eq!(
        request.headers()["authorization"],
        format!(
            "Signature version=\"1\",headers=\"date (request-target) host content-length content-type x-content-sha256\",keyId=\"{TENANCY}/{USER}/{SPEC_FINGERPRINT}\",algorithm=\"rsa-sha256\",signature=\"{SIGNATURE_A}\""
        )
    );
    // The headers the signature covers are really on the request.
    let headers = request.headers();
    assert_eq!(headers["date"], "Thu, 05 Jan 2023 21:31:40 GMT");
    assert_eq!(headers["content-length"], "0");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-content-sha256"], EMPTY_BODY_SHA256);
}

#[test]
fn vector_b_get_matches_spec_byte_for_byte() {
    let mut request = Request::builder()
        .method(Method::GET)
        .uri("https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com/20190301/secretbundles/ocid1.vaultsecret.oc1.iad.exampleuniqueid?versionNumber=3")
        .body(Bytes::new())
        .unwrap();
    let key = SigningKey::new(user_key_id(), spec_key());
    sign_request(
        &mut request,
        &user_identity(),
        &key,
        spec_date(),
        SignatureProfile::Standard,
    )
    .unwrap();

    let expected = "date: Thu, 05 Jan 2023 21:31:40 GMT
(request-target): get /20190301/secretbundles/ocid1.vaultsecret.oc1.iad.exampleuniqueid?versionNumber=3
host: secrets.vaults.us-ashburn-1.oci.oraclecloud.com";
    let to_sign = signing_string(&request, SignatureProfile::Standard).unwrap();
    assert_eq!(String::from_utf8_lossy(to_sign.as_bytes()), expected);
    assert_eq!(to_sign.headers(), "date (request-target) host");
    assert_eq!(signature_of(&request), SIGNATURE_B);
    // A GET signs no body headers, so none are added.
    assert!(request.headers().get("x-content-sha256").is_none());
    assert!(request.headers().get("content-length").is_none());
}

#[test]
fn vector_c_federation_post_omits_host_and_matches_spec() {
    let body = r#"{"certificate":"MIIBfakeLeaf","intermediateCertificates":["MIIBfakeInter"],"publicKey":"MIIBfakeSessionKey"}"#;
    assert_eq!(body.len(), 108);
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("https://auth.us-ashburn-1.oraclecloud.com/v1/x509")
        .header("content-type", "application/json")
        .body(Bytes::from_static(body.as_bytes()))
        .unwrap();
    let key = SigningKey::new(KeyId::new(format!("{TENANCY}/fed-x509/00:11")), spec_key());
    sign_request(
        &mut request,
        &Identity::Instance,
        &key,
        spec_date(),
        SignatureProfile::Federation,
    )
    .unwrap();

    let expected = "date: Thu, 05 Jan 2023 21:31:40 GMT
(request-target): post /v1/x509
content-length: 108
content-type: application/json
x-content-sha256: H+jMIU+gJEmpsyffok2p0+Xb9T5qemRCa7fn+IliMM4=";
    let to_sign = signing_string(&request, SignatureProfile::Federation).unwrap();
    assert_eq!(String::from_utf8_lossy(to_sign.as_bytes()), expected);
    assert_eq!(
        to_sign.headers(),
        "date (request-target) content-length content-type x-content-sha256"
    );
    assert_eq!(signature_of(&request), SIGNATURE_C);
}

#[test]
fn signing_string_keeps_the_escaped_target_and_a_non_default_port() {
    let request = Request::builder()
        .method(Method::DELETE)
        .uri("https://127.0.0.1:8443/a%2Fb?x=1+2")
        .header("date", "Thu, 05 Jan 2023 21:31:40 GMT")
        .body(Bytes::new())
        .unwrap();
    let to_sign = signing_string(&request, SignatureProfile::Standard).unwrap();
    assert_eq!(
        String::from_utf8_lossy(to_sign.as_bytes()),
        "date: Thu, 05 Jan 2023 21:31:40 GMT\n(request-target): delete /a%2Fb?x=1+2\nhost: 127.0.0.1:8443"
    );
}
