//! Byte compatibility of `bootconfig::grubenv` with Debian's `grub-editenv` (grub-common), both
//! directions. Fails (never skips) when `grub-editenv` is not installed.

use std::path::Path;
use std::process::Command;

use bootconfig::{GrubEnv, ENV_SIZE};

fn editenv(file: &Path, args: &[&str]) -> String {
    let out = Command::new("grub-editenv")
        .arg(file)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("grub-editenv (package grub-common) must be installed to run this test: {e}")
        });
    assert!(
        out.status.success(),
        "grub-editenv {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const CASES: &[&[(&str, &str)]] = &[
    &[],
    &[
        ("K3OS_PRIMARY", "B"),
        ("K3OS_A", "good"),
        ("K3OS_A_TRIES", "0"),
        ("K3OS_B", "try"),
        ("K3OS_B_TRIES", "3"),
    ],
    &[
        ("back", "a\\b\\\\c"),
        ("nl", "line1\nline2\n"),
        ("hash", "#not a comment"),
        ("empty", ""),
        ("eq", "x=y=z"),
    ],
    &[
        ("saved_entry", "k3os-a"),
        ("next_entry", ""),
        ("spaces", "  lead and trail  "),
    ],
];

#[test]
fn editenv_written_blocks_read_in_rust_and_are_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    for (i, case) in CASES.iter().enumerate() {
        let f = d.path().join(format!("env{i}"));
        editenv(&f, &["create"]);
        for (k, v) in *case {
            editenv(&f, &["set", &format!("{k}={v}")]);
        }
        let theirs = std::fs::read(&f).unwrap();
        assert_eq!(theirs.len(), ENV_SIZE);
        let parsed = GrubEnv::parse(&theirs).unwrap();
        let expected = GrubEnv::from_pairs(case.iter().copied());
        assert_eq!(parsed, expected, "case {i}");
        assert_eq!(
            expected.to_bytes().unwrap(),
            theirs,
            "case {i}: Rust block must be byte-identical"
        );
    }
}

#[test]
fn rust_written_blocks_list_the_same_in_editenv() {
    let d = tempfile::tempdir().unwrap();
    for (i, case) in CASES.iter().enumerate() {
        let f = d.path().join(format!("env{i}"));
        std::fs::write(
            &f,
            GrubEnv::from_pairs(case.iter().copied())
                .to_bytes()
                .unwrap(),
        )
        .unwrap();
        let listed = editenv(&f, &["list"]);
        let expected: String = case.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        assert_eq!(listed, expected, "case {i}");
    }
}

#[test]
fn editenv_edits_of_a_rust_block_match_rust_edits() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("env");
    let mut env =
        GrubEnv::from_pairs([("K3OS_A", "good"), ("K3OS_B", "try"), ("K3OS_B_TRIES", "3")]);
    std::fs::write(&f, env.to_bytes().unwrap()).unwrap();
    // Shrink, grow, append, and unset: grub-editenv edits in place; Rust re-serialises.
    editenv(&f, &["set", "K3OS_A=bad"]);
    env.set("K3OS_A", "bad");
    editenv(&f, &["set", "K3OS_B=good\\with\nescapes"]);
    env.set("K3OS_B", "good\\with\nescapes");
    editenv(&f, &["set", "extra=1"]);
    env.set("extra", "1");
    editenv(&f, &["unset", "K3OS_B_TRIES"]);
    env.remove("K3OS_B_TRIES");
    let theirs = std::fs::read(&f).unwrap();
    assert_eq!(GrubEnv::parse(&theirs).unwrap(), env);
    assert_eq!(env.to_bytes().unwrap(), theirs);
}

/// `grub_set_in_place` (the model of GRUB's `save_env` edit) against grub-editenv, which runs
/// the same `grub_envblk_set`: byte-identical blocks after tricky edits.
#[test]
fn in_place_set_model_matches_editenv_byte_for_byte() {
    use bootconfig::grub_set_in_place;
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("env");
    editenv(&f, &["create"]);
    let mut model = std::fs::read(&f).unwrap();
    let edits = [
        ("A", "\nV="),
        ("V", ""),
        ("K3OS_A", "good"),
        ("A", "x\\"),
        ("K3OS_A", "try"),
        ("V", "longer value here"),
        ("A", ""),
        ("K3OS_A_TRIES", "3"),
        ("K3OS_A_TRIES", "2"),
    ];
    for (k, v) in edits {
        editenv(&f, &["set", &format!("{k}={v}")]);
        assert!(grub_set_in_place(&mut model, k, v));
        assert_eq!(model, std::fs::read(&f).unwrap(), "after set {k}={v:?}");
    }
}
