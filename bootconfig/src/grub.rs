//! A/B boot on stock Debian GRUB (no patched modules): the generated `grub.cfg` and the
//! environment files it reads and counts down.
//!
//! # Files (all under the GRUB directory, e.g. `/boot/grub`, found by GRUB via `$prefix`)
//! - `grub.cfg`: [`render_cfg`]; installed by the image builder.
//! - `k3os/env1`, `k3os/env2`: two copies of the boot state, each a 1024-byte GRUB environment
//!   block ([`crate::grubenv`]) with `K3OS_PRIMARY=A|B`, `K3OS_A=good|try|bad`,
//!   `K3OS_A_TRIES=0..=max`, `K3OS_B`, `K3OS_B_TRIES`.
//! - `k3os/lock1`, `k3os/lock2`: one marker per copy, a block holding `K3OS_EDITING=0|1`.
//!
//! The scheme follows mender's grub-mender-grubenv (two env copies, each with a lock block),
//! re-derived for our variables; no code was taken from it.
//!
//! # Writing (Rust and GRUB alike)
//! Mark copy 1 editing (`lock1`: `K3OS_EDITING=1`), write `env1`, unmark; then the same for
//! copy 2. All four files are written in place (same blocks, same 1024-byte size) because
//! GRUB's `save_env` writes through the file's block list; a missing or wrongly sized file is
//! recreated with an atomic replace instead. One refinement of the order: when GRUB reads copy
//! 1 and copy 2 is damaged (lock not `0`, env not loading, or a file of the wrong size), Rust
//! writes copy 2 first, so the copy GRUB reads is never marked editing while the other copy is
//! unusable. GRUB only writes a copy whose lock reads exactly
//! `0` (a copy whose write was interrupted is left for the next Rust write, which rewrites both
//! copies completely) and unmarks a copy only when `save_env` on it succeeded.
//!
//! # Reading (GRUB script, and [`GrubBootloader::read`] which follows the same rules)
//! Copy 1 is used unless its lock is not exactly `K3OS_EDITING=0` (an unreadable lock counts as
//! editing) or `env1` fails to load; otherwise copy 2. Every value is range-checked: primary
//! not exactly `A`/`B` → `A`; a state not exactly `good`/`try` → `bad`; tries not exactly one
//! of `0`..=`max_tries` → `0`. The slot chosen is [`BootEnv::next_boot`]'s choice. If the
//! chosen slot is on trial with tries left, GRUB counts one down (an if-chain, stock GRUB has no
//! arithmetic) and saves both copies before the menu boots it.
//!
//! [`GrubBootloader::read`] returns exactly the state GRUB's script would see (the *safe
//! interpretation* of a torn or damaged copy), and an error naming both env files only when
//! neither copy loads at all (nothing installed).
//!
//! A single power cut during any write leaves GRUB choosing the old or the new slot (proved by
//! the power-cut tests, against the real GRUB in `grub-emu` too). A second cut while GRUB
//! itself counts down on the very next boot, before Linux ever ran again, can leave both copies
//! marked editing; GRUB then loads copy 2 as it is and range-checks it.
//!
//! The boot partition's filesystem must give the env files real blocks (ext4 without
//! `inline_data`, the default), or GRUB's `save_env` cannot count down.

use std::path::{Path, PathBuf};

use crate::atomic::WriteOp;
use crate::grubenv::{grub_load, grub_set_in_place, GrubEnv, ENV_SIZE};
pub use crate::BootEntry;
use crate::{BootEnv, Bootloader, Error, Result, Slot, SlotBoot};

/// Subdirectory of the GRUB directory that holds the env copies and locks.
pub const ENV_DIR: &str = "k3os";
/// Variable names in the env copies, in file order.
pub const VAR_PRIMARY: &str = "K3OS_PRIMARY";
pub const VAR_EDITING: &str = "K3OS_EDITING";
/// Comment line in [`render_cfg`]'s output recording the highest tries count the script
/// accepts; [`GrubBootloader`] never writes more than that.
pub const MAX_TRIES_MARKER: &str = "# k3os-max-tries: ";
/// Line separating the selection script from the menu entries in [`render_cfg`]'s output.
pub const MENU_MARKER: &str = "# ---- k3os menu entries ----";

