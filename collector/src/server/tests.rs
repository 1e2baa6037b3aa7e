//! The threat model, over real HTTP against a collector on SQLite: every bad report refused
//! with its status and stored nowhere.

use super::*;
use crate::testutil::{allow, id, key, report, signed};
use fleet_report::Outcome;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A collector on a free port (its own runtime thread) over a fresh SQLite file.
pub fn start(limits: Limits) -> (SocketAddr, Arc<App>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::open(&format!("sqlite:{}", dir.path().join("r.db").display())).unwrap();
    let app = Arc::new(App::new(allow(), store, limits));
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let served = app.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(std_listener).unwrap();
            serve(l, served).await.unwrap();
        });
    });
    (addr, app, dir)
}

/// POST `body` to `path`: the status and the answer's body.
pub fn post(addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    // A server may answer (413) before reading a long body: ignore a reset while writing it.
    let _ = c.write_all(body);
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {out:?}"));
    let text = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, text)
}

#[test]
fn a_good_report_is_stored_once_and_every_attack_is_refused_and_stored_nowhere() {
    let limits = Limits {
        rows_per_node: 3,
        burst: 1000,
        per_sec: 1000.0,
        ..Limits::default()
    };
    let (addr, app, _dir) = start(limits);
    let p = |body: &[u8]| post(addr, REPORTS_PATH, body);
    let good = signed(1, "site-a", 10, Outcome::Blessed);
    assert_eq!(p(&good).0, 201);
    assert_eq!(p(&good), (200, "already stored (a resend)\n".into()));

    // Forged: node 1's id, node 9's signature.
    let mut forged = report(
        1,
        "site-a",
        11,
        Outcome::RolledBack {
            why: "forged".into(),
        },
    );
    let body = {
        let mut r = forged.clone();
        r.node = id(9);
        let mut b = r.sign(&key(9)).unwrap();
        let (theirs, victim) = (id(9).to_string(), id(1).to_string());
        let at = b.windows(64).position(|w| w == theirs.as_bytes()).unwrap();
        b[at..at + 64].copy_from_slice(victim.as_bytes());
        b
    };
    let (s, why) = p(&body);
    assert_eq!(s, 401, "{why}");
    // Invented site, with a fresh key of its own.
    let (s, why) = p(&signed(
        42,
        "site-invented",
        1,
        Outcome::RolledBack { why: "x".into() },
    ));
    assert_eq!(s, 403, "{why}");
    assert!(why.contains("not enrolled"), "{why}");
    // A real node reporting for another site.
    let (s, why) = p(&signed(
        3,
        "site-a",
        1,
        Outcome::RolledBack { why: "x".into() },
    ));
    assert_eq!(s, 403, "{why}");
    assert!(why.contains("enrolled for site \"site-b\""), "{why}");
    // Replay: an older number than the newest stored.
    let (s, why) = p(&signed(1, "site-a", 9, Outcome::Blessed));
    assert_eq!(s, 409, "{why}");
    // The same number with other bytes.
    forged.outcome = Outcome::TrialBoot;
    forged.seq = 10;
    assert_eq!(p(&forged.sign(&key(1)).unwrap()).0, 409);
    // Too large, and not a report at all.
    assert_eq!(p(&vec![b'a'; 64 * 1024]).0, 413);
    let (s, why) = p(b"k3os-report 1\n\x1b[31mred");
    assert_eq!(s, 400);
    assert!(!why.contains('\x1b'), "untrusted text is escaped: {why:?}");
    // Disk fill: node 2 may hold 3 reports.
    for seq in 1..=3 {
        assert_eq!(p(&signed(2, "site-a", seq, Outcome::TrialBoot)).0, 201);
    }
    let (s, why) = p(&signed(2, "site-a", 4, Outcome::TrialBoot));
    assert_eq!(s, 507, "{why}");

    let rows = app.rows().unwrap();
    assert_eq!(
        rows.len(),
        4,
        "node 1's one report and node 2's three: {rows:?}"
    );
    assert!(rows.iter().all(|r| r.site == "site-a"));
    assert!(!rows.iter().any(|r| r.outcome.why().is_some()));
    assert_eq!(post(addr, "/healthz", b"").0, 405, "healthz is GET only");
}

#[test]
fn a_flooding_node_gets_429_and_the_others_are_unaffected() {
    let limits = Limits {
        rows_per_node: 1000,
        burst: 3,
        per_sec: 0.001,
        ..Limits::default()
    };
    let (addr, app, _dir) = start(limits);
    let statuses: Vec<u16> = (1..=6)
        .map(|seq| {
            post(
                addr,
                REPORTS_PATH,
                &signed(1, "site-a", seq, Outcome::TrialBoot),
            )
            .0
        })
        .collect();
    assert_eq!(statuses, vec![201, 201, 201, 429, 429, 429]);
    assert_eq!(
        post(
            addr,
            REPORTS_PATH,
            &signed(3, "site-b", 1, Outcome::Blessed)
        )
        .0,
        201
    );
    assert_eq!(app.rows().unwrap().len(), 4);
}
