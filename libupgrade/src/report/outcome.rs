//! Pure: which report, if any, an outcome of the node's flows makes.

use fleet_report::{Outcome, Transfer, WaitFor};

use crate::boot::assess::{Outcome as BootOutcome, Verdict};
use crate::channel::RolloutNote;
use crate::rollout::{Hold, Retry};
use crate::stage::StageReport;
use crate::state::{OtherSlot, SlotState};

/// What a report says besides its outcome: the release it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The outcome.
    pub outcome: Outcome,
    /// The release's version (empty: unknown).
    pub version: String,
    /// Its generation (0: unknown).
    pub generation: u64,
}

/// The report of a finished stage: `staged` with the bytes fetched and how, or `stage_failed`
/// with the error's chain. A release that was already staged, and an attempt that stopped
/// where it was told to (a byte budget, a download window: resumable, not a failure), are no
/// new outcome.
pub fn of_stage(
    res: &crate::Result<StageReport>,
    version: Option<&str>,
    generation: Option<u64>,
) -> Option<Note> {
    match res {
        Ok(r) if r.already_staged => None,
        Err(crate::Error::Stopped { .. }) => None,
        Ok(r) => Some(Note {
            outcome: Outcome::Staged {
                bytes: r.bytes_fetched,
                by: if !r.patched.is_empty() {
                    Transfer::Patch
                } else if r.bytes_reused > 0 {
                    Transfer::Chunks
                } else {
                    Transfer::Full
                },
            },
            version: r.version.clone(),
            generation: r.generation,
        }),
        Err(e) => Some(Note {
            outcome: Outcome::StageFailed {
                why: crate::chain_line(e),
            },
            version: version.unwrap_or_default().to_string(),
            generation: generation.unwrap_or(0),
        }),
    }
}

/// What a wait is for, from its hold (a required stop's hold is the stop's own); None for
/// holds that are no wait of this node's turn (withdrawn, unreadable, a missing stop).
fn wait_for(hold: &Hold) -> Option<(WaitFor, Option<u64>)> {
    match hold {
        Hold::Wave { starts } => Some((WaitFor::Wave, starts.map(|t| t.timestamp().max(0) as u64))),
        Hold::Paused { .. } => Some((WaitFor::Pause, None)),
        Hold::Stop { hold, .. } => wait_for(hold),
        _ => None,
    }
}

/// The report of a channel resolution's wait, and the key that tells it from the last one
/// reported: a node polling while the same release waits for the same reason reports once.
pub fn of_wait(note: &RolloutNote) -> Option<(Note, String)> {
    let w = note.waiting.as_ref()?;
    let (for_, until) = wait_for(&w.hold)?;
    let key = format!("{} {} {for_:?} {until:?}", w.version, w.generation);
    Some((
        Note {
            outcome: Outcome::Waiting {
                wait_for: for_,
                until,
            },
            version: w.version.clone(),
            generation: w.generation,
        },
        key,
    ))
}

/// The report of a release held back because it failed on this node (`retry`, the node's
/// [`crate::rollout::decide_retry`] for it), and its key: `waiting {for: "retry", until}` with
/// `until` when the rollout's retries allow the next attempt (None: held for good). The key
/// holds the decision's sentence, which names the attempts, the last failure and `until`, so
/// a node polling while nothing changed reports once, and again after each new failure or a
/// rollout that changes its retries. None when the release proceeds.
pub fn of_retry(rel: &crate::Release, retry: &Retry) -> Option<(Note, String)> {
    let Retry::Wait { why, until } = retry else {
        return None;
    };
    let version = rel.version.clone().unwrap_or_default();
    let generation = rel.generation.unwrap_or(0);
    let until = until.map(|t| t.timestamp().max(0) as u64);
    let key = format!("{version} {generation} Retry {until:?} {why}");
    Some((
        Note {
            outcome: Outcome::Waiting {
                wait_for: WaitFor::Retry,
                until,
            },
            version,
            generation,
        },
        key,
    ))
}

/// The report of a withdrawn staged release dropped by a resolution.
pub fn of_drop(note: &RolloutNote) -> Option<Note> {
    note.drop_staged.as_ref().map(|d| Note {
        outcome: Outcome::WithdrawnDropped,
        version: d.version.clone(),
        generation: d.generation,
    })
}

/// The reports of a boot's assessment: the other slot's fallback (the release that never
/// confirmed), then the booted slot's bless or rollback when it changed the booted slot's
/// state (`booted_before`: a second `confirm` in the same boot repeats the verdict, not the
/// outcome). A boot that was already good, is still pending or unhealthy without a way back
/// makes none: an idle node reports nothing.
pub fn of_verdict(
    v: &Verdict,
    fell_back: Option<(&str, u64)>,
    booted_generation: u64,
    booted_before: SlotState,
) -> Vec<Note> {
    let mut out = Vec::new();
    if let (Some(OtherSlot::FallbackTaken { used, tries, slot }), Some((ver, generation))) =
        (&v.other_slot, fell_back)
    {
        out.push(Note {
            outcome: Outcome::FellBack {
                why: format!(
                    "slot {slot} never confirmed: the loader fell back after {used} of {tries} tries"
                ),
            },
            version: ver.to_string(),
            generation,
        });
    }
    let booted = |outcome| Note {
        outcome,
        version: v.version.clone().unwrap_or_default(),
        generation: booted_generation,
    };
    match &v.outcome {
        BootOutcome::Blessed if booted_before != SlotState::Good => {
            out.push(booted(Outcome::Blessed))
        }
        BootOutcome::RolledBack { .. } if booted_before != SlotState::Bad => {
            out.push(booted(Outcome::RolledBack {
                why: v.reason.clone(),
            }))
        }
        _ => {}
    }
    out
}

/// Notes of one event on one slot record (activation, manual rollback).
pub(crate) fn note_of(outcome: fleet_report::Outcome, rec: &crate::state::SlotRecord) -> Note {
    Note {
        outcome,
        version: rec.version.clone().unwrap_or_default(),
        generation: rec.generation.unwrap_or(0),
    }
}
