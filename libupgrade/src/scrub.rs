//! `slot verify`: re-read both slots against their signed dm-verity trees (issue 34 item 5).
//!
//! Each slot that holds a complete release made with `--verity` (state staged, trying or
//! good) whose tree and FEC this node's stage wrote (`slotfiles::verity_written`; a slot
//! staged by an earlier k3os-ops has none and is not judged) is read whole: every tree block against the signed root, every data block against
//! the tree, and the FEC area against its signed sha256 ([`crate::verity::scrub`]). On the
//! slot that is not booted, what FEC can correct is written back and a damaged FEC area is
//! recomputed; what it cannot leaves the slot marked bad in the loader and the state file, so
//! that a fallback never lands on a slot that rotted while nobody looked. The booted slot is
//! never opened for writing: its damage is reported (its reads go through the kernel's
//! dm-verity, which corrects with the same FEC or fails the read).

use bootconfig::Slot;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::manifest::{Manifest, Verity};
use crate::state::SlotState;
use crate::updater::Updater;
use crate::verity::{scrub, Scrub, ScrubOutcome};

/// What a scrub did with one slot.
#[derive(Debug, Clone, Serialize)]
pub struct SlotScrub {
    /// The slot.
    pub slot: Slot,
    /// The release it holds, when it holds one.
    pub version: Option<String>,
    /// It is the booted slot (read only).
    pub booted: bool,
    /// Why it was not read (no complete release, or one without dm-verity).
    pub skipped: Option<String>,
    /// What the read found and repaired.
    pub outcome: Option<ScrubSummary>,
    /// It was marked bad because of damage FEC could not correct.
    pub marked_bad: bool,
}

/// The counts of a [`ScrubOutcome`], for an operator and `--json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScrubSummary {
    /// 4 KiB blocks still damaged (data, then tree).
    pub damaged: u64,
    /// The first few of them (block numbers), for the message.
    pub first_damaged: Vec<u64>,
    /// Blocks below a damaged tree block, not checkable.
    pub unverified: u64,
    /// Blocks corrected from FEC and written back.
    pub repaired: u64,
    /// The FEC area did not hash to the signed sha256.
    pub fec_damaged: bool,
    /// The FEC area was recomputed and written back.
    pub fec_rewritten: bool,
}

impl From<&ScrubOutcome> for ScrubSummary {
    fn from(o: &ScrubOutcome) -> Self {
        ScrubSummary {
            damaged: o.damaged.len() as u64,
            first_damaged: o.damaged.iter().take(8).copied().collect(),
            unverified: o.unverified,
            repaired: o.repaired.len() as u64,
            fec_damaged: o.fec_damaged,
            fec_rewritten: o.fec_rewritten,
        }
    }
}

impl SlotScrub {
    /// Every block verifies (after repair) and the FEC area is the signed one; or not read.
    pub fn clean(&self) -> bool {
        self.outcome.as_ref().is_none_or(|o| {
            o.damaged == 0 && o.unverified == 0 && (!o.fec_damaged || o.fec_rewritten)
        })
    }
}

impl Updater {
    /// One read of `slot`'s verity device; with `repair`, writing what FEC corrects.
    fn scrub_pass(
        &self,
        slot: Slot,
        m: &Manifest,
        v: &Verity,
        repair: bool,
    ) -> Result<ScrubOutcome> {
        let dev = self.layout.verity_device(slot, &m.version, v, repair)?;
        let g = v.geometry();
        let mut fec_sha256 = [0u8; 32];
        hex::decode_to_slice(&v.fec_sha256, &mut fec_sha256).expect("checked when parsed");
        let salt = v.salt_bytes();
        let s = Scrub {
            geometry: &g,
            salt: &salt,
            root: v.root(),
            fec_sha256,
            repair,
        };
        let place = self.layout.place(slot, crate::manifest::Artifact::Rootfs);
        let found = scrub(&dev, &s).map_err(|e| Error::io("scrub", &place, e))?;
        if repair {
            dev.sync().map_err(|e| Error::io("fsync", &place, e))?;
        }
        Ok(found)
    }

    /// The slot's state and release are still `held` (what the scrub started from).
    fn still_holds(
        &self,
        slot: Slot,
        booted: Slot,
        held: &(SlotState, Option<String>),
    ) -> Result<bool> {
        let st = self.load(Some(booted))?;
        let r = st.slot(slot);
        Ok(r.state == held.0 && r.manifest_sha256 == held.1)
    }

    /// Scrub both slots (see the module docs); with `repair`, correct the slot that is not
    /// booted and mark it bad when FEC cannot.
    pub fn verify_slots(&self, repair: bool) -> Result<Vec<SlotScrub>> {
        let booted = self.booted_slot()?;
        Slot::ALL
            .iter()
            .map(|&s| self.verify_slot(s, booted, repair && s != booted))
            .collect()
    }

    fn verify_slot(&self, slot: Slot, booted: Slot, repair: bool) -> Result<SlotScrub> {
        let st = self.load(Some(booted))?;
        let rec = st.slot(slot);
        let mut out = SlotScrub {
            slot,
            version: rec.version.clone(),
            booted: slot == booted,
            skipped: None,
            outcome: None,
            marked_bad: false,
        };
        if !matches!(
            rec.state,
            SlotState::Staged | SlotState::Trying | SlotState::Good
        ) {
            out.skipped = Some(format!("{}: holds no complete release", rec.state));
            return Ok(out);
        }
        let Some(m) = crate::slotfiles::manifest(&self.cfg.state_dir, slot)? else {
            out.skipped = Some("no signed manifest is kept for it".into());
            return Ok(out);
        };
        let Some(v) = m.verity.clone() else {
            out.skipped = Some("its release was made without dm-verity".into());
            return Ok(out);
        };
        if crate::slotfiles::verity_written(&self.cfg.state_dir, slot)?.as_deref()
            != Some(&v.root_hash)
        {
            out.skipped = Some(
                "its dm-verity tree was never written (staged by an earlier k3os-ops, or installed by an image builder)".into(),
            );
            return Ok(out);
        }
        // Read first, write only when there is damage, and only while the slot still holds
        // what was read: a stage (which takes no lock) may start on it meanwhile.
        let held = (rec.state, rec.manifest_sha256.clone());
        let mut found = self.scrub_pass(slot, &m, &v, false)?;
        let damaged = |o: &ScrubOutcome| !o.damaged.is_empty() || o.unverified > 0 || o.fec_damaged;
        if repair && damaged(&found) {
            if !self.still_holds(slot, booted, &held)? {
                out.skipped = Some(
                    "changed while it was read (a stage or an activation): not repaired".into(),
                );
                out.outcome = Some(ScrubSummary::from(&found));
                return Ok(out);
            }
            found = self.scrub_pass(slot, &m, &v, true)?;
        }
        out.outcome = Some(ScrubSummary::from(&found));
        if repair && !out.clean() && self.still_holds(slot, booted, &held)? {
            let o = out.outcome.as_ref().expect("set above");
            self.mark_bad(
                slot,
                &format!(
                    "dm-verity scrub: {} of {} blocks of {} damaged beyond FEC (first {:?}), {} unverifiable",
                    o.damaged,
                    v.geometry().fec_blocks(),
                    m.version,
                    o.first_damaged,
                    o.unverified
                ),
            )?;
            out.marked_bad = true;
        }
        Ok(out)
    }
}
