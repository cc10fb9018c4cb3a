//! Upstream exchange durations by host class and status class, fed by the transport.

use super::*;

/// Which class of upstream an authority is (`secrets`, `certificates`, `vaults`,
/// `kubernetes`, `proxymux`, `federation`, `identity_domain`, `imds`): the configured
/// endpoints, then the OCI host names.
#[derive(Debug, Default)]
pub(crate) struct HostClasses(std::collections::BTreeMap<String, &'static str>);

impl HostClasses {
    pub(crate) fn insert(&mut self, authority: String, class: &'static str) {
        self.0.entry(authority).or_insert(class);
    }

    fn class(&self, authority: &str) -> &'static str {
        if let Some(class) = self.0.get(authority) {
            return class;
        }
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        if host.starts_with("secrets.") {
            "secrets"
        } else if host.starts_with("certificates.") {
            "certificates"
        } else if host.starts_with("vaults.") {
            "vaults"
        } else if host.starts_with("auth.") {
            "federation"
        } else if host.ends_with(".identity.oraclecloud.com") {
            "identity_domain"
        } else if host == "169.254.169.254" {
            "imds"
        } else if authority.ends_with(":12250") {
            "proxymux"
        } else {
            "other"
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ExchangeLabel {
    host_class: &'static str,
    status_class: &'static str,
}

/// Upstream exchange durations by host class and status class, fed by the transport.
#[derive(Debug)]
pub(crate) struct UpstreamTimings {
    classes: HostClasses,
    pub(super) durations: Family<ExchangeLabel, Histogram, fn() -> Histogram>,
}

impl UpstreamTimings {
    pub(crate) fn new(classes: HostClasses) -> Self {
        fn buckets() -> Histogram {
            Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ])
        }
        Self {
            classes,
            durations: Family::new_with_constructor(buckets),
        }
    }
}

impl transport::ExchangeObserver for UpstreamTimings {
    fn exchanged(&self, authority: &str, outcome: transport::Outcome, elapsed: Duration) {
        let status_class = match outcome {
            transport::Outcome::Status(s) if s < 200 => "1xx",
            transport::Outcome::Status(s) if s < 300 => "2xx",
            transport::Outcome::Status(s) if s < 400 => "3xx",
            transport::Outcome::Status(s) if s < 500 => "4xx",
            transport::Outcome::Status(_) => "5xx",
            transport::Outcome::Failed(transport::ErrorKind::Connect) => "connect_error",
            transport::Outcome::Failed(transport::ErrorKind::Timeout) => "timeout",
            transport::Outcome::Failed(transport::ErrorKind::TooLarge) => "too_large",
            transport::Outcome::Failed(_) => "error",
        };
        let label = ExchangeLabel {
            host_class: self.classes.class(authority),
            status_class,
        };
        self.durations
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
    }
}
