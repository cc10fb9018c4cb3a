//! The size bounds of library code (ARCHITECTURE.md, "Sizes"): no source file over 600
//! code lines and no function over 80 lines, tests, the testkit and xtask aside. The
//! functions still over the bound are listed with their length; the list may only
//! shrink, and a listed function may only get shorter.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 80;

/// Functions over the bound, `file:function` and their length, each allowed only to
/// shrink. None is today; an entry here is a debt to pay, not a place to park a function.
const OVER: &[(&str, usize)] = &[];

/// The code of a file before its `#[cfg(test)] mod tests`.
fn library_part(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Non-blank lines that are not comments.
fn code_lines(lines: &[&str]) -> usize {
    lines
        .iter()
        .filter(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with("//")
        })
        .count()
}

/// The name of the function a line declares, if it does.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for prefix in ["async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// Braces of a line outside string and char literals and comments.
fn braces(line: &str) -> (usize, usize) {
    let (mut open, mut close) = (0, 0);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A char literal ('{', '\''); a lifetime has no closing quote nearby.
                let ahead: String = chars.clone().take(3).collect();
                if let Some(escaped) = ahead.strip_prefix('\\') {
                    if let Some(end) = escaped.find('\'') {
                        for _ in 0..end + 2 {
                            chars.next();
                        }
                    }
                } else if ahead.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            '{' => open += 1,
            '}' => close += 1,
            _ => {}
        }
    }
    (open, close)
}

/// Each function of `lines` with its length in lines, declaration to closing brace.
fn functions<'a>(lines: &[&'a str]) -> Vec<(&'a str, usize)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let mut depth = 0usize;
        let mut opened = false;
        for (offset, line) in lines[start..].iter().enumerate() {
            let (open, close) = braces(line);
            opened |= open > 0;
            depth = (depth + open).saturating_sub(close);
            if !opened && line.trim_end().ends_with(';') {
                break; // a declaration without a body
            }
            if opened && depth == 0 {
                found.push((name, offset + 1));
                break;
            }
        }
    }
    found
}

fn library_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(
                &*name,
                "target" | "tests" | "benches" | "examples" | "testkit"
            ) {
                library_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

#[test]
fn the_measure_counts_bodies_and_skips_literals() {
    let text = "fn a() {\n    let s = \"}}}\";\n    let c = '}';\n}\n\
                pub(crate) async fn b<'x>(x: &'x str) -> &'x str {\n    // }\n    x\n}\n\
                fn c();\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
    let lines = library_part(text);
    assert_eq!(functions(&lines), [("a", 4), ("b", 4)]);
    assert_eq!(code_lines(&lines), 8);
}

#[test]
fn library_files_and_functions_stay_within_their_size_bounds() {
    let root = crate::procs::root();
    let mut files = Vec::new();
    for dir in ["crates", "bin"] {
        library_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "{} files", files.len());
    let mut problems = Vec::new();
    let mut listed_seen = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = library_part(&text);
        let relative = file.strip_prefix(&root).unwrap().display().to_string();
        let code = code_lines(&lines);
        if code > MAX_FILE_LINES {
            problems.push(format!(
                "{relative}: {code} code lines (at most {MAX_FILE_LINES})"
            ));
        }
        // Functions of one name in one file (methods of several impls) count as their
        // longest.
        let mut longest = std::collections::BTreeMap::new();
        for (name, length) in functions(&lines) {
            let entry = longest.entry(format!("{relative}:{name}")).or_insert(0);
            *entry = length.max(*entry);
        }
        for (key, length) in longest {
            let listed = OVER.iter().find(|(k, _)| *k == key).map(|(_, n)| *n);
            if listed.is_some() {
                listed_seen.push(key.clone());
            }
            match listed {
                Some(bound) if length > bound => problems.push(format!(
                    "{key}: {length} lines, more than its listed {bound}"
                )),
                Some(_) if length <= MAX_FN_LINES => problems.push(format!(
                    "{key}: {length} lines, within {MAX_FN_LINES} now: remove it from OVER"
                )),
                None if length > MAX_FN_LINES => problems.push(format!(
                    "{key}: {length} lines (at most {MAX_FN_LINES}): split it"
                )),
                _ => {}
            }
        }
    }
    for (key, _) in OVER {
        if !listed_seen.iter().any(|k| k == key) {
            problems.push(format!("{key} is listed in OVER but no longer exists"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
