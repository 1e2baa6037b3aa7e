//! A minimal writer for the `newc` cpio format the kernel unpacks as initramfs.
//!
//! Written here rather than driving `cpio(1)` so the archive can hold `/dev/console` (a device
//! node) and root ownership without touching the host filesystem, and so its bytes depend only
//! on the entries (no host timestamps or inode numbers): same inputs, same initrd.

use std::io::{self, Write};

/// One archive member.
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
    CharDev {
        path: String,
        mode: u32,
        major: u32,
        minor: u32,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

fn pad4<W: Write>(w: &mut W, len: usize) -> io::Result<()> {
    let pad = (4 - len % 4) % 4;
    w.write_all(&[0u8; 3][..pad])
}

fn header<W: Write>(
    w: &mut W,
    ino: u32,
    mode: u32,
    nlink: u32,
    filesize: usize,
    rdev: (u32, u32),
    name: &str,
) -> io::Result<()> {
    let namesize = name.len() + 1;
    write!(
        w,
        "070701{ino:08X}{mode:08X}{uid:08X}{gid:08X}{nlink:08X}{mtime:08X}{filesize:08X}\
         {dmaj:08X}{dmin:08X}{rmaj:08X}{rmin:08X}{namesize:08X}{check:08X}",
        uid = 0,
        gid = 0,
        mtime = 0,
        dmaj = 0,
        dmin = 0,
        rmaj = rdev.0,
        rmin = rdev.1,
        check = 0,
    )?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    pad4(w, 110 + namesize)
}

/// Write `entries` (parents before children) and the trailer.
pub fn write<W: Write>(w: &mut W, entries: &[Entry]) -> io::Result<()> {
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match e {
            Entry::Dir { path, mode } => header(w, ino, S_IFDIR | mode, 2, 0, (0, 0), path)?,
            Entry::File { path, mode, data } => {
                header(w, ino, S_IFREG | mode, 1, data.len(), (0, 0), path)?;
                w.write_all(data)?;
                pad4(w, data.len())?;
            }
            Entry::Symlink { path, target } => {
                header(w, ino, S_IFLNK | 0o777, 1, target.len(), (0, 0), path)?;
                w.write_all(target.as_bytes())?;
                pad4(w, target.len())?;
            }
            Entry::CharDev {
                path,
                mode,
                major,
                minor,
            } => header(w, ino, S_IFCHR | mode, 1, 0, (*major, *minor), path)?,
        }
    }
    header(w, 0, 0, 1, 0, (0, 0), "TRAILER!!!")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// The archive must be readable by GNU cpio (the same format the kernel unpacks).
    #[test]
    fn gnu_cpio_lists_and_extracts_it() {
        let entries = vec![
            Entry::Dir {
                path: "bin".into(),
                mode: 0o755,
            },
            Entry::File {
                path: "bin/hello".into(),
                mode: 0o755,
                data: b"#!/bin/sh\necho hi\n".to_vec(),
            },
            Entry::Symlink {
                path: "init".into(),
                target: "bin/hello".into(),
            },
            Entry::Dir {
                path: "dev".into(),
                mode: 0o755,
            },
            Entry::CharDev {
                path: "dev/console".into(),
                mode: 0o600,
                major: 5,
                minor: 1,
            },
        ];
        let mut buf = Vec::new();
        write(&mut buf, &entries).unwrap();
        assert_eq!(buf.len() % 4, 0);

        let mut child = Command::new("cpio")
            .args(["-t", "-v", "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cpio(1) must be installed for this test (package cpio)");
        child.stdin.take().unwrap().write_all(&buf).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8(out.stdout).unwrap();
        for want in [
            "bin/hello",
            "init -> bin/hello",
            "dev/console",
            "crw-------",
        ] {
            assert!(listing.contains(want), "missing {want} in:\n{listing}");
        }

        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("cpio")
            .args([
                "-i",
                "-d",
                "--quiet",
                "--no-absolute-filenames",
                "--nonmatching",
                "dev/console",
            ])
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&buf).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(
            std::fs::read(dir.path().join("bin/hello")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
    }
}
