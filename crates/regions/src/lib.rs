#![doc = include_str!("../README.md")]
//!
//! The table is the SDK's (spec 2.1, appendix A); endpoints are built from a [`Region`]'s
//! id and domain by the code that calls each service.

use std::fmt;
use std::path::Path;

use serde::Deserialize;

/// The second-level domain used when neither the table nor the metadata knows a region and
/// no default realm is configured.
const DEFAULT_DOMAIN: &str = "oraclecloud.com";

/// Region id, short code and realm of every region the SDK knows (appendix A, upstream
/// v65.117.1).
const REGIONS: &[(&str, &str, &str)] = &[
    ("ap-chuncheon-1", "yny", "oc1"),
    ("ap-hyderabad-1", "hyd", "oc1"),
    ("ap-melbourne-1", "mel", "oc1"),
    ("ap-mumbai-1", "bom", "oc1"),
    ("ap-osaka-1", "kix", "oc1"),
    ("ap-seoul-1", "icn", "oc1"),
    ("ap-sydney-1", "syd", "oc1"),
    ("ap-tokyo-1", "nrt", "oc1"),
    ("ca-montreal-1", "yul", "oc1"),
    ("ca-toronto-1", "yyz", "oc1"),
    ("eu-amsterdam-1", "ams", "oc1"),
    ("eu-frankfurt-1", "fra", "oc1"),
    ("eu-zurich-1", "zrh", "oc1"),
    ("me-jeddah-1", "jed", "oc1"),
    ("me-dubai-1", "dxb", "oc1"),
    ("sa-saopaulo-1", "gru", "oc1"),
    ("uk-cardiff-1", "cwl", "oc1"),
    ("uk-london-1", "lhr", "oc1"),
    ("us-ashburn-1", "iad", "oc1"),
    ("us-phoenix-1", "phx", "oc1"),
    ("us-sanjose-1", "sjc", "oc1"),
    ("sa-vinhedo-1", "vcp", "oc1"),
    ("sa-santiago-1", "scl", "oc1"),
    ("il-jerusalem-1", "mtz", "oc1"),
    ("eu-marseille-1", "mrs", "oc1"),
    ("ap-singapore-1", "sin", "oc1"),
    ("me-abudhabi-1", "auh", "oc1"),
    ("eu-milan-1", "lin", "oc1"),
    ("eu-stockholm-1", "arn", "oc1"),
    ("af-johannesburg-1", "jnb", "oc1"),
    ("eu-paris-1", "cdg", "oc1"),
    ("mx-queretaro-1", "qro", "oc1"),
    ("eu-madrid-1", "mad", "oc1"),
    ("us-chicago-1", "ord", "oc1"),
    ("mx-monterrey-1", "mty", "oc1"),
    ("us-saltlake-2", "aga", "oc1"),
    ("sa-bogota-1", "bog", "oc1"),
    ("sa-valparaiso-1", "vap", "oc1"),
    ("ap-singapore-2", "xsp", "oc1"),
    ("me-riyadh-1", "ruh", "oc1"),
    ("ap-delhi-1", "onm", "oc1"),
    ("ap-batam-1", "hsg", "oc1"),
    ("eu-madrid-3", "orf", "oc1"),
    ("eu-turin-1", "nrq", "oc1"),
    ("ap-kulai-2", "jbp", "oc1"),
    ("af-casablanca-1", "lej", "oc1"),
    ("us-langley-1", "lfi", "oc2"),
    ("us-luke-1", "luf", "oc2"),
    ("us-gov-ashburn-1", "ric", "oc3"),
    ("us-gov-chicago-1", "pia", "oc3"),
    ("us-gov-phoenix-1", "tus", "oc3"),
    ("uk-gov-london-1", "ltn", "oc4"),
    ("uk-gov-cardiff-1", "brs", "oc4"),
    ("ap-chiyoda-1", "nja", "oc8"),
    ("ap-ibaraki-1", "ukb", "oc8"),
    ("me-dcc-muscat-1", "mct", "oc9"),
    ("me-ibri-1", "ibr", "oc9"),
    ("ap-dcc-canberra-1", "wga", "oc10"),
    ("eu-dcc-milan-1", "bgy", "oc14"),
    ("eu-dcc-milan-2", "mxp", "oc14"),
    ("eu-dcc-dublin-2", "snn", "oc14"),
    ("eu-dcc-rating-2", "dtm", "oc14"),
    ("eu-dcc-rating-1", "dus", "oc14"),
    ("eu-dcc-dublin-1", "ork", "oc14"),
    ("ap-dcc-gazipur-1", "dac", "oc15"),
    ("eu-madrid-2", "vll", "oc19"),
    ("eu-frankfurt-2", "str", "oc19"),
    ("eu-jovanovac-1", "beg", "oc20"),
    ("me-dcc-doha-1", "doh", "oc21"),
    ("me-alrayyan-1", "vve", "oc21"),
    ("us-somerset-1", "ebb", "oc23"),
    ("us-thames-1", "ebl", "oc23"),
    ("eu-dcc-zurich-1", "avz", "oc24"),
    ("eu-crissier-1", "avf", "oc24"),
    ("me-abudhabi-3", "ahu", "oc26"),
    ("me-alain-1", "rba", "oc26"),
    ("me-abudhabi-2", "rkt", "oc29"),
    ("me-abudhabi-4", "shj", "oc29"),
    ("ap-seoul-2", "dtz", "oc35"),
    ("ap-suwon-1", "dln", "oc35"),
    ("ap-chuncheon-2", "bno", "oc35"),
    ("us-ashburn-2", "yxj", "oc42"),
    ("us-newark-1", "pgc", "oc42"),
    ("eu-budapest-1", "jsk", "oc51"),
];

