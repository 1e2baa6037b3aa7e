//! Sites report back (issue 32), end to end through the binary: a node (the k3OS dir layout of
//! `cli_support::write_node`, running v1) with a `report_url` stages v2 from a real `release
//! serve` channel and its signed report reaches a real `collector serve` on SQLite; with the
//! collector down, the trial boot's report is spooled on the node's state partition and sent
//! by the next command once the collector is back; the trial boot's bless follows. A node of a
//! site the collector does not enrol is refused and keeps its reports; a refused report never
//! holds newer ones back.

use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use cli_support::Node;
use fleet_report::Outcome;
use release_support::Server;

/// `k3os-ops collector serve` on `port` over `db`, killed on drop.
pub(crate) struct Collector(Child);

impl Collector {
    pub(crate) fn start(port: u16, db: &Path, allow: &Path) -> Collector {
        Self::start_with(port, db, allow, &[]).0
    }

    /// With `extra` arguments; the collector and the stdout lines after the first.
    pub(crate) fn start_with(
        port: u16,
        db: &Path,
        allow: &Path,
        extra: &[&str],
    ) -> (Collector, Vec<String>) {
        let mut child = Command::new(release_support::bin())
            .args(["collector", "serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(format!("sqlite:{}", db.display()))
            .arg("--allow")
            .arg(allow)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn k3os-ops collector serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(&format!(
                "collecting reports at http://127.0.0.1:{port}/v1/reports"
            )),
            "{line:?}"
        );
        let mut more = Vec::new();
        if extra.contains(&"--dashboard") {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            more.push(l.trim().to_string());
        }
        (Collector(child), more)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node running v1 (generation 5) that reports to `port` as `site`.
fn reporting_node(port: u16, site: &str) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (_, trust) = release_support::keys(dir.path(), "node");
    let extra =
        format!("report_url = \"http://127.0.0.1:{port}/v1/reports\"\nreport_site = \"{site}\"\n");
    let config = cli_support::write_node(dir.path(), 5, &trust, &extra);
    Node { dir, config }
}

/// The node id `slot status` shows.
pub(crate) fn node_id(node: &Node) -> String {
    let out = node.ok(&["slot", "status"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("node id: "))
        .unwrap_or_else(|| panic!("no node id in:\n{out}"));
    line["node id: ".len()..][..64].to_string()
}

/// A channel served by `release serve` holding v2 (generation 6) signed by the node's key.
fn channel(node: &Node) -> (Server, PathBuf) {
    let chan = node.path().join("site/stable");
    std::fs::create_dir_all(&chan).unwrap();
    let inputs = release_support::squashfs_inputs(node.path(), "v2");
    release_support::create(
        &inputs,
        &node.path().join("keys/node.key"),
        &chan.join("v2"),
        "v2",
        libupgrade::manifest::Arch::host(),
        Some(6),
    );
    node.ok(&["release", "index", chan.to_str().unwrap()]);
    (Server::start(&chan), chan)
}

/// One site of the fleet: a node of `site` reporting to a collector on a free `port`, the
/// collector's database and allow-list (the node enrolled for its site, or nobody), and a
/// channel served by `release serve` holding v2.
pub(crate) struct Site {
    pub(crate) port: u16,
    pub(crate) node: Node,
    pub(crate) db: PathBuf,
    pub(crate) allow: PathBuf,
    pub(crate) srv: Server,
    pub(crate) chan: PathBuf,
    pub(crate) work: tempfile::TempDir,
}

impl Site {
    /// `site`'s node, enrolled when `enrolled` (else the allow-list names nobody).
    fn new(site: &str, enrolled: bool) -> Site {
        Site::prepared(site, enrolled, |_| {})
    }

    /// The same, with `prepare` run on the node before anything reads it (its id is made at
    /// first use): e.g. a v0.1.0 state file.
    pub(crate) fn prepared(site: &str, enrolled: bool, prepare: impl FnOnce(&Node)) -> Site {
        let port = free_port();
        let node = reporting_node(port, site);
        prepare(&node);
        let work = tempfile::tempdir().unwrap();
        let (db, allow) = (work.path().join("reports.db"), work.path().join("allow"));
        let entry = if enrolled {
            format!("{} {site}\n", node_id(&node))
        } else {
            "# nobody yet\n".to_string()
        };
        std::fs::write(&allow, entry).unwrap();
        let (srv, chan) = channel(&node);
        Site {
            port,
            node,
            db,
            allow,
            srv,
            chan,
            work,
        }
    }
}

pub(crate) fn stored(db: &Path) -> Vec<collector::Row> {
    use collector::Store;
    collector::SqliteStore::open(db).unwrap().rows().unwrap()
}

fn spooled(node: &Node) -> usize {
    let dir = libupgrade::spool_dir(&node.path().join("state"));
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".report"))
            })
            .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_node_reports_staged_then_spools_through_an_outage_then_reports_the_bless() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan: _chan,
        work: _work,
    } = Site::new("site-1", true);
    let id = node_id(&node);

    // Staged, reported at the end of `upgrade`.
    let collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    let rows = stored(&db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!((r.node.as_str(), r.site.as_str()), (id.as_str(), "site-1"));
    assert_eq!((r.version.as_str(), r.generation), ("v2", 6));
    assert_eq!(r.channel, srv.url);
    match r.outcome {
        Outcome::Staged { bytes, .. } => assert!(bytes > 0, "{r:?}"),
        ref o => panic!("expected staged, got {o:?}"),
    }
    assert_eq!(spooled(&node), 0);

    // The link is down: the activation succeeds and its report waits in the spool.
    drop(collector);
    let t = std::time::Instant::now();
    node.ok(&["slot", "activate"]);
    assert!(
        t.elapsed().as_secs() < 10,
        "reporting delayed the command: {:?}",
        t.elapsed()
    );
    assert_eq!(spooled(&node), 1);
    assert_eq!(stored(&db).len(), 1);

    // Back up: the next command sends the spool.
    let _collector = Collector::start(port, &db, &allow);
    let status = node.ok(&["slot", "status"]);
    assert!(status.contains("site site-1"), "{status}");
    assert_eq!(spooled(&node), 0);
    // The trial boot of slot B passes its checks: blessed, reported by `slot confirm`.
    cli_support_boot_b(&node);
    node.ok(&["slot", "confirm"]);
    let rows = stored(&db);
    let kinds: Vec<&str> = rows.iter().map(|r| r.outcome.kind()).collect();
    assert_eq!(kinds, vec!["staged", "trial_boot", "blessed"]);
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq), "{rows:?}");
    // Nothing new happens: nothing new is reported.
    node.ok(&["slot", "confirm"]);
    node.ok(&["slot", "status"]);
    assert_eq!(stored(&db).len(), 3, "{:?}", stored(&db));
}

