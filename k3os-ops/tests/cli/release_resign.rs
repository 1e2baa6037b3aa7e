//! Verify before signing (issue 34 item 1), through the binary: every publisher command that
//! re-signs the channel (`release targets`, `timestamp`, `rollout`, `pause`, `resume`,
//! `withdraw`, `root rotate`) is run against a channel directory tampered in each of four
//! ways (an edited pin, an edited rollout, a replaced file, a rolled-back version). Each run
//! must fail naming the tampered file once and leave every byte of the channel directory as it
//! was, so what the nodes read is unchanged. The untampered channel then still re-signs.

use std::path::Path;

use chrono::{Duration as Days, Utc};
use k3os_ops_testing::cli::ops;
use libupgrade::rollout::{Rollout, Wave};
use libupgrade::trust::meta::{Envelope, Targets, Versions};
use libupgrade::trust::{meta::Role, publish};

use crate::release_trust::Chan;

/// A tampering of the channel: its name, the file it changes, and the change.
struct Tamper {
    name: &'static str,
    file: &'static str,
    apply: fn(&Chan, &[u8]) -> Vec<u8>,
}

/// `targets.json` with its signed body edited by `edit` and its signatures kept.
fn edit_targets(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut env: Envelope = Envelope::parse(bytes, "targets.json").unwrap();
    edit(&mut env.signed);
    serde_json::to_vec(&env).unwrap()
}

const TAMPERS: [Tamper; 4] = [
    Tamper {
        name: "edited pin",
        file: "targets.json",
        apply: |_, b| {
            edit_targets(b, |t| {
                t["targets"]["v1/manifest.json"]["hashes"]["sha256"] = "0".repeat(64).into();
            })
        },
    },
    Tamper {
        name: "edited rollout",
        file: "targets.json",
        apply: |_, b| {
            edit_targets(b, |t| {
                t["targets"]["v2/manifest.json"]["custom"]
                    .as_object_mut()
                    .unwrap()
                    .remove("rollout");
            })
        },
    },
    Tamper {
        // The timestamp replaced by one pinning the same snapshot, signed by a key no root of
        // this channel lists.
        name: "replaced file",
        file: "timestamp.json",
        apply: |c, b| {
            let ts: Versions = Envelope::parse(b, "t")
                .unwrap()
                .body(Role::Timestamp, "t")
                .unwrap();
            Envelope::sign(&ts, &[c.k("targets3")]).to_bytes()
        },
    },
    Tamper {
        // The targets signed before the last publication (the snapshot pins a newer one).
        name: "rolled-back version",
        file: "targets.json",
        apply: |c, _| std::fs::read(c.t.path().join("targets.v1.json")).unwrap(),
    },
];

/// The publisher's commands, each with its keys (key files under `<temp>/keys/`) and `--root`.
fn commands(c: &Chan) -> Vec<(&'static str, Vec<String>)> {
    let k = |n: &str| c.t.path().join("keys").join(n).display().to_string();
    let dir = c.dir.display().to_string();
    let sign = || {
        vec![
            "--key".to_string(),
            k("targets1.key"),
            "--snapshot-key".into(),
            k("snapshot.key"),
            "--timestamp-key".into(),
            k("timestamp.key"),
        ]
    };
    // Every command also takes the root kept apart (`--root`), here the channel's first root.
    let anchor = c.t.path().join("root-kept-apart.json");
    std::fs::copy(c.dir.join("1.root.json"), &anchor).unwrap();
    let with = |head: &[&str], tail: Vec<String>| {
        let mut v: Vec<String> = ["release"]
            .iter()
            .chain(head)
            .map(|s| s.to_string())
            .collect();
        v.extend(tail);
        v.extend(["--root".to_string(), anchor.display().to_string()]);
        v
    };
    vec![
        (
            "targets",
            with(&["targets", &dir, "--key", &k("targets1.key")], vec![]),
        ),
        (
            "timestamp",
            with(
                &["timestamp", &dir],
                vec![
                    "--snapshot-key".into(),
                    k("snapshot.key"),
                    "--timestamp-key".into(),
                    k("timestamp.key"),
                ],
            ),
        ),
        (
            "rollout",
            with(&["rollout", &dir, "v2", "--waves", "100%@+0"], sign()),
        ),
        ("pause", with(&["pause", &dir, "v2"], sign())),
        ("resume", with(&["resume", &dir, "v2"], sign())),
        ("withdraw", with(&["withdraw", &dir, "v2"], sign())),
        (
            "root rotate",
            with(
                &["root", "rotate", &dir],
                vec![
                    "--timestamp-key".into(),
                    k("timestamp2.pub"),
                    "--sign-key".into(),
                    k("root1.key"),
                ],
            ),
        ),
    ]
}

