//! [`GrubBootloader`]: plans Rust's writes of the env copies (order, in place or replaced) and
//! performs them.

use std::path::{Path, PathBuf};

use super::env::{GrubEnv, ENV_SIZE};
use super::model::{env_block, good_block, read_opt, simulate_boot, BootSim, EnvSource};
use super::version::{installed, GrubScript, CFG_FILE};
use super::{ENV_DIR, GOOD_FILE, MAX_TRIES_MARKER, MENU_MARKER, VAR_EDITING};
use crate::atomic::WriteOp;
use crate::{
    BootEnv, Bootloader, Error, Integrity, Planned, Result, ScriptInfo, ScriptKind, Slot, SlotBoot,
};

/// The slot the last-good record should name after a write of `new`, when it named `current`:
/// the primary if it is (newly) good, else `current` while it stays good, else the other good
/// slot, else none.
fn last_good_after(current: Option<Slot>, new: &BootEnv) -> Option<Slot> {
    let good = |s: Slot| new.get(s) == SlotBoot::Good;
    if good(new.primary) {
        Some(new.primary)
    } else if let Some(c) = current.filter(|&c| good(c)) {
        Some(c)
    } else {
        Slot::ALL.into_iter().find(|&s| good(s))
    }
}

/// [`Bootloader`] on stock GRUB; see the module docs for the files and the protocol.
#[derive(Debug, Clone)]
pub struct GrubBootloader {
    grub_dir: PathBuf,
    max_tries: u8,
}

impl GrubBootloader {
    /// `grub_dir` holds `grub.cfg` (on a node `/boot/grub`); `max_tries` must equal the
    /// [`GrubConfig::max_tries`](super::GrubConfig::max_tries) the installed `grub.cfg` was rendered with (0 counts as 1).
    pub fn new(grub_dir: impl Into<PathBuf>, max_tries: u8) -> Self {
        Self {
            grub_dir: grub_dir.into(),
            max_tries: max_tries.max(1),
        }
    }

    /// The GRUB directory this backend reads and writes (e.g. `/boot/grub`).
    pub fn grub_dir(&self) -> &Path {
        &self.grub_dir
    }

    /// Create (or completely rewrite) the env copies and locks with `initial`, creating the
    /// `k3os/` directory if needed. Tries above `max_tries` are clamped.
    pub fn install(&self, initial: &BootEnv) -> Result<()> {
        self.create_env_dir()?;
        self.commit(initial)
    }

    fn clamp(&self, env: BootEnv) -> BootEnv {
        clamp_tries(env, self.effective_max_tries())
    }

    /// The installed script's version (`None`: no `grub.cfg`); an error naming both versions
    /// when it is newer than this build reads.
    pub fn script(&self) -> Result<Option<GrubScript>> {
        installed(&self.grub_dir)
    }

    /// Install `cfg_text` as `grub.cfg`, keeping the boot state: see [`Self::plan_install_script`].
    /// Returns whether anything was written.
    pub fn install_script(&self, cfg_text: &str) -> Result<bool> {
        let ops = self.plan_install_script(cfg_text)?;
        crate::atomic::apply_all(&ops)?;
        Ok(!ops.is_empty())
    }

    /// The writes that install `cfg_text` as `grub.cfg` and keep the state GRUB reads now
    /// (nothing when it is installed already): both env copies and the last-good record
    /// rewritten completely, in the newest layout, under the rules of the script installed now
    /// (so a cut among them is an ordinary power-cut-safe write); then `grub.cfg` replaced
    /// atomically. Old script + new copies and new script + new copies both read the same
    /// state (see [`GrubScript`](super::GrubScript)). Tries above what the new script accepts are lowered to
    /// its limit. Refused, with nothing written, when `cfg_text` is newer than this build or
    /// when no state can be read (nothing to keep: use [`Self::install_fresh`]).
    pub fn plan_install_script(&self, cfg_text: &str) -> Result<Vec<WriteOp>> {
        let path = self.grub_dir.join(CFG_FILE);
        check_is_cfg(&path, cfg_text)?;
        if read_opt(&path)?.as_deref() == Some(cfg_text.as_bytes()) {
            return Ok(Vec::new());
        }
        let env = self.read()?;
        self.plan_with_script(&env, &path, cfg_text)
    }