/// Pretend the node rebooted into slot B.
pub(crate) fn cli_support_boot_b(node: &Node) {
    std::fs::write(
        node.path().join("cmdline"),
        "root=/dev/vda5 ro k3os.slot=B\n",
    )
    .unwrap();
    std::fs::write(node.path().join("boot_id"), "boot-2\n").unwrap();
    std::fs::write(
        node.path().join("k3os-release"),
        "VERSION=v2\nGENERATION=6\n",
    )
    .unwrap();
}

#[test]
fn a_node_the_collector_does_not_enrol_is_refused_and_keeps_its_reports() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan: _chan,
        work: _work,
    } = Site::new("site-9", false);
    let _collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    assert_eq!(stored(&db).len(), 0);
    assert_eq!(
        spooled(&node),
        1,
        "403 is kept: the node may be enrolled later"
    );
}

/// Replace the node's `report_site` with `site` (what an operator's fix of the config does).
fn set_site(node: &Node, site: &str) {
    let cfg = std::fs::read_to_string(&node.config).unwrap();
    let line = cfg
        .lines()
        .find(|l| l.starts_with("report_site"))
        .unwrap()
        .to_string();
    let fixed = cfg.replace(&line, &format!("report_site = \"{site}\""));
    std::fs::write(&node.config, fixed).unwrap();
}

/// The `reports:` lines of `slot status`.
fn refusal_lines(node: &Node) -> Vec<String> {
    let lines: Vec<String> = node
        .ok(&["slot", "status"])
        .lines()
        .filter(|l| l.starts_with("reports: "))
        .map(str::to_string)
        .collect();
    eprintln!("slot status: {lines:?}");
    lines
}

/// A node enrolled for `site-1` but configured with a wrong site: its first report (staged) is
/// refused with 403 and set aside, and the commands after it do not resend it ahead of the
/// newer ones. Once the site is corrected, the trial boot's report goes through at the next
/// command; the refused one, which the collector can no longer take, is dropped, counted in
/// the next report, and `slot status` says so.
#[test]
fn a_refused_report_never_holds_back_newer_ones_and_ends_dropped_and_counted() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan: _chan,
        work: _work,
    } = Site::new("site-1", true);
    set_site(&node, "site-typo");
    let _collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    assert_eq!(stored(&db).len(), 0);
    assert_eq!(spooled(&node), 1, "the refused report is kept aside");
    let lines = refusal_lines(&node);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("reports: 1 refused by the collector (403 Forbidden: ")
            && lines[0].contains("set aside after 1 try of 3"),
        "{lines:?}"
    );

    set_site(&node, "site-1");
    node.ok(&["slot", "activate"]);
    let rows = stored(&db);
    let kinds: Vec<&str> = rows.iter().map(|r| r.outcome.kind()).collect();
    assert_eq!(kinds, ["trial_boot"], "the newer report went through");
    assert_eq!(spooled(&node), 0, "the refused one is gone");
    let lines = refusal_lines(&node);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("reports: 1 refused by the collector (403 Forbidden: ")
            && lines[0].ends_with(
                "dropped after 1 try: a newer report was stored, and the collector takes no older number"
            ),
        "{lines:?}"
    );
    cli_support_boot_b(&node);
    node.ok(&["slot", "confirm"]);
    let rows = stored(&db);
    let last = rows.last().unwrap();
    assert_eq!(
        (last.outcome.kind(), last.dropped),
        ("blessed", 1),
        "{rows:?}"
    );
}

