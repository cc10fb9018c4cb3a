use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio::time::Instant;

use crate::error::MountError;
use crate::proto;

/// The attribute (and NodePublish secret) key under which kubelet hands over the pod's
/// service-account tokens (spec 3.7).
pub const SERVICE_ACCOUNT_TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

const POD_NAME_KEY: &str = "csi.storage.k8s.io/pod.name";
const POD_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pod.namespace";
const POD_UID_KEY: &str = "csi.storage.k8s.io/pod.uid";
const SERVICE_ACCOUNT_NAME_KEY: &str = "csi.storage.k8s.io/serviceAccount.name";

/// The `target_path` of every request of the secrets-store-sync-controller (a constant in
/// its `pkg/provider/provider_client.go`; it is never a directory on the node).
pub const SYNC_CONTROLLER_TARGET_PATH: &str = "/mnt/secrets-store";

/// The attribute every driver version adds to the SecretProviderClass parameters.
const SECRET_PROVIDER_CLASS_KEY: &str = "secretProviderClass";

/// Highest file mode the contract allows (0777).
const MAX_FILE_MODE: u32 = 0o777;

/// A mount request, typed and validated at the edge.
///
/// Credentials are separated from plain parameters: [`MountRequest::attributes`] never
/// holds the service-account tokens, which live only in [`MountRequest::service_account_tokens`]
/// as secret values; NodePublish secrets are secret values too.
#[derive(Debug)]
pub struct MountRequest {
    /// SecretProviderClass parameters and the driver's volume context, without credentials.
    pub attributes: BTreeMap<String, String>,
    /// The pod the volume belongs to, from the `csi.storage.k8s.io/*` attributes.
    pub pod: Pod,
    /// Tokens kubelet issued for the pod's service account, by audience (empty when the
    /// CSIDriver object requests none).
    pub service_account_tokens: ServiceAccountTokens,
    /// The NodePublish secrets (`nodePublishSecretRef`), without the tokens entry.
    pub node_publish_secrets: BTreeMap<String, SecretString>,
    /// The mode for every file.
    pub file_mode: FileMode,
    /// Versions the driver currently has (drivers before v1.6 send them on rotation).
    pub current_object_versions: Vec<ObjectVersion>,
    /// When the mount service must be done: the time the caller granted, less a margin for
    /// the answer to reach it ([`Deadline`]).
    pub deadline: Instant,
    /// The time the caller granted: its `grpc-timeout` (or the default), capped by
    /// configuration; for messages.
    pub timeout: Duration,
    /// Who sent the request, told from its shape.
    pub caller: Caller,
}

/// Who calls `Mount`: both speak the same contract, but only the driver mounts for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The Secrets Store CSI driver, for a pod's volume on this node: the pod attributes
    /// name the pod the files are for.
    Driver,
    /// The secrets-store-sync-controller (`kubernetes-sigs/secrets-store-sync-controller`),
    /// for a `SecretSync` object: the files become a Kubernetes Secret. Its pod attributes
    /// name the controller's own pod (in its own namespace), with the SecretSync's
    /// namespace and service account; its tokens, when it sends any, are bound to no pod.
    ///
    /// Told by the shape only the controller sends: `target_path` is
    /// [`SYNC_CONTROLLER_TARGET_PATH`] and there is no `secretProviderClass` attribute
    /// (which every driver version adds).
    SyncController,
}

