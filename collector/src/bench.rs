//! The ingest measurement (`just bench-collector`, i.e. `cargo test -p collector --profile dist --
//! --ignored ingest --nocapture --test-threads 1`; not in CI): `COLLECTOR_BENCH_SITES` enrolled
//! one-node sites (default 10,000) × 10 reports each, signed beforehand, into SQLite and into a
//! real PostgreSQL server (the test's own), two ways:
//! - **over HTTP** (`ingest_http_*`): the collector's own axum server on a loopback port (a
//!   2-worker tokio runtime, as `collector serve` runs it) and two client threads, each one
//!   keep-alive HTTP/1.1 connection sending `POST /v1/reports` one at a time; latency per
//!   request as the client sees it; the bytes on the wire per report (request line, headers
//!   and body; the response) are counted, which gives what a site spends per upgrade;
//! - **in process** (`ingest_sqlite`, `ingest_postgres`): [`crate::server::App::receive`]
//!   (verify, enrolment, rate, admit, store: all but the HTTP framing).
//!
//! Each prints reports/s, p50/p99 latency and the database's size on disk.
//!
//! With failure bundles in the mix (`ingest_bundles_sqlite`, `ingest_bundles_postgres`, in
//! process): the same reports, and after each rollback report (2 of each node's 10) its
//! failure bundle through [`App::receive_bundle`] (signature, enrolment, rate, inflate, admit,
//! store). Each bundle carries a failed health check's output and the tails of the kernel,
//! kubelet and containerd logs and the slot decision log, about 48 KiB of log-like text with
//! timestamps and ids (deflated to about a fifth of it). A reference run of the reports alone
//! into a fresh store of the same kind goes first; the run prints items/s, the ratio of its
//! reports/s to the reference's, and the bytes the bundles add to the database per 1,000
//! failures (SQLite: the file after a checkpoint, against the reference's; PostgreSQL:
//! `pg_total_relation_size('bundles')`).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_report::{AllowList, NodeId, Outcome, Report, Transfer};

use crate::server::App;
use crate::Limits;

const PER_NODE: u64 = 10;
/// The content type a node's reporter sends (`libupgrade::report::CONTENT_TYPE`; the collector
/// does not depend on libupgrade).
const CONTENT_TYPE: &str = "application/vnd.k3os-ops.report.v1";

