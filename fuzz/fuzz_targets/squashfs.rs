//! The squashfs check every staged rootfs passes (`sqcheck::check`, through
//! `libupgrade::fuzz_squashfs_check`, feature `fuzzing`): the superblock, the inode table's
//! chain of metadata blocks and the id table's pointers, read through exact reads at offsets.
//!
//! The input is the image; the size the manifest gives is its length.
//!
//! Asserts: an accepted image is a squashfs 4.0 whose filesystem fits the input, with a block
//! size a power of two from 4 KiB to 1 MiB; a refusal's message carries no control character
//! (it is printed to the publisher and the node's log).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let read_at = |pos: u64, buf: &mut [u8]| -> std::io::Result<()> {
        let start = usize::try_from(pos).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| data.get(start..end))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    };
    match libupgrade::fuzz_squashfs_check(read_at, data.len() as u64) {
        Ok(sb) => {
            assert_eq!(sb.version, (4, 0));
            assert!(sb.bytes_used <= data.len() as u64, "{sb:?}");
            assert!(sb.block_size.is_power_of_two(), "{sb:?}");
            assert!((4096..=1 << 20).contains(&sb.block_size), "{sb:?}");
        }
        Err(msg) => assert!(!msg.chars().any(char::is_control), "unescaped: {msg:?}"),
    }
});
