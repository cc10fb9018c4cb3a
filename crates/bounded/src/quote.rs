//! Untrusted text in messages and logs: escaped, and truncated with its length said.

use std::fmt;

/// The most characters of a value a [`Quoted`] shows.
pub const QUOTE_CHARS: usize = 100;

/// A value someone else wrote, as a message or a log line may show it: Debug-escaped (a
/// newline or an escape sequence cannot forge a line or colour a terminal), at most
/// [`QUOTE_CHARS`] characters, and when cut, its whole length in bytes.
///
/// ```
/// use oci_csi_bounded::quote;
///
/// assert_eq!(quote("workload").to_string(), r#""workload""#);
/// assert_eq!(quote("a\nb\x1b[31m").to_string(), r#""a\nb\u{1b}[31m""#);
/// let long = "x".repeat(650_000);
/// let shown = quote(&long).to_string();
/// assert!(shown.len() < 200 && shown.ends_with("… (650000 bytes)"), "{shown}");
/// ```
#[derive(Clone, Copy)]
pub struct Quoted<'a>(&'a str);

/// Quotes `value` for a message or a log line (see [`Quoted`]).
pub fn quote(value: &str) -> Quoted<'_> {
    Quoted(value)
}

impl Quoted<'_> {
    /// The part shown: at most [`QUOTE_CHARS`] characters.
    fn shown(&self) -> (&str, bool) {
        match self.0.char_indices().nth(QUOTE_CHARS) {
            Some((cut, _)) => (&self.0[..cut], true),
            None => (self.0, false),
        }
    }
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shown, cut) = self.shown();
        write!(f, "{shown:?}")?;
        if cut {
            write!(f, "… ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_read_as_debug_and_long_ones_are_cut_on_a_character() {
        assert_eq!(quote("").to_string(), "\"\"");
        assert_eq!(quote("vault\"id").to_string(), format!("{:?}", "vault\"id"));
        let exactly = "é".repeat(QUOTE_CHARS);
        assert_eq!(quote(&exactly).to_string(), format!("{exactly:?}"));
        let over = "é".repeat(QUOTE_CHARS + 1);
        let shown = quote(&over).to_string();
        assert_eq!(
            shown,
            format!("{:?}… ({} bytes)", "é".repeat(QUOTE_CHARS), over.len())
        );
    }

    #[test]
    fn a_quoted_value_never_spans_lines_and_is_bounded_whatever_it_holds() {
        // The worst case per character is an escape like \u{10ffff} (10 characters).
        let nasty: String = std::iter::repeat_n(['\n', '\u{1b}', '\u{10ffff}', '"'], 10_000)
            .flatten()
            .collect();
        let shown = quote(&nasty).to_string();
        assert!(!shown.contains('\n') && !shown.contains('\u{1b}'));
        assert!(shown.len() <= QUOTE_CHARS * 10 + 40, "{}", shown.len());
    }
}
