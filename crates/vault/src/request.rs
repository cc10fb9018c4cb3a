//! What to fetch: the secret, the version selector, and the exact request OCI expects
//! (spec 2.2 and 2.4).

use std::fmt;
use std::str::FromStr;

use auth::Identity;
use tokio::time::Instant;

use crate::Backoff;

/// The API version prefix of every Secrets path.
const API_PREFIX: &str = "/20190301/secretbundles";

/// A secret version stage (spec 2.2), upper-case on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// The version in use.
    Current,
    /// A version waiting to become current.
    Pending,
    /// The most recently created version.
    Latest,
    /// The version that was current before the current one.
    Previous,
    /// An older version.
    Deprecated,
}

impl Stage {
    /// Every stage, in the order OCI documents them.
    pub const ALL: [Stage; 5] = [
        Stage::Current,
        Stage::Pending,
        Stage::Latest,
        Stage::Previous,
        Stage::Deprecated,
    ];

    /// The wire spelling: `CURRENT`, `PENDING`, `LATEST`, `PREVIOUS`, `DEPRECATED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Current => "CURRENT",
            Stage::Pending => "PENDING",
            Stage::Latest => "LATEST",
            Stage::Previous => "PREVIOUS",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of the five stages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown stage {0:?}: expected one of CURRENT, PENDING, LATEST, PREVIOUS, DEPRECATED")]
pub struct UnknownStage(pub String);

impl FromStr for Stage {
    type Err = UnknownStage;

    /// Parses the exact upper-case wire spelling, as the Go provider compares stages
    /// exactly (spec 2.3).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Stage::ALL
            .into_iter()
            .find(|stage| stage.as_str() == s)
            .ok_or_else(|| UnknownStage(s.to_owned()))
    }
}

/// Which version of a secret to fetch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Selector {
    /// The version that holds this stage (the Go provider's default is `CURRENT`).
    Stage(Stage),
    /// A version number (OCI numbers versions from 1).
    VersionNumber(u64),
    /// A version name.
    VersionName(String),
}

impl Default for Selector {
    fn default() -> Self {
        Selector::Stage(Stage::Current)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Stage(stage) => write!(f, "stage {stage}"),
            Selector::VersionNumber(n) => write!(f, "version {n}"),
            Selector::VersionName(name) => write!(f, "version name {name:?}"),
        }
    }
}

/// Which secret to fetch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SecretRef {
    /// By name within a vault (GetSecretBundleByName, what the Go provider uses).
    ByName {
        /// The vault OCID.
        vault_id: String,
        /// The secret name, sent as given (not trimmed).
        name: String,
    },
    /// By secret OCID (GetSecretBundle).
    ById {
        /// The secret OCID.
        secret_id: String,
    },
}

/// One secret bundle to fetch, as whom, from where, and by when.
#[derive(Clone, Debug)]
pub struct SecretRequest {
    /// The Secrets endpoint without a trailing slash, e.g.
    /// `https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com` or the emulator's
    /// `https://127.0.0.1:PORT`.
    pub base_url: String,
    /// The established credential the request is made with: the signing layer signs with
    /// its key, and a cached answer is only ever served to the same
    /// [`auth::Session::credential`] (the session itself is not part of the cache key).
    pub session: auth::Session,
    /// The secret.
    pub secret: SecretRef,
    /// The version.
    pub selector: Selector,
    /// Every attempt and every sleep between attempts ends by then.
    pub deadline: Instant,
    /// Told of the sleeps between attempts ([`Backoff::none`]: nobody is).
    pub backoff: Backoff,
}

impl SecretRequest {
    /// Who the request is made as.
    pub fn identity(&self) -> Identity {
        self.session.identity()
    }

    /// How errors name the secret: the name and vault, or the OCID, and the selector.
    pub(crate) fn describe(&self) -> String {
        match &self.secret {
            SecretRef::ByName { vault_id, name } => {
                format!("secret {name:?} ({}) in vault {vault_id}", self.selector)
            }
            SecretRef::ById { secret_id } => format!("secret {secret_id} ({})", self.selector),
        }
    }

