//! `snapshot.json` and `timestamp.json`: re-signed over the targets a transaction will leave
//! in place (its own new targets, or the served ones), each one version up. What a channel's
//! cron job runs, and the tail of every command that changes the targets.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Utc};

use super::{next, publish_err, signers_for, verified, Publish, SigningKey};
use crate::trust::meta::SPEC_VERSION;
use crate::trust::meta::{file_meta, Envelope, MetaRef, Role, Root, Targets, Versions};
use crate::trust::TrustError;

/// [`stage_timestamp`] committed alone: re-sign `snapshot.json` (over the current
/// `targets.json`, once it verified) and `timestamp.json` (over the new snapshot).
pub fn write_timestamp(
    dir: &Path,
    signers: &[SigningKey],
    snapshot_expires: DateTime<Utc>,
    timestamp_expires: DateTime<Utc>,
) -> Result<(Versions, Versions), TrustError> {
    let mut p = Publish::begin(dir)?;
    let out = stage_timestamp(&mut p, signers, snapshot_expires, timestamp_expires)?;
    p.commit()?;
    Ok(out)
}

fn meta_ref(version: u64, bytes: &[u8]) -> MetaRef {
    let m = file_meta(bytes, None);
    MetaRef {
        version,
        length: Some(m.length),
        hashes: Some(m.hashes),
    }
}

/// The targets `p` will leave in place (its staged ones, else the served ones) and their
/// version.
fn targets_pinned(p: &Publish) -> Result<(u64, Vec<u8>), TrustError> {
    let name = Role::Targets.file();
    if let Some(bytes) = p.staged(name) {
        let t: Targets = Envelope::parse(bytes, name)?.body(Role::Targets, name)?;
        return Ok((t.version, bytes.to_vec()));
    }
    let (t, bytes) = verified(p)?.targets.as_ref().ok_or_else(|| {
        publish_err(
            p.path_of(name),
            "no targets: run `k3os-ops release targets` first",
        )
    })?;
    Ok((t.version, bytes.clone()))
}

/// Sign `doc` as `role` with the `signers` that are its keys in `root`, check the threshold
/// (naming the file), and stage it; its bytes are returned.
fn sign_versions(
    p: &mut Publish,
    root: &Root,
    role: Role,
    doc: &Versions,
    signers: &[SigningKey],
) -> Result<Vec<u8>, TrustError> {
    let env = Envelope::sign(doc, &signers_for(&[root], role, signers));
    let what = format!(
        "{}: new {role} version {}",
        p.path_of(role.file()),
        doc.version
    );
    env.check_role(root, role, &what)?;
    let bytes = env.to_bytes();
    p.stage(role.file(), bytes.clone());
    Ok(bytes)
}

/// Stage a new `snapshot.json` pinning the targets the transaction leaves in place, and a new
/// `timestamp.json` pinning it, each one version up, signed by the `signers` that are keys of
/// their role (a threshold of each, or nothing is staged).
pub fn stage_timestamp(
    p: &mut Publish,
    signers: &[SigningKey],
    snapshot_expires: DateTime<Utc>,
    timestamp_expires: DateTime<Utc>,
) -> Result<(Versions, Versions), TrustError> {
    let served = verified(p)?;
    let root = served.root.clone();
    let (sn_version, ts_version) = (served.snapshot, served.timestamp);
    let (tg_version, tg_bytes) = targets_pinned(p)?;
    let versions = |role: Role, version, expires, pinned: Role, pin| Versions {
        type_: role.as_str().into(),
        spec_version: SPEC_VERSION.into(),
        version,
        expires,
        meta: BTreeMap::from([(pinned.file().to_string(), pin)]),
    };
    let snapshot = versions(
        Role::Snapshot,
        next(Role::Snapshot, sn_version)?,
        snapshot_expires,
        Role::Targets,
        meta_ref(tg_version, &tg_bytes),
    );
    let sn_bytes = sign_versions(p, &root, Role::Snapshot, &snapshot, signers)?;
    let timestamp = versions(
        Role::Timestamp,
        next(Role::Timestamp, ts_version)?,
        timestamp_expires,
        Role::Snapshot,
        meta_ref(snapshot.version, &sn_bytes),
    );
    sign_versions(p, &root, Role::Timestamp, &timestamp, signers)?;
    Ok((snapshot, timestamp))
}
