//! Kubernetes Nodes at the emulator's Kubernetes endpoint: `GET /api/v1/nodes/{name}` and
//! `PATCH` with a JSON patch (RFC 6902: `test`, `add`, `remove`, `replace`), as the API
//! server answers them: a failed `test` is 422 and changes nothing, an empty taint list
//! is dropped from the object. Tests may forbid verbs (RBAC without the rule: 403) and
//! make "someone else" add a taint right after the provider's next read (the race the
//! provider's `test` op guards against).

use std::collections::{BTreeMap, BTreeSet};

use http::request::Parts;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::kube_status;
use crate::server::Reply;
use crate::state::{Shared, derived_uid, rfc3339};

/// A node and its taints.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSeed {
    /// The node's name.
    pub name: String,
    /// Its taints, in order.
    pub taints: Vec<TaintSeed>,
}

/// One taint (`NoExecute` taints get a `timeAdded`, as the API server sets it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaintSeed {
    /// Its key, e.g. `node.example.com/agent-not-ready`.
    pub key: String,
    /// Its value, if any.
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl NodeSeed {
    /// A node with `taints` as (key, effect).
    pub fn new(name: &str, taints: &[(&str, &str)]) -> Self {
        Self {
            name: name.to_owned(),
            taints: taints
                .iter()
                .map(|(key, effect)| TaintSeed {
                    key: (*key).to_owned(),
                    value: None,
                    effect: (*effect).to_owned(),
                })
                .collect(),
        }
    }
}

/// The nodes, what tests forbid, and edits pending.
#[derive(Debug, Default)]
pub(crate) struct Nodes {
    /// Each node's object as the API server would answer it.
    pub(crate) objects: BTreeMap<String, Value>,
    /// Verbs (`get`, `patch`) the provider's service account may not use on nodes.
    pub(crate) forbidden: BTreeSet<String>,
    /// Taints added to a node right after the next GET of it.
    pub(crate) after_next_read: BTreeMap<String, Vec<Value>>,
    resource_version: u64,
}

impl Nodes {
    pub(crate) fn new(seeds: &[NodeSeed], now: std::time::SystemTime) -> Self {
        let mut nodes = Self::default();
        for seed in seeds {
            let taints: Vec<Value> = seed.taints.iter().map(|t| taint(t, now)).collect();
            let mut object = json!({
                "kind": "Node",
                "apiVersion": "v1",
                "metadata": {
                    "name": seed.name,
                    "uid": derived_uid("", &seed.name),
                    "labels": { "kubernetes.io/hostname": seed.name },
                },
                "spec": { "podCIDR": "10.244.0.0/24" },
                "status": { "nodeInfo": { "kubeletVersion": "v1.33.0" } },
            });
            set_taints(&mut object, taints);
            nodes.objects.insert(seed.name.clone(), object);
            nodes.bump(&seed.name);
        }
        nodes
    }

    fn bump(&mut self, name: &str) {
        self.resource_version += 1;
        if let Some(object) = self.objects.get_mut(name) {
            object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        }
    }

    /// A node's taints now (empty when it has none).
    pub(crate) fn taints(&self, name: &str) -> Option<Vec<Value>> {
        let object = self.objects.get(name)?;
        Some(
            object["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        )
    }

    /// Adds `taint` to the node, as another controller would.
    pub(crate) fn add_taint(&mut self, name: &str, taint: Value) -> bool {
        let Some(mut taints) = self.taints(name) else {
            return false;
        };
        taints.push(taint);
        if let Some(object) = self.objects.get_mut(name) {
            set_taints(object, taints);
        }
        self.bump(name);
        true
    }
}

/// A taint as the API server writes it.
pub(crate) fn taint(seed: &TaintSeed, now: std::time::SystemTime) -> Value {
    let mut taint = json!({ "key": seed.key, "effect": seed.effect });
    if let Some(value) = &seed.value {
        taint["value"] = json!(value);
    }
    if seed.effect == "NoExecute" {
        let mut at = rfc3339(now);
        if let Some(dot) = at.find('.') {
            at.replace_range(dot..at.len() - 1, "");
        }
        taint["timeAdded"] = json!(at);
    }
    taint
}

/// `spec.taints`, left out when empty (the API server's `omitempty`).
fn set_taints(object: &mut Value, taints: Vec<Value>) {
    if let Some(spec) = object["spec"].as_object_mut() {
        if taints.is_empty() {
            spec.remove("taints");
        } else {
            spec.insert("taints".to_owned(), Value::from(taints));
        }
    }
}

fn forbidden(verb: &str, name: &str) -> Reply {
    kube_status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!(
            "nodes \"{name}\" is forbidden: User \"system:serviceaccount:kube-system:oci-secrets-store-provider\" \
             cannot {verb} resource \"nodes\" in API group \"\" at the cluster scope"
        ),
    )
}

fn not_found(name: &str) -> Reply {
    kube_status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("nodes \"{name}\" not found"),
    )
}

