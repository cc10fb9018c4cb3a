//! The mount's fetches: every secret and certificate entry through the byte budget,
//! concurrently under the fan-out, failing over where the class says.

use super::*;

impl<A, V, C> OciMount<A, V, C>
where
    A: IdentityService,
    V: SecretsService,
    C: crate::certificates::CertificateService,
{
    /// The certificate entries, fetched concurrently (bounded by the fan-out) with the
    /// mount's identity and within its byte bounds, their keys decoded through the gate of
    /// tenant keys; the first failure fails the mount.
    pub(super) async fn fetch_certificates(
        &self,
        params: &MountParameters,
        targets: &Targets,
        mount: &Arc<MountBytes>,
        request: &MountRequest,
    ) -> Result<(Vec<File>, Vec<ObjectVersion>, Vec<Reservation>), MountError> {
        let permits = Arc::new(Semaphore::new(self.config.fan_out.max(1)));
        let namespace = request.pod.namespace.clone().unwrap_or_default();
        let mut pending: FuturesUnordered<_> = params
            .certificates
            .iter()
            .map(|spec| {
                let call = crate::certificates::request(
                    spec,
                    &targets.primary.endpoints.certificates,
                    &targets.primary.session,
                    request.deadline,
                );
                let fetch = CertificateFetch {
                    certificates: self.certificates.clone(),
                    mount: mount.clone(),
                    permits: permits.clone(),
                    keys: self.config.tenant_keys.clone(),
                    expiry: self.config.certificate_expiry.clone(),
                    namespace: namespace.clone(),
                    request,
                    span: tracing::info_span!(
                        "fetch certificate",
                        entry = spec.index,
                        certificate = %spec.id,
                        private_key = spec.private_key,
                        oci.request_id = tracing::field::Empty,
                        error.kind = tracing::field::Empty,
                    ),
                };
                let span = fetch.span.clone();
                let run = async move { (spec.index, fetch.run(spec, call).await) };
                tracing::Instrument::instrument(run, span)
            })
            .collect();
        let mut done = Vec::with_capacity(params.certificates.len());
        while let Some((index, made)) = pending.next().await {
            // Dropping `pending` on the first failure cancels the fetches still running.
            done.push((index, made?));
        }
        // In request order.
        done.sort_by_key(|(index, _)| *index);
        let (mut files, mut versions, mut held) = (Vec::new(), Vec::new(), Vec::new());
        for (_, (f, v, r)) in done {
            files.extend(f);
            versions.push(v);
            held.extend(r);
        }
        Ok((files, versions, held))
    }

    pub(super) async fn fetch_all(
        &self,
        params: &MountParameters,
        established: &auth::Established,
        targets: &Targets,
        mount: &Arc<MountBytes>,
        deadline: tokio::time::Instant,
    ) -> Result<(Vec<vault::SecretBundle>, Vec<Reservation>), MountError> {
        let permits = Arc::new(Semaphore::new(self.config.fan_out.max(1)));
        let mut pending: FuturesUnordered<_> = params
            .secrets
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let (primary, failover) = secret_requests(spec, targets, deadline);
                let span = tracing::info_span!(
                    "fetch secret",
                    entry = index,
                    secret = %spec.source.display(),
                    region = tracing::field::Empty,
                    lookup = tracing::field::Empty,
                    oci.request_id = tracing::field::Empty,
                    error.kind = tracing::field::Empty,
                );
                let fetch = SecretFetch {
                    secrets: self.secrets.clone(),
                    mount: mount.clone(),
                    permits: permits.clone(),
                    span: span.clone(),
                };
                let fetched = fetch.run(primary, failover);
                tracing::Instrument::instrument(async move { (index, fetched.await) }, span)
            })
            .collect();
        let mut collected = Collected::new(params.secrets.len());
        while let Some((index, fetched)) = pending.next().await {
            // Returning or breaking drops `pending`: the fetches still running are cancelled.
            if collected.take(index, fetched, params, self.config.max_total_bytes)? {
                break;
            }
        }
        let Collected {
            bundles,
            reservations,
            failures,
            shared,
        } = collected;
        let abandoned = pending.len();
        drop(pending);
        if !failures.is_empty() {
            return Err(combine(
                params,
                failures,
                abandoned,
                &established.identity(),
            ));
        }
        let bundles = bundles
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                MountError::internal("internal error: a secret was neither fetched nor failed")
            })?;
        // Reads that reached OCI (not answered by the cache), in the mount's span.
        // Certificate entries are always read from OCI (they are not cached).
        let upstream = bundles.len() - shared.len() + params.certificates.len();
        tracing::Span::current().record("upstream_calls", upstream);
        log_shared(established.credential(), &bundles, shared);
        Ok((bundles, reservations))
    }
}

