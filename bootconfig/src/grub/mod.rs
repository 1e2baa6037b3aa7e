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

//!
//! Submodules: [`script`] renders `grub.cfg`, [`model`] reads the files the way that script
//! does (and what its countdown writes), [`writer`] is the [`Bootloader`](crate::Bootloader)
//! that plans and performs Rust's writes. The names below are the one definition all three use.

use crate::Slot;

mod model;
mod script;
mod writer;

pub use crate::BootEntry;
pub use model::{simulate_boot, BootSim};
pub(crate) use script::kernel_args;
pub use script::{render_cfg, GrubConfig};
pub use writer::GrubBootloader;

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
