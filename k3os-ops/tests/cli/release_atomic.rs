//! Every publisher command is all or nothing: run through the binary with a wrong key of each
//! role it signs with (a key no root lists, in the place of the targets, snapshot, timestamp or
//! root key), each command must fail naming the role and the file, and leave every byte of the
//! channel directory as it was. With the right keys the same command then succeeds (the
//! refusals were the keys'). A full disk (a tmpfs with no room left) is refused the same way.

use std::path::Path;
use std::process::Command;

use chrono::{Duration as Days, Utc};
use k3os_ops_testing::cli::ops;
use libupgrade::rollout::{Rollout, Wave};
use libupgrade::trust::publish;

use crate::release_trust::Chan;

/// The key files a command is given, by role (names under `<temp>/keys/`).
#[derive(Clone, Copy)]
struct Keys {
    targets: &'static str,
    snapshot: &'static str,
    timestamp: &'static str,
    root: &'static str,
}

const RIGHT: Keys = Keys {
    targets: "targets1.key",
    snapshot: "snapshot.key",
    timestamp: "timestamp.key",
    root: "root1.key",
};

/// A key of no role of the channel.
const WRONG: &str = "targets3.key";

/// One publisher command: its name, the roles it signs with, the channel it runs on and its
/// arguments for a channel directory and keys.
struct Cmd {
    name: &'static str,
    roles: &'static [&'static str],
    channel: fn() -> Chan,
    args: fn(&Chan, &str, Keys) -> Vec<String>,
}

fn key(c: &Chan, name: &str) -> String {
    c.t.path().join("keys").join(name).display().to_string()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `--key T --snapshot-key S --timestamp-key TS` of the commands that re-sign all three.
fn sign(c: &Chan, k: Keys) -> Vec<String> {
    vec![
        "--key".into(),
        key(c, k.targets),
        "--snapshot-key".into(),
        key(c, k.snapshot),
        "--timestamp-key".into(),
        key(c, k.timestamp),
    ]
}

fn with(head: &[&str], tail: Vec<String>) -> Vec<String> {
    let mut v = strings(head);
    v.extend(tail);
    v
}

/// v2 with a rollout whose first wave starts tomorrow, not paused.
fn waves_channel() -> Chan {
    let c = Chan::new(1);
    let waves = Rollout {
        waves: vec![Wave {
            share_bp: 10_000,
            start: Utc::now() + Days::days(1),
        }],
        ..Rollout::default()
    };
    let expires = publish::expires_in(Days::days(90));
    publish::write_rollout(
        &c.dir,
        "v2",
        &|_| Ok(waves.clone()),
        &[c.k("targets1")],
        expires,
    )
    .unwrap();
    c.timestamp(Days::days(7));
    c
}

fn paused_channel() -> Chan {
    crate::release_resign::channel()
}

fn halt_channel() -> Chan {
    let c = Chan::new(1);
    libupgrade::signing::generate_keypair(&c.t.path().join("keys"), "halt").unwrap();
    c
}

const COMMANDS: &[Cmd] = &[
    Cmd {
        name: "targets",
        roles: &["targets"],
        channel: paused_channel,
        args: |c, d, k| {
            with(
                &["release", "targets", d, "--key", &key(c, k.targets)],
                vec![],
            )
        },
    },
    Cmd {
        name: "targets with snapshot and timestamp keys",
        roles: &["targets", "snapshot", "timestamp"],
        channel: paused_channel,
        args: |c, d, k| with(&["release", "targets", d], sign(c, k)),
    },
    Cmd {
        name: "timestamp",
        roles: &["snapshot", "timestamp"],
        channel: paused_channel,
        args: |c, d, k| {
            let mut v = sign(c, k);
            v.drain(..2);
            with(&["release", "timestamp", d], v)
        },
    },
    Cmd {
        name: "rollout",
        roles: &["targets", "snapshot", "timestamp"],
        channel: paused_channel,
        args: |c, d, k| {
            with(
                &["release", "rollout", d, "v2", "--waves", "100%@+0"],
                sign(c, k),
            )
        },
    },
    Cmd {
        name: "pause",
        roles: &["targets", "snapshot", "timestamp"],
        channel: waves_channel,
        args: |c, d, k| with(&["release", "pause", d, "v2"], sign(c, k)),
    },
    Cmd {
        name: "resume",
        roles: &["targets", "snapshot", "timestamp"],
        channel: paused_channel,
        args: |c, d, k| with(&["release", "resume", d, "v2"], sign(c, k)),
    },
    Cmd {
        name: "withdraw",
        roles: &["targets", "snapshot", "timestamp"],
        channel: paused_channel,
        args: |c, d, k| with(&["release", "withdraw", d, "v2"], sign(c, k)),
    },
    Cmd {
        name: "delegate-halt",
        roles: &["targets", "snapshot", "timestamp"],
        channel: halt_channel,
        args: |c, d, k| {
            let halt = key(c, "halt.pub");
            with(
                &["release", "delegate-halt", d, "--halt-key", &halt],
                sign(c, k),
            )
        },
    },
    Cmd {
        name: "root rotate",
        roles: &["root"],
        channel: paused_channel,
        args: |c, d, k| {
            let ts = key(c, "timestamp2.pub");
            let root = key(c, k.root);
            strings(&[
                "release",
                "root",
                "rotate",
                d,
                "--timestamp-key",
                &ts,
                "--sign-key",
                &root,
            ])
        },
    },
];

/// `keys` with the key of `role` replaced by [`WRONG`].
fn wrong(role: &str) -> Keys {
    let mut k = RIGHT;
    match role {
        "targets" => k.targets = WRONG,
        "snapshot" => k.snapshot = WRONG,
        "timestamp" => k.timestamp = WRONG,
        "root" => k.root = WRONG,
        other => panic!("no role {other}"),
    }
    k
}

/// The file a refusal of `role`'s new document names (root rotation writes root version 2).
fn file_of(role: &str) -> &'static str {
    match role {
        "targets" => "targets.json",
        "snapshot" => "snapshot.json",
        "timestamp" => "timestamp.json",
        _ => "2.root.json",
    }
}

