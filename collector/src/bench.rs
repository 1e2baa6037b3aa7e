//! The ingest measurement (`cargo test -p collector --release -- --ignored ingest`, not in
//! CI): `NODES` enrolled nodes × `PER_NODE` reports each, signed beforehand, through
//! [`crate::server::App::receive`] (verify, enrolment, rate, admit, store: all but the HTTP
//! framing) into SQLite and into a real PostgreSQL server; prints reports/s, p50/p99 latency
//! and the database's size on disk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_report::{AllowList, NodeId, Outcome, Report, Transfer};

use crate::server::App;
use crate::Limits;

const NODES: u32 = 2_000;
const PER_NODE: u64 = 10;

fn fleet() -> (AllowList, Vec<Vec<u8>>) {
    let mut allow = AllowList::default();
    let mut bodies = Vec::new();
    for n in 0..NODES {
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
                seed: Some(n * 499),
                dropped: 0,
            };
            bodies.push(r.sign(&key).unwrap());
        }
    }
    // Interleave the nodes, as a fleet sends.
    let mut order: Vec<Vec<u8>> = Vec::with_capacity(bodies.len());
    for seq in 0..PER_NODE as usize {
        for n in 0..NODES as usize {
            order.push(bodies[n * PER_NODE as usize + seq].clone());
        }
    }
    (allow, order)
}

fn run(name: &str, store: Box<dyn crate::Store>, size: impl Fn() -> u64) {
    let (allow, bodies) = fleet();
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let limits = Limits {
        burst: 1000,
        ..Limits::default()
    };
    let app = Arc::new(App::new(allow, store, limits));
    let mut lat: Vec<Duration> = Vec::with_capacity(bodies.len());
    let t = Instant::now();
    for b in &bodies {
        let s = Instant::now();
        let (status, why) = app.receive(b);
        assert_eq!(status, 201, "{why}");
        lat.push(s.elapsed());
    }
    let wall = t.elapsed();
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "ingest {name}: {} reports ({} B avg) from {NODES} nodes in {:.2} s: {:.0} reports/s, p50 {:?}, p99 {:?}, database {} KiB",
        bodies.len(),
        bytes / bodies.len(),
        wall.as_secs_f64(),
        bodies.len() as f64 / wall.as_secs_f64(),
        q(0.50),
        q(0.99),
        size() / 1024
    );
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

#[test]
#[ignore = "a measurement: cargo test -p collector --release -- --ignored ingest --nocapture"]
fn ingest_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let store = crate::open(&format!("sqlite:{}", db.display())).unwrap();
    run("sqlite", store, || dir_size(dir.path()));
}

#[test]
#[ignore = "a measurement: cargo test -p collector --release -- --ignored ingest --nocapture"]
fn ingest_postgres() {
    let pg = crate::store::tests::pg_server::PgServer::start();
    let store = crate::open(&pg.url()).unwrap();
    let url = pg.url();
    run("postgres", store, || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let n: i64 = c
            .query_one("SELECT pg_total_relation_size('reports')", &[])
            .unwrap()
            .get(0);
        n as u64
    });
}
