//! A release that failed on a node is not retried by itself, through the binary: a node (a
//! temp dir with the k3OS layout, running v1) stages v2 from a channel with signed metadata,
//! tries it, fails its health check and rolls back. Then a plain `upgrade` stages nothing and
//! says why (exit 0), `--converge` refuses (exit 1), `slot status` shows it held back; the
//! publisher's `release rollout --retries 1` lets it try once more after the backoff (the
//! node's clock moved by `K3OS_OPS_TEST_NOW`), and a newer release proceeds as usual.
//!
//! The node reports to a real `collector serve` all along: each hold goes home once, as a wait
//! for a retry (report format 2), and `rollout-status --reports` and the dashboard's HTML show
//! the failure "not retried", then "waiting (retry after …)", until the retry stages it again.

use crate::release_args::release_create;
use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use chrono::{DateTime, Duration, SubsecRound, Utc};
use release_support::Server;

use super::fleet_reports::{free_port, stored, Collector};
use super::rollout_cli::run;

/// What it printed on stdout and stderr, asserting it exited with `code`.
fn exits(code: i32, config: Option<&Path>, now: Option<DateTime<Utc>>, args: &[&str]) -> String {
    let out = run(config, now, args);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(code), "k3os-ops {args:?}:\n{said}");
    said
}

