//! `--remove-node-taint <key>`: a node that waits for its provider. On a new node, pods
//! scheduled before the provider serves fail their first mounts ("provider not found") and
//! back off; with a startup taint on new nodes (Karpenter's `startupTaints`, a node pool's
//! taints), no pod that does not tolerate it lands there until the provider removes it. The
//! removal waits until the socket serves and the readiness self-check (`Version` over the
//! socket) passes, then patches the provider's own node (`server.node_name`, from the
//! downward API) through the one transport, retrying with backoff until it succeeds. A
//! refusal (RBAC) is logged as an error and counted, and serving goes on.

use std::sync::Arc;
use std::time::Duration;

use auth::{AuthError, NodeTaint, TaintRemoval};
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::ready::Readiness;

/// The first wait after a failed attempt; each failure doubles it up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often readiness is checked until it passes.
const READY_POLL: Duration = Duration::from_millis(200);
/// The budget of one attempt (a read and a patch).
const ATTEMPT: Duration = Duration::from_secs(30);

/// What one attempt came to, as the metric's `result` label says it.
fn result_of(outcome: &Result<TaintRemoval, AuthError>) -> &'static str {
    match outcome {
        Ok(TaintRemoval::Removed(_)) => "removed",
        Ok(TaintRemoval::Absent) => "absent",
        Err(AuthError::Status { status: 403, .. }) => "forbidden",
        Err(AuthError::Status {
            status: 409 | 422, ..
        }) => "conflict",
        Err(_) => "error",
    }
}

/// Removes the taint once the provider is ready; returns when it is gone or at `stop`.
pub(crate) async fn remove_when_ready(
    taint: NodeTaint,
    ready: Arc<Readiness>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let (node, key) = (taint.node().to_owned(), taint.key().to_owned());
    metrics.set_node_taint_pending(true);
    tracing::info!(%node, taint = %key, "the startup taint is removed once the provider is ready");
    let stopped = |stop: &mut watch::Receiver<bool>, after: Duration| {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(after) => false,
                _ = stop.wait_for(|s| *s) => true,
            }
        }
    };
    while ready.check().await.is_err() {
        if stopped(&mut stop, READY_POLL).await {
            return;
        }
    }
    let mut backoff = FIRST_BACKOFF;
    loop {
        let outcome = taint.remove(tokio::time::Instant::now() + ATTEMPT).await;
        let result = result_of(&outcome);
        metrics.node_taint_attempt(result);
        let wait = match outcome {
            Ok(TaintRemoval::Removed(effects)) => {
                tracing::info!(%node, taint = %key, effects = %effects.join(","), "removed the startup taint: pods that mount secrets may now be scheduled here");
                break;
            }
            Ok(TaintRemoval::Absent) => {
                tracing::info!(%node, taint = %key, "the node has no such NoSchedule or NoExecute taint: nothing to remove");
                break;
            }
            Err(error) => {
                let error = vault::ErrorChain(&error).to_string();
                match result {
                    "forbidden" => tracing::error!(
                        %node, taint = %key, %error, retry_in = ?backoff,
                        "cannot remove the startup taint: the provider's service account may not get or patch \
                         nodes (grant it, e.g. the chart's provider.removeNodeTaint), or the chart's \
                         admission policy refused the change (its token must name this node: the error \
                         says which); the provider keeps serving"
                    ),
                    "conflict" => tracing::info!(
                        %node, taint = %key, %error, retry_in = ?backoff,
                        "the node changed while the taint was being removed; reading it again"
                    ),
                    _ => tracing::warn!(
                        %node, taint = %key, %error, retry_in = ?backoff,
                        "cannot remove the startup taint yet; the provider keeps serving"
                    ),
                }
                // A conflict backs off too: a 422 may also be a patch the server refuses
                // for good, which must not become a busy loop.
                let wait = jittered(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        if stopped(&mut stop, wait).await {
            return;
        }
    }
    metrics.set_node_taint_pending(false);
}

/// `backoff` less up to a fifth, so the nodes of a large cluster do not retry in step.
fn jittered(backoff: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = aws_lc_rs::rand::fill(&mut byte);
    backoff - backoff / 5 * u32::from(byte[0]) / 255
}

/// A taint key as Kubernetes validates it (a qualified name): an optional DNS-subdomain
/// prefix and `/`, then 1 to 63 characters, alphanumeric at both ends, `-`, `_` and `.`
/// between.
pub(crate) fn check_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(
            "not a taint key: a name of 1 to 63 letters, digits, '-', '_' or '.', \
                    beginning and ending with a letter or digit, optionally after a DNS prefix and '/'",
        );
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.starts_with(alnum)
            && l.ends_with(alnum)
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    if key.contains('/') && (prefix.len() > 253 || !prefix.split('.').all(label_ok)) {
        return Err("not a taint key: its prefix before '/' is not a lowercase DNS subdomain");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_labelled_by_what_the_api_answered() {
        let status = |status| {
            Err(AuthError::Status {
                endpoint: auth::Endpoint::Kubernetes,
                operation: "patching".to_owned(),
                status,
                detail: None,
            })
        };
        assert_eq!(result_of(&Ok(TaintRemoval::Removed(vec![]))), "removed");
        assert_eq!(result_of(&Ok(TaintRemoval::Absent)), "absent");
        assert_eq!(result_of(&status(403)), "forbidden");
        assert_eq!(result_of(&status(422)), "conflict");
        assert_eq!(result_of(&status(409)), "conflict");
        assert_eq!(result_of(&status(503)), "error");
    }

    #[test]
    fn the_jitter_only_shortens_the_wait_and_by_a_fifth_at_most() {
        for _ in 0..100 {
            let wait = jittered(Duration::from_secs(10));
            assert!(
                wait <= Duration::from_secs(10) && wait >= Duration::from_secs(8),
                "{wait:?}"
            );
        }
    }
}