    /// Write `initial` and `cfg_text` on a GRUB directory that may hold nothing yet (image
    /// builders, adopting a machine): the `k3os/` directory, both env copies with their
    /// locks, the last-good record, then `grub.cfg`.
    pub fn install_fresh(&self, initial: &BootEnv, cfg_text: &str) -> Result<()> {
        self.create_env_dir()?;
        let path = self.grub_dir.join(CFG_FILE);
        check_is_cfg(&path, cfg_text)?;
        crate::atomic::apply_all(&self.plan_with_script(initial, &path, cfg_text)?)
    }

    fn plan_with_script(&self, env: &BootEnv, path: &Path, cfg_text: &str) -> Result<Vec<WriteOp>> {
        let new_max = max_tries_of(path, cfg_text)?.unwrap_or(self.max_tries);
        let max = new_max.max(1).min(self.effective_max_tries());
        let mut ops = self.plan(&clamp_tries(env.clone(), max))?;
        ops.push(WriteOp::Replace {
            path: path.to_path_buf(),
            data: cfg_text.as_bytes().to_vec(),
        });
        Ok(ops)
    }

    fn create_env_dir(&self) -> Result<()> {
        let dir = self.grub_dir.join(ENV_DIR);
        if !self.grub_dir.is_dir() {
            return Err(Error::Missing {
                path: self.grub_dir.clone(),
                what: "expected the GRUB directory (holding grub.cfg)".into(),
            });
        }
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
        crate::atomic::fsync_dir(&self.grub_dir)
    }
}

/// `text` is a `grub.cfg` rendered by [`super::render_cfg`] (its menu marker) of a version
/// this build reads.
fn check_is_cfg(path: &Path, text: &str) -> Result<GrubScript> {
    if !text.lines().any(|l| l == MENU_MARKER) {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            what: format!(
                "the new script is not a grub.cfg rendered by k3os-ops (no {MENU_MARKER:?} line); nothing was written"
            ),
        });
    }
    GrubScript::of_cfg(path, text)
}

/// `env` with every trial's tries lowered to `max`.
fn clamp_tries(mut env: BootEnv, max: u8) -> BootEnv {
    for slot in Slot::ALL {
        if let SlotBoot::Trying { tries_left } = env.get(slot) {
            env.set(
                slot,
                SlotBoot::Trying {
                    tries_left: tries_left.min(max),
                },
            );
        }
    }
    env
}

/// The highest tries count a `grub.cfg`'s text accepts (its [`MAX_TRIES_MARKER`] line), `None`
/// when it has no marker.
fn max_tries_of(path: &Path, text: &str) -> Result<Option<u8>> {
    let Some(v) = text.lines().find_map(|l| l.strip_prefix(MAX_TRIES_MARKER)) else {
        return Ok(None);
    };
    v.trim()
        .parse::<u8>()
        .map(Some)
        .map_err(|_| Error::Invalid {
            path: path.to_path_buf(),
            what: format!("expected a number 1..=255 after {MAX_TRIES_MARKER:?}, found {v:?}"),
        })
}

impl GrubBootloader {
    /// The highest tries count the installed `grub.cfg` accepts (its `# k3os-max-tries:`
    /// line), `None` when there is no `grub.cfg` or it has no marker.
    pub fn cfg_max_tries(&self) -> Result<Option<u8>> {
        let path = self.grub_dir.join(CFG_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => max_tries_of(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io {
                op: "read",
                path,
                source,
            }),
        }
    }

    /// `max_tries`, lowered to what the installed `grub.cfg` accepts when that is less (a
    /// larger count would read as 0 in GRUB and the trial slot would never boot).
    pub fn effective_max_tries(&self) -> u8 {
        match self.cfg_max_tries() {
            Ok(Some(cfg)) if cfg.max(1) < self.max_tries => {
                log::warn!(
                    "{}: grub.cfg counts at most {cfg} tries, bootloader configured for {}; using {cfg}",
                    self.grub_dir.display(),
                    self.max_tries
                );
                cfg.max(1)
            }
            _ => self.max_tries,
        }
    }

    /// What GRUB's script will do at the next boot (copy used, state, choice, countdown).
    pub fn simulate_boot(&self) -> Result<BootSim> {
        simulate_boot(&self.grub_dir, self.effective_max_tries())
    }

