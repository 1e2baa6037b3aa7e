//! The foreign-zstd pair (issue 35 item 1): the monthly pair imaged by this machine's
//! mksquashfs loading trixie's libzstd 1.5.7 (`LD_LIBRARY_PATH`, the library alone, extracted
//! by delta-debs.sh), against the same pair made with the pinned zstd (Debian 12's 1.5.4, what
//! this machine's mksquashfs links). Prints the squashfs patch of each, the foreign pair's
//! patch as published and after `libupgrade::patch::repack` (what `release create` publishes),
//! and the ratio to the pinned pair's patch (goal: within 1.10).

use std::fs;
use std::path::Path;
use std::time::Instant;

use super::{len, patch_run, pct, squashfs_with};

/// The re-packed copy of `img` next to it (`.repacked.sq`), with the seconds it took and the
/// blocks that changed (cached like the images).
fn repacked(img: &Path) -> (std::path::PathBuf, f64, String) {
    let out = img.with_extension("repacked.sq");
    let t = Instant::now();
    let st = libupgrade::patch::repack(img, &out).unwrap();
    let changed = format!("{} of {} blocks changed", st.changed, st.blocks);
    (out, t.elapsed().as_secs_f64(), changed)
}

/// Run the section: `images` caches images, `lib` is trixie's libzstd directory, `rec` the
/// mksquashfs options, `w` scratch space.
pub fn run(images: &Path, trees: &Path, lib: &Path, rec: &[&str], w: &Path) {
    println!(
        "\n== foreign zstd: the monthly pair (mksquashfs {}) made with libzstd 1.5.7 ==",
        rec.join(" ")
    );
    assert!(
        lib.join("libzstd.so.1").is_file(),
        "{} missing: run libupgrade/benches/delta-debs.sh (mksquashfs would silently load the system's libzstd)",
        lib.display()
    );
    let (v1, v2) = (trees.join("monthly-v1"), trees.join("monthly-v2"));
    let (p1, p2) = (
        squashfs_with(images, &v1, rec, None),
        squashfs_with(images, &v2, rec, None),
    );
    let (f1, f2) = (
        squashfs_with(images, &v1, rec, Some(lib)),
        squashfs_with(images, &v2, rec, Some(lib)),
    );
    let size = len(&p2);
    let (r1, s1, c1) = repacked(&f1);
    let (r2, s2, c2) = repacked(&f2);
    println!(
        "re-pack (release create): v1 {s1:.1} s ({c1}), v2 {s2:.1} s ({c2}), v2 {} → {} bytes (pinned-zstd image {size}, {})",
        len(&f2),
        len(&r2),
        if fs::read(&r2).unwrap() == fs::read(&p2).unwrap() {
            "byte for byte the re-packed image"
        } else {
            "other bytes than the re-packed image"
        }
    );
    let pinned = patch_run(&["build", "squashfs"], &[&p1, &p2, &w.join("zp")]);
    let rows = [
        ("pinned zstd 1.5.4 (reference)", &p1, &p2),
        ("1.5.7 as mksquashfs made it", &f1, &f2),
        ("1.5.7 re-packed, both releases", &r1, &r2),
        ("1.5.7: v1 as made, v2 re-packed", &f1, &r2),
    ];
    for (name, a, b) in rows {
        let run = patch_run(&["build", "squashfs"], &[a, b, &w.join("zp")]);
        println!(
            "{name:<34} patch {:>9} bytes = {} of v2, {:.2}× the pinned pair's ({})",
            run.bytes,
            pct(run.bytes, size),
            run.bytes as f64 / pinned.bytes as f64,
            run.note
        );
    }
    let check = patch_run(&["apply"], &[&w.join("zp"), &f1, &w.join("zpatched")]);
    assert_eq!(check.bytes, len(&r2));
    assert!(fs::read(w.join("zpatched")).unwrap() == fs::read(&r2).unwrap());
    println!("(the last patch applied to v1 as made gives the re-packed v2 byte for byte)");
}