fn state_var(s: Slot) -> String {
    format!("K3OS_{}", s.letter())
}
fn tries_var(s: Slot) -> String {
    format!("K3OS_{}_TRIES", s.letter())
}
fn env_var_names() -> [String; 5] {
    [
        VAR_PRIMARY.to_string(),
        state_var(Slot::A),
        tries_var(Slot::A),
        state_var(Slot::B),
        tries_var(Slot::B),
    ]
}

/// Everything `grub.cfg` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrubConfig {
    /// `[A, B]`.
    pub entries: [BootEntry; 2],
    /// Highest tries count the script accepts and counts down from (at least 1).
    pub max_tries: u8,
    pub timeout_secs: u32,
    /// Also use the first serial port (115200 8N1) for the menu.
    pub serial: bool,
    /// `panic=<secs>` on every kernel command line, so a panicking kernel reboots.
    pub panic_secs: u32,
}

/// Quote one word for GRUB script: single quotes, `'` written as `'\''`.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The kernel arguments of `slot`'s entry: the configured command line, then `k3os.slot=` and
/// `panic=` (last, so they win over any earlier occurrence).
pub(crate) fn kernel_args(entry: &BootEntry, slot: Slot, panic_secs: u32) -> Vec<String> {
    let mut args: Vec<String> = entry
        .cmdline
        .split_whitespace()
        .map(str::to_string)
        .collect();
    args.push(format!("k3os.slot={}", slot.letter()));
    args.push(format!("panic={panic_secs}"));
    args
}