/// The entries' answers as they arrive, in request order.
struct Collected {
    bundles: Vec<Option<vault::SecretBundle>>,
    reservations: Vec<Reservation>,
    failures: Vec<(usize, vault::VaultError)>,
    shared: Vec<(usize, cache::Lookup)>,
}

impl Collected {
    fn new(entries: usize) -> Self {
        Self {
            bundles: (0..entries).map(|_| None).collect(),
            reservations: Vec::new(),
            failures: Vec::new(),
            shared: Vec::new(),
        }
    }

    /// Takes entry `index`'s answer. `Err` fails the mount now (it is over its size, or
    /// the budget refused it); `Ok(true)` stops the others (a permanent failure fails the
    /// mount whatever they give, so their retries stop now).
    fn take(
        &mut self,
        index: usize,
        fetched: EntryAnswer,
        params: &MountParameters,
        max_total_bytes: usize,
    ) -> Result<bool, MountError> {
        match fetched {
            EntryAnswer::Bundle(bundle, lookup, reservation, over) => {
                if lookup.is_shared() {
                    self.shared.push((index, lookup));
                }
                self.bundles[index] = Some(bundle);
                self.reservations.extend(reservation);
                if over {
                    return Err(too_large(params, &self.bundles, max_total_bytes));
                }
                Ok(false)
            }
            EntryAnswer::MountOver => Err(too_large(params, &self.bundles, max_total_bytes)),
            EntryAnswer::Refused(refusal) => Err(MountError::new(
                ErrorKind::ResourceExhausted,
                refusal.to_string(),
            )),
            EntryAnswer::Failed(err) => {
                let permanent = !err.is_retryable();
                self.failures.push((index, err));
                Ok(permanent)
            }
        }
    }
}

/// The request of a secret entry to its primary region and, when the class and the entry
/// name one, to the failover region. With a failover, the primary gets half of the time
/// left, so that the failover has time to answer.
fn secret_requests(
    spec: &SecretSpec,
    targets: &Targets,
    deadline: tokio::time::Instant,
) -> (vault::SecretRequest, Option<(String, vault::SecretRequest)>) {
    let request = |target: &Target, source: &SecretSource, deadline| vault::SecretRequest {
        base_url: target.endpoints.secrets.clone(),
        session: target.session.clone(),
        secret: match source {
            SecretSource::Name { name, vault_id } => vault::SecretRef::ByName {
                vault_id: vault_id.clone(),
                name: name.clone(),
            },
            SecretSource::Id(secret_id) => vault::SecretRef::ById {
                secret_id: secret_id.clone(),
            },
        },
        selector: selector(spec),
        deadline,
    };
    let failover = targets
        .failover
        .as_ref()
        .zip(spec.failover.as_ref())
        .map(|(target, source)| {
            let again = request(target, source, deadline);
            (target.endpoints.name().to_owned(), again)
        });
    let primary_deadline = match failover {
        Some(_) => {
            let now = tokio::time::Instant::now();
            now + deadline.saturating_duration_since(now) / 2
        }
        None => deadline,
    };
    (
        request(&targets.primary, &spec.source, primary_deadline),
        failover,
    )
}

/// What one certificate entry gives a mount: its files, its object version and the bytes
/// it holds in the budget.
type CertificateFiles = (Vec<File>, ObjectVersion, Option<Reservation>);

/// One certificate entry's fetch: a fan-out permit, the Certificates call through the byte
/// budget, the private key through the gate of tenant keys, then its files; what happened
/// goes into its span.
struct CertificateFetch<'a, C> {
    certificates: C,
    mount: Arc<MountBytes>,
    permits: Arc<Semaphore>,
    keys: auth::TenantKeys,
    expiry: Arc<crate::certificates::CertificateExpiry>,
    namespace: String,
    request: &'a MountRequest,
    span: tracing::Span,
}

