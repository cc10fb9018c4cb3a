//! Docs and structure the compiler does not check, checked as tests (rust-analyzer's
//! `tidy.rs` habit): every invariant a comment cites by number is the invariant of
//! ARCHITECTURE.md under that number (and `cycles`: no source file of a crate imports
//! another that imports it back).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::procs::root;

/// Every `.rs` file under `dir` (but `target/`).
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !path.ends_with("target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// ARCHITECTURE.md's invariants: number → its bold title (which may wrap), lower case.
fn invariants(map: &str) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    for (at, _) in map.match_indices(". **") {
        let line_start = map[..at].rfind('\n').map_or(0, |i| i + 1);
        let Ok(number) = map[line_start..at].trim().parse::<u32>() else {
            continue;
        };
        let title_start = at + ". **".len();
        if let Some(len) = map[title_start..].find("**") {
            let title = map[title_start..title_start + len].split_whitespace();
            out.insert(number, title.collect::<Vec<_>>().join(" ").to_lowercase());
        }
    }
    out
}

/// The words of a title that say what it is about (five letters or more, but the words any
/// title could hold).
fn key_words(title: &str) -> Vec<&str> {
    const ANY: [&str; 12] = [
        "every", "never", "other", "others", "which", "there", "under", "within", "holds",
        "before", "after", "passes",
    ];
    let mut words: Vec<&str> = title
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() >= 5 && !ANY.contains(w))
        .collect();
    words.sort_unstable();
    words.dedup();
    words
}

/// Each `invariant N` of `text`, with the line it is on and those around it (lower case).
fn citations(text: &str) -> Vec<(usize, u32, String)> {
    let lines: Vec<String> = text.lines().map(str::to_lowercase).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("invariant ") {
            rest = &rest[at + "invariant ".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(number) = digits.parse() {
                let around =
                    |j: Option<usize>| j.and_then(|j| lines.get(j)).map_or("", String::as_str);
                let context = format!(
                    "{} {line} {}",
                    around(i.checked_sub(1)),
                    around(Some(i + 1))
                );
                out.push((i + 1, number, context));
            }
        }
    }
    out
}

#[test]
fn every_invariant_a_comment_cites_by_number_is_that_invariant_of_the_architecture_map() {
    let root = root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let invariants = invariants(&map);
    assert!(invariants.len() >= 20, "{invariants:?}");
    let mut files = Vec::new();
    for dir in ["crates", "bin", "xtask", "fuzz"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.extend(["clippy.toml", "deploy/check.py", ".ci/run"].map(|f| root.join(f)));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (line, number, context) in citations(&text) {
            checked += 1;
            let shown = format!(
                "{}:{line}",
                file.strip_prefix(&root).unwrap_or(file).display()
            );
            match invariants.get(&number) {
                None => wrong.push(format!("{shown}: invariant {number} does not exist")),
                Some(title) => {
                    // Two of its words (one, for a title of one): a comment that names the
                    // invariant's subject, not a word it happens to share.
                    let words = key_words(title);
                    let found = words.iter().filter(|w| context.contains(*w)).count();
                    if found < words.len().min(2) {
                        wrong.push(format!(
                            "{shown}: cites invariant {number} (\"{title}\") without any of {words:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(checked >= 5, "the scan found {checked} citations");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The library crates (those published: all of `crates/` but `publish = false`), by package
/// name, with their folder.
fn library_crates() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let manifest = std::fs::read_to_string(entry.path().join("Cargo.toml")).unwrap_or_default();
        if manifest.contains("publish = false") {
            continue;
        }
        let name = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|n| n.strip_suffix('"'));
        if let Some(name) = name {
            out.push((name.to_owned(), entry.path()));
        }
    }
    out.sort();
    out
}

#[test]
fn every_library_crate_is_tested_alone_in_ci_and_its_readme_example_is_a_doc_test() {
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let alone = ci
        .lines()
        .find(|l| l.trim_start().starts_with("for crate in "))
        .expect("the each-crate-alone loop of .ci/run");
    let crates = library_crates();
    assert!(crates.len() >= 10, "{crates:?}");
    for (name, dir) in crates {
        assert!(
            alone
                .split_whitespace()
                .any(|w| w.trim_end_matches(';') == name),
            "{name} is missing from .ci/run's each-crate-alone loop"
        );
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap_or_default();
        assert!(
            lib.contains("include_str!(\"../README.md\")"),
            "{name}'s README is not compiled as a doc test (include it under #[cfg(doctest)])"
        );
    }
}
