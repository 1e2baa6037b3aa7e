//! Rollouts end to end through the binary (issue 24): the publisher sets, pauses, resumes and
//! withdraws rollouts with `release rollout|pause|resume|withdraw` on a channel served by
//! `release serve`; a node (a temp dir with the k3OS layout, running v1) resolves `latest`
//! through the signed metadata with its clock moved by `K3OS_OPS_TEST_NOW` (the binary's
//! test-only clock). Covered: a wave that has not reached the node (the older release is
//! taken, the newer one's start is named), `--plan-only` creating no seed, `--version` of a
//! withheld release refused unless `--ignore-rollout` (a withdrawn one refused whatever the
//! flags, and a slot holding it never activated), a withdrawn staged release replaced by
//! the newest one still offered, a pause holding a node, a required stop walked first,
//! `slot status` showing the seed, and `release resolve --seed --at` showing one node's view.

use crate::release_args::release_create;
use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use chrono::{DateTime, Duration, SubsecRound, Utc};
use release_support::Server;

/// Run the binary with the node's config and, when given, the test clock (also the retry
/// tests' runner).
pub(crate) fn run(config: Option<&Path>, now: Option<DateTime<Utc>>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_k3os-ops"));
    c.args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove(libupgrade::channel::TEST_NOW_ENV);
    if let Some(cfg) = config {
        c.env("K3OS_OPS_CONFIG", cfg);
    }
    if let Some(t) = now {
        c.env(libupgrade::channel::TEST_NOW_ENV, t.to_rfc3339());
    }
    c.output().unwrap()
}

fn ok(config: Option<&Path>, now: Option<DateTime<Utc>>, args: &[&str]) -> (String, String) {
    let out = run(config, now, args);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "k3os-ops {args:?} failed:\n{o}{e}");
    (o, e)
}