impl Caller {
    /// Who sent a request of this target path and these attributes.
    ///
    /// The target path is the caller's own (kubelet's path for the driver, the constant
    /// [`SYNC_CONTROLLER_TARGET_PATH`] for the controller), while the attributes hold the
    /// SecretProviderClass's parameters, which the controller copies as they are. So a class
    /// could add a `secretProviderClass` parameter and make a controller's request look like
    /// a driver's (whose identity rules would then ask for a TokenRequest bound to the
    /// controller's pod in the tenant's namespace). When the marks disagree that way the
    /// request is refused, naming the parameter: a silent choice either way could be wrong.
    fn of(target_path: &str, attributes: &BTreeMap<String, String>) -> Result<Self, MountError> {
        let controllers_path = target_path == SYNC_CONTROLLER_TARGET_PATH;
        match (
            controllers_path,
            attributes.contains_key(SECRET_PROVIDER_CLASS_KEY),
        ) {
            (true, false) => Ok(Caller::SyncController),
            (true, true) => Err(MountError::invalid_argument(format!(
                "the request has the secrets-store-sync-controller's target path \
                 {SYNC_CONTROLLER_TARGET_PATH} and a {SECRET_PROVIDER_CLASS_KEY:?} attribute, \
                 which only the driver sets: the SecretProviderClass must not have a parameter \
                 named {SECRET_PROVIDER_CLASS_KEY:?} (the controller copies its parameters)"
            ))),
            (false, _) => Ok(Caller::Driver),
        }
    }

    /// A name for logs and spans: `driver` or `sync-controller`.
    pub fn as_str(self) -> &'static str {
        match self {
            Caller::Driver => "driver",
            Caller::SyncController => "sync-controller",
        }
    }
}

/// The pod a mount is for. Fields are absent when the driver does not send pod information
/// (`podInfoOnMount: false`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pod {
    /// `csi.storage.k8s.io/pod.namespace`.
    pub namespace: Option<String>,
    /// `csi.storage.k8s.io/pod.name`.
    pub name: Option<String>,
    /// `csi.storage.k8s.io/pod.uid`.
    pub uid: Option<String>,
    /// `csi.storage.k8s.io/serviceAccount.name`.
    pub service_account: Option<String>,
}

/// The file mode of the mounted files, 0 to 0o777.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMode(u32);

impl FileMode {
    /// A mode, if it is within 0..=0o777.
    pub fn new(mode: u32) -> Option<Self> {
        (mode <= MAX_FILE_MODE).then_some(Self(mode))
    }

    /// The numeric mode.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// An object's identifier and version, as the driver records them in the
/// SecretProviderClassPodStatus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectVersion {
    /// Object identifier.
    pub id: String,
    /// Object version.
    pub version: String,
}

/// A service-account token issued by kubelet for one audience.
#[derive(Clone)]
pub struct ServiceAccountToken {
    /// The JWT.
    pub token: SecretString,
    /// When kubelet says it expires (RFC 3339), if given.
    pub expiration_timestamp: Option<String>,
}

impl fmt::Debug for ServiceAccountToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccountToken")
            .field("token", &"[redacted]")
            .field("expiration_timestamp", &self.expiration_timestamp)
            .finish()
    }
}

/// The service-account tokens of a mount, by audience (`""` is the API server's default).
#[derive(Clone, Debug, Default)]
pub struct ServiceAccountTokens(BTreeMap<String, ServiceAccountToken>);

