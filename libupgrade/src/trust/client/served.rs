//! The publisher's side of verification: before any command re-signs a channel (`release
//! targets`, `timestamp`, `rollout`, `pause`, `resume`, `withdraw`, `root rotate`), the
//! channel directory as it is served is verified with the node's own checks, and a file
//! that does not verify is refused, naming it, before anything is written. Anyone who can
//! write the served directory (a web server, a bucket, the machine running `release serve`)
//! therefore cannot get an entry, a pin or a rollout signed at the publisher's next routine
//! command: TUF's repository side, too, works from metadata it verified first.
//!
//! **The served copy is verified** (not a trusted copy kept apart): the directory stays the
//! one place the publisher's commands read and write. The checks are the client's
//! ([`super`]): the root chain walked from `1.root.json` with a threshold of the previous and
//! the new root keys at each step (and `root.json` must be the chain's newest root), then a
//! threshold of each role's keys for `timestamp.json`, `snapshot.json` and `targets.json`, and
//! the length, every hash and the version each referrer pins. Three differences, each needed
//! by a publisher:
//! - expiry is not checked (re-signing an expired channel is how a publisher revives it);
//! - `targets.json` may be *newer* than the snapshot's pin when a threshold of the newest
//!   root's targets keys signed it (what `release targets` writes before `release timestamp`
//!   pins it); never older. The snapshot must be exactly the one the timestamp pins;
//! - a file signed by its role's keys of an *earlier* root of the chain counts (the channel
//!   serves it between a `root rotate` that replaced those keys and the publisher's re-sign):
//!   a snapshot or targets file so signed must still be exactly what its referrer pins, so
//!   only a timestamp rests on a rotated-away key alone, and all it can do is pin a snapshot
//!   that must verify by itself.
//!
//! Limits, stated: the anchor is the directory's own `1.root.json` unless the publisher names
//! one kept apart ([`verify_served_from`], `release … --root FILE`: then a chain replaced
//! from its first root on is refused too), and the
//! publisher keeps no record of versions, so a consistent replay of an older *complete* set
//! of signed files is not told from the current one (each file alone is: an older targets or
//! timestamp file no longer matches the pins around it).

use std::path::Path;

use super::{check_ref, meta_entry, walk_chain, MAX_ROOT_BYTES, MAX_SNAPSHOT_BYTES};
use super::{MAX_TARGETS_BYTES, MAX_TIMESTAMP_BYTES};
use crate::trust::kept::DirMeta;
use crate::trust::meta::{Envelope, MetaRef, Role, Root, Targets, Versions};
use crate::trust::{MetaSource, Record, TrustError};

/// A channel directory's metadata after it verified.
#[derive(Debug, Clone)]
pub struct Served {
    /// The newest root of the chain (what `root.json` holds).
    pub root: Root,
    /// The timestamp's version (`None`: the channel has none yet).
    pub timestamp: Option<u64>,
    /// The snapshot's version (`None`: none yet).
    pub snapshot: Option<u64>,
    /// The targets and their bytes (`None`: none yet).
    pub targets: Option<(Targets, Vec<u8>)>,
}

/// Verify the metadata served from `dir` as described in the module docs. Every refusal is
/// [`TrustError::Unverified`] around the check that failed (which names the file); a channel
/// without a root is [`TrustError::Publish`].
pub fn verify_served(dir: &Path) -> Result<Served, TrustError> {
    verify_source(&DirMeta(dir.to_path_buf()))
}

/// [`verify_served`] over any source of the channel's files: the publish transaction
/// ([`crate::trust::publish::Publish`]) checks the directory as it will be once its new files
/// are in place, before a byte is written.
pub(crate) fn verify_source(src: &dyn MetaSource) -> Result<Served, TrustError> {
    let first = src.location("1.root.json");
    let Some(bytes) = src.fetch("1.root.json", MAX_ROOT_BYTES)? else {
        return Err(TrustError::Publish {
            what: first,
            why: "no root: run `k3os-ops release root init` for this channel first".into(),
        });
    };
    check(src, &bytes, &first).map_err(|e| TrustError::Unverified {
        refused: Box::new(e),
    })
}

/// [`verify_served`] from a root the publisher keeps apart (`release … --root FILE`, e.g. the
/// root baked into the nodes' images) instead of the directory's own `1.root.json`: the
/// chain must walk from it to the served `root.json`, so a chain replaced from its first root
/// on is refused too. `anchor` is that file's bytes, `anchor_what` its name for messages.
pub fn verify_served_from(
    dir: &Path,
    anchor: &[u8],
    anchor_what: &str,
) -> Result<Served, TrustError> {
    let src = DirMeta(dir.to_path_buf());
    check(&src, anchor, anchor_what).map_err(|e| TrustError::Unverified {
        refused: Box::new(e),
    })
}

