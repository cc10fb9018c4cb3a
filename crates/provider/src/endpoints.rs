//! Where a mount's calls go: the one place a region becomes the Secrets, Certificates and
//! Vault URLs its requests are built with. The principal's region comes with its established
//! identity; a region a SecretProviderClass names is resolved here, among the regions the
//! provider knows (never a host); the operator's overrides (`[endpoints]`) come first.

use std::sync::Arc;

use std::collections::BTreeMap;

use regions::{Region, RegionError, Regions};

/// The operator's URLs instead of a region's (`[endpoints]`): tests point them at the
/// emulator, a private endpoint per region in production.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointOverrides {
    /// Secrets API base URL for every region.
    pub secrets: Option<String>,
    /// Secrets API base URLs by region id, before `secrets`.
    pub secrets_by_region: BTreeMap<String, String>,
    /// Certificates API base URL for every region.
    pub certificates: Option<String>,
    /// Certificates API base URLs by region id, before `certificates`.
    pub certificates_by_region: BTreeMap<String, String>,
    /// Vault (management) API base URL for every region: ListSecrets.
    pub vaults: Option<String>,
    /// Vault API base URLs by region id, before `vaults`.
    pub vaults_by_region: BTreeMap<String, String>,
}

/// Resolves regions to endpoints. The default knows the built-in regions and has no
/// overrides and no configured region.
#[derive(Debug, Default)]
pub struct Endpoints {
    regions: Regions,
    configured: Option<Region>,
    overrides: EndpointOverrides,
    /// The endpoints of the regions mounts named lately, built once each (at most
    /// [`MEMO_REGIONS`]: a node's mounts name a handful).
    memo: std::sync::Mutex<Vec<Arc<RegionEndpoints>>>,
}

impl Clone for Endpoints {
    fn clone(&self) -> Self {
        Self {
            regions: self.regions.clone(),
            configured: self.configured.clone(),
            overrides: self.overrides.clone(),
            memo: std::sync::Mutex::default(),
        }
    }
}

/// The regions whose endpoints [`Endpoints`] keeps built.
const MEMO_REGIONS: usize = 32;

/// One region's endpoints, without a trailing slash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionEndpoints {
    /// The region; `None` when the principal's is not known and the overrides serve.
    pub region: Option<Region>,
    /// Secrets API base URL.
    pub secrets: String,
    /// Certificates API base URL.
    pub certificates: String,
    /// Vault (management) API base URL, which lists a vault's secrets; `None` without a
    /// known region or an override (only `tag` and `namePrefix` entries need it).
    pub vaults: Option<String>,
}

impl RegionEndpoints {
    /// The second-level domain of the region's realm, when known.
    pub fn realm(&self) -> Option<&str> {
        self.region.as_ref().and_then(Region::domain)
    }

    /// The region id, as logs name it (`configured endpoints` without a region).
    pub fn name(&self) -> &str {
        self.region
            .as_ref()
            .map_or("configured endpoints", Region::id)
    }
}