/// `GET` or `PATCH /api/v1/nodes/{name}`.
pub(crate) fn handle(shared: &Shared, parts: &Parts, name: &str, body: &[u8]) -> Reply {
    let verb = if parts.method == Method::GET {
        "get"
    } else {
        "patch"
    };
    let mut st = shared.state();
    let nodes = &mut st.nodes;
    if nodes.forbidden.contains(verb) {
        return forbidden(verb, name);
    }
    let Some(object) = nodes.objects.get(name).cloned() else {
        return not_found(name);
    };
    if parts.method == Method::GET {
        for taint in nodes.after_next_read.remove(name).unwrap_or_default() {
            nodes.add_taint(name, taint);
        }
        return Reply::json(StatusCode::OK, &object);
    }
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type.split(';').next() != Some("application/json-patch+json") {
        return kube_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!("the body of the request was in an unknown format: {content_type}"),
        );
    }
    let Ok(Value::Array(ops)) = serde_json::from_slice::<Value>(body) else {
        return kube_status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the patch is not a JSON array",
        );
    };
    let mut patched = object;
    if let Err(message) = ops.iter().try_for_each(|op| apply(&mut patched, op)) {
        return kube_status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message);
    }
    let taints = patched["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    set_taints(&mut patched, taints);
    nodes.objects.insert(name.to_owned(), patched);
    nodes.bump(name);
    let answer = nodes.objects.get(name).cloned().unwrap_or_default();
    drop(st);
    shared
        .counters
        .update(|s| *s.node_patches.entry(name.to_owned()).or_default() += 1);
    Reply::json(StatusCode::OK, &answer)
}

/// One JSON-patch operation on `doc` (RFC 6902; `move` and `copy` are not needed here).
fn apply(doc: &mut Value, op: &Value) -> Result<(), String> {
    let path = op["path"].as_str().ok_or("an operation without a path")?;
    let kind = op["op"].as_str().ok_or("an operation without an op")?;
    match kind {
        "test" => {
            if doc.pointer(path) == Some(&op["value"]) {
                Ok(())
            } else {
                Err(format!("testing value {path} failed: test failed"))
            }
        }
        "replace" => {
            let slot = doc.pointer_mut(path).ok_or_else(|| {
                format!("replace operation does not apply: doc is missing path: {path}")
            })?;
            *slot = op["value"].clone();
            Ok(())
        }
        "remove" | "add" => {
            let (parent, last) = path.rsplit_once('/').ok_or("a path without a /")?;
            let container = doc.pointer_mut(parent).ok_or_else(|| {
                format!("{kind} operation does not apply: doc is missing path: {parent}")
            })?;
            match (container, kind) {
                (Value::Object(map), "remove") => map.remove(last).map(|_| ()).ok_or_else(|| {
                    format!("remove operation does not apply: doc is missing key: {path}")
                }),
                (Value::Object(map), _) => {
                    map.insert(last.to_owned(), op["value"].clone());
                    Ok(())
                }
                (Value::Array(list), "remove") => {
                    let at: usize = last.parse().map_err(|_| format!("bad index in {path}"))?;
                    (at < list.len())
                        .then(|| {
                            list.remove(at);
                        })
                        .ok_or_else(|| format!("remove operation does not apply: no index {at}"))
                }
                (Value::Array(list), _) => {
                    let at = if last == "-" {
                        list.len()
                    } else {
                        last.parse().map_err(|_| format!("bad index in {path}"))?
                    };
                    (at <= list.len())
                        .then(|| list.insert(at, op["value"].clone()))
                        .ok_or_else(|| format!("add operation does not apply: no index {at}"))
                }
                _ => Err(format!("{path}: not a container")),
            }
        }
        other => Err(format!("unsupported operation {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_patch_tests_guard_the_replace() {
        let mut doc = json!({"spec": {"taints": [{"key": "a"}, {"key": "b"}]}});
        let ops = json!([
            {"op": "test", "path": "/spec/taints", "value": [{"key": "a"}, {"key": "b"}]},
            {"op": "replace", "path": "/spec/taints", "value": [{"key": "b"}]},
        ]);
        for op in ops.as_array().unwrap() {
            apply(&mut doc, op).unwrap();
        }
        assert_eq!(doc["spec"]["taints"], json!([{"key": "b"}]));
        let stale = json!({"op": "test", "path": "/spec/taints", "value": [{"key": "a"}]});
        assert!(apply(&mut doc, &stale).unwrap_err().contains("test failed"));
        apply(
            &mut doc,
            &json!({"op": "add", "path": "/spec/taints/-", "value": {"key": "c"}}),
        )
        .unwrap();
        apply(&mut doc, &json!({"op": "remove", "path": "/spec/taints/0"})).unwrap();
        assert_eq!(doc["spec"]["taints"], json!([{"key": "c"}]));
    }
}
