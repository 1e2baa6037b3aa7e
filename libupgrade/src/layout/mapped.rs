//! The device under a device-mapper device: with dm-verity the root is mounted from
//! `/dev/dm-N`, whose one "slave" in sysfs is the slot's partition (or the loop device of a
//! dir-layout slot's file). The rootfs health check compares the partition, so it looks
//! through the mapping first. Reads sysfs under a root given by the caller (tests use a
//! temp dir).

use std::path::Path;

/// Device-mapper levels followed at most (verity over a partition is one).
const MAX_DEPTH: usize = 4;

/// A block device: its numbers and, when found through sysfs, its kernel name (`vda5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockDev {
    /// (major, minor).
    pub dev: (u32, u32),
    /// The kernel name, `None` for the device the caller started from.
    pub name: Option<String>,
}

/// `dev` (major, minor) with every device-mapper level above a single device removed: while
/// `<sys>/dev/block/<major>:<minor>/slaves` holds exactly one entry, step to that device
/// (`<sys>/class/block/<name>/dev`). A device with no slaves (a partition), several (a
/// mapping over many devices, which is no slot's) or unreadable sysfs is returned as it is,
/// so the caller's comparison decides.
pub(crate) fn underlying(sys: &Path, dev: (u32, u32)) -> BlockDev {
    let mut at = BlockDev { dev, name: None };
    for _ in 0..MAX_DEPTH {
        match single_slave(sys, at.dev) {
            Some(next) => at = next,
            None => break,
        }
    }
    at
}

/// The one device under `dev`, if it has exactly one.
fn single_slave(sys: &Path, dev: (u32, u32)) -> Option<BlockDev> {
    let slaves = sys.join(format!("dev/block/{}:{}/slaves", dev.0, dev.1));
    let mut names = std::fs::read_dir(slaves).ok()?.filter_map(|e| e.ok());
    let name = names.next()?.file_name();
    if names.next().is_some() {
        return None;
    }
    let text = std::fs::read_to_string(sys.join("class/block").join(&name).join("dev")).ok()?;
    Some(BlockDev {
        dev: parse_dev(&text)?,
        name: Some(name.to_string_lossy().into_owned()),
    })
}

/// `"<major>:<minor>\n"` as sysfs `dev` files hold it.
fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs: `dm-0` (253:0) over `vda5` (254:5), `dm-1` over two devices.
    fn sysfs() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let s = d.path();
        for (name, dev) in [("vda5", "254:5"), ("vda4", "254:4"), ("dm-0", "253:0")] {
            std::fs::create_dir_all(s.join("class/block").join(name)).unwrap();
            std::fs::write(
                s.join("class/block").join(name).join("dev"),
                format!("{dev}\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(s.join("dev/block/253:0/slaves/vda5")).unwrap();
        std::fs::create_dir_all(s.join("dev/block/254:5/slaves")).unwrap();
        std::fs::create_dir_all(s.join("dev/block/253:1/slaves/vda4")).unwrap();
        std::fs::create_dir_all(s.join("dev/block/253:1/slaves/vda5")).unwrap();
        d
    }

    #[test]
    fn a_verity_device_resolves_to_its_partition_and_others_stay() {
        let d = sysfs();
        let at = underlying(d.path(), (253, 0));
        assert_eq!(
            (at.dev, at.name.as_deref()),
            ((254, 5), Some("vda5")),
            "dm-verity over vda5"
        );
        for (dev, what) in [
            ((254, 5), "a partition"),
            ((253, 1), "over two devices"),
            ((7, 0), "not in sysfs"),
        ] {
            assert_eq!(
                underlying(d.path(), dev),
                BlockDev { dev, name: None },
                "{what}"
            );
        }
        assert_eq!(parse_dev("254:5\n"), Some((254, 5)));
        assert_eq!(parse_dev("x"), None);
    }
}