impl ServiceAccountTokens {
    /// The token for `audience`, if kubelet issued one.
    pub fn get(&self, audience: &str) -> Option<&ServiceAccountToken> {
        self.0.get(audience)
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The audiences present.
    pub fn audiences(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The tokens by audience.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ServiceAccountToken)> {
        self.0
            .iter()
            .map(|(audience, token)| (audience.as_str(), token))
    }
}

impl MountRequest {
    /// Translates the driver's request. `deadline` was already computed from the call's
    /// `grpc-timeout`.
    ///
    /// Error messages name the field and where parsing failed, but never quote the
    /// `secrets` field or the tokens, which carry credentials.
    pub fn from_proto(
        request: proto::MountRequest,
        deadline: impl Into<Deadline>,
    ) -> Result<Self, MountError> {
        let Deadline {
            at: deadline,
            granted: timeout,
        } = deadline.into();
        let mut attributes = parse_attributes(&request.attributes)?;
        let mut node_publish_secrets = parse_secrets(&request.secrets)?;
        let tokens_json = match node_publish_secrets.remove(SERVICE_ACCOUNT_TOKENS_KEY) {
            Some(from_secrets) => {
                attributes.remove(SERVICE_ACCOUNT_TOKENS_KEY);
                Some(from_secrets)
            }
            None => attributes
                .remove(SERVICE_ACCOUNT_TOKENS_KEY)
                .map(SecretString::from),
        };
        let service_account_tokens = match tokens_json {
            Some(json) => parse_tokens(json.expose_secret())?,
            None => ServiceAccountTokens::default(),
        };
        let file_mode = parse_permission(&request.permission)?;
        let pod = Pod {
            namespace: attributes.get(POD_NAMESPACE_KEY).cloned(),
            name: attributes.get(POD_NAME_KEY).cloned(),
            uid: attributes.get(POD_UID_KEY).cloned(),
            service_account: attributes.get(SERVICE_ACCOUNT_NAME_KEY).cloned(),
        };
        let caller = Caller::of(&request.target_path, &attributes)?;
        let current_object_versions = request
            .current_object_version
            .into_iter()
            .map(|v| ObjectVersion {
                id: v.id,
                version: v.version,
            })
            .collect();
        Ok(Self {
            attributes,
            pod,
            service_account_tokens,
            node_publish_secrets,
            file_mode,
            current_object_versions,
            deadline,
            timeout,
            caller,
        })
    }
}

/// When a mount must be answered: the time its caller granted and the instant the mount
/// service must be done by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// The time the caller granted.
    pub granted: Duration,
    /// When the mount service must be done.
    pub at: Instant,
}

impl Deadline {
    /// `granted` from now, answered a little before it (a twentieth, at most a second), so
    /// that the caller reads our message rather than its own timeout (tonic would
    /// otherwise answer Cancelled at the same instant).
    pub fn granted(granted: Duration) -> Self {
        let margin = (granted / 20).min(Duration::from_secs(1));
        Self {
            granted,
            at: Instant::now() + granted - margin,
        }
    }
}

/// Exactly `at`, the time left until it granted.
impl From<Instant> for Deadline {
    fn from(at: Instant) -> Self {
        Self {
            granted: at.saturating_duration_since(Instant::now()),
            at,
        }
    }
}

/// The largest request the server decodes (`max_decoding_message_size`, set in
/// [`crate::CsiProvider::into_service`]; tonic's default is 4 MiB): a SecretProviderClass's
/// parameters, the pod's attributes and tokens take a few KiB, and the OCI `secrets` list at
/// most 256 KiB. Each JSON document of a request is parsed within it, and the mounts in
/// flight and waiting hold at most this much each.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// The budget of the request's JSON documents: no larger than the request itself.
const REQUEST_JSON: bounded::ParseBudget = bounded::ParseBudget::new(MAX_REQUEST_BYTES);

/// Where a JSON document stopped parsing, without quoting it (the documents carry tokens).
fn json_position(err: &bounded::ParseError) -> String {
    err.to_string()
}

fn parse_attributes(json: &str) -> Result<BTreeMap<String, String>, MountError> {
    const PREFIX: &str =
        "failed to unmarshal SecretProviderClass parameters or attributes provided by driver";
    let JsonObject(object) = bounded::json::from_str(json, &REQUEST_JSON).map_err(|e| {
        MountError::invalid_argument(format!(
            "{PREFIX}: attributes must be a JSON object of strings ({})",
            json_position(&e)
        ))
    })?;
    // The value is not quoted: the tokens attribute carries credentials.
    object.strings().map_err(|(key, kind)| {
        MountError::invalid_argument(format!(
            "{PREFIX}: attribute {} must be a string, not {kind}",
            bounded::quote(&key),
        ))
    })
}