/// Realm key to second-level domain (spec 2.1).
const REALMS: &[(&str, &str)] = &[
    ("oc1", "oraclecloud.com"),
    ("oc2", "oraclegovcloud.com"),
    ("oc3", "oraclegovcloud.com"),
    ("oc4", "oraclegovcloud.uk"),
    ("oc8", "oraclecloud8.com"),
    ("oc9", "oraclecloud9.com"),
    ("oc10", "oraclecloud10.com"),
    ("oc14", "oraclecloud14.com"),
    ("oc15", "oraclecloud15.com"),
    ("oc19", "oraclecloud.eu"),
    ("oc20", "oraclecloud20.com"),
    ("oc21", "oraclecloud21.com"),
    ("oc23", "oraclecloud23.com"),
    ("oc24", "oraclecloud24.com"),
    ("oc26", "oraclecloud26.com"),
    ("oc29", "oraclecloud29.com"),
    ("oc35", "oraclecloud35.com"),
    ("oc42", "oraclecloud42.com"),
    ("oc51", "oraclecloud51.com"),
    ("oc52", "oraclecloud52.com"),
];

/// Why a region or the region metadata cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// The region is empty or contains whitespace (the Go provider's message).
    #[error("region can not be empty or have spaces: {0:?}")]
    Invalid(String),
    /// A region a tenant supplied (in a user principal's config Secret) that is not in
    /// the built-in table nor in the operator's region metadata.
    #[error(
        "region {0:?} is not a region this provider knows: a region from a tenant must be an \
         OCI region id (us-ashburn-1) or short code (iad) of the built-in table, or one the \
         node's operator added with OCI_REGION_METADATA or a regions-config.json file; host \
         names, ports and user info are never accepted"
    )]
    Unknown(String),
    /// `OCI_REGION_METADATA` is not one region object with the four required members.
    #[error("invalid region metadata (OCI_REGION_METADATA): {0}")]
    Metadata(String),
    /// The `regions-config.json` file cannot be read or is not an array of region objects.
    #[error("invalid regions configuration file {path}: {reason}")]
    ConfigFile {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// One region's metadata, in the schema of `regions-config.json` and
/// `OCI_REGION_METADATA` (all four members required and non-empty; values lower-cased).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionInfo {
    /// Short code, e.g. `yul`.
    pub region_key: String,
    /// Realm key, e.g. `oc1`.
    pub realm_key: String,
    /// Full region id, e.g. `ca-montreal-1`.
    pub region_identifier: String,
    /// Second-level domain, e.g. `oraclecloud.com`.
    pub realm_domain_component: String,
}

impl RegionInfo {
    fn normalized(mut self) -> Result<Self, String> {
        for (name, value) in [
            ("regionKey", &mut self.region_key),
            ("realmKey", &mut self.realm_key),
            ("regionIdentifier", &mut self.region_identifier),
            ("realmDomainComponent", &mut self.realm_domain_component),
        ] {
            *value = value.trim().to_ascii_lowercase();
            if value.is_empty() {
                return Err(format!("{name} is empty"));
            }
        }
        Ok(self)
    }

    fn knows(&self, region: &str) -> bool {
        self.region_key == region || self.region_identifier == region
    }
}

/// A resolved region: its id and the second-level domain of its realm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    // Shared: a region is cloned into every mount's endpoints and sessions.
    id: std::sync::Arc<str>,
    /// `None` when the region is itself a full domain (it contains a dot).
    domain: Option<std::sync::Arc<str>>,
}

impl Region {
    /// The region id (`us-ashburn-1`), or the full domain for a dotted region.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The second-level domain (`oraclecloud.com`); `None` for a dotted region.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// Turns region strings into [`Region`]s the way the SDK's `StringToRegion` does, with
/// the region metadata given explicitly (never read from the home directory implicitly).
///
/// ```
/// use oci_csi_regions::Regions;
///
/// let regions = Regions::default();
/// let region = regions.resolve("region.example.com")?;
/// assert_eq!((region.id(), region.domain()), ("region.example.com", None));
/// # Ok::<(), oci_csi_regions::RegionError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Regions {
    config_file: Vec<RegionInfo>,
    metadata: Option<RegionInfo>,
    default_realm: Option<String>,
}

