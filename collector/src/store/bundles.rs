//! What the store keeps of a failure bundle ([`fleet_report::Bundle`]): the fields a view
//! needs as columns, and the sealed envelope exactly as received (what a download serves, and
//! what anyone can verify again with the node's key).

use fleet_report::{Failure, NodeId, Opened};
use serde::Serialize;

use super::{big, StoreError};

/// One stored bundle, as `rollout-status` and the dashboard read it (the sealed bytes are read
/// on their own, by [`super::Store::bundle_body`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BundleRow {
    /// The node id.
    pub node: String,
    /// Its site (from the allow-list when the bundle was stored).
    pub site: String,
    /// The release attempted.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Which attempt of that release on the node.
    pub attempt: u32,
    /// The slot it was tried in.
    pub slot: String,
    /// When the node wrote it (RFC 3339, the node's clock, as the node wrote it).
    pub time: String,
    /// How the attempt failed.
    pub failure: Failure,
    /// The one-line why.
    pub why: String,
    /// When the collector stored it (Unix seconds).
    pub received: u64,
    /// The sealed envelope's size in bytes.
    pub size: u64,
}

/// Which of one node's stored bundles the publisher removes (`k3os-ops collector
/// delete-bundles`): all of them, or only those of one release, or only those received before
/// a time; both filters together narrow it further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSelection {
    /// The node.
    pub node: NodeId,
    /// Only the bundles of this release version (None: of every release).
    pub version: Option<String>,
    /// Only the bundles the collector received before this time (Unix seconds, the
    /// collector's clock: the node's own `time` may be wrong; None: at any time).
    pub received_before: Option<u64>,
}

impl BundleSelection {
    /// The error of a deletion that failed in database `db` (the transaction rolled back).
    pub(crate) fn delete_failed(&self, db: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError {
            db: db.to_string(),
            what: format!(
                "delete the bundles of node {}: {e}; nothing was removed",
                self.node
            ),
        }
    }
}

/// What a store holds of one node's bundles, for the admission checks made before a bundle
/// is inflated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleKnown {
    /// These exact bytes are stored for the node already (a resend).
    pub resend: bool,
    /// Bundles stored for the node.
    pub count: u64,
    /// Their sealed bytes, summed.
    pub bytes: u64,
}

/// The columns of a bundle, shared by both backends.
pub(crate) struct BundleColumns<'a> {
    pub node: String,
    pub site: &'a str,
    pub version: &'a str,
    pub generation: i64,
    pub attempt: i64,
    pub slot: &'a str,
    pub time: &'a str,
    pub failure: String,
    pub why: &'a str,
    pub received: i64,
    pub size: i64,
    pub body: &'a [u8],
}

impl<'a> BundleColumns<'a> {
    pub(crate) fn of(o: &'a Opened, site: &'a str, received: u64) -> BundleColumns<'a> {
        let b = &o.bundle;
        BundleColumns {
            node: b.node.to_string(),
            site,
            version: &b.version,
            generation: big(b.generation),
            attempt: i64::from(b.attempt),
            slot: &b.slot,
            time: &b.time,
            failure: serde_json::to_string(&b.failure).expect("failure serializes"),
            why: &b.why,
            received: big(received),
            size: big(o.bytes.len() as u64),
            body: &o.bytes,
        }
    }
}

/// A `bundles` row as both backends read it, before its failure column is parsed.
pub(crate) struct RawBundle {
    pub node: String,
    pub site: String,
    pub version: String,
    pub generation: i64,
    pub attempt: i64,
    pub slot: String,
    pub time: String,
    pub failure: String,
    pub why: String,
    pub received: i64,
    pub size: i64,
}

impl RawBundle {
    /// The row as the views read it; an error naming `db` when its failure does not parse.
    pub(crate) fn into_row(self, db: &str) -> Result<BundleRow, StoreError> {
        Ok(BundleRow {
            failure: failure_of(db, &self.failure)?,
            node: self.node,
            site: self.site,
            version: self.version,
            generation: self.generation as u64,
            attempt: u32::try_from(self.attempt).unwrap_or(u32::MAX),
            slot: self.slot,
            time: self.time,
            why: self.why,
            received: self.received as u64,
            size: self.size as u64,
        })
    }

    /// What a deletion returned, as the views read it, by release and attempt.
    pub(crate) fn deleted(db: &str, raw: Vec<RawBundle>) -> Result<Vec<BundleRow>, StoreError> {
        let mut rows = raw
            .into_iter()
            .map(|r| r.into_row(db))
            .collect::<Result<Vec<_>, _>>()?;
        rows.sort_by(|a, b| (&a.version, a.attempt).cmp(&(&b.version, b.attempt)));
        Ok(rows)
    }
}

/// A row's failure column back to the failure (written by [`BundleColumns::of`]).
pub(crate) fn failure_of(db: &str, json: &str) -> Result<Failure, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError {
        db: db.to_string(),
        what: format!(
            "stored failure {:?} does not parse: {e}",
            json.escape_debug().to_string()
        ),
    })
}
