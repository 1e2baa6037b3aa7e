//! An image archive: a plain tar of container images (an OCI image layout or a `docker save`
//! archive, what k3s imports from its airgap directory), kept in the payload store and
//! patched as plain bytes (an uncompressed tar keeps unchanged layers byte for byte, so chunks
//! and plain patches reuse them). The images it holds are listed in the manifest
//! (`Payload::images`, filled by `release create --image`).

use super::{Kind, OnBoot, Place, ReadAt, Room};

/// The image-archive kind.
pub(super) const KIND: Kind = Kind {
    name: "image-archive",
    place: Place::Store,
    patch_kind: "plain",
    check: Some(check),
    room: Room::Store,
    content_len: None,
    verity: false,
    on_boot: OnBoot::AirgapImages,
};

/// A tar archive: its first header carries the `ustar` magic (POSIX and GNU tar, what
/// `skopeo copy … oci-archive:` and `docker save` write). The images themselves are read
/// again by the boot's health check.
fn check(read: ReadAt, size: u64) -> Result<(), String> {
    if size < 512 {
        return Err(format!(
            "{size} bytes: shorter than one tar header (512 bytes)"
        ));
    }
    let mut magic = [0u8; 5];
    read(257, &mut magic).map_err(|e| format!("reading its tar header: {e}"))?;
    if &magic != b"ustar" {
        return Err(format!(
            "not a tar archive: expected 'ustar' at byte 257, found {:?}",
            String::from_utf8_lossy(&magic).escape_debug().to_string()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bytes: &[u8]) -> impl Fn(u64, &mut [u8]) -> std::io::Result<()> + '_ {
        move |pos, buf| {
            let p = pos as usize;
            buf.copy_from_slice(&bytes[p..p + buf.len()]);
            Ok(())
        }
    }

    #[test]
    fn a_tar_passes_and_anything_else_is_named() {
        let mut tar = vec![0u8; 1024];
        tar[257..262].copy_from_slice(b"ustar");
        assert!(check(&reader(&tar), 1024).is_ok());
        let gz = [0x1fu8, 0x8b, 8, 0].repeat(256);
        let e = check(&reader(&gz), 1024).unwrap_err();
        assert!(e.contains("not a tar archive"), "{e}");
        assert!(check(&reader(&tar[..100]), 100)
            .unwrap_err()
            .contains("shorter"));
    }
}
