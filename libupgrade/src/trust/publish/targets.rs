//! `targets.json`: the channel's releases listed, a rollout edited, the halt role delegated.
//! Each `stage_*` signs the new targets into a [`Publish`] transaction (snapshot and
//! timestamp are staged after it with [`super::stage_timestamp`]); each `write_*` is the same
//! change committed alone.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use chrono::{DateTime, Utc};

use super::{
    next, publish_err, rollouts, signers_for, verified, Publish, SigningKey, VerifyingKey,
};
use crate::manifest::MANIFEST_FILE;
use crate::rollout::{Rollout, RolloutError};
use crate::trust::meta::{
    file_meta, DelegatedRole, Delegations, Envelope, Key, Role, Root, TargetCustom, Targets,
    SPEC_VERSION,
};
use crate::trust::TrustError;

/// Run `stage` in a transaction of its own over `dir` and commit it.
fn alone(
    dir: &Path,
    stage: impl FnOnce(&mut Publish) -> Result<Targets, TrustError>,
) -> Result<Targets, TrustError> {
    let mut p = Publish::begin(dir)?;
    let t = stage(&mut p)?;
    p.commit()?;
    Ok(t)
}

/// [`stage_targets`] committed alone.
pub fn write_targets(
    dir: &Path,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    alone(dir, |p| stage_targets(p, signers, expires))
}

/// [`stage_delegation`] committed alone.
pub fn write_delegation(
    dir: &Path,
    keys: &[VerifyingKey],
    threshold: u32,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    alone(dir, |p| {
        stage_delegation(p, keys, threshold, signers, expires)
    })
}

/// [`stage_rollout`] committed alone.
pub fn write_rollout(
    dir: &Path,
    version: &str,
    edit: &dyn Fn(Option<&Rollout>) -> Result<Rollout, RolloutError>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    alone(dir, |p| stage_rollout(p, version, edit, signers, expires))
}

/// The verified targets of the transaction's channel (a refusal naming the file when there are
/// none yet).
fn published(p: &Publish) -> Result<(Root, Targets), TrustError> {
    let served = verified(p)?;
    let (doc, _) = served.targets.clone().ok_or_else(|| {
        publish_err(
            p.path_of(Role::Targets.file()),
            "no targets: run `k3os-ops release targets` first",
        )
    })?;
    Ok((served.root.clone(), doc))
}

/// List every release of the channel directory (those `release index` lists) in a new
/// `targets.json`, signed by `signers` (a threshold of the targets keys), staged in `p`.
pub fn stage_targets(
    p: &mut Publish,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    let served = verified(p)?.clone();
    let dir = p.dir().to_path_buf();
    let index = crate::channel::build_index(&dir)
        .map_err(|e| publish_err(dir.display().to_string(), e.to_string()))?;
    // The rollouts of the verified targets carry over: re-listing the channel after a
    // `release create` must not restart, resume or un-withdraw any release's rollout.
    let mut kept = rollouts(served.targets.as_ref().map(|(t, _)| t));
    let mut targets = BTreeMap::new();
    for e in &index.releases {
        let rel = format!("{}/{MANIFEST_FILE}", e.path.trim_end_matches('/'));
        let path = dir.join(&rel);
        let bytes = fs::read(&path).map_err(|source| TrustError::Io { path, source })?;
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
    sign_targets(p, &served.root, doc, signers)
}

/// Re-sign `targets.json` one version up delegating the stop-only `halt` role
/// ([`crate::trust::halt`]) to `keys` with `threshold` (`paths: ["halt/*"]`, terminating), replacing
/// any earlier halt delegation; with no keys, the delegation is removed (the channel has no
/// guard). Every other delegated role is dropped: a node honours none. Staged in `p`; snapshot
/// and timestamp are staged after it with [`super::stage_timestamp`].
pub fn stage_delegation(
    p: &mut Publish,
    keys: &[VerifyingKey],
    threshold: u32,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    let what = p.path_of(Role::Targets.file());
    let (root, mut doc) = published(p)?;
    doc.delegations = match keys.len() as u32 {
        0 => None,
        n if threshold == 0 || threshold > n => {
            return Err(publish_err(
                what,
                format!("halt threshold {threshold} must be between 1 and its {n} key(s)"),
            ))
        }
        _ => Some(halt_delegation(&root, keys, threshold, &what)?),
    };
    doc.version = next(Role::Targets, Some(doc.version))?;
    doc.expires = expires;
    sign_targets(p, &root, doc, signers)
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
            name: crate::trust::halt::HALT_ROLE.into(),
            keyids: ids,
            threshold,
            terminating: true,
            paths: Some(vec![crate::trust::halt::HALT_PATHS.into()]),
        }],
    })
}

/// Sign `doc` with `signers`, check it against `root`'s targets threshold, and stage it as the
/// channel's `targets.json` (nothing is staged when the check fails).
fn sign_targets(
    p: &mut Publish,
    root: &Root,
    doc: Targets,
    signers: &[SigningKey],
) -> Result<Targets, TrustError> {
    let env = Envelope::sign(&doc, &signers_for(&[root], Role::Targets, signers));
    env.check_role(
        root,
        Role::Targets,
        &format!(
            "{}: new targets version {}",
            p.path_of(Role::Targets.file()),
            doc.version
        ),
    )?;
    p.stage(Role::Targets.file(), env.to_bytes());
    Ok(doc)
}

/// Re-sign `targets.json` one version up with the rollout of release `version` (every
/// architecture's target of it) replaced by `edit` of its current one (`None`: it has none).
/// The result must pass [`Rollout::validate`]; nothing is staged otherwise. The publisher's
/// `release rollout|pause|resume|withdraw`; snapshot and timestamp are staged after it with
/// [`super::stage_timestamp`].
pub fn stage_rollout(
    p: &mut Publish,
    version: &str,
    edit: &dyn Fn(Option<&Rollout>) -> Result<Rollout, RolloutError>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Targets, TrustError> {
    let what = p.path_of(Role::Targets.file());
    let (root, mut doc) = published(p)?;
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
    sign_targets(p, &root, doc, signers)
}
