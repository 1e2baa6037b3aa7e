//! The fleet-of-sites row of `just bench-fleet` (issue 24 item 8): many single-node sites, each
//! its own cluster with its own agent and `UpdateChannel`, follow one channel whose signed
//! metadata rolls v2 out in four waves (1 % at T, 10 % at T+24h, 50 % at T+48h, 100 % at
//! T+72h).
//!
//! Two measurements, both of the real code:
//! - **What one poll costs** ([`poll_cost`]): a channel built and signed by the binary
//!   (`release create|index|root init|targets|timestamp|rollout`) and served by a real `release
//!   serve`; a site whose wave has not started resolves `latest` through libupgrade exactly as
//!   a node does (`channel::resolve_for` with the node's trust options and the site's seed), at
//!   virtual times 15 minutes apart (the test clock of the resolution). Every request the
//!   server logs is counted, with the bytes of the files it answered. Three clients: a node
//!   (the agent's poller and `k3os-ops upgrade --version latest` from a timer both record what
//!   they trusted and keep the verified snapshot and targets, `trust::kept::Kept`), a resolution
//!   that keeps nothing (`--plan-only`), and the reference, python-tuf's ngclient, refreshing
//!   the same channel on the same server in the same run.
//! - **The share on the release per hour** ([`simulate`]): `FLEET_SITES` sites (default 1000),
//!   each with the seed the agent derives from its channel's UID (`Seed::derived_from`), polling
//!   every hour while it waits for its wave (the agent's default `--wait-poll-secs`; every 15
//!   minutes otherwise, `--poll-secs`) at a random phase, and one second after the instant its
//!   seed is admitted (the agent's poller looks again then, whatever its period; the same fleet
//!   polling every 15 minutes while waiting is summarised too); at every poll the
//!   site asks libupgrade's pure decision (`rollout::offer`) what it is offered; once offered v2
//!   it is on it [`UPDATE`] later (stage, reboot, confirm: an assumption, not measured here).
//!   Printed per hour: the schedule's share, the share offered and the share on v2, and the
//!   requests the waiting sites send the origin (measured per poll × polls).

use std::path::{Path, PathBuf};
use std::process::Command;

use chrono::{DateTime, Duration, SubsecRound, Utc};
use libupgrade::channel::{NodeRollout, SeedSource, TrustOptions};
use libupgrade::manifest::Arch;
use libupgrade::rollout::{self, Hold, Installed, Listed, Rollout, Seed, Wave, SEED_SPACE};
use rand::{Rng, SeedableRng};

use k3os_ops_testing::release::{self, Server};

/// The sites' poll period (the agent's default `--poll-secs`).
const POLL: Duration = Duration::minutes(15);
/// Their poll period while a release waits for their wave (the agent's default
/// `--wait-poll-secs`).
const WAIT_POLL: Duration = Duration::minutes(60);
/// From being offered v2 to running it (stage, reboot, confirm): assumed.
const UPDATE: Duration = Duration::minutes(10);
/// Polls measured on the real server.
const POLLS: i64 = 8;

/// The four waves from `t`.
fn waves(t: DateTime<Utc>) -> Vec<Wave> {
    [(100, 0), (1000, 24), (5000, 48), (10_000, 72)]
        .into_iter()
        .map(|(share_bp, h)| Wave {
            share_bp,
            start: t + Duration::hours(h),
        })
        .collect()
}

/// Requests of one poll: the paths, the bytes of the files answered.
#[derive(Debug, Default, Clone)]
pub struct Poll {
    pub paths: Vec<String>,
    pub bytes: u64,
}

/// What polls cost on the real server (the last of [`POLLS`] polls while waiting, and the
/// first): a node, which keeps the metadata it verified (the agent's poller and an `upgrade`
/// timer alike); a resolution that keeps nothing (`upgrade --plan-only`, and every poll before
/// nodes kept metadata); python-tuf's ngclient refreshing the same channel (the reference).
#[derive(Debug, Clone)]
pub struct PollCost {
    pub first: Poll,
    pub node: Poll,
    pub look: Poll,
    pub reference: Poll,
}

