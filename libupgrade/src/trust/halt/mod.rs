//! The halt: a stop of a release's rollout, signed by a key that can only stop it (the
//! collector's guard holds it), which every node honours at its next poll as it honours the
//! publisher's pause.
//!
//! # Format
//! The publisher delegates, in `targets.json`, a TUF *delegated targets role* named `halt`
//! (`delegations.roles`: the guard's keys, a threshold, `paths: ["halt/*"]`, terminating);
//! python-tuf's `Root` accepts no role beyond the four top-level ones, so a delegation is the
//! standard place for it, and TUF clients that do not look for `halt/*` targets (python-tuf,
//! nodes of earlier releases) skip it. The guard publishes `halt.json`, a targets document of
//! that role:
//! ```json
//! {"signed":{"_type":"targets","spec_version":"1.0.0","version":3,"expires":"…",
//!   "targets":{"halt/v2":{"length":1234,"hashes":{"sha256":"<the manifest's>"},
//!     "custom":{"halt":{"since":"2026-12-08T06:00:00Z","reason":"rolled_back 4 of 10"}}}}},
//!  "signatures":[…]}
//! ```
//! Each target names one release (`halt/VERSION`) and binds the halt to that release's exact
//! manifest: its length and sha256 must equal those of a target the publisher's targets list,
//! or the entry holds nothing.
//!
//! # Why the guard's key can only stop (the node's rules, [`verify`] and [`apply`])
//! - **It cannot publish a release**: releases are read from the top-level targets only; a
//!   `halt.json` listing any path outside `halt/` is refused as a whole, and `halt/` entries
//!   are never releases.
//! - **It cannot widen a rollout**: an entry carries a time and a reason, nothing else is read;
//!   its only effect is [`crate::rollout::Rollout::paused`] set where it was unset, which holds
//!   nodes that have not staged the release and admits no one.
//! - **It cannot lift the publisher's pause** (nor a withdrawal): a halt only adds a hold; no
//!   entry, and no absent entry, removes one.
//! - **It cannot lift its own halt once nodes saw it**: a node records the highest `halt.json`
//!   version it verified (per the delegation's keys) and refuses a lower one, and refuses a
//!   missing `halt.json` after it saw one (an old halt file replayed, or the file deleted, is
//!   a [`TrustError::Halt`]: the node updates nothing from that channel). Only the publisher
//!   lifts a halt, with the targets keys ([`crate::rollout::Rollout::halt_lifted`], `release
//!   resume`); an entry whose `since` is at or before that is inert, so a replayed old halt
//!   does not stop the resumed rollout either.
//! - **Its signature on anything else counts for nothing**: its keys are in no top-level role.
//!
//! # The snapshot
//! TUF lists a delegated role's version in `snapshot.json`, signed by the snapshot key. The
//! guard holds no snapshot key, so `halt.json` is outside the snapshot and is fetched on every
//! poll of a channel that delegates `halt` (one more small request: three per poll instead of
//! two). Freshness comes from the halt's own version and expiry instead: the guard re-signs
//! `halt.json` at every run, and an expired one is refused (the node then updates nothing
//! from the channel: a guard that stopped running stops the rollouts it watches, as a
//! timestamp that is not re-signed does). The cost of leaving the snapshot: a mirror can
//! withhold a *newer* halt from a node that never saw it, until the served one expires —
//! which only lets the publisher's own schedule go on, the open loop there was before the
//! guard. python-tuf reads such a channel (its refresh reads only top-level metadata, and a
//! release's target is found in the top-level targets before any delegation is searched).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::meta::{self, Envelope, Key, RoleKeys, Targets};
use super::MetaSource;
use super::TrustError;
use crate::rollout::{Pause, Rollout};

/// The delegated role's name (`halt`) in `targets.json`'s `delegations`.
pub const HALT_ROLE: &str = "halt";
/// The file the guard publishes in the channel, next to `targets.json`.
pub const HALT_FILE: &str = "halt.json";
/// Every target of the halt role lies under this prefix.
pub const HALT_PREFIX: &str = "halt/";
/// The `paths` the publisher delegates to the halt role.
pub const HALT_PATHS: &str = "halt/*";
/// Largest `halt.json` read.
pub const MAX_HALT_BYTES: u64 = 256 << 10;

