//! A node's resolution through signed metadata, honouring each release's rollout
//! ([`crate::rollout`]): `latest` is what [`rollout::offer`] offers this node now, an explicit
//! version is refused while it is withheld (unless the request says to ignore rollouts). A
//! withdrawn release is refused whatever the request says: withdrawal is final, and the one way
//! back for a publisher is a new release.
//!
//! Targets that carry no rollout at all resolve exactly as before rollouts existed (the
//! seed is then not even looked up): a v0.2.0 channel behaves as it did.

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use super::targets::{pick, Target};
use super::ChannelError;
use crate::manifest::{Arch, MANIFEST_FILE};
use crate::rollout::{self, Hold, Installed, Listed, Seed, Waiting};
use crate::trust::meta::Targets;

/// Where a resolution takes the node's seed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedSource {
    /// This seed (e.g. one per cluster, `Seed::derived_from`).
    Given(Seed),
    /// The node's seed file in this state directory, created when missing.
    File(PathBuf),
    /// The node's seed file, read only (`--plan-only`): a node without one is placed last in
    /// the fleet ([`LAST_SEED`]), so it is shown only what the whole fleet is offered.
    ReadOnly(PathBuf),
}

/// The position a read-only resolution gives a node that has no seed file yet.
pub const LAST_SEED: u32 = rollout::SEED_SPACE - 1;

/// What a node's resolution knows of the node for the rollouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRollout {
    /// Its seed.
    pub seed: SeedSource,
    /// The release it runs (generation 0 when unknown).
    pub running: Installed,
    /// The release staged (not yet activated) in its other slot.
    pub staged: Option<Installed>,
    /// Take an explicitly named version even while its wave has not reached this node or its
    /// rollout is paused (`--ignore-rollout`); never a withdrawn one.
    pub ignore_rollout: bool,
}

/// What the rollouts meant for a resolution, carried to the front end's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutNote {
    /// The seed used.
    pub seed: Seed,
    /// A newer release this node waits for, and why.
    pub waiting: Option<Waiting>,
    /// The release resolved is a required stop on the way to this one.
    pub toward: Option<String>,
    /// An explicit version taken despite its rollout (`--ignore-rollout`), and what held it.
    pub ignored: Option<Hold>,
    /// The release staged in the node's other slot is withdrawn: the node drops it (marks the
    /// slot bad so it is never activated) before staging what is offered.
    pub drop_staged: Option<Installed>,
    /// Nothing newer than the running release is offered to this node now: `latest` resolved
    /// to what it already has, and a front end stages nothing.
    pub nothing_newer: bool,
    /// Every release of this architecture the channel lists as withdrawn (oldest first), so a
    /// front end that keeps a target of its own (the agent's `status.latestVersion`) can tell
    /// that it was withdrawn.
    pub withdrawn: Vec<String>,
    /// The resolved release's [`crate::rollout::Retries`]: how a node on which it failed tries
    /// it again (None: it does not, see [`crate::rollout::decide_retry`]).
    pub retries: Option<crate::rollout::Retries>,
}

impl std::fmt::Display for RolloutNote {
    /// E.g. "seed 123456; v3 waits: this node's wave starts at …".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {}", self.seed.get())?;
        if self.nothing_newer {
            write!(f, "; nothing newer is offered to this node now")?;
        }
        if let Some(t) = &self.toward {
            write!(f, "; a required stop on the way to {}", t.escape_debug())?;
        }
        if let Some(w) = &self.waiting {
            write!(f, "; {} waits: {}", w.version.escape_debug(), w.hold)?;
        }
        if let Some(d) = &self.drop_staged {
            write!(
                f,
                "; the staged {} is withdrawn: dropped, never to be activated",
                d.version.escape_debug()
            )?;
        }
        if let Some(h) = &self.ignored {
            write!(f, "; taken with --ignore-rollout although {h}")?;
        }
        Ok(())
    }
}

