//! An in-memory [`Bootloader`] with the same rules as the GRUB backend: choice by
//! [`BootEnv::next_boot`], one try consumed per power-on, `mark_bad` leaves the primary where
//! it is, `try_slot` clamps tries into `1..=max_tries`. For tests of code that drives a
//! bootloader without boot files (the agent); `libupgrade`'s own tests run against the real
//! GRUB and syslinux backends on temp dirs, and `tests/integration/memory_vs_grub.rs` holds this
//! model to the GRUB backend transaction by transaction.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::grub::GrubScript;
use crate::{BootEnv, Bootloader, Integrity, Result, ScriptInfo, ScriptKind, Slot, SlotBoot};

/// Shared boot environment in memory; clones see the same state.
#[derive(Debug, Clone)]
pub struct MemoryBootloader {
    env: Arc<Mutex<BootEnv>>,
    script: Arc<Mutex<GrubScript>>,
    verity: Arc<Mutex<[Option<String>; 2]>>,
    max_tries: u8,
}

impl MemoryBootloader {
    /// Starts as an installed node: A good and primary, B bad.
    pub fn new(max_tries: u8) -> MemoryBootloader {
        MemoryBootloader {
            env: Arc::new(Mutex::new(BootEnv {
                primary: Slot::A,
                a: SlotBoot::Good,
                b: SlotBoot::Bad,
            })),
            script: Arc::new(Mutex::new(GrubScript::CURRENT)),
            verity: Arc::new(Mutex::new([None, None])),
            max_tries,
        }
    }

    /// Pretend the installed `grub.cfg` is `script` (a node made by an earlier release).
    pub fn set_script(&self, script: GrubScript) {
        *self.script.lock().unwrap_or_else(|e| e.into_inner()) = script;
    }

    /// The environment, for inspection or to simulate a write that never happened.
    pub fn env(&self) -> MutexGuard<'_, BootEnv> {
        self.env.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Power on: the slot the loader boots, after counting down a trial's tries.
    pub fn power_on(&self) -> Slot {
        let mut env = self.env();
        let s = env.next_boot();
        if let SlotBoot::Trying { tries_left } = env.get(s) {
            env.set(
                s,
                SlotBoot::Trying {
                    tries_left: tries_left.saturating_sub(1),
                },
            );
        }
        s
    }
}

impl Bootloader for MemoryBootloader {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn max_tries(&self) -> u8 {
        self.max_tries
    }
    fn read(&self) -> Result<BootEnv> {
        Ok(self.env().clone())
    }
    fn mark_bad(&self, slot: Slot) -> Result<()> {
        self.env().set(slot, SlotBoot::Bad);
        Ok(())
    }
    fn try_slot(&self, slot: Slot, tries: u8) -> Result<()> {
        let mut env = self.env();
        env.set(
            slot,
            SlotBoot::Trying {
                tries_left: tries.clamp(1, self.max_tries.max(1)),
            },
        );
        env.primary = slot;
        Ok(())
    }
    fn mark_good(&self, slot: Slot) -> Result<()> {
        let mut env = self.env();
        env.set(slot, SlotBoot::Good);
        env.primary = slot;
        Ok(())
    }
    fn integrity(&self) -> Result<Integrity> {
        Ok(Integrity {
            in_use: "memory".into(),
            damaged: Vec::new(),
        })
    }
    fn script(&self) -> Result<ScriptInfo> {
        Ok(ScriptInfo {
            kind: ScriptKind::GrubCfg,
            path: "memory/grub.cfg".into(),
            installed: Some(
                self.script
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .number(),
            ),
            newest_known: GrubScript::CURRENT.number(),
        })
    }
    /// Takes the version from the text, as the GRUB backend does; the state is kept.
    fn install_script(&self, text: &str) -> Result<bool> {
        let v = GrubScript::of_cfg(std::path::Path::new("memory/grub.cfg"), text)?;
        let mut s = self.script.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *s != v;
        *s = v;
        Ok(changed)
    }
    /// Keeps the hash per slot (validated as the GRUB backend does); `Ok(false)` for a hash
    /// under a script below 3, as the GRUB backend.
    fn set_verity(&self, slot: Slot, root_hash: Option<&str>) -> Result<bool> {
        if let Some(h) = root_hash {
            valid_hash(slot, h)?;
        }
        let mut v = self.verity.lock().unwrap_or_else(|e| e.into_inner());
        v[slot_index(slot)] = root_hash.map(str::to_string);
        let reads = *self.script.lock().unwrap_or_else(|e| e.into_inner()) >= GrubScript::V3;
        Ok(root_hash.is_none() || reads)
    }
    fn verity(&self, slot: Slot) -> Result<Option<String>> {
        Ok(self.verity.lock().unwrap_or_else(|e| e.into_inner())[slot_index(slot)].clone())
    }
}

/// Index of `slot` in per-slot arrays.
fn slot_index(slot: Slot) -> usize {
    match slot {
        Slot::A => 0,
        Slot::B => 1,
    }
}

/// `hash` if the GRUB backend would write it (same rule, same error).
fn valid_hash(slot: Slot, hash: &str) -> Result<&str> {
    crate::grub::verity_checked(
        &std::path::Path::new("memory/k3os").join(format!("verity-{slot}")),
        hash,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trial_gets_its_tries_then_falls_back() {
        let l = MemoryBootloader::new(3);
        l.try_slot(Slot::B, 9).unwrap();
        assert_eq!(
            l.read().unwrap().b,
            SlotBoot::Trying { tries_left: 3 },
            "clamped to max_tries"
        );
        assert_eq!(
            [l.power_on(), l.power_on(), l.power_on(), l.power_on()],
            [Slot::B, Slot::B, Slot::B, Slot::A]
        );
        l.mark_good(Slot::B).unwrap();
        assert_eq!(l.power_on(), Slot::B);
        l.mark_bad(Slot::B).unwrap();
        assert_eq!(
            l.read().unwrap().primary,
            Slot::B,
            "like GRUB: the primary stays"
        );
        assert_eq!(l.power_on(), Slot::A, "a bad primary is skipped");
        l.try_slot(Slot::B, 0).unwrap();
        assert_eq!(l.read().unwrap().b, SlotBoot::Trying { tries_left: 1 });
    }
}
