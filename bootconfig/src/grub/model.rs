//! What GRUB's script sees and does at one boot, read from the files on disk: the one reader
//! both the tests (against the real GRUB in `grub-emu`) and [`super::GrubBootloader`] use. See
//! the module docs of [`crate::grub`] for the rules.

use std::fmt;
use std::path::{Path, PathBuf};

use super::env::{grub_load, grub_set_in_place, GrubEnv, Loaded, ENV_SIZE};
use super::version::{installed, GrubScript};
use super::{
    check_value, env_var_names, state_var, tries_var, ENV_DIR, GOOD_FILE, VAR_CHECK, VAR_EDITING,
    VAR_GOOD, VAR_GOOD_AGAIN, VAR_PRIMARY,
};
use crate::atomic::WriteOp;
use crate::{BootEnv, Damage, Error, Integrity, Result, Slot, SlotBoot};

/// Where the script took the state from (its `k3os_copy` variable prints the same words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvSource {
    /// Env copy 1 or 2.
    Copy(u8),
    /// Both copies damaged: the last-good record named this slot.
    LastGood(Slot),
    /// Nothing usable: defaults (primary A, both bad).
    Nothing,
}

impl fmt::Display for EnvSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvSource::Copy(n) => write!(f, "{n}"),
            EnvSource::LastGood(_) => f.write_str("good"),
            EnvSource::Nothing => f.write_str("none"),
        }
    }
}

/// What GRUB's script sees and does at one boot, modelled from the files on disk. Tests compare
/// it with the real GRUB (`grub-emu`); [`super::GrubBootloader`] is built on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSim {
    /// The installed script whose rules these are.
    pub script: GrubScript,
    /// Where the state came from.
    pub source: EnvSource,
    /// The state after range checks, before the countdown.
    pub seen: BootEnv,
    /// The slot booted.
    pub choice: Slot,
    /// The writes GRUB's `save_env` performs before booting (countdown), in order.
    pub countdown: Vec<WriteOp>,
    /// Per copy: intact (loads; under script 2 also its check matches).
    pub intact: [bool; 2],
    /// Per copy: intact, its lock reads exactly `0`, and both files have the size `save_env`
    /// needs. A writer must not mark the copy in use editing while the other copy is not
    /// usable.
    pub usable: [bool; 2],
    /// What the last-good record says: `Some(Some(slot))`, `Some(None)` for an intact record
    /// naming no slot, `None` when it is missing or damaged.
    pub last_good: Option<Option<Slot>>,
    /// The last-good file holds exactly what a write of its slot produces.
    pub last_good_canonical: bool,
    /// Damaged records and the one in use, for `slot status`.
    pub integrity: Integrity,
}

pub(super) fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn range_check(get: impl Fn(&str) -> Option<String>, max: u8) -> BootEnv {
    let primary = if get(VAR_PRIMARY).as_deref() == Some("B") {
        Slot::B
    } else {
        Slot::A
    };
    let state = |slot: Slot| {
        let tries = get(&tries_var(slot))
            .and_then(|t| (0..=max).find(|n| n.to_string() == t))
            .unwrap_or(0);
        match get(&state_var(slot)).as_deref() {
            Some("good") => SlotBoot::Good,
            Some("try") => SlotBoot::Trying { tries_left: tries },
            _ => SlotBoot::Bad,
        }
    };
    BootEnv {
        primary,
        a: state(Slot::A),
        b: state(Slot::B),
    }
}

/// The script's choice, written out the way the script does it (not via `next_boot`, so the
/// tests comparing the two mean something).
fn script_choice(env: &BootEnv) -> Slot {
    let ok = |s: Slot| match env.get(s) {
        SlotBoot::Good => true,
        SlotBoot::Trying { tries_left } => tries_left != 0,
        SlotBoot::Bad => false,
    };
    let (p, o) = (env.primary, env.primary.other());
    if ok(p) {
        p
    } else if ok(o) {
        o
    } else if env.get(p) != SlotBoot::Bad {
        p
    } else if env.get(o) != SlotBoot::Bad {
        o
    } else {
        p
    }
}

/// The variables of one copy holding `env`, check last (the order of the script's `save_env`).
pub(super) fn env_block(env: &BootEnv) -> GrubEnv {
    let mut g = GrubEnv::new();
    g.set(VAR_PRIMARY, env.primary.letter());
    for slot in Slot::ALL {
        let (state, tries) = match env.get(slot) {
            SlotBoot::Good => ("good", 0),
            SlotBoot::Trying { tries_left } => ("try", tries_left),
            SlotBoot::Bad => ("bad", 0),
        };
        g.set(state_var(slot), state);
        g.set(tries_var(slot), tries.to_string());
    }
    let check = check_value(|k| g.get(k).map(str::to_string));
    g.set(VAR_CHECK, check);
    g
}