/// The seed `src` names; errors name the seed file.
pub(super) fn seed_of(src: &SeedSource, channel: &str) -> Result<Seed, ChannelError> {
    let err = |e: rollout::SeedError| ChannelError::Seed {
        channel: channel.to_string(),
        source: Box::new(e),
    };
    match src {
        SeedSource::Given(s) => Ok(*s),
        SeedSource::File(dir) => Ok(rollout::load_or_create_seed(dir).map_err(err)?.seed),
        SeedSource::ReadOnly(dir) => Ok(rollout::read_seed(dir)
            .map_err(err)?
            .unwrap_or(Seed::new(LAST_SEED).expect("the last seed is in the space"))),
    }
}

/// The releases of `arch` the targets list, with their rollouts.
fn listed(targets: &Targets, arch: Arch) -> Vec<Listed> {
    targets
        .targets
        .iter()
        .filter(|(p, _)| p.ends_with(&format!("/{MANIFEST_FILE}")))
        .filter_map(|(p, m)| {
            m.custom
                .as_ref()
                .filter(|c| super::targets::plain(p, &c.version))
        })
        .filter(|c| c.arch == arch)
        .map(|c| Listed {
            version: c.version.clone(),
            generation: c.generation,
            rollout: c.rollout.clone(),
        })
        .collect()
}

/// The target a node resolves `version` (None/`latest`: the newest offered to it) to at `now`,
/// and what the rollouts meant; `None` for the note when no target carries a rollout.
pub(super) fn pick_for<'a>(
    channel: &str,
    targets: &'a Targets,
    version: Option<&str>,
    arch: Arch,
    node: &NodeRollout,
    now: DateTime<Utc>,
) -> Result<Option<(Target<'a>, Option<RolloutNote>)>, ChannelError> {
    let all = listed(targets, arch);
    if all.iter().all(|l| l.rollout.is_none()) {
        return Ok(pick(targets, version, arch).map(|t| (t, None)));
    }
    let seed = seed_of(&node.seed, channel)?;
    let at = Asked {
        channel,
        targets,
        arch,
        node,
        seed,
        all: &all,
    };
    let picked = match version.filter(|v| *v != "latest") {
        Some(v) => at.explicit(v, now),
        None => at.latest(now),
    }?;
    Ok(picked.map(|(t, note)| {
        let retries = all
            .iter()
            .find(|l| l.version == t.2.version && l.generation == t.2.generation)
            .and_then(|l| l.rollout.as_ref())
            .and_then(|r| r.retries);
        (t, note.map(|n| RolloutNote { retries, ..n }))
    }))
}

/// One resolution under rollouts: the channel, its targets for this node's architecture, the
/// node and its seed.
struct Asked<'a, 'n> {
    channel: &'n str,
    targets: &'a Targets,
    arch: Arch,
    node: &'n NodeRollout,
    seed: Seed,
    all: &'n [Listed],
}

