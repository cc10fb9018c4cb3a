//! How deep a template nests, read off its tokens before anything parses it.
//!
//! minijinja's parser recurses on unary `-` and `not` without its recursion guard, and builds
//! a tree as deep as a chain of attributes, filters, tests or binary operators is long; the
//! checker's walk, the compiler and the tree's `Drop` all recurse on that tree. A template of
//! 16 KiB (`{{ - - - … x }}`) would overflow a worker's stack, which aborts the process: no
//! `catch_unwind` catches it. So the nesting is bounded on the token stream first (the lexer
//! is a loop), and only a template within the bound is ever parsed.
//!
//! The bound is conservative: every operator token counts as one level of the tree at its
//! bracket level (a flat expression of `k` operators parses into a tree at most `k + 1` deep,
//! whatever the precedences), every bracket as one more, and every open block (`if`, `for`,
//! each `elif`, ...) as one. A template is refused once that count passes [`MAX_NESTING`],
//! far above what a configuration file needs and far below what a small stack can hold
//! (`the_deepest_templates_a_class_may_hold_are_refused_or_rendered_on_a_256_kib_thread`).

use minijinja::machinery::{Span, Token, tokenize};

/// The deepest a template may nest, counted as this module's documentation says.
pub const MAX_NESTING: usize = 48;

/// Where the template first nests deeper than [`MAX_NESTING`], if it does. A lexer error
/// ends the scan: the parser meets the same error at the same token, no deeper than here.
pub(crate) fn too_deep(source: &str) -> Option<Span> {
    let mut blocks: Vec<usize> = Vec::new();
    let mut block_depth = 0usize;
    // Operators met at each open bracket level of the current tag; `depth` is the sum of
    // (operators + 1) over them, the deepest the tree can be at this token.
    let mut levels: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut tag = Tag::default();
    for item in tokenize(source, false, Default::default()) {
        let Ok((token, span)) = item else { break };
        let ident = matches!(token, Token::Ident(_));
        match &token {
            Token::VariableStart | Token::BlockStart => {
                levels.clear();
                levels.push(0);
                depth = 1;
                tag = Tag {
                    block: matches!(token, Token::BlockStart),
                    first: true,
                    ..Tag::default()
                };
            }
            Token::VariableEnd | Token::BlockEnd => {
                if tag.block_set && !tag.assigns {
                    // `{% set x %}…{% endset %}` opens a block; `{% set x = … %}` does not.
                    blocks.push(1);
                    block_depth += 1;
                }
                levels.clear();
                depth = 0;
            }
            Token::Ident(word) if tag.block && tag.first => {
                tag.first = false;
                block_depth = open_or_close(&mut blocks, &mut tag, word, block_depth);
            }
            Token::BracketOpen | Token::ParenOpen | Token::BraceOpen => {
                // The subscript, call or literal is a node of the level it stands in, and
                // what it holds is a level of its own.
                if let Some(top) = levels.last_mut() {
                    *top += 1;
                }
                levels.push(0);
                depth += 2;
            }
            Token::BracketClose | Token::ParenClose | Token::BraceClose if levels.len() > 1 => {
                depth -= levels.pop().unwrap_or(0) + 1;
            }
            Token::Assign if levels.len() == 1 => tag.assigns = true,
            token if is_operator(token) => {
                if let Some(top) = levels.last_mut() {
                    *top += 1;
                    depth += 1;
                }
            }
            _ => {}
        }
        if ident {
            tag.first = false;
        }
        if block_depth + depth > MAX_NESTING {
            return Some(span);
        }
    }
    None
}

/// The blocks open after a tag named by `word`: `if`, `for`, ... open one, an `elif` nests
/// in the `if` before it, an `end…` closes one (with its `elif`s); answers the depth of the
/// open blocks.
fn open_or_close(blocks: &mut Vec<usize>, tag: &mut Tag, word: &str, depth: usize) -> usize {
    match word {
        "if" | "for" | "with" | "filter" | "autoescape" | "macro" | "call" | "block" => {
            blocks.push(1);
            depth + 1
        }
        "set" => {
            tag.block_set = true;
            depth
        }
        "elif" => match blocks.last_mut() {
            Some(top) => {
                *top += 1;
                depth + 1
            }
            None => depth,
        },
        w if w.starts_with("end") => depth - blocks.pop().unwrap_or(0),
        _ => depth,
    }
}

