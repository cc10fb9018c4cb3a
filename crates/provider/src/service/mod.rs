//! The mount service `csi-grpc` calls: parameters, then the identity, then where its calls
//! go (`targets`), then every entry at once (`fanout`: each by its kind, `crate::entries`),
//! then the templates, then the answer (`files`: its object versions, its size check).
//! What the service is built over and shares between mounts is `crate::contract`; a failure
//! says what failed through `crate::failure`.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use csi_grpc::{Caller, ErrorKind, MountError, MountRequest, MountResponse};
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt};

mod fanout;
mod files;
mod targets;

use crate::contract::{
    CertificateService, IdentityService, ListingService, MountContext, NoListings, SecretsService,
};
use crate::entries::{EntryFiles, EntryVersion, MountRun, render_templates};
use crate::failure::auth_error;
use files::{check_selected, object_versions};
// `crate::fuzzing` checks a mount's size as a mount does.
pub(crate) use files::check_size;
use targets::endpoint_error;

use crate::layers::budget::MountBytes;
use crate::params::{AuthSpec, MountParameters};

/// The OCI mount service that `csi-grpc` calls: parameters, identity, then the entries
/// fetched concurrently (bounded), all or nothing. Cloned per request (by tonic, by the
/// edge's layers): a reference count, not a copy of every fetch stack it holds.
pub struct OciMount<A, V, C, L = NoListings> {
    shared: Arc<Shared<A, V, C, L>>,
}

struct Shared<A, V, C, L> {
    auth: A,
    // The fetch services answer `Held`, which only the byte budget's layer makes: every
    // fetch passes through it.
    secrets: V,
    certificates: C,
    listings: L,
    config: Arc<MountContext>,
}

impl<A, V, C, L> Clone for OciMount<A, V, C, L> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<A, V, C, L> fmt::Debug for OciMount<A, V, C, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OciMount")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<A, V, C> OciMount<A, V, C> {
    /// A mount service establishing identities with `auth` (a tower service, usually
    /// `auth::Principals`), reading secret entries through `secrets` and certificate
    /// entries through `certificates` (the byte budget's layer over the fetch stacks; a
    /// `NoCertificates` under it refuses certificate entries).
    /// Without a listing service ([`NoListings`]): `versions`, `tag` and `namePrefix`
    /// entries fail until [`OciMount::with_listings`] gives it one.
    pub fn new(auth: A, secrets: V, certificates: C, config: MountContext) -> Self {
        Self {
            shared: Arc::new(Shared {
                auth,
                secrets,
                certificates,
                listings: NoListings,
                config: Arc::new(config),
            }),
        }
    }
}

impl<A: Clone, V: Clone, C: Clone, L> OciMount<A, V, C, L> {
    /// The same service making the listings of `versions`, `tag` and `namePrefix` entries
    /// through `listings` (the byte budget's layer over the listing stack).
    pub fn with_listings<M>(self, listings: M) -> OciMount<A, V, C, M> {
        let shared = &self.shared;
        OciMount {
            shared: Arc::new(Shared {
                auth: shared.auth.clone(),
                secrets: shared.secrets.clone(),
                certificates: shared.certificates.clone(),
                listings,
                config: shared.config.clone(),
            }),
        }
    }
}

impl<A, V, C, L> OciMount<A, V, C, L>
where
    A: IdentityService,
    V: SecretsService,
    C: CertificateService,
    L: ListingService,
{
    /// `[auth] allowed_types`: another type is PermissionDenied before any upstream call.
    fn check_allowed_type(&self, auth_type: crate::params::AuthType) -> Result<(), MountError> {
        let allowed = &self.shared.config.allowed_types;
        if allowed.contains(&auth_type) {
            return Ok(());
        }
        let allowed: Vec<&str> = allowed.iter().map(|t| t.as_str()).collect();
        Err(MountError::new(
            ErrorKind::PermissionDenied,
            format!(
                "authType \"{auth_type}\" is not allowed on this node: the provider's \
                 auth.allowed_types is [{}]; use one of those, or ask the cluster operator",
                allowed.join(", ")
            ),
        ))
    }

    async fn mount(self, request: MountRequest) -> Result<MountResponse, MountError> {
        let namespace = request.pod.namespace.as_deref().unwrap_or("");
        let limits = crate::params::ParseLimits {
            max_secrets: self.shared.config.max_secrets,
            max_files: self.shared.config.max_files,
        };
        // A class parsed lately with these parameters is served as it was parsed; else it is
        // parsed, what parsing may allocate held in the budget while it runs.
        let params = self.shared.config.classes.get_or_parse(
            &request.attributes,
            &request.pod,
            limits,
            || {
                let attributes: usize = request
                    .attributes
                    .iter()
                    .map(|(key, value)| key.len() + value.len())
                    .sum();
                let _parsing = self.shared.config.reserve(
                    namespace,
                    attributes.saturating_mul(crate::params::PARSE_BYTES_PER_BYTE),
                    "reading the SecretProviderClass parameters",
                )?;
                // A misspelt parameter is never fatal (the driver passes attributes of its
                // own), but the operator reading the log is told what was meant.
                for warning in MountParameters::warnings(&request.attributes) {
                    tracing::warn!(%warning, "SecretProviderClass parameter");
                }
                MountParameters::parse_within(&request.attributes, &request.pod, limits)
                    .map_err(MountError::from)
            },
        )?;
        let auth_type = params.auth.auth_type();
        self.check_allowed_type(auth_type)?;
        if auth_type == crate::params::AuthType::Workload {
            // Workload identity's region is the configured one: a mount no endpoint could
            // serve is refused before its token is exchanged.
            let endpoints = &self.shared.config.endpoints;
            endpoints
                .of(endpoints.configured_region())
                .map_err(endpoint_error)?;
        }
        let established = tracing::Instrument::instrument(
            self.shared
                .auth
                .clone()
                .oneshot(identity_request(&params, &request)),
            tracing::info_span!("establish identity", principal = auth_type.as_str()),
        )
        .await
        .map_err(auth_error)?;
        let targets = targets::targets(&self.shared.config, &params, &established)?;
        let run = MountRun {
            config: &self.shared.config,
            request: &request,
            namespace,
            mount: MountBytes::new(namespace, self.shared.config.max_total_bytes),
            permits: Arc::new(Semaphore::new(self.shared.config.fan_out.max(1))),
            pages: vault::Pages::at_most(self.shared.config.max_listing_pages),
        };
        let mut entries = fanout::fetch_all(
            &run,
            (
                &self.shared.secrets,
                &self.shared.certificates,
                &self.shared.listings,
            ),
            &params,
            &established,
            &targets,
        )
        .await?;
        let templates = params.templates();
        let rendered = render_templates(&run, &templates, &mut entries).await?;
        entries.extend(rendered);
        answer(entries, &params, &self.shared.config)
    }
}

