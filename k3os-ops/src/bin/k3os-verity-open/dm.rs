//! The three device-mapper ioctls that make a mapped device (`DM_DEV_CREATE`, `DM_TABLE_LOAD`,
//! `DM_DEV_SUSPEND` to resume it), and `DM_DEV_REMOVE` to undo a half-made one, on
//! `/dev/mapper/control` (`linux/dm-ioctl.h`, interface version 4).
//!
//! Written here rather than with `dmsetup` (dynamically linked: libdevmapper, libudev, libselinux
//! and a loader in the initrd) or the `devicemapper` crate (its dependency tree for four
//! ioctls): the request is one `struct dm_ioctl` header followed by one target spec and its
//! parameter string, encoded by [`request`] (pure, tested) and sent by [`Control`].

use std::fs::File;
use std::os::fd::AsRawFd;

/// `sizeof(struct dm_ioctl)`.
const HEADER: usize = 312;
/// `sizeof(struct dm_target_spec)`.
const SPEC: usize = 40;
/// Offset of `name[128]` in the header.
const NAME_AT: usize = 48;
/// Longest device name (`DM_NAME_LEN` less the NUL).
const NAME_MAX: usize = 127;
/// `DM_READONLY_FLAG`: the verity target refuses a writable table.
const READONLY: u32 = 1;
/// The interface version asked for (the kernel accepts any minor up to its own).
const VERSION: [u32; 3] = [4, 0, 0];

/// Command numbers (`_IOC_NR`) of the ioctls used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// `DM_DEV_CREATE`: a device with no table.
    Create = 3,
    /// `DM_DEV_REMOVE`.
    Remove = 4,
    /// `DM_DEV_SUSPEND` without `DM_SUSPEND_FLAG`: resume, making the loaded table live.
    Resume = 6,
    /// `DM_TABLE_LOAD`: the inactive table.
    Load = 9,
}

/// Why a device-mapper request failed.
#[derive(Debug, thiserror::Error)]
pub enum DmError {
    /// A device name too long or with a NUL.
    #[error("device-mapper name '{0}' is empty, over {NAME_MAX} bytes or holds a NUL")]
    Name(String),
    /// `/dev/mapper/control` missing (dm-mod not loaded?).
    #[error("open /dev/mapper/control (is dm-mod loaded?): {0}")]
    Control(std::io::Error),
    /// The ioctl failed; the kernel log says why in its words.
    #[error("device-mapper {cmd:?} of '{name}' failed: {source} (the kernel log says why)")]
    Ioctl {
        /// The request.
        cmd: Cmd,
        /// The device.
        name: String,
        /// errno.
        source: std::io::Error,
    },
}

/// One target of a table: `length` sectors from 0 of type `kind` with `params`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// Sectors mapped.
    pub sectors: u64,
    /// Target type (`verity`).
    pub kind: &'a str,
    /// Its parameter string.
    pub params: &'a str,
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// The request buffer of `cmd` on device `name`, with `target` as its one-target table
/// (`DM_TABLE_LOAD` only).
pub fn request(name: &str, target: Option<&Target>) -> Result<Vec<u8>, DmError> {
    if name.is_empty() || name.len() > NAME_MAX || name.contains('\0') {
        return Err(DmError::Name(name.escape_debug().to_string()));
    }
    let body = target.map_or(0, |t| (SPEC + t.params.len() + 1).next_multiple_of(8));
    let mut buf = vec![0u8; HEADER + body];
    for (i, v) in VERSION.iter().enumerate() {
        put_u32(&mut buf, i * 4, *v);
    }
    put_u32(&mut buf, 12, (HEADER + body) as u32); // data_size
    put_u32(&mut buf, 16, HEADER as u32); // data_start
    buf[NAME_AT..NAME_AT + name.len()].copy_from_slice(name.as_bytes());
    if let Some(t) = target {
        put_u32(&mut buf, 20, 1); // target_count
        put_u32(&mut buf, 28, READONLY); // flags
        let s = HEADER;
        buf[s + 8..s + 16].copy_from_slice(&t.sectors.to_ne_bytes()); // length
        put_u32(&mut buf, s + 20, body as u32); // next
        let kind = t.kind.as_bytes();
        buf[s + 24..s + 24 + kind.len().min(15)].copy_from_slice(&kind[..kind.len().min(15)]);
        buf[s + SPEC..s + SPEC + t.params.len()].copy_from_slice(t.params.as_bytes());
    }
    Ok(buf)
}

