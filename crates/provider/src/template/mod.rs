//! `template` entries: one file rendered from other files of the same class, in a sandboxed
//! subset of Jinja (minijinja).
//!
//! The subset is checked on the template's syntax tree before anything runs (`check.rs`):
//! text, `{{ expressions }}`, `{% if %}` and `{% for %}` (not recursive); expressions read the
//! class's files through `text(file)`, `json(file)` and `base64(file)`, attributes and items
//! of what they return, constants, comparisons, `and`/`or`/`not`, inline `if`, and the
//! filters and tests listed below. There is no assignment, macro, block, include or import
//! (no loader: a template reads nothing but the class's files), and no arithmetic or
//! concatenation, so no value grows past what the inputs hold. Rendering (`render.rs`) is
//! bounded in work by fuel, in output by the room the mount has left (the byte budget), and
//! each `json(file)` reserves what its parse may take from the byte budget. Errors name the
//! entry, the line and column, never a rendered value or an input's content.

mod check;
mod render;

pub(crate) use check::check;
pub use check::{FILTERS, FUNCTIONS, TESTS};
pub(crate) use render::{Input, render};

/// The longest template (its text in the class).
pub const MAX_TEMPLATE_BYTES: usize = 16 * 1024;

/// Work a render may do: minijinja's fuel, about one unit per instruction.
pub const TEMPLATE_FUEL: u64 = 200_000;