/// The last-good record naming `slot` (`none` for no slot).
pub(super) fn good_block(slot: Option<Slot>) -> GrubEnv {
    let v = slot.map_or("none", Slot::letter);
    GrubEnv::from_pairs([(VAR_GOOD, v), (VAR_GOOD_AGAIN, v)])
}

fn sized(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == ENV_SIZE as u64)
}

/// Why an env copy cannot be used as `script` reads it (`present`: the file exists; `env`: it
/// loads as a GRUB environment block), or `None` when its values are intact.
fn copy_problem(present: bool, env: Option<&Loaded>, script: GrubScript) -> Option<String> {
    match (present, env) {
        (false, _) => Some("missing".to_string()),
        (true, None) => Some("not a GRUB environment block (no signature)".to_string()),
        (true, Some(_)) if script == GrubScript::V1 => None,
        (true, Some(l)) => {
            let want = check_value(|k| l.get(k).map(str::to_string));
            match l.get(VAR_CHECK) {
                Some(c) if c == want => None,
                Some(c) => Some(format!(
                    "damaged: {VAR_CHECK}={c:?} does not match its values {want:?}; none of them is used"
                )),
                None => Some(format!(
                    "damaged: no {VAR_CHECK} to confirm its values {want:?}; none of them is used"
                )),
            }
        }
    }
}

/// One env copy as `script` reads it: its lock value, and its variables when intact, or why it
/// is damaged. Script 1 has no check: a copy that loads is intact.
fn read_copy(
    dir: &Path,
    n: u8,
    script: GrubScript,
    damaged: &mut Vec<Damage>,
) -> Result<(String, Option<Loaded>)> {
    let names = env_var_names();
    let lock_path = dir.join(format!("lock{n}"));
    let env_path = dir.join(format!("env{n}"));
    let lock_raw = read_opt(&lock_path)?;
    let lock_loaded = lock_raw.as_deref().and_then(grub_load);
    // The script presets K3OS_EDITING=1, so an unloadable lock (or one without the variable)
    // reads as editing.
    let lock = lock_loaded
        .as_ref()
        .and_then(|l| l.get(VAR_EDITING).map(str::to_string))
        .unwrap_or_else(|| "1".into());
    let env_raw = read_opt(&env_path)?;
    let env = env_raw.as_deref().and_then(grub_load).map(|mut l| {
        l.vars
            .retain(|(k, _)| names.contains(k) || k.as_str() == VAR_CHECK);
        l
    });
    let problem = copy_problem(env_raw.is_some(), env.as_ref(), script);
    if let Some(what) = &problem {
        damaged.push(Damage {
            record: format!("copy {n}"),
            path: env_path.clone(),
            what: what.clone(),
        });
    } else if !sized(&env_path) {
        damaged.push(Damage {
            record: format!("copy {n}"),
            path: env_path.clone(),
            what: format!("not {ENV_SIZE} bytes (the next write replaces it)"),
        });
    } else if let (Some(raw), Some(l)) = (&env_raw, &env) {
        // Values intact, but other bytes (padding, comments) damaged: GRUB reads it, its own
        // save_env may fail on it; the next Rust write rewrites it.
        // (Script 1's copies may lack the check: the canonical block holds what is there.)
        let canonical = GrubEnv::from_pairs(
            names
                .iter()
                .chain([&VAR_CHECK.to_string()])
                .filter_map(|k| l.get(k).map(|v| (k.clone(), v.to_string()))),
        )
        .to_bytes()
        .ok();
        if canonical.as_deref() != Some(raw.as_slice()) {
            damaged.push(Damage {
                record: format!("copy {n}"),
                path: env_path.clone(),
                what: "values intact, other bytes damaged (the next write rewrites it)".into(),
            });
        }
    }
    lock_damage(
        n,
        &lock,
        lock_raw.as_deref(),
        lock_loaded.is_some(),
        lock_path,
        damaged,
    );
    Ok((lock, if problem.is_none() { env } else { None }))
}

