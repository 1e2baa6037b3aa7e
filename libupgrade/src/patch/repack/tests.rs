//! The re-pack against real mksquashfs images (squashfs-tools, installed by setup.sh): an image
//! this build's zstd made comes back byte for byte; an image whose blocks another compressor
//! made comes back with this build's blocks and the same files, as `unsquashfs` and `sqfsdiff`
//! read them; damaged inputs are refused with the offset named.

use std::fs;
use std::path::Path;
use std::process::Command;

use super::*;
use crate::patch::{apply, build, Base, PatchKind};

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (squashfs-tools, squashfs-tools-ng)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A tree with what the walk must handle: multi-block files, tails in fragments, a
/// duplicate, a hard link, a symlink, an empty file and directory, a sparse block, xattrs,
/// and a directory large enough for an indexed (extended) inode and several metadata blocks.
fn tree(dir: &Path, version: u8) {
    let mut seed = 0x2545_f491_u64 + u64::from(version);
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 7) as u8 + b'a'
            })
            .collect()
    };
    let d = dir.join("usr/lib");
    fs::create_dir_all(&d).unwrap();
    fs::create_dir_all(dir.join("empty")).unwrap();
    fs::write(d.join("big.so"), noise(700_000)).unwrap();
    fs::write(d.join("copy.so"), fs::read(d.join("big.so")).unwrap()).unwrap();
    let mut sparse = vec![0u8; 300_000];
    sparse[..1000].copy_from_slice(&noise(1000));
    fs::write(d.join("sparse.bin"), sparse).unwrap();
    fs::write(dir.join("empty.txt"), b"").unwrap();
    fs::hard_link(d.join("big.so"), dir.join("hard.so")).unwrap();
    std::os::unix::fs::symlink("usr/lib/big.so", dir.join("link.so")).unwrap();
    for (f, v) in [
        ("hard.so", 5),
        ("usr/lib/sparse.bin", 300),
        ("empty.txt", 40),
    ] {
        set_xattr(&dir.join(f), &noise(v));
    }
    let many = dir.join("share/doc");
    fs::create_dir_all(&many).unwrap();
    for i in 0..600 {
        let name = format!("package-with-a-long-name-{i:04}-{version}");
        fs::write(many.join(name), noise(50 + i)).unwrap();
    }
}

/// `user.k3os` = `value` on `path` (the xattr tables must survive the re-pack).
fn set_xattr(path: &Path, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            c"user.k3os".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn mksquashfs(tree: &Path, out: &Path, level: u32) {
    mksquashfs_with(tree, out, level, &[]);
}

fn mksquashfs_with(tree: &Path, out: &Path, level: u32, extra: &[&str]) {
    run(Command::new("mksquashfs")
        .arg(tree)
        .arg(out)
        .args(extra)
        .args([
            "-noappend",
            "-quiet",
            "-no-progress",
            "-all-root",
            "-comp",
            "zstd",
            "-Xcompression-level",
            &level.to_string(),
            "-mkfs-time",
            "0",
            "-all-time",
            "0",
        ]));
}

/// An image whose blocks another compressor made: level 3's blocks under compressor options
/// that say 19 (what a publisher's other libzstd at level 19 amounts to for the node).
fn foreign(tree: &Path, out: &Path) {
    foreign_with(tree, out, &[]);
}

fn foreign_with(tree: &Path, out: &Path, extra: &[&str]) {
    mksquashfs_with(tree, out, 3, extra);
    let mut b = fs::read(out).unwrap();
    assert_eq!(
        &b[96..102],
        &[0x04, 0x80, 3, 0, 0, 0],
        "uncompressed options, level 3"
    );
    b[98] = 19;
    fs::write(out, b).unwrap();
}

fn listing(img: &Path) -> String {
    let out = run(Command::new("unsquashfs")
        .arg("-lls")
        .arg("-d")
        .arg("r")
        .arg(img));
    String::from_utf8(out).unwrap()
}

#[test]
fn an_image_this_zstd_made_comes_back_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    tree(&t.path().join("t"), 1);
    let (a, b) = (t.path().join("a.sq"), t.path().join("b.sq"));
    // mksquashfs' flags for tables and blocks stored uncompressed each keep their meaning.
    for extra in [&[][..], &["-noI"], &["-noF", "-noD"], &["-noId", "-noX"]] {
        mksquashfs_with(&t.path().join("t"), &a, 15, extra);
        let st = repack(&a, &b).unwrap();
        assert_eq!(st.changed, 0, "{extra:?}: {st:?}");
        assert!(st.blocks > 5, "{st:?}");
        assert!(
            fs::read(&a).unwrap() == fs::read(&b).unwrap(),
            "{extra:?}: re-pack changed bytes"
        );
    }
}

#[test]
fn a_foreign_image_comes_back_with_this_zstds_blocks_and_the_same_files() {
    let t = tempfile::tempdir().unwrap();
    tree(&t.path().join("t"), 1);
    let (f, r, r2) = (
        t.path().join("f.sq"),
        t.path().join("r.sq"),
        t.path().join("r2.sq"),
    );
    // Without xattrs: their tables are copied as the input has them (see `write`), so with
    // them only their bytes would differ from mksquashfs' own below.
    foreign_with(&t.path().join("t"), &f, &["-no-xattrs"]);
    let st = repack(&f, &r).unwrap();
    assert!(st.changed > 5, "{st:?}");
    assert_eq!(listing(&f), listing(&r));
    run(Command::new("sqfsdiff").arg("-a").arg(&f).arg("-b").arg(&r));
    // What mksquashfs (linking the same zstd) makes at level 19 from the same tree is what
    // the re-pack made (level 15, the default, would leave the compressor options out).
    let own = t.path().join("own.sq");
    mksquashfs_with(&t.path().join("t"), &own, 19, &["-no-xattrs"]);
    assert!(fs::read(&own).unwrap() == fs::read(&r).unwrap());
    let again = repack(&r, &r2).unwrap();
    assert_eq!(
        again.changed, 0,
        "a re-packed image is this zstd's: {again:?}"
    );
}

