//! The stage plan: a pure decision, from the target slot's record, the download checkpoint
//! and what the preflight found on the server, of what a stage run does — nothing (the slot
//! already holds this release), or, per artifact, skip it (an interrupted run completed it),
//! write it chunk by chunk (it has a usable chunk index), or stream it whole from a position.
//! Like RAUC's install plans: made before anything is written, then handed to one executor
//! per kind ([`super::Stager::execute`]). Tested without disks.

use bootconfig::Slot;

use crate::checkpoint::Partial;
use crate::manifest::Artifact;
use crate::state::{SlotRecord, SlotState};

/// How one artifact is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// Written and verified by an interrupted run of this release into this slot.
    Done,
    /// Chunk by chunk from its index: kept, copied from the running slot or fetched.
    Chunked,
    /// Streamed whole, from byte `resume_at` (a checkpointed position of an interrupted run).
    Stream { resume_at: u64 },
}

/// What a stage run writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePlan {
    /// An interrupted run of this release into this slot is continued: its checkpoint is kept
    /// and what the target holds is re-verified; otherwise the slot is invalidated first.
    pub resume: bool,
    /// In [`Artifact::ALL`] order.
    pub steps: [(Artifact, How); 3],
}

/// The slot already holds exactly this release (staged or on trial): nothing to do.
pub fn staged_already(target: &SlotRecord, manifest_sha256: &str) -> bool {
    matches!(target.state, SlotState::Staged | SlotState::Trying)
        && target.manifest_sha256.as_deref() == Some(manifest_sha256)
}

/// The writes for release `manifest_sha256` into `slot`, whose record says `state`:
/// `checkpoint` is continued when it is of this release into this slot and the slot is still
/// invalid (a run was interrupted after invalidating it); `has_index[k]` says whether
/// artifact `k` has a chunk index the server can serve by range.
pub fn plan_writes(
    slot: Slot,
    state: SlotState,
    manifest_sha256: &str,
    checkpoint: Option<&Partial>,
    has_index: [bool; 3],
) -> WritePlan {
    let resumed = checkpoint.filter(|p| {
        p.slot == slot && p.manifest_sha256 == manifest_sha256 && state == SlotState::Invalid
    });
    let step = |k: usize| {
        let a = Artifact::ALL[k];
        let how = if resumed.is_some_and(|p| p.done.contains(&a)) {
            How::Done
        } else if has_index[k] {
            How::Chunked
        } else {
            How::Stream {
                resume_at: match resumed.and_then(|p| p.current) {
                    Some((ca, pos)) if ca == a => pos,
                    _ => 0,
                },
            }
        };
        (a, how)
    };
    WritePlan {
        resume: resumed.is_some(),
        steps: [step(0), step(1), step(2)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial(slot: Slot, sha: &str) -> Partial {
        Partial {
            slot,
            manifest_sha256: sha.into(),
            done: vec![Artifact::Rootfs],
            current: Some((Artifact::Kernel, 4096)),
            fetched: 0,
            reused: 0,
        }
    }

    #[test]
    fn a_fresh_stage_writes_everything_from_the_start() {
        let p = plan_writes(Slot::B, SlotState::Empty, "m", None, [true, false, false]);
        assert!(!p.resume);
        assert_eq!(
            p.steps,
            [
                (Artifact::Rootfs, How::Chunked),
                (Artifact::Kernel, How::Stream { resume_at: 0 }),
                (Artifact::Initrd, How::Stream { resume_at: 0 }),
            ]
        );
    }

    #[test]
    fn an_interrupted_run_of_the_same_release_is_continued() {
        let cp = partial(Slot::B, "m");
        let p = plan_writes(Slot::B, SlotState::Invalid, "m", Some(&cp), [false; 3]);
        assert!(p.resume);
        assert_eq!(
            p.steps,
            [
                (Artifact::Rootfs, How::Done),
                (Artifact::Kernel, How::Stream { resume_at: 4096 }),
                (Artifact::Initrd, How::Stream { resume_at: 0 }),
            ]
        );
    }

    #[test]
    fn a_checkpoint_of_another_release_slot_or_state_is_not_continued() {
        for (slot, state, sha) in [
            (Slot::A, SlotState::Invalid, "m"),
            (Slot::B, SlotState::Invalid, "other"),
            (Slot::B, SlotState::Bad, "m"),
        ] {
            let cp = partial(slot, sha);
            let p = plan_writes(Slot::B, state, "m", Some(&cp), [false; 3]);
            assert!(!p.resume, "{slot} {state:?} {sha}");
            assert!(p
                .steps
                .iter()
                .all(|(_, h)| *h == How::Stream { resume_at: 0 }));
        }
    }

    #[test]
    fn staged_or_trying_with_the_same_manifest_is_already_staged() {
        let mut r = SlotRecord::empty();
        r.manifest_sha256 = Some("m".into());
        for (state, want) in [
            (SlotState::Staged, true),
            (SlotState::Trying, true),
            (SlotState::Good, false),
            (SlotState::Invalid, false),
        ] {
            r.state = state;
            assert_eq!(staged_already(&r, "m"), want, "{state:?}");
        }
        r.state = SlotState::Staged;
        assert!(!staged_already(&r, "other"));
    }
}
