//! The README's layout table against the tree: every path it names exists, and every crate of the
//! workspace has a row or is named in one. A file moved or a crate added without the table
//! following fails here, naming what is missing.
//!
//! Which backticked words of the table are paths: everything in the first column, and elsewhere
//! any word with a `/` in it and no space (`install/src/transform/`); all relative to the
//! repository root. Words without a `/` (`libcuslice.so`, `cuslice-hook`) are names, not paths.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    // tests/harness -> the repository root.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The rows of the table under `## Layout`, each as its cells (header and separator left out).
fn layout_rows(readme: &str) -> Vec<Vec<String>> {
    let mut lines = readme.lines().skip_while(|l| l.trim() != "## Layout");
    assert!(
        lines.next().is_some(),
        "README.md has no `## Layout` section"
    );
    let table: Vec<&str> = lines
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .collect();
    assert!(
        table.len() > 2,
        "README.md's `## Layout` section has no table"
    );
    table[2..]
        .iter()
        .map(|l| {
            let l = l.trim().trim_start_matches('|').trim_end_matches('|');
            l.split('|').map(|c| c.trim().to_string()).collect()
        })
        .collect()
}

/// The backticked words of a cell.
fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The paths a row names, in order.
fn row_paths(row: &[String]) -> Vec<String> {
    let mut paths = Vec::new();
    for (i, cell) in row.iter().enumerate() {
        for word in backticked(cell) {
            let is_path = i == 0
                || (word.contains('/')
                    && !word.contains(char::is_whitespace)
                    && !word.starts_with('/')
                    && !word.contains("://"));
            if is_path {
                paths.push(word.to_string());
            }
        }
    }
    paths
}

fn readme() -> String {
    let path = root().join("README.md");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_path_in_the_readme_layout_table_exists() {
    let rows = layout_rows(&readme());
    let mut named = 0;
    let mut missing = Vec::new();
    for row in &rows {
        let paths = row_paths(row);
        assert!(
            !paths.is_empty(),
            "a layout row names no path in its first column: {row:?}"
        );
        for p in paths {
            named += 1;
            if !root().join(&p).exists() {
                missing.push(p);
            }
        }
    }
    assert!(
        named >= 10,
        "README.md's layout table names only {named} paths; is it parsed right?"
    );
    assert!(
        missing.is_empty(),
        "README.md's layout table names {} path(s) that do not exist (relative to the repository root): {}",
        missing.len(),
        missing.join(", ")
    );
}

/// The `members` of the workspace's Cargo.toml, as written there.
fn workspace_members() -> Vec<String> {
    let path = root().join("Cargo.toml");
    let toml =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let list = toml
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("the workspace's Cargo.toml has no `members = [...]`");
    list.lines()
        .map(|l| {
            l.split('#')
                .next()
                .unwrap_or_default()
                .trim()
                .trim_end_matches(',')
                .trim_matches('"')
        })
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_workspace_crate_is_in_the_readme_layout_table() {
    let named: Vec<String> = layout_rows(&readme())
        .iter()
        .flat_map(|r| row_paths(r))
        .map(|p| p.trim_end_matches('/').to_string())
        .collect();
    let members = workspace_members();
    assert!(
        !members.is_empty(),
        "no workspace members found in Cargo.toml"
    );
    let absent: Vec<&String> = members.iter().filter(|m| !named.contains(m)).collect();
    assert!(
        absent.is_empty(),
        "README.md's layout table names no row or path for these workspace crates: {}",
        absent
            .iter()
            .map(|m| format!("{m}/"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[test]
fn the_parser_reads_paths_from_the_first_column_and_slashed_words_elsewhere() {
    let readme = "intro\n\n## Layout\n\n| path | what |\n|---|---|\n\
                  | `a/` | `b.so`, `c/d.rs` and `/run/x`, `e / f` |\n| `g` | none |\n\nafter\n| `h/` | not the table |\n";
    let rows = layout_rows(readme);
    assert_eq!(rows.len(), 2);
    assert_eq!(row_paths(&rows[0]), ["a/", "c/d.rs"]);
    assert_eq!(row_paths(&rows[1]), ["g"]);
}

/// The README is the front door: what cuslice is, the two commands, install, configuration,
/// Kubernetes in brief and links. The rest lives in docs/; a README past 15,000 bytes has
/// taken in what belongs there.
#[test]
fn the_readme_stays_under_15000_bytes() {
    let n = readme().len();
    assert!(
        n < 15_000,
        "README.md is {n} bytes; move the detail into docs/ and link it (limit 15,000)"
    );
}

/// Every file the README links to (relative links) exists.
#[test]
fn every_file_the_readme_links_to_exists() {
    let text = readme();
    let mut missing = Vec::new();
    let mut seen = 0;
    for part in text.split("](").skip(1) {
        let Some(target) = part.split(')').next() else {
            continue;
        };
        let file = target.split('#').next().unwrap_or_default();
        if file.is_empty() || file.contains("://") {
            continue;
        }
        seen += 1;
        if !root().join(file).exists() {
            missing.push(file.to_string());
        }
    }
    assert!(
        seen >= 10,
        "README.md links to only {seen} files; is it parsed right?"
    );
    assert!(
        missing.is_empty(),
        "README.md links to missing files: {missing:?}"
    );
}
