//! The mount's fetches: every secret and certificate entry through the byte budget,
//! concurrently under the fan-out, failing over where the class says.

use super::*;

impl<A, V, C> OciMount<A, V, C>
where
    A: IdentityService,
    V: Service<vault::SecretRequest, Error = vault::VaultError> + Clone + Send + Sync + 'static,
    V::Response: BundleResponse,
    V::Future: Send + 'static,
    C: crate::certificates::CertificateService,
{
    /// The certificate entries, fetched concurrently (bounded by the fan-out) with the
    /// mount's identity and within its byte bounds, their keys decoded through the gate of
    /// tenant keys; the first failure fails the mount.
    pub(super) async fn fetch_certificates(
        &self,
        params: &MountParameters,
        established: &auth::Established,
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
                    &targets.certificates,
                    &established.session,
                    request.deadline,
                );
                let client = self.certificates.clone();
                let permits = permits.clone();
                let mount = mount.clone();
                let keys = self.config.tenant_keys.clone();
                let namespace = namespace.clone();
                let (deadline, file_mode) = (request.deadline, request.file_mode);
                let expiry = self.config.certificate_expiry.clone();
                let span = tracing::info_span!(
                    "fetch certificate",
                    entry = spec.index,
                    certificate = %spec.id,
                    private_key = spec.private_key,
                    oci.request_id = tracing::field::Empty,
                    error.kind = tracing::field::Empty,
                );
                let record = span.clone();
                tracing::Instrument::instrument(
                    async move {
                        let _permit = permits.acquire_owned().await;
                        let held = match client.fetch(&mount, call).await {
                            Ok(held) => held,
                            Err(refused) => {
                                let error = refused_error(
                                    refused,
                                    |err| {
                                        record.record("error.kind", vault_kind(err).as_str());
                                        crate::certificates::fetch_error(spec, err)
                                    },
                                    &mount,
                                );
                                return (spec.index, Err(error));
                            }
                        };
                        if let Some(id) = &held.value.opc_request_id {
                            record.record("oci.request_id", id.as_str());
                        }
                        if held.over {
                            return (spec.index, Err(over_limit(&mount, spec)));
                        }
                        let made = async {
                            let key = crate::certificates::private_key(
                                spec,
                                &held.value,
                                &keys,
                                &namespace,
                                deadline,
                            )
                            .await?;
                            let (files, version) = crate::certificates::files(
                                spec,
                                &held.value,
                                key.as_ref(),
                                file_mode,
                                &expiry,
                                &namespace,
                            )?;
                            Ok((files, version, held.reservation))
                        };
                        (spec.index, made.await)
                    },
                    span,
                )
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
                let request = |base_url: &str, source: &SecretSource, deadline| {
                    vault::SecretRequest {
                        base_url: base_url.to_owned(),
                        session: established.session.clone(),
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
                    }
                };
                // With a failover region, the primary gets half of the time left, so the
                // failover has time to answer.
                let failover = targets.failover.as_ref().zip(spec.failover.as_ref()).map(
                    |(target, source)| (target.clone(), request(&target.secrets_endpoint, source, deadline)),
                );
                let primary_deadline = match failover {
                    Some(_) => {
                        let now = tokio::time::Instant::now();
                        now + deadline.saturating_duration_since(now) / 2
                    }
                    None => deadline,
                };
                let request = request(&targets.primary, &spec.source, primary_deadline);
                let stats = self.config.served.clone();
                let path = spec.path.clone();
                let vault = self.vault.clone();
                let permits = permits.clone();
                let mount = mount.clone();
                let span = tracing::info_span!(
                    "fetch secret",
                    entry = index,
                    secret = %spec.source.display(),
                    region = tracing::field::Empty,
                    lookup = tracing::field::Empty,
                    oci.request_id = tracing::field::Empty,
                    error.kind = tracing::field::Empty,
                );
                let fetch_span = span.clone();
                tracing::Instrument::instrument(async move {
                    let span = fetch_span;
                    let _permit = permits.acquire_owned().await;
                    let answer = match vault.fetch(&mount, request).await {
                        Err(Refused::Failed(err)) if failover.is_some() && fails_over(&err) => {
                            let Some((target, again)) = failover else {
                                return (index, Fetched::Failed(err));
                            };
                            tracing::warn!(
                                secret = %path,
                                region = %target.region,
                                error = %chain(&err),
                                "the primary region failed; reading the failover region"
                            );
                            span.record("region", "failover");
                            let answer = vault.fetch(&mount, again).await;
                            if answer.is_ok() {
                                stats.failover.fetch_add(1, Ordering::Relaxed);
                                tracing::info!(secret = %path, region = %target.region, "served by the failover region");
                            }
                            answer
                        }
                        answer => {
                            span.record("region", "primary");
                            if answer.is_ok() {
                                stats.primary.fetch_add(1, Ordering::Relaxed);
                            }
                            answer
                        }
                    };
                    match answer {
                        Ok(held) => {
                            let (bundle, lookup) = held.value.into_parts();
                            span.record("lookup", lookup.as_str());
                            if let Some(id) = &bundle.opc_request_id {
                                span.record("oci.request_id", id.as_str());
                            }
                            (index, Fetched::Bundle(bundle, lookup, held.reservation, held.over))
                        }
                        Err(Refused::Budget(refusal)) => (index, Fetched::Refused(refusal)),
                        Err(Refused::MountOver) => (index, Fetched::MountOver),
                        Err(Refused::Failed(err)) => {
                            span.record("error.kind", vault_kind(&err).as_str());
                            if let Some(id) = err.opc_request_id() {
                                span.record("oci.request_id", id);
                            }
                            (index, Fetched::Failed(err))
                        }
                    }
                }, span)
            })
            .collect();
        let mut bundles: Vec<Option<vault::SecretBundle>> =
            (0..params.secrets.len()).map(|_| None).collect();
        let mut reservations = Vec::new();
        let mut failures: Vec<(usize, vault::VaultError)> = Vec::new();
        let mut shared: Vec<(usize, cache::Lookup)> = Vec::new();
        while let Some((index, fetched)) = pending.next().await {
            match fetched {
                Fetched::Bundle(bundle, lookup, reservation, over) => {
                    if lookup.is_shared() {
                        shared.push((index, lookup));
                    }
                    bundles[index] = Some(bundle);
                    reservations.extend(reservation);
                    if over {
                        // Dropping `pending` cancels the fetches still running.
                        return Err(too_large(params, &bundles, self.config.max_total_bytes));
                    }
                }
                Fetched::MountOver => {
                    return Err(too_large(params, &bundles, self.config.max_total_bytes));
                }
                Fetched::Refused(refusal) => {
                    return Err(MountError::new(
                        ErrorKind::ResourceExhausted,
                        refusal.to_string(),
                    ));
                }
                Fetched::Failed(err) => {
                    let permanent = !err.is_retryable();
                    failures.push((index, err));
                    // A permanent failure fails the mount whatever the others give:
                    // stop their retries now.
                    if permanent {
                        break;
                    }
                }
            }
        }
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

/// What one fetch gave.
pub(super) enum Fetched {
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
