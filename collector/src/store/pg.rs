//! PostgreSQL (the `postgres` crate): for a collector on more than one machine.

use fleet_report::{NodeId, Opened, Verified};

use super::{
    big, outcome_of, BundleColumns, BundleKnown, BundleRow, BundleSelection, Columns, GuardAction,
    Known, RawBundle, Row, SchemaStep, Store, StoreError, SCHEMA,
};

/// Reports in a PostgreSQL database.
pub struct PgStore {
    db: String,
    client: postgres::Client,
}

const META: &str =
    "CREATE TABLE IF NOT EXISTS collector_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);";

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS guard_actions (
    id BIGSERIAL PRIMARY KEY, at BIGINT NOT NULL, channel TEXT NOT NULL,
    version TEXT NOT NULL, action TEXT NOT NULL, detail TEXT NOT NULL,
    halt_version BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS reports (
    node TEXT NOT NULL, seq BIGINT NOT NULL, site TEXT NOT NULL, at BIGINT NOT NULL,
    received BIGINT NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
    generation BIGINT NOT NULL, kind TEXT NOT NULL, outcome TEXT NOT NULL, seed BIGINT,
    dropped BIGINT NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (node, seq));
CREATE INDEX IF NOT EXISTS reports_release ON reports (version, generation);
CREATE TABLE IF NOT EXISTS bundles (
    node TEXT NOT NULL, version TEXT NOT NULL, attempt BIGINT NOT NULL, site TEXT NOT NULL,
    generation BIGINT NOT NULL, slot TEXT NOT NULL, time TEXT NOT NULL, failure TEXT NOT NULL,
    why TEXT NOT NULL, received BIGINT NOT NULL, size BIGINT NOT NULL, body BYTEA NOT NULL,
    PRIMARY KEY (node, version, attempt));
";

const BUNDLE_COLUMNS: &str =
    "node, site, version, generation, attempt, slot, time, failure, why, received, size";

/// A `bundles` row of [`BUNDLE_COLUMNS`], as read.
fn raw_bundle(r: &postgres::Row) -> RawBundle {
    RawBundle {
        node: r.get(0),
        site: r.get(1),
        version: r.get(2),
        generation: r.get(3),
        attempt: r.get(4),
        slot: r.get(5),
        time: r.get(6),
        failure: r.get(7),
        why: r.get(8),
        received: r.get(9),
        size: r.get(10),
    }
}

/// `url` without a password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..s + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

impl PgStore {
    /// Connect (no TLS: put the database on a private network or a local socket) and create or
    /// check the schema.
    pub fn open(url: &str) -> Result<PgStore, StoreError> {
        let db = redact(url);
        let err = |what: &str, e: postgres::Error| StoreError {
            db: db.clone(),
            what: format!("{what}: {e}"),
        };
        let mut client =
            postgres::Client::connect(url, postgres::NoTls).map_err(|e| err("connect", e))?;
        client
            .batch_execute(META)
            .map_err(|e| err("create schema", e))?;
        let schema: Option<i64> = client
            .query_opt("SELECT value FROM collector_meta WHERE key = 'schema'", &[])
            .map_err(|e| err("read schema", e))?
            .map(|r| r.get(0));
        let sql = match super::schema_step(&db, schema)? {
            SchemaStep::Current => "",
            SchemaStep::New => {
                "INSERT INTO collector_meta (key, value) VALUES ('schema', $1)
                 ON CONFLICT (key) DO NOTHING"
            }
            SchemaStep::Migrate => "UPDATE collector_meta SET value = $1 WHERE key = 'schema'",
        };
        client
            .batch_execute(CREATE)
            .map_err(|e| err("create schema", e))?;
        if !sql.is_empty() {
            client
                .execute(sql, &[&SCHEMA])
                .map_err(|e| err("write schema", e))?;
        }
        Ok(PgStore { db, client })
    }

    fn err(&self, what: &str, e: postgres::Error) -> StoreError {
        StoreError {
            db: self.db.clone(),
            what: format!("{what}: {e}"),
        }
    }
}

impl Store for PgStore {
    fn known(&mut self, node: &NodeId, seq: u64) -> Result<Known, StoreError> {
        let node = node.to_string();
        let row = self.client.query_one(
            "SELECT MAX(seq), COUNT(*), (SELECT body FROM reports WHERE node = $1 AND seq = $2)
                 FROM reports WHERE node = $1",
            &[&node, &big(seq)],
        );
        let row = row.map_err(|e| self.err("read node", e))?;
        let max: Option<i64> = row.get(0);
        let rows: i64 = row.get(1);
        Ok(Known {
            max_seq: max.map(|m| m as u64),
            same_seq: row.get(2),
            rows: rows as u64,
        })
    }

    fn insert(&mut self, v: &Verified, received: u64) -> Result<(), StoreError> {
        let c = Columns::of(v);
        let r = self.client.execute(
            "INSERT INTO reports (node, seq, site, at, received, channel, version, generation,
             kind, outcome, seed, dropped, body) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)",
            &[
                &c.node, &c.seq, &c.site, &c.at, &big(received), &c.channel, &c.version,
                &c.generation, &c.kind, &c.outcome, &c.seed, &c.dropped, &v.bytes,
            ],
        );
        r.map_err(|e| self.err("insert report", e))?;
        Ok(())
    }

    fn rows(&mut self) -> Result<Vec<Row>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT node, site, seq, at, received, channel, version, generation, outcome,
                 seed, dropped FROM reports ORDER BY node, seq",
                &[],
            )
            .map_err(|e| self.err("read reports", e))?;
        rows.iter()
            .map(|r| {
                Ok(Row {
                    node: r.get(0),
                    site: r.get(1),
                    seq: r.get::<_, i64>(2) as u64,
                    at: r.get::<_, i64>(3) as u64,
                    received: r.get::<_, i64>(4) as u64,
                    channel: r.get(5),
                    version: r.get(6),
                    generation: r.get::<_, i64>(7) as u64,
                    outcome: outcome_of(&self.db, r.get(8))?,
                    seed: r
                        .get::<_, Option<i64>>(9)
                        .and_then(|s| u32::try_from(s).ok()),
                    dropped: r.get::<_, i64>(10) as u64,
                })
            })
            .collect()
    }

    fn record(&mut self, a: &GuardAction) -> Result<(), StoreError> {
        let r = self.client.execute(
            "INSERT INTO guard_actions (at, channel, version, action, detail, halt_version)
             VALUES ($1,$2,$3,$4,$5,$6)",
            &[
                &big(a.at),
                &a.channel,
                &a.version,
                &a.action,
                &a.detail,
                &big(a.halt_version),
            ],
        );
        r.map_err(|e| self.err("record the guard's action", e))?;
        Ok(())
    }

    fn actions(&mut self) -> Result<Vec<GuardAction>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT at, channel, version, action, detail, halt_version FROM guard_actions
                 ORDER BY id",
                &[],
            )
            .map_err(|e| self.err("read the guard's actions", e))?;
        Ok(rows
            .iter()
            .map(|r| GuardAction {
                at: r.get::<_, i64>(0) as u64,
                channel: r.get(1),
                version: r.get(2),
                action: r.get(3),
                detail: r.get(4),
                halt_version: r.get::<_, i64>(5) as u64,
            })
            .collect())
    }

    fn bundle_known(&mut self, node: &NodeId, body: &[u8]) -> Result<BundleKnown, StoreError> {
        let row = self.client.query_one(
            "SELECT COUNT(*), COALESCE(SUM(size), 0)::BIGINT, COALESCE(BOOL_OR(body = $2), false)
                 FROM bundles WHERE node = $1",
            &[&node.to_string(), &body],
        );
        let row = row.map_err(|e| self.err("read node's bundles", e))?;
        Ok(BundleKnown {
            count: row.get::<_, i64>(0) as u64,
            bytes: row.get::<_, i64>(1) as u64,
            resend: row.get(2),
        })
    }

    fn insert_bundle(&mut self, b: &Opened, site: &str, received: u64) -> Result<(), StoreError> {
        let c = BundleColumns::of(b, site, received);
        let r = self.client.execute(
            &format!(
                "INSERT INTO bundles ({BUNDLE_COLUMNS}, body)
                 VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)"
            ),
            &[
                &c.node,
                &c.site,
                &c.version,
                &c.generation,
                &c.attempt,
                &c.slot,
                &c.time,
                &c.failure,
                &c.why,
                &c.received,
                &c.size,
                &c.body,
            ],
        );
        r.map_err(|e| self.err("insert bundle", e))?;
        Ok(())
    }

    fn bundles(&mut self) -> Result<Vec<BundleRow>, StoreError> {
        let rows = self
            .client
            .query(
                &format!("SELECT {BUNDLE_COLUMNS} FROM bundles ORDER BY node, version, attempt"),
                &[],
            )
            .map_err(|e| self.err("read bundles", e))?;
        rows.iter()
            .map(|r| raw_bundle(r).into_row(&self.db))
            .collect()
    }

    fn bundle_body(
        &mut self,
        node: &str,
        version: &str,
        attempt: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let r = self.client.query_opt(
            "SELECT body FROM bundles WHERE node = $1 AND version = $2 AND attempt = $3",
            &[&node, &version, &i64::from(attempt)],
        );
        Ok(r.map_err(|e| self.err("read bundle", e))?.map(|r| r.get(0)))
    }

    fn delete_bundles(&mut self, sel: &BundleSelection) -> Result<Vec<BundleRow>, StoreError> {
        let db = self.db.clone();
        let err = |e: postgres::Error| sel.delete_failed(&db, e);
        // One statement in one transaction: dropped uncommitted on any error, rolled back.
        let mut tx = self.client.transaction().map_err(err)?;
        let found = tx
            .query(
                &format!(
                    "DELETE FROM bundles WHERE node = $1 AND ($2::TEXT IS NULL OR version = $2)
                     AND ($3::BIGINT IS NULL OR received < $3) RETURNING {BUNDLE_COLUMNS}"
                ),
                &[
                    &sel.node.to_string(),
                    &sel.version,
                    &sel.received_before.map(big),
                ],
            )
            .map_err(err)?;
        let raw: Vec<RawBundle> = found.iter().map(raw_bundle).collect();
        tx.commit().map_err(err)?;
        RawBundle::deleted(&db, raw)
    }

    fn name(&self) -> &str {
        &self.db
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            super::redact("postgres://me:secret@db:5432/r"),
            "postgres://me@db:5432/r"
        );
        assert_eq!(super::redact("postgres://db/r"), "postgres://db/r");
    }
}
