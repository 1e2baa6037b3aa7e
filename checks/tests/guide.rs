//! The guide cannot rot: every ```` ```sh test ```` block of `docs/guide/*.md` runs against the
//! `k3os-ops` built from this workspace (see `checks::guide` and `docs/README.md`).
//!
//! Each page's blocks run in order, each with `bash -euo pipefail`, in one fresh temporary
//! directory per page, with a `PATH` whose first entry holds only `k3os-ops`. A failing block
//! fails the test naming the page, the block's line, its exit status and its output.
//!
//! The binary: `K3OS_OPS_BIN` when set, else the `k3os-ops` cargo built into the same target
//! directory as this test (`cargo test --workspace` builds it for k3os-ops' own tests; alone,
//! run `cargo build -p k3os-ops` first). Building it from here could race the other test
//! binaries of a workspace run over the same file, so this test only looks.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use checks::guide::{asserts, marked_blocks, Block, MARKER};

/// Longest a block may run: the slowest builds a squashfs and signs a release.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `k3os-ops` to run (see the module docs).
fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("K3OS_OPS_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the path of this test binary");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lies in <target>/<profile>/deps/");
    let bin = profile_dir.join("k3os-ops");
    assert!(
        bin.is_file(),
        "no k3os-ops binary at {}: run `cargo build -p k3os-ops` first (or set K3OS_OPS_BIN)",
        bin.display()
    );
    bin
}

/// The guide's pages, sorted, with their marked blocks.
fn pages() -> Vec<(PathBuf, Vec<Block>)> {
    let dir = repo().join("docs/guide");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text =
                fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            let blocks = marked_blocks(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, blocks)
        })
        .collect()
}

/// A temporary directory holding only `k3os-ops` (a symlink), for the front of `PATH`.
fn bin_dir(bin: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(bin, d.path().join("k3os-ops")).unwrap();
    d
}

/// Run one block in `dir`; None when it passed, else what to report.
fn run(block: &Block, dir: &Path, path: &str) -> Option<String> {
    let log = dir.join(format!(".guide-block-{}.log", block.line));
    let out = File::create(&log).unwrap();
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block.script])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("K3OS_OPS_CONFIG")
        .env_remove("K3OS_OPS_BARRIERS")
        .env_remove("K3OS_OPS_BARRIER_STOP")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("run bash");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break format!("{s}");
        }
        if start.elapsed() > BLOCK_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break format!("timed out after {} s", BLOCK_TIMEOUT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = fs::read_to_string(&log).unwrap_or_default();
    let _ = fs::remove_file(&log);
    (status != "exit status: 0").then(|| format!("{status}\n--- output ---\n{output}"))
}

