//! Removing the provider's startup taint from its own node (`--remove-node-taint`), over the
//! one transport with the provider's own service account. Only the named node and only the
//! named key's `NoSchedule` and `NoExecute` taints are touched: one JSON patch that first
//! `test`s the taint list as it was read, so an edit made in between (the kubelet, an
//! autoscaler, an operator) fails the patch instead of being overwritten.

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use transport::HttpService;

use crate::PrincipalsConfig;
use crate::error::{AuthError, Endpoint};
use crate::kube::KubeApi;
use crate::remote::segment;

/// The effects a startup taint is removed with: what keeps pods off the node.
const EFFECTS: [&str; 2] = ["NoSchedule", "NoExecute"];

/// The most a Node's JSON may be (its status lists images and volumes; a large node's
/// is some hundreds of KiB).
const MAX_NODE_BYTES: usize = 4 * 1024 * 1024;

/// One node's startup taint, removed through the Kubernetes API.
#[derive(Clone, Debug)]
pub struct NodeTaint {
    kube: KubeApi,
    node: String,
    key: String,
}

/// What a removal found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaintRemoval {
    /// The taint was there and is gone: its effects.
    Removed(Vec<String>),
    /// The node has no such taint (removed already, or never set): nothing was patched.
    Absent,
}

impl NodeTaint {
    /// The taint `key` of node `node`, with the Kubernetes API the principals use.
    pub fn new(
        config: &PrincipalsConfig,
        http: HttpService,
        node: &str,
        key: &str,
    ) -> Result<Self, AuthError> {
        let kube = KubeApi::new(
            http,
            config.kubernetes_api.as_deref(),
            config.kubernetes_service_host.as_deref(),
            config.kubernetes_service_port,
            config.kubeconfig.as_deref(),
            &config.service_account_token_file,
        )?
        .ok_or_else(|| {
            AuthError::Config(format!(
                "removing the taint {key} from node {node} needs the kubernetes api \
                 (kubernetes_api, kubeconfig or kubernetes_service_host)"
            ))
        })?;
        Ok(Self {
            kube,
            node: node.to_owned(),
            key: key.to_owned(),
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The taint's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Reads the node and, when it carries the taint, removes it with one JSON patch whose
    /// `test` guards the taint list read. A concurrent edit makes the API server refuse
    /// the patch (422, or 409): `AuthError::Status` with that status, to read again.
    pub async fn remove(&self, deadline: tokio::time::Instant) -> Result<TaintRemoval, AuthError> {
        let uri = format!("{}/api/v1/nodes/{}", self.kube.base(), segment(&self.node));
        let operation = format!("reading node {}", self.node);
        let mut request = self.kube.request(Method::GET, uri.clone(), None)?;
        request
            .extensions_mut()
            .insert(transport::MaxBodyBytes(MAX_NODE_BYTES));
        let response = self.kube.send(request, &operation, deadline).await?;
        if response.status() != StatusCode::OK {
            return Err(crate::kube::status_error(operation, &response));
        }
        let taints = taints_of(response.body(), &operation)?;
        let (removed, kept): (Vec<&Value>, Vec<&Value>) =
            taints.iter().partition(|t| self.matches(t));
        if removed.is_empty() {
            return Ok(TaintRemoval::Absent);
        }
        let effects = removed
            .iter()
            .filter_map(|t| t["effect"].as_str().map(str::to_owned))
            .collect();
        let patch = json!([
            { "op": "test", "path": "/spec/taints", "value": taints },
            { "op": "replace", "path": "/spec/taints", "value": kept },
        ]);
        let operation = format!("removing the taint {} from node {}", self.key, self.node);
        let mut request = self
            .kube
            .request(Method::PATCH, uri, Some(patch.to_string()))?;
        request.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/json-patch+json"),
        );
        let response = self.kube.send(request, &operation, deadline).await?;
        if response.status() != StatusCode::OK {
            return Err(crate::kube::status_error(operation, &response));
        }
        Ok(TaintRemoval::Removed(effects))
    }

    fn matches(&self, taint: &Value) -> bool {
        taint["key"].as_str() == Some(self.key.as_str())
            && taint["effect"]
                .as_str()
                .is_some_and(|e| EFFECTS.contains(&e))
    }
}

/// `spec.taints` of a Node's JSON, each taint as the server wrote it (the `test` compares
/// them whole, `timeAdded` included).
fn taints_of(body: &[u8], operation: &str) -> Result<Vec<Value>, AuthError> {
    #[derive(Deserialize, Default)]
    struct Spec {
        #[serde(default)]
        taints: Vec<Value>,
    }
    #[derive(Deserialize)]
    struct Node {
        #[serde(default)]
        spec: Spec,
    }
    let node: Node = bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len()))
        .map_err(|e| AuthError::MalformedResponse {
            endpoint: Endpoint::Kubernetes,
            operation: operation.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(node.spec.taints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_are_read_whole_and_a_node_without_any_has_none() {
        let body = br#"{"kind":"Node","spec":{"podCIDR":"10.0.0.0/24","taints":[{"key":"a","effect":"NoSchedule","timeAdded":"2024-01-01T00:00:00Z"}]},"status":{"images":[]}}"#;
        let taints = taints_of(body, "reading").unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0]["timeAdded"], "2024-01-01T00:00:00Z");
        assert!(
            taints_of(br#"{"kind":"Node","spec":{}}"#, "reading")
                .unwrap()
                .is_empty()
        );
        assert!(
            taints_of(br#"{"kind":"Node"}"#, "reading")
                .unwrap()
                .is_empty()
        );
        assert!(taints_of(b"not json", "reading").is_err());
    }
}