/// After `release withdraw … v3`: node2 (v3 staged in slot B before the withdrawal) takes v3 with
/// no flag, and once it verified the withdrawal its slot holding v3 is never activated. The
/// refusals name their cause once and leave the slots and boot files (and, for `slot
/// activate`, every byte of the node) as they were.
fn withdrawal_is_final(cfg: &Path, n: &Path, url: &str, now: Option<DateTime<Utc>>) {
    let (slots, boot) = (
        testkit::tree_bytes(&n.join("system")),
        testkit::tree_bytes(&n.join("boot")),
    );
    let state = fs::read(n.join("state/state.json")).unwrap();
    let args = [
        "upgrade",
        "--stage-only",
        "--channel",
        url,
        "--version",
        "v3",
        "--ignore-rollout",
        "--allow-downgrade",
    ];
    let out = run(Some(cfg), now, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a withdrawn release was taken: {err}"
    );
    assert!(
        err.contains("release v3 is not offered to this node")
            && err.contains("a withdrawn release is never taken, whatever the flags")
            && !err.contains("takes it anyway"),
        "{err}"
    );
    assert_eq!(err.matches("withdrawn at").count(), 1, "{err}");
    testkit::assert_same_tree("slots", &slots, &testkit::tree_bytes(&n.join("system")));
    testkit::assert_same_tree("boot", &boot, &testkit::tree_bytes(&n.join("boot")));
    assert_eq!(state, fs::read(n.join("state/state.json")).unwrap());

    let whole = testkit::tree_bytes(n);
    let out = run(Some(cfg), now, &["slot", "activate"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a withdrawn slot was activated: {err}"
    );
    assert!(
        err.contains("slot B holds v3 (generation 3)")
            && err.contains("withdrew target v3/manifest.json at")
            && err.contains("never activated, whatever the flags"),
        "{err}"
    );
    assert_eq!(err.matches("withdrew").count(), 1, "{err}");
    testkit::assert_same_tree("node after slot activate", &whole, &testkit::tree_bytes(n));
}

fn create(work: &Path, chan: &Path, key: &Path, version: &str, generation: u64) {
    let (sq, k, i) = release_support::squashfs_inputs(work, version);
    let args = release_create((&sq, &k, &i), chan, key, version, generation);
    ok(
        None,
        None,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[test]
fn a_node_follows_waves_pause_withdrawal_and_required_stops_through_the_cli() {
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s);
    let s = |s: &str| p(s).display().to_string();
    let keys = p("keys");
    let publisher = |a: &[&str]| {
        ok(None, None, a);
    };
    publisher(&["release", "keygen", "-o", &s("keys"), "--name", "release"]);
    let meta = release_support::MetaKeys::generate(&keys, &publisher);
    let trust = p("trust.d");
    fs::create_dir_all(&trust).unwrap();
    fs::copy(keys.join("release.pub"), trust.join("release.pub")).unwrap();

    let chan = p("site/stable");
    fs::create_dir_all(&chan).unwrap();
    fs::create_dir_all(p("work")).unwrap();
    ok(None, None, &["release", "index", &s("site/stable")]);
    for (v, g) in [("v1", 1), ("v2", 2), ("v3", 3)] {
        create(&p("work"), &chan, &keys.join("release.key"), v, g);
    }
    let c = s("site/stable");
    meta.init_channel(&chan, &publisher);
    let sign = meta.signing();
    let publish = |args: &[&str]| {
        let mut a: Vec<&str> = vec!["release"];
        a.extend_from_slice(args);
        a.extend(sign.iter().map(String::as_str));
        ok(None, None, &a).0
    };
    // `release targets` then `release timestamp`, as a publisher re-lists the channel.
    let relist = || meta.relist(&chan, &publisher);
    // v3 goes to the whole fleet at once, a day from now (every seed waits until then).
    let start = (Utc::now() + Duration::days(1)).trunc_subsecs(0);
    let start_s = start.to_rfc3339();
    let out = publish(&[
        "rollout", &c, "v3", "--waves", "100%@+0", "--start", &start_s,
    ]);
    assert!(out.contains("0.00 % of the fleet"), "{out}");
    // Re-listing the channel keeps the rollout.
    relist();
    let (status, _) = ok(
        None,
        None,
        &[
            "release",
            "rollout-status",
            &c,
            "--at",
            &(start + Duration::hours(1)).to_rfc3339(),
        ],
    );
    assert!(status.contains("100.00 % of the fleet"), "{status}");
    let srv = Server::start(&p("site"));
    let url = format!("{}stable/", srv.url);

    // What a node with seed 5 running generation 1 gets, before and after the wave's start.
    let root = chan.join("root.json").display().to_string();
    let resolve = |at: DateTime<Utc>| {
        let at = at.to_rfc3339();
        let a = [
            "release", "resolve", &url, "--root", &root, "--seed", "5", "--at", &at,
        ];
        ok(None, None, &a).0
    };
    let out = resolve(Utc::now());
    assert!(
        out.starts_with("rollout: seed 5; v3 waits: this node's wave starts at"),
        "{out}"
    );
    assert!(out.contains("\nv2 ("), "{out}");
    let out = resolve(start + Duration::hours(1));
    assert!(out.contains("\nv3 (") && !out.contains("waits"), "{out}");

    let n = p("node");
    let cfg = cli_support::write_node(
        &n,
        1,
        &trust,
        &format!("channel_root = \"{}/root.json\"\n", n.display()),
    );
    fs::copy(chan.join("root.json"), n.join("root.json")).unwrap();
    let seed_file = libupgrade::rollout::seed_path(&n.join("state"));
    let node = |now: Option<DateTime<Utc>>, args: &[&str]| ok(Some(&cfg), now, args);
    let later = Some(start + Duration::hours(1));

    // Before the wave: `latest` is v2 and names v3's start; a plan draws no seed.
    let (_, err) = node(None, &["upgrade", "--plan-only", "--channel", &url]);
    assert!(err.contains("resolves to v2"), "{err}");
    let wait = format!("v3 waits: this node's wave starts at {start}");
    assert!(err.contains(&wait), "{err}");
    assert!(!seed_file.exists(), "--plan-only created the seed file");
    let (out, _) = node(None, &["slot", "status"]);
    assert!(out.contains("rollout seed: none yet"), "{out}");
    // An explicit withheld version is refused without the flag, staged with it.
    let out = run(
        Some(&cfg),
        None,
        &[
            "upgrade",
            "--stage-only",
            "--channel",
            &url,
            "--version",
            "v3",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("release v3 is not offered to this node")
            && err.contains(&format!("wave starts at {start}"))
            && err.contains("--ignore-rollout"),
        "{err}"
    );
    let (out, _) = node(
        None,
        &[
            "upgrade",
            "--stage-only",
            "--channel",
            &url,
            "--version",
            "v3",
            "--ignore-rollout",
        ],
    );
    assert!(out.contains("staged v3"), "{out}");
    assert!(
        seed_file.exists(),
        "a staging resolution keeps the node's seed"
    );
    let (out, _) = node(None, &["slot", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["seed"].as_u64().is_some(), "{out}");

    // A node running generation 2 has nothing newer before the wave, and takes v3 after.
    let n2 = p("node2");
    let cfg2 = cli_support::write_node(
        &n2,
        2,
        &trust,
        &format!("channel_root = \"{}/root.json\"\n", n2.display()),
    );
    fs::copy(chan.join("root.json"), n2.join("root.json")).unwrap();
    let (out, _) = ok(
        Some(&cfg2),
        None,
        &["upgrade", "--stage-only", "--channel", &url],
    );
    assert!(
        out.contains("nothing to stage") && out.contains(&wait),
        "{out}"
    );
    let (out, _) = ok(
        Some(&cfg2),
        later,
        &["upgrade", "--stage-only", "--channel", &url],
    );
    assert!(out.contains("staged v3"), "{out}");

    // Withdrawn: the staged v3 is replaced by the newest release still offered, v2.
    let out = publish(&["withdraw", &c, "v3"]);
    assert!(out.contains("withdrawn at"), "{out}");
    withdrawal_is_final(&cfg2, &n2, &url, later);
    let (out, err) = node(later, &["upgrade", "--stage-only", "--channel", &url]);
    assert!(out.contains("staged v2"), "{out}");
    assert!(err.contains("the staged v3 is withdrawn: dropped"), "{err}");

    // Pause holds a node that has not started v4; v5 requires v4 as a stop.
    create(&p("work"), &chan, &keys.join("release.key"), "v4", 4);
    create(&p("work"), &chan, &keys.join("release.key"), "v5", 5);
    relist();
    let now_s = Utc::now().trunc_subsecs(0).to_rfc3339();
    publish(&["rollout", &c, "v4", "--waves", "100%@+0", "--start", &now_s]);
    publish(&[
        "rollout",
        &c,
        "v5",
        "--waves",
        "100%@+0",
        "--start",
        &now_s,
        "--from-at-least",
        "v4",
    ]);
    publish(&["pause", &c, "v4"]);
    let (_, err) = node(later, &["upgrade", "--plan-only", "--channel", &url]);
    assert!(err.contains("resolves to v2"), "{err}");
    assert!(
        err.contains("v5 waits: required stop \"v4\" is held: the rollout is paused since"),
        "{err}"
    );
    // Resumed: the node walks through v4 first, then v5.
    publish(&["resume", &c, "v4"]);
    let (out, err) = node(later, &["upgrade", "--stage-only", "--channel", &url]);
    assert!(out.contains("staged v4"), "{out}");
    assert!(err.contains("a required stop on the way to v5"), "{err}");
    let (out, _) = node(later, &["slot", "status"]);
    assert!(out.contains("rollout seed: "), "{out}");
}
