//! Squashfs patches against real mksquashfs images: built, applied, byte-identical to the
//! target image, over hand-picked edits and random trees (proptest).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use libupgrade::patch::{self, PatchKind};
use proptest::prelude::*;

use super::noise;

/// images/src/rootfs.rs' MKSQUASHFS_OPTS (k3os-images depends on libupgrade, so the test
/// repeats them): the options the releases' rootfs is made with.
const MKSQUASHFS_OPTS: &[&str] = &[
    "-noappend",
    "-all-root",
    "-no-xattrs",
    "-comp",
    "zstd",
    "-no-fragments",
    "-mkfs-time",
    "0",
    "-all-time",
    "0",
    "-quiet",
];

/// A file tree: path → content (`None`: a symlink to `target`).
type Tree = BTreeMap<String, Vec<u8>>;

/// Compressible bytes: words from a small vocabulary, the way text and code compress.
fn text(n: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "the ",
        "node ",
        "slot ",
        "squashfs ",
        "block ",
        "kernel ",
        "0x1f ",
        "\n",
        "update ",
        "config ",
        "=",
        "lib ",
        "int main() { return 0; }\n",
    ];
    let mut out = Vec::with_capacity(n + 32);
    let mut x = seed | 1;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % WORDS.len() as u64) as usize].as_bytes());
    }
    out.truncate(n);
    out
}

fn mksquashfs(tree: &Tree, dir: &Path, name: &str) -> PathBuf {
    let root = dir.join(format!("{name}.tree"));
    for (p, data) in tree {
        let f = root.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, data).unwrap();
    }
    std::fs::create_dir_all(&root).unwrap();
    let img = dir.join(format!("{name}.sq"));
    let st = Command::new("mksquashfs")
        .arg(&root)
        .arg(&img)
        .args(MKSQUASHFS_OPTS)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "mksquashfs {name}");
    img
}

/// Build the patch base → target, apply it, and check the output is the target image.
fn round_trip(base: &Tree, target: &Tree) -> (patch::BuildStats, u64) {
    let d = tempfile::tempdir().unwrap();
    let b = mksquashfs(base, d.path(), "base");
    let t = mksquashfs(target, d.path(), "target");
    let mut p = Vec::new();
    let st = patch::build(PatchKind::Squashfs, &b, &t, &mut p).unwrap();
    let h = patch::read_header(&mut &p[..]).unwrap();
    assert_eq!(h.compressor, patch::identity(15));
    let want = std::fs::read(&t).unwrap();
    let mut got = Vec::with_capacity(want.len());
    let f = std::fs::File::open(&b).unwrap();
    patch::apply(
        &mut &p[..],
        patch::Base::whole(&f).unwrap(),
        &mut |x: &[u8]| {
            got.extend_from_slice(x);
            Ok(())
        },
    )
    .unwrap();
    assert!(
        got == want,
        "patched image differs from the target ({st:?})"
    );
    eprintln!(
        "patch {} bytes of a {}-byte image: {st:?}",
        p.len(),
        want.len()
    );
    (st, want.len() as u64)
}

fn sample_tree() -> Tree {
    let mut t = Tree::new();
    for i in 0..300 {
        t.insert(
            format!("usr/share/doc/pkg{i}/copyright"),
            text(500 + i * 37, i as u64),
        );
    }
    t.insert(
        "usr/lib/modules/6.1.0-57/kernel/a.ko".into(),
        text(400_000, 1),
    );
    t.insert("usr/bin/tool".into(), text(900_000, 2));
    t.insert("usr/lib/random.bin".into(), noise(300_000, 3));
    t.insert("var/sparse".into(), vec![0; 600_000]);
    t.insert("etc/empty".into(), Vec::new());
    t.insert("etc/dup1".into(), text(200_000, 4));
    t.insert("etc/dup2".into(), text(200_000, 4));
    t
}

/// A monthly-update-like edit: a few bytes in a big file, a module directory renamed by
/// version, a file renamed, one added, one removed, one grown.
#[test]
fn squashfs_patch_reproduces_the_target_and_is_small() {
    let base = sample_tree();
    let mut target = base.clone();
    target.get_mut("usr/bin/tool").unwrap()[450_000..450_008].copy_from_slice(b"PATCHED!");
    let ko = target
        .remove("usr/lib/modules/6.1.0-57/kernel/a.ko")
        .unwrap();
    let mut ko2 = ko.clone();
    ko2[10] = b'X';
    target.insert("usr/lib/modules/6.1.0-58/kernel/a.ko".into(), ko2);
    let r = target.remove("usr/share/doc/pkg7/copyright").unwrap();
    target.insert("usr/share/doc/pkg7-renamed/copyright".into(), r);
    target.insert("usr/share/new".into(), text(50_000, 99));
    target.remove("usr/share/doc/pkg9/copyright");
    target
        .get_mut("etc/dup1")
        .unwrap()
        .extend_from_slice(&text(100_000, 5));
    let (st, size) = round_trip(&base, &target);
    assert!(st.data_ops >= 3, "{st:?}");
    assert!(st.copy_ops >= 1, "{st:?}");
    assert_eq!(st.blocks_not_reproducible, 0, "{st:?}");
    assert!(
        st.bytes * 100 < size * 5,
        "patch of {} bytes for a {size}-byte image: {st:?}",
        st.bytes
    );
}

