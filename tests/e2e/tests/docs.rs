//! The documentation holds together: every relative link in README.md, CHANGELOG.md, docs/ and
//! the crates' and examples' READMEs leads to a file that exists, and every `#anchor` to a
//! heading of that page (as GitHub names headings); the README stays a front page. No cluster.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

/// GitHub's anchor of a heading: lowercase, letters, digits, `-` and `_` kept, spaces to `-`,
/// everything else (backticks, dots, slashes, dashes of other kinds) dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|(_, l)| {
            let rest = l.trim_start_matches('#');
            (rest.len() < l.len() && rest.starts_with(' ')).then(|| anchor(rest))
        })
        .collect()
}

/// The targets of the inline links `[text](target)` on a line.
fn links(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = &after[..end];
        if !target.contains(char::is_whitespace) {
            out.push(target);
        }
        rest = &after[end..];
    }
    out
}

fn pages(root: &Path) -> Result<Vec<PathBuf>> {
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for dir in ["docs", "crates", "example"] {
        for entry in std::fs::read_dir(root.join(dir))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            } else if path.join("README.md").exists() {
                pages.push(path.join("README.md"));
            }
        }
    }
    Ok(pages)
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_leads_somewhere() -> Result<()> {
    let root = e2e::repo_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages(&root)? {
        let text = std::fs::read_to_string(&page).with_context(|| page.display().to_string())?;
        for (n, line) in prose(&text) {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    page.parent().context("page dir")?.join(path)
                };
                let at = format!("{}:{n}: {target}", page.strip_prefix(&root)?.display());
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                } else if !fragment.is_empty() && file.extension().is_some_and(|e| e == "md") {
                    let target_text = std::fs::read_to_string(&file)?;
                    if !anchors(&target_text).contains(fragment) {
                        broken.push(format!("{at}: no such heading"));
                    }
                }
            }
        }
    }
    ensure!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    ensure!(
        checked > 50,
        "only {checked} links checked: is the parser blind?"
    );
    Ok(())
}

#[test]
fn the_checker_sees_a_broken_link_and_a_broken_anchor() {
    let text = "# Top `thing`\n\nSee [a](#top-thing), [b](#nowhere).\n```\n[c](#in-code)\n```\n";
    let found = anchors(text);
    assert!(found.contains("top-thing"));
    assert!(!found.contains("nowhere"));
    let targets: Vec<&str> = prose(text)
        .into_iter()
        .flat_map(|(_, l)| links(l))
        .collect();
    assert_eq!(targets, ["#top-thing", "#nowhere"]);
    assert_eq!(anchor("Retained volumes"), "retained-volumes");
    assert_eq!(
        anchor("OpenKruise Advanced StatefulSets"),
        "openkruise-advanced-statefulsets"
    );
    assert_eq!(
        anchor("`drainer exec -- COMMAND` (hook mode)"),
        "drainer-exec----command-hook-mode"
    );
}

#[test]
fn the_readme_is_a_front_page() -> Result<()> {
    let text = std::fs::read_to_string(e2e::repo_root().join("README.md"))?;
    let lines = text.lines().count();
    ensure!(
        lines <= 250,
        "README.md has {lines} lines: keep it a front page, and the rest in docs/"
    );
    Ok(())
}
