//! `bootconfig` owns everything the bootloader reads: which slot boots next, how many tries a
//! slot that is on trial has left, and the bootloader configuration that implements that choice.
//!
//! Two backends implement [`Bootloader`]:
//! - GRUB ([`GrubBootloader`], module `grub`): stock Debian GRUB, no patched modules. The
//!   complete `grub.cfg` ([`render_cfg`]) and two copies of a 1024-byte environment block
//!   ([`GrubEnv`], module `grub::env`), each guarded by an `editing` lock block and carrying its
//!   values twice, so a torn or damaged copy is never used (damaged as a whole); a last-good
//!   record for when both copies are damaged; N tries counted down by the script itself with
//!   an if-chain and `save_env`.
//! - syslinux ([`SyslinuxBootloader`], module `syslinux`): extlinux/syslinux. One try only:
//!   the trial slot is booted through the ADV "boot once" record ([`Adv`], byte-identical to
//!   what `extlinux --once` writes); `DEFAULT` in `extlinux.conf` ([`render_conf`]) is
//!   rewritten (atomically) when the slot is confirmed. A panicking kernel (`panic=N` on the
//!   command line) or a watchdog reset falls back to `DEFAULT`.
//!
//! Module `atomic` holds the write primitives everything here (and `libupgrade`) uses:
//! atomic replacement ([`write_atomic`]: temp + fsync + rename + dir fsync) for files found by
//! name, and in-place overwrite ([`write_in_place`], [`write_at`]) for files a loader
//! addresses by block list.
//!
//! # Public surface
//! The modules are private; every public item has one path, at the crate root (the `pub use`
//! list below): `bootconfig::GrubBootloader`, never `bootconfig::grub::GrubBootloader`.
//!
//! # Architecture
//! Every transaction has one shape: **read** the loader's files the way the loader will at
//! the next boot (`grub::model` models the installed script, by its version; `syslinux`
//! reads the conf and the ADV) → **plan** the writes from the new state (`Vec<`[`WriteOp`]`>`,
//! ordered so a cut between any two leaves the old or the new choice) → **apply** them
//! ([`apply_all`]). Versions of the loader's own files: [`GrubScript`] (the script decides
//! how the env copies are read; a new script is installed only after the copies are
//! rewritten under the old one) and [`conf_version`]; newer versions are refused by
//! name. [`MemoryBootloader`] (module `memory`) is the in-memory twin for tests of code above.
//!
//! The library above (`libupgrade`) decides *when* to call these; this crate decides *how* the
//! loader is told, and guarantees that every write is power-cut safe: at any instant of a write,
//! the loader's choice is a slot that was bootable before the write or the one being installed
//! after it completed.
//!
//! Tests (all run on the build host; they fail, naming the missing tool, rather than skip):
//! `grubenv_editenv` (byte compatibility with `grub-editenv`), `grub_real` (`grub-script-check`;
//! the real GRUB script engine in `grub-emu` on ext4 images, including torn env files),
//! `extlinux_real` (ADV bytes vs `extlinux --once/--clear-once` on a loop-mounted ext4),
//! `power_cut` (a cut at every byte class and every changed byte of every write, from every
//! state), `integrity` (damage to any bytes of one env copy, lock or the last-good record, both
//! copies damaged, GRUB's countdown torn with the other copy damaged), `memory_vs_grub` (the
//! in-memory loader follows the GRUB backend's rules), `grub_qemu` / `syslinux_qemu` (real BIOS
//! boots in QEMU), `props` (property tests).

#![warn(missing_docs)]

mod atomic;
mod grub;
mod memory;
mod slot;
mod syslinux;

// The public surface: one path per item, all at the crate root.
pub use atomic::{apply_all, fsync_dir, write_at, write_atomic, write_in_place, WriteOp};
pub use grub::env::{
    grub_load, grub_set_in_place, EnvBlockError, GrubEnv, Loaded, ENV_SIZE, HEADER,
};
pub use grub::{
    render_cfg, render_signed_cfg, simulate_boot, simulate_boot_with, BootSim, EnvSource,
    GrubBootloader, GrubConfig, GrubScript, CFG_FILE, MENU_MARKER, SCRIPT_MARKER,
};
pub use memory::MemoryBootloader;
pub use slot::{ParseSlotError, Slot};
pub use syslinux::{
    conf_version, render_conf, Adv, SyslinuxBootloader, SyslinuxConfig, SyslinuxView, ADV_BOOTONCE,
    ADV_SIZE, CONF_VERSION,
};

use serde::{Deserialize, Serialize};

/// What the bootloader will do with one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum SlotBoot {
    /// Confirmed: boots without counting.
    Good,
    /// On trial: the loader boots it while `tries_left > 0`, counting down before each boot.
    Trying {
        /// Boots the loader may still try it.
        tries_left: u8,
    },
    /// Never chosen (unless no other slot is bootable at all).
    Bad,
}