fn create(work: &Path, chan: &Path, key: &Path, version: &str, generation: u64) {
    let (sq, k, i) = release_support::squashfs_inputs(work, version);
    let args = release_create((&sq, &k, &i), chan, key, version, generation);
    exits(
        0,
        None,
        None,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

/// The page at `url` (`http://HOST:PORT/PATH`), by a plain HTTP/1.0 GET.
fn get(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut c = std::net::TcpStream::connect(host).unwrap();
    write!(c, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut page = String::new();
    c.read_to_string(&mut page).unwrap();
    page
}

/// The outcomes of the reports stored about v2, in the order the store reads them back.
fn v2_reports(db: &Path) -> Vec<fleet_report::Outcome> {
    stored(db)
        .into_iter()
        .filter(|r| r.version == "v2")
        .map(|r| r.outcome)
        .collect()
}

/// The node `n` boots slot `slot` in boot `boot_id` (what a reboot changes for it).
fn boot(n: &Path, slot: &str, boot_id: &str) {
    fs::write(n.join("cmdline"), format!("ro k3os.slot={slot}\n")).unwrap();
    fs::write(n.join("boot_id"), format!("{boot_id}\n")).unwrap();
}

#[test]
fn a_release_that_failed_here_waits_for_retries_or_a_newer_release() {
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s);
    let s = |s: &str| p(s).display().to_string();
    let publisher = |a: &[&str]| {
        exits(0, None, None, a);
    };
    publisher(&["release", "keygen", "-o", &s("keys"), "--name", "release"]);
    let keys = p("keys");
    let meta = release_support::MetaKeys::generate(&keys, &publisher);
    let trust = p("trust.d");
    fs::create_dir_all(&trust).unwrap();
    fs::copy(keys.join("release.pub"), trust.join("release.pub")).unwrap();
    let chan = p("site/stable");
    fs::create_dir_all(&chan).unwrap();
    fs::create_dir_all(p("work")).unwrap();
    publisher(&["release", "index", &s("site/stable")]);
    for (v, g) in [("v1", 1), ("v2", 2)] {
        create(&p("work"), &chan, &keys.join("release.key"), v, g);
    }
    meta.init_channel(&chan, &publisher);
    let srv = Server::start(&p("site"));
    let url = format!("{}stable/", srv.url);

    let n = p("node");
    let port = free_port();
    let cfg = cli_support::write_node(
        &n,
        1,
        &trust,
        &format!(
            "channel_root = \"{}/root.json\"\nreport_url = \"http://127.0.0.1:{port}/v1/reports\"\nreport_site = \"site-1\"\n",
            n.display()
        ),
    );
    fs::copy(chan.join("root.json"), n.join("root.json")).unwrap();
    let node =
        |code: i32, now: Option<DateTime<Utc>>, args: &[&str]| exits(code, Some(&cfg), now, args);
    let upgrade = ["upgrade", "--stage-only", "--channel", url.as_str()];
    // The collector, with the node enrolled, and its dashboard.
    let said = node(0, None, &["slot", "status"]);
    let id = said
        .lines()
        .find_map(|l| l.strip_prefix("node id: "))
        .unwrap_or_else(|| panic!("no node id: {said}"))[..64]
        .to_string();
    let (db, allow) = (p("reports.db"), p("allow"));
    fs::write(&allow, format!("{id} site-1\n")).unwrap();
    let (_collector, more) = Collector::start_with(
        port,
        &db,
        &allow,
        &[
            "--dashboard",
            "127.0.0.1:0",
            "--channel",
            chan.to_str().unwrap(),
        ],
    );
    let dashboard = more[0].strip_prefix("dashboard at ").unwrap().to_string();
    let dbarg = format!("sqlite:{}", db.display());
    let status = || {
        let said = exits(
            0,
            None,
            None,
            &[
                "release",
                "rollout-status",
                chan.to_str().unwrap(),
                "--reports",
                &dbarg,
            ],
        );
        let page = get(&dashboard);
        (said, page)
    };
    let retry_wait = |until| fleet_report::Outcome::Waiting {
        wait_for: fleet_report::WaitFor::Retry,
        until,
    };

    // v2 is staged, tried, fails its health check and is rolled back from.
    assert!(node(0, None, &upgrade).contains("staged v2"));
    node(0, None, &["slot", "activate"]);
    let check = n.join("health.d/50-app");
    fs::write(&check, "#!/bin/sh\necho app is down\nexit 1\n").unwrap();
    fs::set_permissions(&check, fs::Permissions::from_mode(0o755)).unwrap();
    boot(&n, "B", "boot-2");
    let said = node(1, None, &["slot", "confirm"]);
    assert!(said.contains("50-app"), "{said}");
    fs::remove_file(&check).unwrap();
    boot(&n, "A", "boot-3");
    node(0, None, &["slot", "confirm"]);
    let failed_at = Utc::now();

    // A plain upgrade stages nothing, says why, exits 0 and leaves the slots as they were.
    let slots = testkit::tree_bytes(&n.join("system"));
    let said = node(0, None, &upgrade);
    assert!(
        said.contains(
            "nothing to stage: failed here: v2 (generation 2) failed 1 time(s) on this node"
        ) && said.contains("app is down")
            && said.contains("until a newer release is published or its rollout allows retries"),
        "{said}"
    );
    assert!(!said.contains("staged v2"), "{said}");
    testkit::assert_same_tree("slots", &slots, &testkit::tree_bytes(&n.join("system")));
    // It reported the hold: held for good, as a wait for a retry with no time.
    let reports = v2_reports(&db);
    assert_eq!(reports.last(), Some(&retry_wait(None)), "{reports:?}");
    let (said, page) = status();
    assert!(
        said.contains("failed, waiting (retry) 1") && said.contains("then not retried"),
        "{said}"
    );
    assert!(page.contains("<td>rolled back, not retried</td>"), "{page}");
    // --converge keeps refusing it (exit 1), naming why once.
    let said = node(1, None, &["upgrade", "--converge", "--channel", &url]);
    assert_eq!(said.matches("failed here: v2").count(), 1, "{said}");
    // However often it polls, one report of the same hold.
    node(0, None, &upgrade);
    assert_eq!(
        v2_reports(&db).len(),
        reports.len(),
        "{:?}",
        v2_reports(&db)
    );
    // slot status says it is held back and why, in both views.
    let said = node(0, None, &["slot", "status"]);
    assert!(
        said.contains("held back: failed here: v2 (generation 2)"),
        "{said}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&node(0, None, &["slot", "status", "--json"])).unwrap();
    assert_eq!(v["failed"][0]["version"], "v2", "{v}");
    assert_eq!(v["failed"][0]["attempts"], 1, "{v}");
    assert_eq!(v["held_back"][0]["version"], "v2", "{v}");
    assert!(v["held_back"][0]["until"].is_null(), "{v}");

    // The publisher allows one retry, an hour after the failure.
    let sign = meta.signing();
    let start = (Utc::now() - Duration::hours(1))
        .trunc_subsecs(0)
        .to_rfc3339();
    let mut a = vec!["release", "rollout", chan.to_str().unwrap(), "v2"];
    a.extend(["--waves", "100%@+0", "--start", &start]);
    a.extend(["--retries", "1", "--retry-backoff", "1h"]);
    a.extend(sign.iter().map(String::as_str));
    let said = exits(0, None, None, &a);
    assert!(
        said.contains("retries it 1 time(s), 3600 s after the failure"),
        "{said}"
    );
    // Within the hour: it waits, saying until when.
    let said = node(0, None, &upgrade);
    assert!(
        said.contains("nothing to stage: failed here: v2") && said.contains("retry 1 of 1"),
        "{said}"
    );
    let until = (failed_at + Duration::hours(1)).trunc_subsecs(0);
    let named = said
        .split("not before ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| DateTime::parse_from_rfc3339(r).ok())
        .unwrap_or_else(|| panic!("no time named: {said}"));
    assert!(
        (named.with_timezone(&Utc) - until).num_seconds().abs() <= 5,
        "{named} vs {until}"
    );
    // Reported once more, now with the time the retry is allowed, which the views show.
    let named = named.with_timezone(&Utc);
    let reports = v2_reports(&db);
    assert_eq!(
        reports.last(),
        Some(&retry_wait(Some(named.timestamp() as u64))),
        "{reports:?}"
    );
    let shown = format!(
        "waiting (retry after {})",
        named.format("%Y-%m-%dT%H:%M:%SZ")
    );
    let (said, page) = status();
    // rollout-status: under the failed attempt's bundle, what the node did since.
    assert!(said.contains(&format!("then {shown}")), "{shown}\n{said}");
    assert!(
        page.contains(&format!("<td>rolled back, {shown}</td>")),
        "{shown}\n{page}"
    );
    // After the backoff: it tries once more.
    let later = Some(Utc::now() + Duration::hours(2));
    assert!(node(0, later, &upgrade).contains("staged v2"));
    // The retry is a later attempt: the failure no longer counts.
    let (said, _) = status();
    assert!(said.contains("offered: staged 1"), "{said}");
    assert!(!said.contains("waiting (retry"), "{said}");

    // v3 published: a newer release proceeds as usual, whatever failed before.
    create(&p("work"), &chan, &keys.join("release.key"), "v3", 3);
    meta.relist(&chan, &publisher);
    let said = node(0, None, &upgrade);
    assert!(said.contains("staged v3"), "{said}");
}
