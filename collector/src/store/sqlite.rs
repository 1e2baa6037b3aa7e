//! SQLite (rusqlite, SQLite bundled): the embedded default, one file.

use std::path::Path;

use fleet_report::{NodeId, Opened, Verified};
use rusqlite::{params, Connection, OptionalExtension};

use super::{
    big, outcome_of, BundleColumns, BundleKnown, BundleRow, BundleSelection, Columns, GuardAction,
    Known, RawBundle, Row, SchemaStep, Store, StoreError, SCHEMA,
};

/// Reports in one SQLite file (WAL journal).
pub struct SqliteStore {
    db: String,
    conn: Connection,
}

const META: &str =
    "CREATE TABLE IF NOT EXISTS collector_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);";

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS guard_actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, channel TEXT NOT NULL,
    version TEXT NOT NULL, action TEXT NOT NULL, detail TEXT NOT NULL,
    halt_version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reports (
    node TEXT NOT NULL, seq INTEGER NOT NULL, site TEXT NOT NULL, at INTEGER NOT NULL,
    received INTEGER NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
    generation INTEGER NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, seed INTEGER,
    dropped INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (node, seq));
CREATE INDEX IF NOT EXISTS reports_release ON reports (version, generation);
CREATE TABLE IF NOT EXISTS bundles (
    node TEXT NOT NULL, version TEXT NOT NULL, attempt INTEGER NOT NULL, site TEXT NOT NULL,
    generation INTEGER NOT NULL, slot TEXT NOT NULL, time TEXT NOT NULL, failure TEXT NOT NULL,
    why TEXT NOT NULL, received INTEGER NOT NULL, size INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (node, version, attempt));
";

const BUNDLE_COLUMNS: &str =
    "node, site, version, generation, attempt, slot, time, failure, why, received, size";

/// A `bundles` row of [`BUNDLE_COLUMNS`], as read.
fn raw_bundle(r: &rusqlite::Row) -> rusqlite::Result<RawBundle> {
    Ok(RawBundle {
        node: r.get(0)?,
        site: r.get(1)?,
        version: r.get(2)?,
        generation: r.get(3)?,
        attempt: r.get(4)?,
        slot: r.get(5)?,
        time: r.get(6)?,
        failure: r.get(7)?,
        why: r.get(8)?,
        received: r.get(9)?,
        size: r.get(10)?,
    })
}

impl SqliteStore {
    /// Open or create the database file at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let db = format!("sqlite:{}", path.display());
        let err = |what: &str, e: rusqlite::Error| StoreError {
            db: db.clone(),
            what: format!("{what}: {e}"),
        };
        let conn = Connection::open(path).map_err(|e| err("open", e))?;
        // WAL with NORMAL sync: no fsync per report (the ingest goal is 1,000 reports/s); a
        // power cut of this machine may lose the last acknowledged reports, never the file.
        conn.pragma_update(None, "journal_mode", "WAL")
            .and_then(|()| conn.pragma_update(None, "synchronous", "NORMAL"))
            .and_then(|()| conn.execute_batch(META))
            .map_err(|e| err("create schema", e))?;
        let schema: Option<i64> = conn
            .query_row(
                "SELECT value FROM collector_meta WHERE key = 'schema'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| err("read schema", e))?;
        let sql = match super::schema_step(&db, schema)? {
            SchemaStep::Current => "",
            SchemaStep::New => "INSERT INTO collector_meta (key, value) VALUES ('schema', ?1)",
            SchemaStep::Migrate => "UPDATE collector_meta SET value = ?1 WHERE key = 'schema'",
        };
        conn.execute_batch(CREATE)
            .map_err(|e| err("create schema", e))?;
        if !sql.is_empty() {
            conn.execute(sql, [SCHEMA])
                .map_err(|e| err("write schema", e))?;
        }
        Ok(SqliteStore { db, conn })
    }

    fn err(&self, what: &str, e: rusqlite::Error) -> StoreError {
        StoreError {
            db: self.db.clone(),
            what: format!("{what}: {e}"),
        }
    }
}

