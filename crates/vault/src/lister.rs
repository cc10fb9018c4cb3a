//! A listing page by page: [`ListerLayer`] makes [`Lister`], which sends the pages of a
//! [`ListRequest`] to the service below (the retries of the client, each page retried
//! alone) and keeps what the listing asks for, within [`MAX_PAGES`]; what a listing is
//! cached under.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use auth::Credential;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt as _};

use crate::error::VaultError;
use crate::list::{ListKind, ListRequest, ListedSecret, MAX_PAGES, Page, PageRequest};

/// A boxed future of this crate's services.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Why a listing stopped before its last page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStop {
    /// [`MAX_PAGES`] pages were read.
    TooManyPages,
}

/// What a listing kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Version numbers, newest first (versions listings).
    pub versions: Vec<u64>,
    /// The `ACTIVE` secrets, in name order, with their tags (vault listings).
    pub secrets: Vec<ListedSecret>,
    /// Why the listing stopped early, if it did.
    pub stopped: Option<ListStop>,
    /// Pages read.
    pub pages: u32,
}

impl Listing {
    /// Keeps what `kind` asks for of one page; `true` once nothing more is needed.
    fn keep(&mut self, kind: &ListKind, page: Page) -> bool {
        match kind {
            ListKind::Versions { at_most, count, .. } => {
                let kept = page
                    .versions
                    .into_iter()
                    .filter(|(number, deleting)| number <= at_most && !deleting)
                    .map(|(number, _)| number);
                self.versions.extend(kept);
                self.versions.truncate(*count);
                self.versions.len() >= *count
            }
            ListKind::Secrets { .. } => {
                let active = page
                    .secrets
                    .into_iter()
                    .filter(|(_, state)| state == "ACTIVE")
                    .map(|(secret, _)| secret);
                self.secrets.extend(active);
                false
            }
        }
    }
}

impl cache::CacheValue for Listing {
    /// The names, OCIDs and tags kept.
    fn bytes(&self) -> usize {
        self.versions.len() * 8
            + self
                .secrets
                .iter()
                .map(|s| {
                    let tags: usize = s.tags.iter().map(|(k, v)| k.len() + v.len()).sum();
                    s.id.len() + s.name.len() + tags
                })
                .sum::<usize>()
    }
}

/// What a listing is cached under: everything its pages depend on, the credential that
/// made it first (as [`crate::BundleKey`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListKey {
    /// Who listed.
    pub credential: std::sync::Arc<Credential>,
    /// The endpoint, which names the region.
    pub endpoint: String,
    /// What was listed.
    pub kind: ListKind,
}

impl cache::CacheKey for ListRequest {
    type Key = ListKey;

    fn cache_key(&self) -> ListKey {
        // Destructured without `..`, as `SecretRequest`'s key is.
        let ListRequest {
            base_url,
            session,
            kind,
            deadline: _,
            // The caller's budgets, not what is listed (see `SecretRequest`'s key).
            backoff: _,
            pages: _,
        } = self;
        ListKey {
            credential: session.shared_credential().clone(),
            endpoint: base_url.trim_end_matches('/').to_owned(),
            kind: kind.clone(),
        }
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Pages through listings: configuration-free.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListerLayer;

impl<S> Layer<S> for ListerLayer {
    type Service = Lister<S>;

    fn layer(&self, inner: S) -> Lister<S> {
        Lister { inner }
    }
}

/// The service of [`ListerLayer`]: a [`ListRequest`] in, its [`Listing`] out, each page a
/// [`PageRequest`] to the service below, one after the other (each page names the next).
#[derive(Clone, Debug)]
pub struct Lister<S> {
    inner: S,
}

impl<S> Service<ListRequest> for Lister<S>
where
    S: Service<PageRequest, Response = Page, Error = VaultError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Listing;
    type Error = VaultError;
    type Future = BoxFuture<Result<Listing, VaultError>>;

    // Each page drives its own clone of the service below to readiness (as the retries
    // do for their attempts), so the lister itself is always ready.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), VaultError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ListRequest) -> Self::Future {
        Box::pin(list(self.inner.clone(), Arc::new(request)))
    }
}

