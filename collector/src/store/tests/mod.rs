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
    // The guard's log: kept in order, read back as recorded.
    assert_eq!(s.actions().unwrap(), vec![]);
    let halt = GuardAction {
        at: 1_900_000_100,
        channel: "/srv/channel".into(),
        version: "v2".into(),
        action: "halt".into(),
        detail: "rolled_back 5 of 10 (50.00 %) >= 20 %".into(),
        halt_version: 3,
    };
    let lifted = GuardAction {
        action: "lifted".into(),
        halt_version: 0,
        ..halt.clone()
    };
    s.record(&halt).unwrap();
    s.record(&lifted).unwrap();
    assert_eq!(s.actions().unwrap(), vec![halt, lifted]);
}

/// Bundles stored, counted per node, read back, and a second copy under one attempt refused
/// by the key, on any backend.
pub fn exercise_bundles(s: &mut dyn Store) {
    use crate::testutil::opened;
    let node = crate::testutil::id(1);
    assert_eq!(s.bundle_known(&node, b"x").unwrap(), BundleKnown::default());
    let one = opened(1, 1, "kubelet: failed to load config");
    let two = opened(1, 2, "kubelet: failed to load config");
    let other = opened(3, 1, "containerd: \u{1b}[31m<b>boom</b>");
    s.insert_bundle(&one, "site-a", 1_900_000_000).unwrap();
    s.insert_bundle(&two, "site-a", 1_900_000_001).unwrap();
    s.insert_bundle(&other, "site-b", 1_900_000_002).unwrap();
    assert!(
        s.insert_bundle(&one, "site-a", 1).is_err(),
        "one row per attempt"
    );
    let k = s.bundle_known(&node, &two.bytes).unwrap();
    assert!(k.resend, "these bytes are stored");
    assert_eq!(k.count, 2);
    assert_eq!(k.bytes, (one.bytes.len() + two.bytes.len()) as u64);
    assert!(
        !s.bundle_known(&node, &other.bytes).unwrap().resend,
        "node 3's, not 1's"
    );
    let rows = s.bundles().unwrap();
    assert_eq!(rows.len(), 3);
    let r = rows.iter().find(|r| r.site == "site-b").unwrap();
    assert_eq!(
        (r.node.as_str(), r.version.as_str(), r.attempt, r.generation),
        (crate::testutil::id(3).to_string().as_str(), "v2", 1, 2)
    );
    assert_eq!(
        (r.failure, r.why.as_str()),
        (other.bundle.failure, other.bundle.why.as_str())
    );
    assert_eq!(
        (r.received, r.size),
        (1_900_000_002, other.bytes.len() as u64)
    );
    assert_eq!(
        (r.slot.as_str(), r.time.as_str()),
        ("B", "2027-01-15T08:00:00Z")
    );
    let body = s.bundle_body(&r.node, "v2", 1).unwrap().unwrap();
    assert_eq!(body, other.bytes, "the sealed bytes, as received");
    assert_eq!(s.bundle_body(&r.node, "v2", 9).unwrap(), None);
    // Node 1 failed v2, node 3 blessed it: node 1's newest bundle is opened, and only it.
    let failed = verified(1, "site-a", 9, Outcome::RolledBack { why: "x".into() });
    s.insert(&failed, 1).unwrap();
    s.insert(&verified(3, "site-b", 9, Outcome::Blessed), 1)
        .unwrap();
    let rows: Vec<Row> = s
        .rows()
        .unwrap()
        .into_iter()
        .filter(|r| r.seq == 9)
        .collect();
    let opened = s.failed_bundles(&rows).unwrap();
    assert_eq!(
        opened,
        vec![two.bundle.clone()],
        "read back from the sealed bytes"
    );
}

/// Node `n`'s bundle of attempt `attempt` of `version`, opened.
fn opened_of(n: u8, version: &str, attempt: u32) -> fleet_report::Opened {
    let mut b = crate::testutil::bundle(n, attempt, "kubelet: failed to load config");
    b.version = version.into();
    fleet_report::open_bundle(&b.seal(&crate::testutil::key(n)).unwrap()).unwrap()
}

/// (version, attempt) of `rows`.
fn attempts(rows: &[BundleRow]) -> Vec<(String, u32)> {
    rows.iter()
        .map(|r| (r.version.clone(), r.attempt))
        .collect()
}

