//! Listings: the versions of a secret (the Secrets API's ListSecretBundleVersions) and the
//! active secrets of a vault (the Vault API's ListSecrets), one page per [`PageRequest`],
//! sent exactly as the SDKs send them (the Go SDK's `secrets` and `vault` packages: query
//! keys in sorted order, the page token of `opc-next-page` as `page`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use auth::Identity;
use serde::Deserialize;
use tokio::time::Instant;

use crate::Backoff;
use crate::bundle::{MalformedBundle, from_json};
use crate::request::encode_path_segment;

/// Versions asked of one page: the versions wanted and one more, so that a `PENDING`
/// version above the current one still leaves a whole history on the first page.
const VERSIONS_SLACK: usize = 1;

/// Secrets asked of one ListSecrets page. A summary with its tags is about 2 KB, so a page
/// stays well under the client's body limit (`upstream.max_bundle_bytes`, 256 KiB).
pub const SECRETS_PAGE_LIMIT: usize = 50;

/// Pages of one listing at most: 10,000 secrets of a vault (or 200 pages of versions).
pub const MAX_PAGES: u32 = 200;

/// A freeform tag a secret must carry: `key=value`, or `key` with any value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TagFilter {
    /// The tag's key, compared exactly.
    pub key: String,
    /// Its value, compared exactly; `None`: any value.
    pub value: Option<String>,
}

/// Which secrets of a vault a selection takes: every filter given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SecretFilter {
    /// A freeform tag.
    pub tag: Option<TagFilter>,
    /// The start of the secret's name.
    pub name_prefix: Option<String>,
}

impl SecretFilter {
    /// Whether a secret of `name` with these freeform tags is selected.
    pub fn matches(&self, name: &str, tags: &BTreeMap<String, String>) -> bool {
        let tagged = self.tag.as_ref().is_none_or(|t| match tags.get(&t.key) {
            Some(value) => t.value.as_ref().is_none_or(|wanted| wanted == value),
            None => false,
        });
        tagged
            && self
                .name_prefix
                .as_ref()
                .is_none_or(|prefix| name.starts_with(prefix.as_str()))
    }
}

/// What to list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ListKind {
    /// The versions of a secret, newest first: at most `count` of those numbered
    /// `at_most` or lower, versions scheduled for deletion left out.
    Versions {
        /// The secret OCID.
        secret_id: String,
        /// The highest version number kept (the current version's).
        at_most: u64,
        /// Versions kept at most.
        count: usize,
    },
    /// The `ACTIVE` secrets of a vault, in name order, with their freeform tags: one
    /// listing (and one cache entry) per vault, whatever selects from it ([`SecretFilter`]
    /// is applied to the listing, not sent).
    Secrets {
        /// The compartment OCID (ListSecrets needs it).
        compartment_id: String,
        /// The vault OCID.
        vault_id: String,
    },
}

/// One listing to make, as whom, from where, by when. Its pages are [`PageRequest`]s.
#[derive(Clone, Debug)]
pub struct ListRequest {
    /// The API's base URL: the Secrets endpoint for versions, the Vault (management)
    /// endpoint, `https://vaults.{region}.oci.{domain}`, for secrets.
    pub base_url: String,
    /// The established credential it is made with (see [`crate::SecretRequest::session`]).
    pub session: auth::Session,
    /// What is listed.
    pub kind: ListKind,
    /// Every page and every retry ends by then.
    pub deadline: Instant,
    /// Told of the sleeps between the attempts of every page (as
    /// [`crate::SecretRequest::backoff`]).
    pub backoff: Backoff,
    /// The pages the caller may still have sent upstream (a mount's allowance, shared by
    /// all its listings); not part of the cache key, as `backoff` is not.
    pub pages: Pages,
}

/// An allowance of listing pages sent upstream, shared by its clones (a mount's listings).
#[derive(Clone, Debug, Default)]
pub struct Pages(Option<Arc<AtomicU32>>);

impl Pages {
    /// No allowance: only [`MAX_PAGES`] per listing bounds them.
    pub const fn unlimited() -> Self {
        Self(None)
    }

    /// At most `pages` pages, over every listing given a clone.
    pub fn at_most(pages: u32) -> Self {
        Self(Some(Arc::new(AtomicU32::new(pages))))
    }

    /// Takes one page of the allowance: `false` when none is left.
    pub(crate) fn take(&self) -> bool {
        self.0.as_ref().is_none_or(|left| {
            left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        })
    }

    /// The pages left (`None`: unlimited).
    pub fn left(&self) -> Option<u32> {
        self.0.as_ref().map(|left| left.load(Ordering::Relaxed))
    }
}

impl ListRequest {
    /// How errors name the listing.
    pub fn describe(&self) -> String {
        match &self.kind {
            ListKind::Versions { secret_id, .. } => format!("the versions of secret {secret_id}"),
            ListKind::Secrets {
                compartment_id,
                vault_id,
                ..
            } => format!("the secrets of vault {vault_id} in compartment {compartment_id}"),
        }
    }
}

