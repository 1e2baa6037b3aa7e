//! The node's side of TUF (spec 1.0, section 5, "detailed client workflow"), over any source
//! of metadata files: walk the root chain, then timestamp → snapshot → targets, checking
//! thresholds, versions that never go backwards, hashes and lengths between roles, and expiry.
//!
//! [`update`] is pure given its [`MetaSource`] and clock: it takes the node's [`Record`] of
//! what it trusted before and returns the verified targets with the record to keep. Storing
//! the record ([`super::store`]) is the caller's effect.

use chrono::{DateTime, Utc};

use super::meta::{self, Envelope, Key, MetaRef, Role, Root, Targets, Versions};
use super::{MetaSource, Record, TrustError};

/// Largest `N.root.json` read.
pub const MAX_ROOT_BYTES: u64 = 512 << 10;
/// Largest `timestamp.json` read.
pub const MAX_TIMESTAMP_BYTES: u64 = 16 << 10;
/// Largest `snapshot.json` read when the timestamp names no length.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 20;
/// Largest `targets.json` read when the snapshot names no length.
pub const MAX_TARGETS_BYTES: u64 = 16 << 20;
/// Most root versions walked in one update (a chain longer than this is an attack or a
/// mistake; a node that far behind walks on at its next poll).
pub const MAX_ROOT_STEPS: u64 = 1024;

/// The expiry rule of one update: the node's clock, and whether the operator waived expiry (named apart from the stage's [`crate::Clock`], the time source a stage waits on).
#[derive(Debug, Clone, Copy)]
pub struct ExpiryRule {
    /// The node's clock.
    pub now: DateTime<Utc>,
    /// Operator override (`upgrade --ignore-expiry`): expiry is not checked (and the
    /// record's time floor is not moved).
    pub ignore_expiry: bool,
}

impl ExpiryRule {
    /// The time expiry is checked against: the node's clock, but never earlier than the
    /// newest clock reading at which this node verified the channel before (a clock reset to
    /// 1970 by a dead RTC does not reopen metadata that expired since).
    pub fn reference(&self, record: &Record) -> DateTime<Utc> {
        match record.time_floor {
            Some(floor) if floor > self.now => floor,
            _ => self.now,
        }
    }

    fn check(
        &self,
        reference: DateTime<Utc>,
        role: Role,
        version: u64,
        expires: DateTime<Utc>,
    ) -> Result<(), TrustError> {
        if self.ignore_expiry || expires > reference {
            return Ok(());
        }
        Err(TrustError::Expired {
            role,
            version,
            expires,
            now: reference,
        })
    }
}

/// What an update verified.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The targets document, checked against the root, timestamp and snapshot it chains to.
    pub targets: Targets,
    /// The record to keep (new root, versions, time floor).
    pub record: Record,
    /// `snapshot.json` as verified (to keep for the next update).
    pub snapshot: File,
    /// `targets.json` as verified (to keep for the next update).
    pub targets_file: File,
    /// The halt role's `halt.json` as verified ([`super::halt`]); `None`: the targets delegate
    /// no halt role, or the guard has published none yet. Not applied to `targets`: the
    /// caller applies it ([`super::halt::apply`]) where a node decides.
    pub halts: Option<super::halt::Halts>,
}

fn fetch_required(src: &dyn MetaSource, name: &str, max: u64) -> Result<Vec<u8>, TrustError> {
    src.fetch(name, max)?.ok_or_else(|| TrustError::Missing {
        file: name.to_string(),
        location: src.location(name),
    })
}

