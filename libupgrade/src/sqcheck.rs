//! A bounded-memory structural check of a squashfs image, run on every staged rootfs.
//!
//! The bytes written were already verified chunk by chunk and as a whole against the signed
//! manifest; this check guards against a publisher signing something that is not a mountable
//! squashfs. It reads the superblock, checks its fields against each other, walks the chain of
//! metadata blocks of the inode table (each header's length must be 1..=8192 and the chain must
//! end exactly where the directory table starts, with the root inode on a block boundary of it)
//! and the id table's lookup pointers. Memory stays constant whatever the image holds: parsing
//! every inode and directory with `backhand` (what this replaced) took 92 MiB for a 120 MiB
//! Debian image with 15 k files, past the 64 MiB stage budget.

use std::io;

use byteorder::{ByteOrder, LittleEndian as LE};

const METADATA_MAX: u64 = 8192;

/// Magic at offset 0 of a squashfs image ("hsqs", little endian).
pub const MAGIC: &[u8; 4] = b"hsqs";
/// Length of a squashfs 4.0 superblock.
pub const SUPERBLOCK_LEN: usize = 96;

/// Byte offsets of the superblock fields that are written back (the re-pack moves tables).
pub mod at {
    /// Root inode reference.
    pub const ROOT: usize = 32;
    /// Bytes used.
    pub const BYTES_USED: usize = 40;
    /// Id table index.
    pub const ID: usize = 48;
    /// Xattr id table header.
    pub const XATTR: usize = 56;
    /// Inode table.
    pub const INODES: usize = 64;
    /// Directory table.
    pub const DIRS: usize = 72;
    /// Fragment table index.
    pub const FRAGMENTS: usize = 80;
    /// Export table index.
    pub const EXPORT: usize = 88;
}

/// A squashfs 4.0 superblock: the workspace's one reader of it (`fields`, and
/// `superblock` to cross-check them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Number of inodes in the image.
    pub inode_count: u32,
    /// Data block size in bytes.
    pub block_size: u32,
    /// Number of entries in the fragment table.
    pub fragment_count: u32,
    /// Compressor id (1 gzip … 6 zstd).
    pub compression: u16,
    /// log2 of the block size.
    pub block_log: u16,
    /// Superblock flags (compressor options present, tables uncompressed, exportable, …).
    pub flags: u16,
    /// Number of entries in the uid/gid table.
    pub id_count: u16,
    /// Format version, major and minor (4.0).
    pub version: (u16, u16),
    /// Reference to the root inode: metadata block offset `<< 16` | offset inside the block.
    pub root_inode: u64,
    /// Bytes of the image in use (the filesystem's length, without padding).
    pub bytes_used: u64,
    /// Byte offset of the uid/gid lookup table.
    pub id_table_start: u64,
    /// Byte offset of the xattr id table header (`u64::MAX`: none).
    pub xattr_table_start: u64,
    /// Byte offset of the inode table.
    pub inode_table_start: u64,
    /// Byte offset of the directory table.
    pub directory_table_start: u64,
    /// Byte offset of the fragment table index (`u64::MAX`: none).
    pub fragment_table_start: u64,
    /// Byte offset of the export table index (`u64::MAX`: none).
    pub export_table_start: u64,
}

/// [`superblock`] of a whole image held in memory (shorter than a superblock: an error).
pub fn superblock_of(img: &[u8]) -> Result<Superblock, String> {
    superblock(head_of(img)?)
}

/// The first [`SUPERBLOCK_LEN`] bytes of `img` (shorter: an error naming its length).
pub fn head_of(img: &[u8]) -> Result<&[u8; SUPERBLOCK_LEN], String> {
    img.get(..SUPERBLOCK_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| format!("{} bytes, shorter than a superblock", img.len()))
}

/// The fields of the superblock `b`, its magic checked but nothing else: for a reader that
/// needs only where the filesystem ends ([`superblock`] checks the fields against each other).
pub fn fields(b: &[u8; SUPERBLOCK_LEN]) -> Result<Superblock, String> {
    if &b[0..4] != MAGIC {
        return Err(format!("no squashfs magic (found {:02x?})", &b[0..4]));
    }
    let u16_at = |o: usize| LE::read_u16(&b[o..]);
    let u32_at = |o: usize| LE::read_u32(&b[o..]);
    let u64_at = |o: usize| LE::read_u64(&b[o..]);
    Ok(Superblock {
        inode_count: u32_at(4),
        block_size: u32_at(12),
        fragment_count: u32_at(16),
        compression: u16_at(20),
        block_log: u16_at(22),
        flags: u16_at(24),
        id_count: u16_at(26),
        version: (u16_at(28), u16_at(30)),
        root_inode: u64_at(at::ROOT),
        bytes_used: u64_at(at::BYTES_USED),
        id_table_start: u64_at(at::ID),
        xattr_table_start: u64_at(at::XATTR),
        inode_table_start: u64_at(at::INODES),
        directory_table_start: u64_at(at::DIRS),
        fragment_table_start: u64_at(at::FRAGMENTS),
        export_table_start: u64_at(at::EXPORT),
    })
}