/// `halt.json`'s `signed` object (a TUF targets document of the `halt` role).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltDoc {
    /// `targets`, as for every targets role.
    #[serde(rename = "_type")]
    pub type_: String,
    /// The TUF specification version (any 1.x is read).
    pub spec_version: String,
    /// The version; a node refuses one lower than it verified before.
    pub version: u64,
    /// When it stops being trusted (a node refuses an expired one).
    pub expires: DateTime<Utc>,
    /// One entry per halted release: `halt/VERSION`.
    pub targets: BTreeMap<String, HaltTarget>,
}

/// One halted release: its manifest's length and hashes, and the halt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltTarget {
    /// The halted release's manifest length, as the publisher's targets list it.
    pub length: u64,
    /// The manifest's hashes (`sha256` required).
    pub hashes: BTreeMap<String, String>,
    /// `{"halt": …}`.
    pub custom: HaltCustom,
}

/// A halt target's custom data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltCustom {
    /// The halt.
    pub halt: Mark,
}

/// When and why the guard halted the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// When the halt began (the hold begins here, or at the node's clock if later).
    pub since: DateTime<Utc>,
    /// The criteria that were met (the guard's words; untrusted text, escaped when shown).
    #[serde(default)]
    pub reason: String,
}

/// What a node records of the halt role between polls (in its [`super::Record`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// The delegation's key ids, sorted: when the publisher changes them, the bound is
    /// forgotten (as a rotated top-level key's).
    pub keyids: Vec<String>,
    /// The highest `halt.json` version verified with those keys.
    pub version: u64,
}

/// A verified `halt.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halts {
    /// The document as verified.
    pub doc: HaltDoc,
    /// The bound to record.
    pub seen: Seen,
}

/// The halt delegation of `targets`: the role and its keys (`None`: the publisher runs no
/// guard for this channel).
pub fn delegation(targets: &Targets) -> Option<(&BTreeMap<String, Key>, RoleKeys)> {
    let d = targets.delegations.as_ref()?;
    let (_, rk) = d.role(HALT_ROLE)?;
    Some((&d.keys, rk))
}

fn sorted_ids(rk: &RoleKeys) -> Vec<String> {
    let mut ids = rk.keyids.clone();
    ids.sort();
    ids.dedup();
    ids
}

fn refused(location: &str, why: String) -> TrustError {
    TrustError::Halt {
        location: location.to_string(),
        why,
    }
}

/// Fetch and [`verify`] the halt role's file of a channel whose `targets` delegate it.
/// `Ok(None)`: no delegation, or no `halt.json` yet and none seen before.
pub fn fetch_verified(
    src: &dyn MetaSource,
    targets: &Targets,
    seen: Option<&Seen>,
    now: Option<DateTime<Utc>>,
) -> Result<Option<Halts>, TrustError> {
    if delegation(targets).is_none() {
        return Ok(None);
    }
    let bytes = src.fetch(HALT_FILE, MAX_HALT_BYTES)?;
    verify(
        targets,
        bytes.as_deref(),
        &src.location(HALT_FILE),
        seen,
        now,
    )
}

/// Check `bytes` (the `halt.json` at `location`, `None`: not there) against the halt
/// delegation of the verified `targets` and the bound `seen`: a threshold of the delegated
/// keys, `_type` targets, a version not below the bound, not expired at `now` (`None`: expiry
/// waived, `upgrade --ignore-expiry`), and every target under `halt/` with a halt mark.
pub fn verify(
    targets: &Targets,
    bytes: Option<&[u8]>,
    location: &str,
    seen: Option<&Seen>,
    now: Option<DateTime<Utc>>,
) -> Result<Option<Halts>, TrustError> {
    let Some((keys, rk)) = delegation(targets) else {
        return Ok(None);
    };
    let keyids = sorted_ids(&rk);
    let floor = seen.filter(|s| s.keyids == keyids).map(|s| s.version);
    let Some(bytes) = bytes else {
        return match floor {
            Some(v) if v > 0 => Err(refused(location, format!(
                "missing, but this node verified halt version {v} of this channel before (a halt is lifted by the publisher's `release resume`, never by removing the file)"
            ))),
            _ => Ok(None),
        };
    };
    let env = Envelope::parse(bytes, location)?;
    let found = env.count_valid(keys, &rk, location)?;
    let need = rk.threshold.max(1) as usize;
    if found < need {
        return Err(refused(location, format!(
            "{found} valid signature(s) by the halt role's keys (delegated by targets version {}), {need} required",
            targets.version
        )));
    }
    let doc: HaltDoc = env.body(super::meta::Role::Targets, location)?;
    if let Some(v) = floor.filter(|v| doc.version < *v) {
        return Err(refused(
            location,
            format!(
                "halt version {} is older than version {v} this node already verified (rollback)",
                doc.version
            ),
        ));
    }
    if let Some(now) = now.filter(|n| doc.expires <= *n) {
        return Err(refused(location, format!(
            "halt version {} expired at {}, the node's time is {} (the guard re-signs it at every run: is it running?)",
            doc.version, meta::time_str(&doc.expires), meta::time_str(&now)
        )));
    }
    check_entries(&doc, location)?;
    Ok(Some(Halts {
        seen: Seen {
            keyids,
            version: doc.version,
        },
        doc,
    }))
}

