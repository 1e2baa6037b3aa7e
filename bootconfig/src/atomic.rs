//! Power-cut-safe file writes, shared by the bootloader backends and by `libupgrade`.
//!
//! Two kinds of write exist, because bootloaders read files in two different ways:
//! - [`write_atomic`]: the loader finds the file by *name* through a filesystem driver
//!   (`grub.cfg`, `extlinux.conf`, state files). A complete copy is written to a temporary file in
//!   the same directory, fsynced, renamed over the target, and the directory is fsynced. At any
//!   instant the name points at either the complete old or the complete new content.
//! - [`write_in_place`] / [`write_at`]: the loader (or its writer) addresses the file by *block
//!   list*: GRUB's `save_env` writes the blocks of the env file it found, syslinux writes its ADV
//!   into sectors recorded in `ldlinux.sys` at install time. Such a file must keep its blocks, so
//!   it is overwritten through the existing inode (no truncate, no rename, same length) and
//!   fsynced. A cut during such a write can tear it; the callers' formats (two copies with an
//!   `editing` marker, two checksummed ADV copies) make a torn copy harmless.
//!
//! Files with the ext2/3/4 *immutable* attribute (extlinux sets it on `ldlinux.sys`) are written
//! in place by lifting the attribute for the write and restoring it afterwards, as `extlinux`
//! itself does.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The temporary name used for an atomic replacement of `path`: `.<name>.k3os-tmp` in the same
/// directory. It is fixed so a leftover from an interrupted write is simply overwritten by the
/// next one instead of accumulating.
pub fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| Error::Invalid {
        path: path.to_path_buf(),
        what: "expected a file path, found no file name".into(),
    })?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(".k3os-tmp");
    Ok(path.with_file_name(tmp))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Apply `ops` in order; the first failure stops (what was applied stays: every plan is
/// ordered so that any prefix of it is a state the loader handles).
pub fn apply_all(ops: &[WriteOp]) -> Result<()> {
    ops.iter().try_for_each(WriteOp::apply)
}

/// Replace `path` with `bytes` atomically: temp file in the same directory, write, fsync,
/// rename over `path`, fsync the directory, then `syncfs` the filesystem. The file gets mode
/// 0644.
///
/// Why `syncfs`: fsync of the directory makes the rename durable *in the ext4 journal*, but
/// GRUB and syslinux read the filesystem without replaying the journal. After a power cut
/// right after the rename they still found the old directory entry (vm-tests powercut on
/// extlinux, cut at `confirm:state-good`: the node booted the old slot while Linux, which
/// replays the journal, saw the new `extlinux.conf`). `syncfs` writes the committed metadata
/// to its home location, so what the loader reads is what was renamed.
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let path = path.as_ref();
    let tmp = temp_path(path)?;
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(io("create temporary file", &tmp))?;
        f.write_all(bytes).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("fsync", &tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        op: "rename temporary file over",
        path: path.to_path_buf(),
        source,
    })?;
    let dir = parent_dir(path);
    fsync_dir(&dir)?;
    syncfs(&dir)
}

/// Flush the whole filesystem holding `dir`, journal checkpoint included (see [`write_atomic`]).
pub fn syncfs(dir: impl AsRef<Path>) -> Result<()> {
    use std::os::fd::AsRawFd;
    let dir = dir.as_ref();
    let f = File::open(dir).map_err(io("open directory", dir))?;
    // SAFETY: syncfs only reads the file descriptor, which `f` keeps open for the call.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(Error::Io {
            op: "syncfs the filesystem of",
            path: dir.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// fsync a directory, making renames and creations in it durable.
pub fn fsync_dir(dir: impl AsRef<Path>) -> Result<()> {
    let dir = dir.as_ref();
    let f = File::open(dir).map_err(io("open directory", dir))?;
    f.sync_all().map_err(io("fsync directory", dir))
}

/// Overwrite the whole content of the existing file `path` with `bytes` without moving its
/// blocks (same inode, same length, no truncation), then fsync it. The new content must have
/// exactly the file's current length; use [`write_atomic`] to change a file's size.
pub fn write_in_place(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let path = path.as_ref();
    let len = std::fs::metadata(path).map_err(io("stat", path))?.len();
    if len != bytes.len() as u64 {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            what: format!(
                "in-place write must keep the file size: file has {len} bytes, new content has {} bytes",
                bytes.len()
            ),
        });
    }
    write_at(path, 0, bytes)
}