/// A channel whose v2 has a paused rollout (targets version 3), with the targets of version 1
/// kept aside (`<temp>/targets.v1.json`) for the rolled-back tamper.
pub(crate) fn channel() -> Chan {
    let c = Chan::new(1);
    std::fs::copy(
        c.dir.join("targets.json"),
        c.t.path().join("targets.v1.json"),
    )
    .unwrap();
    let signers = [c.k("targets1")];
    let expires = publish::expires_in(Days::days(90));
    let waves = Rollout {
        waves: vec![Wave {
            share_bp: 10_000,
            start: Utc::now() + Days::days(1),
        }],
        ..Rollout::default()
    };
    publish::write_rollout(&c.dir, "v2", &|_| Ok(waves.clone()), &signers, expires).unwrap();
    let at = Utc::now();
    publish::write_rollout(
        &c.dir,
        "v2",
        &|r| r.unwrap().clone().pause(at),
        &signers,
        expires,
    )
    .unwrap();
    c.timestamp(Days::days(7));
    c
}

fn run(args: &[String]) -> std::process::Output {
    ops(None, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn every_re_signing_command_refuses_tampered_metadata_and_writes_nothing() {
    let c = channel();
    for (command, args) in commands(&c) {
        for t in &TAMPERS {
            let path = c.dir.join(t.file);
            let original = c.read(t.file);
            c.write(t.file, &(t.apply)(&c, &original));
            let before = testkit::tree_bytes(&c.dir);
            let out = run(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            let case = format!(
                "release {command} over a channel with {} ({})",
                t.name, t.file
            );
            assert!(!out.status.success(), "{case}: signed it\n{err}");
            let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
            assert_eq!(errors.len(), 1, "{case}: {err}");
            let line = errors[0];
            assert!(
                line.contains("refusing to sign over the channel's metadata as served"),
                "{case}: {line}"
            );
            assert_eq!(
                line.matches(&path.display().to_string()).count(),
                1,
                "{case}: {line}"
            );
            testkit::assert_same_tree(&case, &before, &testkit::tree_bytes(&c.dir));
            eprintln!("{case}: {line}");
            c.write(t.file, &original);
        }
    }
    // Untampered, every command signs again (the refusals were the tampering's).
    for (command, args) in commands(&c) {
        let out = run(&args);
        assert!(
            out.status.success(),
            "release {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_signed_chain(&c.dir);
}

/// The channel, after the untampered commands, still verifies as the publisher verifies it.
fn assert_signed_chain(dir: &Path) {
    let served = libupgrade::trust::client::served::verify_served(dir).unwrap();
    let (t, _): (Targets, _) = served.targets.unwrap();
    assert!(t.targets["v2/manifest.json"]
        .custom
        .as_ref()
        .unwrap()
        .rollout
        .is_some());
}

/// The order vm-tests' trust-rotation scenario publishes in: root 2 replaces the targets key,
/// then `release timestamp` re-signs before `release targets` (the served targets, signed by
/// the revoked key, are what the snapshot pins, so they are accepted as such), then the targets
/// are re-signed with the new key. Targets the revoked key signs *after* the rotation, newer
/// than the pin, are refused.
#[test]
fn after_a_targets_key_rotation_the_pinned_old_targets_verify_and_newer_ones_must_use_the_new_key()
{
    let c = Chan::new(1);
    let changes = std::collections::BTreeMap::from([(Role::Targets, c.spec(&["targets2"], 1))]);
    let year = publish::expires_in(Days::days(365));
    publish::rotate_root(&c.dir, &changes, &[c.k("root1")], year).unwrap();
    c.timestamp(Days::days(7));
    let expires = publish::expires_in(Days::days(90));
    let e = publish::write_targets(&c.dir, &[c.k("targets1")], expires).unwrap_err();
    assert!(
        e.to_string()
            .contains("0 valid signature(s) by targets keys of root version 2"),
        "{e}"
    );
    // The revoked key's own re-listing, left on disk by someone else: never signed over.
    let mut body: Targets = Envelope::parse(&c.read("targets.json"), "t")
        .unwrap()
        .body(Role::Targets, "t")
        .unwrap();
    body.version += 1;
    let pinned = c.read("targets.json");
    c.write(
        "targets.json",
        &Envelope::sign(&body, &[c.k("targets1")]).to_bytes(),
    );
    let before = testkit::tree_bytes(&c.dir);
    let e = publish::write_targets(&c.dir, &[c.k("targets2")], expires).unwrap_err();
    assert!(
        e.to_string().contains("targets.json: 0 valid signature(s)"),
        "{e}"
    );
    testkit::assert_same_tree("channel", &before, &testkit::tree_bytes(&c.dir));
    c.write("targets.json", &pinned);
    publish::write_targets(&c.dir, &[c.k("targets2")], expires).unwrap();
    c.timestamp(Days::days(7));
    assert_signed_chain_without_rollouts(&c.dir);
}

fn assert_signed_chain_without_rollouts(dir: &Path) {
    let served = libupgrade::trust::client::served::verify_served(dir).unwrap();
    assert_eq!(served.root.version, 2);
    assert!(served.targets.is_some());
}

/// The chain's own shape: `root.json` that is not the newest root of the chain, and a snapshot
/// served without the timestamp that pins it, are refused like an edited file, naming it.
#[test]
fn a_stale_root_json_or_a_missing_timestamp_is_refused_naming_the_file() {
    let c = Chan::new(1);
    let changes = std::collections::BTreeMap::from([(Role::Timestamp, c.spec(&["timestamp2"], 1))]);
    let year = publish::expires_in(Days::days(365));
    publish::rotate_root(&c.dir, &changes, &[c.k("root1")], year).unwrap();
    let expires = publish::expires_in(Days::days(90));
    let cases: [(&str, Option<Vec<u8>>); 2] = [
        ("root.json", Some(c.read("1.root.json"))),
        ("timestamp.json", None),
    ];
    for (file, replacement) in cases {
        let original = c.read(file);
        match &replacement {
            Some(b) => c.write(file, b),
            None => std::fs::remove_file(c.dir.join(file)).unwrap(),
        }
        let before = testkit::tree_bytes(&c.dir);
        let e = publish::write_targets(&c.dir, &[c.k("targets1")], expires).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&c.dir.join(file).display().to_string())
                && msg.contains("refusing to sign"),
            "{file}: {msg}"
        );
        testkit::assert_same_tree(file, &before, &testkit::tree_bytes(&c.dir));
        c.write(file, &original);
    }
    publish::write_targets(&c.dir, &[c.k("targets1")], expires).unwrap();
}

/// `--root FILE` anchors the publisher's check on a root kept apart: a chain replaced from
/// `1.root.json` on (a forger's root that lists the publisher's public keys next to its own,
/// and files its own keys signed) is refused before anything is written.
#[test]
fn a_chain_replaced_from_its_first_root_is_refused_from_a_root_kept_apart() {
    let c = Chan::new(1);
    let anchor = c.t.path().join("root-kept-apart.json");
    std::fs::copy(c.dir.join("1.root.json"), &anchor).unwrap();
    for f in [
        "1.root.json",
        "root.json",
        "targets.json",
        "snapshot.json",
        "timestamp.json",
    ] {
        std::fs::remove_file(c.dir.join(f)).unwrap();
    }
    let roles = std::collections::BTreeMap::from([
        (Role::Root, c.spec(&["root2"], 1)),
        (Role::Targets, c.spec(&["targets1", "targets3"], 1)),
        (Role::Snapshot, c.spec(&["snapshot", "timestamp2"], 1)),
        (Role::Timestamp, c.spec(&["timestamp", "timestamp2"], 1)),
    ]);
    let year = publish::expires_in(Days::days(365));
    publish::init_root(&c.dir, &roles, &[c.k("root2")], year).unwrap();
    let expires = publish::expires_in(Days::days(90));
    publish::write_targets(&c.dir, &[c.k("targets3")], expires).unwrap();
    let week = publish::expires_in(Days::days(7));
    publish::write_timestamp(&c.dir, &[c.k("timestamp2")], expires, week).unwrap();

    let k = |n: &str| c.t.path().join("keys").join(n).display().to_string();
    let dir = c.dir.display().to_string();
    let before = testkit::tree_bytes(&c.dir);
    let args = [
        "release",
        "timestamp",
        &dir,
        "--snapshot-key",
        &k("snapshot.key"),
        "--timestamp-key",
        &k("timestamp.key"),
        "--root",
        &anchor.display().to_string(),
    ];
    let out = ops(None, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "signed over a forged chain: {err}");
    assert!(
        err.contains(&c.dir.join("root.json").display().to_string())
            && err.contains("the newest of the chain")
            && err.contains("refusing to sign"),
        "{err}"
    );
    testkit::assert_same_tree("channel", &before, &testkit::tree_bytes(&c.dir));
}