/// What a region-metadata document may be (a region's few members; a file of them).
const METADATA_BUDGET: bounded::ParseBudget = bounded::ParseBudget::new(1024 * 1024);

impl Regions {
    /// With `OCI_REGION_METADATA` (one JSON object), the content of a `regions-config.json`
    /// file (a JSON array) and `OCI_DEFAULT_REALM` (a domain, e.g. `oraclecloud.com`).
    pub fn new(
        metadata: Option<&str>,
        config_file: Option<(&Path, &[u8])>,
        default_realm: Option<&str>,
    ) -> Result<Self, RegionError> {
        let metadata = match metadata.map(str::trim).filter(|m| !m.is_empty()) {
            None => None,
            Some(json) => {
                // The operator's configuration, read within a budget like every document.
                let info: RegionInfo = bounded::json::from_str(json, &METADATA_BUDGET)
                    .map_err(|e| RegionError::Metadata(e.detail()))?;
                Some(info.normalized().map_err(RegionError::Metadata)?)
            }
        };
        let config_file = match config_file {
            None => Vec::new(),
            Some((path, bytes)) => {
                let error = |reason: String| RegionError::ConfigFile {
                    path: path.display().to_string(),
                    reason,
                };
                let infos: Vec<RegionInfo> = bounded::json::from_slice(bytes, &METADATA_BUDGET)
                    .map_err(|e| error(e.detail()))?;
                infos
                    .into_iter()
                    .enumerate()
                    .map(|(i, info)| info.normalized().map_err(|e| error(format!("[{i}]: {e}"))))
                    .collect::<Result<_, _>>()?
            }
        };
        let default_realm = default_realm
            .map(|r| r.trim().to_ascii_lowercase())
            .filter(|r| !r.is_empty());
        Ok(Self {
            config_file,
            metadata,
            default_realm,
        })
    }

    /// Like [`Regions::new`], reading `regions-config.json` from `path` when it exists (a
    /// missing file is ignored, as the SDK does).
    pub fn from_files(
        metadata: Option<&str>,
        config_file: Option<&Path>,
        default_realm: Option<&str>,
    ) -> Result<Self, RegionError> {
        let content = match config_file {
            None => None,
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => Some((path, bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(RegionError::ConfigFile {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    });
                }
            },
        };
        Self::new(
            metadata,
            content.as_ref().map(|(p, b)| (*p, b.as_slice())),
            default_realm,
        )
    }

    /// Resolves a short code, full region id or dotted domain (spec 2.1). For regions the
    /// operator chose (configuration, instance metadata); a tenant's region goes through
    /// [`Regions::resolve_known`].
    pub fn resolve(&self, region: &str) -> Result<Region, RegionError> {
        validate(region)?;
        let region = region.to_ascii_lowercase();
        if region.contains('.') {
            return Ok(Region {
                id: region.into(),
                domain: None,
            });
        }
        if let Some(known) = self.lookup(&region) {
            return Ok(known);
        }
        Ok(Region {
            id: region.into(),
            domain: Some(
                self.default_realm
                    .clone()
                    .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned())
                    .into(),
            ),
        })
    }

    /// Resolves a region a tenant supplied: only a region of the built-in table or of the
    /// operator's region metadata, compared lower-cased. Anything else (a dotted name, a
    /// host, user info, a port, an unknown name) is [`RegionError::Unknown`], so a tenant
    /// can never choose where the provider connects.
    pub fn resolve_known(&self, region: &str) -> Result<Region, RegionError> {
        validate(region)?;
        let lower = region.to_ascii_lowercase();
        let plain = lower
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        match self.lookup(&lower) {
            Some(known) if plain => Ok(known),
            _ => {
                // The value comes from a tenant's Secret: quote only its start.
                let shown: String = region.chars().take(64).collect();
                Err(RegionError::Unknown(shown))
            }
        }
    }

    /// A region of the built-in table, the regions file or the metadata variable.
    fn lookup(&self, region: &str) -> Option<Region> {
        let known = REGIONS
            .iter()
            .find(|(id, short, _)| *short == region || *id == region);
        if let Some((id, _, realm)) = known {
            let domain = REALMS
                .iter()
                .find(|(key, _)| key == realm)
                .map_or(DEFAULT_DOMAIN, |(_, domain)| domain);
            return Some(Region {
                id: (*id).into(),
                domain: Some((*domain).into()),
            });
        }
        self.config_file
            .iter()
            .chain(self.metadata.iter())
            .find(|info| info.knows(region))
            .map(|info| Region {
                id: info.region_identifier.as_str().into(),
                domain: Some(info.realm_domain_component.as_str().into()),
            })
    }
}

/// A region must be non-empty and contain no whitespace.
pub fn validate(region: &str) -> Result<(), RegionError> {
    if region.is_empty() || region.chars().any(char::is_whitespace) {
        return Err(RegionError::Invalid(region.to_owned()));
    }
    Ok(())
}
