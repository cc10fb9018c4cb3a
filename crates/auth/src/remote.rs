//! Sending auth's own requests (Kubernetes API, proxymux, instance metadata, federation)
//! over the one transport, with the mount's deadline and errors that name the endpoint.

use bytes::Bytes;
use http::{Request, Response};
use tower::ServiceExt as _;
use transport::{Deadline, HttpService};

use crate::error::{AuthError, Endpoint};
use zeroize::Zeroizing;

/// Sends `request` with `deadline` over `http`.
pub(crate) async fn send(
    http: &HttpService,
    mut request: Request<Bytes>,
    deadline: tokio::time::Instant,
    endpoint: Endpoint,
    operation: &str,
) -> Result<Response<Bytes>, AuthError> {
    request.extensions_mut().insert(Deadline(deadline));
    http.clone()
        .oneshot(request)
        .await
        .map_err(|source| AuthError::Transport {
            endpoint,
            operation: operation.to_owned(),
            source,
        })
}

/// The `code` (OCI) or `reason` (Kubernetes) member of an error body, if it is short
/// printable text. Bodies are not echoed whole: they are not ours to log.
pub(crate) fn error_detail(body: &[u8]) -> Option<String> {
    let value: serde_json::Value =
        bounded::json::from_slice(body, &bounded::ParseBudget::new(body.len())).ok()?;
    let text = value
        .get("code")
        .and_then(|c| c.as_str())
        .or_else(|| value.get("reason").and_then(|r| r.as_str()))?;
    (text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    .then(|| text.to_owned())
}

/// Builds a request, mapping the (static, so unreachable) builder error to `Internal`.
pub(crate) fn build(
    builder: http::request::Builder,
    body: impl Into<Bytes>,
) -> Result<Request<Bytes>, AuthError> {
    builder
        .body(body.into())
        .map_err(|_| AuthError::Config("an endpoint url does not form a valid request uri".into()))
}

/// Percent-encodes a path segment (Kubernetes names are DNS labels, but the mount's
/// attributes are not ours to trust).
pub(crate) fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// An `application/x-www-form-urlencoded` body of `fields`, in order: letters, digits and
/// `*-._` as they are, a space as `+`, every other byte `%XX` (so Base64's `+/=` are
/// escaped, as Go's `url.Values.Encode` does). Holds what the fields hold: a caller with
/// secret fields keeps it zeroizing.
pub(crate) fn form_urlencoded(fields: &[(&str, &str)]) -> Zeroizing<String> {
    let mut out = Zeroizing::new(String::with_capacity(
        fields.iter().map(|(k, v)| k.len() + 3 * v.len() + 2).sum(),
    ));
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        for (j, part) in [name, value].into_iter().enumerate() {
            if j > 0 {
                out.push('=');
            }
            for byte in part.bytes() {
                match byte {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                        out.push(char::from(byte));
                    }
                    b' ' => out.push('+'),
                    _ => out.push_str(&format!("%{byte:02X}")),
                }
            }
        }
    }
    out
}

/// `host` as it goes in a URL authority: IPv6 addresses bracketed.
pub(crate) fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// A fresh `opc-request-id`, the one generator of the workspace: `groups` groups of 16
/// random bytes as 32 lower-case hex digits, joined by `/` (the Secrets API takes one group,
/// the proxymux three, spec 3.3). `None` if the system RNG fails; the id is for
/// correlation only.
pub fn opc_request_id(groups: usize) -> Option<String> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(groups * 33);
    for group in 0..groups {
        let mut bytes = [0u8; 16];
        aws_lc_rs::rand::fill(&mut bytes).ok()?;
        if group > 0 {
            id.push('/');
        }
        for byte in bytes {
            id.push(char::from(HEX[usize::from(byte >> 4)]));
            id.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    Some(id)
}

#[cfg(test)]
mod request_id_tests {
    use super::{form_urlencoded, opc_request_id};

    #[test]
    fn form_values_escape_base64_and_reserved_bytes() {
        let body = form_urlencoded(&[("public_key", "MII+/a=="), ("t", "a b&c=d~é")]);
        assert_eq!(
            body.as_str(),
            "public_key=MII%2B%2Fa%3D%3D&t=a+b%26c%3Dd%7E%C3%A9"
        );
    }

    #[test]
    fn request_ids_are_groups_of_32_hex_digits() {
        let proxymux = opc_request_id(3).unwrap();
        let groups: Vec<_> = proxymux.split('/').collect();
        assert_eq!(groups.len(), 3);
        for group in &groups {
            assert_eq!(group.len(), 32);
            assert!(
                group
                    .bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            );
        }
        assert_ne!(groups[0], groups[1]);
        assert_eq!(opc_request_id(1).unwrap().len(), 32);
    }
}