/// The channel's first signed metadata, with fresh metadata keys; returns the publisher's
/// re-signing commands (`release ARGS…` signed with those keys).
fn sign_channel<'a>(node: &'a Node, chan: &Path) -> impl Fn(&[&str]) -> String + 'a {
    let run = |a: &[&str]| {
        node.ok(a);
    };
    let keys = release_support::MetaKeys::generate(&node.path().join("meta-keys"), &run);
    keys.init_channel(chan, &run);
    let signing = keys.signing();
    move |args: &[&str]| {
        let mut a: Vec<&str> = vec!["release"];
        a.extend_from_slice(args);
        a.extend(signing.iter().map(String::as_str));
        node.ok(&a)
    }
}

/// The node trusts the channel's root: it resolves through the rollouts and reports its seed.
fn trust_root(node: &Node, chan: &Path) {
    std::fs::copy(chan.join("1.root.json"), node.path().join("root.json")).unwrap();
    let cfg = std::fs::read_to_string(&node.config).unwrap();
    let root = format!(
        "channel_root = \"{}\"\n",
        node.path().join("root.json").display()
    );
    std::fs::write(&node.config, format!("{root}{cfg}")).unwrap();
}

/// A guard key made and delegated the channel `c`'s halt role (`publish` as [`sign_channel`]);
/// returns the folder holding `halt.key` and `halt.pub`.
fn delegate_guard(node: &Node, publish: &impl Fn(&[&str]) -> String, c: &str) -> PathBuf {
    let gk = node.path().join("guard-keys");
    node.ok(&[
        "release",
        "keygen",
        "-o",
        gk.to_str().unwrap(),
        "--name",
        "halt",
    ]);
    publish(&[
        "delegate-halt",
        c,
        "--halt-key",
        gk.join("halt.pub").to_str().unwrap(),
    ]);
    gk
}

/// The channel signed, v2 rolling out in one wave to the whole fleet since an hour ago (the
/// node is in wave 1), and the node trusting the channel's root; returns the channel's path
/// and the publisher's commands (as [`sign_channel`]).
fn one_wave_started<'a>(node: &'a Node, chan: &Path) -> (String, impl Fn(&[&str]) -> String + 'a) {
    let publish = sign_channel(node, chan);
    let c = chan.display().to_string();
    let start = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    publish(&["rollout", &c, "v2", "--waves", "100%@+0", "--start", &start]);
    trust_root(node, chan);
    (c, publish)
}

#[test]
fn rollout_status_shows_what_the_sites_reported_per_release_and_wave() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan,
        work: _work,
    } = Site::new("site-1", true);
    let (c, _publish) = one_wave_started(&node, &chan);
    let _collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    let rows = stored(&db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].seed.is_some(), "{rows:?}");

    let dbarg = format!("sqlite:{}", db.display());
    let out = node.ok(&["release", "rollout-status", &c, "--reports", &dbarg]);
    eprintln!("{out}");
    assert!(out.contains("100.00 % of the fleet"), "{out}");
    assert!(
        out.contains("1 node(s) at 1 site(s), 1 report(s), 0 dropped unsent"),
        "{out}"
    );
    assert!(out.contains("v2 (generation 6)"), "{out}");
    assert!(
        out.contains("wave 1: 1 node(s), 1 offered: staged 1"),
        "{out}"
    );
    let json: serde_json::Value = serde_json::from_str(&node.ok(&[
        "release",
        "rollout-status",
        &c,
        "--reports",
        &dbarg,
        "--json",
    ]))
    .unwrap();
    assert_eq!(json["planned"][0]["version"], "v2");
    assert_eq!(json["planned"][0]["share_percent"], 100.0);
    let wave = &json["reports"]["releases"][0]["waves"][0];
    assert_eq!(wave["wave"], 1);
    assert_eq!(wave["states"]["staged"], 1);
    assert_eq!(wave["offered"], 1);
    // Without --reports: the planned share only, as before.
    let plain = node.ok(&["release", "rollout-status", &c]);
    assert!(!plain.contains("reported"), "{plain}");
}