async fn list<S>(inner: S, request: Arc<ListRequest>) -> Result<Listing, VaultError>
where
    S: Service<PageRequest, Response = Page, Error = VaultError> + Clone,
{
    let mut listing = Listing::default();
    let mut page = None;
    loop {
        if listing.pages >= MAX_PAGES {
            listing.stopped = Some(ListStop::TooManyPages);
            return Ok(listing);
        }
        // The caller's allowance (a mount's, over all its listings): an error, so that
        // what was read is not cached as if it were the whole listing.
        if !request.pages.take() {
            return Err(VaultError::PagesSpent {
                subject: Box::new(crate::Subject {
                    object: request.describe(),
                    principal: request.session.identity(),
                    grant: crate::Subject::LIST_GRANT,
                }),
                read: listing.pages,
            });
        }
        let answer = inner
            .clone()
            .oneshot(PageRequest {
                list: Arc::clone(&request),
                page: page.take(),
            })
            .await?;
        listing.pages += 1;
        let next = answer.next.clone();
        if listing.keep(&request.kind, answer) {
            return Ok(listing);
        }
        match next {
            Some(next) => page = Some(next),
            None => return Ok(listing),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::list::{SecretFilter, TagFilter};

    /// Pages answered in turn; the page tokens asked for.
    #[derive(Clone, Default)]
    struct Pages {
        pages: Arc<Mutex<Vec<Page>>>,
        asked: Arc<Mutex<Vec<Option<String>>>>,
    }

    impl Service<PageRequest> for Pages {
        type Response = Page;
        type Error = VaultError;
        type Future = BoxFuture<Result<Page, VaultError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), VaultError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: PageRequest) -> Self::Future {
            self.asked.lock().unwrap().push(request.page);
            let page = self.pages.lock().unwrap().remove(0);
            Box::pin(async move { Ok(page) })
        }
    }

    fn request(kind: ListKind) -> ListRequest {
        ListRequest {
            base_url: "https://vaults.example".into(),
            session: auth::Session::for_tests(Credential::Instance {
                tenancy: "ocid1.tenancy.oc1..t".into(),
                instance: "ocid1.instance.oc1..i".into(),
            }),
            kind,
            deadline: Instant::now(),
            backoff: crate::Backoff::none(),
            pages: crate::Pages::unlimited(),
        }
    }

    fn secret(name: &str, state: &str, team: &str) -> (ListedSecret, String) {
        (
            ListedSecret {
                id: format!("ocid1.vaultsecret..{name}"),
                name: name.into(),
                tags: [("team".to_owned(), team.to_owned())].into(),
            },
            state.into(),
        )
    }

    fn vault() -> ListKind {
        ListKind::Secrets {
            compartment_id: "c".into(),
            vault_id: "v".into(),
        }
    }

    #[tokio::test]
    async fn a_vault_listing_follows_every_page_and_keeps_the_active_secrets_with_their_tags() {
        let pages = Pages::default();
        *pages.pages.lock().unwrap() = vec![
            Page {
                secrets: vec![
                    secret("a", "ACTIVE", "payments"),
                    secret("b", "ACTIVE", "billing"),
                    secret("c", "PENDING_DELETION", "payments"),
                ],
                next: Some("p2".into()),
                ..Page::default()
            },
            Page {
                secrets: vec![secret("d", "ACTIVE", "payments")],
                ..Page::default()
            },
        ];
        let listing = ListerLayer
            .layer(pages.clone())
            .oneshot(request(vault()))
            .await
            .unwrap();
        let names: Vec<&str> = listing.secrets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "d"]);
        assert_eq!(listing.secrets[1].tags["team"], "billing");
        assert_eq!((listing.pages, listing.stopped), (2, None));
        assert_eq!(*pages.asked.lock().unwrap(), [None, Some("p2".into())]);
        let filter = SecretFilter {
            tag: Some(TagFilter {
                key: "team".into(),
                value: Some("payments".into()),
            }),
            name_prefix: None,
        };
        let selected: Vec<&str> = listing
            .secrets
            .iter()
            .filter(|s| filter.matches(&s.name, &s.tags))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(selected, ["a", "d"]);
    }

    #[tokio::test]
    async fn a_listing_stops_with_an_error_when_the_callers_pages_are_spent() {
        let pages = Pages::default();
        *pages.pages.lock().unwrap() = vec![
            Page {
                secrets: vec![secret("a", "ACTIVE", "payments")],
                next: Some("p2".into()),
                ..Page::default()
            },
            Page::default(),
        ];
        let allowance = crate::Pages::at_most(1);
        let err = ListerLayer
            .layer(pages.clone())
            .oneshot(ListRequest {
                pages: allowance.clone(),
                ..request(vault())
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, VaultError::PagesSpent { read: 1, .. }),
            "{err:?}"
        );
        assert_eq!(err.kind(), crate::ErrorKind::ResourceExhausted);
        assert_eq!(pages.asked.lock().unwrap().len(), 1, "no second page");
        assert_eq!(allowance.left(), Some(0));
    }

    #[tokio::test]
    async fn a_versions_listing_keeps_the_newest_up_to_the_current_and_stops_when_it_has_them() {
        let pages = Pages::default();
        *pages.pages.lock().unwrap() = vec![
            Page {
                // 6 is pending (above the current 5); 4 is scheduled for deletion.
                versions: vec![(6, false), (5, false), (4, true)],
                next: Some("p2".into()),
                ..Page::default()
            },
            Page {
                versions: vec![(3, false), (2, false)],
                next: Some("p3".into()),
                ..Page::default()
            },
        ];
        let kind = ListKind::Versions {
            secret_id: "s".into(),
            at_most: 5,
            count: 3,
        };
        let listing = ListerLayer
            .layer(pages.clone())
            .oneshot(request(kind))
            .await
            .unwrap();
        assert_eq!(listing.versions, [5, 3, 2]);
        assert_eq!(listing.pages, 2, "the third page is not asked for");
    }
}