#[test]
fn every_marked_block_of_the_guide_runs() {
    let bin = binary();
    let bins = bin_dir(&bin);
    let path = format!(
        "{}:{}",
        bins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pages = pages();
    let total: usize = pages.iter().map(|(_, b)| b.len()).sum();
    assert!(
        total > 0,
        "no ```{MARKER} block in docs/guide/*.md: the guide would go untested"
    );
    let mut failures = Vec::new();
    for (page, blocks) in &pages {
        let name = page
            .strip_prefix(repo())
            .unwrap_or(page)
            .display()
            .to_string();
        for b in blocks.iter().filter(|b| !asserts(&b.script)) {
            failures.push(format!(
                "{name}:{}: the block checks nothing (add grep -q, test, cmp or diff)",
                b.line
            ));
        }
        let dir = tempfile::tempdir().unwrap();
        for b in blocks {
            let started = Instant::now();
            if let Some(why) = run(b, dir.path(), &path) {
                failures.push(format!(
                    "{name}:{}: block failed: {why}--- block ---\n{}",
                    b.line, b.script
                ));
                break; // later blocks of the page build on this one
            }
            eprintln!(
                "{name}:{}: ok ({:.1} s)",
                b.line,
                started.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!("{total} block(s) in {} page(s)", pages.len());
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n\n"));
}

/// The CLI reference is the binary's own help: `scripts/cli-reference.sh` regenerates it.
#[test]
fn the_cli_reference_is_the_binarys_help() {
    let out = Command::new("sh")
        .arg(repo().join("scripts/cli-reference.sh"))
        .arg(binary())
        .current_dir(repo())
        .output()
        .expect("run scripts/cli-reference.sh");
    assert!(
        out.status.success(),
        "scripts/cli-reference.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = String::from_utf8(out.stdout).expect("help text is UTF-8");
    let file = repo().join("docs/reference/cli.md");
    let have = fs::read_to_string(&file).unwrap_or_default();
    if let Some((n, (h, w))) = have
        .lines()
        .zip(want.lines())
        .enumerate()
        .find(|(_, (h, w))| h != w)
    {
        panic!(
            "docs/reference/cli.md line {}: {h:?}, but the binary's help says {w:?}; \
             regenerate it with `scripts/cli-reference.sh > docs/reference/cli.md`",
            n + 1
        );
    }
    assert_eq!(
        have.lines().count(),
        want.lines().count(),
        "docs/reference/cli.md has {} lines, the binary's help {}; regenerate it with \
         `scripts/cli-reference.sh > docs/reference/cli.md`",
        have.lines().count(),
        want.lines().count()
    );
}

/// Every relative link of README.md, CHANGELOG.md and docs/ names a file or directory of the
/// repository, and its `#anchor`, if any, a heading of that file.
#[test]
fn every_relative_link_of_the_docs_resolves() {
    let mut pages = vec![repo().join("README.md"), repo().join("CHANGELOG.md")];
    let mut dirs = vec![repo().join("docs")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = fs::read_to_string(page).unwrap();
        let name = page
            .strip_prefix(repo())
            .unwrap_or(page)
            .display()
            .to_string();
        for link in checks::guide::relative_links(&text) {
            let target = page.parent().unwrap().join(&link.path);
            let shown = format!("{name}:{}: {}", link.line, link.path);
            if !target.exists() {
                broken.push(format!("{shown} does not exist"));
                continue;
            }
            let Some(anchor) = &link.anchor else { continue };
            let file = if link.path.is_empty() { page } else { &target };
            let Ok(linked) = fs::read_to_string(file) else {
                continue;
            };
            if !checks::guide::heading_anchors(&linked).contains(anchor) {
                broken.push(format!("{shown}#{anchor}: no such heading"));
            }
        }
    }
    assert!(broken.is_empty(), "\n{}\n", broken.join("\n"));
}

/// The field paths of an OpenAPI schema object, as docs/reference/crd.md writes them
/// (`spec.stage.windows[].start`).
fn schema_paths(schema: &serde_yaml::Value, prefix: &str, out: &mut Vec<String>) {
    let Some(props) = schema.get("properties").and_then(|p| p.as_mapping()) else {
        return;
    };
    for (name, sub) in props {
        let path = format!("{prefix}{}", name.as_str().unwrap_or_default());
        out.push(path.clone());
        match sub.get("type").and_then(|t| t.as_str()) {
            Some("object") => schema_paths(sub, &format!("{path}."), out),
            Some("array") => {
                if let Some(items) = sub.get("items") {
                    schema_paths(items, &format!("{path}[]."), out);
                }
            }
            _ => {}
        }
    }
}

/// docs/reference/crd.md names every field of the UpdateChannel's schema (deploy/crd.yaml,
/// which another test keeps equal to the types).
#[test]
fn the_crd_reference_names_every_field() {
    let yaml = fs::read_to_string(repo().join("k3os-ops/deploy/crd.yaml")).unwrap();
    let crd: serde_yaml::Value = yaml
        .split("\n---\n")
        .filter_map(|d| serde_yaml::from_str(d).ok())
        .find(|d: &serde_yaml::Value| {
            d.get("kind").and_then(|k| k.as_str()) == Some("CustomResourceDefinition")
        })
        .expect("a CustomResourceDefinition in k3os-ops/deploy/crd.yaml");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut paths = Vec::new();
    schema_paths(&schema["spec"], "spec.", &mut paths);
    schema_paths(&schema["status"], "status.", &mut paths);
    assert!(
        paths.len() > 40,
        "only {} fields read from crd.yaml",
        paths.len()
    );
    let doc = fs::read_to_string(repo().join("docs/reference/crd.md")).unwrap();
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !doc.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/reference/crd.md does not name these UpdateChannel fields of crd.yaml: {missing:?}"
    );
}
