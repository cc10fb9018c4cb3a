//! The budgets against hostile documents: what is refused, what still parses, and that
//! nothing a document holds reaches an error's message.

use oci_csi_bounded::{BoundedString, Exceeded, ParseBudget, ParseError, json, yaml};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::Value;

const BUDGET: ParseBudget = ParseBudget::new(1 << 20);

/// The finding of the review: one 14 000-character scalar anchored once and aliased from
/// every field of 256 entries (~97 KB) built ~65 MB per parse.
fn aliased_scalar_list(entries: usize, scalar: usize) -> String {
    let mut yaml = format!("- name: &s {}\n", "x".repeat(scalar));
    for _ in 1..entries {
        yaml.push_str("- {name: *s, fileName: *s, vaultId: *s, stage: *s}\n");
    }
    yaml
}

/// Nested anchors: each level a list of the previous one ten times (a billion laughs).
fn laughs(levels: usize) -> String {
    let mut yaml = "a0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n".to_owned();
    for level in 1..=levels {
        let previous = format!("*a{}", level - 1);
        let items = vec![previous; 10].join(", ");
        yaml.push_str(&format!("a{level}: &a{level} [{items}]\n"));
    }
    yaml
}

#[test]
fn one_scalar_aliased_from_every_field_is_refused_as_expansion() {
    let yaml = aliased_scalar_list(256, 14_000);
    assert!(yaml.len() < 100_000, "{}", yaml.len());
    let err = yaml::from_str::<Vec<Value>>(&yaml, &BUDGET).unwrap_err();
    assert!(err.is_budget(), "{}", err.detail());
    assert!(err.to_string().contains("budget"), "{err}");
    // (The default budget refuses it too, but only by its alias/anchor ratio, checked once
    // the whole document was read: the expansion was built first. The peak-heap tests of
    // the provider measure that.)
}

#[test]
fn nested_aliases_are_refused_before_they_expand() {
    for levels in [3, 5, 9] {
        let err = yaml::from_str::<Value>(&laughs(levels), &BUDGET).unwrap_err();
        assert!(
            matches!(
                err,
                ParseError::Budget {
                    exceeded: Exceeded::ExpandedText | Exceeded::Nodes | Exceeded::Aliases,
                    ..
                }
            ),
            "{levels}: {err:?}"
        );
    }
}

#[test]
fn documents_that_use_aliases_sparingly_still_parse() {
    let yaml = "defaults: &d {mode: \"0400\", stage: CURRENT}\n\
                a: *d\nb: *d\nc: {<<: *d, stage: PENDING}\n";
    let doc: Value = yaml::from_str(yaml, &BUDGET).unwrap();
    assert_eq!(doc["a"]["mode"], "0400");
    assert_eq!(doc["c"]["stage"], "PENDING");
    // Twenty entries sharing one vault OCID through an alias.
    let mut list = "- {name: s0, vaultId: &v ocid1.vault.oc1.iad.aaaa}\n".to_owned();
    for i in 1..20 {
        list.push_str(&format!("- {{name: s{i}, vaultId: *v}}\n"));
    }
    let entries: Vec<Value> = yaml::from_str(&list, &BUDGET).unwrap();
    assert_eq!(entries[19]["vaultId"], "ocid1.vault.oc1.iad.aaaa");
}

#[test]
fn depth_input_length_and_utf8_are_bounded() {
    let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
    let err = yaml::from_str::<Value>(&deep, &BUDGET).unwrap_err();
    assert!(err.is_budget(), "{err:?}");
    let small = ParseBudget::new(10);
    assert_eq!(
        yaml::from_str::<Value>("a: 0123456789", &small).unwrap_err(),
        ParseError::TooLarge { len: 13, max: 10 }
    );
    assert_eq!(
        json::from_slice::<Value>(b"[1, 2, 3, 4, 5]", &small).unwrap_err(),
        ParseError::TooLarge { len: 15, max: 10 }
    );
    assert_eq!(
        yaml::from_slice::<Value>(b"a: \xff", &BUDGET).unwrap_err(),
        ParseError::NotUtf8 { valid_up_to: 3 }
    );
    let deep_json = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(
        json::from_slice::<Value>(deep_json.as_bytes(), &BUDGET)
            .unwrap_err()
            .is_budget()
    );
}

