//! A/B boot on stock Debian GRUB (no patched modules): the generated `grub.cfg` and the
//! environment files it reads and counts down.
//!
//! # Files (all under the GRUB directory, e.g. `/boot/grub`, found by GRUB via `$prefix`)
//! - `grub.cfg`: [`render_cfg`], first line the script's version (`# k3os-grub-script: 3`;
//!   v0.1.0's script has none): installed by `k3os-ops bootloader install`, and replaced by an
//!   activation whose release carries a newer script ([`GrubBootloader::install_script`]). How
//!   versions are read, migrated and rolled out: [`version`].
//! - `k3os/env1`, `k3os/env2`: two copies of the boot state, each a 1024-byte GRUB environment
//!   block ([`env`](mod@env)) with `K3OS_PRIMARY=A|B`, `K3OS_A=good|try|bad`,
//!   `K3OS_A_TRIES=0..=max`, `K3OS_B`, `K3OS_B_TRIES`, and the copy's integrity check
//!   `K3OS_CHECK`: those five values again, joined with `:` (e.g. `B:good:0:try:3`).
//! - `k3os/lock1`, `k3os/lock2`: one marker per copy, a block holding `K3OS_EDITING=0|1`.
//! - `k3os/verity-A`, `k3os/verity-B` (script 3): a slot's dm-verity root hash, passed on its
//!   command line as `k3os.verity=<hex>` ([`verity`](mod@verity)).
//! - `k3os/good`: the slot last confirmed good, `K3OS_GOOD=A|B` written twice (also as
//!   `K3OS_GOOD_AGAIN`). Written only when that slot changes (a confirm, or when the slot it
//!   names is marked bad); read only when both copies are damaged.
//!
//! The two-copies-with-locks scheme follows mender's grub-mender-grubenv, re-derived for our
//! variables; no code was taken from it.
//!
//! # Copy integrity (one definition: [`check_value`] in Rust, [`check_expr`] in the script)
//! Stock GRUB has no arithmetic, so no checksum: instead every value is stored twice. A copy is
//! **intact** when it loads as an environment block and `K3OS_CHECK` equals the string built
//! from the five values as loaded (GRUB compares `"${K3OS_CHECK}"` with
//! `"${K3OS_PRIMARY}:${K3OS_A}:…"`). Any damage to a value, a name, the check or the header —
//! `K3OS_A=good` becoming `K3OS_A=gXod` included — makes the copy damaged *as a whole*: none of
//! its values are used. A torn write (a mix of old and new bytes) is damaged too, unless the
//! mix equals a complete old or new block.
//!
//! # Reading (GRUB script 2, and [`GrubBootloader`]'s `read`, which follow the same rules;
//! script 1's rules are in [`version`])
//! 1. copy 1 if it is intact and its lock reads exactly `K3OS_EDITING=0` (an unreadable lock
//!    counts as editing);
//! 2. else copy 2 if it is intact (whatever its lock says: an intact copy holds one complete
//!    write);
//! 3. else copy 1 if it is intact (copy 1 was being written, copy 2 is damaged);
//! 4. else the last-good record `k3os/good` when its two values agree on `A` or `B`: that slot
//!    good and primary, the other bad (its state is unknown, so it is never chosen over the
//!    confirmed one);
//! 5. else nothing: primary `A`, both bad, GRUB boots A (only after three independent faults).
//!
//! Every value is then range-checked: primary not exactly `A`/`B` → `A`; a state not exactly
//! `good`/`try` → `bad`; tries not exactly one of `0`..=`max_tries` → `0`. The slot chosen is
//! [`BootEnv::next_boot`](crate::BootEnv::next_boot)'s choice. If the chosen slot is on trial
//! with tries left, GRUB counts one down (an if-chain) and saves every copy it found intact:
//! mark its lock editing, `save_env` the values and the new check, unmark.
//!
//! [`simulate_boot`] is that reader, byte for byte (checked against the real GRUB in
//! `grub-emu`); [`BootSim::integrity`] names each damaged or mid-write file and the record in
//! use, which `libupgrade`'s status shows.
//!
//! # Writing (Rust)
//! A Rust write never takes values from a damaged copy: it reads the state the way GRUB does
//! (above), changes it, and rewrites **both** copies completely from that state: mark copy 1
//! editing, write `env1`, unmark; then copy 2. When GRUB uses copy 1 and copy 2 is not usable,
//! copy 2 is written first, so the copy GRUB reads is never touched while the other one is
//! damaged. All files are written in place (same blocks, same 1024-byte size) because GRUB's
//! `save_env` writes through the file's block list; a missing or wrongly sized file is
//! recreated with an atomic replace instead. `k3os/good` is rewritten before the copies when
//! the slot it names stops being good (so it never names a bad slot), after them otherwise.
//!
//! A single power cut during any write leaves GRUB choosing the old or the new slot (proved by
//! the power-cut tests, against the real GRUB in `grub-emu` too). A cut during GRUB's own
//! countdown while the other copy is damaged leaves no intact copy: GRUB then boots the last
//! confirmed slot (rule 4), never a slot marked bad.
//!
//! The boot partition's filesystem must give the env files real blocks (ext4 without
//! `inline_data`, the default), or GRUB's `save_env` cannot count down.
//!
//! Submodules: `script` renders `grub.cfg`, `model` reads the files the way that script does
//! (and what its countdown writes), `writer` is the [`Bootloader`](crate::Bootloader) that
//! plans and performs Rust's writes. The names below are the one definition all three use.