/// A JSON object read as its members in order: the map is built once, in bulk, from them
/// sorted (the driver's Go encoder sends the keys sorted already).
struct JsonObject(Members);

struct Members(Vec<(String, JsonString)>);

impl Members {
    /// The members as a map of strings (the last of a repeated key, as JSON decoders
    /// do), or the first member in key order whose value is not a string, and what it is.
    fn strings(mut self) -> Result<BTreeMap<String, String>, (String, &'static str)> {
        // Stable: of a repeated key the last stays last, and the map keeps it.
        self.0.sort_by(|a, b| a.0.cmp(&b.0));
        let mut strings = Vec::with_capacity(self.0.len());
        for (key, value) in self.0 {
            match value {
                JsonString::Text(text) => strings.push((key, text)),
                JsonString::Other(kind) => return Err((key, kind)),
            }
        }
        Ok(strings.into_iter().collect())
    }
}

impl<'de> Deserialize<'de> for JsonObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = JsonObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<JsonObject, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(member) = map.next_entry::<String, JsonString>()? {
                    members.push(member);
                }
                Ok(JsonObject(Members(members)))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A JSON object's value that should be a string: the string, or what it was instead (read
/// straight into the map, without a `serde_json::Value` of the document first).
enum JsonString {
    Text(String),
    Other(&'static str),
}

impl<'de> Deserialize<'de> for JsonString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = JsonString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<JsonString, E> {
                Ok(JsonString::Text(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<JsonString, E> {
                Ok(JsonString::Text(v))
            }
            fn visit_unit<E>(self) -> Result<JsonString, E> {
                Ok(JsonString::Other("null"))
            }
            fn visit_bool<E>(self, _: bool) -> Result<JsonString, E> {
                Ok(JsonString::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<JsonString, E> {
                Ok(JsonString::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<JsonString, E> {
                Ok(JsonString::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<JsonString, E> {
                Ok(JsonString::Other("a number"))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<JsonString, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(JsonString::Other("an array"))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<JsonString, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(JsonString::Other("an object"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

fn parse_secrets(json: &str) -> Result<BTreeMap<String, SecretString>, MountError> {
    let trimmed = json.trim();
    if trimmed.is_empty() || trimmed == "null" {
        return Ok(BTreeMap::new());
    }
    let JsonObject(object) = bounded::json::from_str(trimmed, &REQUEST_JSON).map_err(|e| {
        MountError::invalid_argument(format!(
            "failed to unmarshal node publish secrets: must be a JSON object of strings ({})",
            json_position(&e)
        ))
    })?;
    let secrets = object.strings().map_err(|(key, kind)| {
        MountError::invalid_argument(format!(
            "failed to unmarshal node publish secrets: entry {} must be a string, not {kind}",
            bounded::quote(&key),
        ))
    })?;
    Ok(secrets
        .into_iter()
        .map(|(key, value)| (key, SecretString::from(value)))
        .collect())
}

#[derive(Deserialize)]
struct RawToken {
    token: String,
    #[serde(rename = "expirationTimestamp", default)]
    expiration_timestamp: Option<String>,
}

fn parse_tokens(json: &str) -> Result<ServiceAccountTokens, MountError> {
    // Driver v1.0 always copies the key from the volume context, as "" when kubelet sent
    // no tokens (no `tokenRequests` in the CSIDriver).
    let trimmed = json.trim();
    if trimmed.is_empty() || trimmed == "null" {
        return Ok(ServiceAccountTokens::default());
    }
    let raw: BTreeMap<String, RawToken> =
        bounded::json::from_str(json, &REQUEST_JSON).map_err(|e| {
            MountError::invalid_argument(format!(
                "{SERVICE_ACCOUNT_TOKENS_KEY} must be a JSON object mapping each audience to \
             {{\"token\", \"expirationTimestamp\"}} ({})",
                json_position(&e)
            ))
        })?;
    Ok(ServiceAccountTokens(
        raw.into_iter()
            .map(|(audience, t)| {
                (
                    audience,
                    ServiceAccountToken {
                        token: SecretString::from(t.token),
                        expiration_timestamp: t.expiration_timestamp,
                    },
                )
            })
            .collect(),
    ))
}

fn parse_permission(permission: &str) -> Result<FileMode, MountError> {
    let trimmed = permission.trim();
    let mode = (!trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()))
        .then(|| trimmed.parse::<u32>().ok())
        .flatten()
        .and_then(FileMode::new);
    mode.ok_or_else(|| {
        MountError::invalid_argument(format!(
            "failed to unmarshal file permission: {} is not a decimal file mode \
             between 0 and 511 (0777)",
            bounded::quote(permission)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn request(attributes: &str, secrets: &str, permission: &str) -> proto::MountRequest {
        proto::MountRequest {
            attributes: attributes.into(),
            secrets: secrets.into(),
            target_path: "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/v/mount".into(),
            permission: permission.into(),
            current_object_version: vec![proto::ObjectVersion {
                id: "a".into(),
                version: "1".into(),
            }],
        }
    }

    fn translate(
        attributes: &str,
        secrets: &str,
        permission: &str,
    ) -> Result<MountRequest, MountError> {
        MountRequest::from_proto(request(attributes, secrets, permission), Instant::now())
    }

    #[test]
    fn translates_a_driver_request() {
        let attrs = serde_json::json!({
            "secrets": "- name: a\n",
            "csi.storage.k8s.io/pod.name": "p",
            "csi.storage.k8s.io/pod.namespace": "ns",
            "csi.storage.k8s.io/pod.uid": "u",
            "csi.storage.k8s.io/serviceAccount.name": "sa",
        })
        .to_string();
        let req = translate(&attrs, "{}", "420").unwrap();
        assert_eq!(req.file_mode.get(), 420);
        assert_eq!(req.pod.namespace.as_deref(), Some("ns"));
        assert_eq!(req.pod.service_account.as_deref(), Some("sa"));
        assert_eq!(req.attributes["secrets"], "- name: a\n");
        assert_eq!(req.current_object_versions.len(), 1);
        assert!(req.service_account_tokens.is_empty());
    }

    #[test]
    fn the_sync_controller_is_told_by_its_target_path_and_a_class_parameter_cannot_disguise_it() {
        let controller = serde_json::json!({
            "secrets": "- name: a\n",
            "csi.storage.k8s.io/pod.namespace": "ns",
        });
        let mut driver = controller.clone();
        driver["secretProviderClass"] = "spc".into();
        let translate = |target: &str, attributes: &serde_json::Value| {
            let mut r = request(&attributes.to_string(), "{}", "420");
            r.target_path = target.into();
            MountRequest::from_proto(r, Instant::now())
        };
        let at = |target: &str, attributes: &serde_json::Value| {
            translate(target, attributes).unwrap().caller
        };
        assert_eq!(
            at(SYNC_CONTROLLER_TARGET_PATH, &controller),
            Caller::SyncController
        );
        // The controller copies the class's parameters: one named secretProviderClass must
        // not turn its request into a driver's (which may request a token bound to the
        // controller's pod in the tenant's namespace). The disagreement is refused.
        let err = translate(SYNC_CONTROLLER_TARGET_PATH, &driver).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(
            err.message()
                .contains("must not have a parameter named \"secretProviderClass\""),
            "{err}"
        );
        // Kubelet's path is the driver's, with or without the attribute (a pod's own mount
        // path is never the target path).
        assert_eq!(
            at(
                "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/v/mount",
                &controller
            ),
            Caller::Driver
        );
        assert_eq!(at("/mnt/secrets-store/", &controller), Caller::Driver);
    }

    #[test]
    fn an_empty_tokens_attribute_means_no_tokens() {
        // What driver v1.0 sends when the CSIDriver has no tokenRequests.
        for tokens in ["", " ", "null"] {
            let attrs = serde_json::json!({ SERVICE_ACCOUNT_TOKENS_KEY: tokens }).to_string();
            let req = translate(&attrs, "null", "420").unwrap();
            assert!(req.service_account_tokens.is_empty(), "{tokens:?}");
            assert!(!req.attributes.contains_key(SERVICE_ACCOUNT_TOKENS_KEY));
        }
    }

    #[test]
    fn accepts_empty_and_null_node_publish_secrets() {
        for secrets in ["", "null", "{}", "  "] {
            assert!(
                translate("{}", secrets, "420")
                    .unwrap()
                    .node_publish_secrets
                    .is_empty()
            );
        }
    }

    #[test]
    fn a_repeated_attribute_keeps_its_last_value_and_the_first_non_string_in_key_order_is_named() {
        let attributes = parse_attributes(r#"{"b":"1","a":"2","b":"3"}"#).unwrap();
        assert_eq!(
            attributes.into_iter().collect::<Vec<_>>(),
            [("a".into(), "2".into()), ("b".into(), "3".into())]
        );
        let err = parse_attributes(r#"{"z":1,"m":"ok","a":true}"#).unwrap_err();
        assert!(
            err.to_string()
                .contains("attribute \"a\" must be a string, not a boolean"),
            "{err}"
        );
    }

    #[test]
    fn takes_tokens_from_secrets_first_and_removes_them_from_attributes() {
        let from_attr =
            r#"{"":{"token":"attr-token","expirationTimestamp":"2026-01-01T00:00:00Z"}}"#;
        let from_secret = r#"{"":{"token":"secret-token"}}"#;
        let attrs = serde_json::json!({ SERVICE_ACCOUNT_TOKENS_KEY: from_attr }).to_string();
        let secrets = serde_json::json!({ SERVICE_ACCOUNT_TOKENS_KEY: from_secret }).to_string();

        let req = translate(&attrs, &secrets, "420").unwrap();
        assert_eq!(
            req.service_account_tokens
                .get("")
                .unwrap()
                .token
                .expose_secret(),
            "secret-token"
        );
        assert!(!req.attributes.contains_key(SERVICE_ACCOUNT_TOKENS_KEY));
        assert!(req.node_publish_secrets.is_empty());

        let req = translate(&attrs, "{}", "420").unwrap();
        let token = req.service_account_tokens.get("").unwrap();
        assert_eq!(token.token.expose_secret(), "attr-token");
        assert!(!format!("{req:?}").contains("attr-token"));
    }

    #[test]
    fn refuses_malformed_fields_naming_them() {
        let cases = [
            ("[]", "{}", "420", "attributes must be a JSON object"),
            (
                "{\"a\": 1}",
                "{}",
                "420",
                "attribute \"a\" must be a string, not a number",
            ),
            ("{", "{}", "420", "unexpected end of input"),
            ("{}", "[1]", "420", "node publish secrets"),
            ("{}", "{}", "", "file permission"),
            ("{}", "{}", "512", "\"512\" is not a decimal file mode"),
            ("{}", "{}", "-1", "file permission"),
            ("{}", "{}", "0o644", "file permission"),
        ];
        for (attributes, secrets, permission, fragment) in cases {
            let err = translate(attributes, secrets, permission).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(
                err.message().contains(fragment),
                "{attributes} {permission}: {err}"
            );
        }
    }

    #[test]
    fn malformed_tokens_are_refused_without_quoting_them() {
        let attrs = serde_json::json!({ SERVICE_ACCOUNT_TOKENS_KEY: "{\"\":\"eyJsecret-token\"}" })
            .to_string();
        let err = translate(&attrs, "{}", "420").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains(SERVICE_ACCOUNT_TOKENS_KEY));
        assert!(!err.message().contains("eyJsecret-token"), "{err}");
    }
}
