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
mod doc;
mod nesting;
mod render;
mod work;

pub(crate) use check::check;
pub use check::{FILTERS, FUNCTIONS, TESTS};
pub use nesting::MAX_NESTING;
pub(crate) use render::{Input, RenderError, Renders, Reserve};
pub(crate) use work::Work;

/// The longest template (its text in the class).
pub const MAX_TEMPLATE_BYTES: usize = 16 * 1024;

/// Work the templates of one mount may do, all of them together: minijinja's fuel, about
/// one unit per instruction, and one per node a comparison of documents visits.
pub const TEMPLATE_FUEL: u64 = 200_000;

/// The most `template` entries one class may hold.
pub const MAX_TEMPLATES: usize = 32;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use zeroize::Zeroizing;

    use super::*;

    /// Every shape that nests, `(head, open, core, close, tail)`: `open` and `close` repeated
    /// `n` times around `core`.
    const SHAPES: [(&str, &str, &str, &str, &str); 13] = [
        ("{{ ", "- ", "1", "", " }}"),
        ("{{ ", "not ", "true", "", " }}"),
        ("{{ ", "", "text(\"f\")", " | trim", " }}"),
        ("{{ ", "", "text(\"f\")", " is string", " }}"),
        ("{{ ", "", "text(\"f\")", " or true", " }}"),
        ("{{ ", "", "text(\"f\")", " == \"v\"", " }}"),
        ("{{ ", "", "json(\"j\")", ".a", " }}"),
        ("{{ ", "", "json(\"j\")", "[\"a\"]", " }}"),
        ("{{ ", "(", "text(\"f\")", ")", " }}"),
        ("{{ ", "[", "text(\"f\")", "]", " | length }}"),
        ("", "{% if true %}", "{{ text(\"f\") }}", "{% endif %}", ""),
        ("", "{% for x in [1] %}", "{{ x }}", "{% endfor %}", ""),
        ("{% if false %}", "{% elif false %}", "x", "", "{% endif %}"),
    ];

    /// Each shape at the deepest the bound (and the size cap) admits, and one step past it.
    fn deepest_and_past() -> Vec<(String, String)> {
        SHAPES
            .iter()
            .map(|(head, open, core, close, tail)| {
                let make =
                    |n: usize| format!("{head}{}{core}{}{tail}", open.repeat(n), close.repeat(n));
                let mut n = 0;
                while make(n + 1).len() <= MAX_TEMPLATE_BYTES
                    && check(&make(n + 1)).problems.is_empty()
                {
                    n += 1;
                }
                (make(n), make(n + 1))
            })
            .collect()
    }

    #[test]
    fn the_deepest_templates_a_class_may_hold_are_refused_or_rendered_on_a_256_kib_thread() {
        let run = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| {
                let mut rendered = 0;
                for (deepest, past) in deepest_and_past() {
                    let checked = check(&deepest);
                    assert!(
                        checked.problems.is_empty(),
                        "{deepest:.60}: {:?}",
                        checked.problems
                    );
                    let inputs =
                        BTreeMap::from([input("f", b"v"), input("j", b"{\"a\": {\"a\": 1}}")]);
                    // Rendering may fail (an undefined attribute), never overflow.
                    let renders = Renders::new(
                        inputs,
                        Arc::new(|_| Ok(None)),
                        Work::new(TEMPLATE_FUEL, None),
                    );
                    if renders.render(&deepest, 1 << 20).is_ok() {
                        rendered += 1;
                    }
                    let refused = check(&past);
                    assert!(
                        refused
                            .problems
                            .iter()
                            .any(|p| p.contains("nests deeper than 48")),
                        "{past:.60}: {:?}",
                        refused.problems
                    );
                }
                rendered
            })
            .expect("a thread");
        let rendered = run.join().expect("no overflow, no panic");
        assert!(rendered >= 8, "most shapes render: {rendered}");
    }

    #[test]
    fn a_render_stops_at_the_mounts_deadline_and_when_nobody_waits() {
        let inputs = || BTreeMap::from([input("f", b"v")]);
        let late = Renders::new(
            inputs(),
            Arc::new(|_| Ok(None)),
            Work::new(TEMPLATE_FUEL, Some(std::time::Instant::now())),
        );
        let err = late.render("{{ text(\"f\") }}", 1024).unwrap_err();
        assert!(err.late, "{err:?}");
        assert!(err.message.contains("at the mount's deadline"), "{err:?}");

        let work = Work::new(TEMPLATE_FUEL, None);
        let renders = Renders::new(inputs(), Arc::new(|_| Ok(None)), work.clone());
        assert!(renders.render("{{ text(\"f\") }}", 1024).is_ok());
        work.cancel();
        let err = renders.render("{{ text(\"f\") }}", 1024).unwrap_err();
        assert!(err.message.contains("nobody waits"), "{err:?}");
    }

    fn input(name: &str, bytes: &[u8]) -> (String, Input) {
        (
            name.to_owned(),
            Input {
                bytes: Arc::new(Zeroizing::new(bytes.to_vec())),
                version: "1".to_owned(),
            },
        )
    }
}
