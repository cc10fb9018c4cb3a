//! Rendering a checked template: a minijinja environment with nothing but our functions,
//! filters and tests, fuel, strict undefined values, and output written into a buffer that
//! refuses to grow past the room the mount has left.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use minijinja::value::{Kwargs, Rest};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};
use zeroize::Zeroizing;

use super::TEMPLATE_FUEL;

/// One file of the class a template may read: its bytes (shared, not copied) and the
/// object version of the entry that wrote it.
#[derive(Clone)]
pub(crate) struct Input {
    pub(crate) bytes: Arc<Zeroizing<Vec<u8>>>,
    pub(crate) version: String,
}

/// What `json(file)` may hold of the byte budget while the render lasts, per byte parsed.
type Reserve = dyn Fn(usize) -> Result<Option<crate::Reservation>, String> + Send + Sync;

/// A render's output, and the `(file, version)` of each input it read, in the order first
/// read.
pub(crate) type Rendered = (Zeroizing<Vec<u8>>, Vec<(String, String)>);

/// Why a render failed: `line L, column C: what` (never a value or an input's content), and
/// whether it was for want of room or budget (the mount is then `ResourceExhausted`).
#[derive(Debug)]
pub(crate) struct RenderError {
    pub(crate) message: String,
    pub(crate) exhausted: bool,
}

/// Renders `source` (already checked) with `inputs`, into at most `room` bytes. Answers
/// the output and the versions of the inputs it read (in the order first read).
pub(crate) fn render(
    source: &str,
    inputs: BTreeMap<String, Input>,
    room: usize,
    reserve: Arc<Reserve>,
) -> Result<Rendered, RenderError> {
    let read = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let held = Arc::new(Mutex::new(Vec::new()));
    let env = environment(Arc::new(inputs), room, reserve, read.clone(), held.clone());
    let template = env
        .template_from_str(source)
        .map_err(|e| describe(source, &e))?;
    let mut out = Bounded {
        bytes: Zeroizing::new(Vec::new()),
        room,
    };
    let rendered = template.render_captured_to((), &mut out).map(drop);
    drop(env);
    drop(held);
    rendered.map_err(|e| describe(source, &e))?;
    let read = std::mem::take(&mut *read.lock().unwrap_or_else(PoisonError::into_inner));
    Ok((out.bytes, read))
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
                                    the bytes the driver accepts in one response"
            .to_owned(),
        ErrorKind::UndefinedError => "it uses an undefined value".to_owned(),
        kind => kind.to_string(),
    };
    let exhausted = matches!(err.kind(), ErrorKind::WriteFailure)
        || err.detail().is_some_and(|d| d.starts_with(BUDGET));
    RenderError {
        message: format!("{at}: {what}"),
        exhausted,
    }
}

/// Marks the refusal of a reservation among our own errors.
const BUDGET: &str = "provider: reading it for json(): ";

/// Marks the messages of our own errors (`describe` shows them).
const OURS: &str = "provider: ";

fn ours(message: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{OURS}{message}"))
}

/// A buffer that fails rather than grow past `room` bytes.
struct Bounded {
    bytes: Zeroizing<Vec<u8>>,
    room: usize,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.room {
            return Err(std::io::Error::other("past the mount's room"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

type Shared<T> = Arc<Mutex<T>>;

/// The environment: `text`, `json`, `base64` over `inputs` (each read recorded in `read`,
/// each parse's reservation kept in `held` until the render ends), the filters and tests,
/// fuel, strict undefined values. Nothing else: no loader, no builtins.
fn environment(
    inputs: Arc<BTreeMap<String, Input>>,
    room: usize,
    reserve: Arc<Reserve>,
    read: Shared<Vec<(String, String)>>,
    held: Shared<Vec<crate::Reservation>>,
) -> Environment<'static> {
    let mut env = Environment::empty();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // A file is written as its template reads, its last newline included; a line holding
    // only a `{% %}` tag leaves no line behind (Ansible's and Salt's habit for config files).
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    let input = move |file: &str| -> Result<Input, Error> {
        let found = inputs
            .get(file)
            .cloned()
            .ok_or_else(|| ours(format!("no file {} in this class", bounded::quote(file))))?;
        let mut read = read.lock().unwrap_or_else(PoisonError::into_inner);
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
    add_json(&mut env, input, reserve, held);
    filters(&mut env, room);
    tests(&mut env);
    env
}

/// `json(file)`: the file parsed (once per render) within the budgets of a `keys` parse,
/// its reservation kept in `held` until the render ends.
fn add_json(
    env: &mut Environment<'static>,
    input: impl Fn(&str) -> Result<Input, Error> + Send + Sync + 'static,
    reserve: Arc<Reserve>,
    held: Shared<Vec<crate::Reservation>>,
) {
    // A file is parsed once per render, however many times the template reads it.
    let parsed: Shared<BTreeMap<String, Value>> = Arc::default();
    env.add_function("json", move |file: &str| -> Result<Value, Error> {
        let found = input(file)?;
        if let Some(value) = parsed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(file)
        {
            return Ok(value.clone());
        }
        let reservation = reserve(found.bytes.len())
            .map_err(|why| ours(format!("reading it for json(): {why}")))?;
        held.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(reservation);
        let value: Value = crate::extract::parse_as(&found.bytes, None).map_err(|e| match e {
            crate::extract::ExtractError::Parse(why) => ours(format!(
                "file {} cannot be read as JSON or YAML: {why}",
                bounded::quote(file)
            )),
            _ => ours("a parse without a document"),
        })?;
        parsed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(file.to_owned(), value.clone());
        Ok(value)
    });
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
    env.add_filter("tojson", move |v: Value| -> Result<String, Error> {
        let text = serde_json::to_string(&v).map_err(|_| ours("tojson cannot write this value"))?;
        if text.len() > room {
            return Err(ours("tojson's output would pass the mount's room"));
        }
        Ok(text)
    });
    env.add_filter(
        "join",
        move |v: Value, rest: Rest<String>| -> Result<String, Error> {
            let separator = rest.first().cloned().unwrap_or_default();
            let mut out = String::new();
            for (i, item) in v.try_iter()?.enumerate() {
                let item = item.to_string();
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
    env.add_filter("last", |v: Value| -> Result<Value, Error> {
        Ok(v.try_iter()?.last().unwrap_or(Value::UNDEFINED))
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
