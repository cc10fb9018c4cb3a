//! The list as a whole: every entry checked by its kind (`crate::entries`), no file written
//! twice or colliding with another, every file a template reads written by another entry.

use std::collections::BTreeMap;

use bounded::quote;
use csi_grpc::{FilePath, validate_file_set};

use super::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use super::spec::ClassDefaults;
use super::yaml::RawSecret;
use crate::entries::{Entry, check_reads};

/// The files the entries write or read, every kind counted (a selection's are known only
/// once its vault is listed).
pub(super) fn files(entries: &[Entry]) -> usize {
    entries.iter().map(|e| e.files().len()).sum()
}

/// Every entry, each checked whatever the others gave; their problems go to `problems` and
/// the entries without any are answered, in the class's order.
pub(super) fn check_entries(
    raw: Vec<RawSecret>,
    class: ClassDefaults<'_>,
    problems: &mut Problems,
) -> Vec<Entry> {
    if raw.is_empty() {
        problems.note(crate::entries::none_given());
        return Vec::new();
    }
    check_template_count(&raw, problems);
    let mut entries = Vec::with_capacity(raw.len());
    let mut files = FileNames::default();
    for (index, item) in raw.iter().enumerate() {
        let Some(entry) = Entry::check(index, item, class, problems) else {
            continue;
        };
        for (path, key, what) in entry.claims(item) {
            problems.take(files.claim(path, index, key, what));
        }
        entries.push(entry);
    }
    // What the templates read is written by the other entries (read or written).
    let read: Vec<&FilePath> = entries
        .iter()
        .filter(|e| !matches!(e, Entry::Template(_)))
        .flat_map(Entry::files)
        .collect();
    let templates: Vec<&crate::entries::TemplateSpec> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Template(t) => Some(t),
            _ => None,
        })
        .collect();
    check_reads(&templates, &read, problems);
    // The driver's rules for the set of written files (no file that is also a directory,
    // ...); duplicates were named above, entry by entry.
    if !files.duplicated {
        let written = entries
            .iter()
            .filter(|e| e.written())
            .flat_map(Entry::files);
        problems.take(validate_file_set(written).map_err(|e| {
            ParamError::new(format!(
                "{RETRIEVE_PREFIX}: invalid file name in parameter \"secrets\": {e}"
            ))
        }));
    }
    entries
}

/// At most [`crate::template::MAX_TEMPLATES`] template entries: their renders share one
/// mount's work, but each is parsed and checked first.
fn check_template_count(raw: &[RawSecret], problems: &mut Problems) {
    let templates = raw.iter().filter(|item| item.template.is_some()).count();
    if templates > crate::template::MAX_TEMPLATES {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: parameter \"secrets\" has {templates} template entries; a \
             class may have at most {}",
            crate::template::MAX_TEMPLATES
        )));
    }
}

/// The files written so far, the entry writing each, and whether one was claimed twice.
#[derive(Default)]
struct FileNames {
    claimed: BTreeMap<String, usize>,
    duplicated: bool,
}

impl FileNames {
    /// `path` for entry `index` (its `keys[k]` item), refused when an earlier entry writes it.
    fn claim(
        &mut self,
        path: &FilePath,
        index: usize,
        key: Option<usize>,
        what: &str,
    ) -> Result<(), ParamError> {
        let Some(first) = self.claimed.insert(path.as_str().to_owned(), index) else {
            return Ok(());
        };
        self.duplicated = true;
        let this = match key {
            Some(k) => format!("secrets[{index}].keys[{k}]"),
            None => format!("secrets[{index}]"),
        };
        Err(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: {what}: {}: secrets[{first}] and {this} would both be written to \
             file {}",
            quote(path.as_str()),
            quote(path.as_str())
        )))
    }
}
