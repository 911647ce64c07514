//! The controller's structure, read from its sources: no import circle between its files, and
//! the domain (the planner, the act side, observe, validate and the rest) imports nothing of
//! the runtime that drives it. A file's imports are its `use` paths and inline `crate::` and
//! `super::` paths, test code left out; each is resolved to the file of the longest module
//! prefix it names. And the runtime's size, against its budget.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module (`crate::a::b`) and the file that holds it.
struct Module {
    path: Vec<String>,
    file: PathBuf,
    text: String,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Drops comments, string and char literals (a crude lexer: enough for paths).
fn strip_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
                i += 1;
                while i < b.len() && b[i] != b'\'' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// The end (exclusive) of the item starting at `from`: its `;` or its balanced `{}` block.
fn item_end(text: &str, from: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in text[from..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return from + i + 1;
                }
            }
            ';' if depth == 0 => return from + i + 1,
            _ => {}
        }
    }
    text.len()
}

/// `text` without the items under `#[cfg(test)]`, and the names of the modules declared so
/// (`#[cfg(test)] mod name;`), whose files are test code.
fn strip_test_items(text: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut test_mods = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let end = item_end(after, 0);
        let item = after[..end].trim();
        if let Some(name) = item
            .split_whitespace()
            .skip_while(|w| *w != "mod")
            .nth(1)
            .filter(|_| item.ends_with(';'))
        {
            test_mods.push(name.trim_end_matches(';').to_owned());
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

fn modules() -> Vec<Module> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let root = src();
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    let mut all = Vec::new();
    let mut test_files = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().with_extension("");
        let mut path: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        if path == ["lib"] || path == ["main"] {
            path.clear();
            if file.ends_with("main.rs") {
                // The binary is a crate of its own: it may use the library, nothing uses it.
                continue;
            }
        }
        let raw = std::fs::read_to_string(&file).unwrap();
        let (text, test_mods) = strip_test_items(&strip_comments_and_strings(&raw));
        let dir = if path.is_empty() || file.ends_with("mod.rs") {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        for m in test_mods {
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(&m));
        }
        all.push(Module { path, file, text });
    }
    all.retain(|m| {
        !test_files
            .iter()
            .any(|t| m.file == *t || m.file.starts_with(t))
    });
    all
}

/// Every path a `use` tree names, flattened (`a::{b, c::d}` → `a::b`, `a::c::d`).
fn flatten(tree: &str) -> Vec<String> {
    // Without whitespace and renames (`x as y`).
    let mut bare = String::new();
    let mut words = tree.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w == "as" {
            if let Some(alias) = words.next() {
                bare.push_str(&alias[alias.find([',', '}']).unwrap_or(alias.len())..]);
            }
            continue;
        }
        bare.push_str(w);
    }
    let tree = bare;
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| flatten(p).into_iter().map(move |f| format!("{prefix}{f}")))
        .collect()
}

/// The paths `m` names: its `use` trees and its inline `crate::`/`super::` paths, absolute.
fn named_paths(m: &Module, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut raw = Vec::new();
    let text = &m.text;
    let mut i = 0;
    while let Some(at) = text[i..].find("use ") {
        let start = i + at;
        i = start + 4;
        let before = text[..start].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = start + text[start..].find(';').unwrap_or(text.len() - start);
        raw.extend(flatten(&text[start + 4..end]));
    }
    for anchor in ["crate::", "super::"] {
        let mut i = 0;
        while let Some(at) = text[i..].find(anchor) {
            let start = i + at;
            i = start + anchor.len();
            if text[..start]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue;
            }
            let end = text[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(text.len(), |e| start + e);
            raw.push(text[start..end].to_owned());
        }
    }
    raw.into_iter()
        .filter_map(|p| {
            let segs: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
            let mut abs: Vec<String> = match segs.first()? {
                &"crate" => Vec::new(),
                &"super" | &"self" => {
                    let mut base = m.path.clone();
                    let mut k = 0;
                    while segs.get(k) == Some(&"super") {
                        base.pop();
                        k += 1;
                    }
                    base.extend(
                        segs[k..]
                            .iter()
                            .filter(|s| **s != "self")
                            .map(|s| (*s).to_owned()),
                    );
                    return Some(base);
                }
                first if children.contains(*first) => m.path.clone(),
                _ => return None,
            };
            abs.extend(
                segs.iter()
                    .skip(usize::from(segs[0] == "crate"))
                    .map(|s| (*s).to_owned()),
            );
            Some(abs)
        })
        .collect()
}