/// The `dev` field of a reply (`huge_encode_dev`), as (major, minor).
pub fn reply_dev(buf: &[u8]) -> (u32, u32) {
    let mut d = [0u8; 8];
    d.copy_from_slice(&buf[40..48]);
    let dev = u64::from_ne_bytes(d);
    let major = ((dev >> 8) & 0xfff) as u32;
    let minor = ((dev & 0xff) | ((dev >> 12) & 0xfff00)) as u32;
    (major, minor)
}

/// An open `/dev/mapper/control`.
pub struct Control(File);

impl Control {
    /// Open the control device.
    pub fn open() -> Result<Control, DmError> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/mapper/control")
            .map(Control)
            .map_err(DmError::Control)
    }

    /// Send `cmd` for `name` (with `target` for a table load); the kernel's reply buffer.
    pub fn send(&self, cmd: Cmd, name: &str, target: Option<&Target>) -> Result<Vec<u8>, DmError> {
        let mut buf = request(name, target)?;
        let code = nix::request_code_readwrite!(0xfd, cmd as u8, HEADER);
        // SAFETY: `buf` is a `struct dm_ioctl` of `data_size` = buf.len() bytes, which is all
        // the kernel reads and writes back.
        let r = unsafe { nix::libc::ioctl(self.0.as_raw_fd(), code as _, buf.as_mut_ptr()) };
        if r < 0 {
            return Err(DmError::Ioctl {
                cmd,
                name: name.into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn a_table_load_is_the_header_then_one_spec_and_its_nul_terminated_params() {
        let t = Target {
            sectors: 6688,
            kind: "verity",
            params: "1 254:4 254:4 4096",
        };
        let b = request("k3os-root", Some(&t)).unwrap();
        assert_eq!(b.len(), 312 + 64, "40 + 19 bytes, padded to 8");
        assert_eq!([u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)], [4, 0, 0]);
        assert_eq!((u32_at(&b, 12), u32_at(&b, 16)), (376, 312), "size, start");
        assert_eq!(
            (u32_at(&b, 20), u32_at(&b, 28)),
            (1, 1),
            "one target, read-only"
        );
        assert_eq!(&b[48..58], b"k3os-root\0");
        assert_eq!(u64::from_ne_bytes(b[320..328].try_into().unwrap()), 6688);
        assert_eq!(u32_at(&b, 332), 64, "next");
        assert_eq!(&b[336..343], b"verity\0");
        assert_eq!(&b[352..371], b"1 254:4 254:4 4096\0");
        let plain = request("k3os-root", None).unwrap();
        assert_eq!(
            (plain.len(), u32_at(&plain, 12), u32_at(&plain, 20)),
            (312, 312, 0)
        );
    }

    #[test]
    fn bad_names_are_refused_and_the_reply_dev_decodes() {
        for bad in ["", "a\0b", &"x".repeat(128)] {
            assert!(
                matches!(request(bad, None), Err(DmError::Name(_))),
                "{bad:?}"
            );
        }
        let mut b = request("r", None).unwrap();
        // huge_encode_dev(MKDEV(254, 0x1234)): minor's low byte, major, minor's high bits.
        let dev: u64 = 0x34 | (254 << 8) | (0x12 << 20);
        b[40..48].copy_from_slice(&dev.to_ne_bytes());
        assert_eq!(reply_dev(&b), (254, 0x1234));
    }
}