impl<C: crate::certificates::CertificateService> CertificateFetch<'_, C> {
    async fn run(
        self,
        spec: &crate::CertificateSpec,
        call: vault::CertificateRequest,
    ) -> Result<CertificateFiles, MountError> {
        let _permit = self.permits.acquire_owned().await;
        let held = match self
            .certificates
            .oneshot(Metered::new(call, &self.mount))
            .await
        {
            Ok(held) => held,
            Err(refused) => {
                let failed = |err: &vault::VaultError| {
                    self.span.record("error.kind", vault_kind(err).as_str());
                    crate::certificates::fetch_error(spec, err)
                };
                return Err(refused_error(refused, failed, &self.mount));
            }
        };
        let (bundle, reservation, over) = held.into_parts();
        if let Some(id) = &bundle.opc_request_id {
            self.span.record("oci.request_id", id.as_str());
        }
        if over {
            return Err(over_limit(&self.mount, spec));
        }
        let key = crate::certificates::private_key(
            spec,
            &bundle,
            &self.keys,
            &self.namespace,
            self.request.deadline,
        )
        .await?;
        let (files, version) = crate::certificates::files(
            spec,
            &bundle,
            key.as_ref(),
            self.request.file_mode,
            &self.expiry,
            &self.namespace,
        )?;
        Ok((files, version, reservation))
    }
}

/// One secret entry's fetch: a fan-out permit, then the entry through the Secrets fetch
/// stack (its primary region, its failover region if the primary fails over, within the
/// byte bounds); what happened goes into its span.
struct SecretFetch<V> {
    secrets: V,
    mount: Arc<MountBytes>,
    permits: Arc<Semaphore>,
    span: tracing::Span,
}

impl<V: SecretsService> SecretFetch<V> {
    async fn run(
        self,
        primary: vault::SecretRequest,
        failover: Option<(String, vault::SecretRequest)>,
    ) -> EntryAnswer {
        let _permit = self.permits.acquire_owned().await;
        let request = WithFailover {
            primary: Metered::new(primary, &self.mount),
            failover: failover.map(|(region, again)| (region, Metered::new(again, &self.mount))),
        };
        match self.secrets.oneshot(request).await {
            Ok((held, _served)) => {
                let (answer, reservation, over) = held.into_parts();
                let (bundle, lookup) = answer.into_parts();
                self.span.record("lookup", lookup.as_str());
                if let Some(id) = &bundle.opc_request_id {
                    self.span.record("oci.request_id", id.as_str());
                }
                EntryAnswer::Bundle(bundle, lookup, reservation, over)
            }
            Err(Refused::Budget(refusal)) => EntryAnswer::Refused(refusal),
            Err(Refused::MountOver) => EntryAnswer::MountOver,
            Err(Refused::Failed(err)) => {
                self.span.record("error.kind", vault_kind(&err).as_str());
                if let Some(id) = err.opc_request_id() {
                    self.span.record("oci.request_id", id);
                }
                EntryAnswer::Failed(err)
            }
        }
    }
}

/// Completes OCI's audit trail: reads answered from the cache (or by joining another
/// mount's fetch) never reached OCI, so the provider's log says which, for whom.
pub(super) fn log_shared(
    credential: &auth::Credential,
    bundles: &[vault::SecretBundle],
    mut shared: Vec<(usize, cache::Lookup)>,
) {
    if shared.is_empty() {
        return;
    }
    shared.sort_by_key(|(index, _)| *index);
    let entries: Vec<String> = shared
        .iter()
        .filter_map(|(index, lookup)| {
            let bundle = bundles.get(*index)?;
            Some(format!(
                "secrets[{index}] {} version {} ({})",
                bundle.secret_id,
                bundle.version_number,
                lookup.as_str()
            ))
        })
        .collect();
    tracing::info!(
        %credential,
        served_without_oci = %entries.join(", "),
        "secrets served from the provider's cache (OCI's audit log does not see these reads)"
    );
}

/// What one entry's fetch gave.
pub(super) enum EntryAnswer {
    /// The bundle, how it was looked up, its bytes in the budget, and whether it brought
    /// the mount past its size limit.
    Bundle(
        vault::SecretBundle,
        cache::Lookup,
        Option<Reservation>,
        bool,
    ),
    Failed(vault::VaultError),
    Refused(crate::budget::Refusal),
    MountOver,
}

pub(super) fn selector(spec: &SecretSpec) -> vault::Selector {
    match &spec.selector {
        VersionSelector::Number(n) => vault::Selector::VersionNumber(*n),
        VersionSelector::Stage(stage) => vault::Selector::Stage(*stage),
        VersionSelector::Name(name) => vault::Selector::VersionName(name.clone()),
    }
}
