//! One suite for every backend: SQLite here, PostgreSQL against a real server (`pg_server`).

use super::*;
use crate::testutil::verified;
use fleet_report::{Outcome, Transfer};

/// Store, read back, and what `known` says, on any backend.
pub fn exercise(s: &mut dyn Store) {
    let node = crate::testutil::id(1);
    assert_eq!(s.known(&node, 1).unwrap(), Known::default());
    let a = verified(
        1,
        "site-a",
        1,
        Outcome::Staged {
            bytes: 42,
            by: Transfer::Patch,
        },
    );
    let b = verified(
        1,
        "site-a",
        2,
        Outcome::RolledBack {
            why: "check \"x\" failed\n".into(),
        },
    );
    let c = verified(3, "site-b", 7, Outcome::Blessed);
    for v in [&a, &b, &c] {
        s.insert(v, 1_900_000_000).unwrap();
    }
    let k = s.known(&node, 2).unwrap();
    assert_eq!(k.max_seq, Some(2));
    assert_eq!(k.rows, 2);
    assert_eq!(k.same_seq.as_deref(), Some(&b.bytes[..]));
    assert_eq!(s.known(&node, 3).unwrap().same_seq, None);
    // The primary key refuses a second row under one number.
    assert!(s.insert(&a, 1).is_err());
    let rows = s.rows().unwrap();
    assert_eq!(rows.len(), 3);
    let r = rows.iter().find(|r| r.seq == 2).unwrap();
    assert_eq!(r.outcome, b.report.outcome);
    assert_eq!(
        (r.site.as_str(), r.received, r.seed),
        ("site-a", 1_900_000_000, Some(1000))
    );
    assert_eq!(r.node, node.to_string());
}

#[test]
fn sqlite_stores_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    exercise(
        open(&format!("sqlite:{}", path.display()))
            .unwrap()
            .as_mut(),
    );
    // Reopened: the same rows, the schema kept.
    let mut again = SqliteStore::open(&path).unwrap();
    assert_eq!(again.rows().unwrap().len(), 3);
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE collector_meta SET value = 2 WHERE key = 'schema'",
        [],
    )
    .unwrap();
    drop(conn);
    let e = SqliteStore::open(&path).err().unwrap().to_string();
    assert!(e.contains("schema 2, this build reads schema 1"), "{e}");
}

#[test]
fn an_unknown_database_url_is_named() {
    let e = open("mysql://x").err().unwrap().to_string();
    assert!(e.contains("mysql://x") && e.contains("sqlite:PATH"), "{e}");
}

#[test]
fn postgres_stores_and_reads_back_on_a_real_server() {
    let pg = crate::store::tests::pg_server::PgServer::start();
    exercise(open(&pg.url()).unwrap().as_mut());
    let mut again = PgStore::open(&pg.url()).unwrap();
    assert_eq!(again.rows().unwrap().len(), 3);
}

pub mod pg_server;