/// A file larger than one Data op's 16 MiB: several ops, each against its window.
#[test]
fn squashfs_patch_of_a_big_file() {
    let mut base = Tree::new();
    base.insert("big".into(), text(20 << 20, 11));
    let mut target = base.clone();
    let big = target.get_mut("big").unwrap();
    big[1000] ^= 1;
    big[18 << 20] ^= 1;
    let (st, _) = round_trip(&base, &target);
    assert!(st.data_ops >= 2, "{st:?}");
}

/// A file's content: compressible text, noise (stored raw by mksquashfs) or zeros (sparse).
fn content() -> impl Strategy<Value = Vec<u8>> {
    (0u8..3, 0usize..400_000, any::<u64>()).prop_map(|(kind, n, seed)| match kind {
        0 => text(n, seed),
        1 => noise(n, seed),
        _ => vec![0; n],
    })
}

fn tree() -> impl Strategy<Value = Tree> {
    let name = prop::sample::select(vec![
        "etc", "usr", "lib", "bin", "share", "doc", "5.10", "x",
    ]);
    let path = prop::collection::vec(name, 1..4).prop_map(|p| p.join("/") + ".f");
    prop::collection::btree_map(path, content(), 1..12)
}

/// One edit of a tree.
#[derive(Debug, Clone)]
enum Edit {
    Add(String, Vec<u8>),
    Remove(usize),
    Poke(usize, usize, u8),
    Grow(usize, Vec<u8>),
    Shrink(usize, usize),
    Rename(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    let idx = any::<usize>();
    prop_oneof![
        ("[a-z]{1,8}", content()).prop_map(|(n, c)| Edit::Add(format!("new/{n}"), c)),
        idx.prop_map(Edit::Remove),
        (idx, any::<usize>(), any::<u8>()).prop_map(|(i, at, v)| Edit::Poke(i, at, v)),
        (idx, content()).prop_map(|(i, c)| Edit::Grow(i, c)),
        (idx, any::<usize>()).prop_map(|(i, n)| Edit::Shrink(i, n)),
        (idx, "[a-z]{1,8}").prop_map(|(i, n)| Edit::Rename(i, format!("moved/{n}"))),
    ]
}

fn apply_edit(t: &mut Tree, e: &Edit) {
    let key = |t: &Tree, i: usize| t.keys().nth(i % t.len().max(1)).cloned();
    match e.clone() {
        Edit::Add(p, c) => {
            t.insert(p, c);
        }
        Edit::Remove(i) => {
            if t.len() > 1 {
                let k = key(t, i).unwrap();
                t.remove(&k);
            }
        }
        Edit::Poke(i, at, v) => {
            let k = key(t, i).unwrap();
            let f = t.get_mut(&k).unwrap();
            if !f.is_empty() {
                let n = f.len();
                for j in 0..4 {
                    f[(at + j * 7919) % n] ^= v | 1;
                }
            }
        }
        Edit::Grow(i, c) => {
            let k = key(t, i).unwrap();
            t.get_mut(&k).unwrap().extend_from_slice(&c);
        }
        Edit::Shrink(i, n) => {
            let k = key(t, i).unwrap();
            let f = t.get_mut(&k).unwrap();
            let keep = if f.is_empty() { 0 } else { n % f.len() };
            f.truncate(keep);
        }
        Edit::Rename(i, p) => {
            let k = key(t, i).unwrap();
            let c = t.remove(&k).unwrap();
            t.insert(p, c);
        }
    }
}

proptest! {
    // mksquashfs runs twice per case: few cases, each a real pair of images.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the trees and edits, the patched image is byte for byte the target image.
    #[test]
    fn patched_images_are_the_target(base in tree(), edits in prop::collection::vec(edit(), 1..6)) {
        let mut target = base.clone();
        for e in &edits {
            apply_edit(&mut target, e);
        }
        // A path cannot be both a file and a directory.
        let clash = |t: &Tree| t.keys().any(|a| t.keys().any(|b| b.starts_with(&format!("{a}/"))));
        prop_assume!(!clash(&base) && !clash(&target));
        round_trip(&base, &target);
    }
}