#[test]
fn a_patch_to_a_repacked_image_recompresses_every_block_and_applies() {
    let t = tempfile::tempdir().unwrap();
    let (t1, t2) = (t.path().join("t1"), t.path().join("t2"));
    tree(&t1, 1);
    tree(&t2, 1);
    fs::write(t2.join("usr/lib/big.so"), {
        let mut b = fs::read(t1.join("usr/lib/big.so")).unwrap();
        b[300_000..300_100].fill(b'z');
        b
    })
    .unwrap();
    let (v1, v2f, v2) = (
        t.path().join("v1.sq"),
        t.path().join("v2f.sq"),
        t.path().join("v2.sq"),
    );
    let v1f = t.path().join("v1f.sq");
    foreign(&t1, &v1f);
    foreign(&t2, &v2f);
    repack(&v1f, &v1).unwrap();
    repack(&v2f, &v2).unwrap();
    let mut p = Vec::new();
    let foreign_st = build(PatchKind::Squashfs, &v1f, &v2f, &mut Vec::new()).unwrap();
    let st = build(PatchKind::Squashfs, &v1, &v2, &mut p).unwrap();
    assert!(
        st.bytes * 4 < foreign_st.bytes,
        "re-packed pair {st:?}, as published {foreign_st:?}"
    );
    assert_eq!(st.blocks_not_reproducible, 0, "{st:?}");
    assert!(st.blocks_recompressed > 0, "{st:?}");
    let base = fs::File::open(&v1).unwrap();
    let mut out = Vec::new();
    apply(
        &mut &p[..],
        Base::whole(&base).unwrap(),
        &mut |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        },
    )
    .unwrap();
    assert!(out == fs::read(&v2).unwrap());
}

fn refused(img: &[u8]) -> String {
    repack_bytes(img).map(|_| ()).expect_err("refused")
}

#[test]
fn damaged_or_other_images_are_refused_naming_what_and_where() {
    let t = tempfile::tempdir().unwrap();
    tree(&t.path().join("t"), 1);
    let f = t.path().join("f.sq");
    foreign(&t.path().join("t"), &f);
    let img = fs::read(&f).unwrap();
    assert!(refused(&img[..90]).contains("shorter than a superblock"));
    assert!(refused(&img[..img.len() / 2]).contains("bytes used"));
    let mut gz = img.clone();
    gz[20] = 1;
    assert!(refused(&gz).contains("only zstd"), "{}", refused(&gz));
    // The inode table's first block header claims more than a metadata block holds.
    let it = crate::sqcheck::superblock_of(&img)
        .unwrap()
        .inode_table_start as usize;
    let mut bad = img.clone();
    bad[it..it + 2].copy_from_slice(&0x7fffu16.to_le_bytes());
    let e = refused(&bad);
    assert!(e.contains(&format!("metadata block at {it}")), "{e}");
    // A file's block list pointing into another block.
    let mut bad = img.clone();
    let dt = crate::sqcheck::superblock_of(&img)
        .unwrap()
        .directory_table_start as usize;
    bad[dt..dt + 2].copy_from_slice(&3u16.to_le_bytes());
    assert!(!refused(&bad).is_empty());
}

#[test]
fn damaged_metadata_never_panics_and_what_passes_still_checks() {
    let t = tempfile::tempdir().unwrap();
    tree(&t.path().join("t"), 2);
    let f = t.path().join("f.sq");
    mksquashfs(&t.path().join("t"), &f, 15);
    let img = fs::read(&f).unwrap();
    let sb = crate::sqcheck::superblock_of(&img).unwrap();
    let (it, used) = (sb.inode_table_start as usize, sb.bytes_used as usize);
    let mut seed = 7u64;
    for _ in 0..80 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut bad = img.clone();
        let at = it + (seed >> 33) as usize % (used - it);
        bad[at] ^= 1 << (seed % 8);
        bad[24..26].copy_from_slice(&img[24..26]);
        if let Ok((out, _)) = repack_bytes(&bad) {
            let _ = verify(&bad, &out);
        }
    }
}

#[test]
fn release_create_publishes_as_given_what_needs_no_or_cannot_take_a_repack() {
    let t = tempfile::tempdir().unwrap();
    tree(&t.path().join("t"), 1);
    let (own, f, gz, out) = (
        t.path().join("own.sq"),
        t.path().join("f.sq"),
        t.path().join("gz.sq"),
        t.path().join("out.sq"),
    );
    mksquashfs(&t.path().join("t"), &own, 15);
    foreign(&t.path().join("t"), &f);
    run(Command::new("mksquashfs")
        .arg(t.path().join("t"))
        .arg(&gz)
        .args(["-noappend", "-quiet", "-no-progress", "-comp", "gzip"]));
    assert!(matches!(for_release(&own, &out), Ok(Rootfs::Unchanged(_))));
    assert!(matches!(for_release(&f, &out), Ok(Rootfs::Repacked(st)) if st.changed > 0));
    let Ok(Rootfs::NotRepacked(why)) = for_release(&gz, &out) else {
        panic!("a gzip image is published as given");
    };
    assert!(why.contains("gz.sq") && why.contains("only zstd"), "{why}");
    let missing = t.path().join("missing.sq");
    assert!(matches!(
        for_release(&missing, &out),
        Err(PatchError::File { .. })
    ));
}