impl Store for SqliteStore {
    fn known(&mut self, node: &NodeId, seq: u64) -> Result<Known, StoreError> {
        let node = node.to_string();
        let (max, rows): (Option<i64>, i64) = self
            .conn
            .prepare_cached("SELECT MAX(seq), COUNT(*) FROM reports WHERE node = ?1")
            .and_then(|mut s| s.query_row([&node], |r| Ok((r.get(0)?, r.get(1)?))))
            .map_err(|e| self.err("read node", e))?;
        let same_seq: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT body FROM reports WHERE node = ?1 AND seq = ?2")
            .and_then(|mut s| {
                s.query_row(params![node, big(seq)], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err("read report", e))?;
        Ok(Known {
            max_seq: max.map(|m| m as u64),
            same_seq,
            rows: rows as u64,
        })
    }

    fn insert(&mut self, v: &Verified, received: u64) -> Result<(), StoreError> {
        let c = Columns::of(v);
        self.conn
            .prepare_cached(
                "INSERT INTO reports (node, seq, site, at, received, channel, version, generation,
                 kind, outcome, seed, dropped, body) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    c.node, c.seq, c.site, c.at, big(received), c.channel, c.version,
                    c.generation, c.kind, c.outcome, c.seed, c.dropped, v.bytes
                ])
            })
            .map_err(|e| self.err("insert report", e))?;
        Ok(())
    }

    fn rows(&mut self) -> Result<Vec<Row>, StoreError> {
        let db = self.db.clone();
        let mut s = self
            .conn
            .prepare(
                "SELECT node, site, seq, at, received, channel, version, generation, outcome,
                 seed, dropped FROM reports ORDER BY node, seq",
            )
            .map_err(|e| self.err("read reports", e))?;
        let raw = s
            .query_map([], |r| {
                Ok((
                    (
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ),
                    (
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, String>(5)?,
                    ),
                    (
                        r.get::<_, String>(6)?,
                        r.get::<_, i64>(7)?,
                        r.get::<_, String>(8)?,
                    ),
                    (r.get::<_, Option<i64>>(9)?, r.get::<_, i64>(10)?),
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| StoreError {
                db: db.clone(),
                what: format!("read reports: {e}"),
            })?;
        raw.into_iter()
            .map(
                |(
                    (node, site, seq),
                    (at, received, channel),
                    (version, generation, outcome),
                    (seed, dropped),
                )| {
                    Ok(Row {
                        node,
                        site,
                        seq: seq as u64,
                        at: at as u64,
                        received: received as u64,
                        channel,
                        version,
                        generation: generation as u64,
                        outcome: outcome_of(&db, &outcome)?,
                        seed: seed.and_then(|s| u32::try_from(s).ok()),
                        dropped: dropped as u64,
                    })
                },
            )
            .collect()
    }

    fn record(&mut self, a: &GuardAction) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO guard_actions (at, channel, version, action, detail, halt_version)
                 VALUES (?1,?2,?3,?4,?5,?6)",
                params![
                    big(a.at),
                    a.channel,
                    a.version,
                    a.action,
                    a.detail,
                    big(a.halt_version)
                ],
            )
            .map_err(|e| self.err("record the guard's action", e))?;
        Ok(())
    }

    fn actions(&mut self) -> Result<Vec<GuardAction>, StoreError> {
        let db = self.db.clone();
        let mut s = self
            .conn
            .prepare(
                "SELECT at, channel, version, action, detail, halt_version FROM guard_actions
                 ORDER BY id",
            )
            .map_err(|e| self.err("read the guard's actions", e))?;
        let rows = s
            .query_map([], |r| {
                Ok(GuardAction {
                    at: r.get::<_, i64>(0)? as u64,
                    channel: r.get(1)?,
                    version: r.get(2)?,
                    action: r.get(3)?,
                    detail: r.get(4)?,
                    halt_version: r.get::<_, i64>(5)? as u64,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>());
        rows.map_err(|e| StoreError {
            db,
            what: format!("read the guard's actions: {e}"),
        })
    }

    fn bundle_known(&mut self, node: &NodeId, body: &[u8]) -> Result<BundleKnown, StoreError> {
        let (count, bytes, resend): (i64, i64, bool) = self
            .conn
            .prepare_cached(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), COALESCE(MAX(body = ?2), 0)
                 FROM bundles WHERE node = ?1",
            )
            .and_then(|mut s| {
                s.query_row(params![node.to_string(), body], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
            })
            .map_err(|e| self.err("read node's bundles", e))?;
        Ok(BundleKnown {
            resend,
            count: count as u64,
            bytes: bytes as u64,
        })
    }

    fn insert_bundle(&mut self, b: &Opened, site: &str, received: u64) -> Result<(), StoreError> {
        let c = BundleColumns::of(b, site, received);
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO bundles ({BUNDLE_COLUMNS}, body)
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    c.node,
                    c.site,
                    c.version,
                    c.generation,
                    c.attempt,
                    c.slot,
                    c.time,
                    c.failure,
                    c.why,
                    c.received,
                    c.size,
                    c.body
                ])
            })
            .map_err(|e| self.err("insert bundle", e))?;
        Ok(())
    }

    fn bundles(&mut self) -> Result<Vec<BundleRow>, StoreError> {
        let db = self.db.clone();
        let raw = self
            .conn
            .prepare(&format!(
                "SELECT {BUNDLE_COLUMNS} FROM bundles ORDER BY node, version, attempt"
            ))
            .and_then(|mut s| {
                s.query_map([], raw_bundle)
                    .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            })
            .map_err(|e| self.err("read bundles", e))?;
        raw.into_iter().map(|r| r.into_row(&db)).collect()
    }

    fn bundle_body(
        &mut self,
        node: &str,
        version: &str,
        attempt: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT body FROM bundles WHERE node = ?1 AND version = ?2 AND attempt = ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![node, version, i64::from(attempt)], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err("read bundle", e))
    }

    fn delete_bundles(&mut self, sel: &BundleSelection) -> Result<Vec<BundleRow>, StoreError> {
        let db = self.db.clone();
        let err = |e: rusqlite::Error| sel.delete_failed(&db, e);
        // One statement in one transaction: dropped uncommitted on any error, rolled back.
        let tx = self.conn.transaction().map_err(err)?;
        let raw = tx
            .prepare(&format!(
                "DELETE FROM bundles WHERE node = ?1 AND (?2 IS NULL OR version = ?2)
                 AND (?3 IS NULL OR received < ?3) RETURNING {BUNDLE_COLUMNS}"
            ))
            .and_then(|mut s| {
                s.query_map(
                    params![
                        sel.node.to_string(),
                        sel.version,
                        sel.received_before.map(big)
                    ],
                    raw_bundle,
                )
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            })
            .map_err(err)?;
        tx.commit().map_err(err)?;
        RawBundle::deleted(&db, raw)
    }

    fn name(&self) -> &str {
        &self.db
    }
}
