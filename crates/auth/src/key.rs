//! RSA private keys: loading from every PEM form the Go provider accepts, signing, and
//! the public-key encodings OCI asks for.

use std::fmt;

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_SHA256};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockCipherDecrypt, BlockModeDecrypt, KeyIvInit};
use md5::{Digest as _, Md5};
use pkcs8::der::asn1::ObjectIdentifier;
use pkcs8::pkcs5::{self, pbes2};
use pkcs8::{EncryptedPrivateKeyInfoRef, PrivateKeyInfoRef};
use zeroize::{Zeroize as _, Zeroizing};

/// `rsaEncryption` (RFC 8017 appendix A.1), the only PKCS#8 algorithm we sign with.
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// Upper bound on PBKDF2 iterations in an encrypted PKCS#8 key. OpenSSL writes 2048 by
/// default and current guidance is around 600 000; anything far beyond is more likely a
/// key crafted to stall the node-wide provider than a real one.
const MAX_PBKDF2_ITERATIONS: u32 = 1_000_000;

/// Upper bound on the memory scrypt may need (`128 * r * N` bytes) for an encrypted PKCS#8
/// key, for the same reason. OpenSSL's default (N = 16384, r = 8) needs 16 MiB, and that is
/// also the most one tenant's key may make the shared provider allocate.
const MAX_SCRYPT_MEMORY: u64 = 16 * 1024 * 1024;

/// Upper bound on scrypt's work, `128 * r * N * p` (memory times the parallelisation
/// parameter, which runs the whole derivation `p` times): OpenSSL's default twice over,
/// about 0.1 s of one core here.
const MAX_SCRYPT_WORK: u64 = 2 * MAX_SCRYPT_MEMORY;

/// Upper bound on scrypt's parallelisation parameter `p`.
const MAX_SCRYPT_PARALLELISM: u16 = 16;

/// Largest RSA key a tenant may hand us (a user API key, a certificate's key): signing cost
/// grows with the cube of the size, and OCI itself issues and accepts at most 4096 bits.
pub(crate) const MAX_RSA_BITS: usize = 4096;

/// Longest PEM label or cipher name we repeat in an error message; longer ones are cut.
const MAX_ECHO_LEN: usize = 64;

