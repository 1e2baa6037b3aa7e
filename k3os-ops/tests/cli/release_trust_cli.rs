//! End to end through the binary: `release create` → `release root init` / `targets` /
//! `timestamp` → `release serve` → `upgrade --channel` on a node (a temp dir with the k3OS dir
//! layout and a real GRUB env) that trusts root version 1. Then the publisher rotates the root
//! (new root key, the targets key replaced: the old one is revoked) and publishes v3, its
//! manifest signed by a brand-new release key that no trust.d holds, listed only by the new
//! targets key: the node, which still has only root v1 and the old release key on disk, walks to
//! root 2 and upgrades on the targets role's word, with no change on the node. The same v3
//! served without metadata is refused for its signature. A stale channel is refused with one error line naming
//! the role and its expiry, and `--ignore-expiry` overrides it loudly.

use crate::release_args::release_create;
use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::path::{Path, PathBuf};

use cli_support::ops;
use release_support::Server;

fn ok(config: Option<&Path>, args: &[&str]) -> (String, String) {
    let out = ops(config, args);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "k3os-ops {args:?} failed:\n{o}{e}");
    (o, e)
}

fn fails(config: Option<&Path>, args: &[&str]) -> String {
    let out = ops(config, args);
    assert!(!out.status.success(), "k3os-ops {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{err}");
    errors[0].to_string()
}

/// A node booted on slot A (v1, generation 1) trusting `release.pub` for manifests, with its
/// channel root at `<node>/root.json`.
fn node(p: &Path, trust: &Path) -> PathBuf {
    let root = format!("channel_root = \"{}/root.json\"\n", p.display());
    cli_support::write_node(p, 1, trust, &root)
}

