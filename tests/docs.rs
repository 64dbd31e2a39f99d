//! The docs against the code: the facade's metrics table (crate docs, "Metrics") names every
//! metric the layers register, with its type and label keys, and nothing else; and every path
//! in CONTRIBUTING.md's layout table exists; and no file outgrows the house rule's length. They
//! read files only: no features, no services.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `"..."` literals in `text`, each with whether `=>` follows it (a label key).
fn literals(text: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        let literal = after[..end].to_owned();
        rest = &after[end + 1..];
        found.push((literal, rest.trim_start().starts_with("=>")));
    }
    found
}

/// One metric: its name, its kind (`counter`, `gauge`, `histogram`) and its label keys.
type Metric = (String, String, BTreeSet<String>);

/// Every `counter!`, `gauge!` and `histogram!` call in `layers/*/src`.
fn registered() -> BTreeSet<Metric> {
    let mut files = Vec::new();
    for entry in fs::read_dir(root().join("layers")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut metrics = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for kind in ["counter", "gauge", "histogram"] {
            let call = format!("{kind}!(");
            for (at, _) in text.match_indices(&call) {
                let args = &text[at + call.len()..];
                // The macro's arguments: up to the parenthesis that closes the call.
                let mut depth = 1;
                let end = args
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map(|(i, _)| i)
                    .unwrap_or_else(|| panic!("unclosed {call} in {}", file.display()));
                let literals = literals(&args[..end]);
                let (name, _) = literals.first().unwrap_or_else(|| {
                    panic!("{call} without a literal name in {}", file.display())
                });
                let labels = literals
                    .iter()
                    .filter(|(_, key)| *key)
                    .map(|(l, _)| l.clone())
                    .collect();
                metrics.insert((name.clone(), kind.to_owned(), labels));
            }
        }
    }
    metrics
}

/// The backticked words of a table cell.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The metrics table's rows: metric, type, label keys, and every label value listed.
fn documented() -> Vec<(Metric, Vec<String>)> {
    let docs = fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let rows: Vec<_> = docs
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `tower_once_"))
        .map(|row| format!("| `tower_once_{row}"))
        .collect();
    assert!(!rows.is_empty(), "no metrics table in src/lib.rs");
    rows.iter()
        .map(|row| {
            let cells: Vec<_> = row.split('|').map(str::trim).collect();
            let name = ticked(cells[1]).remove(0);
            let kind = cells[2].to_owned();
            let mut keys = BTreeSet::new();
            let mut values = Vec::new();
            for part in cells[3].split(';').filter(|p| !p.trim().is_empty()) {
                let words = ticked(part);
                keys.insert(words[0].clone());
                values.extend(words[1..].iter().cloned());
            }
            ((name, kind, keys), values)
        })
        .collect()
}

#[test]
fn the_metrics_table_names_every_registered_metric_and_nothing_else() {
    let registered = registered();
    let documented = documented();
    let table: BTreeSet<Metric> = documented.iter().map(|(m, _)| m.clone()).collect();
    let missing: Vec<_> = registered.difference(&table).collect();
    let stale: Vec<_> = table.difference(&registered).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "registered but not in the table (name, type, label keys): {missing:#?}\n\
         in the table but not registered: {stale:#?}"
    );
    assert!(
        table
            .iter()
            .any(|(name, _, _)| name == "tower_once_outbox_sends_total"),
        "the outbox relay's counter is in the table"
    );
}

#[test]
fn every_label_value_in_the_metrics_table_is_a_literal_of_its_crate() {
    for ((name, _, _), values) in documented() {
        // tower_once_<crate>_...: the crate that registers it.
        let krate = name
            .trim_start_matches("tower_once_")
            .split('_')
            .next()
            .unwrap();
        let mut files = Vec::new();
        rust_files(&root().join("layers").join(krate).join("src"), &mut files);
        let source: String = files
            .iter()
            .map(|f| fs::read_to_string(f).unwrap())
            .collect();
        for value in values {
            assert!(
                source.contains(&format!("\"{value}\"")),
                "{name}: the label value `{value}` appears nowhere in layers/{krate}/src"
            );
        }
    }
}

#[test]
fn every_path_in_the_layout_table_exists() {
    let contributing = fs::read_to_string(root().join("CONTRIBUTING.md")).unwrap();
    let layout = contributing
        .split("\n## Layout\n")
        .nth(1)
        .expect("CONTRIBUTING.md has a Layout section");
    let mut checked = 0;
    let mut missing = Vec::new();
    for row in layout.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<_> = row.split('|').map(str::trim).collect();
        let path = ticked(cells[1]).remove(0);
        // `layers/*/tests`: at least one crate has it.
        let bases: Vec<PathBuf> = match path.split_once("/*/") {
            Some((parent, child)) => fs::read_dir(root().join(parent))
                .unwrap()
                .map(|e| e.unwrap().path().join(child))
                .filter(|p| p.exists())
                .collect(),
            None => vec![root().join(&path)]
                .into_iter()
                .filter(|p| p.exists())
                .collect(),
        };
        checked += 1;
        if bases.is_empty() {
            missing.push(path.clone());
            continue;
        }
        if path.contains('*') {
            continue;
        }
        // The files and folders the row names (`future/`, `covered.rs`,
        // `migrations/0001_outbox.sql`), each somewhere below the row's path.
        let base = &bases[0];
        let dir = if base.is_dir() {
            base.clone()
        } else {
            base.parent().unwrap().into()
        };
        let mut below = Vec::new();
        walk(&dir, &mut below);
        for name in ticked(cells[2]) {
            let looks_like_a_path = [".rs", ".sql", ".sh", ".md", "/"]
                .iter()
                .any(|end| name.ends_with(end))
                && !name.contains(' ');
            if !looks_like_a_path {
                continue;
            }
            let wanted = format!("/{}", name.trim_end_matches('/'));
            if !below.iter().any(|p| p.ends_with(&wanted)) {
                missing.push(format!("{path}: {name}"));
            }
        }
    }
    assert!(
        checked >= 20,
        "the layout table has its rows ({checked} read)"
    );
    assert!(
        missing.is_empty(),
        "named in the layout table, not in the tree: {missing:#?}"
    );
}

/// Every file and folder below `dir`, as `/`-separated strings.
fn walk(dir: &Path, out: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.to_string_lossy().replace('\\', "/"));
        if path.is_dir() {
            walk(&path, out);
        }
    }
}

/// The house rule (CONTRIBUTING.md): a source file does one job, so none grows past 400 lines,
/// and a test file holds one subject, so none grows past 800.
#[test]
fn no_source_file_over_400_lines_and_no_test_file_over_800() {
    let root = root();
    let mut too_long = Vec::new();
    let mut crates = vec![root.clone()];
    for entry in fs::read_dir(root.join("layers")).expect("layers/") {
        crates.push(entry.expect("a crate").path());
    }
    for krate in crates {
        for (dir, limit) in [("src", 400), ("tests", 800)] {
            let mut files = Vec::new();
            if krate.join(dir).is_dir() {
                rust_files(&krate.join(dir), &mut files);
            }
            for file in files {
                let lines = fs::read_to_string(&file).expect("readable").lines().count();
                if lines > limit {
                    too_long.push(format!("{} ({lines} > {limit})", file.display()));
                }
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "split by job or subject: {too_long:#?}"
    );
}