/// Every entry must be `halt/NAME` (one path segment, the delegated pattern) with a sha256:
/// the halt role signs nothing else.
fn check_entries(doc: &HaltDoc, location: &str) -> Result<(), TrustError> {
    for (path, t) in &doc.targets {
        let name = path.strip_prefix(HALT_PREFIX).unwrap_or("");
        if name.is_empty() || name.contains('/') {
            return Err(refused(location, format!(
                "lists target '{}', outside the halt role's paths ({HALT_PATHS}): the halt key signs nothing but halts",
                path.escape_debug()
            )));
        }
        if !t.hashes.contains_key("sha256") {
            return Err(refused(
                location,
                format!("target '{}' has no sha256", path.escape_debug()),
            ));
        }
    }
    Ok(())
}

/// A release the halt holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The release's target path in the publisher's targets.
    pub target: String,
    /// The release's version, as the target names it.
    pub version: String,
    /// The halt's `since` as signed.
    pub since: DateTime<Utc>,
    /// The guard's reason (untrusted text).
    pub reason: String,
}

/// The halt's entry for the target with `length` and `sha256`, if one names exactly that
/// manifest.
fn entry_for<'a>(halts: &'a HaltDoc, length: u64, sha256: &str) -> Option<&'a Mark> {
    halts
        .targets
        .values()
        .find(|t| t.length == length && t.hashes.get("sha256").map(String::as_str) == Some(sha256))
        .map(|t| &t.custom.halt)
}

/// Whether `mark` holds a release with rollout `r` (`None`: no rollout data): not withdrawn,
/// not already paused by the publisher, and not lifted by the publisher.
fn holds(r: Option<&Rollout>, mark: &Mark) -> bool {
    r.is_none_or(|r| {
        r.withdrawn.is_none() && r.paused.is_none() && r.halt_lifted.is_none_or(|l| mark.since > l)
    })
}

/// Hold every release of `targets` that `halts` names, as a pause from the halt's `since` (or
/// `now`, if that is earlier: a hold never waits for its start). Pure; the only change is
/// `rollout.paused` set where it was unset (a release without rollout data gets one that
/// holds the whole fleet). Returns what it held.
pub fn apply(targets: &mut Targets, halts: &HaltDoc, now: DateTime<Utc>) -> Vec<Applied> {
    let mut held = Vec::new();
    for (path, m) in targets.targets.iter_mut() {
        let Some(sha) = m.sha256().map(str::to_string) else {
            continue;
        };
        let Some(mark) = entry_for(halts, m.length, &sha) else {
            continue;
        };
        let Some(c) = m.custom.as_mut() else {
            continue;
        };
        if !holds(c.rollout.as_ref(), mark) {
            continue;
        }
        let r = c.rollout.get_or_insert_with(Rollout::default);
        r.paused = Some(Pause {
            since: mark.since.min(now),
        });
        held.push(Applied {
            target: path.clone(),
            version: c.version.clone(),
            since: mark.since,
            reason: mark.reason.clone(),
        });
    }
    held
}

/// Whether the publisher has not lifted `mark` for a release with rollout `r`.
fn holds_lift(r: Option<&Rollout>, mark: &Mark) -> bool {
    r.and_then(|r| r.halt_lifted).is_none_or(|l| mark.since > l)
}

/// The halt the served `halt` names for the release of `version` in `targets` and that still
/// holds it (the publisher's `release resume` lifts it).
pub fn active_for<'a>(targets: &Targets, halts: &'a HaltDoc, version: &str) -> Option<&'a Mark> {
    targets.targets.values().find_map(|m| {
        let c = m.custom.as_ref().filter(|c| c.version == version)?;
        let mark = entry_for(halts, m.length, m.sha256()?)?;
        let r = c.rollout.as_ref();
        (r.is_none_or(|r| r.withdrawn.is_none()) && holds_lift(r, mark)).then_some(mark)
    })
}

mod write;

pub use write::{entry_name, next_doc, served, sign, write_served, Written};

#[cfg(test)]
mod tests;
