//! What one parse may cost, derived from the input it is given.

/// The bounds of one parse of untrusted text. There is no `Default`: every caller says the
/// largest input it takes, so no library default is ever the bound.
///
/// For an input of `n` bytes a YAML parse may hold at most
/// - `min(expansion × n + 1 KiB, max_expanded_bytes)` bytes of scalar text, counting every
///   scalar an alias replays;
/// - `n + 256` nodes (a node takes at least one byte of input unless an alias replays it)
///   and `n / 4 + 64` replayed events (at most 16 384);
/// - [`ParseBudget::max_depth`] levels of nesting, one document, no anchor buffer larger
///   than the input, and implicit keys of at most [`MAX_KEY_LOOKAHEAD`] characters.
///
/// JSON has no aliases: its input length is the bound (serde_json's own depth limit
/// applies), and what a document of `n` bytes becomes is a constant multiple of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseBudget {
    max_input_bytes: usize,
    expansion: usize,
    max_expanded_bytes: usize,
    max_depth: usize,
}

/// Scalar text allowed beyond `expansion × n`, so tiny inputs with an alias or two parse.
const EXPANSION_SLACK: usize = 1024;
/// Nodes allowed beyond one per input byte.
const NODE_SLACK: usize = 256;
/// The longest implicit key: YAML allows 1024 characters; 256 keeps the scanner's token
/// queue small (measured: 150 KB at most, against 600 KB at 1024).
pub const MAX_KEY_LOOKAHEAD: usize = 256;
/// The most alias-replayed events in any parse.
const MAX_REPLAYED_EVENTS: usize = 16_384;

impl ParseBudget {
    /// Inputs of at most `max_input_bytes`; expanded text at most twice the input (and
    /// never above `max_input_bytes`), 32 levels deep.
    pub const fn new(max_input_bytes: usize) -> Self {
        Self {
            max_input_bytes,
            expansion: 2,
            max_expanded_bytes: max_input_bytes,
            max_depth: 32,
        }
    }

    /// Expanded scalar text at most `factor` times the input (at least 1).
    pub const fn with_expansion(mut self, factor: usize) -> Self {
        self.expansion = if factor == 0 { 1 } else { factor };
        self
    }

    /// Expanded scalar text never above `bytes`, whatever the input (e.g. the room a mount
    /// has left).
    pub const fn with_max_expanded_bytes(mut self, bytes: usize) -> Self {
        self.max_expanded_bytes = bytes;
        self
    }

    /// At most `depth` levels of nested sequences and mappings.
    pub const fn with_max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth;
        self
    }

    /// The largest input accepted.
    pub const fn max_input_bytes(&self) -> usize {
        self.max_input_bytes
    }

    /// The factor of expanded text over input.
    pub const fn expansion(&self) -> usize {
        self.expansion
    }

    /// The deepest nesting accepted.
    pub const fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// The scalar text a parse of `input_len` bytes may hold.
    pub fn expanded_bytes(&self, input_len: usize) -> usize {
        self.expansion
            .saturating_mul(input_len)
            .saturating_add(EXPANSION_SLACK)
            .min(self.max_expanded_bytes.max(input_len))
    }

    /// The nodes a parse of `input_len` bytes may produce.
    pub fn nodes(&self, input_len: usize) -> usize {
        input_len.saturating_add(NODE_SLACK)
    }

    /// The events aliases may replay in a parse of `input_len` bytes.
    pub fn replayed_events(&self, input_len: usize) -> usize {
        (input_len / 4 + 64).min(MAX_REPLAYED_EVENTS)
    }

    /// The serde-saphyr options of a parse of `input_len` bytes.
    pub(crate) fn yaml_options(&self, input_len: usize) -> serde_saphyr::Options {
        let nodes = self.nodes(input_len);
        let replayed = self.replayed_events(input_len);
        let mut budget = serde_saphyr::Budget::default();
        budget.max_reader_input_bytes = Some(self.max_input_bytes);
        budget.max_events = nodes.saturating_mul(2).saturating_add(replayed);
        budget.max_nodes = nodes;
        budget.max_aliases = replayed;
        budget.max_anchors = nodes;
        budget.max_recorded_anchor_events = nodes;
        budget.max_recorded_anchor_bytes = input_len.saturating_add(EXPANSION_SLACK);
        budget.max_depth = self.max_depth;
        budget.flow_nesting_limit = self.max_depth;
        budget.max_documents = 1;
        budget.max_total_scalar_bytes = self.expanded_bytes(input_len);
        budget.max_merge_keys = 256;
        budget.max_inclusion_depth = 0;
        // While a plain scalar may still turn out to be a key, the scanner keeps every token
        // it reads (some 600 bytes per character of lookahead: 600 KB at the default 1024).
        // Keys here are field names and short map keys.
        budget.simple_key_max_lookahead = MAX_KEY_LOOKAHEAD;
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget);
        options.alias_limits.max_total_replayed_events = replayed;
        options.alias_limits.max_replay_stack_depth = self.max_depth.min(16);
        // Errors carry positions, never a snippet of the input (which may be secret).
        options.with_snippet = false;
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_the_input_and_never_passes_the_cap() {
        let budget = ParseBudget::new(10_000);
        assert_eq!(budget.expanded_bytes(100), 2 * 100 + EXPANSION_SLACK);
        assert_eq!(budget.expanded_bytes(9_000), 10_000);
        let tight = budget.with_max_expanded_bytes(500);
        // Never below the input itself: a document's own text always fits.
        assert_eq!(tight.expanded_bytes(800), 800);
        assert_eq!(tight.expanded_bytes(100), 500);
        assert_eq!(budget.with_expansion(0).expansion(), 1);
        assert_eq!(budget.replayed_events(1 << 30), MAX_REPLAYED_EVENTS);
    }
}
