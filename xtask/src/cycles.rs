//! No source file of a crate imports another that imports it back, directly or through
//! others: what two files share lives below both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::procs::root;
use crate::tidy::rust_files;

/// The modules a source file uses from its own crate: `crate::a::b`, `super::x` (a sibling,
/// or the parent itself for an item of the parent's), and `child::…` for a module the file
/// declares, braces (`use super::{a::X, b}`) followed. The crate root (`lib.rs`, the facade
/// of re-exports) is no edge.
fn imports(file: &Path, src_root: &Path, text: &str) -> BTreeSet<PathBuf> {
    let module = module_of(file, src_root);
    let parent: PathBuf = module.parent().map(Path::to_path_buf).unwrap_or_default();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut bases = vec![
        ("crate::".to_owned(), PathBuf::new()),
        ("super::".to_owned(), parent),
    ];
    // The modules this file declares, used by their bare names.
    let own_dir =
        if file.ends_with("mod.rs") || file.ends_with("lib.rs") || file.ends_with("main.rs") {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
    for line in code.lines() {
        let line = line.trim();
        if let Some(name) = line
            .strip_prefix("mod ")
            .or_else(|| line.strip_prefix("pub mod "))
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .and_then(|n| n.strip_suffix(';'))
        {
            let child = own_dir.join(name);
            if child.with_extension("rs").is_file() || child.join("mod.rs").is_file() {
                bases.push((format!("{name}::"), module.join(name)));
            }
        }
    }
    for (prefix, base) in &bases {
        let mut at = 0;
        while let Some(found) = code[at..].find(prefix.as_str()) {
            let start = at + found;
            at = start + prefix.len();
            let before = code[..start].chars().last();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            follow(src_root, base, &code[at..], &mut out);
            // A declared child's prefix names the child itself.
            if !(prefix.starts_with("crate") || prefix.starts_with("super")) {
                out.insert(base.clone());
            }
        }
    }
    out.remove(&PathBuf::new());
    // A module using what it declares (its children's items, re-exported or not) is the
    // module tree, not an import between files: only edges to other branches count.
    out.retain(|to| !to.starts_with(&module));
    out
}

/// The deepest modules `rest` (what follows `base::`) names, braces followed.
fn follow(src_root: &Path, base: &Path, rest: &str, out: &mut BTreeSet<PathBuf>) {
    if let Some(inner) = rest.strip_prefix('{') {
        let mut depth = 1;
        let mut item = String::new();
        for c in inner.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 1 => {
                    follow(src_root, base, item.trim(), out);
                    item.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                follow(src_root, base, item.trim(), out);
                return;
            }
            item.push(c);
        }
        return;
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let deeper = base.join(&name);
    if !name.is_empty() && is_module(src_root, &deeper) {
        match rest[name.len()..].strip_prefix("::") {
            Some(after) => follow(src_root, &deeper, after, out),
            None => {
                out.insert(deeper);
            }
        }
    } else {
        out.insert(base.to_path_buf());
    }
}

/// `src/a/b.rs` or `src/a/b/mod.rs` is module `a/b`.
fn module_of(file: &Path, src_root: &Path) -> PathBuf {
    let relative = file
        .strip_prefix(src_root)
        .unwrap_or(file)
        .with_extension("");
    if relative.ends_with("mod") || relative.ends_with("lib") || relative.ends_with("main") {
        relative.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        relative
    }
}

fn is_module(src_root: &Path, module: &Path) -> bool {
    src_root.join(module).with_extension("rs").is_file()
        || src_root.join(module).join("mod.rs").is_file()
}

/// The groups of files that import each other in a circle (strongly connected components
/// of more than one file), each sorted.
fn cycles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    fn finish(
        node: &PathBuf,
        graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        seen: &mut BTreeSet<PathBuf>,
        order: &mut Vec<PathBuf>,
    ) {
        if !seen.insert(node.clone()) {
            return;
        }
        for next in graph.get(node).into_iter().flatten() {
            finish(next, graph, seen, order);
        }
        order.push(node.clone());
    }
    let mut reverse: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (from, tos) in graph {
        for to in tos {
            reverse.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for node in graph.keys() {
        finish(node, graph, &mut seen, &mut order);
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for node in order.iter().rev() {
        let mut group = Vec::new();
        finish(node, &reverse, &mut assigned, &mut group);
        if group.len() > 1 {
            group.sort();
            out.push(group);
        }
    }
    out
}

/// Cycles known and not yet broken, each with why: the test fails on any other, and when
/// one of these is gone (so this list only shrinks).
const KNOWN: &[(&str, &str, &str)] = &[(
    "crates/testkit/src",
    "certs, domain, handlers, listing, nodes, seed, server, state, stats",
    "the emulator (a dev-dependency, not published): its state holds each endpoint's data \
     types, defined beside that endpoint's handlers, which read the state back",
)];

#[test]
fn no_source_file_of_a_crate_imports_one_that_imports_it_back() {
    let root = root();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.extend([root.join("bin/src"), root.join("xtask/src")]);
    let mut cycles: Vec<String> = Vec::new();
    let mut edges = 0;
    for src in &crates {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut graph = BTreeMap::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            // Tests inside a file import what they test: the file's own code is what counts.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let found = imports(file, src, code);
            edges += found.len();
            graph.insert(module_of(file, src), found);
        }
        for group in self::cycles(&graph) {
            let shown: Vec<String> = group.iter().map(|m| m.display().to_string()).collect();
            let krate = src.strip_prefix(&root).unwrap_or(src);
            cycles.push(format!("{}: {}", krate.display(), shown.join(", ")));
        }
    }
    assert!(edges > 100, "the scan found {edges} imports");
    for (krate, group, why) in KNOWN {
        let known = format!("{krate}: {group}");
        assert!(
            cycles.contains(&known),
            "{known} is no longer a cycle ({why}): take it off KNOWN"
        );
        cycles.retain(|c| *c != known);
    }
    assert!(
        cycles.is_empty(),
        "files importing each other in a circle (move what two share below both):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_cycles_through_parents_and_siblings() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(PathBuf::from(a))
                .or_default()
                .insert(PathBuf::from(b));
            g.entry(PathBuf::from(b)).or_default();
        }
        g
    };
    let found = cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
    assert_eq!(found, [["a", "b", "c"].map(PathBuf::from).to_vec()]);
    assert!(cycles(&graph(&[("a", "a/x"), ("a/x", "b"), ("b", "c")])).is_empty());
    assert!(cycles(&graph(&[("a", "b"), ("b", "c")])).is_empty());
}
