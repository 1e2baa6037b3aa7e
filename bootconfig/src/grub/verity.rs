//! Per-slot dm-verity root hash files (GRUB script 3, issue 34): `k3os/verity-A` and
//! `k3os/verity-B`, each a 1024-byte GRUB environment block holding `K3OS_VERITY_A=<hex>` (or
//! `_B`). When a slot's file exists, script 3 adds `k3os.verity=<hex>` to that slot's kernel
//! command line, which makes the initramfs open the root through dm-verity; without the file
//! the slot boots exactly as before. A file that exists but does not load (or holds no value)
//! passes `k3os.verity=unreadable`, a hash no initramfs accepts: that boot fails and the loader
//! falls back, rather than booting the slot without the integrity it was activated with.
//!
//! The files are separate from the env copies so the copies keep script 2's layout and rules
//! (a node moves between scripts 2 and 3 without rewriting them), and each is written only
//! while its slot is not the one running: by the activation of that slot, before the loader is
//! told to try it, with one atomic replace (or removal). The value is not trusted by what reads
//! it: the initramfs opens the root with it, so a wrong hash fails the boot, and the confirm
//! step compares it with the slot's signed manifest.

use std::path::{Path, PathBuf};

use super::env::GrubEnv;
use super::ENV_DIR;
use crate::{Error, Result, Slot};

/// The variable a slot's file holds (`K3OS_VERITY_A`, `K3OS_VERITY_B`).
pub(crate) fn verity_var(slot: Slot) -> String {
    format!("K3OS_VERITY_{slot}")
}

/// The file name of a slot's root hash file in [`ENV_DIR`] (`verity-A`, `verity-B`).
pub(crate) fn verity_file(slot: Slot) -> String {
    format!("verity-{slot}")
}

/// The value the script passes when a slot's file exists but yields no hash.
pub(crate) const UNREADABLE: &str = "unreadable";

/// Longest root hash accepted (sha512's 64 bytes, in hex).
const MAX_HEX: usize = 128;
/// Longest geometry (the fields after the root hash) accepted: a 64-byte salt in hex and four
/// numbers, with room to spare, far under the kernel's 2048-byte command line.
const MAX_GEOMETRY: usize = 256;

/// `value` if it is what the kernel's verity target and the initramfs take: a root hash
/// (lower-case hex, an even number of digits, 2 to 128 of them), optionally followed by the
/// geometry the initramfs needs (`,<salt>,<data blocks>,<hash start>,<FEC start>,<FEC roots>`:
/// lower-case hex and decimal digits; see libupgrade's `boot::verity_check::boot_param`); else
/// an error naming `path` and what was found.
pub(crate) fn checked<'a>(path: &Path, value: &'a str) -> Result<&'a str> {
    let digits = |f: &str| f.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let (hash, geometry) = match value.split_once(',') {
        Some((h, g)) => (h, Some(g)),
        None => (value, None),
    };
    let hash_ok = digits(hash) && !hash.is_empty() && hash.len() % 2 == 0 && hash.len() <= MAX_HEX;
    let geometry_ok = geometry.is_none_or(|g| {
        g.len() <= MAX_GEOMETRY && g.split(',').all(|f| !f.is_empty() && digits(f))
    });
    if hash_ok && geometry_ok {
        return Ok(value);
    }
    Err(Error::Invalid {
        path: path.to_path_buf(),
        what: format!(
            "expected a dm-verity root hash (lower-case hex, an even number of digits up to {MAX_HEX}) optionally followed by ',' and its geometry (lower-case hex or decimal fields, up to {MAX_GEOMETRY} bytes), found '{}'; nothing was written",
            value.escape_debug()
        ),
    })
}

/// Path of `slot`'s root hash file under `grub_dir`.
pub(crate) fn path_of(grub_dir: &Path, slot: Slot) -> PathBuf {
    grub_dir.join(ENV_DIR).join(verity_file(slot))
}

/// Make `slot`'s file name `root_hash`, or remove it (`None`), atomically.
pub(crate) fn write(grub_dir: &Path, slot: Slot, root_hash: Option<&str>) -> Result<()> {
    let path = path_of(grub_dir, slot);
    let Some(hash) = root_hash else {
        return match std::fs::remove_file(&path) {
            Ok(()) => crate::atomic::fsync_dir(path.parent().unwrap_or(grub_dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                op: "remove",
                path,
                source,
            }),
        };
    };
    let hash = checked(&path, hash)?;
    let block = GrubEnv::from_pairs([(verity_var(slot), hash.to_string())])
        .to_bytes()
        .map_err(|e| Error::Invalid {
            path: path.clone(),
            what: format!("cannot encode the root hash as an environment block: {e}"),
        })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            op: "create directory",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    crate::atomic::write_atomic(&path, &block)
}

/// What script 3 passes as `slot`'s `k3os.verity=` (the model of its lines): `None` without a
/// file, the hash it holds, or [`UNREADABLE`] when the file does not load as GRUB loads it.
pub(crate) fn read(grub_dir: &Path, slot: Slot) -> Result<Option<String>> {
    let path = path_of(grub_dir, slot);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                op: "read",
                path,
                source,
            })
        }
    };
    let value = super::env::grub_load(&bytes)
        .and_then(|l| l.get(&verity_var(slot)).map(str::to_string))
        .filter(|v| !v.is_empty());
    Ok(Some(value.unwrap_or_else(|| UNREADABLE.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_remove_round_trip_and_bad_hashes_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let h = "ab".repeat(32);
        assert_eq!(read(d.path(), Slot::B).unwrap(), None);
        write(d.path(), Slot::B, Some(&h)).unwrap();
        assert_eq!(read(d.path(), Slot::B).unwrap().as_deref(), Some(&*h));
        assert_eq!(read(d.path(), Slot::A).unwrap(), None, "per slot");
        let bytes = std::fs::read(path_of(d.path(), Slot::B)).unwrap();
        assert_eq!(bytes.len(), crate::ENV_SIZE, "a GRUB env block");
        let with_geometry = format!("{h},{},2840,2840,2863,2", "5a".repeat(32));
        write(d.path(), Slot::A, Some(&with_geometry)).unwrap();
        assert_eq!(
            read(d.path(), Slot::A).unwrap().as_deref(),
            Some(&*with_geometry)
        );
        write(d.path(), Slot::A, None).unwrap();
        let long = format!("{h},{}", "1".repeat(300));
        for bad in [
            "",
            "AB",
            "abc",
            "ab cd",
            "ab\ncd",
            &"a".repeat(130),
            "ab,",
            "ab,,12",
            "ab,12,X",
            "ab,1 2",
            ",ab",
            &long,
        ] {
            let e = write(d.path(), Slot::B, Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("verity-B") && e.contains("nothing was written"),
                "{e}"
            );
        }
        assert_eq!(read(d.path(), Slot::B).unwrap().as_deref(), Some(&*h));
        write(d.path(), Slot::B, None).unwrap();
        assert_eq!(read(d.path(), Slot::B).unwrap(), None);
        write(d.path(), Slot::B, None).unwrap();
    }

    #[test]
    fn a_damaged_file_reads_as_unreadable() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), Slot::A, Some("00ff")).unwrap();
        let p = path_of(d.path(), Slot::A);
        std::fs::write(&p, b"garbage").unwrap();
        assert_eq!(
            read(d.path(), Slot::A).unwrap().as_deref(),
            Some(UNREADABLE)
        );
    }
}
