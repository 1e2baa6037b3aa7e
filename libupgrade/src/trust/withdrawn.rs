//! Whether the node's own last verified channel metadata withdraws a release it holds: what
//! `slot activate` (and every other activation, the agent's and `upgrade`'s) asks before it
//! lets the loader try a slot. Withdrawal is final: a slot holding a withdrawn release is
//! never activated, whatever the flags; the publisher's way back is a new release.
//!
//! The answer comes from the targets file each channel's last update kept ([`super::kept`])
//! and the node's trust record ([`super::store`]): a kept `targets.json` counts only when a
//! threshold of the targets keys of the recorded root signed it and its version is the one
//! the record last trusted. Nothing is downloaded (an activation works offline, as before); a
//! kept file that is missing, damaged or not the last verified one says nothing (logged), so
//! the check can only refuse on the node's verified word, never invent a withdrawal.
//!
//! A release is identified by the sha256 of its manifest when the slot's record has it (the
//! pin a target carries), else by version and generation.

use std::path::Path;

use chrono::{DateTime, Utc};

use super::client::MAX_TARGETS_BYTES;
use super::kept::Kept;
use super::meta::{Envelope, Role, Root, Targets};
use super::store::Store;
use super::{MetaSource, Record, TrustError};

/// A release as a slot's state record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<'a> {
    /// Its version.
    pub version: &'a str,
    /// Its generation.
    pub generation: u64,
    /// The sha256 of the manifest staged, when recorded.
    pub manifest_sha256: Option<&'a str>,
}

/// A channel's verified word that a release is withdrawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithdrawnBy {
    /// The channel (its key in the trust record: directory, base URL or GitHub repository).
    pub channel: String,
    /// The version of the targets file that says so.
    pub targets_version: u64,
    /// The target path withdrawn (`DIR/manifest.json`).
    pub target: String,
    /// When it was withdrawn.
    pub at: DateTime<Utc>,
}

impl std::fmt::Display for WithdrawnBy {
    /// E.g. "channel https://site/stable/ withdrew target v3/manifest.json at … (its signed
    /// targets version 7, as this node last verified them)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "channel {} withdrew target {} at {} (its signed targets version {}, as this node last verified them)",
            self.channel.escape_debug(),
            self.target.escape_debug(),
            super::meta::time_str(&self.at),
            self.targets_version
        )
    }
}

/// The first channel in the trust record at `store_file` whose last verified targets withdraw
/// `held`; `None` when none does (or the node keeps no verified targets).
pub fn withdrawn_by(store_file: &Path, held: &Held<'_>) -> Option<WithdrawnBy> {
    let store = match Store::load(store_file) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("withdrawal check: {e}; not consulted");
            return None;
        }
    };
    store.channels.iter().find_map(|(channel, record)| {
        let kept = Kept::for_channel(store_file, channel);
        match verified_targets(&kept, record) {
            Ok(Some(t)) => find(&t, held).map(|(target, at)| WithdrawnBy {
                channel: channel.clone(),
                targets_version: t.version,
                target,
                at,
            }),
            Ok(None) => None,
            Err(e) => {
                log::warn!(
                    "withdrawal check, channel {}: {e}; not consulted",
                    channel.escape_debug()
                );
                None
            }
        }
    })
}

/// The kept targets of one channel when they are the ones its record last trusted.
fn verified_targets(kept: &Kept, record: &Record) -> Result<Option<Targets>, TrustError> {
    let name = Role::Targets.file();
    let Some(bytes) = kept.fetch(name, MAX_TARGETS_BYTES)? else {
        return Ok(None);
    };
    let loc = kept.location(name);
    let root: Root = record.root.body(Role::Root, "trusted root")?;
    let env = Envelope::parse(&bytes, &loc)?;
    env.check_role(&root, Role::Targets, &loc)?;
    let t: Targets = env.body(Role::Targets, &loc)?;
    if t.version != record.targets {
        return Err(TrustError::WrongVersion {
            location: loc,
            expected: record.targets,
            found: t.version,
        });
    }
    Ok(Some(t))
}