/// Parse and cross-check the first 96 bytes.
pub fn superblock(b: &[u8; SUPERBLOCK_LEN]) -> Result<Superblock, String> {
    let sb = fields(b)?;
    let ((major, minor), log) = (sb.version, sb.block_log);
    if (major, minor) != (4, 0) {
        return Err(format!("squashfs version {major}.{minor}, expected 4.0"));
    }
    if !(12..=20).contains(&log) || sb.block_size != 1 << log {
        return Err(format!(
            "block size {} does not match block_log {log} (4 KiB..1 MiB)",
            sb.block_size
        ));
    }
    if !(1..=6).contains(&sb.compression) {
        return Err(format!("unknown compression id {}", sb.compression));
    }
    if sb.inode_count == 0 || sb.id_count == 0 {
        return Err("no inodes or no ids".into());
    }
    if !(SUPERBLOCK_LEN as u64 <= sb.inode_table_start
        && sb.inode_table_start < sb.directory_table_start
        && sb.directory_table_start < sb.id_table_start
        && sb.id_table_start < sb.bytes_used)
    {
        return Err(format!(
            "tables out of order: inodes at {}, directories at {}, ids at {}, {} bytes used",
            sb.inode_table_start, sb.directory_table_start, sb.id_table_start, sb.bytes_used
        ));
    }
    if sb.root_inode & 0xffff >= METADATA_MAX {
        return Err(format!(
            "root inode offset {} is past a metadata block",
            sb.root_inode & 0xffff
        ));
    }
    Ok(sb)
}

/// Check the image read through `read_at(pos, buf)` (exact reads relative to the image start);
/// `size` is the image's size from the manifest.
pub fn check(
    read_at: impl Fn(u64, &mut [u8]) -> io::Result<()>,
    size: u64,
) -> Result<Superblock, String> {
    let mut b = [0u8; SUPERBLOCK_LEN];
    read_at(0, &mut b).map_err(|e| format!("cannot read the superblock: {e}"))?;
    let sb = superblock(&b)?;
    if sb.bytes_used > size {
        return Err(format!(
            "superblock says {} bytes used, manifest says the image has {size}",
            sb.bytes_used
        ));
    }
    // The inode table: a chain of metadata blocks ending where the directory table starts.
    let root_block = sb.inode_table_start + (sb.root_inode >> 16);
    let mut pos = sb.inode_table_start;
    let mut root_seen = false;
    while pos < sb.directory_table_start {
        root_seen |= pos == root_block;
        let mut h = [0u8; 2];
        read_at(pos, &mut h).map_err(|e| format!("cannot read the inode table at {pos}: {e}"))?;
        let len = u64::from(LE::read_u16(&h) & 0x7fff);
        if len == 0 || len > METADATA_MAX {
            return Err(format!("inode table block at {pos} claims {len} bytes"));
        }
        pos += 2 + len;
    }
    if pos != sb.directory_table_start {
        return Err(format!(
            "the inode table runs to {pos}, past the directory table at {}",
            sb.directory_table_start
        ));
    }
    if !root_seen {
        return Err(format!(
            "the root inode (block at {root_block}) is not on an inode table block"
        ));
    }
    // The id table: pointers to its metadata blocks, between the directories and itself.
    let blocks = (u64::from(sb.id_count) * 4).div_ceil(METADATA_MAX);
    if sb.id_table_start + blocks * 8 > sb.bytes_used {
        return Err("the id table lookup runs past the image".into());
    }
    for i in 0..blocks {
        let mut p = [0u8; 8];
        read_at(sb.id_table_start + i * 8, &mut p)
            .map_err(|e| format!("cannot read the id table: {e}"))?;
        let at = LE::read_u64(&p);
        if !(sb.directory_table_start..sb.id_table_start).contains(&at) {
            return Err(format!(
                "id table block {i} points at {at}, outside the tables"
            ));
        }
    }
    Ok(sb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &std::path::Path) -> Vec<u8> {
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("etc")).unwrap();
        for i in 0..300 {
            std::fs::write(
                tree.join("etc").join(format!("f{i}")),
                format!("file {i}\n").repeat(i),
            )
            .unwrap();
        }
        let out = dir.join("x.sq");
        let st = std::process::Command::new("mksquashfs")
            .arg(&tree)
            .arg(&out)
            .args(["-noappend", "-quiet", "-comp", "gzip"])
            .status()
            .expect("mksquashfs (scripts/setup.sh installs squashfs-tools)");
        assert!(st.success());
        std::fs::read(out).unwrap()
    }

    fn run(img: &[u8]) -> Result<Superblock, String> {
        check(
            |pos, buf| {
                let s = img
                    .get(pos as usize..pos as usize + buf.len())
                    .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "past the end"))?;
                buf.copy_from_slice(s);
                Ok(())
            },
            img.len() as u64,
        )
    }

    #[test]
    fn a_real_image_passes_and_damage_is_named() {
        let t = tempfile::tempdir().unwrap();
        let img = image(t.path());
        let sb = run(&img).unwrap();
        assert_eq!(sb.inode_count, 302);

        let mut bad = img.clone();
        bad[0] = b'x';
        assert!(run(&bad).unwrap_err().contains("magic"));
        let mut bad = img.clone();
        bad[12] ^= 1; // block size
        assert!(run(&bad).unwrap_err().contains("block size"));
        // Corrupt the first inode table block header.
        let mut bad = img.clone();
        let at = sb.inode_table_start as usize;
        bad[at] = 0;
        bad[at + 1] = 0x80; // length 0, uncompressed
        assert!(
            run(&bad).unwrap_err().contains("inode table block"),
            "{:?}",
            run(&bad)
        );
        // Truncated image: the manifest says fewer bytes than the superblock uses.
        assert!(check(
            |p, b| {
                b.copy_from_slice(&img[p as usize..p as usize + b.len()]);
                Ok(())
            },
            1000
        )
        .unwrap_err()
        .contains("bytes used"));
        let junk: Vec<u8> = (0..100_000u32).map(|i| (i * 7919 % 251) as u8).collect();
        assert!(run(&junk).is_err());
    }
}
