//! `template` entries: the template (checked against the subset), its file and mode.

use csi_grpc::FilePath;

use super::fields::parse_mode;
use super::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use super::spec::TemplateSpec;
use super::yaml::RawSecret;

/// A `template` entry: its fields, and its template held to the subset (every problem at
/// its line and column). Which files it reads is checked with the whole list.
pub(super) fn check_template(
    index: usize,
    item: &RawSecret,
    problems: &mut Problems,
) -> Option<TemplateSpec> {
    let misplaced = item.misplaced_in_template();
    if !misplaced.is_empty() {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}] is a template entry, which takes template, \
             fileName and mode, not {}",
            misplaced.join(", ")
        )));
    }
    let source = item.template.as_deref().unwrap_or_default();
    let checked = crate::template::check(source);
    for problem in &checked.problems {
        problems.note(ParamError::new(format!(
            "{RETRIEVE_PREFIX}: secrets[{index}].template {problem}"
        )));
    }
    let path = match item.file_name.as_deref().map(str::trim) {
        Some(name) if !name.is_empty() => problems.take(FilePath::new(name).map_err(|e| {
            ParamError::new(format!(
                "{RETRIEVE_PREFIX}: invalid file name: secrets[{index}].fileName: {e}"
            ))
        })),
        _ => {
            problems.note(ParamError::new(format!(
                "{RETRIEVE_PREFIX}: secrets[{index}] is a template entry: it needs fileName, \
                 the file it renders"
            )));
            None
        }
    };
    let mode = problems.take(parse_mode(index, item.mode.as_ref()));
    if !misplaced.is_empty() || !checked.problems.is_empty() {
        return None;
    }
    Some(TemplateSpec {
        index,
        source: source.to_owned(),
        path: path?,
        mode: mode?,
        reads: checked.files,
    })
}

/// Every file a template of the class reads is written by another entry of the class.
pub(super) fn check_reads(
    templates: &[TemplateSpec],
    files: &[&FilePath],
    problems: &mut Problems,
) {
    for template in templates {
        for (file, line, column) in &template.reads {
            if !files.iter().any(|f| f.as_str() == file) {
                let listed: Vec<&str> = files.iter().take(20).map(|f| f.as_str()).collect();
                problems.note(ParamError::new(format!(
                    "{RETRIEVE_PREFIX}: secrets[{}].template line {line}, column {column}: no \
                     entry of this class has the file {} (its files: {})",
                    template.index,
                    bounded::quote(file),
                    listed.join(", ")
                )));
            }
        }
    }
}