fn ok(args: &[&str]) {
    testkit::run(Command::new(release::bin()).args(args));
}

/// A channel in `site/stable` with v1 and v2 (v2 rolled out in four waves from `t`), signed by
/// the binary as a publisher does; returns the channel directory.
fn publish(dir: &Path, t: DateTime<Utc>) -> PathBuf {
    let s = |p: &Path| p.display().to_string();
    let keys = dir.join("keys");

    ok(&["release", "keygen", "-o", &s(&keys), "--name", "release"]);
    let meta = release::MetaKeys::generate(&keys, &ok);
    let k = |n: &str| meta.file(n);
    let chan = dir.join("site/stable");
    let work = dir.join("work");
    std::fs::create_dir_all(&chan).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    for (v, g) in [("v1", "1"), ("v2", "2")] {
        let (sq, kern, init) = release::squashfs_inputs(&work, v);
        let out = s(&chan.join(v));
        ok(&[
            "release",
            "create",
            "--rootfs",
            &s(&sq),
            "--kernel",
            &s(&kern),
            "--initrd",
            &s(&init),
            "--version",
            v,
            "--arch",
            Arch::host().as_str(),
            "--key",
            &k("release.key"),
            "-o",
            &out,
            "--generation",
            g,
        ]);
    }
    let c = s(&chan);
    ok(&["release", "index", &c]);
    meta.init_channel(&chan, &ok);
    let rollout = [
        "release",
        "rollout",
        &c,
        "v2",
        "--waves",
        "1%@+0,10%@+24h,50%@+48h,100%@+72h",
        "--start",
        &t.to_rfc3339(),
    ]
    .into_iter()
    .map(String::from)
    .chain(meta.signing())
    .collect::<Vec<_>>();
    ok(&rollout.iter().map(String::as_str).collect::<Vec<_>>());
    chan
}

/// The requests `log` gained since it had `seen` lines, with the bytes of the files of `root`
/// they were answered (200) with.
fn since(log: &Path, seen: &mut usize, root: &Path) -> Poll {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut p = Poll::default();
    for l in &lines[*seen..] {
        // "PEER GET /stable/timestamp.json -> 200"
        let mut w = l.split_whitespace().skip(1);
        let (Some(_method), Some(path)) = (w.next(), w.next()) else {
            continue;
        };
        let status = l.rsplit(' ').next().unwrap_or_default();
        p.paths.push(format!("{path} {status}"));
        if status == "200" {
            let file = root.join(path.trim_start_matches('/'));
            p.bytes += std::fs::metadata(file).map_or(0, |m| m.len());
        }
    }
    *seen = lines.len();
    p
}

/// Measure what a waiting site's polls fetch (see the module docs).
pub fn poll_cost() -> PollCost {
    let dir = tempfile::tempdir().unwrap();
    let t = (Utc::now() + Duration::hours(1)).trunc_subsecs(0);
    let chan = publish(dir.path(), t);
    let log = dir.path().join("serve.log");
    let srv = Server::start_logged(&dir.path().join("site"), &log);
    let url = format!("{}stable/", srv.url);
    // The last seed of the fleet: admitted only at T+72h, so it waits through every poll here.
    let seed = Seed::new(SEED_SPACE - 1).unwrap();
    let node = NodeRollout {
        seed: SeedSource::Given(seed),
        running: Installed {
            version: "v1".into(),
            generation: 1,
        },
        staged: None,
        ignore_rollout: false,
    };
    let mut seen = 0;
    let site = dir.path().join("site");
    let mut measure = |read_only: bool, name: &str| {
        let state = dir.path().join(name);
        std::fs::create_dir_all(&state).unwrap();
        std::fs::copy(chan.join("root.json"), state.join("root.json")).unwrap();
        let mut polls = Vec::new();
        for k in 0..POLLS {
            let trust = TrustOptions {
                root_file: state.join("root.json"),
                store_file: state.join(libupgrade::trust::STORE_FILE),
                policy: libupgrade::channel::MetadataPolicy::Auto,
                now: Some(t + Duration::hours(1) + POLL * k as i32),
                ignore_expiry: false,
                min_rate: None,
                read_only,
            };
            let r = libupgrade::channel::resolve_for(&url, None, Arch::host(), &trust, Some(&node))
                .expect("resolve");
            let waits = r
                .rollout
                .as_ref()
                .and_then(|n| n.waiting.as_ref())
                .map(|w| w.version.as_str());
            assert_eq!((r.version.as_str(), waits), ("v1", Some("v2")), "{r:?}");
            polls.push(since(&log, &mut seen, &site));
        }
        polls
    };
    let node_polls = measure(false, "node");
    let look = measure(true, "plan-only");
    let reference = (0..POLLS)
        .map(|_| {
            python_tuf_refresh(
                &url,
                &dir.path().join("python-tuf"),
                &chan.join("root.json"),
            );
            since(&log, &mut seen, &site)
        })
        .collect::<Vec<_>>();
    drop(srv);
    let last = |p: &[Poll]| p[POLLS as usize - 1].clone();
    PollCost {
        first: node_polls[0].clone(),
        node: last(&node_polls),
        look: last(&look),
        reference: last(&reference),
    }
}