/// The publisher frees node 6's quota: by release, by the time received, then all of it;
/// node 7's bundles are never touched, and a node with nothing stored removes nothing.
pub fn exercise_delete(s: &mut dyn Store) {
    let (six, seven) = (crate::testutil::id(6), crate::testutil::id(7));
    for (n, version, attempt, received) in [
        (6, "v2", 1, 100),
        (6, "v2", 2, 200),
        (6, "v3", 1, 300),
        (6, "v3", 2, 400),
        (7, "v3", 1, 100),
    ] {
        s.insert_bundle(&opened_of(n, version, attempt), "site-d", received)
            .unwrap();
    }
    let sel = |version: Option<&str>, before: Option<u64>| BundleSelection {
        node: six,
        version: version.map(str::to_string),
        received_before: before,
    };
    let gone = s.delete_bundles(&sel(Some("v3"), Some(400))).unwrap();
    assert_eq!(
        attempts(&gone),
        vec![("v3".into(), 1)],
        "v3 received before 400"
    );
    assert_eq!((gone[0].received, gone[0].site.as_str()), (300, "site-d"));
    let gone = s.delete_bundles(&sel(None, Some(150))).unwrap();
    assert_eq!(attempts(&gone), vec![("v2".into(), 1)]);
    assert_eq!(s.bundle_known(&six, b"").unwrap().count, 2);
    let gone = s.delete_bundles(&sel(None, None)).unwrap();
    assert_eq!(attempts(&gone), vec![("v2".into(), 2), ("v3".into(), 2)]);
    assert_eq!(s.bundle_known(&six, b"").unwrap(), BundleKnown::default());
    assert_eq!(s.delete_bundles(&sel(None, None)).unwrap(), vec![]);
    let k = s.bundle_known(&seven, b"").unwrap();
    assert_eq!(k.count, 1, "another node's bundles are kept");
    // Its quota freed, node 6 may store again, even an attempt it had before.
    s.insert_bundle(&opened_of(6, "v2", 1), "site-d", 500)
        .unwrap();
}

/// A deletion that fails part way removes nothing: node 8's attempt 2 cannot be deleted
/// (`arm` makes the database refuse it), so deleting all of node 8's bundles fails naming the
/// database and the node, and both are still there; `disarm` lifts it and both go.
pub fn deletion_is_all_or_nothing(s: &mut dyn Store, arm: impl Fn(), disarm: impl Fn()) {
    let eight = crate::testutil::id(8);
    for attempt in [1, 2] {
        s.insert_bundle(&opened_of(8, "v2", attempt), "site-e", 1)
            .unwrap();
    }
    let all = BundleSelection {
        node: eight,
        version: None,
        received_before: None,
    };
    arm();
    let e = s.delete_bundles(&all).unwrap_err().to_string();
    assert!(
        e.starts_with(s.name())
            && e.contains(&eight.to_string())
            && e.contains("nothing was removed"),
        "{e}"
    );
    assert_eq!(s.bundle_known(&eight, b"").unwrap().count, 2, "{e}");
    disarm();
    assert_eq!(s.delete_bundles(&all).unwrap().len(), 2);
}

/// The halted canaries, stored and read back: node 4 staged, rolled back, then waits
/// for the halt; node 5 does the same and then stages again after the lift. Whatever the
/// backend, each node's outcome ([`crate::history`]) is read from its whole history.
pub fn halted_canaries(s: &mut dyn Store) {
    let paused = Outcome::Waiting {
        wait_for: fleet_report::WaitFor::Pause,
        until: None,
    };
    let staged = Outcome::Staged {
        bytes: 1,
        by: Transfer::Full,
    };
    let failed = Outcome::RolledBack {
        why: "check \"x\" failed".into(),
    };
    for n in [4, 5] {
        for (seq, o) in [(1, &staged), (2, &failed), (3, &paused)] {
            s.insert(&verified(n, "site-c", seq, o.clone()), 1_900_000_000 + seq)
                .unwrap();
        }
    }
    s.insert(&verified(5, "site-c", 4, staged.clone()), 1_900_000_010)
        .unwrap();
    let rows: Vec<Row> = s
        .rows()
        .unwrap()
        .into_iter()
        .filter(|r| r.site == "site-c")
        .collect();
    let all = crate::history::outcomes(&rows);
    let v2 = &all[&(2, "v2")];
    let four = &v2[crate::testutil::id(4).to_string().as_str()];
    assert_eq!(four.label(), "rolled back, waiting (paused)");
    assert_eq!(four.decided_by.outcome, failed);
    assert_eq!(four.decided_by.received, 1_900_000_002);
    let five = &v2[crate::testutil::id(5).to_string().as_str()];
    assert_eq!((five.label().as_str(), five.newest.seq), ("staged", 4));
    let f = crate::fleet::summarize(&rows, &|_, _| Some(1), 0);
    let w = &f.releases[0].waves[0];
    assert_eq!(
        (w.nodes, w.offered, w.failed_waiting.values().sum::<u64>()),
        (2, 2, 1),
        "{w:?}"
    );
}

