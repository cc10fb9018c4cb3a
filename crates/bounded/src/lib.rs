//! Untrusted input, bounded: every parse of a document a tenant controls runs under an
//! explicit [`ParseBudget`], and every value a tenant wrote is [`quote`]d (escaped and
//! truncated) before it reaches a message or a log line.
//!
//! The YAML parser's defaults let ~100 KB of anchors and aliases expand into tens of
//! megabytes (64 MiB of scalar text per parse, a million replayed events). Here the bounds
//! follow the input: expanded scalar text at most [`ParseBudget::expansion`] times the
//! input (and never above the caller's cap), nodes at most about one per input byte, a
//! low alias-replay limit and a shallow depth. So what a parse may allocate is a small
//! multiple of what it read, whatever the document.
//!
//! ```
//! use oci_csi_bounded::{ParseBudget, yaml};
//!
//! let budget = ParseBudget::new(64 * 1024);
//! let list: Vec<String> = yaml::from_str("- a\n- b\n", &budget).unwrap();
//! assert_eq!(list, ["a", "b"]);
//!
//! // One scalar anchored once and aliased many times is refused, not expanded.
//! let bomb = format!("- &a {}\n{}", "x".repeat(1000), "- *a\n".repeat(100));
//! let err = yaml::from_str::<Vec<String>>(&bomb, &budget).unwrap_err();
//! assert!(err.to_string().contains("budget"), "{err}");
//! ```
//!
//! The workspace's clippy configuration refuses the parsers' own entry points
//! (`serde_saphyr::from_str`, `serde_json::from_slice`, ...) outside this crate, so a new
//! parser of tenant input cannot skip the budget by accident.

mod budget;
mod error;
pub mod json;
mod quote;
mod text;
pub mod yaml;

pub use budget::{MAX_KEY_LOOKAHEAD, ParseBudget};
pub use error::{DETAIL_CHARS, Exceeded, ParseError};
pub use quote::{QUOTE_CHARS, Quoted, quote};
pub use text::BoundedString;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