/// The target of `targets` that is `held` and withdrawn, with when (pure).
fn find(targets: &Targets, held: &Held<'_>) -> Option<(String, DateTime<Utc>)> {
    targets.targets.iter().find_map(|(path, m)| {
        let c = m.custom.as_ref()?;
        let same = match held.manifest_sha256 {
            Some(sha) => m.sha256() == Some(sha),
            None => c.version == held.version && c.generation == held.generation,
        };
        let w = c.rollout.as_ref().and_then(|r| r.withdrawn)?;
        same.then(|| (path.clone(), w.at))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::manifest::Arch;
    use crate::rollout::{Rollout, Withdrawal};
    use crate::trust::meta::{file_meta, TargetCustom};

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    fn targets(withdrawn: bool) -> Targets {
        let mut m = file_meta(b"manifest of v3", None);
        m.custom = Some(TargetCustom {
            version: "v3".into(),
            generation: 3,
            arch: Arch::host(),
            rollout: withdrawn.then(|| Rollout {
                withdrawn: Some(Withdrawal { at: at() }),
                ..Rollout::default()
            }),
        });
        Targets {
            type_: "targets".into(),
            spec_version: "1.0.0".into(),
            version: 4,
            expires: at(),
            targets: BTreeMap::from([("v3/manifest.json".to_string(), m)]),
            delegations: None,
        }
    }

    #[test]
    fn a_withdrawn_target_is_found_by_manifest_hash_else_by_version_and_generation() {
        let sha = crate::trust::meta::sha256_hex(b"manifest of v3");
        let by_hash = Held {
            version: "renamed",
            generation: 9,
            manifest_sha256: Some(&sha),
        };
        assert_eq!(
            find(&targets(true), &by_hash),
            Some(("v3/manifest.json".into(), at()))
        );
        let other = Held {
            manifest_sha256: Some("00"),
            version: "v3",
            generation: 3,
        };
        assert_eq!(
            find(&targets(true), &other),
            None,
            "another release named v3"
        );
        let by_name = Held {
            manifest_sha256: None,
            ..other
        };
        assert!(find(&targets(true), &by_name).is_some());
        assert_eq!(find(&targets(false), &by_name), None);
    }

    /// A node's trust record (root 1: targets key seed 2) with `targets_file` as the kept targets of
    /// channel `c`, recorded at targets version `recorded`; the store file's path.
    fn node_with(dir: &Path, targets_file: &[u8], recorded: u64) -> std::path::PathBuf {
        use crate::trust::publish::{self, RoleSpec, SigningKey};
        let spec = |seed: u8| RoleSpec {
            keys: vec![SigningKey::from_bytes(&[seed; 32]).verifying_key()],
            threshold: 1,
        };
        let roles = Role::ALL.into_iter().zip([1, 2, 3, 4].map(spec)).collect();
        let chan = dir.join("chan");
        std::fs::create_dir_all(&chan).unwrap();
        let signer = SigningKey::from_bytes(&[1; 32]);
        publish::init_root(&chan, &roles, &[signer], at() + chrono::Duration::days(1)).unwrap();
        let root = std::fs::read(chan.join("root.json")).unwrap();
        let mut record = Record::from_root(&root, "root").unwrap();
        record.targets = recorded;
        let store_file = dir.join("state").join(crate::trust::STORE_FILE);
        let mut store = Store::load(&store_file).unwrap();
        store.channels.insert("c".into(), record);
        store.save(&store_file).unwrap();
        let digest = crate::trust::meta::sha256_hex(b"c");
        let kept = dir
            .join("state")
            .join(crate::trust::KEPT_DIR)
            .join(&digest[..32]);
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::write(kept.join("targets.json"), targets_file).unwrap();
        store_file
    }

    #[test]
    fn only_kept_targets_signed_by_the_recorded_root_at_the_recorded_version_count() {
        use crate::trust::publish::SigningKey;
        let held = Held {
            version: "v3",
            generation: 3,
            manifest_sha256: None,
        };
        let signed_by = |seed: u8| {
            Envelope::sign(&targets(true), &[SigningKey::from_bytes(&[seed; 32])]).to_bytes()
        };
        let d = tempfile::tempdir().unwrap();
        let by = withdrawn_by(&node_with(d.path(), &signed_by(2), 4), &held).unwrap();
        assert_eq!((by.channel.as_str(), by.targets_version), ("c", 4));
        assert!(
            by.to_string()
                .contains("withdrew target v3/manifest.json at"),
            "{by}"
        );
        for (why, bytes, recorded) in [
            (
                "signed by a key the root does not list for targets",
                signed_by(3),
                4,
            ),
            ("not the version last verified", signed_by(2), 5),
        ] {
            let d = tempfile::tempdir().unwrap();
            assert_eq!(
                withdrawn_by(&node_with(d.path(), &bytes, recorded), &held),
                None,
                "{why}"
            );
        }
    }

    #[test]
    fn no_record_or_no_kept_targets_says_nothing() {
        let d = tempfile::tempdir().unwrap();
        let held = Held {
            version: "v3",
            generation: 3,
            manifest_sha256: None,
        };
        assert_eq!(
            withdrawn_by(&d.path().join("channel-trust.json"), &held),
            None
        );
    }
}