#[test]
fn sqlite_reads_each_node_s_history_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    halted_canaries(&mut SqliteStore::open(&path).unwrap());
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
    exercise_bundles(&mut again);
    exercise_delete(&mut again);
}

/// SQLite's part of [`deletion_is_all_or_nothing`]: a trigger that aborts the deletion of
/// node 8's attempt 2, created and dropped through a second connection.
#[test]
fn sqlite_deletes_a_node_s_bundles_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    let mut s = SqliteStore::open(&path).unwrap();
    let sql = |q: &str| {
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(q)
            .unwrap()
    };
    deletion_is_all_or_nothing(
        &mut s,
        || {
            sql(
                "CREATE TRIGGER keep BEFORE DELETE ON bundles WHEN OLD.attempt = 2
                 BEGIN SELECT RAISE(ABORT, 'kept by the test'); END;",
            )
        },
        || sql("DROP TRIGGER keep"),
    );
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE collector_meta SET value = 5 WHERE key = 'schema'",
        [],
    )
    .unwrap();
    conn.execute("DROP TABLE guard_actions", []).unwrap();
    drop(conn);
    let e = SqliteStore::open(&path).err().unwrap().to_string();
    assert!(e.contains("schema 5, this build reads schema 4"), "{e}");
    // Nothing was created in it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'guard_actions'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 0);
}

/// What the previous release's collector (schema 1) created, exactly: its tables and one
/// report row.
const SCHEMA_1: &str = "
CREATE TABLE collector_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE reports (
    node TEXT NOT NULL, seq INTEGER NOT NULL, site TEXT NOT NULL, at INTEGER NOT NULL,
    received INTEGER NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
    generation INTEGER NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, seed INTEGER,
    dropped INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (node, seq));
CREATE INDEX reports_release ON reports (version, generation);
INSERT INTO collector_meta (key, value) VALUES ('schema', 1);
";

#[test]
fn a_schema_1_database_of_the_previous_release_is_migrated_keeping_its_reports() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(SCHEMA_1).unwrap();
    let v = verified(1, "site-a", 1, Outcome::Blessed);
    drop(conn);
    // Insert through a schema-1 shaped statement (what the previous build ran).
    let c = Columns::of(&v);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO reports (node, seq, site, at, received, channel, version, generation,
         kind, outcome, seed, dropped, body) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
        rusqlite::params![
            c.node,
            c.seq,
            c.site,
            c.at,
            5,
            c.channel,
            c.version,
            c.generation,
            c.kind,
            c.outcome,
            c.seed,
            c.dropped,
            v.bytes
        ],
    )
    .unwrap();
    drop(conn);
    let mut s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.rows().unwrap().len(), 1);
    assert_eq!(s.actions().unwrap(), vec![]);
    assert_eq!(s.bundles().unwrap(), vec![]);
    drop(s);
    assert_eq!(sqlite_schema(&path), SCHEMA);
}

/// What the previous release's collector (schema 2) created in SQLite, exactly, with one
/// action of its guard.
const SCHEMA_2: &str = "
CREATE TABLE collector_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE guard_actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, channel TEXT NOT NULL,
    version TEXT NOT NULL, action TEXT NOT NULL, detail TEXT NOT NULL,
    halt_version INTEGER NOT NULL);
CREATE TABLE reports (
    node TEXT NOT NULL, seq INTEGER NOT NULL, site TEXT NOT NULL, at INTEGER NOT NULL,
    received INTEGER NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
    generation INTEGER NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, seed INTEGER,
    dropped INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (node, seq));
CREATE INDEX reports_release ON reports (version, generation);
INSERT INTO guard_actions (at, channel, version, action, detail, halt_version)
    VALUES (5, '/srv/c', 'v2', 'halt', 'rolled_back 3 of 3', 2);
INSERT INTO collector_meta (key, value) VALUES ('schema', 2);
";

#[test]
fn a_schema_2_database_of_the_previous_release_gains_bundles_keeping_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(SCHEMA_2)
        .unwrap();
    let mut s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.actions().unwrap().len(), 1, "the guard's log is kept");
    exercise_bundles(&mut s);
    drop(s);
    let schema = sqlite_schema(&path);
    assert_eq!(schema, SCHEMA);
}

fn retry_wait() -> Outcome {
    Outcome::Waiting {
        wait_for: fleet_report::WaitFor::Retry,
        until: Some(1_800_003_600),
    }
}

