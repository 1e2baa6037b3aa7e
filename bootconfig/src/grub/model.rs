//! What GRUB's script sees and does at one boot, read from the files on disk: the one reader
//! both the tests (against the real GRUB in `grub-emu`) and [`super::GrubBootloader`] use.

use std::path::Path;

use super::{env_var_names, state_var, tries_var, ENV_DIR, VAR_EDITING, VAR_PRIMARY};
use crate::atomic::WriteOp;
use crate::grubenv::{grub_load, grub_set_in_place, GrubEnv, ENV_SIZE};
use crate::{BootEnv, Error, Result, Slot, SlotBoot};

/// What GRUB's script sees and does at one boot, modelled from the files on disk. Tests compare
/// it with the real GRUB (`grub-emu`); [`GrubBootloader::read`] is built on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSim {
    /// The copy the script loaded (1 or 2), `None` when neither loaded.
    pub copy: Option<u8>,
    /// The state after range checks, before the countdown.
    pub seen: BootEnv,
    /// The slot booted.
    pub choice: Slot,
    /// The writes GRUB's `save_env` performs before booting (countdown), in order.
    pub countdown: Vec<WriteOp>,
    /// Per copy: its lock reads exactly `0`, its env loads, and both files have the size
    /// `save_env` needs. A writer must not mark the copy in use editing while the other copy
    /// is not usable.
    pub usable: [bool; 2],
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
    g
}

/// Model GRUB's boot-time script on the files under `grub_dir` (see the module docs).
pub fn simulate_boot(grub_dir: &Path, max_tries: u8) -> Result<BootSim> {
    let max = max_tries.max(1);
    let dir = grub_dir.join(ENV_DIR);
    let file = |name: String| dir.join(name);
    // The script presets K3OS_EDITING=1, so an unloadable lock (or one without the variable)
    // reads as editing.
    let mut locks = [String::new(), String::new()];
    for (n, lock) in locks.iter_mut().enumerate() {
        let loaded = read_opt(&file(format!("lock{}", n + 1)))?.and_then(|b| grub_load(&b));
        *lock = loaded
            .and_then(|l| l.get(VAR_EDITING).map(str::to_string))
            .unwrap_or_else(|| "1".into());
    }
    let names = env_var_names();
    let load = |n: u8| -> Result<Option<crate::grubenv::Loaded>> {
        Ok(read_opt(&file(format!("env{n}")))?
            .and_then(|b| grub_load(&b))
            .map(|mut l| {
                l.vars.retain(|(k, _)| names.contains(k));
                l
            }))
    };
    let sized = |name: String| -> bool {
        std::fs::metadata(file(name)).is_ok_and(|m| m.is_file() && m.len() == ENV_SIZE as u64)
    };
    let mut usable = [false; 2];
    for (n, u) in usable.iter_mut().enumerate() {
        let n1 = n as u8 + 1;
        *u = locks[n] == "0"
            && sized(format!("lock{n1}"))
            && sized(format!("env{n1}"))
            && load(n1)?.is_some();
    }
    let mut copy = None;
    let mut vars = None;
    if locks[0] == "0" {
        if let Some(l) = load(1)? {
            copy = Some(1);
            vars = Some(l);
        }
    }
    if copy.is_none() {
        if let Some(l) = load(2)? {
            copy = Some(2);
            vars = Some(l);
        }
    }
    let seen = range_check(
        |k| vars.as_ref().and_then(|l| l.get(k).map(str::to_string)),
        max,
    );
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
            let block = env_block(&after);
            for n in 1..=2u8 {
                if locks[n as usize - 1] != "0" {
                    continue;
                }
                let lock_path = file(format!("lock{n}"));
                let env_path = file(format!("env{n}"));
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
        }
    }
    Ok(BootSim {
        copy,
        seen,
        choice,
        countdown,
        usable,
    })
}
