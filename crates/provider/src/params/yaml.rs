//! The `secrets` list as written: serde shapes of its entries, read within the mount's entry
//! and file allowances, and the one table of which field applies to which kind of entry.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use bounded::{BoundedString, ParseBudget};

use super::problems::{HANDLE_PREFIX, ParamError, RETRIEVE_PREFIX, UNMARSHAL_PREFIX, nearest};
use super::spec::{CertificateKind, MAX_VERSIONS, ParseLimits, SECRETS};

/// The largest `secrets` parameter parsed: 256 entries of 1 KiB each. Its aliases may
/// expand it to twice its size at most, never past this.
pub const MAX_SECRETS_BYTES: usize = 256 * 1024;

/// The longest value of any entry field, refused as it is read (a `keys` item's `key`, at
/// most 1024 characters, is the longest any field takes).
const MAX_FIELD_BYTES: usize = 1024;

/// A field of an entry as written: text of at most [`MAX_FIELD_BYTES`].
pub(crate) type Field = BoundedString<MAX_FIELD_BYTES>;

/// A `template` as written: at most [`crate::template::MAX_TEMPLATE_BYTES`].
pub(crate) type TemplateText = BoundedString<{ crate::template::MAX_TEMPLATE_BYTES }>;

/// The budget of the `secrets` parameter's parse.
const SECRETS_BUDGET: ParseBudget = ParseBudget::new(MAX_SECRETS_BYTES);

std::thread_local! {
    /// Files the list being parsed on this thread may still name (`None`: no parse under
    /// way). The YAML parse is synchronous, so the count cannot cross another parse.
    static FILES_LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Takes one file from the parse's allowance; `false` once it is used up.
fn take_file() -> bool {
    FILES_LEFT.with(|left| match left.get() {
        Some(0) => false,
        Some(n) => {
            left.set(Some(n - 1));
            true
        }
        None => true,
    })
}

/// A `keys` list, each item counted against the files the mount may write as it is read.
#[derive(Debug)]
pub(crate) struct CappedKeys(pub(crate) Vec<RawKey>);

impl<'de> Deserialize<'de> for CappedKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = CappedKeys;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of keys")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<CappedKeys, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
                while let Some(key) = seq.next_element::<RawKey>()? {
                    if !take_file() {
                        return Err(de::Error::custom(TOO_MANY_FILES));
                    }
                    out.push(key);
                }
                Ok(CappedKeys(out))
            }
        }
        deserializer.deserialize_seq(KeysVisitor)
    }
}

/// The marker of the parse error that the file allowance ran out.
const TOO_MANY_FILES: &str = "too many files";

/// A scalar field's text, refused past [`MAX_FIELD_BYTES`] as it is read.
fn text_field<E: de::Error>(v: &str) -> Result<String, E> {
    if v.len() > MAX_FIELD_BYTES {
        return Err(E::custom(format_args!(
            "a string of {} bytes, longer than the {MAX_FIELD_BYTES} this field takes",
            v.len()
        )));
    }
    Ok(v.to_owned())
}

/// `versionNumber` as written: Go accepts an integer or a quoted integer, nothing else.
#[derive(Debug)]
pub(crate) enum RawVersion {
    Integer(i128),
    Text(String),
    Other(String),
}