    /// The writes that make `new` the state, in the order they must happen.
    pub fn plan(&self, new: &BootEnv) -> Result<Vec<WriteOp>> {
        let dir = self.grub_dir.join(ENV_DIR);
        let block = |g: GrubEnv, path: &Path| {
            g.to_bytes().map_err(|e| Error::Invalid {
                path: path.to_path_buf(),
                what: e.to_string(),
            })
        };
        let write = |path: PathBuf, data: Vec<u8>| -> Result<WriteOp> {
            let in_place = match std::fs::metadata(&path) {
                Ok(m) => m.is_file() && m.len() == ENV_SIZE as u64,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(source) => {
                    return Err(Error::Io {
                        op: "stat",
                        path,
                        source,
                    })
                }
            };
            Ok(if in_place {
                WriteOp::InPlace {
                    path,
                    offset: 0,
                    data,
                }
            } else {
                WriteOp::Replace { path, data }
            })
        };
        // Copy 1 then copy 2, except when GRUB uses copy 1 and copy 2 is not usable: then copy
        // 2 is repaired first, so the copy GRUB reads is never marked editing while the other
        // one is damaged.
        let sim = simulate_boot(&self.grub_dir, self.max_tries)?;
        let order = if sim.source == EnvSource::Copy(1) && !sim.usable[1] {
            [2, 1]
        } else {
            [1, 2]
        };
        let mut ops = Vec::new();
        for n in order {
            let lock = dir.join(format!("lock{n}"));
            let env = dir.join(format!("env{n}"));
            ops.push(write(
                lock.clone(),
                block(GrubEnv::from_pairs([(VAR_EDITING, "1")]), &lock)?,
            )?);
            ops.push(write(env.clone(), block(env_block(new), &env)?)?);
            // After the first op the lock exists with the right size, so this one is in place.
            let data = block(GrubEnv::from_pairs([(VAR_EDITING, "0")]), &lock)?;
            ops.push(WriteOp::InPlace {
                path: lock,
                offset: 0,
                data,
            });
        }
        // The last-good record: rewritten only when the slot it names changes (or it is
        // damaged); before the copies when that slot stops being good, after them otherwise.
        let current = sim.last_good.flatten();
        let target = last_good_after(current, new);
        if sim.last_good != Some(target) || !sim.last_good_canonical {
            let path = dir.join(GOOD_FILE);
            let op = write(path.clone(), block(good_block(target), &path)?)?;
            if current.is_some_and(|c| new.get(c) != SlotBoot::Good) {
                ops.insert(0, op);
            } else {
                ops.push(op);
            }
        }
        Ok(ops)
    }
}

impl Planned for GrubBootloader {
    fn plan_writes(&self, new: &BootEnv) -> Result<Vec<WriteOp>> {
        self.plan(new)
    }
    fn accept(&self, env: BootEnv) -> BootEnv {
        self.clamp(env)
    }
}