/// The mount's answer from its entries: the secrets' files, then the certificates', then
/// the templates', each in the class's order (an entry read by templates only writes none),
/// within the size the driver accepts (and, with selections, the files it may write); the
/// reservations are held until the answer is assembled and handed on.
fn answer(
    mut entries: Vec<EntryFiles>,
    params: &MountParameters,
    config: &MountContext,
) -> Result<MountResponse, MountError> {
    let group = |files: &EntryFiles| {
        params
            .entries
            .iter()
            .find(|entry| entry.index() == files.index)
            .map_or(0, crate::entries::Entry::answer_group)
    };
    // Stable: each group keeps the class's order.
    entries.sort_by_key(|files| group(files));
    let mut secret_versions = Vec::new();
    let mut own_versions = Vec::new();
    for version in entries
        .iter()
        .filter(|entry| entry.write)
        .flat_map(|entry| &entry.versions)
    {
        match version {
            EntryVersion::Secret {
                path,
                secret_id,
                version,
                ..
            } => secret_versions.push((path, secret_id.as_str(), *version)),
            EntryVersion::Certificate(version) | EntryVersion::Template(version) => {
                own_versions.push(version.clone())
            }
        }
    }
    let mut object_versions = object_versions(&secret_versions);
    object_versions.extend(own_versions);
    let mut files = Vec::new();
    let mut reservations = Vec::new();
    for entry in entries {
        if entry.write {
            files.extend(entry.files);
        }
        reservations.extend(entry.reservations);
    }
    if !params.selections().is_empty() {
        check_selected(&files, config.max_files)?;
    }
    check_size(&files, config.max_total_bytes)?;
    drop(reservations);
    Ok(MountResponse {
        files,
        object_versions,
    })
}

/// What the identity service is asked for one mount: the class's principal and what the
/// request says of the pod and its tokens.
fn identity_request(params: &MountParameters, request: &MountRequest) -> auth::IdentityRequest {
    auth::IdentityRequest {
        kind: match &params.auth {
            AuthSpec::User { secret_name } => auth::PrincipalKind::User {
                secret_name: secret_name.clone(),
            },
            AuthSpec::Instance => auth::PrincipalKind::Instance,
            AuthSpec::Workload => auth::PrincipalKind::Workload,
        },
        namespace: request.pod.namespace.clone(),
        pod_name: request.pod.name.clone(),
        pod_uid: request.pod.uid.clone(),
        service_account: request.pod.service_account.clone(),
        service_account_tokens: request
            .service_account_tokens
            .iter()
            .map(|(audience, token)| (audience.to_owned(), token.token.clone()))
            .collect(),
        deadline: request.deadline,
        caller: match request.caller {
            Caller::Driver => auth::Caller::Driver,
            Caller::SyncController => auth::Caller::SyncController,
        },
    }
}

impl<A, V, C, L> Service<MountRequest> for OciMount<A, V, C, L>
where
    A: IdentityService,
    V: SecretsService,
    C: CertificateService,
    L: ListingService,
{
    type Response = MountResponse;
    type Error = MountError;
    type Future = futures_util::future::BoxFuture<'static, Result<MountResponse, MountError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), MountError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: MountRequest) -> Self::Future {
        Box::pin(self.clone().mount(request))
    }
}