impl<'de> Deserialize<'de> for RawVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer version number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawVersion, E> {
                Ok(RawVersion::Integer(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawVersion, E> {
                Ok(RawVersion::Integer(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<RawVersion, E> {
                Ok(RawVersion::Integer(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawVersion, E> {
                Ok(RawVersion::Other(format!("{v:?}")))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawVersion, E> {
                Ok(RawVersion::Other(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawVersion, E> {
                text_field(v).map(RawVersion::Text)
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawVersion, E> {
                Ok(RawVersion::Text(String::new()))
            }
            fn visit_none<E: de::Error>(self) -> Result<RawVersion, E> {
                Ok(RawVersion::Text(String::new()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `mode` as written: a string of octal digits; a YAML integer is refused (YAML 1.1 reads
/// `0400` as octal 256, YAML 1.2 as decimal 400).
#[derive(Debug)]
pub(crate) enum RawMode {
    Text(String),
    Integer(String),
    Other,
}

impl<'de> Deserialize<'de> for RawMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quoted octal mode such as \"0400\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawMode, E> {
                Ok(RawMode::Integer(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawMode, E> {
                Ok(RawMode::Integer(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawMode, E> {
                Ok(RawMode::Integer(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<RawMode, E> {
                Ok(RawMode::Other)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawMode, E> {
                text_field(v).map(RawMode::Text)
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawMode, E> {
                Ok(RawMode::Text(String::new()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecret {
    pub(crate) name: Option<Field>,
    #[serde(rename = "secretId")]
    pub(crate) secret_id: Option<Field>,
    #[serde(rename = "vaultId")]
    pub(crate) vault_id: Option<Field>,
    pub(crate) stage: Option<Field>,
    #[serde(rename = "versionNumber")]
    pub(crate) version_number: Option<RawVersion>,
    #[serde(rename = "versionName")]
    pub(crate) version_name: Option<Field>,
    #[serde(rename = "fileName")]
    pub(crate) file_name: Option<Field>,
    pub(crate) mode: Option<RawMode>,
    pub(crate) encoding: Option<Field>,
    pub(crate) keys: Option<CappedKeys>,
    pub(crate) format: Option<Field>,
    #[serde(rename = "failoverVaultId")]
    pub(crate) failover_vault_id: Option<Field>,
    #[serde(rename = "certificateId")]
    pub(crate) certificate_id: Option<Field>,
    #[serde(rename = "certificateAuthorityId")]
    pub(crate) certificate_authority_id: Option<Field>,
    #[serde(rename = "caBundleId")]
    pub(crate) ca_bundle_id: Option<Field>,
    #[serde(rename = "privateKey")]
    pub(crate) private_key: Option<bool>,
    pub(crate) directory: Option<Field>,
    #[serde(rename = "certFileName")]
    pub(crate) cert_file_name: Option<Field>,
    #[serde(rename = "chainFileName")]
    pub(crate) chain_file_name: Option<Field>,
    #[serde(rename = "keyFileName")]
    pub(crate) key_file_name: Option<Field>,
    pub(crate) versions: Option<RawVersion>,
    pub(crate) tag: Option<Field>,
    #[serde(rename = "namePrefix")]
    pub(crate) name_prefix: Option<Field>,
    #[serde(rename = "compartmentId")]
    pub(crate) compartment_id: Option<Field>,
    pub(crate) template: Option<TemplateText>,
    #[serde(rename = "writeFile")]
    pub(crate) write_file: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKey {
    pub(crate) key: Option<Field>,
    #[serde(rename = "fileName")]
    pub(crate) file_name: Option<Field>,
    pub(crate) mode: Option<RawMode>,
}

pub(crate) fn parse_secrets_yaml(
    attributes: &BTreeMap<String, String>,
    limits: ParseLimits,
) -> Result<Vec<RawSecret>, ParamError> {
    let max_secrets = limits.max_secrets;
    let yaml = attributes.get(SECRETS).ok_or_else(|| {
        ParamError::new(format!(
            "{HANDLE_PREFIX}: missed \"secrets\" SecretProviderClass parameters"
        ))
    })?;
    if yaml.trim().is_empty() {
        return Err(ParamError::new(format!(
            "{HANDLE_PREFIX}: missed content of SecretProviderClass parameter \"secrets\""
        )));
    }
    let over = std::cell::Cell::new(false);
    let seed = CappedList {
        max: max_secrets,
        over: &over,
    };
    let previous = FILES_LEFT.with(|left| left.replace(Some(limits.max_files)));
    let parsed = bounded::yaml::with_seed(yaml, &SECRETS_BUDGET, seed);
    let files_over = FILES_LEFT.with(|left| left.replace(previous)) == Some(0)
        && parsed
            .as_ref()
            .is_err_and(|e| e.detail().contains(TOO_MANY_FILES));
    if files_over {
        return Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: the list names more than {} files (entries and keys items), \
             the most one mount may write (server.max_files_per_mount); parsing stopped there: \
             split it over several SecretProviderClasses",
            limits.max_files
        )));
    }
    if over.get() {
        return Err(ParamError::new(format!(
            "{UNMARSHAL_PREFIX}: the list has more than {max_secrets} entries, the most one \
             mount may have (server.max_secrets_per_mount); split it over several \
             SecretProviderClasses"
        )));
    }
    parsed.map_err(|e| match e {
        bounded::ParseError::TooLarge { len, max } => ParamError::new(format!(
            "{UNMARSHAL_PREFIX}: the list is {len} bytes, more than the {max} one mount's \
             parameter may have; split it over several SecretProviderClasses"
        )),
        e if e.is_budget() => ParamError::new(format!(
            "{UNMARSHAL_PREFIX}: the list was refused: {e} (anchors and aliases may repeat a \
             value, not multiply the list)"
        )),
        e => ParamError::new(match unknown_field(&e) {
            Some(unknown) => format!("{UNMARSHAL_PREFIX}: {unknown}"),
            None => format!(
                "{UNMARSHAL_PREFIX}: expected a YAML list of entries (name, secretId, \
                 certificateId, template, ...): {}",
                e.detail()
            ),
        }),
    })
}

/// Every field an entry of the list may have (the field table's, [`RawSecret::given`]).
pub(crate) const ENTRY_FIELDS: [&str; 26] = [
    "name",
    "secretId",
    "vaultId",
    "fileName",
    "encoding",
    "keys",
    "versions",
    "tag",
    "namePrefix",
    "compartmentId",
    "format",
    "failoverVaultId",
    "stage",
    "versionNumber",
    "versionName",
    "privateKey",
    "directory",
    "certFileName",
    "chainFileName",
    "keyFileName",
    "mode",
    "template",
    "writeFile",
    "certificateId",
    "certificateAuthorityId",
    "caBundleId",
];

/// The fields of a `keys` item.
const KEY_FIELDS: [&str; 3] = ["key", "fileName", "mode"];

/// An unknown field, said once, where it is and what was meant: "line 3, column 5: unknown
/// field "encodng" in an entry; did you mean "encoding"?" (`None`: another error).
fn unknown_field(e: &bounded::ParseError) -> Option<String> {
    let detail = e.detail();
    let (_, rest) = detail.split_once("unknown field `")?;
    let name = rest.split_once('`').map_or(rest, |(name, _)| name);
    let in_key = rest.contains("expected one of `key`") || rest.contains("expected one of key,");
    let (known, what): (&[&str], _) = if in_key {
        (&KEY_FIELDS, "a keys item")
    } else {
        (&ENTRY_FIELDS, "an entry")
    };
    let at = e.position().map_or_else(String::new, |(line, column)| {
        format!("line {line}, column {column}: ")
    });
    let hint = match nearest(name, known) {
        Some(meant) => format!("did you mean \"{meant}\"?"),
        None => format!("{what} takes {}", known.join(", ")),
    };
    Some(format!(
        "{at}unknown field {} in {what}; {hint}",
        bounded::quote(name)
    ))
}

/// A YAML sequence of [`RawSecret`] of at most `max` entries: past it, deserializing stops
/// with an error (and `over` set), before the rest of the list is built.
struct CappedList<'a> {
    max: usize,
    over: &'a std::cell::Cell<bool>,
}

impl<'de> serde::de::DeserializeSeed<'de> for CappedList<'_> {
    type Value = Vec<RawSecret>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CappedList<'_> {
    type Value = Vec<RawSecret>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of secrets")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
        while out.len() < self.max {
            match seq.next_element::<RawSecret>()? {
                Some(entry) => {
                    if !(0..entry.files_at_least()).all(|_| take_file()) {
                        return Err(de::Error::custom(TOO_MANY_FILES));
                    }
                    out.push(entry);
                }
                None => return Ok(out),
            }
        }
        // One more entry, of any shape, is one too many; it is not built.
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            self.over.set(true);
            return Err(de::Error::custom("too many entries"));
        }
        Ok(out)
    }
}

/// What an entry is: a secret (`name`, `secretId`), a selection of a vault's secrets
/// (`tag`, `namePrefix`) or a certificate entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    Secret,
    Selection,
    Certificate(CertificateKind),
    Template,
}

/// The kinds of entry a field applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Applies {
    secret: bool,
    certificate: bool,
    certificate_authority: bool,
    ca_bundle: bool,
    selection: bool,
    template: bool,
}

impl Applies {
    const SECRET: Self = Self::new(true, [false; 3], false, false);
    const SELECTION: Self = Self::new(false, [false; 3], true, false);
    const SECRET_OR_SELECTION: Self = Self::new(true, [false; 3], true, false);
    const IN_DIRECTORY: Self = Self::new(false, [true; 3], true, false);
    const ANY_CERTIFICATE: Self = Self::new(false, [true; 3], false, false);
    const VERSIONED: Self = Self::new(true, [true, true, false], false, false);
    const LEAF: Self = Self::new(false, [true, false, false], false, false);
    const EVERY: Self = Self::new(true, [true; 3], true, true);
    const TEMPLATE: Self = Self::new(false, [false; 3], false, true);
    /// Every kind a template may read (its files are known when the class is read).
    const INPUTS: Self = Self::new(true, [true; 3], false, false);
    /// `fileName`: a secret's file, or a template's.
    const FILE: Self = Self::new(true, [false; 3], false, true);

    /// `certificates`: certificate, certificate authority, CA bundle.
    const fn new(secret: bool, certificates: [bool; 3], selection: bool, template: bool) -> Self {
        Self {
            secret,
            certificate: certificates[0],
            certificate_authority: certificates[1],
            ca_bundle: certificates[2],
            selection,
            template,
        }
    }

    pub(crate) fn to(self, kind: EntryKind) -> bool {
        match kind {
            EntryKind::Secret => self.secret,
            EntryKind::Selection => self.selection,
            EntryKind::Template => self.template,
            EntryKind::Certificate(CertificateKind::Certificate) => self.certificate,
            EntryKind::Certificate(CertificateKind::CertificateAuthority) => {
                self.certificate_authority
            }
            EntryKind::Certificate(CertificateKind::CaBundle) => self.ca_bundle,
        }
    }
}

impl RawSecret {
    /// The fields given, as written, with the kinds of entry each applies to. The struct is
    /// destructured without `..`: a field added to `RawSecret` does not compile until it is
    /// placed here, so no field can pass unchecked.
    pub(crate) fn given(&self) -> Vec<(&'static str, Applies)> {
        let RawSecret {
            name,
            secret_id,
            vault_id,
            stage,
            version_number: number,
            version_name,
            file_name,
            mode,
            encoding,
            keys,
            format,
            failover_vault_id: failover,
            certificate_id,
            certificate_authority_id: ca_id,
            ca_bundle_id,
            private_key,
            directory,
            cert_file_name,
            chain_file_name: chain,
            key_file_name,
            versions,
            tag,
            name_prefix,
            compartment_id: compartment,
            template,
            write_file,
        } = self;
        let cert_only = |kind| Applies::new(false, [kind == 0, kind == 1, kind == 2], false, false);
        let named = |id: &Option<Field>| id.as_deref().is_some_and(|v| !v.is_empty());
        [
            ("name", name.is_some(), Applies::SECRET),
            ("secretId", secret_id.is_some(), Applies::SECRET),
            ("vaultId", vault_id.is_some(), Applies::SECRET_OR_SELECTION),
            ("fileName", file_name.is_some(), Applies::FILE),
            ("encoding", encoding.is_some(), Applies::SECRET_OR_SELECTION),
            ("keys", keys.is_some(), Applies::SECRET),
            ("versions", versions.is_some(), Applies::SECRET),
            ("tag", tag.is_some(), Applies::SELECTION),
            ("namePrefix", name_prefix.is_some(), Applies::SELECTION),
            ("compartmentId", compartment.is_some(), Applies::SELECTION),
            ("format", format.is_some(), Applies::SECRET),
            ("failoverVaultId", failover.is_some(), Applies::SECRET),
            ("stage", stage.is_some(), Applies::VERSIONED),
            ("versionNumber", number.is_some(), Applies::VERSIONED),
            ("versionName", version_name.is_some(), Applies::VERSIONED),
            ("privateKey", private_key.is_some(), Applies::LEAF),
            ("directory", directory.is_some(), Applies::IN_DIRECTORY),
            ("certFileName", cert_file_name.is_some(), Applies::LEAF),
            ("chainFileName", chain.is_some(), Applies::ANY_CERTIFICATE),
            ("keyFileName", key_file_name.is_some(), Applies::LEAF),
            ("mode", mode.is_some(), Applies::EVERY),
            ("template", template.is_some(), Applies::TEMPLATE),
            ("writeFile", write_file.is_some(), Applies::INPUTS),
            // An empty id names no certificate (the entry is judged as a secret).
            ("certificateId", named(certificate_id), cert_only(0)),
            ("certificateAuthorityId", named(ca_id), cert_only(1)),
            ("caBundleId", named(ca_bundle_id), cert_only(2)),
        ]
        .into_iter()
        .filter(|(_, set, _)| *set)
        .map(|(field, _, applies)| (field, applies))
        .collect()
    }

    /// The first field given that does not apply to an entry of `kind`.
    pub(crate) fn misplaced(&self, kind: EntryKind) -> Option<&'static str> {
        self.given()
            .into_iter()
            .find(|(_, applies)| !applies.to(kind))
            .map(|(field, _)| field)
    }

    /// The fields given that do not apply to a `template` entry.
    pub(crate) fn misplaced_in_template(&self) -> Vec<&'static str> {
        self.given()
            .into_iter()
            .filter(|(_, applies)| !applies.to(EntryKind::Template))
            .map(|(field, _)| field)
            .collect()
    }

    /// The kinds of entry that take `field`, as a secret entry's message says it.
    pub(crate) fn kinds_of(&self, field: &str) -> &'static str {
        let applies = self
            .given()
            .into_iter()
            .find(|(f, _)| *f == field)
            .map(|(_, applies)| applies);
        match applies {
            Some(a)
                if a.selection && !(a.certificate || a.certificate_authority || a.ca_bundle) =>
            {
                "tag and namePrefix entries only"
            }
            Some(a) if a.selection => {
                "certificate entries (certificateId, certificateAuthorityId, caBundleId) and tag \
                 and namePrefix entries only"
            }
            _ => "certificate entries only (certificateId, certificateAuthorityId, caBundleId)",
        }
    }

    /// Whether the entry selects secrets by `tag` or `namePrefix` (a certificate OCID
    /// makes it a certificate entry first).
    pub(crate) fn selects(&self) -> bool {
        self.tag.is_some() || self.name_prefix.is_some()
    }

    /// The files the entry writes at least, counted as the list is read: its own file, or
    /// each version it asks for; none for `keys` (counted as they are read; with them the
    /// whole secret is written only with fileName) or a selection (counted as its listing
    /// is read, at mount time). The exact count follows the checks.
    fn files_at_least(&self) -> usize {
        if self.template.is_some() {
            return 1;
        }
        if self.keys.is_some() || self.selects() {
            return 0;
        }
        match &self.versions {
            Some(RawVersion::Integer(n)) => usize::try_from(*n)
                .ok()
                .filter(|n| (1..=MAX_VERSIONS).contains(n))
                .unwrap_or(1),
            _ => 1,
        }
    }
}
