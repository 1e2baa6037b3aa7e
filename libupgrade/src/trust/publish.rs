//! The publisher's side of channel metadata: make the first root, rotate it, list a channel's
//! releases in `targets.json`, and re-sign `snapshot.json` + `timestamp.json` (what a cron job
//! runs). Every file is written through a temporary file and a rename, in the order a reader
//! needs (`N.root.json` before `root.json`; targets, then snapshot, then timestamp), and each
//! new document is checked against its root's threshold before it is written: a publisher
//! cannot publish what nodes would refuse.
//!
//! **Verify before signing**: every command that re-signs ([`write_targets`],
//! [`write_timestamp`], [`write_rollout`], [`rotate_root`]) first verifies the channel's
//! metadata as it is served, with the node's checks ([`super::client::served`], which states the
//! rules and limits), and works only from what verified: the versions it counts up from, the
//! rollouts `release targets` carries over and the targets a rollout edits. A file that does
//! not verify is refused, naming it, before anything is written, so the nodes' view is
//! unchanged.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use chrono::{DateTime, Duration, SubsecRound, Utc};
pub use ed25519_dalek::{SigningKey, VerifyingKey};

use super::client::served::verify_served;
use super::meta::{
    file_meta, DelegatedRole, Delegations, Envelope, Key, MetaRef, Role, RoleKeys, Root,
    TargetCustom, Targets, Versions, SPEC_VERSION,
};
use super::store::write_atomic;
use super::TrustError;
use crate::manifest::MANIFEST_FILE;
use crate::rollout::{Rollout, RolloutError};

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

fn publish_err(what: impl Into<String>, why: impl Into<String>) -> TrustError {
    TrustError::Publish {
        what: what.into(),
        why: why.into(),
    }
}

/// The channel's current root (`DIR/root.json`), after the served metadata verified.
pub fn current_root(dir: &Path) -> Result<Root, TrustError> {
    Ok(verify_served(dir)?.root)
}

