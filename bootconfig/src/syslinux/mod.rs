//! A/B boot on syslinux/extlinux: `extlinux.conf` plus the ADV "boot once" record.
//!
//! **Syslinux allows exactly one try.** It has no counter a script could decrement; what it has
//! is the ADV (auxiliary data vector) "boot once" record that `extlinux --once=LABEL` writes and
//! that the loader clears *before* it boots that label. So a slot on trial boots once; if it
//! panics (`panic=<secs>` on every command line) or hangs until a watchdog resets the machine,
//! the next boot takes `DEFAULT`, which still names the last confirmed slot.
//! [`SyslinuxBootloader::max_tries`](crate::Bootloader::max_tries) is therefore 1.
//!
//! # Files (in the syslinux directory, e.g. `/boot/syslinux`)
//! - `extlinux.conf`: [`render_conf`]: labels `a` and `b`, `DEFAULT` = the slot to boot when no
//!   boot-once is pending, and a state comment `# k3os-state: primary=B a=good b=try` holding
//!   what syslinux itself cannot (good/try/bad per slot). Rewritten only as a whole, atomically
//!   (temporary file, fsync, rename, fsync dir): syslinux finds it by name.
//! - `ldlinux.sys`: its last 1024 bytes are the ADV, two checksummed 512-byte copies. Written in
//!   place (the loader writes the ADV to sectors recorded at install time, so the file's blocks
//!   must never move; the immutable flag extlinux sets is lifted for the write): copy 0, fsync,
//!   then copy 1, fsync (a damaged copy 1 is repaired first). The loader, like `extlinux`, uses copy 0 if its checksum holds, else
//!   copy 1, else an empty ADV — so a torn copy is never used.
//!
//! # Reading
//! The slot syslinux boots is the boot-once label if a valid ADV holds one, else `DEFAULT`.
//! [`SyslinuxBootloader::read`] reports the state comment, with a slot on trial reading as
//! `Trying { tries_left: 1 }` while its boot-once record is pending and `Trying { tries_left: 0 }`
//! once the loader consumed it (or it was never written). A pending boot-once naming a slot wins
//! over the comment (that slot is reported as the primary on trial), because that is what the
//! loader will do. A conf without the state comment reads as `DEFAULT` good and the other slot
//! bad.
//!
//! # Writing
//! Every transaction computes the new conf and the new boot-once record. A transaction that
//! arms a trial (`try_slot`) writes the ADV first: the intermediate state (old conf, new
//! boot-once) boots the trial slot and reads as the new state. Written the other way round, a
//! cut between the two (new conf saying `try`, no boot-once yet) read as a trial already spent:
//! the loader booted the fallback and the next `confirm` recorded a fallback for a slot that
//! never booted — the trial was lost. Other transactions write the conf first unless the
//! intermediate state (new conf, old ADV) would boot a slot that is neither the old nor the new
//! choice. Either way a power cut at any byte leaves the loader booting the old or the new
//! choice, and a cut in `try_slot` never reads as a spent trial (see the power-cut tests).
//!
//! # Integrity (what a torn or damaged pair does)
//! - `extlinux.conf` is replaced atomically: it is the old or the new file, never torn. A conf
//!   without a valid state line reads as `DEFAULT` good and the other slot bad
//!   (`integrity()` reports it).
//! - Each ADV copy is checksummed; a torn or damaged copy is invalid, the loader uses the other
//!   one (copy 0 first), and the next write rewrites both, the damaged one first. With both
//!   copies invalid the loader sees no boot-once: it boots `DEFAULT`, the last confirmed slot.
//! - The pair: a cut between the two writes boots the old or the new choice (above); the next
//!   write of any transaction restores a consistent pair.

//!
//! # Versions
//! `extlinux.conf` carries `# k3os-extlinux-conf: 1` ([`CONF_VERSION`]; v0.1.0's conf has no
//! marker and is the same format, version 1); a newer one is refused by name and nothing is
//! rewritten, and a release's conf is installed by [`Bootloader::install_script`] in one atomic
//! replace that keeps `DEFAULT` and the state line. The ADV is syslinux's own format (its magic
//! and checksum; the boot-once record `extlinux --once` writes), not ours to version: what it
//! holds is byte-compatible with `extlinux` in every release.
//!
//! Submodules: `adv` (the ADV format: copies, checksum, boot-once record), `conf`
//! (`extlinux.conf`: rendering, parsing, the state line), `tests`; this module is the backend.