/// A schema-3 store (the tables this build has; the number is what differs) holding a
/// report and a bundle is migrated on open: everything kept, schema 4 recorded, and a wait
/// for a retry (report format 2, which a schema-3 collector cannot read) stored and read back.
/// `make_3`: turn a new store of this build into what a schema-3 collector left.
fn a_schema_3_store_is_migrated(open: &dyn Fn() -> Box<dyn Store>, make_3: &dyn Fn()) {
    let mut s = open();
    s.insert(&verified(1, "site-a", 1, Outcome::Blessed), 5)
        .unwrap();
    drop(s);
    make_3();
    let mut s = open();
    assert_eq!(s.rows().unwrap().len(), 1, "the schema-3 report is kept");
    s.insert(&verified(1, "site-a", 2, retry_wait()), 6)
        .unwrap();
    let rows = s.rows().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].outcome, retry_wait());
}

#[test]
fn a_schema_3_database_is_migrated_to_4_keeping_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.db");
    let sql = |q: &str| {
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(q)
            .unwrap()
    };
    a_schema_3_store_is_migrated(&|| Box::new(SqliteStore::open(&path).unwrap()), &|| {
        sql("UPDATE collector_meta SET value = 3 WHERE key = 'schema'")
    });
    let schema = sqlite_schema(&path);
    assert_eq!(schema, 4);
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
    halted_canaries(&mut again);
    exercise_bundles(&mut again);
    exercise_delete(&mut again);
    let sql = |q: &str| {
        postgres::Client::connect(&pg.url(), postgres::NoTls)
            .unwrap()
            .batch_execute(q)
            .unwrap()
    };
    deletion_is_all_or_nothing(
        &mut again,
        || {
            sql("CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'kept by the test'; END $$;
                 CREATE TRIGGER keep BEFORE DELETE ON bundles FOR EACH ROW
                 WHEN (OLD.attempt = 2) EXECUTE FUNCTION keep();")
        },
        || sql("DROP TRIGGER keep ON bundles"),
    );
}

/// What the previous release's collector (schema 2) created in PostgreSQL, exactly.
const PG_SCHEMA_2: &str = "
CREATE TABLE collector_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE guard_actions (
    id BIGSERIAL PRIMARY KEY, at BIGINT NOT NULL, channel TEXT NOT NULL,
    version TEXT NOT NULL, action TEXT NOT NULL, detail TEXT NOT NULL,
    halt_version BIGINT NOT NULL);
CREATE TABLE reports (
    node TEXT NOT NULL, seq BIGINT NOT NULL, site TEXT NOT NULL, at BIGINT NOT NULL,
    received BIGINT NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
    generation BIGINT NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, seed BIGINT,
    dropped BIGINT NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (node, seq));
CREATE INDEX reports_release ON reports (version, generation);
INSERT INTO guard_actions (at, channel, version, action, detail, halt_version)
    VALUES (5, '/srv/c', 'v2', 'halt', 'rolled_back 3 of 3', 2);
INSERT INTO collector_meta (key, value) VALUES ('schema', 2);
";

#[test]
fn a_schema_2_postgres_database_of_the_previous_release_gains_bundles_keeping_its_rows() {
    let pg = crate::store::tests::pg_server::PgServer::start();
    let mut c = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    c.batch_execute(PG_SCHEMA_2).unwrap();
    drop(c);
    let mut s = PgStore::open(&pg.url()).unwrap();
    assert_eq!(s.actions().unwrap().len(), 1, "the guard's log is kept");
    exercise_bundles(&mut s);
    drop(s);
    let mut c = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let schema: i64 = c
        .query_one("SELECT value FROM collector_meta WHERE key = 'schema'", &[])
        .unwrap()
        .get(0);
    assert_eq!(schema, SCHEMA);
}

#[test]
fn a_schema_3_postgres_database_is_migrated_to_4_keeping_its_rows() {
    let pg = crate::store::tests::pg_server::PgServer::start();
    let sql = |q: &str| {
        postgres::Client::connect(&pg.url(), postgres::NoTls)
            .unwrap()
            .batch_execute(q)
            .unwrap()
    };
    a_schema_3_store_is_migrated(&|| Box::new(PgStore::open(&pg.url()).unwrap()), &|| {
        sql("UPDATE collector_meta SET value = 3 WHERE key = 'schema'")
    });
    let mut c = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let schema: i64 = c
        .query_one("SELECT value FROM collector_meta WHERE key = 'schema'", &[])
        .unwrap()
        .get(0);
    assert_eq!(schema, 4);
}

pub mod pg_server;

/// The schema number an SQLite collector database records.
fn sqlite_schema(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM collector_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}