/// `release create` of a real squashfs release `version` into the channel.
fn create(work: &Path, chan: &Path, key: &Path, version: &str, generation: u64) {
    let (sq, k, i) = release_support::squashfs_inputs(work, version);
    let args = release_create((&sq, &k, &i), chan, key, version, generation);
    ok(None, &args.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn a_node_trusting_only_root_1_upgrades_to_a_release_listed_by_a_key_that_exists_since_root_2() {
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s);
    let s = |s: &str| p(s).display().to_string();
    let keys = p("keys");
    for name in [
        "release",
        "release2",
        "root1",
        "root2",
        "targets1",
        "targets2",
        "snapshot",
        "timestamp",
    ] {
        ok(
            None,
            &[
                "release",
                "keygen",
                "-o",
                &keys.display().to_string(),
                "--name",
                name,
            ],
        );
    }
    let k = |n: &str| keys.join(n).display().to_string();
    let trust = p("trust.d");
    fs::create_dir_all(&trust).unwrap();
    fs::copy(keys.join("release.pub"), trust.join("release.pub")).unwrap();

    // Publisher: a channel with v2 and its metadata.
    let chan = p("site/stable");
    fs::create_dir_all(&chan).unwrap();
    fs::create_dir_all(p("work")).unwrap();
    ok(None, &["release", "index", &s("site/stable")]);
    create(&p("work"), &chan, &keys.join("release.key"), "v2", 2);
    let (out, _) = ok(
        None,
        &[
            "release",
            "root",
            "init",
            &s("site/stable"),
            "--root-key",
            &k("root1.key"),
            "--targets-key",
            &k("targets1.pub"),
            "--snapshot-key",
            &k("snapshot.pub"),
            "--timestamp-key",
            &k("timestamp.pub"),
        ],
    );
    assert!(out.contains("wrote root version 1"), "{out}");
    ok(
        None,
        &[
            "release",
            "targets",
            &s("site/stable"),
            "--key",
            &k("targets1.key"),
        ],
    );
    let timestamp = |extra: &[&str]| {
        let (c, sk, tk) = (s("site/stable"), k("snapshot.key"), k("timestamp.key"));
        let mut a = vec!["release", "timestamp", c.as_str()];
        a.extend([
            "--snapshot-key",
            sk.as_str(),
            "--timestamp-key",
            tk.as_str(),
        ]);
        a.extend_from_slice(extra);
        ok(None, &a)
    };
    timestamp(&[]);
    let srv = Server::start(&p("site"));
    let url = format!("{}stable/", srv.url);

    // The node: root v1 baked in at image build.
    let n = p("node");
    let cfg = node(&n, &trust);
    fs::copy(chan.join("root.json"), n.join("root.json")).unwrap();
    // --plan-only verifies the signed metadata and writes nothing on the node: no trust
    // record, no lock file (issue 25).
    let state = n.join("state");
    let before = fs::read_dir(&state).map(|d| d.count()).unwrap_or(0);
    let (out, err) = ok(Some(&cfg), &["upgrade", "--plan-only", "--channel", &url]);
    assert!(out.contains("plan for v2"), "{out}");
    assert!(err.contains("(signed channel metadata)"), "{err}");
    for f in ["channel-trust.json", "channel-trust.lock"] {
        assert!(!state.join(f).exists(), "--plan-only wrote {f}");
    }
    assert_eq!(fs::read_dir(&state).map(|d| d.count()).unwrap_or(0), before);
    let (out, err) = ok(Some(&cfg), &["upgrade", "--stage-only", "--channel", &url]);
    assert!(out.contains("staged v2"), "{out}");
    assert!(err.contains("(signed channel metadata)"), "{err}");

    // Rotate: root2 replaces root1, targets2 replaces targets1 (revoked).
    let (out, _) = ok(
        None,
        &[
            "release",
            "root",
            "rotate",
            &s("site/stable"),
            "--sign-key",
            &k("root1.key"),
            "--root-key",
            &k("root2.key"),
            "--targets-key",
            &k("targets2.pub"),
        ],
    );
    assert!(out.contains("rotated to root version 2"), "{out}");
    // v3 is signed by a release key that exists only on the publisher: no node trusts it.
    create(&p("work"), &chan, &keys.join("release2.key"), "v3", 3);
    let e = fails(
        None,
        &[
            "release",
            "targets",
            &s("site/stable"),
            "--key",
            &k("targets1.key"),
        ],
    );
    assert!(
        e.contains("0 valid signature(s) by targets keys of root version 2"),
        "{e}"
    );
    ok(
        None,
        &[
            "release",
            "targets",
            &s("site/stable"),
            "--key",
            &k("targets2.key"),
        ],
    );
    timestamp(&[]);
    let (out, _) = ok(Some(&cfg), &["upgrade", "--stage-only", "--channel", &url]);
    assert!(out.contains("staged v3"), "{out}");
    assert!(
        out.contains("signed by the channel's targets role (targets version 2, root version 2)"),
        "{out}"
    );
    assert!(!trust.join("release2.pub").exists());
    assert_eq!(
        fs::read(n.join("root.json")).unwrap(),
        fs::read(chan.join("1.root.json")).unwrap(),
        "nothing changed on the node's image"
    );
    let store = fs::read_to_string(n.join("state/channel-trust.json")).unwrap();
    assert!(store.contains("\"format\": 1"), "{store}");
    a_release_served_without_metadata_needs_a_trust_d_signature(&p, &chan, &trust);

    // An operator inspects the channel as a node with root v1 sees it; nothing is recorded.
    let root1 = n.join("root.json").display().to_string();
    let (out, _) = ok(None, &["release", "resolve", &url, "--root", &root1]);
    assert!(
        out.starts_with("v3 (")
            && out.contains(
                "vouched for by the channel's targets role (targets version 2, root version 2)"
            ),
        "{out}"
    );
    let (out, _) = ok(None, &["release", "list", &url, "--root", &root1]);
    let listed: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(listed, ["v3", "v2"], "{out}");
    let bare = p("bare").display().to_string();
    let e = fails(None, &["release", "list", &bare, "--root", &root1]);
    assert!(e.contains("timestamp.json is missing"), "{e}");

    // The channel goes stale: one error line naming the role and its expiry.
    timestamp(&["--expires", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let e = fails(Some(&cfg), &["upgrade", "--stage-only", "--channel", &url]);
    assert!(
        e.contains("timestamp metadata (version 3) expired at"),
        "{e}"
    );
    let (out, err) = ok(
        Some(&cfg),
        &[
            "upgrade",
            "--stage-only",
            "--channel",
            &url,
            "--ignore-expiry",
        ],
    );
    assert!(err.contains("WARNING: --ignore-expiry"), "{err}");
    assert!(out.contains("already holds v3"), "{out}");
}

/// The same v3 (manifest signed by a key in no trust.d) in a channel without metadata, to a
/// node without a root: nothing vouches for it but its signature, which no trust.d key made.
fn a_release_served_without_metadata_needs_a_trust_d_signature(
    p: &dyn Fn(&str) -> PathBuf,
    chan: &Path,
    trust: &Path,
) {
    let bare = p("bare");
    fs::create_dir_all(bare.join("v3")).unwrap();
    fs::copy(chan.join("index.json"), bare.join("index.json")).unwrap();
    for f in fs::read_dir(chan.join("v3")).unwrap() {
        let f = f.unwrap().path();
        fs::copy(&f, bare.join("v3").join(f.file_name().unwrap())).unwrap();
    }
    let n = p("node-without-root");
    let cfg = node(&n, trust);
    let chan_arg = bare.display().to_string();
    let e = fails(
        Some(&cfg),
        &[
            "upgrade",
            "--stage-only",
            "--channel",
            &chan_arg,
            "--version",
            "v3",
        ],
    );
    assert!(e.contains("signature of"), "{e}");
    assert!(e.contains("which is not trusted"), "{e}");
}