/// One page of a listing: the listing, and the page token of the previous page's
/// `opc-next-page` (`None`: the first page). Its retries tell the listing's
/// [`ListRequest::backoff`].
#[derive(Debug)]
pub struct PageRequest {
    /// The listing.
    pub list: Arc<ListRequest>,
    /// The page token.
    pub page: Option<String>,
}

/// An `ACTIVE` secret of a vault listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedSecret {
    /// The secret OCID.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its freeform tags (what a [`SecretFilter`] selects by).
    pub tags: BTreeMap<String, String>,
}

/// One page as OCI answered it.
#[derive(Debug, Default)]
pub struct Page {
    /// Version numbers (versions listings), each with whether it is scheduled for deletion.
    pub versions: Vec<(u64, bool)>,
    /// Secrets (vault listings), each with its lifecycle state.
    pub secrets: Vec<(ListedSecret, String)>,
    /// `opc-next-page`: there are more.
    pub next: Option<String>,
}

impl PageRequest {
    /// Who the listing is made as.
    pub(crate) fn identity(&self) -> Identity {
        self.list.session.identity()
    }

    /// `GET` and the absolute URI of the page: query keys in sorted order, as the Go SDK
    /// sends them (`limit`, `page`, `sortBy`, `sortOrder`; ListSecrets also `compartmentId`,
    /// `lifecycleState` and `vaultId`).
    pub(crate) fn method_and_uri(&self) -> (http::Method, String) {
        let base = self.list.base_url.trim_end_matches('/');
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let path = match &self.list.kind {
            ListKind::Versions {
                secret_id, count, ..
            } => {
                query.append_pair("limit", &(count + VERSIONS_SLACK).to_string());
                if let Some(page) = &self.page {
                    query.append_pair("page", page);
                }
                // The SDK's default order for VERSION_NUMBER is ascending: ask.
                query.append_pair("sortBy", "VERSION_NUMBER");
                query.append_pair("sortOrder", "DESC");
                format!(
                    "/20190301/secretbundles/{}/versions",
                    encode_path_segment(secret_id)
                )
            }
            ListKind::Secrets {
                compartment_id,
                vault_id,
                ..
            } => {
                query.append_pair("compartmentId", compartment_id);
                query.append_pair("lifecycleState", "ACTIVE");
                query.append_pair("limit", &SECRETS_PAGE_LIMIT.to_string());
                if let Some(page) = &self.page {
                    query.append_pair("page", page);
                }
                query.append_pair("sortBy", "NAME");
                query.append_pair("sortOrder", "ASC");
                query.append_pair("vaultId", vault_id);
                "/20180608/secrets".to_owned()
            }
        };
        (
            http::Method::GET,
            format!("{base}{path}?{}", query.finish()),
        )
    }

    /// The page of a successful answer.
    pub(crate) fn parse(&self, body: &[u8], next: Option<&str>) -> Result<Page, MalformedBundle> {
        let next = next.filter(|n| !n.is_empty()).map(str::to_owned);
        match &self.list.kind {
            ListKind::Versions { .. } => parse_versions(body, next),
            ListKind::Secrets { .. } => parse_secrets(body, next),
        }
    }
}

/// The longest OCID or name a listing keeps (OCI's own bound on both is 255).
const MAX_TEXT: usize = 255;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawVersion {
    #[serde(default)]
    version_number: Option<i64>,
    #[serde(default)]
    time_of_deletion: Option<String>,
}