impl Bootloader for GrubBootloader {
    fn name(&self) -> &'static str {
        "grub"
    }

    /// [`GrubBootloader::effective_max_tries`].
    fn max_tries(&self) -> u8 {
        self.effective_max_tries()
    }

    /// The state GRUB's script would see (safe interpretation of torn/damaged copies); an
    /// error naming both env files when neither copy is intact and there is no intact
    /// last-good record either (nothing installed). An intact record naming no slot reads as
    /// GRUB's defaults (primary A, both bad), so a write can still repair the copies.
    fn read(&self) -> Result<BootEnv> {
        let sim = self.simulate_boot()?;
        if sim.source == EnvSource::Nothing && sim.last_good.is_none() {
            let dir = self.grub_dir.join(ENV_DIR);
            return Err(Error::Missing {
                path: dir.join("env1"),
                what: format!(
                    "neither env copy is intact (expected GRUB environment blocks at {} and {}) and there is no last-good record; write them with `k3os-ops bootloader install`",
                    dir.join("env1").display(),
                    dir.join("env2").display()
                ),
            });
        }
        Ok(sim.seen)
    }

    fn mark_bad(&self, slot: Slot) -> Result<()> {
        self.update(|env| env.set(slot, SlotBoot::Bad))
    }

    /// `tries` is clamped into `1..=max_tries()`.
    fn try_slot(&self, slot: Slot, tries: u8) -> Result<()> {
        let tries = tries.clamp(1, self.effective_max_tries());
        self.update(|env| {
            env.primary = slot;
            env.set(slot, SlotBoot::Trying { tries_left: tries });
        })
    }

    fn mark_good(&self, slot: Slot) -> Result<()> {
        self.update(|env| {
            env.primary = slot;
            env.set(slot, SlotBoot::Good);
        })
    }

    fn integrity(&self) -> Result<Integrity> {
        Ok(self.simulate_boot()?.integrity)
    }

    fn script(&self) -> Result<ScriptInfo> {
        Ok(ScriptInfo {
            kind: ScriptKind::GrubCfg,
            path: self.grub_dir.join(CFG_FILE),
            installed: GrubBootloader::script(self)?.map(GrubScript::number),
            newest_known: GrubScript::CURRENT.number(),
        })
    }

    fn install_script(&self, text: &str) -> Result<bool> {
        GrubBootloader::install_script(self, text)
    }

    /// Writes or removes `k3os/verity-<slot>` (see `grub.cfg` script 3); `Ok(false)` when a root hash
    /// was given but the installed script (below 3) does not read the file.
    fn set_verity(&self, slot: Slot, root_hash: Option<&str>) -> Result<bool> {
        super::verity::write(&self.grub_dir, slot, root_hash)?;
        let reads = GrubBootloader::script(self)?.is_none_or(|v| v >= GrubScript::V3);
        Ok(root_hash.is_none() || reads)
    }

    fn verity(&self, slot: Slot) -> Result<Option<String>> {
        super::verity::read(&self.grub_dir, slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grub::{render_cfg, GrubConfig, VAR_PRIMARY};
    use crate::BootEntry;

    pub(crate) fn all_envs(max: u8) -> Vec<BootEnv> {
        let mut states = vec![SlotBoot::Good, SlotBoot::Bad];
        states.extend((0..=max).map(|t| SlotBoot::Trying { tries_left: t }));
        let mut out = Vec::new();
        for primary in Slot::ALL {
            for &a in &states {
                for &b in &states {
                    out.push(BootEnv { primary, a, b });
                }
            }
        }
        out
    }

    fn cfg(max_tries: u8) -> GrubConfig {
        let e = |s: &str| BootEntry {
            kernel: format!("/{s}/vmlinuz"),
            initrd: format!("/{s}/initrd"),
            cmdline: format!(
                "root=/dev/vda{} console=ttyS0 quote='x'",
                if s == "a" { 4 } else { 5 }
            ),
        };
        GrubConfig {
            entries: [e("a"), e("b")],
            max_tries,
            timeout_secs: 1,
            serial: true,
            panic_secs: 10,
        }
    }

    #[test]
    fn read_of_nothing_installed_names_both_files() {
        let d = tempfile::tempdir().unwrap();
        let e = GrubBootloader::new(d.path(), 3)
            .read()
            .unwrap_err()
            .to_string();
        assert!(e.contains("k3os/env1") && e.contains("k3os/env2"), "{e}");
        let e = GrubBootloader::new(d.path().join("nope"), 3)
            .install(&all_envs(1)[0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope") && e.contains("GRUB directory"), "{e}");
    }

    #[test]
    fn install_read_round_trip_and_model_choice_is_next_boot() {
        let d = tempfile::tempdir().unwrap();
        let g = GrubBootloader::new(d.path(), 3);
        for env in all_envs(3) {
            g.install(&env).unwrap();
            assert_eq!(g.read().unwrap(), env);
            let sim = g.simulate_boot().unwrap();
            assert_eq!(sim.source, EnvSource::Copy(1));
            assert_eq!(sim.choice, env.next_boot(), "{env:?}");
        }
    }

    #[test]
    fn transactions_follow_the_contract() {
        let d = tempfile::tempdir().unwrap();
        let g = GrubBootloader::new(d.path(), 3);
        g.install(&BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Good,
        })
        .unwrap();
        g.mark_bad(Slot::B).unwrap();
        assert_eq!(
            g.read().unwrap(),
            BootEnv {
                primary: Slot::A,
                a: SlotBoot::Good,
                b: SlotBoot::Bad
            }
        );
        g.try_slot(Slot::B, 9).unwrap();
        assert_eq!(
            g.read().unwrap(),
            BootEnv {
                primary: Slot::B,
                a: SlotBoot::Good,
                b: SlotBoot::Trying { tries_left: 3 }
            }
        );
        g.try_slot(Slot::B, 0).unwrap();
        assert_eq!(g.read().unwrap().b, SlotBoot::Trying { tries_left: 1 });
        g.mark_good(Slot::B).unwrap();
        assert_eq!(
            g.read().unwrap(),
            BootEnv {
                primary: Slot::B,
                a: SlotBoot::Good,
                b: SlotBoot::Good
            }
        );
        // Files stay in place: 1024 bytes each, same inode across writes.
        use std::os::unix::fs::MetadataExt;
        let env1 = d.path().join("k3os/env1");
        let ino = std::fs::metadata(&env1).unwrap().ino();
        g.mark_bad(Slot::A).unwrap();
        assert_eq!(std::fs::metadata(&env1).unwrap().ino(), ino);
        assert_eq!(std::fs::metadata(&env1).unwrap().len(), 1024);
    }

    #[test]
    fn countdown_model_counts_to_exhaustion_then_falls_back() {
        let d = tempfile::tempdir().unwrap();
        let g = GrubBootloader::new(d.path(), 3);
        g.install(&BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        })
        .unwrap();
        g.try_slot(Slot::B, 3).unwrap();
        let mut boots = Vec::new();
        for _ in 0..5 {
            let sim = g.simulate_boot().unwrap();
            boots.push(sim.choice);
            for op in &sim.countdown {
                op.apply().unwrap();
            }
        }
        assert_eq!(boots, [Slot::B, Slot::B, Slot::B, Slot::A, Slot::A]);
        assert_eq!(g.read().unwrap().b, SlotBoot::Trying { tries_left: 0 });
        assert_eq!(
            GrubEnv::read_file(d.path().join("k3os/env2")).unwrap(),
            GrubEnv::read_file(d.path().join("k3os/env1")).unwrap()
        );
    }

    #[test]
    fn tries_are_limited_to_what_the_installed_cfg_accepts() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("grub.cfg"), render_cfg(&cfg(2))).unwrap();
        let g = GrubBootloader::new(d.path(), 5);
        assert_eq!(g.cfg_max_tries().unwrap(), Some(2));
        assert_eq!(g.max_tries(), 2);
        g.install(&BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        })
        .unwrap();
        g.try_slot(Slot::B, 5).unwrap();
        assert_eq!(g.read().unwrap().b, SlotBoot::Trying { tries_left: 2 });
        std::fs::write(d.path().join("grub.cfg"), format!("{MAX_TRIES_MARKER}x\n")).unwrap();
        let e = g.cfg_max_tries().unwrap_err().to_string();
        assert!(e.contains("grub.cfg") && e.contains("\"x\""), "{e}");
    }

    #[test]
    fn range_checks_default_safely() {
        let d = tempfile::tempdir().unwrap();
        let g = GrubBootloader::new(d.path(), 3);
        g.install(&BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Good,
        })
        .unwrap();
        let junk = GrubEnv::from_pairs([
            (VAR_PRIMARY, "b"),
            ("K3OS_A", "Good"),
            ("K3OS_A_TRIES", "1"),
            ("K3OS_B", "try"),
            ("K3OS_B_TRIES", "4"),
            // Intact as a copy (the check repeats the values): only the range checks act.
            ("K3OS_CHECK", "b:Good:1:try:4"),
        ]);
        for n in [1, 2] {
            std::fs::write(
                d.path().join(format!("k3os/env{n}")),
                junk.to_bytes().unwrap(),
            )
            .unwrap();
        }
        assert_eq!(
            g.read().unwrap(),
            BootEnv {
                primary: Slot::A,
                a: SlotBoot::Bad,
                b: SlotBoot::Trying { tries_left: 0 }
            }
        );
    }

    #[test]
    fn render_cfg_has_entries_and_chain() {
        let text = render_cfg(&cfg(3));
        assert!(text.contains("linux '/a/vmlinuz' 'root=/dev/vda4' 'console=ttyS0' 'quote='\\''x'\\''' 'k3os.slot=A' 'panic=10'"), "{text}");
        assert!(text.contains("initrd '/b/initrd'"));
        assert!(text.contains("--id k3os-B {"));
        assert!(text.contains(
            "if [ \"${K3OS_B_TRIES}\" = \"3\" ]; then set K3OS_B_TRIES=2; set k3os_count=1"
        ));
        assert!(text.contains(
            "elif [ \"${K3OS_A_TRIES}\" = \"1\" ]; then set K3OS_A_TRIES=0; set k3os_count=1"
        ));
        assert!(
            !text.contains("\"4\""),
            "no value above max_tries is accepted"
        );
        assert!(text.contains("serial --unit=0"));
        assert!(!render_cfg(&GrubConfig {
            serial: false,
            ..cfg(1)
        })
        .contains("serial"));
    }
}
