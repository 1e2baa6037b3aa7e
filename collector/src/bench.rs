//! The ingest measurement (`just bench-collector`, i.e. `cargo test -p collector --release --
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
                v: fleet_report::FORMAT,
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
