//! Every boot, before the health checks: the booted slot's payloads whose kind asks for it
//! ([`crate::payload::kinds::OnBoot`]) are made available — image archives linked into k3s's
//! airgap directory ([`crate::payload::airgap`]) — and the built-in check `images` confirms
//! every image the slot's release names is there. An archive is linked only when the store
//! proves its bytes ([`crate::payload::prove`]); one that is not its name is moved aside and
//! the check fails naming it, so the loader falls back.
//!
//! What a slot holds is its kept manifest (`slotfiles`): a slot staged by a k3os-ops that
//! predates payloads keeps none, holds no payloads, and gets no `images` check. A kept manifest
//! that cannot be read fails the check, naming why: the node cannot tell what k3s needs.

use std::path::Path;

use bootconfig::Slot;

use crate::manifest::Manifest;
use crate::payload::airgap::{self, Archive};
use crate::payload::kinds::{self, OnBoot};
use crate::state::CheckResult;
use crate::updater::Updater;

/// Name of the built-in check.
pub const CHECK: &str = "images";

/// The booted slot's archives as this boot found them.
pub(crate) enum SlotArchives {
    /// From its kept manifest (possibly none).
    Known(Vec<Archive>),
    /// Its kept manifest could not be read.
    Unreadable(String),
}

/// The image archives of `m`, at their objects in the store under `state_dir`.
pub(crate) fn archives_of(m: &Manifest, state_dir: &Path) -> Vec<Archive> {
    m.payloads
        .iter()
        .filter(|p| kinds::kind(&p.kind).is_some_and(|k| k.on_boot == OnBoot::AirgapImages))
        .map(|p| Archive {
            name: p.name.clone(),
            object: crate::payload::object_path(state_dir, &p.file.sha256),
            size: p.file.size,
            images: p.images.clone(),
        })
        .collect()
}

impl Updater {
    /// Link the booted slot's archives into the airgap directory (a failure is logged: the
    /// `images` check then says what is missing).
    pub(crate) fn activate_payloads(&self, slot: Slot) -> SlotArchives {
        let m = match crate::slotfiles::manifest(&self.cfg.state_dir, slot) {
            Ok(m) => m,
            Err(e) => return SlotArchives::Unreadable(e.to_string()),
        };
        let archives = m
            .map(|m| archives_of(&m, &self.cfg.state_dir))
            .unwrap_or_default();
        // Only what the store proves is linked; the `images` check names what is not.
        let proven: Vec<Archive> = archives
            .iter()
            .filter(|a| proven(&self.cfg.state_dir, a))
            .cloned()
            .collect();
        match airgap::activate(&self.cfg.airgap_dir, &proven) {
            Ok(done) if !(done.linked.is_empty() && done.removed.is_empty()) => log::info!(
                "slot {slot}'s image archives in {}: linked {:?}, removed {:?}",
                self.cfg.airgap_dir.display(),
                done.linked,
                done.removed
            ),
            Ok(_) => {}
            Err(e) => log::warn!("slot {slot}'s image archives: {e}"),
        }
        SlotArchives::Known(archives)
    }
}

/// Archive `a`'s object is in the store, its bytes proven ([`crate::payload::prove`], the
/// same proof the plan and the stage use; an object that is not its name is moved aside).
fn proven(state_dir: &Path, a: &Archive) -> bool {
    let Some(sha256) = a.object.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    crate::payload::prove(state_dir, sha256, a.size).is_held()
}

/// The built-in `images` check over what [`Updater::activate_payloads`] found; None when the
/// slot holds no image archive.
pub(crate) fn images_check(dir: &Path, found: &SlotArchives) -> Option<CheckResult> {
    let (ok, detail) = match found {
        SlotArchives::Known(a) if a.is_empty() => return None,
        SlotArchives::Known(a) => match airgap::check(dir, a) {
            Ok(()) => (
                true,
                format!(
                    "{} image(s) of {} archive(s) in {}",
                    a.iter().map(|x| x.images.len()).sum::<usize>(),
                    a.len(),
                    dir.display()
                ),
            ),
            Err(why) => (false, why),
        },
        SlotArchives::Unreadable(why) => (false, format!("the slot's kept manifest: {why}")),
    };
    Some(CheckResult {
        name: CHECK.into(),
        ok,
        detail,
    })
}