/// File → the files it imports from.
fn edges(mods: &[Module]) -> BTreeMap<String, BTreeSet<String>> {
    let by_path: BTreeMap<Vec<String>, &Module> =
        mods.iter().map(|m| (m.path.clone(), m)).collect();
    let name = |m: &Module| m.file.strip_prefix(src()).unwrap().display().to_string();
    let mut edges = BTreeMap::new();
    for m in mods {
        let children: BTreeSet<String> = mods
            .iter()
            .filter(|c| c.path.len() == m.path.len() + 1 && c.path.starts_with(&m.path))
            .map(|c| c.path.last().unwrap().clone())
            .collect();
        let to: BTreeSet<String> = named_paths(m, &children)
            .into_iter()
            .filter_map(|p| {
                (0..=p.len())
                    .rev()
                    .find_map(|k| by_path.get(&p[..k]))
                    .filter(|t| t.path != m.path && !t.path.is_empty())
                    .map(|t| name(t))
            })
            .collect();
        edges.insert(name(m), to);
    }
    edges
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_file_of_the_controller_is_in_an_import_circle() {
    let edges = edges(&modules());
    assert!(edges.len() > 50, "the sources were read: {}", edges.len());
    let found = circles(&edges);
    let described: Vec<String> = found
        .iter()
        .map(|c| {
            let ties: Vec<String> = c
                .iter()
                .flat_map(|f| {
                    edges[f]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(move |t| format!("{f} -> {t}"))
                })
                .collect();
            format!("{}: {}", c.join(", "), ties.join("; "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "import circles:\n{}",
        described.join("\n")
    );
}

#[test]
fn the_domain_imports_nothing_of_the_runtime() {
    let edges = edges(&modules());
    let domain = [
        "plan",
        "act",
        "observe",
        "validate",
        "status",
        "retain",
        "template",
        "claim_use",
        "set_kind",
        "config",
        "identity",
    ];
    let wiring = ["runtime", "cli.rs", "lib.rs"];
    let upward: Vec<String> = edges
        .iter()
        .filter(|(f, _)| {
            domain
                .iter()
                .any(|d| f.as_str() == format!("{d}.rs") || f.starts_with(&format!("{d}/")))
        })
        .flat_map(|(f, to)| {
            to.iter()
                .filter(|t| wiring.iter().any(|w| t.starts_with(w)))
                .map(move |t| format!("{f} -> {t}"))
        })
        .collect();
    assert!(
        upward.is_empty(),
        "the domain imports the runtime: {upward:?}"
    );
}

/// The runtime's size budget (issue 42 §2): its production code, test items and test files left
/// out and comment lines counted, at most 5,000 lines; the reconcile at most 200.
#[test]
fn the_runtime_keeps_to_its_line_budget() {
    let files: Vec<(String, usize)> = modules()
        .into_iter()
        .filter(|m| m.path.first().is_some_and(|p| p == "runtime"))
        .map(|m| (m.path.join("::"), m.text.lines().count()))
        .collect();
    assert!(files.len() > 10, "the runtime's files were read: {files:?}");
    let total: usize = files.iter().map(|(_, n)| n).sum();
    assert!(
        total <= 5_000,
        "runtime/ holds {total} lines of production code, over its budget of 5,000: {files:?}"
    );
    let reconcile = files
        .iter()
        .find(|(path, _)| path == "runtime::controller::reconcile")
        .map(|(_, n)| *n)
        .expect("runtime/controller/reconcile.rs");
    assert!(
        reconcile <= 200,
        "reconcile.rs holds {reconcile} lines, over its budget of 200"
    );
}

#[test]
fn the_circle_check_sees_a_circle() {
    // Two files that import each other, and one apart: the check must find exactly the pair.
    let edges = BTreeMap::from([
        ("a.rs".to_owned(), BTreeSet::from(["b.rs".to_owned()])),
        (
            "b.rs".to_owned(),
            BTreeSet::from(["a.rs".to_owned(), "c.rs".to_owned()]),
        ),
        ("c.rs".to_owned(), BTreeSet::new()),
    ]);
    assert_eq!(
        circles(&edges),
        vec![vec!["a.rs".to_owned(), "b.rs".to_owned()]]
    );
    let parsed = flatten("super::{cluster::{Events, publish}, context::Context as C}");
    assert_eq!(
        parsed,
        [
            "super::cluster::Events",
            "super::cluster::publish",
            "super::context::Context"
        ]
    );
}