/// Copy `n`'s lock, added to `damaged` when it does not read as a complete `0` lock (missing,
/// unloadable, marked editing) or its other bytes are not what a write makes.
fn lock_damage(
    n: u8,
    lock: &str,
    lock_raw: Option<&[u8]>,
    loaded: bool,
    lock_path: PathBuf,
    damaged: &mut Vec<Damage>,
) {
    if lock != "0" {
        let what = match (lock_raw, loaded) {
            (None, _) => "missing (counts as editing)".to_string(),
            (Some(_), false) => "not a GRUB environment block (counts as editing)".to_string(),
            _ => format!(
                "marked editing ({VAR_EDITING}={lock:?}): a write of this copy did not finish"
            ),
        };
        damaged.push(Damage {
            record: format!("copy {n} lock"),
            path: lock_path,
            what,
        });
    } else if GrubEnv::from_pairs([(VAR_EDITING, "0")]).to_bytes().ok()
        != lock_raw.map(<[u8]>::to_vec)
    {
        damaged.push(Damage {
            record: format!("copy {n} lock"),
            path: lock_path,
            what: "reads as not editing, other bytes damaged or wrong size (the next write rewrites it)"
                .into(),
        });
    }
}

/// Model GRUB's boot-time script on the files under `grub_dir` (see the module docs), with the
/// rules of the installed `grub.cfg`'s version ([`GrubScript::CURRENT`]'s when there is none;
/// an error naming both versions when it is newer than this build).
pub fn simulate_boot(grub_dir: &Path, max_tries: u8) -> Result<BootSim> {
    let script = installed(grub_dir)?.unwrap_or(GrubScript::CURRENT);
    simulate_boot_with(grub_dir, max_tries, script)
}

/// [`simulate_boot`] with the rules of `script`, whatever `grub.cfg` says.
pub fn simulate_boot_with(grub_dir: &Path, max_tries: u8, script: GrubScript) -> Result<BootSim> {
    let max = max_tries.max(1);
    let dir = grub_dir.join(ENV_DIR);
    let mut damaged = Vec::new();
    let (lock1, env1) = read_copy(&dir, 1, script, &mut damaged)?;
    let (lock2, env2) = read_copy(&dir, 2, script, &mut damaged)?;
    let copies = Copies {
        intact: [env1.is_some(), env2.is_some()],
        locks: [lock1, lock2],
        envs: [env1, env2],
    };
    let mut usable = [false; 2];
    for (i, u) in usable.iter_mut().enumerate() {
        let n = i + 1;
        *u = copies.intact[i]
            && copies.locks[i] == "0"
            && sized(&dir.join(format!("lock{n}")))
            && sized(&dir.join(format!("env{n}")));
    }
    let good_path = dir.join(GOOD_FILE);
    let (last_good, last_good_canonical) = read_last_good(&good_path, script, &mut damaged)?;
    let (source, seen, in_use) = env_source(&dir, &copies, last_good, script, max);
    let choice = script_choice(&seen);
    let mut after = seen.clone();
    let mut countdown = Vec::new();
    if let SlotBoot::Trying { tries_left } = seen.get(choice) {
        if (1..=max).contains(&tries_left) {
            after.set(
                choice,
                SlotBoot::Trying {
                    tries_left: tries_left - 1,
                },
            );
            countdown = countdown_writes(&dir, &copies, &after, script)?;
        }
    }
    Ok(BootSim {
        script,
        source,
        seen,
        choice,
        countdown,
        intact: copies.intact,
        usable,
        last_good,
        last_good_canonical,
        integrity: Integrity { in_use, damaged },
    })
}

/// Both env copies as the script read them ([`read_copy`]).
struct Copies {
    /// Each copy's lock value (`0`: not editing).
    locks: [String; 2],
    /// Each copy's variables, when intact.
    envs: [Option<Loaded>; 2],
    /// Which copies are intact.
    intact: [bool; 2],
}

/// The last-good record as `script` reads it: the slot it names (`Some(None)`: none; `None`:
/// missing or damaged) and whether its bytes are exactly what a write makes. Damage is added
/// to `damaged` for script 2 only (script 1 never reads the record; Rust writes it so that
/// script 2 finds it).
fn read_last_good(
    good_path: &Path,
    script: GrubScript,
    damaged: &mut Vec<Damage>,
) -> Result<(Option<Option<Slot>>, bool)> {
    let good_raw = read_opt(good_path)?;
    let last_good = good_raw.as_deref().and_then(grub_load).and_then(|g| {
        let v = g.get(VAR_GOOD)?;
        if g.get(VAR_GOOD_AGAIN) != Some(v) {
            return None;
        }
        match v {
            "A" => Some(Some(Slot::A)),
            "B" => Some(Some(Slot::B)),
            "none" => Some(None),
            _ => None,
        }
    });
    let canonical = good_block(last_good.flatten()).to_bytes().ok() == good_raw;
    if script == GrubScript::V1 {
        // Script 1 never reads the record.
    } else if last_good.is_none() {
        damaged.push(Damage {
            record: "last-good record".into(),
            path: good_path.to_path_buf(),
            what: if good_raw.is_none() {
                "missing (needed only when both copies are damaged)".into()
            } else {
                format!("damaged: {VAR_GOOD} and {VAR_GOOD_AGAIN} do not agree on A, B or none")
            },
        });
    } else if !canonical {
        damaged.push(Damage {
            record: "last-good record".into(),
            path: good_path.to_path_buf(),
            what: "its slot reads intact, other bytes damaged or wrong size (the next write rewrites it)".into(),
        });
    }
    Ok((last_good, canonical))
}