#[test]
fn abort_criteria_name_the_release_to_halt_and_need_the_reports() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan,
        work: _work,
    } = Site::new("site-1", true);
    let _publish = sign_channel(&node, &chan);
    let c = chan.display().to_string();
    let _collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    node.ok(&["slot", "activate"]);
    // The trial boot's health check fails: rolled back, reported by `slot confirm`.
    cli_support_boot_b(&node);
    let check = node.path().join("health.d/fails");
    std::fs::write(&check, "#!/bin/sh\necho disk on fire\nexit 1\n").unwrap();
    let mut perm = std::fs::metadata(&check).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&check, perm).unwrap();
    let _ = node.ops(&["slot", "confirm"]);
    let rows = stored(&db);
    let kinds: Vec<&str> = rows.iter().map(|r| r.outcome.kind()).collect();
    assert_eq!(kinds, ["staged", "trial_boot", "rolled_back"]);
    assert!(
        rows[2].outcome.why().unwrap().contains("disk on fire"),
        "{rows:?}"
    );

    let dbarg = format!("sqlite:{}", db.display());
    let status = |extra: &[&str]| {
        let mut a = vec!["release", "rollout-status", &c, "--reports", &dbarg];
        a.extend_from_slice(extra);
        node.ok(&a)
    };
    let out = status(&["--abort-if", "50", "--abort-min", "1"]);
    assert!(
        out.contains("abort criteria met for v2: 1 of 1 node(s) failed (100.00 %): `k3os-ops collector guard` halts it with the same criteria, or pause it with `k3os-ops release pause"),
        "{out}"
    );
    assert!(out.contains("1 × rolled_back: "), "{out}");
    let out = status(&["--abort-if", "50", "--abort-min", "5"]);
    assert!(out.contains("v2 not judged yet: 1 node(s) ran it"), "{out}");
    let out = status(&[
        "--abort-if",
        "50",
        "--abort-min",
        "1",
        "--abort-on",
        "stage_failed",
    ]);
    assert!(
        out.contains("abort criteria not met for v2: 0 of 1"),
        "{out}"
    );
    let e = node.fails(&["release", "rollout-status", &c, "--abort-if", "50"]);
    assert!(e.contains("--abort-if needs --reports"), "{e}");
    let e = node.fails(&[
        "release",
        "rollout-status",
        &c,
        "--reports",
        &dbarg,
        "--abort-if",
        "50",
        "--abort-on",
        "exploded",
    ]);
    assert!(e.contains("--abort-on \"exploded\""), "{e}");
}

/// The page as headless Chromium renders it (`--dump-dom`: the DOM after the page loaded).
fn in_chromium(url: &str) -> String {
    k3os_ops_testing::browser::dump_dom(url)
}