/// The number of sites (one node each): `COLLECTOR_BENCH_SITES`, default 10,000.
fn sites() -> u32 {
    std::env::var("COLLECTOR_BENCH_SITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn fleet() -> (AllowList, Vec<Vec<u8>>) {
    let nodes = sites();
    let mut allow = AllowList::default();
    let mut bodies = Vec::new();
    for n in 0..nodes {
        let mut seed = [0u8; 32];
        seed[..4].copy_from_slice(&n.to_le_bytes());
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let node = NodeId::of(&key.verifying_key());
        let site = format!("site-{n:05}");
        allow.enrol(node, &site);
        for seq in 1..=PER_NODE {
            let outcome = match seq % 4 {
                0 => Outcome::Staged {
                    bytes: 48_000_000,
                    by: Transfer::Patch,
                },
                1 => Outcome::TrialBoot,
                2 => Outcome::Blessed,
                _ => Outcome::RolledBack {
                    why: "check node-ready failed: not Ready within 600 s".into(),
                },
            };
            let r = Report {
                v: outcome.format(),
                node,
                site: site.clone(),
                seq,
                at: 1_800_000_000 + seq,
                channel: "https://releases.example/stable/".into(),
                version: "v2.1.0".into(),
                generation: 21,
                outcome,
                seed: Some((u64::from(n) * 1_000_000 / u64::from(nodes)) as u32),
                dropped: 0,
            };
            bodies.push(r.sign(&key).unwrap());
        }
    }
    // Interleave the nodes, as a fleet sends.
    let mut order: Vec<Vec<u8>> = Vec::with_capacity(bodies.len());
    for seq in 0..PER_NODE as usize {
        for n in 0..nodes as usize {
            order.push(bodies[n * PER_NODE as usize + seq].clone());
        }
    }
    (allow, order)
}

/// Latencies → (p50, p99).
fn quantiles(mut lat: Vec<Duration>) -> (Duration, Duration) {
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    (q(0.50), q(0.99))
}

fn limits() -> Limits {
    Limits {
        burst: 1000,
        ..Limits::default()
    }
}

fn run(name: &str, store: Box<dyn crate::Store>, size: impl Fn() -> u64) {
    let (allow, bodies) = fleet();
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let app = Arc::new(App::new(allow, store, limits()));
    let mut lat: Vec<Duration> = Vec::with_capacity(bodies.len());
    let t = Instant::now();
    for b in &bodies {
        let s = Instant::now();
        let (status, why) = app.receive(b);
        assert_eq!(status, 201, "{why}");
        lat.push(s.elapsed());
    }
    let wall = t.elapsed();
    let (p50, p99) = quantiles(lat);
    println!(
        "ingest {name} (in process): {} reports ({} B avg) from {} sites in {:.2} s: {:.0} reports/s, p50 {p50:?}, p99 {p99:?}, database {} KiB",
        bodies.len(),
        bytes / bodies.len(),
        sites(),
        wall.as_secs_f64(),
        bodies.len() as f64 / wall.as_secs_f64(),
        size() / 1024
    );
}

/// One keep-alive HTTP/1.1 connection posting `bodies` in order; per request: its latency,
/// the bytes sent (request line, headers, body) and received (status line, headers, body).
fn post_all(addr: std::net::SocketAddr, bodies: &[Vec<u8>]) -> Vec<(Duration, usize, usize)> {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut out = Vec::with_capacity(bodies.len());
    for b in bodies {
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n",
            crate::server::REPORTS_PATH,
            CONTENT_TYPE,
            b.len()
        );
        let s = Instant::now();
        writer.write_all(head.as_bytes()).unwrap();
        writer.write_all(b).unwrap();
        let mut received = 0;
        let mut status = String::new();
        received += reader.read_line(&mut status).unwrap();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            received += reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        received += length;
        assert!(
            status.contains(" 201 "),
            "{status}{}",
            String::from_utf8_lossy(&body)
        );
        out.push((s.elapsed(), head.len() + b.len(), received));
    }
    out
}