/// Check `bytes` (the `role` file at `location`) against the `meta` entry `referrer` lists for
/// it: its length, and **every** hash it lists (TUF 5.3.x/5.5.2). An algorithm this build
/// cannot compute is a refusal, not a pass, and so is a `hashes` object that lists none.
fn check_ref(
    role: Role,
    r: &MetaRef,
    bytes: &[u8],
    referrer: &str,
    location: &str,
) -> Result<(), TrustError> {
    let mismatch = |expected: String, found: String| TrustError::Mismatch {
        location: location.to_string(),
        expected,
        found,
    };
    if let Some(l) = r.length.filter(|l| *l != bytes.len() as u64) {
        return Err(mismatch(
            format!("{l} bytes (as {referrer} lists)"),
            format!("{} bytes", bytes.len()),
        ));
    }
    let Some(hashes) = &r.hashes else {
        return Ok(());
    };
    if hashes.is_empty() {
        return Err(TrustError::Malformed {
            what: referrer.to_string(),
            why: format!(
                "its meta entry for {} lists an empty hashes object",
                role.file()
            ),
        });
    }
    for (algorithm, want) in hashes {
        let Some(got) = meta::digest_hex(algorithm, bytes) else {
            return Err(TrustError::UnknownHash {
                role,
                referrer: referrer.to_string(),
                algorithm: algorithm.clone(),
                location: location.to_string(),
            });
        };
        if got != *want {
            return Err(mismatch(
                format!("{algorithm} {} (as {referrer} lists)", want.escape_debug()),
                format!("{algorithm} {got}"),
            ));
        }
    }
    Ok(())
}

fn no_rollback(role: Role, seen: u64, found: u64, location: &str) -> Result<(), TrustError> {
    if found < seen {
        return Err(TrustError::Rollback {
            role,
            location: location.to_string(),
            seen,
            found,
        });
    }
    Ok(())
}

/// Walk `N+1.root.json`, `N+2.root.json`, … from the record's root: each must be signed by a
/// threshold of the previous root's root keys and of its own, with exactly the next version.
/// Where a role's keys change, the versions its metadata vouched for are forgotten, as the
/// spec deletes the trusted files that key signed (fast-forward recovery, 5.3.11):
/// - timestamp key rotated: the timestamp version and the snapshot version it named;
/// - snapshot key rotated: the snapshot version and the targets version it named (the trusted
///   snapshot bounds targets, 5.5.5: this is how a fast-forwarded targets version is undone);
/// - targets or root keys rotated: nothing (the trusted snapshot, signed by an unchanged key,
///   still bounds the targets version).
fn walk_roots(src: &dyn MetaSource, record: &mut Record) -> Result<Root, TrustError> {
    let mut chain = walk_chain(src, record)?;
    Ok(chain
        .pop()
        .expect("the chain holds at least the record's root"))
}

/// [`walk_roots`], returning every root of the chain from the record's, oldest first (the
/// publisher's check tells a file signed before a rotation from a forged one: [`served`]).
fn walk_chain(src: &dyn MetaSource, record: &mut Record) -> Result<Vec<Root>, TrustError> {
    let mut root: Root = record.root.body(Role::Root, "trusted root")?;
    let mut chain = Vec::new();
    for _ in 0..MAX_ROOT_STEPS {
        let next = root.version + 1;
        let name = format!("{next}.root.json");
        let Some(bytes) = src.fetch(&name, MAX_ROOT_BYTES)? else {
            break;
        };
        let loc = src.location(&name);
        let env = Envelope::parse(&bytes, &loc)?;
        env.check_role(&root, Role::Root, &loc)?;
        let new: Root = env.body(Role::Root, &loc)?;
        env.check_role(&new, Role::Root, &loc)?;
        if new.version != next {
            return Err(TrustError::WrongVersion {
                location: loc,
                expected: next,
                found: new.version,
            });
        }
        let changed = |r: Role| role_keys(&root, r) != role_keys(&new, r);
        if changed(Role::Timestamp) {
            record.timestamp = 0;
            record.snapshot = 0;
        }
        if changed(Role::Snapshot) {
            record.snapshot = 0;
            record.targets = 0;
        }
        record.root = env;
        chain.push(std::mem::replace(&mut root, new));
    }
    chain.push(root);
    Ok(chain)
}