/// What the store's reports say of v2, counted here on the rows themselves: nodes that sent
/// anything but a wait (offered), that ever staged it, and whose newest report that is not a
/// wait is a bless or a failure.
fn store_counts(db: &Path) -> [(&'static str, usize); 4] {
    let rows = stored(db);
    let mut nodes: Vec<&str> = rows.iter().map(|r| r.node.as_str()).collect();
    nodes.dedup();
    let last_kind = |n: &str| {
        rows.iter()
            .filter(|r| r.node == n && r.outcome.kind() != "waiting")
            .max_by_key(|r| r.seq)
            .map(|r| r.outcome.kind())
    };
    let count = |f: &dyn Fn(&str) -> bool| nodes.iter().filter(|n| f(n)).count();
    [
        ("offered", count(&|n| last_kind(n).is_some())),
        (
            "staged",
            count(&|n| {
                rows.iter()
                    .any(|r| r.node == n && r.outcome.kind() == "staged")
            }),
        ),
        ("blessed", count(&|n| last_kind(n) == Some("blessed"))),
        (
            "failed",
            count(&|n| {
                matches!(
                    last_kind(n),
                    Some("stage_failed" | "rolled_back" | "fell_back")
                )
            }),
        ),
    ]
}

/// Whether `s` starts with an RFC 3339 UTC time, `2026-12-07T04:12:00Z`.
fn is_utc_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[..20].iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[test]
fn the_dashboard_shows_in_a_real_browser_what_the_database_holds() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan,
        work: _work,
    } = Site::new("site-1", true);
    let (c, publish) = one_wave_started(&node, &chan);
    let (_collector, more) = Collector::start_with(
        port,
        &db,
        &allow,
        &["--dashboard", "127.0.0.1:0", "--channel", &c],
    );
    let url = more[0].strip_prefix("dashboard at ").unwrap().to_string();
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    node.ok(&["slot", "activate"]);
    cli_support_boot_b(&node);
    let check = node.path().join("health.d/fails");
    std::fs::write(&check, "#!/bin/sh\necho 'disk <on> fire'\nexit 1\n").unwrap();
    let mut perm = std::fs::metadata(&check).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&check, perm).unwrap();
    let _ = node.ops(&["slot", "confirm"]);
    publish(&["pause", &c, "v2"]);
    assert_eq!(stored(&db).len(), 3);
    // The guard's key delegated, and one guard run: its halt is in the guard's table.
    let gk = delegate_guard(&node, &publish, &c);
    let dbarg = format!("sqlite:{}", db.display());
    node.ok(&[
        "collector",
        "guard",
        "--channel",
        &c,
        "--db",
        &dbarg,
        "--key",
        gk.join("halt.key").to_str().unwrap(),
        "--abort-if",
        "50",
        "--abort-min",
        "1",
    ]);

    let dom = in_chromium(&url);
    let guard = dom
        .split("<tr class=\"halt\">")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("no halt in the guard's table: {dom}"));
    assert!(
        guard.contains("<td>halt</td><td>v2</td><td>1 of 1 node(s) failed")
            && guard.ends_with("<td>1</td>"),
        "{guard}"
    );
    assert!(
        dom.contains("1 node(s) at 1 site(s) of 1 enrolled, 3 report(s)"),
        "{dom}"
    );
    assert!(dom.contains("v2 (generation 6)"), "{dom}");
    // Per wave: the one node, rolled back, in wave 1.
    let row = dom
        .split("<tr data-wave=\"1\">")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("no wave 1 row in {dom}"));
    let cells: Vec<&str> = row
        .split("<td>")
        .skip(1)
        .map(|c| c.trim_end_matches("</td>"))
        .collect();
    // wave, nodes, offered, waiting, staged, trial_boot, blessed, stage_failed, rolled_back, …
    assert_eq!(
        &cells[..9],
        ["1", "1", "1", "0", "0", "0", "0", "0", "1"],
        "{row}"
    );
    // The failing site with its reason, escaped.
    assert!(dom.contains("<td>site-1</td>"), "{dom}");
    assert!(dom.contains("disk &lt;on&gt; fire"), "{dom}");
    // The chart: one node staged and one failed, against the planned line.
    assert!(dom.contains("class=\"staged\" data-last=\"1\""), "{dom}");
    assert!(dom.contains("class=\"failed\" data-last=\"1\""), "{dom}");
    assert!(dom.contains("class=\"planned\" data-last=\"1\""), "{dom}");
    // The pause and the command that lifts it.
    assert!(dom.contains("paused since"), "{dom}");
    assert!(
        dom.contains(&format!("k3os-ops release resume {c} v2")),
        "{dom}"
    );
    // A publisher reads it at a glance: axes with labelled ticks, a legend whose numbers are
    // the store's, the pause and the guard's halt marked, times as UTC dates.
    assert!(dom.contains(">time (UTC)</text>"), "{dom}");
    assert!(dom.contains(">share of 1 enrolled node(s)</text>"), "{dom}");
    assert!(dom.matches("class=\"x-tick\"").count() >= 2, "{dom}");
    assert!(dom.matches("class=\"y-tick\"").count() >= 5, "{dom}");
    assert!(dom.contains(">100 %</text>"), "{dom}");
    assert!(
        dom.contains("<li class=\"planned\" data-count=\"1\""),
        "{dom}"
    );
    for (line, n) in store_counts(&db) {
        assert!(
            dom.contains(&format!("<li class=\"{line}\" data-count=\"{n}\"")),
            "legend {line} should show the store's {n}: {dom}"
        );
    }
    assert!(dom.contains("class=\"mark pause\""), "{dom}");
    assert!(dom.contains("class=\"mark halt\""), "{dom}");
    let at = guard.trim_start_matches("<td>");
    assert!(
        is_utc_time(at),
        "the guard's time is not a UTC date: {guard}"
    );
    let failing = dom.split("<table class=\"failing\">").nth(1).unwrap();
    let when = failing.split("<td>").nth(5).unwrap();
    assert!(is_utc_time(when), "{failing}");
    assert!(!dom.contains("<script"), "{dom}");
    // How it looks: a screenshot (to $DASHBOARD_PNG when set, to look at).
    let png = match std::env::var_os("DASHBOARD_PNG") {
        Some(p) => PathBuf::from(p),
        None => node.path().join("dashboard.png"),
    };
    k3os_ops_testing::browser::screenshot(&url, &png, 1000, 1150);
}

/// The state file v0.1.0 wrote (libupgrade's fixture: slot A v1 good, slot B v2 good).
pub(crate) fn v010_state(node: &Node) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../libupgrade/tests/fixtures/v0.1.0/state.json");
    std::fs::copy(fixture, node.path().join("state/state.json")).unwrap();
}

#[test]
fn a_node_made_by_v010_reports_from_its_first_outcome_and_one_without_report_url_writes_nothing_new(
) {
    // Without report keys: stage, trial, bless; no key, no spool.
    let quiet = Node::new();
    v010_state(&quiet);
    let (srv, _chan) = channel(&quiet);
    quiet.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    quiet.ok(&["slot", "activate"]);
    cli_support_boot_b(&quiet);
    quiet.ok(&["slot", "confirm"]);
    let state = quiet.path().join("state");
    assert!(!state.join(libupgrade::NODE_KEY_FILE).exists());
    assert!(!state.join("report-spool").exists());

    // With them, from a v0.1.0 state file: the first outcome is reported.
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan: _chan,
        work: _work,
    } = Site::prepared("site-1", true, v010_state);
    let _collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    let rows = stored(&db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].outcome.kind(), "staged");
}

/// A health check that always fails, in the node's health dir.
pub(crate) fn failing_check(node: &Node) {
    let check = node.path().join("health.d/fails");
    std::fs::write(&check, "#!/bin/sh\necho disk on fire\nexit 1\n").unwrap();
    let mut perm = std::fs::metadata(&check).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&check, perm).unwrap();
}