use std::path::{Path, PathBuf};

use crate::atomic::WriteOp;
use crate::BootEntry;
use crate::{
    BootEnv, Bootloader, Damage, Error, Integrity, Planned, Result, ScriptInfo, ScriptKind, Slot,
    SlotBoot,
};

mod adv;
mod conf;
mod verity;

pub use adv::{Adv, ADV_BOOTONCE, ADV_SIZE};
pub use conf::{conf_version, render_conf, SyslinuxConfig, CONF_VERSION, STATE_PREFIX};
use conf::{parse_conf, rewrite_conf, slot_of_label};

pub const CONF_FILE: &str = "extlinux.conf";
pub const LDLINUX_FILE: &str = "ldlinux.sys";

/// [`Bootloader`] on syslinux/extlinux; see the module docs.
#[derive(Debug, Clone)]
pub struct SyslinuxBootloader {
    dir: PathBuf,
}

/// The loader's view of the files: what `read` reports and what syslinux will boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyslinuxView {
    /// Both slots as `read` reports them.
    pub env: BootEnv,
    /// The slot syslinux boots next.
    pub choice: Slot,
    /// Pending boot-once label (already checked to be `a` or `b`).
    pub once: Option<Slot>,
    /// Whether a valid ADV copy was found (false: the loader uses an empty ADV).
    pub adv_valid: bool,
}

impl SyslinuxBootloader {
    /// `syslinux_dir` holds `extlinux.conf` and `ldlinux.sys` (from `extlinux --install`).
    pub fn new(syslinux_dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: syslinux_dir.into(),
        }
    }

    /// The `extlinux.conf` this backend reads and writes.
    pub fn conf_path(&self) -> PathBuf {
        self.dir.join(CONF_FILE)
    }

    /// The `ldlinux.sys` whose ADV records the boot-once slot.
    pub fn ldlinux_path(&self) -> PathBuf {
        self.dir.join(LDLINUX_FILE)
    }

    /// The conf's text; an error naming both versions when it is newer than this build reads.
    fn read_conf(&self) -> Result<String> {
        let p = self.conf_path();
        let text = self.read_conf_any()?;
        conf_version(&p, &text)?;
        Ok(text)
    }

    fn read_conf_any(&self) -> Result<String> {
        let p = self.conf_path();
        std::fs::read_to_string(&p).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => Error::Missing {
                path: p.clone(),
                what: "expected extlinux.conf (render_conf)".into(),
            },
            _ => Error::Io {
                op: "read",
                path: p.clone(),
                source,
            },
        })
    }

    /// The raw ADV (both copies) and the offset of copy 0 in `ldlinux.sys`.
    fn read_adv_raw(&self) -> Result<([u8; 2 * ADV_SIZE], u64)> {
        let p = self.ldlinux_path();
        let bytes = std::fs::read(&p).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => Error::Missing {
                path: p.clone(),
                what: "expected ldlinux.sys installed by `extlinux --install`".into(),
            },
            _ => Error::Io {
                op: "read",
                path: p.clone(),
                source,
            },
        })?;
        if bytes.len() < 2 * ADV_SIZE {
            return Err(Error::Invalid {
                path: p,
                what: format!(
                    "expected at least {} bytes (ldlinux.sys ends in the ADV), found {}",
                    2 * ADV_SIZE,
                    bytes.len()
                ),
            });
        }
        let off = bytes.len() - 2 * ADV_SIZE;
        Ok((bytes[off..].try_into().unwrap(), off as u64))
    }

    /// The loader's view (see [`SyslinuxView`]).
    pub fn view(&self) -> Result<SyslinuxView> {
        let text = self.read_conf()?;
        let (raw, _) = self.read_adv_raw()?;
        view_of(&self.conf_path(), &text, &raw)
    }

    /// Set the state to `initial` (rewriting `DEFAULT`, the state line and the boot-once record).
    pub fn install(&self, initial: &BootEnv) -> Result<()> {
        self.commit(initial)
    }

    /// The writes that make `new` the state, in the order they must happen.
    pub fn plan(&self, new: &BootEnv) -> Result<Vec<WriteOp>> {
        let text = self.read_conf()?;
        let (raw, adv_off) = self.read_adv_raw()?;
        let old = view_of(&self.conf_path(), &text, &raw)?;
        let default_new = fallback_choice(new);
        let once_new = match new.get(new.next_boot()) {
            SlotBoot::Trying { tries_left } if tries_left > 0 => Some(new.next_boot()),
            _ => None,
        };
        let choice_new = once_new.unwrap_or(default_new);
        let conf_new = rewrite_conf(&text, default_new, new);
        let (mut adv, _) = Adv::load(&raw);
        let label = once_new
            .map(|s| s.lower().as_bytes().to_vec())
            .unwrap_or_default();
        adv.set(ADV_BOOTONCE, &label)
            .map_err(|what| Error::Invalid {
                path: self.ldlinux_path(),
                what,
            })?;
        let mut adv_ops = Vec::new();
        if adv.0 != raw {
            let path = self.ldlinux_path();
            for c in 0..2 {
                adv_ops.push(WriteOp::InPlace {
                    path: path.clone(),
                    offset: adv_off + (c * ADV_SIZE) as u64,
                    data: adv.0[c * ADV_SIZE..(c + 1) * ADV_SIZE].to_vec(),
                });
            }
            // Copy 0 first, unless only copy 0 is valid now: then the damaged copy 1 is repaired
            // first, so a torn copy 0 never leaves no valid copy at all.
            if Adv::copy_valid(&raw[..ADV_SIZE]) && !Adv::copy_valid(&raw[ADV_SIZE..]) {
                adv_ops.reverse();
            }
        }
        let conf_ops = if conf_new != text {
            vec![WriteOp::Replace {
                path: self.conf_path(),
                data: conf_new.into_bytes(),
            }]
        } else {
            vec![]
        };
        // The order: the state between the two writes must boot the old or the new choice. A
        // new trial is armed ADV first: (old conf, new boot-once) boots the trial slot and reads
        // exactly as the new state, whereas (new conf, no boot-once yet) would read as a trial
        // already spent and boot the fallback: the trial would be lost and, on the next boot,
        // taken for a fallback.
        let old_default = parse_conf(&text).default.as_deref().and_then(slot_of_label);
        let adv_first_mid = once_new.or(old_default);
        let conf_first_mid = old.once.unwrap_or(default_new);
        let ok = |mid: Option<Slot>| mid == Some(old.choice) || mid == Some(choice_new);
        let adv_first = if once_new.is_some() && ok(adv_first_mid) {
            true
        } else {
            !ok(Some(conf_first_mid))
        };
        Ok(if adv_first {
            adv_ops.into_iter().chain(conf_ops).collect()
        } else {
            conf_ops.into_iter().chain(adv_ops).collect()
        })
    }
}