/// One `refresh()` of python-tuf's ngclient (`tests/tuf/interop.py refresh`, python-tuf as
/// `scripts/setup.sh` installs it), keeping its metadata in `metadir` between calls.
fn python_tuf_refresh(url: &str, metadir: &Path, root: &Path) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tuf/interop.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["refresh", url])
        .arg(metadir)
        .arg(root)
        .output()
        .expect("python3 runs (scripts/setup.sh installs it with python-tuf)");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.trim() == "ok",
        "python-tuf refresh of {url}: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Per site: when it was first offered v2, and how many polls it made while waiting.
struct Site {
    offered: DateTime<Utc>,
    waiting_polls: u32,
}

/// Simulate `sites` sites under the four waves from `t`, each polling every `poll` and, as the
/// agent's poller does, once more one second after the instant its seed is admitted (see the
/// module docs).
fn sites_under_waves(sites: usize, t: DateTime<Utc>, poll: Duration) -> Vec<Site> {
    let v2 = Rollout {
        waves: waves(t),
        ..Rollout::default()
    };
    let releases = [
        Listed {
            version: "v1".into(),
            generation: 1,
            rollout: None,
        },
        Listed {
            version: "v2".into(),
            generation: 2,
            rollout: Some(v2),
        },
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(24);
    (0..sites)
        .map(|i| {
            let node = rollout::Node {
                seed: Seed::derived_from(&format!("site-{i:05}/stable-channel-uid")),
                running: Installed {
                    version: "v1".into(),
                    generation: 1,
                },
                staged: None,
            };
            let phase = Duration::seconds(rng.gen_range(0..poll.num_seconds()));
            let mut at = t - Duration::hours(1) + phase;
            let mut waiting_polls = 0;
            loop {
                let o = rollout::offer(&node, at, &releases);
                if o.take.is_some_and(|s| s.version == "v2") {
                    return Site {
                        offered: at,
                        waiting_polls,
                    };
                }
                waiting_polls += 1;
                let admitted = match o.waiting.map(|w| w.hold) {
                    Some(Hold::Wave { starts: Some(s) }) => s + Duration::seconds(1),
                    _ => at + poll,
                };
                at = admitted.min(at + poll);
            }
        })
        .collect()
}

/// Print the row: the schedule, the offered and the updated share per hour, and the requests.
pub fn simulate(sites: usize, cost: &PollCost) {
    let t = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let all = sites_under_waves(sites, t, WAIT_POLL);
    let fmt = |p: &Poll| {
        let mut paths = p.paths.clone();
        paths.dedup();
        format!(
            "{} requests, {} B: {}",
            p.paths.len(),
            p.bytes,
            paths.join(", ")
        )
    };
    println!("\nfleet of one-node sites: {sites} sites, v2 in 4 waves (1 %@T, 10 %@T+24h, 50 %@T+48h, 100 %@T+72h), polls every {} min ({} min while waiting, and at the site's admission instant), update {} min", POLL.num_minutes(), WAIT_POLL.num_minutes(), UPDATE.num_minutes());
    println!("  one poll on a real `release serve` (site waiting for its wave):");
    println!(
        "    first poll:                         {}",
        fmt(&cost.first)
    );
    println!(
        "    node (agent poller, `upgrade`):     {}",
        fmt(&cost.node)
    );
    println!(
        "    keeping nothing (--plan-only):      {}",
        fmt(&cost.look)
    );
    println!(
        "    python-tuf ngclient (reference):    {}",
        fmt(&cost.reference)
    );
    println!(
        "    node / python-tuf: {:.2}× the requests, {:.2}× the bytes",
        cost.node.paths.len() as f64 / cost.reference.paths.len() as f64,
        cost.node.bytes as f64 / cost.reference.bytes.max(1) as f64
    );
    let per_poll = cost.node.paths.len() as f64;
    for minutes in [WAIT_POLL.num_minutes(), POLL.num_minutes()] {
        let polls_per_hour = 60.0 / minutes as f64;
        println!(
            "  requests per waiting site per hour polling every {minutes} min while waiting: {:.1} ({} polls/h × {} requests), {:.0} B; plus one snapshot.json a day after the channel's daily `release timestamp`",
            per_poll * polls_per_hour,
            polls_per_hour,
            per_poll,
            cost.node.bytes as f64 * polls_per_hour
        );
    }
    let v2 = waves(t);
    let share_at = |all: &[Site], at: DateTime<Utc>, lag: Duration| {
        all.iter().filter(|s| s.offered + lag <= at).count() as f64 / sites as f64
    };
    let schedule_at = |at| f64::from(rollout::threshold(&v2, at)) / f64::from(SEED_SPACE);
    // The largest gaps to the schedule over hours 0-80, offered and on v2 (every minute).
    let worst = |all: &[Site]| {
        (0..=80 * 60)
            .map(|m| t + Duration::minutes(m))
            .map(|at| {
                let sched = schedule_at(at);
                (
                    (share_at(all, at, Duration::zero()) - sched).abs(),
                    (share_at(all, at, UPDATE) - sched).abs(),
                )
            })
            .fold((0.0f64, 0.0f64), |(a, b), (x, y)| (a.max(x), b.max(y)))
    };
    let polls_per_hour = 60.0 / WAIT_POLL.num_minutes() as f64;
    println!(
        "  polling every {} min while waiting (and at the site's admission instant):",
        WAIT_POLL.num_minutes()
    );
    println!("  hour  schedule  offered  on v2   waiting  origin req/h");
    for h in (0..=80).filter(|h| h % 4 == 0 || *h == 1) {
        let at = t + Duration::hours(h);
        let waiting = all.iter().filter(|s| s.offered > at).count();
        println!(
            "  {h:>4}  {:>7.2}%  {:>6.2}%  {:>5.2}%  {waiting:>7}  {:>12.0}",
            100.0 * schedule_at(at),
            100.0 * share_at(&all, at, Duration::zero()),
            100.0 * share_at(&all, at, UPDATE),
            waiting as f64 * per_poll * polls_per_hour
        );
    }
    let quarterly = sites_under_waves(sites, t, POLL);
    for (minutes, all) in [
        (WAIT_POLL.num_minutes(), &all),
        (POLL.num_minutes(), &quarterly),
    ] {
        let (offered, on) = worst(all);
        let polls: u64 = all.iter().map(|s| u64::from(s.waiting_polls)).sum();
        println!(
            "  every {minutes} min while waiting: largest gap to the schedule over hours 0-80 (each minute): offered {:.2} points, on v2 {:.2} points ({sites} sites: sampling noise ~ {:.1} points at 50 %); waiting polls {polls} ({:.1} per site), requests {:.0}",
            100.0 * offered,
            100.0 * on,
            100.0 * (0.25 / sites as f64).sqrt(),
            polls as f64 / sites as f64,
            polls as f64 * per_poll
        );
    }
}