/// Where the script reads the slots from, what it sees there, and the sentence for
/// [`Integrity::in_use`]. Script 1: copy 1 unless marked editing or unloadable, else copy 2 if
/// it loads. Script 2 adds: else copy 1 if intact, else the last-good record.
fn env_source(
    dir: &Path,
    copies: &Copies,
    last_good: Option<Option<Slot>>,
    script: GrubScript,
    max: u8,
) -> (EnvSource, BootEnv, String) {
    let intact = copies.intact;
    let copy = if intact[0] && copies.locks[0] == "0" {
        Some(1u8)
    } else if intact[1] {
        Some(2)
    } else if intact[0] && script != GrubScript::V1 {
        Some(1)
    } else {
        None
    };
    let last_good_used = last_good.flatten().filter(|_| script != GrubScript::V1);
    match (copy, last_good_used) {
        (Some(n), _) => {
            let l = copies.envs[n as usize - 1]
                .as_ref()
                .expect("intact copy loaded");
            (
                EnvSource::Copy(n),
                range_check(|k| l.get(k).map(str::to_string), max),
                format!("copy {n} ({})", dir.join(format!("env{n}")).display()),
            )
        }
        (None, Some(g)) => (
            EnvSource::LastGood(g),
            BootEnv {
                primary: g,
                a: if g == Slot::A {
                    SlotBoot::Good
                } else {
                    SlotBoot::Bad
                },
                b: if g == Slot::B {
                    SlotBoot::Good
                } else {
                    SlotBoot::Bad
                },
            },
            format!(
                "last-good record ({}): both copies are damaged, GRUB boots slot {g}, the last confirmed one",
                dir.join(GOOD_FILE).display()
            ),
        ),
        (None, None) => (
            EnvSource::Nothing,
            range_check(|_| None, max),
            if script == GrubScript::V1 {
                "none: no env copy loads (grub.cfg is script 1, which has no last-good record); GRUB boots slot A".to_string()
            } else {
                "none: no intact env copy and no last-good record; GRUB boots slot A".to_string()
            },
        ),
    }
}

/// The in-place writes of the script's countdown to `after`. Script 2 saves the values and
/// the check into every intact copy; script 1 saves the five values (not the check) into every
/// copy whose lock reads `0`. Each copy: lock to editing, the values, lock back to `0`.
fn countdown_writes(
    dir: &Path,
    copies: &Copies,
    after: &BootEnv,
    script: GrubScript,
) -> Result<Vec<WriteOp>> {
    let mut block = env_block(after);
    if script == GrubScript::V1 {
        block.remove(VAR_CHECK);
    }
    let mut countdown = Vec::new();
    for n in 1..=2u8 {
        let saves = match script {
            GrubScript::V1 => copies.locks[n as usize - 1] == "0",
            GrubScript::V2 | GrubScript::V3 => copies.intact[n as usize - 1],
        };
        if !saves {
            continue;
        }
        let lock_path = dir.join(format!("lock{n}"));
        let Some(mut lock) = read_opt(&lock_path)? else {
            continue;
        };
        if !grub_set_in_place(&mut lock, VAR_EDITING, "1") {
            continue;
        }
        countdown.push(WriteOp::InPlace {
            path: lock_path.clone(),
            offset: 0,
            data: lock.clone(),
        });
        let env_path = dir.join(format!("env{n}"));
        let Some(mut env) = read_opt(&env_path)? else {
            continue;
        };
        if !block.iter().all(|(k, v)| grub_set_in_place(&mut env, k, v)) {
            continue;
        }
        countdown.push(WriteOp::InPlace {
            path: env_path,
            offset: 0,
            data: env,
        });
        if grub_set_in_place(&mut lock, VAR_EDITING, "0") {
            countdown.push(WriteOp::InPlace {
                path: lock_path,
                offset: 0,
                data: lock,
            });
        }
    }
    Ok(countdown)
}