impl Planned for SyslinuxBootloader {
    fn plan_writes(&self, new: &BootEnv) -> Result<Vec<WriteOp>> {
        self.plan(new)
    }
}

/// The slot to name in `DEFAULT`: the choice with every trial exhausted.
fn fallback_choice(env: &BootEnv) -> Slot {
    let mut e = env.clone();
    for s in Slot::ALL {
        if let SlotBoot::Trying { .. } = e.get(s) {
            e.set(s, SlotBoot::Trying { tries_left: 0 });
        }
    }
    e.next_boot()
}

fn view_of(conf_path: &Path, text: &str, raw: &[u8; 2 * ADV_SIZE]) -> Result<SyslinuxView> {
    let conf = parse_conf(text);
    let default = conf
        .default
        .as_deref()
        .and_then(slot_of_label)
        .ok_or_else(|| Error::Invalid {
            path: conf_path.to_path_buf(),
            what: format!(
                "expected `DEFAULT a` or `DEFAULT b`, found {:?}",
                conf.default
            ),
        })?;
    let (adv, adv_valid) = Adv::load(raw);
    let once = adv.boot_once().as_deref().and_then(slot_of_label);
    let mut env = conf.state.unwrap_or(BootEnv {
        primary: default,
        a: if default == Slot::A {
            SlotBoot::Good
        } else {
            SlotBoot::Bad
        },
        b: if default == Slot::B {
            SlotBoot::Good
        } else {
            SlotBoot::Bad
        },
    });
    if let Some(s) = once {
        env.primary = s;
        env.set(s, SlotBoot::Trying { tries_left: 1 });
    }
    Ok(SyslinuxView {
        env,
        choice: once.unwrap_or(default),
        once,
        adv_valid,
    })
}

