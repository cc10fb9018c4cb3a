//! The classes parsed lately, kept by their parameters: the driver mounts every volume again
//! on each rotation poll (v1.6's `RequiresRepublish`), with the same parameters, so a class is
//! parsed (and its misspelt parameters warned about) once, not on every republish.
//!
//! A class is its parameters: the attributes without a `/` in their name (the driver's
//! `csi.storage.k8s.io/...` attributes of the pod are not read by the parse), so the pods of
//! one Deployment share an entry, a new pod's first mount included. An entry is found by a
//! digest of those and the parse's inputs (the pod's namespace and service account given or
//! not, the limits), then compared whole: a digest
//! shared by two classes never serves one for the other. Bounded in entries and in bytes
//! (each weighed as its attributes, copied, and a parse's worth of them: ARCHITECTURE.md's
//! cost model counts the bytes); the least recently used goes first. Only classes that parse
//! are kept.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use csi_grpc::Pod;

use crate::params::{MountParameters, ParseLimits};

/// What decides a parse besides the attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Inputs {
    namespace: bool,
    service_account: bool,
    max_secrets: usize,
    max_files: usize,
}

/// The classes parsed lately (see the module's documentation).
#[derive(Debug)]
pub struct ParsedClasses {
    state: Mutex<State>,
    max_entries: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, Kept>,
    bytes: usize,
    clock: u64,
}

#[derive(Debug)]
struct Kept {
    attributes: BTreeMap<String, String>,
    inputs: Inputs,
    params: Arc<MountParameters>,
    bytes: usize,
    used: u64,
}

impl Default for ParsedClasses {
    fn default() -> Self {
        Self::new(1024, 4 << 20)
    }
}

impl ParsedClasses {
    /// At most `max_entries` classes weighing at most `max_bytes`.
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            state: Mutex::default(),
            max_entries,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The class of `attributes` parsed lately with the same inputs, else `parse`'s answer,
    /// kept when it is a class.
    pub(crate) fn get_or_parse<E>(
        &self,
        attributes: &BTreeMap<String, String>,
        pod: &Pod,
        limits: ParseLimits,
        parse: impl FnOnce() -> Result<MountParameters, E>,
    ) -> Result<Arc<MountParameters>, E> {
        let present = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        let inputs = Inputs {
            namespace: present(&pod.namespace),
            service_account: present(&pod.service_account),
            max_secrets: limits.max_secrets,
            max_files: limits.max_files,
        };
        let digest = digest(attributes, inputs);
        {
            let mut state = self.lock();
            state.clock += 1;
            let now = state.clock;
            if let Some(kept) = state.entries.get_mut(&digest)
                && kept.inputs == inputs
                && kept.attributes.iter().eq(class_parameters(attributes))
            {
                kept.used = now;
                return Ok(kept.params.clone());
            }
        }
        let params = Arc::new(parse()?);
        let bytes: usize = class_parameters(attributes)
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
            .saturating_mul(1 + crate::params::PARSE_BYTES_PER_BYTE);
        if bytes <= self.max_bytes {
            self.keep(digest, attributes, inputs, &params, bytes);
        }
        Ok(params)
    }

    fn keep(
        &self,
        digest: u64,
        attributes: &BTreeMap<String, String>,
        inputs: Inputs,
        params: &Arc<MountParameters>,
        bytes: usize,
    ) {
        let mut state = self.lock();
        if let Some(old) = state.entries.remove(&digest) {
            state.bytes -= old.bytes;
        }
        while !state.entries.is_empty()
            && (state.entries.len() >= self.max_entries || state.bytes + bytes > self.max_bytes)
        {
            let Some(oldest) = state
                .entries
                .iter()
                .min_by_key(|(_, kept)| kept.used)
                .map(|(digest, _)| *digest)
            else {
                break;
            };
            if let Some(gone) = state.entries.remove(&oldest) {
                state.bytes -= gone.bytes;
            }
        }
        let used = state.clock;
        state.bytes += bytes;
        state.entries.insert(
            digest,
            Kept {
                attributes: class_parameters(attributes)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                inputs,
                params: params.clone(),
                bytes,
                used,
            },
        );
    }

    /// Classes kept now, and their weight.
    pub fn len_and_bytes(&self) -> (usize, usize) {
        let state = self.lock();
        (state.entries.len(), state.bytes)
    }
}

/// The attributes the parse reads: the class's parameters, not the driver's attributes of
/// the pod (`csi.storage.k8s.io/pod.name`, `.../pod.uid`, ...).
fn class_parameters(
    attributes: &BTreeMap<String, String>,
) -> impl Iterator<Item = (&String, &String)> {
    attributes.iter().filter(|(key, _)| !key.contains('/'))
}