/// What `release resolve --seed 0` says a node that runs nothing of the channel is offered
/// (Ok: the resolution's text; Err: the refusal).
fn offered(node: &Node, url: &str, chan: &Path) -> Result<String, String> {
    let root = chan.join("1.root.json").display().to_string();
    let args = ["release", "resolve", url, "--root", &root, "--seed", "0"];
    let out = node.ops(&args);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match out.status.success() {
        true => Ok(text(&out.stdout)),
        false => Err(text(&out.stderr)),
    }
}

/// Issue 32 item 4 end to end: the publisher delegates the halt role to the guard's key; a
/// release fails its health check at the site; `collector guard` signs a halt with that key
/// into the served channel and records it; a node resolving the channel holds as for a pause;
/// the guard does nothing more while it holds; the guard's key cannot sign for the publisher,
/// a top-level key cannot be the halt key, a forged halt or an old one replayed stops the
/// node (never widens); `release resume` lifts the halt, and the guard notes the lift instead
/// of halting again on the same reports.
#[test]
fn the_guard_halts_a_failing_release_with_its_stop_only_key_and_the_publisher_resumes() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan,
        work,
    } = Site::new("site-1", true);
    let (c, publish) = one_wave_started(&node, &chan);
    let keys = work.path().join("guard-keys");
    let kd = keys.display().to_string();
    node.ok(&["release", "keygen", "-o", &kd, "--name", "halt"]);
    let halt_pub = keys.join("halt.pub").display().to_string();
    let halt_key = keys.join("halt.key").display().to_string();
    // A top-level key cannot be the halt role's.
    let meta = |n: &str| node.path().join("meta-keys").join(n).display().to_string();
    let signing = [
        "--key",
        &meta("targets.key"),
        "--snapshot-key",
        &meta("snapshot.key"),
        "--timestamp-key",
        &meta("timestamp.key"),
    ];
    let mut a = vec!["release", "delegate-halt", &c, "--halt-key"];
    let targets_pub = meta("targets.pub");
    a.push(&targets_pub);
    a.extend_from_slice(&signing);
    let e = node.fails(&a);
    assert!(e.contains("is a targets key of root version 1"), "{e}");
    publish(&["delegate-halt", &c, "--halt-key", &halt_pub]);

    // The release fails at the site: staged, trial boot, rolled back.
    let _collector = Collector::start(port, &db, &allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &srv.url]);
    node.ok(&["slot", "activate"]);
    cli_support_boot_b(&node);
    failing_check(&node);
    let _ = node.ops(&["slot", "confirm"]);
    assert!(offered(&node, &srv.url, &chan).is_ok());

    let dbarg = format!("sqlite:{}", db.display());
    let guard = || {
        node.ok(&[
            "collector",
            "guard",
            "--channel",
            &c,
            "--db",
            &dbarg,
            "--key",
            &halt_key,
            "--abort-if",
            "50",
            "--abort-min",
            "1",
        ])
    };
    let out = guard();
    assert!(out.contains("v2: halted (1 of 1 node(s) failed"), "{out}");
    assert!(out.contains("wrote halt.json version 1"), "{out}");
    let halt_v1 = std::fs::read(chan.join("halt.json")).unwrap();
    python_tuf_verifies_the_halt(&chan);
    let held = offered(&node, &srv.url, &chan).unwrap_err();
    assert!(held.contains("paused since"), "{held}");
    let status = node.ok(&["release", "rollout-status", &c, "--reports", &dbarg]);
    assert!(status.contains("v2 halted by the guard since"), "{status}");
    assert!(
        status.contains(&format!("release resume {c} v2")),
        "{status}"
    );
    assert!(status.contains("guard: "), "{status}");
    // Held: the next run only re-signs; everything is recorded.
    let out = guard();
    assert!(
        out.contains("no release to halt: re-signed halt.json version 2"),
        "{out}"
    );
    let actions = {
        use collector::Store;
        collector::SqliteStore::open(&db)
            .unwrap()
            .actions()
            .unwrap()
    };
    let kinds: Vec<&str> = actions.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(kinds, ["halt", "refresh"], "{actions:?}");
    assert_eq!(actions[0].version, "v2");

    // The guard's key signs nothing for the publisher.
    let e = node.fails(&[
        "release",
        "pause",
        &c,
        "v2",
        "--key",
        &halt_key,
        "--snapshot-key",
        &halt_key,
        "--timestamp-key",
        &halt_key,
    ]);
    assert!(e.contains("0 valid signature(s) by targets keys"), "{e}");
    // A halt.json not signed by the halt key: refused, the node takes nothing from the channel.
    let good = std::fs::read(chan.join("halt.json")).unwrap();
    let forged = String::from_utf8(good.clone())
        .unwrap()
        .replace("\"sig\": \"", "\"sig\": \"00");
    std::fs::write(chan.join("halt.json"), forged).unwrap();
    let e = offered(&node, &srv.url, &chan).unwrap_err();
    assert!(
        e.contains("halt.json") && e.contains("valid signature(s) by the halt role's keys"),
        "{e}"
    );
    std::fs::write(chan.join("halt.json"), &good).unwrap();

    // The node polls (and records halt version 2); the publisher resumes.
    let _ = node.ops(&["upgrade", "--stage-only", "--channel", &srv.url]);
    let out = publish(&["resume", &c, "v2"]);
    assert!(out.contains("lifted the guard's halt of v2"), "{out}");
    assert!(offered(&node, &srv.url, &chan).is_ok());
    // The guard sees the lift and does not halt again on the same reports.
    let out = guard();
    assert!(
        out.contains("v2: the publisher lifted the guard's halt"),
        "{out}"
    );
    assert!(!out.contains("halted"), "{out}");
    assert!(offered(&node, &srv.url, &chan).is_ok());
    // The old halt replayed: a node that saw version 2 refuses version 1 (and takes nothing).
    std::fs::write(chan.join("halt.json"), &halt_v1).unwrap();
    let out = node.ops(&["upgrade", "--stage-only", "--channel", &srv.url]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("older than version"),
        "{e}"
    );
}