    /// The HTTP method and the absolute URI of the call, per spec 2.2 and 2.4: query keys
    /// in sorted order and form-encoded, as the Go SDK sends them (the signature covers
    /// the query exactly as written).
    pub(crate) fn method_and_uri(&self) -> (http::Method, String) {
        let base = self.base_url.trim_end_matches('/');
        // Keys are appended in sorted order: secretName, secretVersionName, stage,
        // vaultId, versionNumber.
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let (method, path) = match &self.secret {
            SecretRef::ByName { vault_id, name } => {
                query.append_pair("secretName", name);
                self.append_selector_before_vault(&mut query);
                query.append_pair("vaultId", vault_id);
                self.append_version_number(&mut query);
                (
                    http::Method::POST,
                    format!("{API_PREFIX}/actions/getByName"),
                )
            }
            SecretRef::ById { secret_id } => {
                self.append_selector_before_vault(&mut query);
                self.append_version_number(&mut query);
                (
                    http::Method::GET,
                    format!("{API_PREFIX}/{}", encode_path_segment(secret_id)),
                )
            }
        };
        let query = query.finish();
        let uri = if query.is_empty() {
            format!("{base}{path}")
        } else {
            format!("{base}{path}?{query}")
        };
        (method, uri)
    }

    fn append_selector_before_vault(
        &self,
        query: &mut url::form_urlencoded::Serializer<'_, String>,
    ) {
        match &self.selector {
            Selector::VersionName(name) => {
                query.append_pair("secretVersionName", name);
            }
            Selector::Stage(stage) => {
                query.append_pair("stage", stage.as_str());
            }
            Selector::VersionNumber(_) => {}
        }
    }

    fn append_version_number(&self, query: &mut url::form_urlencoded::Serializer<'_, String>) {
        if let Selector::VersionNumber(n) = self.selector {
            query.append_pair("versionNumber", &n.to_string());
        }
    }
}

/// Percent-encodes a path segment like Go's `url.PathEscape`, so an OCID (or anything a
/// user typed) cannot change the path.
pub(crate) fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(secret: SecretRef, selector: Selector) -> SecretRequest {
        SecretRequest {
            base_url: "https://secrets.example.com/".into(),
            session: auth::Session::for_tests(auth::Credential::Instance {
                tenancy: "ocid1.tenancy.oc1..t".into(),
                instance: "ocid1.instance.oc1..i".into(),
            }),
            secret,
            selector,
            deadline: Instant::now(),
            backoff: Backoff::none(),
        }
    }

    fn by_name(name: &str) -> SecretRef {
        SecretRef::ByName {
            vault_id: "ocid1.vault.oc1.iad.xyz".into(),
            name: name.into(),
        }
    }

    #[test]
    fn by_name_matches_the_go_sdk_request_line() {
        let (method, uri) =
            request(by_name("db-password"), Selector::Stage(Stage::Current)).method_and_uri();
        assert_eq!(method, http::Method::POST);
        assert_eq!(
            uri,
            "https://secrets.example.com/20190301/secretbundles/actions/getByName\
             ?secretName=db-password&stage=CURRENT&vaultId=ocid1.vault.oc1.iad.xyz"
        );
    }

    #[test]
    fn by_name_query_keys_are_sorted_and_form_encoded() {
        let (_, uri) = request(by_name("a b/c"), Selector::VersionNumber(7)).method_and_uri();
        assert!(
            uri.ends_with("?secretName=a+b%2Fc&vaultId=ocid1.vault.oc1.iad.xyz&versionNumber=7"),
            "{uri}"
        );
        let (_, uri) = request(by_name("n"), Selector::VersionName("v&1".into())).method_and_uri();
        assert!(
            uri.ends_with("?secretName=n&secretVersionName=v%261&vaultId=ocid1.vault.oc1.iad.xyz"),
            "{uri}"
        );
    }

    #[test]
    fn by_id_is_a_get_with_an_escaped_path_segment() {
        let id = SecretRef::ById {
            secret_id: "ocid1.vaultsecret.oc1..a/b?c".into(),
        };
        let (method, uri) = request(id.clone(), Selector::Stage(Stage::Previous)).method_and_uri();
        assert_eq!(method, http::Method::GET);
        assert_eq!(
            uri,
            "https://secrets.example.com/20190301/secretbundles/ocid1.vaultsecret.oc1..a%2Fb%3Fc?stage=PREVIOUS"
        );
        let (_, uri) = request(id, Selector::VersionNumber(3)).method_and_uri();
        assert!(uri.ends_with("a%2Fb%3Fc?versionNumber=3"), "{uri}");
    }

    #[test]
    fn stages_parse_only_in_their_exact_spelling() {
        for stage in Stage::ALL {
            assert_eq!(stage.as_str().parse::<Stage>(), Ok(stage));
        }
        assert!("current".parse::<Stage>().is_err());
        assert!("".parse::<Stage>().is_err());
    }
}