/// The bootloader's view of both slots, as read back from its own files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootEnv {
    /// The slot tried first.
    pub primary: Slot,
    /// What the loader will do with slot A.
    pub a: SlotBoot,
    /// What the loader will do with slot B.
    pub b: SlotBoot,
}

impl BootEnv {
    /// What the loader will do with `slot`.
    pub fn get(&self, slot: Slot) -> SlotBoot {
        match slot {
            Slot::A => self.a,
            Slot::B => self.b,
        }
    }

    /// Set what the loader will do with `slot`.
    pub fn set(&mut self, slot: Slot, state: SlotBoot) {
        match slot {
            Slot::A => self.a = state,
            Slot::B => self.b = state,
        }
    }

    /// The slot the loader boots next, with the same rules the loader script applies: the
    /// primary if it is good or has tries left, else the other if it is, else the primary
    /// anyway when it is not bad, else the other one (a node must always boot something).
    pub fn next_boot(&self) -> Slot {
        let bootable = |s: Slot| match self.get(s) {
            SlotBoot::Good => true,
            SlotBoot::Trying { tries_left } => tries_left > 0,
            SlotBoot::Bad => false,
        };
        let p = self.primary;
        if bootable(p) {
            p
        } else if bootable(p.other()) {
            p.other()
        } else if self.get(p) != SlotBoot::Bad {
            p
        } else if self.get(p.other()) != SlotBoot::Bad {
            p.other()
        } else {
            p
        }
    }
}

/// How intact the loader's own records are (env copies, ADV copies, last-good record), for
/// `slot status`: which record the loader will take its state from at the next boot, and
/// every record that is damaged or mid-write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Integrity {
    /// The record the loader uses, naming its file (e.g. `copy 2 (/boot/grub/k3os/env2)`).
    pub in_use: String,
    /// Damaged, missing or mid-write records; empty when everything is intact. The next write
    /// of any kind rewrites all of them.
    pub damaged: Vec<Damage>,
}

/// One damaged record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Damage {
    /// Which record, e.g. `copy 1`, `copy 1 lock`, `last-good record`, `ADV copy 0`.
    pub record: String,
    /// The file that holds the record.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    pub what: String,
}

/// Which boot script a loader runs (the file a release may carry a new version of).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScriptKind {
    /// GRUB's `grub.cfg` ([`render_cfg`], versions in [`GrubScript`]).
    GrubCfg,
    /// syslinux's `extlinux.conf` ([`render_conf`]).
    ExtlinuxConf,
}

impl ScriptKind {
    /// The file name the script is installed as (and carried in a release as).
    pub fn file_name(self) -> &'static str {
        match self {
            ScriptKind::GrubCfg => grub::CFG_FILE,
            ScriptKind::ExtlinuxConf => syslinux::CONF_FILE,
        }
    }
}

impl std::fmt::Display for ScriptKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScriptKind::GrubCfg => "GRUB script",
            ScriptKind::ExtlinuxConf => "extlinux.conf",
        })
    }
}

/// The boot script a loader runs now, for `slot status` and for deciding whether an
/// activation may install a release's script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptInfo {
    /// Which loader's script.
    pub kind: ScriptKind,
    /// Where it is installed.
    pub path: std::path::PathBuf,
    /// The installed version; `None` when no script is installed.
    pub installed: Option<u32>,
    /// The newest version this build renders and reads.
    pub newest_known: u32,
}

/// One slot's boot files and kernel command line, as the loader sees them (paths relative to
/// the boot partition's root, e.g. `/a/vmlinuz`). The backends append `k3os.slot=A|B` and
/// `panic=<secs>` to `cmdline` themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootEntry {
    /// The kernel image.
    pub kernel: String,
    /// The initrd image.
    pub initrd: String,
    /// The kernel command line before the backend's own arguments.
    pub cmdline: String,
}

/// Errors of the bootloader layer; each names the file and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done, e.g. `read`, `fsync`.
        op: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file's content is not what the loader or this crate expects.
    #[error("{path}: {what}")]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What was expected and what was found.
        what: String,
    },
    /// A file the loader needs does not exist.
    #[error("bootloader file {path} is missing: {what}")]
    Missing {
        /// The file.
        path: std::path::PathBuf,
        /// What it is and what makes it.
        what: String,
    },
    /// A file in a format newer than this build reads: refused, and nothing is rewritten
    /// (rewriting it in an older format could break the newer `k3os-ops` that wrote it).
    #[error("{path}: {what} version {found} is newer than this build of k3os-ops reads (up to version {known}); nothing was rewritten: upgrade k3os-ops first")]
    NewerFormat {
        /// The file.
        path: std::path::PathBuf,
        /// Which format, e.g. `GRUB script`.
        what: &'static str,
        /// The version the file has.
        found: u32,
        /// The newest version this build reads.
        known: u32,
    },
    /// A request the backend cannot carry out, said in full.
    #[error("{0}")]
    Unsupported(String),
}

