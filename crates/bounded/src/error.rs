//! Why a bounded parse failed: by position and kind, never by content.

use std::fmt;

/// Which bound a document passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Exceeded {
    /// More scalar text than the budget allows (aliases expanding it).
    ExpandedText,
    /// Too many nodes or events.
    Nodes,
    /// Aliases replayed too often, or too many aliases or anchors.
    Aliases,
    /// Nested too deeply.
    Depth,
    /// Another of the parser's budgets (documents, merge keys, anchor buffers).
    Other,
}

impl Exceeded {
    fn as_str(self) -> &'static str {
        match self {
            Exceeded::ExpandedText => "its aliases expand to more text than the budget allows",
            Exceeded::Nodes => "it has more nodes than the budget allows",
            Exceeded::Aliases => "it replays aliases more often than the budget allows",
            Exceeded::Depth => "it nests deeper than the budget allows",
            Exceeded::Other => "it passes the parser's budget",
        }
    }
}

/// A parse refused or failed. `Display` gives the kind and the position only: the text of
/// a document (a secret's content, say) never reaches a message through it.
/// [`ParseError::detail`] adds the parser's own words, bounded, for documents whose text is
/// not secret.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// The input is longer than the budget takes.
    TooLarge {
        /// Its length in bytes.
        len: usize,
        /// The budget's `max_input_bytes`.
        max: usize,
    },
    /// The input is not UTF-8 (YAML only).
    NotUtf8 {
        /// Bytes before the first invalid one.
        valid_up_to: usize,
    },
    /// The document passed one of the budget's bounds.
    Budget {
        /// Which one.
        exceeded: Exceeded,
        /// Line and column (1-based) where it was noticed, when known.
        at: Option<(usize, usize)>,
    },
    /// Not a document of the expected shape.
    Invalid {
        /// `JSON` or `YAML`.
        format: &'static str,
        /// What is wrong, in the parser's category (`syntax error`, `unexpected end of
        /// input`, ...): never the document's text.
        kind: &'static str,
        /// Line and column (1-based), when known.
        at: Option<(usize, usize)>,
        /// The parser's message, at most [`DETAIL_CHARS`] characters, one line.
        detail: String,
    },
}

/// The longest parser message a [`ParseError`] keeps.
pub const DETAIL_CHARS: usize = 240;

impl ParseError {
    /// Line and column (1-based), when known.
    pub fn position(&self) -> Option<(usize, usize)> {
        match self {
            ParseError::Budget { at, .. } | ParseError::Invalid { at, .. } => *at,
            ParseError::TooLarge { .. } | ParseError::NotUtf8 { .. } => None,
        }
    }

    /// Whether the document passed the budget (rather than being malformed).
    pub fn is_budget(&self) -> bool {
        matches!(
            self,
            ParseError::Budget { .. } | ParseError::TooLarge { .. }
        )
    }

    /// The message with the parser's own words (which may quote the input), bounded: for
    /// documents whose text is not secret, such as a SecretProviderClass parameter.
    pub fn detail(&self) -> String {
        match self {
            ParseError::Invalid { detail, .. } if !detail.is_empty() => {
                format!("{self}: {detail}")
            }
            _ => self.to_string(),
        }
    }

    pub(crate) fn invalid(
        format: &'static str,
        kind: &'static str,
        at: Option<(usize, usize)>,
        message: &str,
    ) -> Self {
        ParseError::Invalid {
            format,
            kind,
            at,
            detail: one_line(message, DETAIL_CHARS),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |f: &mut fmt::Formatter<'_>, at: &Option<(usize, usize)>| match at {
            Some((line, column)) => write!(f, " at line {line}, column {column}"),
            None => Ok(()),
        };
        match self {
            ParseError::TooLarge { len, max } => write!(
                f,
                "the document is {len} bytes, more than the {max} bytes the budget takes"
            ),
            ParseError::NotUtf8 { valid_up_to } => {
                write!(f, "the document is not UTF-8 (at byte {valid_up_to})")
            }
            ParseError::Budget { exceeded, at: pos } => {
                write!(
                    f,
                    "the document was refused by the parse budget: {}",
                    exceeded.as_str()
                )?;
                at(f, pos)
            }
            ParseError::Invalid {
                format,
                kind,
                at: pos,
                ..
            } => {
                write!(f, "not valid {format}: {kind}")?;
                at(f, pos)
            }
        }
    }
}

impl std::error::Error for ParseError {}

/// `message` on one line (its whitespace runs as single spaces), at most `max` characters.
pub(crate) fn one_line(message: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, word) in message.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
        if out.chars().count() > max {
            let cut: String = out.chars().take(max).collect();
            return format!("{cut}…");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_one_bounded_line() {
        let long = format!("first line\n  {}", "word ".repeat(1000));
        let detail = one_line(&long, DETAIL_CHARS);
        assert!(!detail.contains('\n'));
        assert!(
            detail.chars().count() <= DETAIL_CHARS + 1,
            "{}",
            detail.len()
        );
        assert!(detail.starts_with("first line word"));
        assert_eq!(one_line("a   b\tc", 10), "a b c");
    }
}
