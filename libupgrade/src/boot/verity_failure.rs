//! The initramfs's record of a dm-verity failure (issue 34 item 5): when opening a slot's root
//! through dm-verity fails, or its mount or first reads do, the initramfs
//! (`images/files/initrd-init.sh`) writes `<state_dir>/verity-failure` and reboots, so the
//! loader counts the try and falls back. The next boot's assessment reads the record
//! ([`read`]) and names it in the why of that slot's fallback, which `slot status` shows; the
//! record is then removed ([`remove`]) so it never explains a later fallback.
//!
//! Format 1, written by a shell: `key=value` lines, `format=1`, `slot=A|B`, `reason=<one
//! line>`. New in v0.2.0: no earlier release writes or reads it; an absent file is no failure.
//! A record of an unknown format or slot is still a failure of the slot it names if any; its
//! text is untrusted and escaped where it is shown.

use std::path::{Path, PathBuf};

use bootconfig::Slot;
use serde::{Deserialize, Serialize};

/// The record's file name in the state directory.
pub const FILE: &str = "verity-failure";
/// Longest reason kept (the rest is cut).
const MAX_REASON: usize = 400;

/// A dm-verity failure of a slot's boot, as the initramfs recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerityFailure {
    /// The slot whose root failed.
    pub slot: Slot,
    /// What failed, in the initramfs's words (untrusted: escape when shown).
    pub reason: String,
}

/// The record in `text`; `None` when it names no slot (nothing to attribute).
pub fn parse(text: &str) -> Option<VerityFailure> {
    let mut slot = None;
    let mut reason = String::new();
    let mut format = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("format", v)) => format = Some(v.to_string()),
            Some(("slot", "A")) => slot = Some(Slot::A),
            Some(("slot", "B")) => slot = Some(Slot::B),
            Some(("reason", v)) => reason = v.trim().chars().take(MAX_REASON).collect(),
            _ => {}
        }
    }
    if format.as_deref() != Some("1") {
        reason = format!(
            "{reason} (a record of format '{}', this build reads 1)",
            format.unwrap_or_default().escape_debug()
        );
    }
    slot.map(|slot| VerityFailure { slot, reason })
}

/// Path of the record in `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// The record in `state_dir`, if any. An unreadable file is logged and counts as none: it
/// only explains a fallback the loader already took.
pub fn read(state_dir: &Path) -> Option<VerityFailure> {
    let p = path(state_dir);
    match std::fs::read(&p) {
        Ok(bytes) => parse(&String::from_utf8_lossy(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            log::warn!(
                "{}: cannot read the initramfs's dm-verity record: {e}",
                p.display()
            );
            None
        }
    }
}

/// Remove the record once an assessment has used it (logged when that fails: the next
/// assessment would name it again, which is only noise).
pub fn remove(state_dir: &Path) {
    let p = path(state_dir);
    if let Err(e) = std::fs::remove_file(&p) {
        if e.kind() != std::io::ErrorKind::NotFound {
            log::warn!(
                "{}: cannot remove the used dm-verity record: {e}",
                p.display()
            );
        }
    }
}

/// The words a fallback's why gets when `failure` is of `slot`.
pub fn why(failure: Option<&VerityFailure>, slot: Slot) -> String {
    match failure {
        Some(f) if f.slot == slot => format!(
            "; its initramfs recorded a dm-verity failure: {}",
            f.reason.escape_debug()
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initramfs_record_reads_and_names_its_slot() {
        // As images/files/initrd-init.sh's printf writes it.
        let text = "format=1\nslot=B\nreason=k3os-verity-open: device-mapper Load of 'k3os-root' failed: Invalid argument (os error 22) (the kernel log says why) \n";
        let f = parse(text).unwrap();
        assert_eq!(f.slot, Slot::B);
        assert!(f.reason.starts_with("k3os-verity-open: device-mapper Load"));
        assert!(f.reason.ends_with("says why)"), "trimmed: {:?}", f.reason);
        assert_eq!(
            why(Some(&f), Slot::B),
            format!(
                "; its initramfs recorded a dm-verity failure: {}",
                f.reason.escape_debug()
            )
        );
        assert_eq!(why(Some(&f), Slot::A), "", "another slot's record");
        assert_eq!(why(None, Slot::B), "");
    }

    #[test]
    fn odd_records_are_escaped_cut_or_ignored() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("format=1\nslot=C\nreason=x\n"), None, "no slot");
        let f = parse(&format!(
            "format=1\nslot=A\nreason=\u{1b}[2J{}\n",
            "x".repeat(999)
        ))
        .unwrap();
        assert_eq!(f.reason.chars().count(), MAX_REASON);
        assert!(why(Some(&f), Slot::A).contains("\\u{1b}[2J"));
        let newer = parse("format=2\nslot=B\nreason=r\n").unwrap();
        assert_eq!(
            newer.reason,
            "r (a record of format '2', this build reads 1)"
        );
    }

    #[test]
    fn read_and_remove_in_a_state_dir() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path()), None, "no record: no failure");
        std::fs::write(path(d.path()), "format=1\nslot=B\nreason=mount\n").unwrap();
        assert_eq!(read(d.path()).unwrap().reason, "mount");
        remove(d.path());
        assert!(!path(d.path()).exists());
        remove(d.path());
    }
}