impl Bootloader for SyslinuxBootloader {
    fn name(&self) -> &'static str {
        "syslinux"
    }

    fn max_tries(&self) -> u8 {
        1
    }

    fn read(&self) -> Result<BootEnv> {
        Ok(self.view()?.env)
    }

    fn mark_bad(&self, slot: Slot) -> Result<()> {
        self.update(|env| env.set(slot, SlotBoot::Bad))
    }

    /// Boot `slot` once (`tries` is ignored beyond 1: syslinux allows exactly one try).
    fn try_slot(&self, slot: Slot, _tries: u8) -> Result<()> {
        self.update(|env| {
            env.primary = slot;
            env.set(slot, SlotBoot::Trying { tries_left: 1 });
        })
    }

    fn mark_good(&self, slot: Slot) -> Result<()> {
        self.update(|env| {
            env.primary = slot;
            env.set(slot, SlotBoot::Good);
        })
    }

    fn script(&self) -> Result<ScriptInfo> {
        let path = self.conf_path();
        let installed = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            _ => Some(conf_version(&path, &self.read_conf_any()?)?),
        };
        Ok(ScriptInfo {
            kind: ScriptKind::ExtlinuxConf,
            path,
            installed,
            newest_known: CONF_VERSION,
        })
    }

    /// `k3os.verity=<hex>` on the slot's `APPEND` line of `extlinux.conf` (or removed), in one
    /// atomic replace of the conf; nothing written when it says so already.
    fn set_verity(&self, slot: Slot, root_hash: Option<&str>) -> Result<bool> {
        let path = self.conf_path();
        if let Some(h) = root_hash {
            crate::grub::verity_checked(&path, h)?;
        }
        let current = self.read_conf()?;
        let new = verity::with_verity(&current, slot, root_hash);
        if new != current {
            WriteOp::Replace {
                path,
                data: new.into_bytes(),
            }
            .apply()?;
        }
        Ok(true)
    }

    fn verity(&self, slot: Slot) -> Result<Option<String>> {
        Ok(verity::verity_of(&self.read_conf()?, slot))
    }

    /// The new conf with `DEFAULT` and the state line of the current state, in one atomic
    /// replace: the ADV is not touched, and old or new conf each name the same state with it.
    fn install_script(&self, text: &str) -> Result<bool> {
        let path = self.conf_path();
        conf_version(&path, text)?;
        let parsed = parse_conf(text);
        if parsed.default.as_deref().and_then(slot_of_label).is_none() {
            return Err(Error::Invalid {
                path,
                what: "the new extlinux.conf has no `DEFAULT a` or `DEFAULT b` (not rendered by k3os-ops); nothing was written".into(),
            });
        }
        let current = self.read_conf()?;
        let env = self.read()?;
        let mut new = rewrite_conf(text, fallback_choice(&env), &env);
        // Each slot keeps the root hash its activation gave it.
        for slot in Slot::ALL {
            let hash = verity::verity_of(&current, slot);
            new = verity::with_verity(&new, slot, hash.as_deref());
        }
        if new == current {
            return Ok(false);
        }
        WriteOp::Replace {
            path,
            data: new.into_bytes(),
        }
        .apply()?;
        Ok(true)
    }

    /// The ADV copies (checksummed; the loader uses copy 0 if valid, else copy 1) and the
    /// conf's state line.
    fn integrity(&self) -> Result<Integrity> {
        let text = self.read_conf()?;
        let (raw, _) = self.read_adv_raw()?;
        let ld = self.ldlinux_path();
        let valid = [
            Adv::copy_valid(&raw[..ADV_SIZE]),
            Adv::copy_valid(&raw[ADV_SIZE..]),
        ];
        let mut damaged = Vec::new();
        for (c, ok) in valid.iter().enumerate() {
            if !ok {
                damaged.push(Damage {
                    record: format!("ADV copy {c}"),
                    path: ld.clone(),
                    what: "magic or checksum wrong (the next write repairs it)".into(),
                });
            }
        }
        if parse_conf(&text).state.is_none() {
            damaged.push(Damage {
                record: "state line".into(),
                path: self.conf_path(),
                what: format!(
                    "no valid `{STATE_PREFIX}` line: read as DEFAULT good and the other slot bad"
                ),
            });
        }
        let adv = match valid {
            [true, _] => "ADV copy 0".to_string(),
            [false, true] => "ADV copy 1".to_string(),
            [false, false] => "no valid ADV copy (no boot-once)".to_string(),
        };
        Ok(Integrity {
            in_use: format!(
                "{} and {adv} of {}",
                self.conf_path().display(),
                ld.display()
            ),
            damaged,
        })
    }
}

#[cfg(test)]
mod tests;
