//! Rendering a mount's checked templates: a minijinja environment with nothing but our
//! functions, filters and tests, strict undefined values, the mount's one [`Work`] (fuel
//! shared by all its templates, comparisons of documents charged, its deadline), and output
//! written into a buffer that refuses to grow past the room the mount has left and holds
//! what it grows to in the byte budget.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use minijinja::value::{Kwargs, Rest};
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior, Value};
use zeroize::Zeroizing;

use super::doc::Parsed;
use super::work::{Charging, Stop, Work};
use crate::Reservation;

/// One file of the class a template may read: its bytes (shared, not copied) and the
/// object version of the entry that wrote it.
#[derive(Clone)]
pub(crate) struct Input {
    pub(crate) bytes: Arc<Zeroizing<Vec<u8>>>,
    pub(crate) version: String,
}

/// What the renders may hold of the byte budget, asked in bytes (`Ok(None)`: no budget).
pub(crate) type Reserve = dyn Fn(usize) -> Result<Option<Reservation>, String> + Send + Sync;

/// A render's output, the `(file, version)` of each input it read (in the order first
/// read), and the output's bytes held in the byte budget.
pub(crate) struct Rendered {
    pub(crate) output: Zeroizing<Vec<u8>>,
    pub(crate) read: Vec<(String, String)>,
    pub(crate) reservations: Vec<Reservation>,
}