/// The complete `grub.cfg` (installed as `<grub dir>/grub.cfg`; the env files are found under
/// `${prefix}/k3os/`).
pub fn render_cfg(cfg: &GrubConfig) -> String {
    let max = cfg.max_tries.max(1);
    let names = env_var_names().join(" ");
    let mut s = String::new();
    let mut w = |line: &str| {
        s.push_str(line);
        s.push('\n');
    };
    w("# k3OS A/B boot: generated by bootconfig::grub::render_cfg, do not edit.");
    w("# State: ${prefix}/k3os/env1 and env2, each guarded by lock1/lock2 (K3OS_EDITING=0: complete).");
    w(&format!("{MAX_TRIES_MARKER}{max}"));
    w(&format!("set timeout={}", cfg.timeout_secs));
    w("set timeout_style=menu");
    if cfg.serial {
        w("serial --unit=0 --speed=115200 --word=8 --parity=no --stop=1");
        w("terminal_input console serial");
        w("terminal_output console serial");
    }
    w("set k3os_dir=\"${prefix}/k3os\"");
    w("");
    w("# Which copy: copy 1 unless marked editing (anything but exactly 0) or unloadable.");
    for n in [1, 2] {
        w(&format!("set {VAR_EDITING}=1"));
        w(&format!(
            "if load_env --skip-sig --file \"${{k3os_dir}}/lock{n}\" {VAR_EDITING}; then true; fi"
        ));
        w(&format!("set k3os_lock{n}=\"${{{VAR_EDITING}}}\""));
    }
    w("set k3os_copy=none");
    w("if [ \"${k3os_lock1}\" = \"0\" ]; then");
    w(&format!(
        "  if load_env --skip-sig --file \"${{k3os_dir}}/env1\" {names}; then"
    ));
    w("    set k3os_copy=1");
    w("  fi");
    w("fi");
    w("if [ \"${k3os_copy}\" != \"1\" ]; then");
    for v in env_var_names() {
        w(&format!("  unset {v}"));
    }
    w(&format!(
        "  if load_env --skip-sig --file \"${{k3os_dir}}/env2\" {names}; then"
    ));
    w("    set k3os_copy=2");
    w("  fi");
    w("fi");
    w("");
    w("# Range checks: anything outside the exact allowed set becomes the safe default.");
    w(&format!(
        "if [ \"${{{VAR_PRIMARY}}}\" != \"B\" ]; then set {VAR_PRIMARY}=A; fi"
    ));
    for slot in Slot::ALL {
        let (sv, tv) = (state_var(slot), tries_var(slot));
        w(&format!("if [ \"${{{sv}}}\" = \"good\" ]; then true"));
        w(&format!("elif [ \"${{{sv}}}\" = \"try\" ]; then true"));
        w(&format!("else set {sv}=bad; fi"));
        w(&format!("if [ \"${{{tv}}}\" = \"0\" ]; then true"));
        for t in 1..=max {
            w(&format!("elif [ \"${{{tv}}}\" = \"{t}\" ]; then true"));
        }
        w(&format!("else set {tv}=0; fi"));
        let ok = format!("k3os_{}_ok", slot.letter());
        w(&format!("set {ok}=0"));
        w(&format!(
            "if [ \"${{{sv}}}\" = \"good\" ]; then set {ok}=1; fi"
        ));
        w(&format!("if [ \"${{{sv}}}\" = \"try\" ]; then if [ \"${{{tv}}}\" != \"0\" ]; then set {ok}=1; fi; fi"));
    }
    w("");
    w("# Choice (BootEnv::next_boot): primary if bootable, else the other, else any slot not bad.");
    for (i, p) in [Slot::B, Slot::A].into_iter().enumerate() {
        let o = p.other();
        if i == 0 {
            w(&format!("if [ \"${{{VAR_PRIMARY}}}\" = \"{p}\" ]; then"));
        } else {
            w("else");
        }
        w(&format!(
            "  if [ \"${{k3os_{p}_ok}}\" = \"1\" ]; then set k3os_boot={p}"
        ));
        w(&format!(
            "  elif [ \"${{k3os_{o}_ok}}\" = \"1\" ]; then set k3os_boot={o}"
        ));
        w(&format!(
            "  elif [ \"${{{}}}\" != \"bad\" ]; then set k3os_boot={p}",
            state_var(p)
        ));
        w(&format!(
            "  elif [ \"${{{}}}\" != \"bad\" ]; then set k3os_boot={o}",
            state_var(o)
        ));
        w(&format!("  else set k3os_boot={p}; fi"));
    }
    w("fi");
    w("");
    w("# Count a trial boot down and save it: copy 1, then copy 2, each marked editing meanwhile.");
    w("set k3os_count=0");
    for slot in Slot::ALL {
        let (sv, tv) = (state_var(slot), tries_var(slot));
        w(&format!(
            "if [ \"${{k3os_boot}}\" = \"{slot}\" ]; then if [ \"${{{sv}}}\" = \"try\" ]; then"
        ));
        for t in (1..=max).rev() {
            let kw = if t == max { "if" } else { "elif" };
            w(&format!(
                "  {kw} [ \"${{{tv}}}\" = \"{t}\" ]; then set {tv}={}; set k3os_count=1",
                t - 1
            ));
        }
        w("  fi");
        w("fi; fi");
    }
    w("if [ \"${k3os_count}\" = \"1\" ]; then");
    for n in [1, 2] {
        w(&format!("  if [ \"${{k3os_lock{n}}}\" = \"0\" ]; then"));
        w(&format!("    set {VAR_EDITING}=1"));
        w(&format!(
            "    if save_env --file \"${{k3os_dir}}/lock{n}\" {VAR_EDITING}; then"
        ));
        w(&format!(
            "      if save_env --file \"${{k3os_dir}}/env{n}\" {names}; then"
        ));
        w(&format!("        set {VAR_EDITING}=0"));
        w(&format!(
            "        save_env --file \"${{k3os_dir}}/lock{n}\" {VAR_EDITING}"
        ));
        w("      fi");
        w("    fi");
        w("  fi");
    }
    w("fi");
    w("");
    w("set default=\"k3os-${k3os_boot}\"");
    w("unset fallback");
    // GRUB 2.06 (Debian 12) takes `fallback` as a menu entry *number* only (ids and titles are a
    // downstream Red Hat patch): with an id the fallback silently never happens. The entries
    // below are emitted in Slot::ALL order, so the other slot's index is its entry number.
    for slot in Slot::ALL {
        let o = slot.other();
        let index = Slot::ALL.iter().position(|s| *s == o).expect("slot in ALL");
        w(&format!(
            "if [ \"${{k3os_boot}}\" = \"{slot}\" ]; then if [ \"${{{}}}\" != \"bad\" ]; then set fallback=\"{index}\"; fi; fi",
            state_var(o)
        ));
    }
    w(MENU_MARKER);
    for (slot, entry) in Slot::ALL.into_iter().zip(cfg.entries.iter()) {
        let args: Vec<String> = kernel_args(entry, slot, cfg.panic_secs)
            .iter()
            .map(|a| quote(a))
            .collect();
        w(&format!(
            "menuentry {} --id k3os-{slot} {{",
            quote(&format!("k3OS slot {slot}"))
        ));
        w(&format!(
            "  linux {} {}",
            quote(&entry.kernel),
            args.join(" ")
        ));
        w(&format!("  initrd {}", quote(&entry.initrd)));
        w("}");
    }
    s
}

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

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
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

