//! The squashfs root filesystem: a slot file, patched squashfs-aware, checked structurally.

use super::{Kind, NotContent, OnBoot, Place, ReadAt, Room};
use crate::manifest::Artifact;

/// The rootfs kind.
pub(super) const KIND: Kind = Kind {
    name: "rootfs",
    place: Place::Slot(Artifact::Rootfs),
    patch_kind: "squashfs",
    check: Some(check),
    room: Room::Own,
    content_len: Some(content_len),
    verity: true,
    on_boot: OnBoot::Nothing,
};

/// A squashfs whose used bytes fit the signed size ([`crate::sqcheck`]: constant memory).
fn check(read: ReadAt, size: u64) -> Result<(), String> {
    crate::sqcheck::check(|pos, buf| read(pos, buf), size).map(|_| ())
}

/// The bytes of a copy (`len` long) that are its squashfs: the superblock's used bytes,
/// padded to 4 KiB as mksquashfs pads the image, never past `len`.
fn content_len(read: ReadAt, len: u64) -> Result<u64, NotContent> {
    let mut head = [0u8; crate::sqcheck::SUPERBLOCK_LEN];
    read(0, &mut head).map_err(|e| NotContent::Read("read superblock", e))?;
    let sb = crate::sqcheck::fields(&head).map_err(|_| NotContent::Not("holds no squashfs"))?;
    Ok(sb.bytes_used.div_ceil(4096).saturating_mul(4096).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_from(bytes: &[u8]) -> impl Fn(u64, &mut [u8]) -> std::io::Result<()> + '_ {
        move |pos, buf| {
            let at = pos as usize;
            match bytes.get(at..at + buf.len()) {
                Some(b) => {
                    buf.copy_from_slice(b);
                    Ok(())
                }
                None => Err(std::io::ErrorKind::UnexpectedEof.into()),
            }
        }
    }

    #[test]
    fn a_copy_s_content_is_its_squashfs_padded_to_4k_within_the_copy() {
        let mut sb = vec![0u8; crate::sqcheck::SUPERBLOCK_LEN];
        sb[0..4].copy_from_slice(crate::sqcheck::MAGIC);
        sb[40..48].copy_from_slice(&5000u64.to_le_bytes());
        assert_eq!(content_len(&read_from(&sb), 1 << 20).unwrap(), 8192);
        assert_eq!(content_len(&read_from(&sb), 6000).unwrap(), 6000);
        sb[0] = b'x';
        assert!(matches!(
            content_len(&read_from(&sb), 1 << 20),
            Err(NotContent::Not("holds no squashfs"))
        ));
        assert!(matches!(
            content_len(&read_from(&sb[..10]), 1 << 20),
            Err(NotContent::Read("read superblock", _))
        ));
    }
}