fn run(args: &[String]) -> std::process::Output {
    ops(None, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Run `args`: it must fail with `expect` in its message and leave `dir` byte for byte as it was.
fn refused(case: &str, dir: &Path, args: &[String], expect: &[String]) {
    let before = testkit::tree_bytes(dir);
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{case}: it succeeded\n{err}");
    for e in expect {
        assert!(err.contains(e.as_str()), "{case}: no {e:?} in\n{err}");
    }
    testkit::assert_same_tree(case, &before, &testkit::tree_bytes(dir));
    eprintln!("{case}: {}", err.trim());
}

#[test]
fn every_publisher_command_with_any_wrong_key_writes_nothing_and_names_the_role_and_file() {
    for cmd in COMMANDS {
        let c = (cmd.channel)();
        let dir = c.dir.display().to_string();
        for role in cmd.roles {
            let case = format!("release {} with a wrong {role} key", cmd.name);
            let path = c.dir.join(file_of(role)).display().to_string();
            let expect = [format!("by {role} keys"), path];
            refused(&case, &c.dir, &(cmd.args)(&c, &dir, wrong(role)), &expect);
        }
        let out = run(&(cmd.args)(&c, &dir, RIGHT));
        assert!(
            out.status.success(),
            "release {} with the right keys: {}",
            cmd.name,
            String::from_utf8_lossy(&out.stderr)
        );
        libupgrade::trust::client::served::verify_served(&c.dir).unwrap();
    }
}

/// `release root init` without a secret root key signs nothing: the directory stays empty.
#[test]
fn root_init_without_a_root_signature_writes_nothing() {
    let c = Chan::new(1);
    let dir = c.t.path().join("new");
    std::fs::create_dir(&dir).unwrap();
    let d = dir.display().to_string();
    let args = |root: &str| {
        strings(&[
            "release",
            "root",
            "init",
            &d,
            "--root-key",
            &key(&c, root),
            "--targets-key",
            &key(&c, "targets1.pub"),
            "--snapshot-key",
            &key(&c, "snapshot.pub"),
            "--timestamp-key",
            &key(&c, "timestamp.pub"),
        ])
    };
    let path = dir.join("1.root.json").display().to_string();
    let expect = ["by root keys".to_string(), path];
    refused(
        "release root init with a public root key only",
        &dir,
        &args("root1.pub"),
        &expect,
    );
    let out = run(&args("root1.key"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tmpfs of `size` mounted at `at` (needs root, as CI has), unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn copy_tree(from: &Path, to: &Path) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cp: {err}");
}

/// A channel on a full disk: `release pause` with the right keys cannot write its new files;
/// it fails naming the file, and nothing of the channel changed (no temporary file left).
#[test]
fn a_full_disk_leaves_the_channel_as_it_was() {
    let c = waves_channel();
    let full = c.t.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
        .arg(&full)
        .status()
        .unwrap();
    assert!(
        st.success(),
        "mounting a tmpfs failed: this test needs root (CI runs as root)"
    );
    let _fs = Tmpfs(full.clone());
    copy_tree(&c.dir, &full);
    // Fill what is left of the tmpfs.
    let mut f = std::fs::File::create(full.join("filler")).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &block).is_ok() {}
    drop(f);
    let d = full.display().to_string();
    let args = with(&["release", "pause", &d, "v2"], sign(&c, RIGHT));
    let expect = [
        format!("{d}/.targets.json.part"),
        "No space left on device".to_string(),
    ];
    refused("release pause on a full disk", &full, &args, &expect);
    std::fs::remove_file(full.join("filler")).unwrap();
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