fn env_block(env: &BootEnv) -> GrubEnv {
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

/// [`Bootloader`] on stock GRUB; see the module docs for the files and the protocol.
#[derive(Debug, Clone)]
pub struct GrubBootloader {
    grub_dir: PathBuf,
    max_tries: u8,
}

impl GrubBootloader {
    /// `grub_dir` holds `grub.cfg` (on a node `/boot/grub`); `max_tries` must equal the
    /// [`GrubConfig::max_tries`] the installed `grub.cfg` was rendered with (0 counts as 1).
    pub fn new(grub_dir: impl Into<PathBuf>, max_tries: u8) -> Self {
        Self {
            grub_dir: grub_dir.into(),
            max_tries: max_tries.max(1),
        }
    }

    pub fn grub_dir(&self) -> &Path {
        &self.grub_dir
    }

    /// Create (or completely rewrite) the env copies and locks with `initial`, creating the
    /// `k3os/` directory if needed. Tries above `max_tries` are clamped.
    pub fn install(&self, initial: &BootEnv) -> Result<()> {
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
        crate::atomic::fsync_dir(&self.grub_dir)?;
        self.commit(&self.clamp(initial.clone()))
    }

    fn clamp(&self, mut env: BootEnv) -> BootEnv {
        let max = self.effective_max_tries();
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

    /// The highest tries count the installed `grub.cfg` accepts (its [`MAX_TRIES_MARKER`]
    /// line), `None` when there is no `grub.cfg` or it has no marker.
    pub fn cfg_max_tries(&self) -> Result<Option<u8>> {
        let path = self.grub_dir.join("grub.cfg");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::Io {
                    op: "read",
                    path,
                    source,
                })
            }
        };
        let Some(v) = text.lines().find_map(|l| l.strip_prefix(MAX_TRIES_MARKER)) else {
            return Ok(None);
        };
        v.trim()
            .parse::<u8>()
            .map(Some)
            .map_err(|_| Error::Invalid {
                path,
                what: format!("expected a number 1..=255 after {MAX_TRIES_MARKER:?}, found {v:?}"),
            })
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
        // Copy 1 then copy 2, except when GRUB uses copy 1 and copy 2 is damaged: then copy 2
        // is repaired first, so the copy GRUB reads is never marked editing while the other one
        // is unusable.
        let order = match simulate_boot(&self.grub_dir, self.max_tries) {
            Ok(sim) if sim.copy == Some(1) && !sim.usable[1] => [2, 1],
            _ => [1, 2],
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
        Ok(ops)
    }

    fn commit(&self, new: &BootEnv) -> Result<()> {
        for op in self.plan(new)? {
            op.apply()?;
        }
        Ok(())
    }

    fn update(&self, f: impl FnOnce(&mut BootEnv)) -> Result<()> {
        let mut env = self.read()?;
        f(&mut env);
        self.commit(&self.clamp(env))
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
    /// error naming both env files when neither loads.
    fn read(&self) -> Result<BootEnv> {
        let sim = self.simulate_boot()?;
        if sim.copy.is_none() {
            let dir = self.grub_dir.join(ENV_DIR);
            return Err(Error::Missing {
                path: dir.join("env1"),
                what: format!(
                    "neither env copy loads (expected GRUB environment blocks at {} and {}); run install first",
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(sim.copy, Some(1));
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
