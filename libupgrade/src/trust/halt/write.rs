//! The guard's side of the halt: the next `halt.json` (pure), its signature by the halt
//! role's keys only, and writing it into a served channel directory after the channel's
//! metadata verified (as every publisher command does first).

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, SubsecRound, Utc};

use super::{
    delegation, entry_for, holds_lift, verify, HaltCustom, HaltDoc, HaltTarget, Mark, HALT_FILE,
    HALT_PREFIX, MAX_HALT_BYTES,
};
use crate::trust::client::served::verify_served;
use crate::trust::kept::DirMeta;
use crate::trust::meta::{self, Envelope, Key, Targets};
use crate::trust::store::write_atomic;
use crate::trust::MetaSource;
use crate::trust::TrustError;

/// The entry name of the release whose target is `path` (`DIR/manifest.json` → `halt/DIR`,
/// a `/` inside DIR written `_`: the delegated pattern `halt/*` matches one path segment).
pub fn entry_name(path: &str) -> String {
    let dir = path
        .strip_suffix(crate::manifest::MANIFEST_FILE)
        .unwrap_or(path)
        .trim_end_matches('/');
    format!("{HALT_PREFIX}{}", dir.replace('/', "_"))
}

/// The guard's next `halt.json`: `current` (None: the first) one version up with `expires`,
/// and a halt `mark` of every target of `targets` that lists release `version` and is not
/// already held by an entry (an existing halt keeps its `since`; one the publisher lifted is
/// replaced). Pure. Returns the document and the entries it added.
pub fn next_doc(
    current: Option<&HaltDoc>,
    targets: &Targets,
    halt: Option<(&str, &Mark)>,
    expires: DateTime<Utc>,
) -> Result<(HaltDoc, Vec<String>), TrustError> {
    let mut doc = current.cloned().unwrap_or(HaltDoc {
        type_: "targets".into(),
        spec_version: meta::SPEC_VERSION.into(),
        version: 0,
        expires,
        targets: BTreeMap::new(),
    });
    doc.version = doc
        .version
        .checked_add(1)
        .ok_or_else(|| TrustError::Publish {
            what: HALT_FILE.into(),
            why: format!("version {} has no successor", doc.version),
        })?;
    // TUF writes whole seconds (python-tuf refuses anything else).
    doc.expires = expires.trunc_subsecs(0);
    let mut added = Vec::new();
    let Some((version, mark)) = halt else {
        return Ok((doc, added));
    };
    for (path, m) in &targets.targets {
        let Some(c) = m.custom.as_ref().filter(|c| c.version == version) else {
            continue;
        };
        let Some(sha) = m.sha256() else { continue };
        let live = entry_for(&doc, m.length, sha).filter(|old| holds_lift(c.rollout.as_ref(), old));
        if live.is_some() {
            continue;
        }
        let name = entry_name(path);
        doc.targets.insert(
            name.clone(),
            HaltTarget {
                length: m.length,
                hashes: BTreeMap::from([("sha256".to_string(), sha.to_string())]),
                custom: HaltCustom {
                    halt: Mark {
                        since: mark.since.trunc_subsecs(0),
                        reason: mark.reason.clone(),
                    },
                },
            },
        );
        added.push(name);
    }
    Ok((doc, added))
}

/// Sign `doc` with the `signers` that are keys of the halt delegation of `targets`, and check
/// the threshold (nothing is returned when it is not met: the guard cannot publish a halt the
/// nodes would refuse).
pub fn sign(
    targets: &Targets,
    doc: &HaltDoc,
    signers: &[ed25519_dalek::SigningKey],
) -> Result<Envelope, TrustError> {
    let (keys, rk) = delegation(targets).ok_or_else(|| TrustError::Publish {
        what: format!("targets version {}", targets.version),
        why: "it delegates no halt role: the publisher adds the guard's key with `k3os-ops release delegate-halt`".into(),
    })?;
    let mine: Vec<_> = signers
        .iter()
        .filter(|s| rk.keyids.contains(&Key::ed25519(&s.verifying_key()).id()))
        .cloned()
        .collect();
    let env = Envelope::sign(doc, &mine);
    let what = format!("new {HALT_FILE} version {}", doc.version);
    let found = env.count_valid(keys, &rk, &what)?;
    let need = rk.threshold.max(1) as usize;
    if found < need {
        return Err(TrustError::Publish {
            what,
            why: format!(
                "{found} of the given key(s) belong to the halt role delegated by targets version {}, {need} required",
                targets.version
            ),
        });
    }
    Ok(env)
}

/// What [`write_served`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The new `halt.json` document.
    pub doc: HaltDoc,
    /// The entries it added (empty: only re-signed, to keep it fresh).
    pub added: Vec<String>,
}

/// Write the next `halt.json` into the channel directory `dir` ([`next_doc`], [`sign`]): the
/// served metadata must verify first (the delegation is read from the verified targets, and
/// the served `halt.json` must verify against it, expiry aside), nothing is written otherwise.
pub fn write_served(
    dir: &Path,
    halt: Option<(&str, &Mark)>,
    signers: &[ed25519_dalek::SigningKey],
    expires: DateTime<Utc>,
) -> Result<Written, TrustError> {
    let (targets, _) = verify_served(dir)?
        .targets
        .ok_or_else(|| TrustError::Publish {
            what: dir.join("targets.json").display().to_string(),
            why: "no targets: the publisher runs `k3os-ops release targets` first".into(),
        })?;
    let current = served(dir, &targets)?;
    let (doc, added) = next_doc(current.as_ref(), &targets, halt, expires)?;
    let env = sign(&targets, &doc, signers)?;
    write_atomic(dir, HALT_FILE, &env.to_bytes())?;
    Ok(Written { doc, added })
}

/// The `halt.json` served from the channel directory `dir`, verified against the delegation of
/// its verified `targets` (expiry not checked: the publisher's and the guard's view, as for
/// every served file); `None`: no delegation or no file.
pub fn served(dir: &Path, targets: &Targets) -> Result<Option<HaltDoc>, TrustError> {
    let src = DirMeta(dir.to_path_buf());
    let loc = src.location(HALT_FILE);
    let bytes = src.fetch(HALT_FILE, MAX_HALT_BYTES)?;
    Ok(verify(targets, bytes.as_deref(), &loc, None, None)?.map(|h| h.doc))
}