fn run_http(name: &str, store: Box<dyn crate::Store>, size: impl Fn() -> u64) {
    let (allow, bodies) = fleet();
    let app = Arc::new(App::new(allow, store, limits()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    // Kept until the runtime is down: the store (a PostgreSQL client blocks on drop) must not
    // be dropped on one of its workers.
    let keep = app.clone();
    rt.spawn(crate::server::serve(listener, app));
    // Two clients, each a share of the sites (a node's reports stay in order on one
    // connection, as one node sends them).
    let per = sites() as usize;
    let halves: [Vec<Vec<u8>>; 2] = [0, 1].map(|h| {
        bodies
            .iter()
            .enumerate()
            .filter(|(i, _)| (i % per) % 2 == h)
            .map(|(_, b)| b.clone())
            .collect()
    });
    let t = Instant::now();
    let results: Vec<(Duration, usize, usize)> = std::thread::scope(|s| {
        let hs: Vec<_> = halves
            .iter()
            .map(|part| s.spawn(move || post_all(addr, part)))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let wall = t.elapsed();
    let n = results.len();
    let sent: usize = results.iter().map(|r| r.1).sum();
    let received: usize = results.iter().map(|r| r.2).sum();
    let (p50, p99) = quantiles(results.into_iter().map(|r| r.0).collect());
    // An upgrade that goes well sends 3 reports (staged, trial boot, blessed), and one more
    // when it waited for its wave first.
    let per_report = (sent + received) as f64 / n as f64;
    println!(
        "ingest {name} over HTTP: {n} reports from {} sites, 2 connections, in {:.2} s: {:.0} reports/s, p50 {p50:?}, p99 {p99:?}, database {} KiB; on the wire {:.0} B sent + {:.0} B received per report: {:.0} B per upgrade of 3 reports, {:.0} B with a wait",
        sites(),
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        size() / 1024,
        sent as f64 / n as f64,
        received as f64 / n as f64,
        3.0 * per_report,
        4.0 * per_report
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    drop(keep);
}

fn dir_size(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let m = e
                        .metadata()
                        .map(|m| (m.is_dir(), m.len()))
                        .unwrap_or((false, 0));
                    if m.0 {
                        dir_size(&e.path())
                    } else {
                        m.1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn sqlite() -> (tempfile::TempDir, Box<dyn crate::Store>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let store = crate::open(&format!("sqlite:{}", db.display())).unwrap();
    (dir, store)
}

fn pg_size(url: &str) -> u64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let n: i64 = c
        .query_one("SELECT pg_total_relation_size('reports')", &[])
        .unwrap()
        .get(0);
    n as u64
}

/// A failing node's log-like text of about `bytes`: timestamps, pids, ids that vary per line
/// (seeded by `n`), so it deflates as real logs do rather than to nothing.
fn log_text(n: u64, prefix: &str, bytes: usize) -> String {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut s = String::new();
    let mut t = 0u64;
    while s.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t += x % 997;
        let _ = writeln!(
            s,
            "[{:>6}.{:06}] {prefix}[{}]: E1207 pod_workers.go:{}] \"Error syncing pod\" err=\"failed to load config: open /var/lib/kubelet/config.yaml: no such file\" podUID={:016x}",
            t / 1000,
            t % 1000 * 997,
            x % 4096,
            x % 1500,
            x
        );
    }
    s
}

/// Node `n`'s bundle for the failed attempt `attempt` of the bench's release, sealed.
fn failure_bundle(key: &ed25519_dalek::SigningKey, n: u64, attempt: u32) -> Vec<u8> {
    use fleet_report::{Bundle, Failure, Section};
    let section = |name: &str, text: String| Section {
        name: name.into(),
        text,
        cut_bytes: 0,
    };
    Bundle {
        format: fleet_report::BUNDLE_FORMAT,
        node: NodeId::of(&key.verifying_key()),
        version: "v2.1.0".into(),
        generation: 21,
        attempt,
        slot: "B".into(),
        time: "2027-01-15T08:00:00Z".into(),
        failure: Failure::AwaitedTimeout,
        why: "check node-ready failed: not Ready within 600 s".into(),
        versions: "k3os-ops=0.2.0\nkernel=6.1.0-57-amd64\nkubelet=v1.36.2\n".into(),
        redacted: 3,
        sections: vec![
            section("health/node-ready", log_text(n, "node-ready", 1024)),
            section("log/kernel", log_text(n + 1, "kernel", 12 * 1024)),
            section("log/kubelet", log_text(n + 2, "kubelet", 20 * 1024)),
            section("log/containerd", log_text(n + 3, "containerd", 12 * 1024)),
            section("slot/decisions", log_text(n + 4, "slot", 2 * 1024)),
        ],
    }
    .seal(key)
    .unwrap()
}

/// What goes to the collector, in order.
enum Item {
    Report(Vec<u8>),
    Bundle(Vec<u8>),
}

/// [`fleet`]'s reports, each rollback report followed by its bundle.
fn fleet_with_bundles() -> (AllowList, Vec<Item>) {
    let (allow, reports) = fleet();
    let mut items = Vec::with_capacity(reports.len() * 6 / 5);
    let per = sites() as usize;
    for (i, body) in reports.into_iter().enumerate() {
        let failed = fleet_report::parse(&body)
            .map(|v| v.report.outcome.why().is_some())
            .unwrap_or(false);
        items.push(Item::Report(body));
        if failed {
            let n = (i % per) as u32;
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&n.to_le_bytes());
            let key = ed25519_dalek::SigningKey::from_bytes(&seed);
            let attempt = (i / per) as u32 + 1;
            items.push(Item::Bundle(failure_bundle(&key, u64::from(n), attempt)));
        }
    }
    (allow, items)
}

/// Reports alone into `reference`, then reports and bundles into `store`: the rates, their
/// ratio, and the bytes per 1,000 bundles `growth(stored bundles)` says they added.
fn run_mixed(
    name: &str,
    reference: Box<dyn crate::Store>,
    store: Box<dyn crate::Store>,
    growth: impl Fn() -> u64,
) {
    let (allow, items) = fleet_with_bundles();
    let app = App::new(allow.clone(), reference, limits());
    let t = Instant::now();
    let mut reports = 0usize;
    for i in &items {
        if let Item::Report(b) = i {
            assert_eq!(app.receive(b).0, 201);
            reports += 1;
        }
    }
    let reference_rate = reports as f64 / t.elapsed().as_secs_f64();
    drop(app);
    let app = App::new(allow, store, limits());
    let (mut bundles, mut sealed) = (0usize, 0usize);
    let t = Instant::now();
    for i in &items {
        let (status, why) = match i {
            Item::Report(b) => app.receive(b),
            Item::Bundle(b) => {
                bundles += 1;
                sealed += b.len();
                app.receive_bundle(b)
            }
        };
        assert_eq!(status, 201, "{why}");
    }
    let wall = t.elapsed().as_secs_f64();
    drop(app);
    let added = growth();
    println!(
        "ingest {name} with bundles (in process): {reports} reports and {bundles} bundles ({} B sealed avg) in {wall:.2} s: {:.0} items/s, {:.0} reports/s = {:.2} × the reports-only reference ({reference_rate:.0} reports/s); the bundles add {:.1} MiB to the database: {:.1} MiB per 1,000 failures ({:.1} MiB sealed)",
        sealed / bundles.max(1),
        (reports + bundles) as f64 / wall,
        reports as f64 / wall,
        reports as f64 / wall / reference_rate,
        added as f64 / 1_048_576.0,
        added as f64 / 1_048_576.0 * 1000.0 / bundles.max(1) as f64,
        sealed as f64 / 1_048_576.0 * 1000.0 / bundles.max(1) as f64,
    );
}

/// The size of the SQLite file at `path` once its WAL is checkpointed into it.
fn checkpointed(path: &std::path::Path) -> u64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(c);
    std::fs::metadata(path).unwrap().len()
}

#[test]
#[ignore = "a measurement: just bench-collector"]
fn ingest_bundles_sqlite() {
    let ((rdir, reference), (dir, store)) = (sqlite(), sqlite());
    run_mixed("sqlite", reference, store, || {
        checkpointed(&dir.path().join("r.db")) - checkpointed(&rdir.path().join("r.db"))
    });
}

#[test]
#[ignore = "a measurement: just bench-collector"]
fn ingest_bundles_postgres() {
    let (ref_pg, pg) = (
        crate::store::tests::pg_server::PgServer::start(),
        crate::store::tests::pg_server::PgServer::start(),
    );
    let url = pg.url();
    run_mixed(
        "postgres",
        crate::open(&ref_pg.url()).unwrap(),
        crate::open(&url).unwrap(),
        || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let n: i64 = c
                .query_one("SELECT pg_total_relation_size('bundles')", &[])
                .unwrap()
                .get(0);
            n as u64
        },
    );
}

#[test]
#[ignore = "a measurement: just bench-collector"]
fn ingest_sqlite() {
    let (dir, store) = sqlite();
    run("sqlite", store, || dir_size(dir.path()));
}

#[test]
#[ignore = "a measurement: just bench-collector"]
fn ingest_postgres() {
    let pg = crate::store::tests::pg_server::PgServer::start();
    let store = crate::open(&pg.url()).unwrap();
    let url = pg.url();
    run("postgres", store, || pg_size(&url));
}

#[test]
#[ignore = "a measurement: just bench-collector"]
fn ingest_http_sqlite() {
    let (dir, store) = sqlite();
    run_http("sqlite", store, || dir_size(dir.path()));
}

#[test]
#[ignore = "a measurement: just bench-collector"]
fn ingest_http_postgres() {
    let pg = crate::store::tests::pg_server::PgServer::start();
    let store = crate::open(&pg.url()).unwrap();
    let url = pg.url();
    run_http("postgres", store, || pg_size(&url));
}