/// A result of this crate: [`Error`] unless given.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The one shape of every transaction of a backend here: read the state the loader will see,
/// change it, bring it within what the installed loader accepts, plan the writes, apply them.
pub(crate) trait Planned: Bootloader {
    /// The writes that make `new` the state, in the order they must happen.
    fn plan_writes(&self, new: &BootEnv) -> Result<Vec<atomic::WriteOp>>;
    /// `env` within what the installed loader accepts (GRUB: tries clamped to its script).
    fn accept(&self, env: BootEnv) -> BootEnv {
        env
    }
    /// Make `env` the state.
    fn commit(&self, env: &BootEnv) -> Result<()> {
        atomic::apply_all(&self.plan_writes(&self.accept(env.clone()))?)
    }
    /// Read, change with `f`, commit.
    fn update(&self, f: impl FnOnce(&mut BootEnv)) -> Result<()>
    where
        Self: Sized,
    {
        let mut env = self.read()?;
        f(&mut env);
        self.commit(&env)
    }
}

/// A bootloader that can be told which A/B slot to boot.
///
/// Every method is a complete, power-cut-safe transaction: if power fails during it, the next
/// boot chooses either what was chosen before the call or what the call asked for.
pub trait Bootloader: Send + Sync {
    /// Short name for logs and `slot status` (`grub`, `syslinux`).
    fn name(&self) -> &'static str;
    /// How many tries this loader can give a slot on trial (GRUB: configurable; syslinux: 1).
    fn max_tries(&self) -> u8;
    /// Read the loader's current choice back from its files.
    fn read(&self) -> Result<BootEnv>;
    /// Never boot `slot` again (until it is tried anew). Used before a slot is overwritten.
    fn mark_bad(&self, slot: Slot) -> Result<()>;
    /// Make `slot` the primary on trial with `tries` boots (clamped to [`Self::max_tries`]);
    /// the other slot stays as it is and is the fallback.
    fn try_slot(&self, slot: Slot, tries: u8) -> Result<()>;
    /// Make `slot` the confirmed primary; the other slot keeps its state as the fallback.
    fn mark_good(&self, slot: Slot) -> Result<()>;
    /// Which of the loader's records are damaged and which one it will use.
    fn integrity(&self) -> Result<Integrity>;
    /// The installed boot script and its version; an error naming both versions when it is
    /// newer than this build reads.
    fn script(&self) -> Result<ScriptInfo>;
    /// Replace the boot script with `text`, keeping the boot state, power-cut safely (at every
    /// instant the installed script reads the installed state; see each backend's docs).
    /// `Ok(false)` when `text` is installed already. Refused, with nothing written, when `text`
    /// is not this loader's script or is newer than this build reads.
    fn install_script(&self, text: &str) -> Result<bool>;
    /// Pass `root_hash` (lower-case hex, optionally followed by `,` and the geometry the
    /// initramfs opens the device with) to `slot`'s kernel as `k3os.verity=<value>` from its next
    /// boot on, or nothing (`None`: the slot boots without dm-verity, as before). Called only
    /// while `slot` is not the running slot, before the loader is told to try it. `Ok(false)`
    /// when a hash was given but this loader (or its installed script) cannot pass it: the slot
    /// then boots without dm-verity. A malformed hash is refused with nothing written.
    fn set_verity(&self, slot: Slot, root_hash: Option<&str>) -> Result<bool>;
    /// What the loader passes as `slot`'s `k3os.verity=` (`None`: nothing; a damaged record
    /// reads as the value the loader would pass, which no initramfs accepts).
    fn verity(&self, slot: Slot) -> Result<Option<String>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_boot_prefers_primary_then_fallback_then_anything() {
        let mut env = BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Trying { tries_left: 2 },
        };
        assert_eq!(env.next_boot(), Slot::B);
        env.b = SlotBoot::Trying { tries_left: 0 };
        assert_eq!(env.next_boot(), Slot::A);
        env.b = SlotBoot::Bad;
        assert_eq!(env.next_boot(), Slot::A);
        env.a = SlotBoot::Bad;
        assert_eq!(env.next_boot(), Slot::B, "both bad still boots something");
        env.a = SlotBoot::Trying { tries_left: 0 };
        assert_eq!(
            env.next_boot(),
            Slot::A,
            "an exhausted slot beats a bad one"
        );
    }
}
