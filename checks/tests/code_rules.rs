//! The code rules of the repository, checked over its tracked files (see `checks::rules`):
//! each test fails naming every file, edge or type that breaks its rule.

use std::path::{Path, PathBuf};
use std::process::Command;

use checks::rules::{layering, paths, sizes};

fn repo() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// The repository's Rust files (tracked, and untracked ones git does not ignore).
fn rust_files() -> Vec<PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "*.rs",
        ])
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let files: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| repo().join(p).is_file())
        .collect();
    assert!(files.len() > 100, "only {} Rust files found", files.len());
    files
}

#[test]
fn no_source_file_is_over_the_size_limit() {
    let counted: Vec<(PathBuf, usize)> = rust_files()
        .into_iter()
        .map(|p| {
            let n = sizes::counted_lines(&std::fs::read_to_string(repo().join(&p)).unwrap());
            (p, n)
        })
        .collect();
    let e = sizes::oversized(counted.iter().map(|(p, n)| (p.as_path(), *n)));
    assert!(e.is_empty(), "\n{}\n", e.join("\n"));
}

#[test]
fn the_agent_keeps_its_layering() {
    let agent = Path::new("k3os-ops/src/agent");
    // The agent's top-level modules: a path into the agent root that names none (an item of
    // agent/mod.rs, `super::AgentArgs`) is no edge.
    let modules: Vec<String> = std::fs::read_dir(repo().join(agent))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    let mut edges = Vec::new();
    for p in rust_files() {
        let Ok(rel) = p.strip_prefix(agent) else {
            continue;
        };
        if sizes::is_test_code(&p) {
            continue; // unit-test files (`#[cfg(test)] mod tests;`) may use any layer
        }
        let rel = rel.to_string_lossy().into_owned();
        if rel == "mod.rs" {
            continue;
        }
        let text = std::fs::read_to_string(repo().join(&p)).unwrap();
        let from = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        let names = layering::imports(&rel, &text).unwrap_or_else(|e| panic!("{e}"));
        for to in names.into_iter().filter(|m| modules.contains(m)) {
            edges.push((rel.clone(), from.clone(), to));
        }
    }
    assert!(
        edges.len() > 20,
        "only {} edges read: {edges:?}",
        edges.len()
    );
    let e = layering::breaks(&edges);
    assert!(e.is_empty(), "\n{}\n", e.join("\n"));
}

#[test]
fn every_type_has_one_public_path() {
    let mut e = Vec::new();
    let mut types = 0;
    for (krate, root) in [
        ("libupgrade", "libupgrade/src/lib.rs"),
        ("bootconfig", "bootconfig/src/lib.rs"),
        ("fleet_report", "fleet-report/src/lib.rs"),
        ("collector", "collector/src/lib.rs"),
        ("k3os_ops", "k3os-ops/src/lib.rs"),
    ] {
        let found = paths::public_paths(&repo().join(root)).unwrap_or_else(|err| panic!("{err}"));
        types += found.len();
        e.extend(paths::doubled(krate, &found));
    }
    assert!(types > 100, "only {types} public types found");
    assert!(e.is_empty(), "\n{}\n", e.join("\n"));
}