#[test]
fn errors_say_where_and_never_quote_the_document() {
    let secret = "hunter2-correct-horse";
    for err in [
        yaml::from_str::<Vec<String>>(&format!("- [{secret}\n"), &BUDGET).unwrap_err(),
        yaml::from_str::<Vec<u8>>(&format!("- {secret}\n"), &BUDGET).unwrap_err(),
        json::from_slice::<Vec<u8>>(format!("[\"{secret}\"]").as_bytes(), &BUDGET).unwrap_err(),
        json::from_slice::<Value>(format!("{{\"{secret}\"").as_bytes(), &BUDGET).unwrap_err(),
    ] {
        let shown = err.to_string();
        assert!(!shown.contains(secret), "{shown}");
        assert!(err.position().is_some(), "{err:?}");
        assert!(err.detail().len() < 400, "{}", err.detail());
    }
}

#[derive(Debug, Deserialize)]
struct Entry {
    #[allow(dead_code)] // reason: read only to be refused
    name: BoundedString<16>,
}

#[test]
fn a_field_past_its_length_is_refused_while_it_is_read() {
    let err = yaml::from_str::<Vec<Entry>>("- name: 0123456789abcdefg\n", &BUDGET).unwrap_err();
    assert!(
        err.detail()
            .contains("a string of 17 bytes, longer than the 16 this field takes"),
        "{}",
        err.detail()
    );
    let ok: Vec<Entry> = yaml::from_str("- name: 0123456789abcdef\n", &BUDGET).unwrap();
    assert_eq!(&*ok[0].name, "0123456789abcdef");
}

fn hostile_yaml() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        "[a-z]{1,8}".prop_map(|s| s),
        (1..4000usize).prop_map(|n| "y".repeat(n)),
    ];
    let piece = prop_oneof![
        scalar
            .clone()
            .prop_map(|s| format!("- &a{} {s}\n", s.len() % 7)),
        (0..7usize).prop_map(|i| format!("- *a{i}\n")),
        (0..7usize, 1..30usize)
            .prop_map(|(i, n)| format!("- [{}]\n", vec![format!("*a{i}"); n].join(", "))),
        (0..7usize).prop_map(|i| format!("- &a{i} [{}]\n", ["*a0"; 8].join(", "))),
        (1..60usize).prop_map(|d| format!("- {}{}\n", "[".repeat(d), "]".repeat(d))),
        (0..7usize).prop_map(|i| format!("- {{k: *a{i}, *a{i} : v}}\n")),
        scalar.prop_map(|s| format!("- {{{s}: {s}}}\n")),
    ];
    proptest::collection::vec(piece, 1..80).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever the document, the text it parses to is within the budget's expansion of
    /// the input: aliases cannot multiply it.
    #[test]
    fn fuzz_what_a_yaml_document_parses_to_is_within_its_expansion(yaml in hostile_yaml()) {
        if let Ok(doc) = yaml::from_str::<Value>(&yaml, &BUDGET) {
            let text = serde_json::to_string(&doc).unwrap();
            // Each scalar byte is at most three in JSON (quotes and escapes aside: these
            // are plain), and each node adds its quotes, brackets and separators.
            let bound = 3 * BUDGET.expanded_bytes(yaml.len()) + 4 * BUDGET.nodes(yaml.len());
            prop_assert!(
                text.len() <= bound,
                "{} bytes of JSON from {} bytes of YAML", text.len(), yaml.len()
            );
        }
    }
}