impl std::fmt::Debug for Rendered {
    // Never the output: it is made of secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendered")
            .field(
                "output",
                &format_args!("[redacted; {} bytes]", self.output.len()),
            )
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

/// Why a render failed: `line L, column C: what` (never a value or an input's content), and
/// whether it was for want of room or budget (the mount is then `ResourceExhausted`) or of
/// time (`DeadlineExceeded`).
#[derive(Debug)]
pub(crate) struct RenderError {
    pub(crate) message: String,
    pub(crate) exhausted: bool,
    pub(crate) late: bool,
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(shared: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The renders of one mount: its templates' inputs, each file parsed for `json` once for
/// all of them (and held in the byte budget until they are done), and their one [`Work`].
pub(crate) struct Renders {
    inputs: Arc<BTreeMap<String, Input>>,
    reserve: Arc<Reserve>,
    parsed: Shared<BTreeMap<String, Value>>,
    held: Shared<Vec<Reservation>>,
    work: Arc<Work>,
}

/// What parsing one byte for `json(file)` costs, in fuel: a parse visits each byte a few
/// times and builds the values (minijinja charges serializing at 16 of its 64 units a
/// fuel per byte; a parse costs more).
const PARSE_BYTES_PER_FUEL: u64 = 2;

impl Renders {
    pub(crate) fn new(
        inputs: BTreeMap<String, Input>,
        reserve: Arc<Reserve>,
        work: Arc<Work>,
    ) -> Self {
        Self {
            inputs: Arc::new(inputs),
            reserve,
            parsed: Arc::default(),
            held: Arc::default(),
            work,
        }
    }

    /// The bytes of every input.
    pub(crate) fn input_bytes(&self) -> usize {
        self.inputs.values().map(|i| i.bytes.len()).sum()
    }

    /// Renders `source` (already checked) into at most `room` bytes, within the work left.
    pub(crate) fn render(&self, source: &str, room: usize) -> Result<Rendered, RenderError> {
        if let Some(stop) = self.work.check() {
            return Err(stopped(stop));
        }
        let read = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
        let env = self.environment(room, read.clone());
        let template = env
            .template_from_str(source)
            .map_err(|e| describe(source, &e))?;
        let mut out = Bounded {
            bytes: Zeroizing::new(Vec::new()),
            room,
            reserve: self.reserve.clone(),
            reservations: Vec::new(),
            reserved: 0,
            work: self.work.clone(),
        };
        self.work.start_render();
        let rendered = {
            let _charging = Charging::to(&self.work);
            template
                .render_captured_to((), &mut out)
                .map(|captured| captured.state().fuel_levels().map_or(0, |(spent, _)| spent))
        };
        let spent = match &rendered {
            Ok(spent) => *spent,
            // A failed render is the mount's failure: what it burnt no longer matters.
            Err(_) => self.work.fuel_left(),
        };
        self.work.end_render(spent);
        drop(env);
        if let Some(stop) = self.work.stopped() {
            return Err(stopped(stop));
        }
        rendered.map_err(|e| describe(source, &e))?;
        let read = std::mem::take(&mut *lock(&read));
        Ok(Rendered {
            output: out.bytes,
            read,
            reservations: out.reservations,
        })
    }

    /// The environment of one render: `text`, `json`, `base64` over the inputs (each read
    /// recorded in `read`), the filters and tests, the fuel left, strict undefined values.
    /// Nothing else: no loader, no builtins.
    fn environment(
        &self,
        room: usize,
        read: Shared<Vec<(String, String)>>,
    ) -> Environment<'static> {
        let mut env = Environment::empty();
        env.set_fuel(Some(self.work.fuel_left()));
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // A file is written as its template reads, its last newline included; a line holding
        // only a `{% %}` tag leaves no line behind (Ansible's and Salt's habit for config
        // files).
        if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
            .keep_trailing_newline(true)
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
        {
            env.set_syntax(syntax);
        }
        let inputs = self.inputs.clone();
        let work = self.work.clone();
        let input = move |file: &str| -> Result<Input, Error> {
            if let Some(stop) = work.check() {
                return Err(ours(stop_message(stop)));
            }
            let found = inputs
                .get(file)
                .cloned()
                .ok_or_else(|| ours(format!("no file {} in this class", bounded::quote(file))))?;
            let mut read = lock(&read);
            if !read.iter().any(|(f, _)| f == file) {
                read.push((file.to_owned(), found.version.clone()));
            }
            Ok(found)
        };
        let text_of = input.clone();
        env.add_function("text", move |file: &str| -> Result<Value, Error> {
            let found = text_of(file)?;
            let text = std::str::from_utf8(&found.bytes).map_err(|_| {
                ours(format!(
                    "file {} is not UTF-8 text (read it with base64)",
                    bounded::quote(file)
                ))
            })?;
            Ok(Value::from(text))
        });
        let base64_of = input.clone();
        env.add_function("base64", move |file: &str| -> Result<Value, Error> {
            let found = base64_of(file)?;
            Ok(Value::from(
                base64::engine::general_purpose::STANDARD.encode(found.bytes.as_slice()),
            ))
        });
        self.add_json(&mut env, input);
        filters(&mut env, room);
        tests(&mut env);
        env
    }

    /// `json(file)`: the file parsed (once for all the mount's templates) within the budgets
    /// of a `keys` parse, its reservation held until the renders are done, the parse's work
    /// charged to the render that made it.
    fn add_json(
        &self,
        env: &mut Environment<'static>,
        input: impl Fn(&str) -> Result<Input, Error> + Send + Sync + 'static,
    ) {
        let parsed = self.parsed.clone();
        let held = self.held.clone();
        let reserve = self.reserve.clone();
        env.add_function(
            "json",
            move |state: &State<'_, '_>, file: &str| -> Result<Value, Error> {
                let found = input(file)?;
                if let Some(value) = lock(&parsed).get(file) {
                    return Ok(value.clone());
                }
                state.consume_fuel(found.bytes.len() as u64 / PARSE_BYTES_PER_FUEL)?;
                let reservation = reserve(
                    found
                        .bytes
                        .len()
                        .saturating_mul(crate::extract::PARSE_BYTES_PER_BYTE),
                )
                .map_err(|why| ours(format!("reading it for json(): {why}")))?;
                lock(&held).extend(reservation);
                let Parsed(value) = crate::extract::parse_as::<Parsed>(&found.bytes, None)
                    .map_err(|e| match e {
                        crate::extract::ExtractError::Parse(why) => ours(format!(
                            "file {} cannot be read as JSON or YAML: {why}",
                            bounded::quote(file)
                        )),
                        _ => ours("a parse without a document"),
                    })?;
                lock(&parsed).insert(file.to_owned(), value.clone());
                Ok(value)
            },
        );
    }
}

/// A render stopped by its work, in words.
fn stopped(stop: Stop) -> RenderError {
    RenderError {
        message: format!("the template {}", stop_message(stop)),
        exhausted: false,
        late: stop == Stop::Deadline,
    }
}

fn stop_message(stop: Stop) -> &'static str {
    match stop {
        Stop::OutOfWork => {
            "does more work than a mount's templates may (their fuel is shared, and each node \
             of a comparison of documents costs one)"
        }
        Stop::Deadline => "was still rendering at the mount's deadline",
        Stop::Cancelled => "was stopped: nobody waits for this mount any more",
    }
}

/// Where a render failed and why, in words of ours: minijinja's details may quote a value.
fn describe(source: &str, err: &Error) -> RenderError {
    let at = match (err.line(), err.range()) {
        (Some(line), Some(range)) => {
            let before = &source[..range.start.min(source.len())];
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            format!(
                "line {line}, column {}",
                before[line_start..].chars().count() + 1
            )
        }
        (Some(line), None) => format!("line {line}"),
        _ => "the template".to_owned(),
    };
    let what = match err.kind() {
        // Our own functions and filters say what is wrong without values.
        ErrorKind::InvalidOperation if err.detail().is_some_and(|d| d.starts_with(OURS)) => {
            err.detail().unwrap_or_default()[OURS.len()..].to_owned()
        }
        ErrorKind::OutOfFuel => "it does more work than a template may".to_owned(),
        ErrorKind::WriteFailure => "its output would be larger than a template may write (four \
                                    times its text and the class's files) or take the mount past \
                                    the bytes the driver accepts in one response or the bytes \
                                    this node holds for mounts"
            .to_owned(),
        ErrorKind::UndefinedError => "it uses an undefined value".to_owned(),
        kind => kind.to_string(),
    };
    let exhausted = matches!(err.kind(), ErrorKind::WriteFailure)
        || err.detail().is_some_and(|d| d.starts_with(BUDGET));
    RenderError {
        message: format!("{at}: {what}"),
        exhausted,
        late: false,
    }
}

/// Marks the refusal of a reservation among our own errors.
const BUDGET: &str = "provider: reading it for json(): ";

/// Marks the messages of our own errors (`describe` shows them).
const OURS: &str = "provider: ";

fn ours(message: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{OURS}{message}"))
}

/// The output reserves from the byte budget at least this much at a time.
const OUTPUT_RESERVE_STEP: usize = 16 * 1024;

/// A buffer that fails rather than grow past `room` bytes, holds what it grows to in the
/// byte budget (in steps), and stops with the work.
struct Bounded {
    bytes: Zeroizing<Vec<u8>>,
    room: usize,
    reserve: Arc<Reserve>,
    reservations: Vec<Reservation>,
    reserved: usize,
    work: Arc<Work>,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = self.bytes.len() + buf.len();
        if len > self.room {
            return Err(std::io::Error::other("past the mount's room"));
        }
        if self.work.stopped().is_some() {
            return Err(std::io::Error::other("the work is stopped"));
        }
        if len > self.reserved {
            let step = (len - self.reserved)
                .max(OUTPUT_RESERVE_STEP)
                .min(self.room - self.reserved);
            let reservation = (self.reserve)(step).map_err(std::io::Error::other)?;
            self.reservations.extend(reservation);
            self.reserved += step;
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The filters of the subset; those that may grow a value check it against `room`.
fn filters(env: &mut Environment<'static>, room: usize) {
    env.add_filter("lower", |s: &str| s.to_lowercase());
    env.add_filter("upper", |s: &str| s.to_uppercase());
    env.add_filter("trim", |s: &str| s.trim().to_owned());
    env.add_filter("default", |v: Value, fallback: Option<Value>| {
        if v.is_undefined() || v.is_none() {
            fallback.unwrap_or_else(|| Value::from(""))
        } else {
            v
        }
    });
    env.add_filter("b64encode", move |s: &str| -> Result<String, Error> {
        if s.len() / 3 * 4 > room {
            return Err(ours("b64encode's output would pass the mount's room"));
        }
        Ok(base64::engine::general_purpose::STANDARD.encode(s))
    });
    env.add_filter("b64decode", |s: &str| -> Result<String, Error> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|_| ours("b64decode's input is not base64"))?;
        String::from_utf8(bytes).map_err(|_| ours("b64decode's output is not UTF-8 text"))
    });
    env.add_filter("urlencode", |s: &str| -> String {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    });
    // Serializing walks the whole value: charged as minijinja charges its own (16 of its
    // 64 units a fuel per byte written).
    env.add_filter(
        "tojson",
        move |state: &State<'_, '_>, v: Value| -> Result<String, Error> {
            let text =
                serde_json::to_string(&v).map_err(|_| ours("tojson cannot write this value"))?;
            state.consume_fuel(text.len() as u64 / 4)?;
            if text.len() > room {
                return Err(ours("tojson's output would pass the mount's room"));
            }
            Ok(text)
        },
    );
    env.add_filter(
        "join",
        move |state: &State<'_, '_>, v: Value, rest: Rest<String>| -> Result<String, Error> {
            let separator = rest.first().cloned().unwrap_or_default();
            let mut out = String::new();
            for (i, item) in v.try_iter()?.enumerate() {
                let item = item.to_string();
                // Each item is written out: charged like output, a unit a byte.
                state.consume_fuel(1 + (separator.len() + item.len()) as u64 / 64)?;
                if out.len() + separator.len() + item.len() > room {
                    return Err(ours("join's output would pass the mount's room"));
                }
                if i > 0 {
                    out.push_str(&separator);
                }
                out.push_str(&item);
            }
            Ok(out)
        },
    );
    collection_filters(env);
}

/// The filters over sequences and mappings: none makes a value larger than what it reads.
fn collection_filters(env: &mut Environment<'static>) {
    env.add_filter("length", |v: Value| -> Result<usize, Error> {
        v.len()
            .ok_or_else(|| ours("length of a value that has none"))
    });
    env.add_filter("first", |v: Value| -> Result<Value, Error> {
        Ok(v.try_iter()?.next().unwrap_or(Value::UNDEFINED))
    });
    // A sequence's last item is read by its index, not by walking to it.
    env.add_filter("last", |v: Value| -> Result<Value, Error> {
        match v.len() {
            Some(len) if len > 0 && matches!(v.kind(), minijinja::value::ValueKind::Seq) => {
                v.get_item(&Value::from(len - 1))
            }
            _ => Ok(v.try_iter()?.last().unwrap_or(Value::UNDEFINED)),
        }
    });
    // Pairs are made as a loop takes them, never all at once.
    env.add_filter("items", |v: Value, _: Kwargs| -> Result<Value, Error> {
        if !matches!(v.kind(), minijinja::value::ValueKind::Map) {
            return Err(ours("items of a value that is not a mapping"));
        }
        Ok(Value::make_object_iterable(v, |map| match map.try_iter() {
            Ok(keys) => Box::new(keys.map(move |key| {
                let value = map.get_item(&key).unwrap_or(Value::UNDEFINED);
                Value::from(vec![key, value])
            })),
            Err(_) => Box::new(std::iter::empty()),
        }))
    });
}

fn tests(env: &mut Environment<'static>) {
    env.add_test("defined", |v: Value| !v.is_undefined());
    env.add_test("undefined", |v: Value| v.is_undefined());
    env.add_test("none", |v: Value| v.is_none());
    env.add_test("string", |v: Value| v.as_str().is_some());
    env.add_test("number", |v: Value| v.is_number());
    env.add_test("mapping", |v: Value| {
        matches!(v.kind(), minijinja::value::ValueKind::Map)
    });
    env.add_test("sequence", |v: Value| {
        matches!(
            v.kind(),
            minijinja::value::ValueKind::Seq | minijinja::value::ValueKind::Iterable
        )
    });
}