fn parse_versions(body: &[u8], next: Option<String>) -> Result<Page, MalformedBundle> {
    let raw: Vec<RawVersion> = from_json(body)?;
    let mut versions = Vec::with_capacity(raw.len());
    for v in raw {
        let number = v
            .version_number
            .ok_or(MalformedBundle::MissingVersionNumber)?;
        let number = u64::try_from(number)
            .ok()
            .filter(|n| *n > 0)
            .ok_or(MalformedBundle::InvalidVersionNumber(number))?;
        versions.push((number, v.time_of_deletion.is_some()));
    }
    Ok(Page {
        versions,
        next,
        ..Page::default()
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSecretSummary {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    secret_name: Option<String>,
    #[serde(default)]
    lifecycle_state: Option<String>,
    #[serde(default)]
    freeform_tags: Option<BTreeMap<String, String>>,
}

fn parse_secrets(body: &[u8], next: Option<String>) -> Result<Page, MalformedBundle> {
    let raw: Vec<RawSecretSummary> = from_json(body)?;
    let mut secrets = Vec::with_capacity(raw.len());
    for s in raw {
        let text = |v: Option<String>, field| {
            v.filter(|t| !t.is_empty() && t.len() <= MAX_TEXT)
                .ok_or(MalformedBundle::MissingField(field))
        };
        let listed = ListedSecret {
            id: text(s.id, "id")?,
            name: text(s.secret_name, "secretName")?,
            tags: s.freeform_tags.unwrap_or_default(),
        };
        let state = text(s.lifecycle_state, "lifecycleState")?;
        secrets.push((listed, state));
    }
    Ok(Page {
        secrets,
        next,
        ..Page::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(kind: ListKind, page: Option<&str>) -> PageRequest {
        PageRequest {
            list: Arc::new(ListRequest {
                base_url: "https://api.example.com/".into(),
                session: auth::Session::for_tests(auth::Credential::Instance {
                    tenancy: "ocid1.tenancy.oc1..t".into(),
                    instance: "ocid1.instance.oc1..i".into(),
                }),
                kind,
                deadline: Instant::now(),
                backoff: Backoff::none(),
                pages: Pages::unlimited(),
            }),
            page: page.map(str::to_owned),
        }
    }

    #[test]
    fn a_versions_page_asks_for_the_newest_first_with_its_keys_sorted() {
        let kind = ListKind::Versions {
            secret_id: "ocid1.vaultsecret.oc1..s/x".into(),
            at_most: 5,
            count: 3,
        };
        let (method, uri) = page(kind.clone(), None).method_and_uri();
        assert_eq!(method, http::Method::GET);
        assert_eq!(
            uri,
            "https://api.example.com/20190301/secretbundles/ocid1.vaultsecret.oc1..s%2Fx/versions\
             ?limit=4&sortBy=VERSION_NUMBER&sortOrder=DESC"
        );
        let (_, uri) = page(kind, Some("p 2")).method_and_uri();
        assert!(
            uri.ends_with("?limit=4&page=p+2&sortBy=VERSION_NUMBER&sortOrder=DESC"),
            "{uri}"
        );
    }

    #[test]
    fn a_secrets_page_lists_the_active_secrets_of_the_vault_by_name() {
        let kind = ListKind::Secrets {
            compartment_id: "ocid1.compartment.oc1..c".into(),
            vault_id: "ocid1.vault.oc1..v".into(),
        };
        let (_, uri) = page(kind, Some("next")).method_and_uri();
        assert_eq!(
            uri,
            "https://api.example.com/20180608/secrets?compartmentId=ocid1.compartment.oc1..c\
             &lifecycleState=ACTIVE&limit=50&page=next&sortBy=NAME&sortOrder=ASC\
             &vaultId=ocid1.vault.oc1..v"
        );
    }

    #[test]
    fn pages_parse_the_sdks_summaries_and_refuse_what_they_lack() {
        let versions = page(
            ListKind::Versions {
                secret_id: "s".into(),
                at_most: 9,
                count: 2,
            },
            None,
        );
        let parsed = versions
            .parse(
                br#"[{"secretId":"s","versionNumber":3,"stages":["CURRENT"]},
                     {"secretId":"s","versionNumber":2,"timeOfDeletion":"2030-01-01T00:00:00Z"}]"#,
                Some("n"),
            )
            .unwrap();
        assert_eq!(parsed.versions, [(3, false), (2, true)]);
        assert_eq!(parsed.next.as_deref(), Some("n"));
        assert_eq!(
            versions
                .parse(br#"[{"versionNumber":0}]"#, None)
                .unwrap_err(),
            MalformedBundle::InvalidVersionNumber(0)
        );
        let secrets = page(
            ListKind::Secrets {
                compartment_id: "c".into(),
                vault_id: "v".into(),
            },
            None,
        );
        let parsed = secrets
            .parse(
                br#"[{"id":"ocid1.vaultsecret..a","secretName":"a","lifecycleState":"ACTIVE",
                      "freeformTags":{"team":"payments"},"definedTags":{"ns":{"k":1}}}]"#,
                Some(""),
            )
            .unwrap();
        assert_eq!(parsed.secrets[0].0.name, "a");
        assert_eq!(parsed.secrets[0].0.tags["team"], "payments");
        assert_eq!(parsed.next, None, "an empty opc-next-page is the last page");
        assert_eq!(
            secrets
                .parse(br#"[{"id":"x","lifecycleState":"ACTIVE"}]"#, None)
                .unwrap_err(),
            MalformedBundle::MissingField("secretName")
        );
    }

    #[test]
    fn a_filter_takes_a_tag_with_any_or_one_value_and_a_name_prefix() {
        let tags: BTreeMap<String, String> = [("team".to_owned(), "payments".to_owned())].into();
        let tag = |value: Option<&str>| TagFilter {
            key: "team".into(),
            value: value.map(str::to_owned),
        };
        let filter = SecretFilter {
            tag: Some(tag(Some("payments"))),
            name_prefix: Some("app-".into()),
        };
        assert!(filter.matches("app-db", &tags));
        assert!(!filter.matches("db", &tags), "the prefix holds too");
        assert!(!filter.matches("app-db", &BTreeMap::new()));
        let any = SecretFilter {
            tag: Some(tag(None)),
            name_prefix: None,
        };
        assert!(any.matches("x", &tags));
        let other = SecretFilter {
            tag: Some(tag(Some("billing"))),
            name_prefix: None,
        };
        assert!(!other.matches("x", &tags));
    }
}
