//! JSON under a [`ParseBudget`]: JSON has no aliases, so the input's length is the bound
//! (serde_json also stops at 128 levels of nesting); what `n` bytes become is a constant
//! multiple of `n`.

use serde::de::DeserializeOwned;

use crate::{Exceeded, ParseBudget, ParseError};

/// Parses a JSON document into `T` within `budget`.
pub fn from_slice<T: DeserializeOwned>(
    input: &[u8],
    budget: &ParseBudget,
) -> Result<T, ParseError> {
    if input.len() > budget.max_input_bytes() {
        return Err(ParseError::TooLarge {
            len: input.len(),
            max: budget.max_input_bytes(),
        });
    }
    // The one call of the parser in the workspace: the length above is its bound.
    #[allow(clippy::disallowed_methods)] // reason: this is the budgeted entry point
    let parsed = serde_json::from_slice::<T>(input);
    parsed.map_err(|e| {
        let at = (e.line() > 0).then(|| (e.line(), e.column()));
        let message = e.to_string();
        if message.starts_with("recursion limit exceeded") {
            return ParseError::Budget {
                exceeded: Exceeded::Depth,
                at,
            };
        }
        let kind = match e.classify() {
            serde_json::error::Category::Eof => "unexpected end of input",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "unexpected value",
            serde_json::error::Category::Io => "read error",
        };
        // serde_json's data errors may quote a value of the document; only the kind stays
        // unless the caller asks for the detail.
        let detail = match message.rfind(" at line ") {
            Some(cut) => &message[..cut],
            None => &message,
        };
        ParseError::invalid("JSON", kind, at, detail)
    })
}

/// Parses a JSON document of text into `T` within `budget`.
pub fn from_str<T: DeserializeOwned>(input: &str, budget: &ParseBudget) -> Result<T, ParseError> {
    from_slice(input.as_bytes(), budget)
}