/// A role's keys (in a stable order) and threshold, to tell whether a new root changed them.
fn role_keys(root: &Root, role: Role) -> Option<(Vec<Option<&Key>>, u32)> {
    root.roles.get(&role).map(|k| {
        let mut v: Vec<Option<&Key>> = k.keyids.iter().map(|id| root.keys.get(id)).collect();
        v.sort_by_key(|k| k.map(|k| k.keyval.public.clone()));
        (v, k.threshold)
    })
}

/// The TUF client workflow from `record` (the node's trusted root and the highest versions
/// it has seen). Nothing is returned unless every check passed.
///
/// `kept` holds the snapshot and targets files of the node's last verified update
/// ([`super::kept`]): each is used instead of a download when it passes every check a
/// downloaded one must pass against this update's timestamp (python-tuf's ngclient loads its
/// local metadata the same way), so an unchanged channel costs the `N+1.root.json` probe and
/// `timestamp.json`. A kept file that fails any check is ignored, never an error: the file is
/// downloaded and that one's failure is the error.
pub fn update(
    src: &dyn MetaSource,
    kept: Option<&dyn MetaSource>,
    record: &Record,
    clock: &ExpiryRule,
) -> Result<Verified, TrustError> {
    let mut rec = record.clone();
    let reference = clock.reference(record);
    let root = walk_roots(src, &mut rec)?;
    clock.check(reference, Role::Root, root.version, root.expires)?;
    let step = Step {
        root: &root,
        clock,
        reference,
    };

    let ts_name = Role::Timestamp.file();
    let ts_loc = src.location(ts_name);
    let ts_env = Envelope::parse(&fetch_required(src, ts_name, MAX_TIMESTAMP_BYTES)?, &ts_loc)?;
    ts_env.check_role(&root, Role::Timestamp, &ts_loc)?;
    let ts: Versions = ts_env.body(Role::Timestamp, &ts_loc)?;
    no_rollback(Role::Timestamp, rec.timestamp, ts.version, &ts_loc)?;
    clock.check(reference, Role::Timestamp, ts.version, ts.expires)?;
    let snap_ref = meta_entry(&ts, Role::Snapshot, &ts_loc)?;

    let seen_snapshot = rec.snapshot;
    let (snapshot, sn): (_, Versions) = step.kept_or_fetched(
        src,
        kept,
        Role::Snapshot,
        &snap_ref,
        MAX_SNAPSHOT_BYTES,
        |sn: &Versions, loc| no_rollback(Role::Snapshot, seen_snapshot, sn.version, loc),
    )?;
    let sn_loc = src.location(Role::Snapshot.file());
    let tg_ref = meta_entry(&sn, Role::Targets, &sn_loc)?;
    no_rollback(Role::Targets, rec.targets, tg_ref.version, &sn_loc)?;

    let (targets_file, targets): (_, Targets) = step.kept_or_fetched(
        src,
        kept,
        Role::Targets,
        &tg_ref,
        MAX_TARGETS_BYTES,
        |_: &Targets, _| Ok(()),
    )?;

    // Outside the snapshot: see `halt`'s module docs for why and what bounds it instead.
    let halts = super::halt::fetch_verified(
        src,
        &targets,
        rec.halt.as_ref(),
        (!clock.ignore_expiry).then_some(reference),
    )?;
    rec.halt = halts.as_ref().map(|h| h.seen.clone());
    rec.timestamp = ts.version;
    rec.snapshot = sn.version;
    rec.targets = targets.version;
    if !clock.ignore_expiry {
        rec.time_floor = Some(reference);
    }
    Ok(Verified {
        targets,
        record: rec,
        snapshot,
        targets_file,
        halts,
    })
}

