//! The publisher's side of channel metadata: make the first root, rotate it, list a channel's
//! releases in `targets.json`, and re-sign `snapshot.json` + `timestamp.json` (what a cron job
//! runs).
//!
//! **All or nothing**: every command stages its new files in one [`Publish`] transaction
//! (module `txn`): each new document is checked against its role's threshold when it is signed,
//! the whole new set is verified as it will be served (with the node's own client when it
//! includes a timestamp), and only then are the files written, each through a temporary file,
//! fsync and rename, in the order a node reads nothing half-made from (`N.root.json`,
//! `root.json`, targets, snapshot, timestamp). A wrong key, a missing key file or a failed
//! write leaves the directory byte for byte as it was. The `stage_*` functions add a change to
//! a transaction (so a command signs targets, snapshot and timestamp in one); the `write_*`
//! functions are one change in a transaction of its own.
//!
//! **Verify before signing**: every command that re-signs ([`write_targets`],
//! [`write_timestamp`], [`write_rollout`], [`rotate_root`]) first verifies the channel's
//! metadata as it is served, with the node's checks ([`super::client::served`], which states the
//! rules and limits), and works only from what verified: the versions it counts up from, the
//! rollouts `release targets` carries over and the targets a rollout edits. A file that does
//! not verify is refused, naming it, before anything is written, so the nodes' view is
//! unchanged.

mod root;
mod targets;
mod timestamp;
mod txn;

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Duration, SubsecRound, Utc};
pub use ed25519_dalek::{SigningKey, VerifyingKey};

use super::client::served::{verify_served, Served};
use super::meta::{Key, Role, Root, Targets};
use super::TrustError;
use crate::rollout::Rollout;

pub use root::{init_root, rotate_root};
pub use targets::{
    stage_delegation, stage_rollout, stage_targets, write_delegation, write_rollout, write_targets,
};
pub use timestamp::{stage_timestamp, write_timestamp};
pub use txn::Publish;

/// Default lifetime of `root.json`, in days. The defaults: root a year, targets 90 days,
/// snapshot 30 days, timestamp 7 days (re-signed daily, a node's clock may be 6 days ahead
/// and still take fresh metadata).
pub const ROOT_LIFETIME_DAYS: i64 = 365;
/// Default lifetime of `targets.json`, in days.
pub const TARGETS_LIFETIME_DAYS: i64 = 90;
/// Default lifetime of `snapshot.json`, in days.
pub const SNAPSHOT_LIFETIME_DAYS: i64 = 30;
/// Default lifetime of `timestamp.json`, in days (re-signed daily by a cron job).
pub const TIMESTAMP_LIFETIME_DAYS: i64 = 7;

/// The keys and threshold of one role.
#[derive(Debug, Clone)]
pub struct RoleSpec {
    /// The public keys that sign for the role.
    pub keys: Vec<VerifyingKey>,
    /// How many of `keys` must sign; between 1 and their number, or the root is refused.
    pub threshold: u32,
}

/// `now + d`, to the second (TUF writes whole seconds).
pub fn expires_in(d: Duration) -> DateTime<Utc> {
    (Utc::now() + d).trunc_subsecs(0)
}

pub(super) fn publish_err(what: impl Into<String>, why: impl Into<String>) -> TrustError {
    TrustError::Publish {
        what: what.into(),
        why: why.into(),
    }
}

/// The channel's current root (`DIR/root.json`), after the served metadata verified.
pub fn current_root(dir: &Path) -> Result<Root, TrustError> {
    Ok(verify_served(dir)?.root)
}

/// The signers that are keys of `role` in any of `roots`.
fn signers_for(roots: &[&Root], role: Role, signers: &[SigningKey]) -> Vec<SigningKey> {
    signers
        .iter()
        .filter(|s| {
            let id = Key::ed25519(&s.verifying_key()).id();
            roots
                .iter()
                .any(|r| r.roles.get(&role).is_some_and(|k| k.keyids.contains(&id)))
        })
        .cloned()
        .collect()
}

/// One above `version` of `role` (1 when there is none yet); the largest version has none.
fn next(role: Role, version: Option<u64>) -> Result<u64, TrustError> {
    match version {
        None => Ok(1),
        Some(v) => v
            .checked_add(1)
            .ok_or_else(|| publish_err(role.file(), format!("version {v} has no successor"))),
    }
}

/// The rollouts `targets` carry, by target path (none without targets).
fn rollouts(targets: Option<&Targets>) -> BTreeMap<String, Rollout> {
    targets
        .map(|t| {
            t.targets
                .iter()
                .filter_map(|(path, m)| {
                    let r = m.custom.as_ref()?.rollout.clone()?;
                    Some((path.clone(), r))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The verified channel a transaction started from (a refusal when the channel has no root).
fn verified(p: &Publish) -> Result<&Served, TrustError> {
    p.served().ok_or_else(|| {
        publish_err(
            p.path_of("1.root.json"),
            "no root: run `k3os-ops release root init` for this channel first",
        )
    })
}
