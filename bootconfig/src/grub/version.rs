//! Versions of the GRUB boot scheme: the installed `grub.cfg` decides how GRUB reads and counts
//! down the env copies, so it also decides how Rust must read them.
//!
//! | script | written by | how the env copies are read |
//! |---|---|---|
//! | 1 | v0.1.0 (no marker line) | copy 1 unless its lock is not `0` or it fails to load, else copy 2; no `K3OS_CHECK`, no last-good record; the countdown saves the five values into every copy whose lock reads `0` |
//! | 2 | v0.2.0 (`# k3os-grub-script: 2`) | the rules in [`crate::grub`]'s docs: a copy is used only when `K3OS_CHECK` repeats its values; the last-good record when both are damaged |
//! | 3 | v0.2.0 on (`# k3os-grub-script: 3`) | as 2; besides, each slot's dm-verity root hash file `k3os/verity-A`/`verity-B` ([`super::verity`]) puts `k3os.verity=<hex>` on that slot's command line |
//!
//! Rust always *writes* env copies in the newest layout (the five values, `K3OS_CHECK`, the
//! last-good record): script 1 ignores what it does not load, so that layout reads the same
//! under both scripts. Rust *reads* them with the installed script's rules
//! ([`super::simulate_boot`] dispatches on [`installed`]). A node made by v0.1.0 therefore
//! keeps working unchanged, and moves to script 2 only when a script is installed
//! ([`super::GrubBootloader::install_script`]): the copies are first rewritten completely
//! under the old script's rules, then `grub.cfg` is replaced atomically, so at every instant
//! the installed script reads the installed copies correctly.
//!
//! # Rolling out a script change in two releases
//! A script that reads the env differently can only be installed once *both* slots run a
//! `k3os-ops` that writes what it needs (a v0.1.0 binary writes no `K3OS_CHECK`: under script
//! 2 its writes read as damage). So a change is rolled out like Mender's grub-mender-grubenv
//! and systemd's boot counting keep old loaders working: release N learns to read and write
//! for script k+1 but keeps the installed script; release N+1 carries script k+1, which the
//! node installs when it activates N+1 — at that moment the running slot (N or later) and the
//! trial slot (N+1) both know script k+1. `libupgrade` decides this per activation from what
//! each release declares it reads (the manifest's `boot` section).
//!
//! A `grub.cfg` with a marker naming a version above [`GrubScript::CURRENT`] is refused
//! ([`crate::Error::NewerFormat`]) and nothing is rewritten.

use std::fmt;
use std::path::Path;

use super::VAR_CHECK;
use crate::{Error, Result};

/// The marker line's prefix (the first line of a rendered `grub.cfg` from script 2 on).
pub const SCRIPT_MARKER: &str = "# k3os-grub-script: ";
/// File name of the script in the GRUB directory.
pub const CFG_FILE: &str = "grub.cfg";

/// A GRUB script version this build understands (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GrubScript {
    /// v0.1.0: no integrity check, no last-good record.
    V1,
    /// v0.2.0: `K3OS_CHECK` per copy and the last-good record.
    V2,
    /// v0.2.0 (issue 34): as V2, plus the per-slot dm-verity root hash files. The env copies
    /// read exactly as under V2, so a node moves between 2 and 3 without rewriting them.
    V3,
}

impl GrubScript {
    /// The version [`super::render_cfg`] renders.
    pub const CURRENT: GrubScript = GrubScript::V3;

    /// The version number written after [`SCRIPT_MARKER`].
    pub fn number(self) -> u32 {
        match self {
            GrubScript::V1 => 1,
            GrubScript::V2 => 2,
            GrubScript::V3 => 3,
        }
    }

    /// The version numbered `n`; `None` for a number this build does not know.
    pub fn from_number(n: u32) -> Option<GrubScript> {
        match n {
            1 => Some(GrubScript::V1),
            2 => Some(GrubScript::V2),
            3 => Some(GrubScript::V3),
            _ => None,
        }
    }

    /// The version of a `grub.cfg`'s text: its marker line; without one, 2 when the script
    /// checks `K3OS_CHECK` (builds between v0.1.0 and v0.2.0 rendered no marker), else 1.
    /// `path` only names the file in errors.
    pub fn of_cfg(path: &Path, text: &str) -> Result<GrubScript> {
        let marker = text.lines().find_map(|l| l.strip_prefix(SCRIPT_MARKER));
        let Some(v) = marker else {
            return Ok(if text.contains(VAR_CHECK) {
                GrubScript::V2
            } else {
                GrubScript::V1
            });
        };
        let n: u32 = v.trim().parse().map_err(|_| Error::Invalid {
            path: path.to_path_buf(),
            what: format!("expected a version number after {SCRIPT_MARKER:?}, found {v:?}"),
        })?;
        GrubScript::from_number(n).ok_or_else(|| {
            if n > GrubScript::CURRENT.number() {
                Error::NewerFormat {
                    path: path.to_path_buf(),
                    what: "GRUB script",
                    found: n,
                    known: GrubScript::CURRENT.number(),
                }
            } else {
                Error::Invalid {
                    path: path.to_path_buf(),
                    what: format!("GRUB script version {n} does not exist"),
                }
            }
        })
    }
}

impl fmt::Display for GrubScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// The script installed in `grub_dir`, `None` when there is no `grub.cfg` (nothing installed
/// yet: readers then follow [`GrubScript::CURRENT`], what an install would put there).
pub fn installed(grub_dir: &Path) -> Result<Option<GrubScript>> {
    let path = grub_dir.join(CFG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => GrubScript::of_cfg(&path, &text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            op: "read",
            path,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_real_scripts() {
        let p = Path::new("grub.cfg");
        let v1 = include_str!("../../tests/fixtures/v0.1.0/grub.cfg");
        assert_eq!(GrubScript::of_cfg(p, v1).unwrap(), GrubScript::V1);
        assert_eq!(
            GrubScript::of_cfg(p, "set x=1\nif [ \"${K3OS_CHECK}\" = x ]; then true; fi\n")
                .unwrap(),
            GrubScript::V2,
            "unmarked scripts that check K3OS_CHECK came from builds after v0.1.0"
        );
        assert_eq!(
            GrubScript::of_cfg(p, "# k3os-grub-script: 1\n").unwrap(),
            GrubScript::V1
        );
        assert_eq!(
            GrubScript::of_cfg(p, "# k3os-grub-script: 3\n").unwrap(),
            GrubScript::V3
        );
        let e = GrubScript::of_cfg(p, "# k3os-grub-script: 4\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("grub.cfg") && e.contains("version 4") && e.contains("up to version 3"),
            "{e}"
        );
        let e = GrubScript::of_cfg(p, "# k3os-grub-script: x\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"x\""), "{e}");
    }
}