fn build_root(
    version: u64,
    roles: &BTreeMap<Role, RoleSpec>,
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    let mut keys = BTreeMap::new();
    let mut out = BTreeMap::new();
    for role in Role::ALL {
        let spec = roles
            .get(&role)
            .ok_or_else(|| publish_err("root", format!("no keys given for the {role} role")))?;
        let n = spec.keys.len() as u32;
        if spec.threshold == 0 || spec.threshold > n {
            return Err(publish_err(
                "root",
                format!(
                    "{role} threshold {} must be between 1 and its {n} key(s)",
                    spec.threshold
                ),
            ));
        }
        let mut ids = Vec::new();
        for vk in &spec.keys {
            let k = Key::ed25519(vk);
            let id = k.id();
            if !ids.contains(&id) {
                ids.push(id.clone());
            }
            keys.insert(id, k);
        }
        out.insert(
            role,
            RoleKeys {
                keyids: ids,
                threshold: spec.threshold,
            },
        );
    }
    Ok(Root {
        type_: "root".into(),
        spec_version: SPEC_VERSION.into(),
        consistent_snapshot: false,
        version,
        expires,
        keys,
        roles: out,
    })
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

/// Write root version 1 (`1.root.json` and `root.json`), signed by `signers` (a threshold of
/// its root keys). Refuses a channel that already has a root.
pub fn init_root(
    dir: &Path,
    roles: &BTreeMap<Role, RoleSpec>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    if dir.join(Role::Root.file()).exists() || dir.join("1.root.json").exists() {
        return Err(publish_err(
            dir.join(Role::Root.file()).display().to_string(),
            "the channel already has a root; use `k3os-ops release root rotate`",
        ));
    }
    let root = build_root(1, roles, expires)?;
    let env = Envelope::sign(&root, &signers_for(&[&root], Role::Root, signers));
    env.check_role(&root, Role::Root, "new root version 1")?;
    let bytes = env.to_bytes();
    write_atomic(dir, "1.root.json", &bytes)?;
    write_atomic(dir, Role::Root.file(), &bytes)?;
    Ok(root)
}

/// Publish root N+1: `changes` replace those roles' keys (others keep theirs); it is signed by
/// every signer that is a root key of root N or N+1, and must carry a threshold of both.
pub fn rotate_root(
    dir: &Path,
    changes: &BTreeMap<Role, RoleSpec>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    let old = verify_served(dir)?.root;
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
        let spec = match changes.get(&role) {
            Some(s) => s.clone(),
            None => {
                let rk = &old.roles[&role];
                let keys = rk
                    .keyids
                    .iter()
                    .filter_map(|id| old.keys.get(id))
                    .filter_map(|k| {
                        let raw: [u8; 32] = hex::decode(&k.keyval.public).ok()?.try_into().ok()?;
                        VerifyingKey::from_bytes(&raw).ok()
                    })
                    .collect();
                RoleSpec {
                    keys,
                    threshold: rk.threshold,
                }
            }
        };
        roles.insert(role, spec);
    }
    let new = build_root(old.version + 1, &roles, expires)?;
    let env = Envelope::sign(&new, &signers_for(&[&old, &new], Role::Root, signers));
    let what = format!("new root version {}", new.version);
    env.check_role(
        &old,
        Role::Root,
        &format!("{what} (against root {})", old.version),
    )?;
    env.check_role(&new, Role::Root, &what)?;
    let bytes = env.to_bytes();
    write_atomic(dir, &format!("{}.root.json", new.version), &bytes)?;
    write_atomic(dir, Role::Root.file(), &bytes)?;
    Ok(new)
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

/// List every release of the channel directory (those `release index` lists) in a new
/// `targets.json`, signed by `signers` (a threshold of the targets keys).
pub fn write_targets(
    dir: &Path,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    let served = verify_served(dir)?;
    let index = crate::channel::build_index(dir)
        .map_err(|e| publish_err(dir.display().to_string(), e.to_string()))?;
    // The rollouts of the verified targets carry over: re-listing the channel after a
    // `release create` must not restart, resume or un-withdraw any release's rollout.
    let mut kept = rollouts(served.targets.as_ref().map(|(t, _)| t));
    let mut targets = BTreeMap::new();
    for e in &index.releases {
        let rel = format!("{}/{MANIFEST_FILE}", e.path.trim_end_matches('/'));
        let p = dir.join(&rel);
        let bytes = fs::read(&p).map_err(|source| TrustError::Io { path: p, source })?;
        let custom = TargetCustom {
            version: e.version.clone(),
            generation: e.generation,
            arch: e.arch,
            rollout: kept.remove(&rel),
        };
        targets.insert(rel, file_meta(&bytes, Some(custom)));
    }
    let doc = Targets {
        type_: "targets".into(),
        spec_version: SPEC_VERSION.into(),
        version: next(
            Role::Targets,
            served.targets.as_ref().map(|(t, _)| t.version),
        )?,
        expires,
        targets,
        // The guard's delegation carries over as the rollouts do.
        delegations: served.targets.and_then(|(t, _)| t.delegations),
    };
    sign_targets(dir, &served.root, doc, signers)
}

/// Re-sign `targets.json` one version up delegating the stop-only `halt` role
/// ([`super::halt`]) to `keys` with `threshold` (`paths: ["halt/*"]`, terminating), replacing
/// any earlier halt delegation; with no keys, the delegation is removed (the channel has no
/// guard). Every other delegated role is dropped: a node honours none. Snapshot and timestamp
/// are re-signed after it with [`write_timestamp`].
pub fn write_delegation(
    dir: &Path,
    keys: &[VerifyingKey],
    threshold: u32,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    let served = verify_served(dir)?;
    let what = targets_what(dir);
    let (mut doc, _) = served
        .targets
        .ok_or_else(|| publish_err(&what, "no targets: run `k3os-ops release targets` first"))?;
    doc.delegations = match keys.len() as u32 {
        0 => None,
        n if threshold == 0 || threshold > n => {
            return Err(publish_err(
                what,
                format!("halt threshold {threshold} must be between 1 and its {n} key(s)"),
            ))
        }
        _ => Some(halt_delegation(&served.root, keys, threshold, &what)?),
    };
    doc.version = next(Role::Targets, Some(doc.version))?;
    doc.expires = expires;
    sign_targets(dir, &served.root, doc, signers)
}

/// The `delegations` object naming `keys` as the halt role. A key of a top-level role is
/// refused: the guard's key must be able to sign nothing but halts.
fn halt_delegation(
    root: &Root,
    keys: &[VerifyingKey],
    threshold: u32,
    what: &str,
) -> Result<Delegations, TrustError> {
    let mut map = BTreeMap::new();
    let mut ids = Vec::new();
    for vk in keys {
        let k = Key::ed25519(vk);
        let id = k.id();
        if let Some((role, _)) = root.roles.iter().find(|(_, rk)| rk.keyids.contains(&id)) {
            return Err(publish_err(
                what,
                format!("key {id} is a {role} key of root version {}: the halt role needs a key of its own, which can sign nothing else", root.version),
            ));
        }
        if !ids.contains(&id) {
            ids.push(id.clone());
        }
        map.insert(id, k);
    }
    Ok(Delegations {
        keys: map,
        roles: vec![DelegatedRole {
            name: super::halt::HALT_ROLE.into(),
            keyids: ids,
            threshold,
            terminating: true,
            paths: Some(vec![super::halt::HALT_PATHS.into()]),
        }],
    })
}

/// Sign `doc` with `signers`, check it against `root`'s targets threshold, and write it as the
/// channel's `targets.json` (nothing is written when the check fails).
fn sign_targets(
    dir: &Path,
    root: &Root,
    doc: Targets,
    signers: &[SigningKey],
) -> Result<Targets, TrustError> {
    let env = Envelope::sign(&doc, &signers_for(&[root], Role::Targets, signers));
    env.check_role(
        root,
        Role::Targets,
        &format!("new targets version {}", doc.version),
    )?;
    write_atomic(dir, Role::Targets.file(), &env.to_bytes())?;
    Ok(doc)
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

fn targets_what(dir: &Path) -> String {
    dir.join(Role::Targets.file()).display().to_string()
}

/// Re-sign `targets.json` one version up with the rollout of release `version` (every
/// architecture's target of it) replaced by `edit` of its current one (`None`: it has none).
/// The result must pass [`Rollout::validate`]; nothing is written otherwise. The publisher's
/// `release rollout|pause|resume|withdraw`; snapshot and timestamp are re-signed after it with
/// [`write_timestamp`].
pub fn write_rollout(
    dir: &Path,
    version: &str,
    edit: &dyn Fn(Option<&Rollout>) -> Result<Rollout, RolloutError>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    let served = verify_served(dir)?;
    let what = targets_what(dir);
    let (mut doc, _) = served
        .targets
        .ok_or_else(|| publish_err(&what, "no targets: run `k3os-ops release targets` first"))?;
    let mut found = false;
    for (path, m) in doc.targets.iter_mut() {
        let Some(c) = m.custom.as_mut().filter(|c| c.version == version) else {
            continue;
        };
        let next = edit(c.rollout.as_ref())
            .and_then(|r| r.validate(c.generation).map(|()| r))
            .map_err(|e| publish_err(format!("{what}: target {path}"), e.to_string()))?;
        c.rollout = Some(next);
        found = true;
    }
    if !found {
        let listed: Vec<&str> = doc
            .targets
            .values()
            .filter_map(|m| m.custom.as_ref().map(|c| c.version.as_str()))
            .collect();
        return Err(publish_err(
            what,
            format!(
                "lists no release {version:?} (it lists {}): run `k3os-ops release targets` after `release create`",
                listed.join(", ")
            ),
        ));
    }
    doc.version = next(Role::Targets, Some(doc.version))?;
    doc.expires = expires;
    sign_targets(dir, &served.root, doc, signers)
}

/// Re-sign `snapshot.json` (over the current `targets.json`, once it verified) and
/// `timestamp.json` (over the new snapshot), each one version up. What a channel's cron job
/// runs.
pub fn write_timestamp(
    dir: &Path,
    signers: &[SigningKey],
    snapshot_expires: DateTime<Utc>,
    timestamp_expires: DateTime<Utc>,
) -> Result<(Versions, Versions), TrustError> {
    let served = verify_served(dir)?;
    let root = &served.root;
    let (tg, tg_bytes) = served.targets.as_ref().ok_or_else(|| {
        publish_err(
            targets_what(dir),
            "no targets: run `k3os-ops release targets` first",
        )
    })?;
    let meta_ref = |version: u64, bytes: &[u8]| {
        let m = file_meta(bytes, None);
        MetaRef {
            version,
            length: Some(m.length),
            hashes: Some(m.hashes),
        }
    };
    let snapshot = Versions {
        type_: "snapshot".into(),
        spec_version: SPEC_VERSION.into(),
        version: next(Role::Snapshot, served.snapshot)?,
        expires: snapshot_expires,
        meta: BTreeMap::from([(
            Role::Targets.file().to_string(),
            meta_ref(tg.version, tg_bytes),
        )]),
    };
    let sn_env = Envelope::sign(&snapshot, &signers_for(&[root], Role::Snapshot, signers));
    sn_env.check_role(
        root,
        Role::Snapshot,
        &format!("new snapshot version {}", snapshot.version),
    )?;
    let sn_bytes = sn_env.to_bytes();
    let timestamp = Versions {
        type_: "timestamp".into(),
        spec_version: SPEC_VERSION.into(),
        version: next(Role::Timestamp, served.timestamp)?,
        expires: timestamp_expires,
        meta: BTreeMap::from([(
            Role::Snapshot.file().to_string(),
            meta_ref(snapshot.version, &sn_bytes),
        )]),
    };
    let ts_env = Envelope::sign(&timestamp, &signers_for(&[root], Role::Timestamp, signers));
    ts_env.check_role(
        root,
        Role::Timestamp,
        &format!("new timestamp version {}", timestamp.version),
    )?;
    write_atomic(dir, Role::Snapshot.file(), &sn_bytes)?;
    write_atomic(dir, Role::Timestamp.file(), &ts_env.to_bytes())?;
    Ok((snapshot, timestamp))
}
