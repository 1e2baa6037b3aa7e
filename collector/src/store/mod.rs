//! Where reports are kept: one trait, SQLite and PostgreSQL behind it.
//!
//! Schema version 4 (both backends; `collector_meta.schema` holds the number, a newer one is
//! refused naming both, before anything is created or changed): table `reports`, one row per
//! stored report, keyed by `(node, seq)`, with the report's fields as columns (`outcome` as its
//! JSON) and `body`, the envelope exactly as received; table `guard_actions`, one row per thing
//! the guard did ([`GuardAction`]); table `bundles`, one row per failure bundle, keyed by
//! `(node, version, attempt)`, with the fields a view needs ([`BundleRow`]) and `body`, the
//! sealed envelope exactly as received.
//!
//! Older schemas are migrated on open by creating the tables they lack and recording 4; their
//! rows are kept as they are. Schema 1 (`reports` only) gains `guard_actions` and `bundles`,
//! schema 2 (`reports`, `guard_actions`) gains `bundles`. Schema 4 has the tables of 3: its
//! `reports.outcome` may hold a wait for a retry (report format 2), which a collector of
//! schema 3 cannot read, so the number moves and such a collector refuses the database by
//! name (nothing changed) rather than failing on a row later.

mod bundles;
mod pg;
mod sqlite;

use fleet_report::{NodeId, Opened, Outcome, Verified};
use serde::Serialize;

pub(crate) use bundles::{BundleColumns, RawBundle};
pub use bundles::{BundleKnown, BundleRow, BundleSelection};
pub use pg::PgStore;
pub use sqlite::SqliteStore;

/// The schema version this build writes and reads.
pub const SCHEMA: i64 = 4;

/// What opening a database must do about its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemaStep {
    /// A new database: create everything, record [`SCHEMA`].
    New,
    /// An older schema (1 to 3): create the tables it lacks, record [`SCHEMA`].
    Migrate,
    /// Ours: nothing.
    Current,
}

/// What the schema number a database records means to this build; an error naming both
/// numbers for a newer one (nothing is changed). The one rule both back ends apply.
pub(crate) fn schema_step(db: &str, found: Option<i64>) -> Result<SchemaStep, StoreError> {
    match found {
        None => Ok(SchemaStep::New),
        Some(1..=3) => Ok(SchemaStep::Migrate),
        Some(SCHEMA) => Ok(SchemaStep::Current),
        Some(n) => Err(StoreError {
            db: db.to_string(),
            what: format!("schema {n}, this build reads schema {SCHEMA}: nothing was changed"),
        }),
    }
}

/// One thing the guard did (`k3os-ops collector guard`), as recorded and shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardAction {
    /// When (Unix seconds).
    pub at: u64,
    /// The channel directory the guard wrote to.
    pub channel: String,
    /// The release concerned (empty for a run that only re-signed `halt.json`).
    pub version: String,
    /// `halt` (it signed a halt of the release), `lifted` (it saw the publisher lift its
    /// halt), `refresh` (it only re-signed `halt.json` to keep it fresh).
    pub action: String,
    /// The criteria and counts behind a halt, or what it saw.
    pub detail: String,
    /// The `halt.json` version it wrote (0: none).
    pub halt_version: u64,
}

/// A store failed; the text names the database and the operation.
#[derive(Debug, thiserror::Error)]
#[error("{db}: {what}")]
pub struct StoreError {
    /// The database (`sqlite:PATH`, or the PostgreSQL URL without its password).
    pub db: String,
    /// What failed, with the driver's message.
    pub what: String,
}

/// What a store holds of one node, for the admission checks (module `admit`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// The newest number stored.
    pub max_seq: Option<u64>,
    /// The envelope stored under the number being admitted, if any.
    pub same_seq: Option<Vec<u8>>,
    /// Reports stored.
    pub rows: u64,
}

/// One stored report, as fleet status reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The node id.
    pub node: String,
    /// Its site.
    pub site: String,
    /// The report's number.
    pub seq: u64,
    /// When the node reached the outcome (Unix seconds, the node's clock).
    pub at: u64,
    /// When the collector stored it (Unix seconds).
    pub received: u64,
    /// The channel.
    pub channel: String,
    /// The release's version.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// The outcome.
    pub outcome: Outcome,
    /// The node's rollout seed.
    pub seed: Option<u32>,
    /// The node's running total of reports dropped unsent.
    pub dropped: u64,
}

