//! `release create` of a rootfs whose blocks another zstd made (issue 35 item 1): it publishes
//! the image re-packed with the nodes' zstd (the same files, as `unsquashfs -lls` lists them),
//! so the next release's squashfs patch carries no block whole and the node applies it to the
//! byte; `--keep-rootfs` publishes the input's bytes and the patch then carries blocks whole.
//!
//! "Another zstd" here: mksquashfs at level 3 with the compressor options then saying 19, so
//! no block is what the nodes' zstd makes at the level the image names (the benchmark's
//! foreign pair, `just bench-delta`, uses Debian 13's libzstd 1.5.7 for real).

use k3os_ops_testing::cli::Node;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compressible text: words from a small vocabulary, `n` bytes, varied by `seed`.
fn text(n: usize, seed: u64) -> Vec<u8> {
    let words = [
        "node ", "slot ", "patch ", "zstd ", "block ", "image\n", "grub ", "a ",
    ];
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(words[(s % 8) as usize].as_bytes());
    }
    out.truncate(n);
    out
}

fn unsquashfs_lls(img: &Path) -> String {
    let out = Command::new("unsquashfs")
        .args(["-lls", "-d", "r"])
        .arg(img)
        .output()
        .expect("unsquashfs (squashfs-tools, installed by scripts/setup.sh)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Release `version` of `payload` on `n`: its rootfs made by "another zstd", created with
/// `extra` arguments; the directory, the input rootfs and what `release create` printed.
fn release(
    n: &Node,
    version: &str,
    generation: u64,
    payload: &[u8],
    extra: &[&str],
) -> (PathBuf, PathBuf, String) {
    let tree = n.path().join(format!("{version}.tree"));
    fs::create_dir_all(tree.join("etc")).unwrap();
    let release = format!("VERSION={version}\nGENERATION={generation}\n");
    fs::write(tree.join("etc/k3os-release"), release).unwrap();
    fs::write(tree.join("payload"), payload).unwrap();
    let inputs = n.path().join(format!("{version}.in"));
    fs::create_dir_all(&inputs).unwrap();
    let rootfs = inputs.join("rootfs");
    testkit::squashfs(
        &tree,
        &rootfs,
        &[
            "-no-xattrs",
            "-no-fragments",
            "-comp",
            "zstd",
            "-Xcompression-level",
            "3",
        ],
    );
    let mut img = fs::read(&rootfs).unwrap();
    assert_eq!(
        &img[96..100],
        &[0x04, 0x80, 3, 0],
        "compressor options: level 3"
    );
    img[98] = 19;
    fs::write(&rootfs, img).unwrap();
    fs::write(inputs.join("kernel"), testkit::pseudo_random(300_000, 8)).unwrap();
    fs::write(inputs.join("initrd"), testkit::pseudo_random(200_000, 9)).unwrap();
    let (rel, printed) = n.create_release(version, generation, extra);
    eprintln!("{printed}");
    (rel, rootfs, printed)
}

/// Slot A runs `rel` (k3OS dir layout) and the node keeps its manifest.
fn runs_in_a(n: &Node, rel: &Path, version: &str) {
    let sys = n.path().join("system");
    for (dir, files) in [
        ("rootfs", &["rootfs.squashfs"][..]),
        ("kernel", &["vmlinuz", "initrd"]),
    ] {
        let d = sys.join(dir).join(version);
        fs::create_dir_all(&d).unwrap();
        for f in files {
            fs::copy(rel.join(f), d.join(f)).unwrap();
        }
    }
    let keep = n.path().join("state/slots/a");
    fs::create_dir_all(&keep).unwrap();
    fs::copy(rel.join("manifest.json"), keep.join("manifest.json")).unwrap();
}

#[test]
fn a_rootfs_another_zstd_made_is_published_repacked_and_its_patch_applies_on_the_node() {
    let n = Node::new();
    let p1 = text(3 << 20, 3);
    let mut p2 = p1.clone();
    p2[1 << 20..(1 << 20) + 30_000].copy_from_slice(&text(30_000, 4));
    let (v1, in1, printed) = release(&n, "v1", 5, &p1, &[]);
    assert!(
        printed.contains("rootfs re-packed with the nodes' zstd 1.5.4 (level 19)"),
        "{printed}"
    );
    assert_eq!(
        unsquashfs_lls(&in1),
        unsquashfs_lls(&v1.join("rootfs.squashfs"))
    );
    let (v2, _, printed) = release(&n, "v2", 6, &p2, &["--patch-from", v1.to_str().unwrap()]);
    let line = printed
        .lines()
        .find(|l| l.contains("patch rootfs from v1 (squashfs)"))
        .unwrap_or_else(|| panic!("no rootfs patch line:\n{printed}"));
    assert!(line.contains("listed as"), "{line}");
    assert!(
        !printed.contains("carried whole"),
        "every block of a re-packed image is the nodes' zstd's:\n{printed}"
    );
    runs_in_a(&n, &v1, "v1");
    let src = v2.to_str().unwrap();
    let out = n.ok(&["upgrade", "--stage-only", "--source", src]);
    eprintln!("{out}");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("rootfs by patch from v1"))
        .unwrap_or_else(|| panic!("no rootfs patch line:\n{out}"));
    assert!(!line.contains("fell back"), "{line}");
    assert_eq!(
        fs::read(n.path().join("system/rootfs/v2/rootfs.squashfs")).unwrap(),
        fs::read(v2.join("rootfs.squashfs")).unwrap()
    );
}

/// The size `release create` printed for the rootfs patch from v1.
fn rootfs_patch_bytes(printed: &str) -> u64 {
    let line = printed
        .lines()
        .find(|l| l.contains("patch rootfs from v1 (squashfs): "))
        .unwrap_or_else(|| panic!("no rootfs patch line:\n{printed}"));
    line.split("(squashfs): ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn keep_rootfs_publishes_the_input_bytes_and_the_patch_then_carries_blocks_whole() {
    let p1 = text(3 << 20, 5);
    let mut p2 = p1.clone();
    p2[1 << 20..(1 << 20) + 30_000].copy_from_slice(&text(30_000, 6));
    let sizes = [&["--keep-rootfs"][..], &[]].map(|keep| {
        let n = Node::new();
        let (v1, in1, printed) = release(&n, "v1", 5, &p1, keep);
        let published = fs::read(v1.join("rootfs.squashfs")).unwrap();
        assert_eq!(keep.is_empty(), printed.contains("re-packed"), "{printed}");
        assert_eq!(keep.is_empty(), fs::read(&in1).unwrap() != published);
        let from = [keep, &["--patch-from", v1.to_str().unwrap()]].concat();
        let (_, _, printed) = release(&n, "v2", 6, &p2, &from);
        rootfs_patch_bytes(&printed)
    });
    assert!(
        sizes[0] > 10 * sizes[1],
        "patch as given {} bytes, re-packed {} bytes",
        sizes[0],
        sizes[1]
    );
}