fn digest(attributes: &BTreeMap<String, String>, inputs: Inputs) -> u64 {
    // Fixed keys: the digest only finds an entry, the entry is compared whole.
    let mut hasher = std::hash::DefaultHasher::new();
    for (key, value) in class_parameters(attributes) {
        key.hash(&mut hasher);
        value.hash(&mut hasher);
    }
    inputs.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ParamError;

    fn attrs(secrets: &str) -> BTreeMap<String, String> {
        [
            ("secrets", secrets),
            ("vaultId", "ocid1.vault.oc1..v"),
            ("authType", "instance"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn parse(attributes: &BTreeMap<String, String>) -> Result<MountParameters, ParamError> {
        MountParameters::parse(attributes, &Pod::default())
    }

    #[test]
    fn a_class_is_parsed_once_then_served_and_only_to_the_same_parameters() {
        let classes = ParsedClasses::new(8, 1 << 20);
        let limits = ParseLimits::default();
        let pod = Pod::default();
        let mut parses = 0;
        let a = attrs("- name: a\n");
        for _ in 0..3 {
            let got = classes
                .get_or_parse(&a, &pod, limits, || {
                    parses += 1;
                    parse(&a)
                })
                .unwrap();
            assert_eq!(got.secrets()[0].path.as_str(), "a");
        }
        assert_eq!(parses, 1);
        let b = attrs("- name: b\n");
        let got = classes
            .get_or_parse(&b, &pod, limits, || {
                parses += 1;
                parse(&b)
            })
            .unwrap();
        assert_eq!(got.secrets()[0].path.as_str(), "b");
        assert_eq!(parses, 2);
        // Another limit is another parse.
        let fewer = ParseLimits {
            max_secrets: 1,
            ..limits
        };
        classes
            .get_or_parse(&b, &pod, fewer, || {
                parses += 1;
                parse(&b)
            })
            .unwrap();
        assert_eq!(parses, 3);
        // A class that does not parse is not kept.
        let bad = attrs("- mode: 400\n");
        for _ in 0..2 {
            assert!(
                classes
                    .get_or_parse(&bad, &pod, limits, || {
                        parses += 1;
                        parse(&bad)
                    })
                    .is_err()
            );
        }
        assert_eq!(parses, 5);
    }

    #[test]
    fn the_pods_of_one_class_share_its_entry_and_another_parameter_does_not() {
        let classes = ParsedClasses::new(8, 1 << 20);
        let limits = ParseLimits::default();
        let mut parses = 0;
        for pod in 0..5 {
            let mut a = attrs("- name: a\n");
            a.insert("csi.storage.k8s.io/pod.name".into(), format!("web-{pod}"));
            a.insert("csi.storage.k8s.io/pod.uid".into(), format!("uid-{pod}"));
            a.insert("secretProviderClass".into(), "app".into());
            classes
                .get_or_parse(&a, &Pod::default(), limits, || {
                    parses += 1;
                    parse(&a)
                })
                .unwrap();
        }
        assert_eq!(parses, 1, "five pods of one class are one parse");
        // A parameter the parse does not read but has no `/` (another provider's, a
        // misspelling warned about) still makes another class.
        let mut a = attrs("- name: a\n");
        a.insert("secretProviderClass".into(), "app".into());
        a.insert("vaultid".into(), "misspelt".into());
        classes
            .get_or_parse(&a, &Pod::default(), limits, || {
                parses += 1;
                parse(&a)
            })
            .unwrap();
        assert_eq!(parses, 2);
        let (entries, bytes) = classes.len_and_bytes();
        assert_eq!(entries, 2);
        // Only the class parameters are weighed, not the pods' attributes.
        let weight = |a: &BTreeMap<String, String>| -> usize {
            a.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
                * (1 + crate::params::PARSE_BYTES_PER_BYTE)
        };
        let mut first = attrs("- name: a\n");
        first.insert("secretProviderClass".into(), "app".into());
        assert_eq!(bytes, weight(&first) + weight(&a));
    }

    #[test]
    fn the_kept_classes_stay_within_their_entries_and_bytes_least_recently_used_first() {
        let classes = ParsedClasses::new(3, 1 << 20);
        let (limits, pod) = (ParseLimits::default(), Pod::default());
        for i in 0..10 {
            let a = attrs(&format!("- name: s{i}\n"));
            classes
                .get_or_parse(&a, &pod, limits, || parse(&a))
                .unwrap();
            assert!(classes.len_and_bytes().0 <= 3);
        }
        let small = ParsedClasses::new(100, 2_000);
        for i in 0..10 {
            let a = attrs(&format!("- name: s{i}\n"));
            small.get_or_parse(&a, &pod, limits, || parse(&a)).unwrap();
            assert!(
                small.len_and_bytes().1 <= 2_000,
                "{:?}",
                small.len_and_bytes()
            );
        }
    }
}