/// What the scan knows of the tag it is in.
#[derive(Default)]
struct Tag {
    /// A `{% %}` tag (not `{{ }}`).
    block: bool,
    /// No identifier seen yet in it: the next one names the statement.
    first: bool,
    /// A `set` statement, and whether it assigns (`=`) at its top level.
    block_set: bool,
    assigns: bool,
}

fn is_operator(token: &Token<'_>) -> bool {
    matches!(
        token,
        Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::FloorDiv
            | Token::Pow
            | Token::Mod
            | Token::Dot
            | Token::Tilde
            | Token::Pipe
            | Token::Eq
            | Token::Ne
            | Token::Gt
            | Token::Gte
            | Token::Lt
            | Token::Lte
            | Token::Colon
            | Token::Ident("and" | "or" | "not" | "in" | "is" | "if" | "else")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deep(source: &str) -> Option<(u16, u16)> {
        too_deep(source).map(|s| (s.start_line, s.start_col))
    }

    #[test]
    fn runs_of_unary_operators_and_chains_are_refused_at_the_token_past_the_bound() {
        for source in [
            format!("{{{{ {}x }}}}", "-".repeat(16_000)),
            format!("{{{{ {}x }}}}", "not ".repeat(4_000)),
            format!("{{{{ x{} }}}}", ".a".repeat(8_000)),
            format!("{{{{ x{} }}}}", "|trim".repeat(3_200)),
            format!("{{{{ x{} }}}}", " is string".repeat(1_600)),
            format!("{{{{ x{} }}}}", " or x".repeat(3_000)),
            format!("{{{{ {}x{} }}}}", "(".repeat(5_000), ")".repeat(5_000)),
            format!("{{{{ {}x{} }}}}", "[".repeat(5_000), "]".repeat(5_000)),
            format!(
                "{}x{}",
                "{% if a %}".repeat(2_000),
                "{% endif %}".repeat(2_000)
            ),
            format!("{{% if a %}}{}{{% endif %}}", "{% elif b %}".repeat(2_000)),
            format!(
                "{}{}",
                "{% set x %}".repeat(2_000),
                "{% endset %}".repeat(2_000)
            ),
        ] {
            let at = deep(&source);
            assert!(at.is_some(), "{}", &source[..40]);
        }
        // Refused where the count passes the bound: the 47th `-` of a `{{ - - …`.
        let unary = format!("{{{{ {}x }}}}", "- ".repeat(100));
        assert_eq!(deep(&unary), Some((1, 3 + 2 * (MAX_NESTING as u16 - 1))));
    }

    #[test]
    fn what_a_configuration_file_needs_is_well_within_the_bound() {
        let ordinary = "url={{ json(\"db.json\").host | default(\"localhost\") | lower }}\n\
             {% for k, v in json(\"env.json\") | items %}{% if v is string and k != \"x\" \
             or not (v is none) %}{{ k | upper }}={{ v | urlencode }}{% elif v is number %}\
             {{ v }}{% else %}{{ v | tojson }}{% endif %}\n{% endfor %}\
             {{ json(\"a\")[\"b\"][\"c\"].d.e.f | join(\",\") }}\
             {% set x = 1 %}{% set y = 2 %}";
        assert_eq!(deep(ordinary), None);
        // Nesting that closes gives its depth back: a thousand sequential blocks are fine.
        let sequential = "{% if a %}{{ (((x))) }}{% endif %}".repeat(1_000);
        assert_eq!(deep(&sequential), None);
        // A lexer error ends the scan (the parser reports it).
        assert_eq!(deep("{{ \"unterminated"), None);
    }
}