/// Why a private key could not be loaded or used.
///
/// Messages never contain key bytes or the passphrase: they may end up in a gRPC status
/// that the kubelet logs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The data holds no `-----BEGIN ...-----` line.
    #[error("PEM data was not found in the private key data")]
    NoPem,
    /// The first PEM block is cut short or its body is not Base64.
    #[error("malformed PEM block: {0}")]
    MalformedPem(&'static str),
    /// The key is encrypted and no passphrase (or an empty one) was given.
    #[error("the private key is encrypted but no passphrase was given")]
    PassphraseRequired,
    /// Decryption produced garbage: the passphrase is wrong or the key is corrupt.
    #[error("cannot decrypt the private key: wrong passphrase or corrupt key")]
    WrongPassphrase,
    /// The key is encrypted with a cipher or scheme we do not implement.
    #[error("unsupported private key encryption: {0}")]
    UnsupportedEncryption(String),
    /// The encryption parameters would make decryption unreasonably expensive.
    #[error("private key encryption parameters exceed limits: {0}")]
    EncryptionTooExpensive(String),
    /// The key is a valid key of another algorithm (EC, Ed25519, DSA, ...).
    #[error("unsupported key algorithm {0}: only RSA keys can sign OCI requests")]
    NotRsa(String),
    /// The (decrypted) block is neither a PKCS#1 `RSAPrivateKey` nor a PKCS#8
    /// `PrivateKeyInfo`.
    #[error("the {label} PEM block is not an RSA private key in PKCS#1 or PKCS#8 form")]
    Unparseable {
        /// The PEM label, e.g. `RSA PRIVATE KEY`.
        label: String,
    },
    /// The key is of an algorithm certificate files are not written for.
    #[error(
        "the private key's algorithm is {0}; RSA and ECDSA (P-256, P-384, P-521) are supported"
    )]
    UnsupportedAlgorithm(String),
    /// The block is no private key form this provider reads.
    #[error(
        "the {label} PEM block is not a private key in PKCS#8, encrypted PKCS#8, PKCS#1 or SEC1 form"
    )]
    NotAKey {
        /// The PEM label.
        label: String,
    },
    /// The RSA key is larger than the provider signs with or accepts from a tenant.
    #[error("the RSA key has {0} bits; at most 4096 are accepted")]
    RsaTooLarge(usize),
    /// aws-lc parsed the key but refused it (too small, inconsistent, ...).
    #[error("the RSA private key was rejected")]
    Rejected(#[source] aws_lc_rs::error::KeyRejected),
    /// Key generation or signing failed inside aws-lc.
    #[error("RSA {0} failed")]
    Crypto(&'static str, #[source] aws_lc_rs::error::Unspecified),
}

/// An RSA private key that signs OCI requests with RSASSA-PKCS1-v1_5 and SHA-256.
///
/// The private half lives inside aws-lc, which clears it when the key is dropped; every
/// intermediate copy we make while decoding (Base64 text, DER, decrypted bytes) is held in
/// [`Zeroizing`] buffers. `Debug` shows the public fingerprint only.
///
/// Loading (and especially decrypting) a key is CPU work measured in milliseconds; call it
/// from a blocking context when it is on a request path.
pub struct PrivateKey {
    pair: KeyPair,
    /// DER `SubjectPublicKeyInfo`; public, so a plain `Vec`.
    spki_der: Vec<u8>,
}

impl PrivateKey {
    /// Loads an RSA private key from PEM text, as the Go provider does (spec 5.2).
    ///
    /// Only the first PEM block is used. Accepted forms: PKCS#1 (`RSA PRIVATE KEY`),
    /// PKCS#8 (`PRIVATE KEY`), encrypted PKCS#8 (`ENCRYPTED PRIVATE KEY`, PBES2 with
    /// PBKDF2 or scrypt and AES), and OpenSSL's legacy encryption (`Proc-Type:
    /// 4,ENCRYPTED` with `DEK-Info` naming AES-128-CBC, AES-192-CBC, AES-256-CBC,
    /// DES-EDE3-CBC or DES-CBC). Like Go, the block label is not trusted: PKCS#1 is
    /// tried first, then PKCS#8.
    ///
    /// `passphrase` is ignored for unencrypted keys. `None` and an empty passphrase are
    /// treated alike, because configuration files spell "no passphrase" both ways.
    ///
    /// ```
    /// # let pem = include_bytes!("../tests/data/rsa-pkcs1.pem");
    /// let key = oci_csi_auth::PrivateKey::from_pem(pem, None)?;
    /// assert_eq!(key.fingerprint().len(), 47);
    /// # Ok::<(), oci_csi_auth::KeyError>(())
    /// ```
    pub fn from_pem(pem: &[u8], passphrase: Option<&[u8]>) -> Result<Self, KeyError> {
        let passphrase = passphrase.unwrap_or_default();
        let block = PemBlock::first(pem)?;
        if block.label == "ENCRYPTED PRIVATE KEY" {
            let der = decrypt_pkcs8(&block.der, passphrase)?;
            return Self::from_decrypted_der(&der, &block.label);
        }
        if let Some(dek_info) = block.legacy_encryption()? {
            let der = decrypt_legacy(&block.der, &dek_info, passphrase)?;
            return Self::from_decrypted_der(&der, &block.label);
        }
        Self::from_der(&block.der, &block.label)
    }

    /// Generates a fresh RSA-2048 key pair, as OCI session keys are (spec 3.3, 4.5).
    ///
    /// This takes about 100 ms; call it from a blocking context on a request path.
    pub fn generate_rsa_2048() -> Result<Self, KeyError> {
        let pair = KeyPair::generate(KeySize::Rsa2048)
            .map_err(|err| KeyError::Crypto("key generation", err))?;
        Self::from_pair(pair)
    }

    /// Signs `message` with RSASSA-PKCS1-v1_5 over SHA-256 and returns the raw signature
    /// (as long as the modulus; 256 bytes for RSA-2048).
    pub fn sign_pkcs1_sha256(&self, message: &[u8]) -> Result<Vec<u8>, KeyError> {
        let mut signature = vec![0; self.pair.public_modulus_len()];
        // aws-lc ignores the random source for PKCS#1 v1.5, which is deterministic.
        let rng = aws_lc_rs::rand::SystemRandom::new();
        self.pair
            .sign(&RSA_PKCS1_SHA256, &rng, message, &mut signature)
            .map_err(|err| KeyError::Crypto("signing", err))?;
        Ok(signature)
    }

    /// The DER `SubjectPublicKeyInfo` of the public key.
    pub fn public_key_spki_der(&self) -> &[u8] {
        &self.spki_der
    }

    /// The public key as PEM (`PUBLIC KEY`, Base64 in 64-character lines, trailing
    /// newline), the form the proxymux expects in `podKey` (spec 3.3).
    pub fn public_key_pem(&self) -> String {
        let b64 = STANDARD.encode(&self.spki_der);
        let mut pem = String::with_capacity(b64.len() + b64.len() / 64 + 64);
        pem.push_str("-----BEGIN PUBLIC KEY-----\n");
        // Base64 output is ASCII, so every 64-byte chunk is valid UTF-8.
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PUBLIC KEY-----\n");
        pem
    }

    /// The public key as single-line Base64 of the SPKI DER, as the x509 federation body
    /// carries it (spec 4.4).
    pub fn public_key_base64(&self) -> String {
        STANDARD.encode(&self.spki_der)
    }

    /// The OCI API-key fingerprint: MD5 over the SPKI DER as 16 lower-case hex pairs
    /// joined by `:` (spec 1.4).
    pub fn fingerprint(&self) -> String {
        colon_hex(&Md5::digest(&self.spki_der))
    }

    /// Size of the modulus in bits.
    pub fn bits(&self) -> usize {
        self.pair.public_modulus_len() * 8
    }

    fn from_pair(pair: KeyPair) -> Result<Self, KeyError> {
        let bits = pair.public_modulus_len() * 8;
        if bits > MAX_RSA_BITS {
            return Err(KeyError::RsaTooLarge(bits));
        }
        let spki_der = pair
            .public_key()
            .as_der()
            .map_err(|err| KeyError::Crypto("public key encoding", err))?
            .as_ref()
            .to_vec();
        Ok(Self { pair, spki_der })
    }

    /// Parses plaintext DER that came out of a decryption: any failure here means the
    /// passphrase was wrong (a wrong key passes the padding check about once in 256 tries),
    /// unless the result is recognisably a key of another algorithm.
    fn from_decrypted_der(der: &[u8], label: &str) -> Result<Self, KeyError> {
        match Self::from_der(der, label) {
            Err(KeyError::Unparseable { .. }) => Err(KeyError::WrongPassphrase),
            other => other,
        }
    }

    /// Tries PKCS#1, then PKCS#8, like Go's `parsePKCS1OrPKCS8PrivateKey`.
    fn from_der(der: &[u8], label: &str) -> Result<Self, KeyError> {
        if let Ok(pair) = KeyPair::from_der(der) {
            return Self::from_pair(pair);
        }
        if let Ok(info) = PrivateKeyInfoRef::try_from(der) {
            let oid = info.algorithm.oid;
            if oid != RSA_ENCRYPTION {
                return Err(KeyError::NotRsa(algorithm_name(oid)));
            }
            let pair = KeyPair::from_pkcs8(der).map_err(KeyError::Rejected)?;
            return Self::from_pair(pair);
        }
        // A well-formed PKCS#1 structure that aws-lc refused (e.g. a 1024-bit key) deserves
        // aws-lc's reason rather than "not a key".
        if pkcs1_shaped(der)
            && let Err(rejected) = KeyPair::from_der(der)
        {
            return Err(KeyError::Rejected(rejected));
        }
        Err(match label {
            "EC PRIVATE KEY" => KeyError::NotRsa("EC".into()),
            "DSA PRIVATE KEY" => KeyError::NotRsa("DSA".into()),
            _ => KeyError::Unparseable {
                label: truncate(label),
            },
        })
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("algorithm", &"RSA")
            .field("bits", &self.bits())
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

/// Whether `der` decodes as a PKCS#1 `RSAPrivateKey` (version 0, two-prime).
fn pkcs1_shaped(der: &[u8]) -> bool {
    use pkcs1::der::Decode as _;
    pkcs1::RsaPrivateKeyRef::from_der(der).is_ok()
}

/// A readable name for the algorithms people most often paste by mistake.
pub(crate) fn algorithm_name(oid: ObjectIdentifier) -> String {
    match oid.to_string().as_str() {
        "1.2.840.10045.2.1" => "EC".into(),
        "1.3.101.112" => "Ed25519".into(),
        "1.3.101.113" => "Ed448".into(),
        "1.3.101.110" => "X25519".into(),
        "1.2.840.10040.4.1" => "DSA".into(),
        "1.2.840.113549.1.1.10" => "RSASSA-PSS".into(),
        other => format!("with OID {other}"),
    }
}

fn colon_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, byte) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

pub(crate) fn truncate(text: &str) -> String {
    text.chars().take(MAX_ECHO_LEN).collect()
}

/// The first PEM block of some text, with RFC 1421 headers kept for legacy encryption.
pub(crate) struct PemBlock {
    pub(crate) label: String,
    headers: Vec<(String, String)>,
    pub(crate) der: Zeroizing<Vec<u8>>,
}

/// The DER of every PEM block in `data`, in order (certificate chains, concatenated as
/// instance metadata serves them). The one PEM reader of the crate, also behind
/// [`PrivateKey::from_pem`].
pub(crate) fn pem_ders(mut data: &[u8]) -> Result<Vec<Zeroizing<Vec<u8>>>, KeyError> {
    let mut ders = Vec::new();
    loop {
        match PemBlock::first_and_rest(data) {
            Ok((block, rest)) => {
                ders.push(block.der);
                data = rest;
            }
            Err(KeyError::NoPem) if !ders.is_empty() => return Ok(ders),
            Err(e) => return Err(e),
        }
    }
}

impl PemBlock {
    pub(crate) fn first(data: &[u8]) -> Result<Self, KeyError> {
        Self::first_and_rest(data).map(|(block, _)| block)
    }

    /// The first block and what follows its END line.
    fn first_and_rest(data: &[u8]) -> Result<(Self, &[u8]), KeyError> {
        const BEGIN: &[u8] = b"-----BEGIN ";
        const DASHES: &[u8] = b"-----";
        let start = find(data, BEGIN).ok_or(KeyError::NoPem)?;
        let rest = &data[start + BEGIN.len()..];
        let label_len =
            find(rest, DASHES).ok_or(KeyError::MalformedPem("unterminated BEGIN line"))?;
        let label = std::str::from_utf8(&rest[..label_len])
            .ok()
            .filter(|label| label.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
            .ok_or(KeyError::MalformedPem("invalid label on the BEGIN line"))?
            .to_owned();
        let rest = &rest[label_len + DASHES.len()..];
        let end_line = format!("-----END {label}-----");
        let body_len = find(rest, end_line.as_bytes()).ok_or(KeyError::MalformedPem(
            "missing END line matching the BEGIN line",
        ))?;
        let body = std::str::from_utf8(&rest[..body_len])
            .map_err(|_| KeyError::MalformedPem("body is not text"))?;

        let mut headers = Vec::new();
        // Base64 text of a private key is as secret as the key.
        let mut b64 = Zeroizing::new(String::with_capacity(body.len()));
        let mut in_headers = true;
        for line in body.lines() {
            let line = line.trim();
            if in_headers {
                // Base64 has no ':', so a colon marks an RFC 1421 header.
                if let Some((name, value)) = line.split_once(':') {
                    headers.push((name.trim().to_owned(), value.trim().to_owned()));
                    continue;
                }
                if line.is_empty() {
                    continue;
                }
                in_headers = false;
            }
            b64.extend(line.chars().filter(|c| !c.is_ascii_whitespace()));
        }
        let mut der = Zeroizing::new(Vec::with_capacity(b64.len() / 4 * 3 + 3));
        STANDARD
            .decode_vec(b64.as_bytes(), &mut der)
            .map_err(|_| KeyError::MalformedPem("body is not valid Base64"))?;
        if der.is_empty() {
            return Err(KeyError::MalformedPem("empty body"));
        }
        let after = &rest[body_len + end_line.len()..];
        Ok((
            Self {
                label,
                headers,
                der,
            },
            after,
        ))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `DEK-Info` value when the block carries `Proc-Type: 4,ENCRYPTED`.
    pub(crate) fn legacy_encryption(&self) -> Result<Option<String>, KeyError> {
        let encrypted = self
            .header("Proc-Type")
            .is_some_and(|value| value.replace(' ', "").eq_ignore_ascii_case("4,ENCRYPTED"));
        if !encrypted {
            return Ok(None);
        }
        self.header("DEK-Info")
            .map(|value| Some(value.to_owned()))
            .ok_or(KeyError::MalformedPem(
                "Proc-Type says ENCRYPTED but there is no DEK-Info header",
            ))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The ciphers OpenSSL's legacy PEM encryption can name in `DEK-Info`.
#[derive(Clone, Copy)]
enum LegacyCipher {
    Aes128,
    Aes192,
    Aes256,
    DesEde3,
    Des,
}

impl LegacyCipher {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "AES-128-CBC" => Self::Aes128,
            "AES-192-CBC" => Self::Aes192,
            "AES-256-CBC" => Self::Aes256,
            "DES-EDE3-CBC" => Self::DesEde3,
            "DES-CBC" => Self::Des,
            _ => return None,
        })
    }

    fn key_len(self) -> usize {
        match self {
            Self::Aes128 => 16,
            Self::Aes192 | Self::DesEde3 => 24,
            Self::Aes256 => 32,
            Self::Des => 8,
        }
    }

    fn iv_len(self) -> usize {
        match self {
            Self::Aes128 | Self::Aes192 | Self::Aes256 => 16,
            Self::DesEde3 | Self::Des => 8,
        }
    }
}

/// Decrypts an OpenSSL legacy-encrypted PEM body (RFC 1423 headers, OpenSSL's KDF).
fn decrypt_legacy(
    ciphertext: &[u8],
    dek_info: &str,
    passphrase: &[u8],
) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    let (name, iv_hex) = dek_info
        .split_once(',')
        .ok_or(KeyError::MalformedPem("DEK-Info is not \"cipher,iv\""))?;
    let cipher = LegacyCipher::from_name(name.trim())
        .ok_or_else(|| KeyError::UnsupportedEncryption(truncate(name.trim())))?;
    let iv = decode_hex(iv_hex.trim())
        .filter(|iv| iv.len() == cipher.iv_len())
        .ok_or(KeyError::MalformedPem(
            "DEK-Info IV has the wrong length or is not hex",
        ))?;
    // OpenSSL uses the first 8 bytes of the IV as the KDF salt.
    let key = evp_bytes_to_key(passphrase, &iv[..8], cipher.key_len());

    let mut buf = Zeroizing::new(ciphertext.to_vec());
    let plain_len = match cipher {
        LegacyCipher::Aes128 => cbc_decrypt::<aes::Aes128>(&key, &iv, &mut buf),
        LegacyCipher::Aes192 => cbc_decrypt::<aes::Aes192>(&key, &iv, &mut buf),
        LegacyCipher::Aes256 => cbc_decrypt::<aes::Aes256>(&key, &iv, &mut buf),
        LegacyCipher::DesEde3 => cbc_decrypt::<des::TdesEde3>(&key, &iv, &mut buf),
        LegacyCipher::Des => cbc_decrypt::<des::Des>(&key, &iv, &mut buf),
    };
    match plain_len {
        Some(len) => {
            buf.truncate(len);
            Ok(buf)
        }
        None => Err(decryption_failed(passphrase)),
    }
}

/// CBC-decrypts `buf` in place and checks the PKCS#7 padding; `None` when the padding (or
/// the length) is wrong, which is what a wrong passphrase almost always produces.
fn cbc_decrypt<C>(key: &[u8], iv: &[u8], buf: &mut [u8]) -> Option<usize>
where
    C: BlockCipherDecrypt,
    cbc::Decryptor<C>: KeyIvInit + BlockModeDecrypt,
{
    let decryptor = cbc::Decryptor::<C>::new_from_slices(key, iv).ok()?;
    decryptor
        .decrypt_padded::<Pkcs7>(buf)
        .ok()
        .map(|plain| plain.len())
}

/// OpenSSL's `EVP_BytesToKey` with MD5 and one iteration: `D_i = MD5(D_{i-1} || pass ||
/// salt)`, concatenated until there are `key_len` bytes.
fn evp_bytes_to_key(passphrase: &[u8], salt: &[u8], key_len: usize) -> Zeroizing<Vec<u8>> {
    let mut key = Zeroizing::new(Vec::with_capacity(key_len + 16));
    let mut previous = Zeroizing::new([0u8; 16]);
    let mut first = true;
    while key.len() < key_len {
        let mut hasher = Md5::new();
        if !first {
            hasher.update(previous.as_slice());
        }
        hasher.update(passphrase);
        hasher.update(salt);
        let mut block = hasher.finalize();
        key.extend_from_slice(&block);
        previous.copy_from_slice(&block);
        block.as_mut_slice().zeroize();
        first = false;
    }
    key.truncate(key_len);
    key
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect()
}

fn decryption_failed(passphrase: &[u8]) -> KeyError {
    if passphrase.is_empty() {
        KeyError::PassphraseRequired
    } else {
        KeyError::WrongPassphrase
    }
}

/// Decrypts an `ENCRYPTED PRIVATE KEY` (PKCS#8 `EncryptedPrivateKeyInfo`, PBES2): the one
/// decryption of tenant PKCS#8 keys (user API keys and certificate keys), with the one set
/// of key-derivation limits (`check_kdf_cost`) checked before anything is derived.
pub(crate) fn decrypt_pkcs8(der: &[u8], passphrase: &[u8]) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    let info = EncryptedPrivateKeyInfoRef::try_from(der).map_err(|_| KeyError::Unparseable {
        label: "ENCRYPTED PRIVATE KEY".into(),
    })?;
    let scheme = &info.encryption_algorithm;
    let params = scheme
        .pbes2()
        .ok_or_else(|| KeyError::UnsupportedEncryption(format!("PBES1 scheme {}", scheme.oid())))?;
    check_kdf_cost(&params.kdf)?;
    let mut buf = Zeroizing::new(info.encrypted_data.as_bytes().to_vec());
    let plain_len = match scheme.decrypt_in_place(passphrase, &mut buf) {
        Ok(plain) => plain.len(),
        Err(pkcs5::Error::DecryptFailed) => return Err(decryption_failed(passphrase)),
        Err(pkcs5::Error::UnsupportedAlgorithm { oid }) => {
            return Err(KeyError::UnsupportedEncryption(format!("algorithm {oid}")));
        }
        Err(_) => {
            return Err(KeyError::UnsupportedEncryption(
                "invalid PBES2 parameters".into(),
            ));
        }
    };
    buf.truncate(plain_len);
    if PrivateKeyInfoRef::try_from(buf.as_slice()).is_err() {
        return Err(decryption_failed(passphrase));
    }
    Ok(buf)
}

/// Refuses key-derivation parameters that would stall or exhaust the process, and the
/// degenerate ones (`N` < 2) that make the scrypt parameter conversion in pkcs5 panic.
fn check_kdf_cost(kdf: &pbes2::Kdf) -> Result<(), KeyError> {
    if let Some(pbkdf2) = kdf.pbkdf2() {
        let rounds = pbkdf2.iteration_count;
        if rounds == 0 || rounds > MAX_PBKDF2_ITERATIONS {
            return Err(KeyError::EncryptionTooExpensive(format!(
                "pbkdf2 iteration count {rounds} is outside 1..={MAX_PBKDF2_ITERATIONS}"
            )));
        }
    }
    if let Some(scrypt) = kdf.scrypt() {
        let n = scrypt.cost_parameter;
        let r = u64::from(scrypt.block_size);
        let p = scrypt.parallelization;
        let memory = n.checked_mul(r).and_then(|m| m.checked_mul(128));
        let work = memory.and_then(|m| m.checked_mul(u64::from(p)));
        let acceptable = n >= 2
            && n.is_power_of_two()
            && r > 0
            && (1..=MAX_SCRYPT_PARALLELISM).contains(&p)
            && memory.is_some_and(|m| m <= MAX_SCRYPT_MEMORY)
            && work.is_some_and(|w| w <= MAX_SCRYPT_WORK);
        if !acceptable {
            return Err(KeyError::EncryptionTooExpensive(format!(
                "scrypt N={n} r={r} p={p} is invalid or needs more than {MAX_SCRYPT_MEMORY} bytes \
                 of memory or {MAX_SCRYPT_WORK} bytes of work (128 * r * N * p)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evp_bytes_to_key_matches_openssl() {
        // `openssl enc -aes-256-cbc -pass pass:secret -S 0102030405060708 -md md5 -P`
        let key = evp_bytes_to_key(b"secret", &[1, 2, 3, 4, 5, 6, 7, 8], 32);
        assert_eq!(
            colon_hex(&key).replace(':', ""),
            "c9e5a1bd216dbe1317e230cef48f38ee7f0e17ad64022144bccec4a1aa2879ab"
        );
    }

    #[test]
    fn pem_parser_skips_leading_text_and_reads_headers() {
        let pem = b"junk\n-----BEGIN THING-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAEC\n-----END THING-----\n";
        let block = PemBlock::first(pem).unwrap();
        assert_eq!(block.label, "THING");
        assert_eq!(block.der.as_slice(), &[0, 1, 2]);
        assert_eq!(
            block.legacy_encryption().unwrap().as_deref(),
            Some("AES-128-CBC,00")
        );
    }

    #[test]
    fn pem_without_end_line_is_malformed() {
        let err = PemBlock::first(b"-----BEGIN RSA PRIVATE KEY-----\nAAEC\n").err();
        assert!(matches!(err, Some(KeyError::MalformedPem(_))));
    }

    #[test]
    fn text_without_pem_is_reported() {
        assert!(matches!(
            PemBlock::first(b"hello").err(),
            Some(KeyError::NoPem)
        ));
    }

    fn scrypt(cost_parameter: u64, block_size: u16, parallelization: u16) -> pbes2::Kdf {
        pbes2::Kdf::Scrypt(pbes2::ScryptParams {
            salt: pbes2::Salt::new([0u8; 16]).unwrap(),
            cost_parameter,
            block_size,
            parallelization,
            key_length: None,
        })
    }

    #[test]
    fn kdf_limits_refuse_degenerate_and_huge_scrypt_parameters() {
        // OpenSSL's defaults pass.
        assert!(check_kdf_cost(&scrypt(16384, 8, 1)).is_ok());
        // N = 0 would make pkcs5 panic; N = 3 is not a power of two.
        for (n, r, p) in [
            (0, 8, 1),
            (1, 8, 1),
            (3, 8, 1),
            (1 << 20, 8, 1),
            (16384, 8, 0),
            (16384, 8, 1000),
            (u64::MAX, u16::MAX, 1),
            // Allowed before: 32 MiB of memory, and 16 MiB run 16 times.
            (32768, 8, 1),
            (16384, 8, 16),
            (16384, 8, 3),
        ] {
            assert!(
                matches!(
                    check_kdf_cost(&scrypt(n, r, p)),
                    Err(KeyError::EncryptionTooExpensive(_))
                ),
                "N={n} r={r} p={p}"
            );
        }
    }

    #[test]
    fn an_encrypted_key_asking_for_scrypt_n_2_20_is_refused_before_deriving() {
        use pkcs8::der::Encode as _;
        // A well-formed ENCRYPTED PRIVATE KEY whose scrypt parameters (N = 2^20, r = 8)
        // would need 1 GiB: refused at once, whatever the passphrase.
        let params = pbes2::Parameters {
            kdf: scrypt(1 << 20, 8, 1),
            encryption: pbes2::EncryptionScheme::Aes256Cbc { iv: [7; 16] },
        };
        let ciphertext = pkcs8::der::asn1::OctetString::new(vec![0u8; 1232]).unwrap();
        let info = pkcs8::EncryptedPrivateKeyInfo {
            encryption_algorithm: pkcs5::EncryptionScheme::Pbes2(params),
            encrypted_data: ciphertext,
        };
        let der = info.to_der().unwrap();
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(&der);
        let pem = format!(
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\n{body}\n-----END ENCRYPTED PRIVATE KEY-----\n"
        );
        let err = PrivateKey::from_pem(pem.as_bytes(), Some(b"any passphrase")).unwrap_err();
        assert!(matches!(err, KeyError::EncryptionTooExpensive(_)), "{err}");
        assert!(err.to_string().contains("N=1048576"), "{err}");
    }

    #[test]
    fn hex_decoding_rejects_odd_and_non_hex() {
        assert_eq!(decode_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(decode_hex("é0"), None);
    }
}