/// A verified snapshot or targets file as it was read, and where it came from.
#[derive(Debug, Clone)]
pub struct File {
    /// The file's bytes exactly as verified.
    pub bytes: Vec<u8>,
    /// True when the node's kept copy was used and nothing was downloaded.
    pub kept: bool,
}

/// What the snapshot and targets steps check against: the root walked to and the clock.
struct Step<'a> {
    root: &'a Root,
    clock: &'a ExpiryRule,
    reference: DateTime<Utc>,
}

/// A document with a version and an expiry (snapshot and targets).
trait Versioned: serde::de::DeserializeOwned {
    fn version(&self) -> u64;
    fn expires(&self) -> DateTime<Utc>;
}

impl Versioned for Versions {
    fn version(&self) -> u64 {
        self.version
    }
    fn expires(&self) -> DateTime<Utc> {
        self.expires
    }
}

impl Versioned for Targets {
    fn version(&self) -> u64 {
        self.version
    }
    fn expires(&self) -> DateTime<Utc> {
        self.expires
    }
}

impl Step<'_> {
    /// `role`'s file, as `referrer_entry` (from the timestamp or snapshot) pins it: the kept
    /// copy when it passes [`Step::verify`], else downloaded (at most the pinned length, or
    /// `max`) and verified.
    fn kept_or_fetched<T: Versioned>(
        &self,
        src: &dyn MetaSource,
        kept: Option<&dyn MetaSource>,
        role: Role,
        pinned: &MetaRef,
        max: u64,
        extra: impl Fn(&T, &str) -> Result<(), TrustError>,
    ) -> Result<(File, T), TrustError> {
        let name = role.file();
        let max = pinned.length.unwrap_or(max);
        if let Some(k) = kept {
            let loc = k.location(name);
            let checked = k.fetch(name, max).and_then(|b| match b {
                Some(bytes) => self
                    .verify(role, pinned, &bytes, &loc, &extra)
                    .map(|doc| Some((bytes, doc))),
                None => Ok(None),
            });
            match checked {
                Ok(Some((bytes, doc))) => return Ok((File { bytes, kept: true }, doc)),
                Ok(None) => {}
                Err(e) => log::debug!("kept {name} not used: {e}"),
            }
        }
        let loc = src.location(name);
        let bytes = fetch_required(src, name, max)?;
        let doc = self.verify(role, pinned, &bytes, &loc, &extra)?;
        Ok((File { bytes, kept: false }, doc))
    }

    /// Check `bytes` as `role`'s file at `location`: the length and hashes its referrer pins,
    /// a threshold of the role's keys of the root, exactly the pinned version, `extra`, and
    /// expiry.
    fn verify<T: Versioned>(
        &self,
        role: Role,
        pinned: &MetaRef,
        bytes: &[u8],
        location: &str,
        extra: &impl Fn(&T, &str) -> Result<(), TrustError>,
    ) -> Result<T, TrustError> {
        let referrer = match role {
            Role::Targets => Role::Snapshot.file(),
            _ => Role::Timestamp.file(),
        };
        check_ref(role, pinned, bytes, referrer, location)?;
        let env = Envelope::parse(bytes, location)?;
        env.check_role(self.root, role, location)?;
        let doc: T = env.body(role, location)?;
        if doc.version() != pinned.version {
            return Err(TrustError::WrongVersion {
                location: location.to_string(),
                expected: pinned.version,
                found: doc.version(),
            });
        }
        extra(&doc, location)?;
        self.clock
            .check(self.reference, role, doc.version(), doc.expires())?;
        Ok(doc)
    }
}

/// The `meta` entry for `role`'s file.
fn meta_entry(v: &Versions, role: Role, location: &str) -> Result<MetaRef, TrustError> {
    v.meta
        .get(role.file())
        .cloned()
        .ok_or_else(|| TrustError::Malformed {
            what: location.to_string(),
            why: format!("its meta names no {}", role.file()),
        })
}

pub mod served;

#[cfg(test)]
mod tests;
