//! YAML under a [`ParseBudget`].

use serde::de::{DeserializeOwned, DeserializeSeed};
use serde_saphyr::budget::BudgetBreach;

use crate::{Exceeded, ParseBudget, ParseError};

/// Parses one YAML document into `T` within `budget`.
pub fn from_str<T: DeserializeOwned>(input: &str, budget: &ParseBudget) -> Result<T, ParseError> {
    with_seed(input, budget, std::marker::PhantomData::<T>)
}

/// Parses one YAML document of bytes (UTF-8) into `T` within `budget`.
pub fn from_slice<T: DeserializeOwned>(
    input: &[u8],
    budget: &ParseBudget,
) -> Result<T, ParseError> {
    check_len(input.len(), budget)?;
    let text = std::str::from_utf8(input).map_err(|e| ParseError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    from_str(text, budget)
}

/// Parses one YAML document through `seed` (a stateful deserializer, e.g. one that counts
/// entries as it reads them) within `budget`.
pub fn with_seed<'de, S: DeserializeSeed<'de>>(
    input: &'de str,
    budget: &ParseBudget,
    seed: S,
) -> Result<S::Value, ParseError> {
    check_len(input.len(), budget)?;
    let options = budget.yaml_options(input.len());
    // The one call of the parser in the workspace: the budget above is its bound.
    #[allow(clippy::disallowed_methods)] // reason: this is the budgeted entry point
    let parsed = serde_saphyr::with_deserializer_from_str_with_options(input, options, |de| {
        seed.deserialize(de)
    });
    parsed.map_err(|e| error(&e))
}

/// Parses a stream of YAML documents (`---` separated) into `T`s within `budget`, each
/// document counted against one budget for the whole input.
pub fn from_multiple<T: DeserializeOwned>(
    input: &str,
    budget: &ParseBudget,
    max_documents: usize,
) -> Result<Vec<T>, ParseError> {
    check_len(input.len(), budget)?;
    let mut options = budget.yaml_options(input.len());
    if let Some(b) = options.budget.as_mut() {
        b.max_documents = max_documents;
    }
    #[allow(clippy::disallowed_methods)] // reason: this is the budgeted entry point
    let parsed = serde_saphyr::from_multiple_with_options(input, options);
    parsed.map_err(|e| error(&e))
}

fn check_len(len: usize, budget: &ParseBudget) -> Result<(), ParseError> {
    if len > budget.max_input_bytes() {
        return Err(ParseError::TooLarge {
            len,
            max: budget.max_input_bytes(),
        });
    }
    Ok(())
}

/// The parser's error as ours: a budget breach by kind, anything else with the parser's
/// message (bounded; `Display` of the result does not show it).
fn error(e: &serde_saphyr::Error) -> ParseError {
    // An error about an alias wraps the error itself (and a snippet would wrap both).
    let mut e = e.without_snippet();
    while let serde_saphyr::Error::AliasError { error, .. } = e {
        e = error.without_snippet();
    }
    let at = e.location().and_then(|l| {
        let (line, column) = (l.line(), l.column());
        (line > 0).then_some((line as usize, column as usize))
    });
    let exceeded = match e {
        serde_saphyr::Error::Budget { breach, .. } => Some(match breach {
            BudgetBreach::ScalarBytes { .. } => Exceeded::ExpandedText,
            BudgetBreach::Events { .. } | BudgetBreach::Nodes { .. } => Exceeded::Nodes,
            BudgetBreach::Aliases { .. }
            | BudgetBreach::Anchors { .. }
            | BudgetBreach::AliasAnchorRatio { .. } => Exceeded::Aliases,
            BudgetBreach::Depth { .. } => Exceeded::Depth,
            _ => Exceeded::Other,
        }),
        serde_saphyr::Error::AliasReplayLimitExceeded { .. }
        | serde_saphyr::Error::AliasExpansionLimitExceeded { .. }
        | serde_saphyr::Error::AliasReplayCounterOverflow { .. } => Some(Exceeded::Aliases),
        serde_saphyr::Error::AliasReplayStackDepthExceeded { .. } => Some(Exceeded::Depth),
        // The scanner's own nesting limits (flow and block) are the budget's depth.
        other if other.to_string().contains("recursion limit exceeded") => Some(Exceeded::Depth),
        _ => None,
    };
    match exceeded {
        Some(exceeded) => ParseError::Budget { exceeded, at },
        None => {
            let kind = match e {
                serde_saphyr::Error::Eof { .. } => "unexpected end of input",
                serde_saphyr::Error::SerdeUnknownField { .. }
                | serde_saphyr::Error::SerdeMissingField { .. }
                | serde_saphyr::Error::SerdeInvalidType { .. }
                | serde_saphyr::Error::SerdeInvalidValue { .. }
                | serde_saphyr::Error::SerdeInvalidLength { .. }
                | serde_saphyr::Error::SerdeUnknownVariant { .. }
                | serde_saphyr::Error::DuplicateMappingKey { .. }
                | serde_saphyr::Error::Message { .. } => "unexpected value",
                _ => "syntax error",
            };
            ParseError::invalid("YAML", kind, at, &strip_position(&e.to_string()))
        }
    }
}

/// serde-saphyr ends its messages with the position, which [`ParseError`] says itself.
fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(cut) => message[..cut].to_owned(),
        None => message.to_owned(),
    }
}