use crate::Slot;

pub(crate) mod env;
mod model;
mod script;
mod verity;
pub(crate) mod version;
mod writer;

pub use model::{simulate_boot, simulate_boot_with, BootSim, EnvSource};
pub(crate) use script::kernel_args;
pub use script::{render_cfg, render_signed_cfg, GrubConfig};
pub(crate) use verity::checked as verity_checked;
pub use version::{GrubScript, CFG_FILE, SCRIPT_MARKER};
pub use writer::GrubBootloader;

/// Subdirectory of the GRUB directory that holds the env copies and locks.
pub const ENV_DIR: &str = "k3os";
/// Variable names in the env copies, in file order.
pub const VAR_PRIMARY: &str = "K3OS_PRIMARY";
pub const VAR_EDITING: &str = "K3OS_EDITING";
/// The copy's integrity check: [`check_value`] of its values.
pub const VAR_CHECK: &str = "K3OS_CHECK";
/// The last-good record (file `k3os/good`): the slot, and the same slot again.
pub const GOOD_FILE: &str = "good";
pub const VAR_GOOD: &str = "K3OS_GOOD";
pub const VAR_GOOD_AGAIN: &str = "K3OS_GOOD_AGAIN";
/// Comment line in [`render_cfg`]'s output recording the highest tries count the script
/// accepts; [`GrubBootloader`] never writes more than that.
pub const MAX_TRIES_MARKER: &str = "# k3os-max-tries: ";
/// Line separating the selection script from the menu entries in [`render_cfg`]'s output.
pub const MENU_MARKER: &str = "# ---- k3os menu entries ----";
/// Separator of the values in [`VAR_CHECK`].
const CHECK_SEP: &str = ":";

fn state_var(s: Slot) -> String {
    format!("K3OS_{}", s.letter())
}
fn tries_var(s: Slot) -> String {
    format!("K3OS_{}_TRIES", s.letter())
}
/// The variables of a copy that [`VAR_CHECK`] covers, in file order.
fn env_var_names() -> [String; 5] {
    [
        VAR_PRIMARY.to_string(),
        state_var(Slot::A),
        tries_var(Slot::A),
        state_var(Slot::B),
        tries_var(Slot::B),
    ]
}

/// The check a copy must hold: the values of `K3OS_PRIMARY`, `K3OS_A`, `K3OS_A_TRIES`,
/// `K3OS_B`, `K3OS_B_TRIES` as loaded (an unset variable
/// counts as empty, as in GRUB's `${…}`), joined with `:`.
pub fn check_value(get: impl Fn(&str) -> Option<String>) -> String {
    env_var_names()
        .iter()
        .map(|n| get(n).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(CHECK_SEP)
}

/// The same check as a GRUB script word: `"${K3OS_PRIMARY}:${K3OS_A}:…"`.
pub fn check_expr() -> String {
    let parts: Vec<String> = env_var_names()
        .iter()
        .map(|n| format!("${{{n}}}"))
        .collect();
    format!("\"{}\"", parts.join(CHECK_SEP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_and_expr_are_one_definition() {
        let v = check_value(|n| Some(format!("<{n}>")));
        let e = check_expr()
            .trim_matches('"')
            .replace("${", "<")
            .replace('}', ">");
        assert_eq!(v, e);
        assert_eq!(check_value(|_| None), "::::");
    }
}