/// python-tuf 7 (scripts/setup.sh) reads the guard's `halt.json` as targets metadata and
/// verifies its signatures against the delegation in our `targets.json`
/// (`Targets.verify_delegate`): the halt role is a standard TUF delegated role.
fn python_tuf_verifies_the_halt(chan: &Path) {
    let script = "import sys\n\
from tuf.api.metadata import Metadata\n\
t = Metadata.from_file(sys.argv[1] + '/targets.json')\n\
h = Metadata.from_file(sys.argv[1] + '/halt.json')\n\
t.signed.verify_delegate('halt', h.signed_bytes, h.signatures)\n\
assert all(p.startswith('halt/') for p in h.signed.targets), h.signed.targets\n\
print('verified', len(h.signed.targets))\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, chan.to_str().unwrap()])
        .output()
        .expect("python3 runs (scripts/setup.sh installs it with python-tuf)");
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && o.contains("verified 1"),
        "python-tuf on halt.json: {o}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// POST `body` to the collector on `port`: the status and the answer.
pub(crate) fn post(port: u16, path: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/vnd.k3os-ops.bundle.v1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    c.write_all(body).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string(),
    )
}

/// Canary `i`'s failure of v2 as its node would send it: the rollback report and the failure
/// bundle, both signed with its key. Nine canaries' kubelet fails on its config; the tenth
/// panics before userspace. Canary 0's kernel log holds hostile text.
fn canary(i: u8, key: &ed25519_dalek::SigningKey, channel: &str) -> (Vec<u8>, Vec<u8>) {
    use fleet_report::{Bundle, Failure, NodeId, Report, Section};
    let node = NodeId::of(&key.verifying_key());
    let now = u64::try_from(chrono::Utc::now().timestamp()).unwrap();
    let (failure, why, section) = match i {
        9 => (
            Failure::NoUserspace,
            "slot B did not reach userspace: the loader fell back",
            (
                "log/pstore",
                "Kernel panic - not syncing: VFS: Unable to mount root fs\n",
            ),
        ),
        _ => (
            Failure::HealthCheck,
            "health check 20-kubelet failed",
            (
                "health/20-kubelet",
                "I1207 04:00:00 starting\nkubelet: failed to load config\n",
            ),
        ),
    };
    let report = Report {
        v: 1,
        node,
        site: format!("canary-{i}"),
        seq: 1,
        at: now,
        channel: channel.into(),
        version: "v2".into(),
        generation: 6,
        outcome: Outcome::RolledBack { why: why.into() },
        seed: Some(u32::from(i)),
        dropped: 0,
    };
    let kernel = match i {
        0 => "</pre><script>alert(1)</script><b>\u{1b}[31m",
        _ => "[    1.000000] Linux version 6.1.0\n",
    };
    let bundle = Bundle {
        format: fleet_report::BUNDLE_FORMAT,
        node,
        version: "v2".into(),
        generation: 6,
        attempt: 1,
        slot: "B".into(),
        time: "2027-01-15T08:00:00Z".into(),
        failure,
        why: why.into(),
        versions: "k3os-ops=0.2.0\n".into(),
        redacted: 0,
        sections: vec![
            Section {
                name: section.0.into(),
                text: section.1.into(),
                cut_bytes: 0,
            },
            Section {
                name: "log/kernel".into(),
                text: kernel.into(),
                cut_bytes: 0,
            },
        ],
    };
    (report.sign(key).unwrap(), bundle.seal(key).unwrap())
}

