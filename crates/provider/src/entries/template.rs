//! Template entries: one file rendered from other files of the same class, in a sandboxed
//! subset of Jinja ([`crate::template`], the engine). Their checks (the template held to the
//! subset, what it reads written by another entry of the class) and their render, once the
//! fan-out has fetched the other entries: off the async workers, on the blocking pool behind
//! `MountContext::template_renders` (fewer permits than workers), all of a mount's templates
//! in one task under one [`Work`] (their fuel shared; the work stops at the mount's deadline
//! or as soon as nobody waits for the answer); each file's object version is a digest of the
//! versions of what it read and of the template itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_grpc::{ErrorKind, File, FileContents, FileMode, FilePath, MountError, ObjectVersion};
use zeroize::Zeroizing;

use super::FileDescription;
use super::run::{EntryFiles, EntryVersion, MountRun};
use crate::params::fields::parse_mode;
use crate::params::problems::{ParamError, Problems, RETRIEVE_PREFIX};
use crate::params::yaml::RawSecret;
use crate::template::{Input, RenderError, Renders, Reserve, TEMPLATE_FUEL, Work};

/// One `template` entry: a file rendered from other files of the class
/// ([`crate::template`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateSpec {
    /// Its position in the `secrets` list.
    pub index: usize,
    /// The template, checked against the subset.
    pub source: String,
    /// Where the rendered file is written (`fileName`).
    pub path: FilePath,
    /// Its mode; `None`: the request's permission.
    pub mode: Option<csi_grpc::FileMode>,
    /// The files it reads, by the name a constant gives (`text("…")`), with where.
    pub reads: Vec<(String, usize, usize)>,
}

/// A `template` entry: its fields, and its template held to the subset (every problem at
/// its line and column). Which files it reads is checked with the whole list.
pub(crate) fn check(
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
pub(crate) fn check_reads(
    templates: &[&TemplateSpec],
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
/// The most a template's output may be, per byte of its text and of the class's files.
pub(crate) const TEMPLATE_OUTPUT_FACTOR: usize = 4;

/// Renders `templates` from the files of `entries` (shared with the renders, not copied,
/// and given back), each within the room the mount's other files leave.
pub(crate) async fn render_templates(
    run: &MountRun<'_>,
    templates: &[&TemplateSpec],
    entries: &mut [EntryFiles],
) -> Result<Vec<EntryFiles>, MountError> {
    if templates.is_empty() {
        return Ok(Vec::new());
    }
    let inputs = take_inputs(entries);
    let written: usize = entries
        .iter()
        .filter(|e| e.write)
        .flat_map(|e| &e.files)
        .map(|f| inputs.get(f.path.as_str()).map_or(0, |i| i.bytes.len()))
        .sum();
    let work = Work::new(TEMPLATE_FUEL, Some(run.request.deadline.into_std()));
    let job = Job {
        templates: templates.iter().map(|t| (*t).clone()).collect(),
        renders: Renders::new(inputs.clone(), reserve(run), work.clone()),
        written,
        max_total_bytes: run.config.max_total_bytes,
        mode: run.request.file_mode,
    };
    let outcome = run_off_the_workers(run, job, work).await;
    give_back(entries, inputs);
    outcome
}

/// Runs `job` on the blocking pool once a render permit is free, stopping its work at the
/// mount's deadline or when this future is dropped.
async fn run_off_the_workers(
    run: &MountRun<'_>,
    job: Job,
    work: Arc<Work>,
) -> Result<Vec<EntryFiles>, MountError> {
    let cancel = CancelOnDrop(work);
    let _permit = run
        .config
        .template_renders
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| MountError::internal("the template renders' permits are closed"))?;
    let outcome = tokio::task::spawn_blocking(move || job.run())
        .await
        .map_err(|_| MountError::internal("a template render failed"));
    drop(cancel);
    outcome?
}

/// Stops the renders' work when the mount's future is dropped (its caller gave up).
struct CancelOnDrop(Arc<Work>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// What the blocking task owns: the templates, their renders, and the room left.
struct Job {
    templates: Vec<TemplateSpec>,
    renders: Renders,
    written: usize,
    max_total_bytes: usize,
    mode: FileMode,
}

impl Job {
    fn run(self) -> Result<Vec<EntryFiles>, MountError> {
        let mut written = self.written;
        let mut rendered = Vec::with_capacity(self.templates.len());
        // A template's output is at most a few times what it is made of (its text and the
        // class's files): the memory a mount may take stays a multiple of what it read.
        let made_of = self.renders.input_bytes();
        for spec in &self.templates {
            let allowance = TEMPLATE_OUTPUT_FACTOR.saturating_mul(made_of + spec.source.len());
            let room = self.max_total_bytes.saturating_sub(written).min(allowance);
            let entry = self.render_one(spec, room)?;
            written += entry.files.iter().map(|f| f.contents.len()).sum::<usize>();
            rendered.push(entry);
        }
        Ok(rendered)
    }

    fn render_one(&self, spec: &TemplateSpec, room: usize) -> Result<EntryFiles, MountError> {
        let mut done = self.renders.render(&spec.source, room).map_err(|e| {
            let RenderError {
                message,
                exhausted,
                late,
            } = e;
            let kind = if late {
                ErrorKind::DeadlineExceeded
            } else if exhausted {
                ErrorKind::ResourceExhausted
            } else {
                ErrorKind::InvalidArgument
            };
            MountError::new(kind, format!("secrets[{}].template {message}", spec.index))
        })?;
        Ok(EntryFiles {
            index: spec.index,
            files: vec![File {
                path: spec.path.clone(),
                mode: spec.mode.unwrap_or(self.mode),
                contents: FileContents::new(std::mem::take(&mut *done.output)),
            }],
            versions: vec![EntryVersion::Template(ObjectVersion {
                id: format!("template:{}", spec.path),
                version: digest(&spec.source, &done.read),
            })],
            // The output is held in the byte budget until the mount is answered.
            reservations: done.reservations,
            write: true,
        })
    }
}

/// What the renders reserve from the byte budget, in the mount's namespace.
fn reserve(run: &MountRun<'_>) -> Arc<Reserve> {
    let budget = run.config.byte_budget.clone();
    let namespace: Arc<str> = Arc::from(run.namespace);
    Arc::new(move |len: usize| match &budget {
        Some(budget) => budget
            .try_reserve_for(&namespace, len)
            .map(Some)
            .map_err(|refusal| refusal.to_string()),
        None => Ok(None),
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

/// The entry's file as `check` shows it: what it reads.
pub(crate) fn describe(spec: &TemplateSpec) -> Vec<FileDescription> {
    let mut reads: Vec<&str> = spec.reads.iter().map(|(f, _, _)| f.as_str()).collect();
    reads.dedup();
    vec![FileDescription {
        path: spec.path.as_str().to_owned(),
        mode: spec.mode,
        source: format!("template reading {}", reads.join(", ")),
        vault: String::new(),
        selector: String::new(),
        key: String::new(),
        encoding: "utf-8".to_owned(),
        written: true,
        selection: None,
    }]
}