/// A database of reports.
pub trait Store: Send {
    /// What is stored of `node`, with the envelope under `seq` if there is one.
    fn known(&mut self, node: &NodeId, seq: u64) -> Result<Known, StoreError>;
    /// Store a verified report, received at `received` (Unix seconds).
    fn insert(&mut self, v: &Verified, received: u64) -> Result<(), StoreError>;
    /// Every stored report, by node then number.
    fn rows(&mut self) -> Result<Vec<Row>, StoreError>;
    /// Record what the guard did.
    fn record(&mut self, a: &GuardAction) -> Result<(), StoreError>;
    /// Everything the guard did, oldest first.
    fn actions(&mut self) -> Result<Vec<GuardAction>, StoreError>;
    /// What is stored of `node`'s bundles, and whether `body` is one of them byte for byte.
    fn bundle_known(&mut self, node: &NodeId, body: &[u8]) -> Result<BundleKnown, StoreError>;
    /// Store an opened bundle of a node enrolled for `site`, received at `received`.
    fn insert_bundle(&mut self, b: &Opened, site: &str, received: u64) -> Result<(), StoreError>;
    /// Every stored bundle (without its bytes), by node, version, attempt.
    fn bundles(&mut self) -> Result<Vec<BundleRow>, StoreError>;
    /// The sealed envelope of one stored bundle, as received.
    fn bundle_body(
        &mut self,
        node: &str,
        version: &str,
        attempt: u32,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// Remove the stored bundles `sel` selects, in one transaction: all of them are removed
    /// and returned (by version, then attempt), or, on any error, none. What frees a node's
    /// bundle quota.
    fn delete_bundles(&mut self, sel: &BundleSelection) -> Result<Vec<BundleRow>, StoreError>;
    /// The database, for messages.
    fn name(&self) -> &str;

    /// The bundles the views show for `rows` (every stored report): the newest of each failed
    /// node about each release ([`crate::cause::shown`]), opened again from their sealed bytes
    /// (the node's signature checked again, inflated within the limits). Only those are
    /// opened, so a page costs the failed nodes' count, not every bundle kept.
    fn failed_bundles(&mut self, rows: &[Row]) -> Result<Vec<fleet_report::Bundle>, StoreError> {
        let all = self.bundles()?;
        let db = self.name().to_string();
        let mut out = Vec::new();
        for r in crate::cause::shown(rows, &all) {
            let what = |e: String| StoreError {
                db: db.clone(),
                what: format!(
                    "stored bundle of node {} for attempt {} of {:?}: {e}",
                    r.node,
                    r.attempt,
                    r.version.escape_debug().to_string()
                ),
            };
            let body = self
                .bundle_body(&r.node, &r.version, r.attempt)?
                .ok_or_else(|| what("gone while read".into()))?;
            let opened = fleet_report::open_bundle(&body).map_err(|e| what(e.to_string()))?;
            out.push(opened.bundle);
        }
        Ok(out)
    }
}

/// Open (and create or migrate) the store `url` names: `sqlite:PATH` or a
/// `postgres://`/`postgresql://` URL.
pub fn open(url: &str) -> Result<Box<dyn Store>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        return Ok(Box::new(SqliteStore::open(std::path::Path::new(path))?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Box::new(PgStore::open(url)?));
    }
    Err(StoreError {
        db: url.escape_debug().to_string(),
        what: "not a database URL: expected sqlite:PATH or postgres://…".into(),
    })
}

/// The columns of a report, shared by both backends.
pub(crate) struct Columns {
    pub node: String,
    pub seq: i64,
    pub site: String,
    pub at: i64,
    pub channel: String,
    pub version: String,
    pub generation: i64,
    pub kind: &'static str,
    pub outcome: String,
    pub seed: Option<i64>,
    pub dropped: i64,
}

/// u64 → i64 for a BIGINT column, saturating (the admit step refuses numbers above i64::MAX;
/// times and counts never get there).
pub(crate) fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Columns {
    pub(crate) fn of(v: &Verified) -> Columns {
        let r = &v.report;
        Columns {
            node: r.node.to_string(),
            seq: big(r.seq),
            site: r.site.clone(),
            at: big(r.at),
            channel: r.channel.clone(),
            version: r.version.clone(),
            generation: big(r.generation),
            kind: r.outcome.kind(),
            outcome: serde_json::to_string(&r.outcome).expect("outcome serializes"),
            seed: r.seed.map(i64::from),
            dropped: big(r.dropped),
        }
    }
}

/// A row's outcome column back to the outcome (written by [`Columns::of`]).
pub(crate) fn outcome_of(db: &str, json: &str) -> Result<Outcome, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError {
        db: db.to_string(),
        what: format!(
            "stored outcome {:?} does not parse: {e}",
            json.escape_debug().to_string()
        ),
    })
}

#[cfg(test)]
pub(crate) mod tests;