fn check(src: &dyn MetaSource, first: &[u8], first_loc: &str) -> Result<Served, TrustError> {
    let mut rec = Record::from_root(first, first_loc)?;
    let chain = walk_chain(src, &mut rec)?;
    let root = chain.last().expect("a chain holds its first root").clone();
    let root_loc = src.location(Role::Root.file());
    let current = required(src, Role::Root.file(), MAX_ROOT_BYTES)?;
    if Envelope::parse(&current, &root_loc)? != rec.root {
        return Err(TrustError::Mismatch {
            location: root_loc,
            expected: format!(
                "root version {v} ({v}.root.json, the newest of the chain)",
                v = root.version
            ),
            found: "other contents".into(),
        });
    }

    let ts_loc = src.location(Role::Timestamp.file());
    let timestamp = match src.fetch(Role::Timestamp.file(), MAX_TIMESTAMP_BYTES)? {
        Some(b) => Some(signed::<Versions>(&chain, Role::Timestamp, &b, &ts_loc)?.0),
        None => None,
    };
    let sn_pin = timestamp
        .as_ref()
        .map(|ts| meta_entry(ts, Role::Snapshot, &ts_loc))
        .transpose()?;
    let sn_loc = src.location(Role::Snapshot.file());
    let sn_bytes = src.fetch(Role::Snapshot.file(), MAX_SNAPSHOT_BYTES)?;
    let snapshot = match (sn_bytes, &sn_pin) {
        (Some(b), Some(pin)) => Some(pinned::<Versions>(
            &chain,
            Role::Snapshot,
            pin,
            &b,
            &sn_loc,
        )?),
        (None, None) => None,
        (Some(_), None) => return Err(missing(src, Role::Timestamp)),
        (None, Some(_)) => return Err(missing(src, Role::Snapshot)),
    };
    let tg_pin = snapshot
        .as_ref()
        .map(|sn| meta_entry(sn, Role::Targets, &sn_loc))
        .transpose()?;
    let tg_loc = src.location(Role::Targets.file());
    let targets = match src.fetch(Role::Targets.file(), MAX_TARGETS_BYTES)? {
        Some(b) => Some((pinned_or_newer(&chain, tg_pin.as_ref(), &b, &tg_loc)?, b)),
        None if tg_pin.is_some() => return Err(missing(src, Role::Targets)),
        None => None,
    };
    Ok(Served {
        root,
        timestamp: timestamp.map(|t| t.version),
        snapshot: snapshot.map(|s| s.version),
        targets,
    })
}

fn missing(src: &dyn MetaSource, role: Role) -> TrustError {
    TrustError::Missing {
        file: role.file().into(),
        location: src.location(role.file()),
    }
}

fn required(src: &dyn MetaSource, name: &str, max: u64) -> Result<Vec<u8>, TrustError> {
    src.fetch(name, max)?.ok_or_else(|| TrustError::Missing {
        file: name.into(),
        location: src.location(name),
    })
}

/// `bytes` as `role`'s document, signed by a threshold of its keys in the newest root of
/// `chain` (`true`), or else in an earlier root of it (`false`: signed before a rotation of
/// the role's keys, what a channel serves until the publisher re-signs the role); the newest
/// root's refusal when neither.
fn signed<T: serde::de::DeserializeOwned>(
    chain: &[Root],
    role: Role,
    bytes: &[u8],
    loc: &str,
) -> Result<(T, bool), TrustError> {
    let env = Envelope::parse(bytes, loc)?;
    let (newest, earlier) = chain.split_last().expect("a chain holds its first root");
    let fresh = match env.check_role(newest, role, loc) {
        Ok(()) => true,
        Err(e) => {
            if !earlier.iter().any(|r| env.check_role(r, role, loc).is_ok()) {
                return Err(e);
            }
            false
        }
    };
    Ok((env.body(role, loc)?, fresh))
}

/// Exactly the file `pin` names: its length and hashes, a threshold of the role's keys (see
/// [`signed`]), and the pinned version.
fn pinned<T: serde::de::DeserializeOwned + super::Versioned>(
    chain: &[Root],
    role: Role,
    pin: &MetaRef,
    bytes: &[u8],
    loc: &str,
) -> Result<T, TrustError> {
    check_ref(role, pin, bytes, referrer(role), loc)?;
    let (doc, _): (T, bool) = signed(chain, role, bytes, loc)?;
    if doc.version() != pin.version {
        return Err(TrustError::WrongVersion {
            location: loc.into(),
            expected: pin.version,
            found: doc.version(),
        });
    }
    Ok(doc)
}

/// The targets: the pinned file, or one newer than the pin signed by a threshold of the
/// newest root's targets keys (`release targets` before `release timestamp`); never an older
/// one.
fn pinned_or_newer(
    chain: &[Root],
    pin: Option<&MetaRef>,
    bytes: &[u8],
    loc: &str,
) -> Result<Targets, TrustError> {
    let (doc, fresh): (Targets, bool) = signed(chain, Role::Targets, bytes, loc)?;
    let newest = chain.last().expect("a chain holds its first root");
    let must_be_fresh = || match fresh {
        true => Ok(()),
        false => Envelope::parse(bytes, loc)?.check_role(newest, Role::Targets, loc),
    };
    match pin {
        None => must_be_fresh().map(|()| doc),
        Some(p) if doc.version > p.version => must_be_fresh().map(|()| doc),
        Some(p) if doc.version < p.version => Err(TrustError::Mismatch {
            location: loc.into(),
            expected: format!(
                "targets version {} or newer (as {} pins)",
                p.version,
                Role::Snapshot.file()
            ),
            found: format!("targets version {} (rolled back)", doc.version),
        }),
        Some(p) => pinned(chain, Role::Targets, p, bytes, loc),
    }
}

fn referrer(role: Role) -> &'static str {
    match role {
        Role::Targets => Role::Snapshot.file(),
        _ => Role::Timestamp.file(),
    }
}
