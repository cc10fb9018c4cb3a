//! The class's `template` entries rendered from the files of its other entries, once the
//! fan-out has fetched them: each template's file and object version (a digest of the
//! versions of what it read and of the template itself).

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_grpc::{ErrorKind, File, FileContents, MountError, ObjectVersion};
use zeroize::Zeroizing;

use super::entries::{EntryFiles, EntryVersion, MountRun};
use crate::params::TemplateSpec;
use crate::template::{Input, render};

/// The most a template's output may be, per byte of its text and of the class's files.
pub(crate) const TEMPLATE_OUTPUT_FACTOR: usize = 4;

/// Renders `templates` from the files of `entries` (shared with the renders, not copied,
/// and given back), each within the room the mount's other files leave.
pub(super) fn render_templates(
    run: &MountRun<'_>,
    templates: &[TemplateSpec],
    entries: &mut [EntryFiles],
) -> Result<Vec<EntryFiles>, MountError> {
    if templates.is_empty() {
        return Ok(Vec::new());
    }
    let inputs = take_inputs(entries);
    let mut written: usize = entries
        .iter()
        .filter(|e| e.write)
        .flat_map(|e| &e.files)
        .map(|f| inputs.get(f.path.as_str()).map_or(0, |i| i.bytes.len()))
        .sum();
    let mut rendered = Vec::with_capacity(templates.len());
    let mut outcome = Ok(());
    // A template's output is at most a few times what it is made of (its text and the
    // class's files): the memory a mount may take stays a multiple of what it read.
    let made_of: usize = inputs.values().map(|i| i.bytes.len()).sum();
    for spec in templates {
        let allowance = TEMPLATE_OUTPUT_FACTOR.saturating_mul(made_of + spec.source.len());
        let room = run
            .config
            .max_total_bytes
            .saturating_sub(written)
            .min(allowance);
        match render_one(run, spec, inputs.clone(), room) {
            Ok(entry) => {
                written += entry.files.iter().map(|f| f.contents.len()).sum::<usize>();
                rendered.push(entry);
            }
            Err(err) => {
                outcome = Err(err);
                break;
            }
        }
    }
    give_back(entries, inputs);
    outcome.map(|()| rendered)
}

fn render_one(
    run: &MountRun<'_>,
    spec: &TemplateSpec,
    inputs: BTreeMap<String, Input>,
    room: usize,
) -> Result<EntryFiles, MountError> {
    let budget = run.config.byte_budget.clone();
    let namespace: Arc<str> = Arc::from(run.namespace);
    let reserve = Arc::new(move |len: usize| match &budget {
        Some(budget) => budget
            .try_reserve_for(
                &namespace,
                len.saturating_mul(crate::extract::PARSE_BYTES_PER_BYTE),
            )
            .map(Some)
            .map_err(|refusal| refusal.to_string()),
        None => Ok(None),
    });
    let (mut output, read) = render(&spec.source, inputs, room, reserve).map_err(|e| {
        let kind = if e.exhausted {
            ErrorKind::ResourceExhausted
        } else {
            ErrorKind::InvalidArgument
        };
        MountError::new(
            kind,
            format!("secrets[{}].template {}", spec.index, e.message),
        )
    })?;
    Ok(EntryFiles {
        index: spec.index,
        files: vec![File {
            path: spec.path.clone(),
            mode: spec.mode.unwrap_or(run.request.file_mode),
            contents: FileContents::new(std::mem::take(&mut *output)),
        }],
        versions: vec![EntryVersion::Template(ObjectVersion {
            id: format!("template:{}", spec.path),
            version: digest(&spec.source, &read),
        })],
        reservations: Vec::new(),
        write: true,
    })
}

/// A template's object version: changes whenever the template or the version of a file it
/// read does.
fn digest(source: &str, read: &[(String, String)]) -> String {
    let mut context = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    context.update(source.as_bytes());
    for (file, version) in read {
        context.update(b"\0");
        context.update(file.as_bytes());
        context.update(b"=");
        context.update(version.as_bytes());
    }
    context
        .finish()
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every file of `entries` as a template input: its bytes moved into a shared buffer (the
/// file keeps an empty one until [`give_back`]) and its entry's object versions (all of
/// them: a version history's file changes with any).
fn take_inputs(entries: &mut [EntryFiles]) -> BTreeMap<String, Input> {
    let mut inputs = BTreeMap::new();
    for entry in entries.iter_mut() {
        let versions: Vec<String> = entry
            .versions
            .iter()
            .map(|v| match v {
                EntryVersion::Secret {
                    secret_id, version, ..
                } => format!("{secret_id}@{version}"),
                EntryVersion::Certificate(v) | EntryVersion::Template(v) => {
                    format!("{}@{}", v.id, v.version)
                }
            })
            .collect();
        let version = versions.join(",");
        for file in &mut entry.files {
            let contents = std::mem::replace(&mut file.contents, FileContents::new(Vec::new()));
            inputs.insert(
                file.path.as_str().to_owned(),
                Input {
                    bytes: Arc::new(Zeroizing::new(contents.into_vec())),
                    version: version.clone(),
                },
            );
        }
    }
    inputs
}

/// The inputs' bytes back into their files (the renders are over, so each buffer has one
/// owner again).
fn give_back(entries: &mut [EntryFiles], mut inputs: BTreeMap<String, Input>) {
    for entry in entries.iter_mut() {
        for file in &mut entry.files {
            if let Some(input) = inputs.remove(file.path.as_str()) {
                let bytes = Arc::try_unwrap(input.bytes)
                    .map(|mut b| std::mem::take(&mut *b))
                    .unwrap_or_else(|shared| shared.to_vec());
                file.contents = FileContents::new(bytes);
            }
        }
    }
}
