//! A test-only HTTPS client and an independent OCI request signer written from the spec.
//!
//! Deliberately does not use `oci-csi-auth`: the emulator must be checked against the spec,
//! not against our own client code.

use std::sync::Arc;
use std::time::SystemTime;

use aws_lc_rs::digest;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{KeyPair, RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use oci_csi_testkit::{EmulatorHandle, Endpoint};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

pub type Body = Full<Bytes>;

/// A response read whole.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

pub fn tls_config(ca_pem: &str, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("add ca");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// One client connection (HTTP/1.1 or HTTP/2).
pub enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Conn {
    pub fn is_h2(&self) -> bool {
        matches!(self, Conn::H2(_))
    }

    pub async fn send(&mut self, req: Request<Body>) -> Result<Resp, hyper::Error> {
        let resp = match self {
            Conn::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Conn::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// Opens a connection to an endpoint; `alpn` empty for plain HTTP (instance metadata).
pub async fn connect(emu: &EmulatorHandle, endpoint: Endpoint, alpn: &[&[u8]]) -> Conn {
    let tcp = TcpStream::connect(emu.addr(endpoint))
        .await
        .expect("connect");
    if endpoint == Endpoint::Imds {
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        return Conn::H1(send);
    }
    let connector = tokio_rustls::TlsConnector::from(tls_config(emu.ca_pem(), alpn));
    let tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("tls handshake");
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    if h2 {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        Conn::H2(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        Conn::H1(send)
    }
}

/// Sends one request on a fresh HTTP/1.1 connection.
pub async fn send(emu: &EmulatorHandle, endpoint: Endpoint, req: Request<Body>) -> Resp {
    let mut conn = connect(emu, endpoint, &[b"http/1.1"]).await;
    conn.send(req).await.expect("request")
}

pub fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

pub fn sha256_b64(body: &[u8]) -> String {
    STANDARD.encode(digest::digest(&digest::SHA256, body))
}

pub fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("ascii"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

pub fn pem_der(pem: &str) -> Vec<u8> {
    let b64: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .join("");
    STANDARD.decode(b64).expect("pem base64")
}

pub fn spki_der(key: &RsaKeyPair) -> Vec<u8> {
    key.public_key().as_der().expect("spki").as_ref().to_vec()
}

pub fn rsa_sign(key: &RsaKeyPair, msg: &[u8]) -> String {
    let mut sig = vec![0u8; key.public_modulus_len()];
    key.sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), msg, &mut sig)
        .expect("sign");
    STANDARD.encode(sig)
}

/// A request to be signed, with the pieces that go into the signing string.
#[derive(Clone, Debug)]
pub struct Unsigned {
    pub method: &'static str,
    pub target: String,
    pub host: String,
    pub date: String,
    pub body: Vec<u8>,
    /// The `headers=` list; `None` = the SDK's default for the method.
    pub headers: Option<Vec<&'static str>>,
}

impl Unsigned {
    pub fn new(method: &'static str, target: &str, host: &str, date: SystemTime) -> Self {
        Self {
            method,
            target: target.into(),
            host: host.into(),
            date: http_date(date),
            body: Vec::new(),
            headers: None,
        }
    }

    fn header_list(&self) -> Vec<&'static str> {
        self.headers.clone().unwrap_or_else(|| {
            let mut h = vec!["date", "(request-target)", "host"];
            if matches!(self.method, "POST" | "PUT" | "PATCH") {
                h.extend(["content-length", "content-type", "x-content-sha256"]);
            }
            h
        })
    }

    fn value(&self, name: &str) -> String {
        match name {
            "date" => self.date.clone(),
            "(request-target)" => format!("{} {}", self.method.to_lowercase(), self.target),
            "host" => self.host.clone(),
            "content-length" => self.body.len().to_string(),
            "content-type" => "application/json".into(),
            "x-content-sha256" => sha256_b64(&self.body),
            _ => String::new(),
        }
    }

    pub fn signing_string(&self) -> String {
        self.header_list()
            .iter()
            .map(|h| format!("{h}: {}", self.value(h)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn authorization(&self, key_id: &str, signature: &str) -> String {
        format!(
            "Signature version=\"1\",headers=\"{}\",keyId=\"{key_id}\",algorithm=\"rsa-sha256\",signature=\"{signature}\"",
            self.header_list().join(" ")
        )
    }

    /// Signs and builds the HTTP request.
    pub fn sign(&self, key_id: &str, key: &RsaKeyPair) -> Request<Body> {
        let sig = rsa_sign(key, self.signing_string().as_bytes());
        self.build(&self.authorization(key_id, &sig))
    }

    /// Builds the HTTP request with the given Authorization value and the usual headers.
    pub fn build(&self, authorization: &str) -> Request<Body> {
        let mut b = Request::builder()
            .method(self.method)
            .uri(&self.target)
            .header("host", &self.host)
            .header("date", &self.date)
            .header("content-type", "application/json")
            .header("opc-request-id", "0123456789abcdef0123456789abcdef")
            .header("authorization", authorization);
        if matches!(self.method, "POST" | "PUT" | "PATCH") {
            b = b
                .header("content-length", self.body.len().to_string())
                .header("x-content-sha256", sha256_b64(&self.body));
        }
        b.body(Full::new(Bytes::from(self.body.clone())))
            .expect("request")
    }
}