/// Why a mount has no endpoint to call. Configuration, so `InvalidArgument`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The principal's region is not known and no override serves every region.
    #[error("no region is configured (OCI_RESOURCE_PRINCIPAL_REGION) and no {0} endpoint")]
    NoRegion(&'static str),
    /// The region is not one the provider knows.
    #[error(transparent)]
    Region(#[from] RegionError),
}

impl Endpoints {
    /// With the regions the process knows, the configured region (`auth.region`, resolved
    /// as the principals resolve it) and the operator's overrides.
    pub fn new(
        regions: Regions,
        configured_region: Option<&str>,
        overrides: EndpointOverrides,
    ) -> Result<Self, RegionError> {
        let configured = configured_region.map(|r| regions.resolve(r)).transpose()?;
        Ok(Self {
            regions,
            configured,
            overrides,
            memo: std::sync::Mutex::default(),
        })
    }

    /// The regions the process knows.
    pub fn regions(&self) -> &Regions {
        &self.regions
    }

    /// The configured region: workload identity's, known before any exchange (so a mount
    /// that could not be served is refused before one).
    pub fn configured_region(&self) -> Option<&Region> {
        self.configured.as_ref()
    }

    /// The endpoints of a principal's region (`None`: not known; then only overrides).
    pub fn of(&self, region: Option<&Region>) -> Result<Arc<RegionEndpoints>, EndpointError> {
        let same =
            |e: &&Arc<RegionEndpoints>| e.region.as_ref().map(Region::id) == region.map(Region::id);
        let memo = || {
            self.memo
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(built) = memo().iter().find(same) {
            return Ok(built.clone());
        }
        let built = Arc::new(self.build(region)?);
        let mut memo = memo();
        if memo.len() < MEMO_REGIONS && !memo.iter().any(|e| same(&e)) {
            memo.push(built.clone());
        }
        Ok(built)
    }

    fn build(&self, region: Option<&Region>) -> Result<RegionEndpoints, EndpointError> {
        let o = &self.overrides;
        let secrets = pick(
            region,
            &o.secrets_by_region,
            o.secrets.as_deref(),
            "secrets",
            |r| match r.domain() {
                Some(domain) => format!("https://secrets.vaults.{r}.oci.{domain}"),
                None => format!("https://secrets.{r}"),
            },
        )?;
        let certificates = pick(
            region,
            &o.certificates_by_region,
            o.certificates.as_deref(),
            "certificates",
            |r| match r.domain() {
                Some(domain) => format!("https://certificates.{r}.oci.{domain}"),
                None => format!("https://certificates.{r}"),
            },
        )?;
        let vaults = pick(
            region,
            &o.vaults_by_region,
            o.vaults.as_deref(),
            "vaults",
            |r| match r.domain() {
                Some(domain) => format!("https://vaults.{r}.oci.{domain}"),
                None => format!("https://vaults.{r}"),
            },
        )
        .ok();
        Ok(RegionEndpoints {
            region: region.cloned(),
            secrets,
            certificates,
            vaults,
        })
    }

    /// The endpoints of a region a SecretProviderClass names: only a region id or short
    /// code of the built-in table or of the operator's region metadata.
    pub fn named(&self, region: &str) -> Result<Arc<RegionEndpoints>, EndpointError> {
        let region = self.regions.resolve_known(region)?;
        self.of(Some(&region))
    }
}

/// The override for the region, else the one for every region, else the region's own URL
/// (spec 2.1: `https://secrets.vaults.<region>.oci.<domain>`; the SDK's Certificates
/// template `https://certificates.<region>.oci.<domain>`, `docs/oci-certificates.md`; its
/// Vault template `https://vaults.<region>.oci.<domain>`; a dotted region is the host's own
/// domain).
fn pick(
    region: Option<&Region>,
    by_region: &BTreeMap<String, String>,
    every: Option<&str>,
    service: &'static str,
    own: impl FnOnce(&Region) -> String,
) -> Result<String, EndpointError> {
    let chosen = region
        .and_then(|r| by_region.get(r.id()).map(String::as_str))
        .or(every);
    match (chosen, region) {
        (Some(url), _) => Ok(url.trim_end_matches('/').to_owned()),
        (None, Some(region)) => Ok(own(region)),
        (None, None) => Err(EndpointError::NoRegion(service)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_its_own_endpoints_unless_the_operator_overrides_them() {
        let overrides = EndpointOverrides {
            secrets_by_region: [("us-phoenix-1".into(), "https://vault.phx.example/".into())]
                .into(),
            certificates: Some("https://certs.example".into()),
            ..EndpointOverrides::default()
        };
        let endpoints = Endpoints::new(Regions::default(), Some("ric"), overrides).unwrap();
        let iad = endpoints.named("iad").unwrap();
        assert_eq!(
            iad.secrets,
            "https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com"
        );
        assert_eq!(iad.certificates, "https://certs.example");
        assert_eq!(
            iad.vaults.as_deref(),
            Some("https://vaults.us-ashburn-1.oci.oraclecloud.com")
        );
        assert_eq!(
            (iad.name(), iad.realm()),
            ("us-ashburn-1", Some("oraclecloud.com"))
        );
        let phx = endpoints.named("PHX").unwrap();
        assert_eq!(phx.secrets, "https://vault.phx.example");
        let configured = endpoints.of(endpoints.configured_region()).unwrap();
        assert_eq!(
            configured.secrets,
            "https://secrets.vaults.us-gov-ashburn-1.oci.oraclegovcloud.com"
        );
        assert_eq!(configured.realm(), Some("oraclegovcloud.com"));
        let plain = Endpoints::default().of(Regions::default().resolve("ltn").ok().as_ref());
        assert_eq!(
            plain.unwrap().certificates,
            "https://certificates.uk-gov-london-1.oci.oraclegovcloud.uk"
        );
    }

    #[test]
    fn every_realm_and_a_dotted_region_have_their_secrets_and_certificates_urls() {
        let regions = Regions::default();
        let cases = [
            (
                "iad",
                "https://secrets.vaults.us-ashburn-1.oci.oraclecloud.com",
                "https://certificates.us-ashburn-1.oci.oraclecloud.com",
            ),
            (
                "ric",
                "https://secrets.vaults.us-gov-ashburn-1.oci.oraclegovcloud.com",
                "https://certificates.us-gov-ashburn-1.oci.oraclegovcloud.com",
            ),
            (
                "eu-frankfurt-2",
                "https://secrets.vaults.eu-frankfurt-2.oci.oraclecloud.eu",
                "https://certificates.eu-frankfurt-2.oci.oraclecloud.eu",
            ),
            (
                "region.example.com",
                "https://secrets.region.example.com",
                "https://certificates.region.example.com",
            ),
        ];
        for (input, secrets, certificates) in cases {
            let region = regions.resolve(input).unwrap();
            let urls = Endpoints::default().of(Some(&region)).unwrap();
            assert_eq!(
                (urls.secrets.as_str(), urls.certificates.as_str()),
                (secrets, certificates)
            );
        }
    }

    #[test]
    fn without_a_region_only_an_override_for_every_region_serves() {
        let err = Endpoints::default().of(None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no region is configured (OCI_RESOURCE_PRINCIPAL_REGION) and no secrets endpoint"
        );
        let secrets_only = EndpointOverrides {
            secrets: Some("https://secrets.example".into()),
            ..EndpointOverrides::default()
        };
        let endpoints = Endpoints::new(Regions::default(), None, secrets_only).unwrap();
        let err = endpoints.of(None).unwrap_err();
        assert!(
            err.to_string().ends_with("no certificates endpoint"),
            "{err}"
        );
        let both = EndpointOverrides {
            secrets: Some("https://secrets.example".into()),
            certificates: Some("https://certificates.example".into()),
            ..EndpointOverrides::default()
        };
        let served = Endpoints::new(Regions::default(), None, both)
            .unwrap()
            .of(None)
            .unwrap();
        assert_eq!(served.vaults, None, "only selections need it");
        assert_eq!(served.name(), "configured endpoints");
        assert_eq!(served.realm(), None);
    }

    #[test]
    fn a_class_names_only_regions_the_provider_knows_never_a_host() {
        let endpoints = Endpoints::default();
        for tenant in [
            "evil.example.com",
            "a@127.0.0.1:9",
            "xx-nowhere-9",
            "iad:443",
        ] {
            let err = endpoints.named(tenant).unwrap_err();
            assert!(
                matches!(err, EndpointError::Region(RegionError::Unknown(_))),
                "{tenant}: {err}"
            );
        }
    }
}