#[test]
fn the_canaries_bundles_arrive_and_the_guard_names_their_common_cause() {
    let Site {
        port,
        node,
        db,
        allow,
        srv,
        chan,
        work: _work,
    } = Site::new("site-1", true);
    let (c, publish) = one_wave_started(&node, &chan);
    let keys: Vec<ed25519_dalek::SigningKey> = (1..=10u8)
        .map(|n| ed25519_dalek::SigningKey::from_bytes(&[n; 32]))
        .collect();
    let ids: Vec<String> = keys
        .iter()
        .map(|k| fleet_report::NodeId::of(&k.verifying_key()).to_string())
        .collect();
    let enrolled: String = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("{id} canary-{i}\n"))
        .collect();
    std::fs::write(&allow, enrolled).unwrap();
    let (_collector, more) = Collector::start_with(
        port,
        &db,
        &allow,
        &["--dashboard", "127.0.0.1:0", "--channel", &c],
    );
    let url = more[0].strip_prefix("dashboard at ").unwrap().to_string();
    let mut sealed = Vec::new();
    for (i, k) in (0u8..).zip(&keys) {
        let (report, bundle) = canary(i, k, &srv.url);
        assert_eq!(post(port, "/v1/reports", &report).0, 201);
        let (s, text) = post(port, "/v1/bundles", &bundle);
        assert_eq!(s, 201, "{text}");
        sealed.push(bundle);
    }

    // The guard halts v2 and names the line nine of the ten share.
    let gk = delegate_guard(&node, &publish, &c);
    let dbarg = format!("sqlite:{}", db.display());
    let common = "9 of 10 failed node(s): kubelet: failed to load config";
    let out = node.ok(&[
        "collector",
        "guard",
        "--channel",
        &c,
        "--db",
        &dbarg,
        "--key",
        gk.join("halt.key").to_str().unwrap(),
        "--abort-if",
        "50",
        "--abort-min",
        "5",
    ]);
    assert!(out.contains("v2: halted (10 of 10 node(s) failed"), "{out}");
    assert!(out.contains(common), "{out}");
    // rollout-status: the halt's reason, the common cause, each canary's bundle.
    let out = node.ok(&["release", "rollout-status", &c, "--reports", &dbarg]);
    assert!(
        out.contains(&format!(
            "v2 failed on 10 node(s), 10 failure bundle(s) received; common cause: {common}"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "bundle: node {} (canary-9) attempt 1 no_userspace: slot B did not reach userspace",
            ids[9]
        )),
        "{out}"
    );
    assert_eq!(
        out.matches("attempt 1 health_check: health check 20-kubelet failed")
            .count(),
        9,
        "{out}"
    );
    let json: serde_json::Value = serde_json::from_str(&node.ok(&[
        "release",
        "rollout-status",
        &c,
        "--reports",
        &dbarg,
        "--json",
    ]))
    .unwrap();
    let v2 = &json["failures"][0];
    assert_eq!(v2["common"]["nodes"], 9, "{v2}");
    assert_eq!(
        v2["common"]["line"], "kubelet: failed to load config",
        "{v2}"
    );
    assert_eq!(v2["failed"].as_array().map(Vec::len), Some(10), "{v2}");
    let halted = out
        .lines()
        .find(|l| l.contains("v2 halted by the guard since"))
        .unwrap_or_else(|| panic!("no halt in:\n{out}"));
    assert!(
        halted.contains(common),
        "the signed halt's reason names it: {halted}"
    );

    // The dashboard, as Chromium renders it: the common cause, the halt naming it, each
    // canary's bundle beside its reason, the hostile section as text.
    let dom = in_chromium(&url);
    assert!(dom.contains(&format!("Common cause: {common}")), "{dom}");
    let guard = dom
        .split("<tr class=\"halt\">")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("no halt in the guard's table: {dom}"));
    assert!(guard.contains(common), "{guard}");
    assert_eq!(
        dom.matches("<details class=\"bundle\"").count(),
        10,
        "{dom}"
    );
    let canary0 = dom
        .split(&format!("<tr data-node=\"{}\">", ids[0]))
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("no row of canary 0: {dom}"));
    assert!(
        canary0.contains("<td>health check 20-kubelet failed</td>"),
        "{canary0}"
    );
    assert!(
        canary0.contains("kubelet: failed to load config"),
        "{canary0}"
    );
    assert!(
        canary0.contains("&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;"),
        "{canary0}"
    );
    assert!(!dom.contains("<script"), "{dom}");
    // Its download: the sealed bytes as the canary sent them.
    let href = collector::dashboard::bundle_path(&ids[0], "v2", 1);
    assert!(canary0.contains(&format!("href=\"{href}\"")), "{canary0}");
    let dash = url.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = std::net::TcpStream::connect(dash).unwrap();
    use std::io::{Read, Write};
    write!(
        conn,
        "GET {href} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        got.ends_with(&sealed[0]),
        "the download is the sealed bundle as received"
    );
    // How it looks: a screenshot (to $DASHBOARD_BUNDLES_PNG when set, to look at).
    let png = match std::env::var_os("DASHBOARD_BUNDLES_PNG") {
        Some(p) => PathBuf::from(p),
        None => node.path().join("dashboard.png"),
    };
    k3os_ops_testing::browser::screenshot(&url, &png, 1400, 1400);
}