impl<'a> Asked<'a, '_> {
    fn note(
        &self,
        waiting: Option<Waiting>,
        toward: Option<String>,
        ignored: Option<Hold>,
    ) -> RolloutNote {
        RolloutNote {
            seed: self.seed,
            waiting,
            toward,
            ignored,
            drop_staged: None,
            nothing_newer: false,
            withdrawn: self.withdrawn(),
            retries: None,
        }
    }

    /// The versions of the withdrawn releases, oldest first.
    fn withdrawn(&self) -> Vec<String> {
        let mut gone: Vec<&Listed> = self
            .all
            .iter()
            .filter(|l| l.rollout.as_ref().is_some_and(|r| r.withdrawn.is_some()))
            .collect();
        gone.sort_by_key(|l| l.generation);
        gone.into_iter().map(|l| l.version.clone()).collect()
    }

    /// An explicit version: offered only once its rollout admits this node (or the request
    /// ignores rollouts, which the note records). A withdrawn one is refused even then.
    fn explicit(
        &self,
        v: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<(Target<'a>, Option<RolloutNote>)>, ChannelError> {
        let Some(t) = pick(self.targets, Some(v), self.arch) else {
            return Ok(None);
        };
        let l = self
            .all
            .iter()
            .find(|l| l.version == t.2.version && l.generation == t.2.generation)
            .expect("a picked target is listed");
        let started = self
            .node
            .staged
            .as_ref()
            .is_some_and(|s| s.version == l.version && s.generation == l.generation);
        match rollout::admission(self.seed, now, l, started) {
            Ok(()) => Ok(Some((t, Some(self.note(None, None, None))))),
            Err(hold) if self.node.ignore_rollout && !matches!(hold, Hold::Withdrawn { .. }) => {
                Ok(Some((t, Some(self.note(None, None, Some(hold))))))
            }
            Err(hold) => Err(ChannelError::Withheld {
                channel: self.channel.to_string(),
                version: l.version.clone(),
                seed: self.seed.get(),
                hold,
                withdrawn: self.withdrawn(),
            }),
        }
    }

    /// `latest`: what [`rollout::offer`] gives this node now; when nothing newer is offered,
    /// what the node already has (its running release when listed, else the newest older one
    /// not withdrawn), with what it waits for.
    fn latest(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Option<(Target<'a>, Option<RolloutNote>)>, ChannelError> {
        let node = self.node;
        let offer = rollout::offer(
            &rollout::Node {
                seed: self.seed,
                running: node.running.clone(),
                staged: node.staged.clone(),
            },
            now,
            self.all,
        );
        if let Some(step) = offer.take {
            let t = pick(self.targets, Some(&step.version), self.arch)
                .expect("an offered release is listed");
            let note = RolloutNote {
                drop_staged: offer.drop_staged,
                ..self.note(offer.waiting, step.toward, None)
            };
            return Ok(Some((t, Some(note))));
        }
        let withdrawn = |l: &Listed| l.rollout.as_ref().is_some_and(|r| r.withdrawn.is_some());
        let have = self
            .all
            .iter()
            .filter(|l| l.generation <= node.running.generation)
            .filter(|l| l.version == node.running.version || !withdrawn(l))
            .max_by_key(|l| (l.version == node.running.version, l.generation));
        match have {
            Some(l) => {
                let t = pick(self.targets, Some(&l.version), self.arch)
                    .expect("a listed release is picked");
                let note = RolloutNote {
                    nothing_newer: true,
                    drop_staged: offer.drop_staged,
                    ..self.note(offer.waiting, None, None)
                };
                Ok(Some((t, Some(note))))
            }
            None => Err(ChannelError::NothingOffered {
                channel: self.channel.to_string(),
                running: node.running.version.clone(),
                seed: self.seed.get(),
                waiting: offer
                    .waiting
                    .map(|w| format!("{} waits: {}", w.version, w.hold)),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rollout::{Rollout, Wave};
    use crate::trust::meta::{file_meta, FileMeta};

    fn t(h: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    /// A target entry exactly as a v0.2.0 `release targets` wrote it (no `rollout`).
    const V020_TARGET: &str = r#"{"custom":{"arch":"ARCH","generation":GEN,"version":"VER"},"hashes":{"sha256":"00"},"length":1}"#;

    fn v020(version: &str, generation: u64) -> FileMeta {
        let text = V020_TARGET
            .replace("ARCH", Arch::host().as_str())
            .replace("GEN", &generation.to_string())
            .replace("VER", version);
        serde_json::from_str(&text).unwrap()
    }

    fn targets(entries: Vec<(&str, FileMeta)>) -> Targets {
        Targets {
            type_: "targets".into(),
            spec_version: "1.0.0".into(),
            version: 1,
            expires: t(1000),
            targets: entries
                .into_iter()
                .map(|(v, m)| (format!("{v}/{MANIFEST_FILE}"), m))
                .collect::<BTreeMap<_, _>>(),
            delegations: None,
        }
    }

    fn node(seed: SeedSource, running: u64) -> NodeRollout {
        NodeRollout {
            seed,
            running: Installed {
                version: format!("v{running}"),
                generation: running,
            },
            staged: None,
            ignore_rollout: false,
        }
    }

    #[test]
    fn v020_targets_read_without_rollout_and_write_back_the_same_bytes() {
        let m = v020("v2", 2);
        assert_eq!(m.custom.as_ref().unwrap().rollout, None);
        let back = serde_json::to_string(&m).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&back).unwrap()["custom"]
                .as_object()
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn targets_without_rollouts_resolve_as_before_and_never_look_up_the_seed() {
        let tg = targets(vec![("v1", v020("v1", 1)), ("v2", v020("v2", 2))]);
        // A seed file that cannot be read would fail the resolution if it were looked at.
        let n = node(SeedSource::File("/nonexistent/state".into()), 1);
        let (picked, note) = pick_for("c", &tg, None, Arch::host(), &n, t(0))
            .unwrap()
            .unwrap();
        assert_eq!(picked.2.version, "v2");
        assert_eq!(note, None);
        let plain = pick(&tg, None, Arch::host()).unwrap();
        assert_eq!(picked, plain);
    }

    #[test]
    fn latest_waits_for_the_wave_and_a_withheld_version_is_refused_by_name() {
        let mut v3 = file_meta(b"x", None);
        v3.custom = Some(crate::trust::meta::TargetCustom {
            version: "v3".into(),
            generation: 3,
            arch: Arch::host(),
            rollout: Some(Rollout {
                waves: vec![Wave {
                    share_bp: 10_000,
                    start: t(10),
                }],
                ..Rollout::default()
            }),
        });
        let tg = targets(vec![("v2", v020("v2", 2)), ("v3", v3)]);
        let n = node(SeedSource::Given(Seed::new(7).unwrap()), 1);
        let (p, note) = pick_for("c", &tg, None, Arch::host(), &n, t(0))
            .unwrap()
            .unwrap();
        let note = note.unwrap();
        assert_eq!(p.2.version, "v2");
        assert_eq!(note.waiting.as_ref().unwrap().version, "v3");
        assert!(
            note.to_string()
                .contains(&format!("v3 waits: this node's wave starts at {}", t(10))),
            "{note}"
        );
        let e = pick_for("c", &tg, Some("v3"), Arch::host(), &n, t(0)).unwrap_err();
        assert!(
            e.to_string()
                .contains("release v3 is not offered to this node (seed 7)"),
            "{e}"
        );
        let ignoring = NodeRollout {
            ignore_rollout: true,
            ..n.clone()
        };
        let (p, note) = pick_for("c", &tg, Some("v3"), Arch::host(), &ignoring, t(0))
            .unwrap()
            .unwrap();
        assert_eq!(p.2.version, "v3");
        assert!(note.unwrap().ignored.is_some());
        let (p, _) = pick_for("c", &tg, None, Arch::host(), &n, t(10))
            .unwrap()
            .unwrap();
        assert_eq!(p.2.version, "v3");
        // A read-only node without a seed file is placed last: shown only the whole fleet's.
        let dir = tempfile::tempdir().unwrap();
        let ro = node(SeedSource::ReadOnly(dir.path().into()), 1);
        let (_, note) = pick_for("c", &tg, None, Arch::host(), &ro, t(0))
            .unwrap()
            .unwrap();
        assert_eq!(note.unwrap().seed.get(), LAST_SEED);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_note_lists_the_withdrawn_releases_oldest_first() {
        let with = |version: &str, generation: u64, r: Rollout| {
            let mut m = file_meta(b"x", None);
            m.custom = Some(crate::trust::meta::TargetCustom {
                version: version.into(),
                generation,
                arch: Arch::host(),
                rollout: Some(r),
            });
            m
        };
        let gone = Rollout {
            withdrawn: Some(crate::rollout::Withdrawal { at: t(1) }),
            ..Rollout::default()
        };
        let tg = targets(vec![
            ("v1", v020("v1", 1)),
            ("v4", with("v4", 4, gone.clone())),
            ("v2", with("v2", 2, gone)),
            ("v3", with("v3", 3, Rollout::default())),
        ]);
        let n = node(SeedSource::Given(Seed::new(7).unwrap()), 1);
        for version in [None, Some("v3")] {
            let (p, note) = pick_for("c", &tg, version, Arch::host(), &n, t(2))
                .unwrap()
                .unwrap();
            assert_eq!(p.2.version, "v3");
            assert_eq!(note.unwrap().withdrawn, ["v2", "v4"]);
        }
    }

    #[test]
    fn a_withdrawn_version_is_refused_even_with_ignore_rollout_and_the_hint_says_so() {
        let gone = Rollout {
            withdrawn: Some(crate::rollout::Withdrawal { at: t(1) }),
            ..Rollout::default()
        };
        let mut v1 = file_meta(b"x", None);
        v1.custom = Some(crate::trust::meta::TargetCustom {
            version: "v1".into(),
            generation: 1,
            arch: Arch::host(),
            rollout: Some(gone.clone()),
        });
        let mut v3 = v1.clone();
        v3.custom = Some(crate::trust::meta::TargetCustom {
            version: "v3".into(),
            generation: 3,
            arch: Arch::host(),
            rollout: Some(gone),
        });
        let tg = targets(vec![("v1", v1), ("v2", v020("v2", 2)), ("v3", v3)]);
        let ignoring = NodeRollout {
            ignore_rollout: true,
            // Staged already: "started" never admits a withdrawn release either.
            staged: Some(Installed {
                version: "v3".into(),
                generation: 3,
            }),
            ..node(SeedSource::Given(Seed::new(7).unwrap()), 2)
        };
        // Newer (v3) and older (v1, what `--allow-downgrade` would reach) alike.
        for v in ["v3", "v1"] {
            let e = pick_for("c", &tg, Some(v), Arch::host(), &ignoring, t(2)).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(&e, ChannelError::Withheld { hold: Hold::Withdrawn { .. }, version, .. } if version == v),
                "{msg}"
            );
            assert!(
                msg.contains(&format!("release {v} is not offered")),
                "{msg}"
            );
            assert!(msg.contains("a withdrawn release is never taken"), "{msg}");
            assert!(!msg.contains("--ignore-rollout"), "{msg}");
        }
    }

    #[test]
    fn a_listed_version_that_is_not_a_plain_name_is_never_resolved_to() {
        let tg = targets(vec![("v1", v020("v1", 1)), ("evil", v020("../../x", 9))]);
        let n = node(SeedSource::Given(Seed::new(7).unwrap()), 1);
        let (p, _) = pick_for("c", &tg, None, Arch::host(), &n, t(0))
            .unwrap()
            .unwrap();
        assert_eq!(p.2.version, "v1", "the newest plain-named release");
        assert!(pick(&tg, Some("../../x"), Arch::host()).is_none());
        // With rollouts, the offer is made among plain names only (no panic on a missing pick).
        let mut v2 = file_meta(b"x", None);
        v2.custom = Some(crate::trust::meta::TargetCustom {
            version: "../../y".into(),
            generation: 10,
            arch: Arch::host(),
            rollout: Some(Rollout::default()),
        });
        let tg = targets(vec![("v1", v020("v1", 1)), ("evil", v2)]);
        let (p, _) = pick_for("c", &tg, None, Arch::host(), &n, t(0))
            .unwrap()
            .unwrap();
        assert_eq!(p.2.version, "v1");
    }
}
