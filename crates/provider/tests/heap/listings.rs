//! A fake of the listing APIs' pages (ListSecrets, ListSecretBundleVersions) under the real
//! `vault::Lister`: a vault of `secrets` secrets (tagged `team=t<i % 4>`) and secrets of
//! `versions` versions each, fifty to a page; every page answered is counted, and the bytes
//! its JSON would have on the wire (what the mount reads of it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::future::BoxFuture;

#[derive(Clone, Debug)]
pub struct Pages {
    pub secrets: usize,
    pub versions: u64,
    pub served: Arc<AtomicUsize>,
    pub bytes: Arc<AtomicUsize>,
}

impl Default for Pages {
    fn default() -> Self {
        Self {
            secrets: 0,
            versions: 1,
            served: Arc::default(),
            bytes: Arc::default(),
        }
    }
}

impl tower::Service<vault::PageRequest> for Pages {
    type Response = vault::Page;
    type Error = vault::VaultError;
    type Future = BoxFuture<'static, Result<vault::Page, vault::VaultError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: vault::PageRequest) -> Self::Future {
        self.served.fetch_add(1, Ordering::SeqCst);
        let from: usize = request
            .page
            .as_deref()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let to = |total: usize| (from + vault::SECRETS_PAGE_LIMIT).min(total);
        let page = match &request.list.kind {
            vault::ListKind::Secrets { .. } => {
                let end = to(self.secrets);
                vault::Page {
                    secrets: (from..end)
                        .map(|i| {
                            let secret = vault::ListedSecret {
                                id: format!("ocid1.vaultsecret.oc1..s{i}"),
                                name: format!("s{i}"),
                                tags: [("team".to_owned(), format!("t{}", i % 4))].into(),
                            };
                            (secret, "ACTIVE".to_owned())
                        })
                        .collect(),
                    next: (end < self.secrets).then(|| end.to_string()),
                    ..vault::Page::default()
                }
            }
            vault::ListKind::Versions { at_most, .. } => {
                let total = usize::try_from(self.versions.min(*at_most)).unwrap_or(0);
                let end = to(total);
                vault::Page {
                    versions: (from..end).map(|i| (*at_most - i as u64, false)).collect(),
                    next: (end < total).then(|| end.to_string()),
                    ..vault::Page::default()
                }
            }
        };
        self.bytes.fetch_add(wire_bytes(&page), Ordering::SeqCst);
        Box::pin(async move { Ok(page) })
    }
}

/// The bytes of `page` as the APIs' JSON would hold it, at the least (the fields read).
fn wire_bytes(page: &vault::Page) -> usize {
    let secrets = page.secrets.iter().map(|(s, state)| {
        serde_json::json!({
            "id": s.id, "secretName": s.name, "lifecycleState": state, "freeformTags": s.tags,
        })
    });
    let versions = page
        .versions
        .iter()
        .map(|(n, _)| serde_json::json!({ "versionNumber": n }));
    let items: Vec<serde_json::Value> = secrets.chain(versions).collect();
    serde_json::to_string(&items).map_or(0, |s| s.len())
}