/// Overwrite `bytes.len()` bytes of the existing file `path` at `offset`, in place, then
/// fsync. The range must lie inside the file (the file never grows, so no block is allocated).
pub fn write_at(path: impl AsRef<Path>, offset: u64, bytes: &[u8]) -> Result<()> {
    let path = path.as_ref();
    let len = std::fs::metadata(path).map_err(io("stat", path))?.len();
    let end = offset.checked_add(bytes.len() as u64);
    if end.is_none_or(|end| end > len) {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            what: format!(
                "in-place write of {} bytes at offset {offset} would extend the file ({len} bytes)",
                bytes.len()
            ),
        });
    }
    let write = |f: &File| -> Result<()> {
        f.write_all_at(bytes, offset)
            .map_err(io("write in place", path))?;
        f.sync_data().map_err(io("fsync", path))
    };
    match OpenOptions::new().write(true).open(path) {
        Ok(f) => write(&f),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            // Possibly immutable (extlinux marks ldlinux.sys +i): lift the flag for the write.
            let ro = File::open(path).map_err(io("open", path))?;
            let flags = get_flags(&ro).map_err(io("read inode flags of", path))?;
            if flags & FS_IMMUTABLE_FL == 0 {
                return Err(Error::Io {
                    op: "open for in-place write",
                    path: path.to_path_buf(),
                    source: e,
                });
            }
            set_flags(&ro, flags & !FS_IMMUTABLE_FL)
                .map_err(io("clear immutable flag of", path))?;
            let result = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io("open for in-place write", path))
                .and_then(|f| write(&f));
            let restore = set_flags(&ro, flags).map_err(io("restore immutable flag of", path));
            result.and(restore)
        }
        Err(e) => Err(Error::Io {
            op: "open for in-place write",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

const FS_IMMUTABLE_FL: libc::c_long = 0x0000_0010;

fn get_flags(f: &File) -> std::io::Result<libc::c_long> {
    use std::os::fd::AsRawFd;
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long through the pointer, which is valid for the call.
    let rc = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            libc::FS_IOC_GETFLAGS,
            &mut flags as *mut libc::c_long,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(flags)
}

fn set_flags(f: &File, flags: libc::c_long) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: FS_IOC_SETFLAGS reads one long through the pointer, which is valid for the call.
    let rc = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            libc::FS_IOC_SETFLAGS,
            &flags as *const libc::c_long,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One write of a backend's transaction, as data. Backends plan a transaction as a list of
/// these and then [`WriteOp::apply`] them in order; the power-cut tests apply a prefix of the
/// list plus a torn part of the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// [`write_atomic`] of the whole file.
    Replace {
        /// The file replaced.
        path: PathBuf,
        /// Its whole new content.
        data: Vec<u8>,
    },
    /// [`write_at`] into the existing file.
    InPlace {
        /// The existing file.
        path: PathBuf,
        /// Where in it the bytes go.
        offset: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
}

impl WriteOp {
    /// Perform the write durably.
    pub fn apply(&self) -> Result<()> {
        match self {
            WriteOp::Replace { path, data } => write_atomic(path, data),
            WriteOp::InPlace { path, offset, data } => write_at(path, *offset, data),
        }
    }

    /// The file this write changes.
    pub fn path(&self) -> &Path {
        match self {
            WriteOp::Replace { path, .. } | WriteOp::InPlace { path, .. } => path,
        }
    }

    /// Leave the state a power cut would leave after `written` bytes of this write reached the
    /// disk: for an in-place write the first `written` bytes are new and the rest old; for a
    /// replacement the temporary file holds `written` bytes and was not renamed (so the target
    /// is untouched). `written >= len` for a replacement means "complete but not renamed".
    pub fn apply_torn(&self, written: usize) -> Result<()> {
        match self {
            WriteOp::Replace { path, data } => {
                let tmp = temp_path(path)?;
                std::fs::write(&tmp, &data[..written.min(data.len())]).map_err(io("write", &tmp))
            }
            WriteOp::InPlace { path, offset, data } => {
                write_at(path, *offset, &data[..written.min(data.len())])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn atomic_replaces_content_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.conf");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert!(!temp_path(&p).unwrap().exists());
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o644);
    }

    #[test]
    fn atomic_overwrites_a_stale_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(
            temp_path(&p).unwrap(),
            b"leftover from a cut, longer than the new content",
        )
        .unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
    }

    #[test]
    fn atomic_into_missing_dir_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("nope/f");
        let e = write_atomic(&p, b"x").unwrap_err().to_string();
        assert!(e.contains("nope/.f.k3os-tmp"), "{e}");
    }

    #[test]
    fn in_place_keeps_the_inode_and_rejects_size_changes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("env");
        std::fs::write(&p, [b'#'; 1024]).unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        write_in_place(&p, &[b'x'; 1024]).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        assert_eq!(std::fs::read(&p).unwrap(), vec![b'x'; 1024]);
        let e = write_in_place(&p, &[b'y'; 1000]).unwrap_err().to_string();
        assert!(e.contains("1024 bytes") && e.contains("1000 bytes"), "{e}");
        let e = write_at(&p, 1000, &[0; 100]).unwrap_err().to_string();
        assert!(e.contains("extend the file"), "{e}");
        write_at(&p, 1020, b"tail").unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[1020..], b"tail");
        let e = write_in_place(d.path().join("missing"), b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn torn_ops_leave_prefix_or_untouched_target() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("env");
        std::fs::write(&p, b"aaaaaaaa").unwrap();
        let op = WriteOp::InPlace {
            path: p.clone(),
            offset: 0,
            data: b"bbbbbbbb".to_vec(),
        };
        op.apply_torn(3).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"bbbaaaaa");
        let op = WriteOp::Replace {
            path: p.clone(),
            data: b"cccc".to_vec(),
        };
        op.apply_torn(usize::MAX).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"bbbaaaaa");
        assert_eq!(std::fs::read(temp_path(&p).unwrap()).unwrap(), b"cccc");
        op.apply().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"cccc");
    }
}
