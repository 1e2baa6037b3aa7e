//! Patches: round trips and every refusal (wrong base, corrupt patch, other compressor).

use std::io::Write;
use std::path::Path;

use libupgrade::patch::{self, PatchError, PatchKind};

use super::noise;

fn write(dir: &Path, name: &str, data: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

fn build(kind: PatchKind, base: &Path, target: &Path) -> (Vec<u8>, patch::BuildStats) {
    let mut out = Vec::new();
    let st = patch::build(kind, base, target, &mut out).unwrap();
    assert_eq!(st.bytes, out.len() as u64, "stats count every byte written");
    (out, st)
}

fn apply(p: &[u8], base: &Path) -> (Result<patch::ApplyStats, PatchError>, Vec<u8>) {
    let f = std::fs::File::open(base).unwrap();
    let mut got = Vec::new();
    let res = patch::apply(
        &mut &p[..],
        patch::Base::whole(&f).unwrap(),
        &mut |b: &[u8]| {
            got.extend_from_slice(b);
            Ok(())
        },
    );
    (res, got)
}

/// A kernel-like pair: mostly the same bytes, some moved, some changed, a tail added.
fn plain_pair() -> (Vec<u8>, Vec<u8>) {
    let base = noise(3 << 20, 7);
    let mut target = base.clone();
    target[1000..1010].copy_from_slice(b"0123456789");
    target.drain(200_000..210_000);
    target.extend_from_slice(&noise(5000, 9));
    target[2_000_000..2_100_000].copy_from_slice(&base[100_000..200_000]);
    (base, target)
}

#[test]
fn plain_round_trip_is_small_and_exact() {
    let d = tempfile::tempdir().unwrap();
    let (b, t) = plain_pair();
    let (base, target) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let (p, st) = build(PatchKind::Plain, &base, &target);
    assert!(
        p.len() < 20_000,
        "patch of {} bytes for a few small edits",
        p.len()
    );
    assert_eq!(st.compressor, "none");
    let h = patch::read_header(&mut &p[..]).unwrap();
    assert_eq!(
        (h.kind, h.base_size, h.target_size),
        (PatchKind::Plain, b.len() as u64, t.len() as u64)
    );
    patch::can_apply(&h).unwrap();
    let (res, got) = apply(&p, &base);
    let st = res.unwrap();
    assert_eq!(st.bytes, t.len() as u64);
    assert!(got == t, "applied patch reproduces the target");
}

/// A target larger than one 16 MiB window: the windows follow each other.
#[test]
fn plain_round_trip_over_several_windows() {
    let d = tempfile::tempdir().unwrap();
    let b = noise(20 << 20, 3);
    let mut t = b.clone();
    t.insert(17 << 20, 1);
    for i in (0..t.len()).step_by(7 << 20) {
        t[i] ^= 0xff;
    }
    let (base, target) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let (p, st) = build(PatchKind::Plain, &base, &target);
    assert_eq!(st.delta_ops, 2, "{st:?}");
    assert!(p.len() < 100_000, "patch of {} bytes", p.len());
    let (res, got) = apply(&p, &base);
    res.unwrap();
    assert!(got == t);
}

#[test]
fn a_patch_for_another_base_emits_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (b, t) = plain_pair();
    let (base, target) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let (p, _) = build(PatchKind::Plain, &base, &target);
    // Same size, one byte differs: refused by sha256.
    let mut other = b.clone();
    other[12345] ^= 1;
    let other = write(d.path(), "o", &other);
    let (res, got) = apply(&p, &other);
    match res {
        Err(PatchError::WrongBase { found_sha256, .. }) => assert_eq!(found_sha256.len(), 64),
        r => panic!("expected WrongBase, got {r:?}"),
    }
    assert!(got.is_empty());
    // Another size: refused by size.
    let shorter = write(d.path(), "s", &b[..b.len() - 1]);
    let (res, got) = apply(&p, &shorter);
    assert!(
        matches!(res, Err(PatchError::WrongBase { found_sha256, .. }) if found_sha256.is_empty())
    );
    assert!(got.is_empty());
}

#[test]
fn corrupt_patches_give_typed_errors() {
    let d = tempfile::tempdir().unwrap();
    let (b, t) = plain_pair();
    let (base, target) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let (p, _) = build(PatchKind::Plain, &base, &target);
    let hlen = 8 + 2 + 1 + 4 + 4 + 32 + 8 + 32 + 8 + 2 + 4;
    // Truncated anywhere.
    for cut in [0, 5, hlen - 1, hlen, hlen + 1, p.len() / 2, p.len() - 1] {
        let (res, _) = apply(&p[..cut], &base);
        assert!(res.is_err(), "truncated at {cut}");
    }
    // Bad magic, newer version, unknown kind.
    for (at, what) in [(0, "magic"), (8, "version"), (10, "kind")] {
        let mut q = p.clone();
        q[at] ^= 0x40;
        let (res, got) = apply(&q, &base);
        let e = res.unwrap_err();
        assert!(matches!(e, PatchError::Header(_)), "{what}: {e}");
        assert!(got.is_empty());
    }
    // A flipped byte in every position of the ops: an error or (if it hit nothing decoded)
    // the same output, never a panic and never a wrong output reported as success.
    for at in (hlen..p.len()).step_by(97) {
        let mut q = p.clone();
        q[at] ^= 0x5a;
        let (res, got) = apply(&q, &base);
        if res.is_ok() {
            assert!(got == t, "flip at {at} succeeded with another output");
        }
    }
    // An unknown op tag names the op.
    let mut q = p.clone();
    q[hlen] = 9;
    let e = apply(&q, &base).0.unwrap_err();
    assert!(
        matches!(&e, PatchError::Op { op: 0, what, .. } if what.contains("unknown op tag 9")),
        "{e}"
    );
}

#[test]
fn another_compressor_is_refused_before_a_byte() {
    let d = tempfile::tempdir().unwrap();
    let (b, t) = plain_pair();
    let (base, _) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let mut h = patch::PatchHeader {
        kind: PatchKind::Squashfs,
        base_sha256: [0; 32],
        base_size: b.len() as u64,
        target_sha256: [0; 32],
        target_size: 0,
        compressor: "zstd 10507 level 15\u{1b}[31m".into(),
        level: 15,
        block_size: 131072,
    };
    let mut p = Vec::new();
    h.write(&mut p).unwrap();
    p.write_all(&[0]).unwrap();
    let e = patch::can_apply(&patch::read_header(&mut &p[..]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("\\u{1b}"), "escaped: {e}");
    let (res, got) = apply(&p, &base);
    assert!(matches!(res, Err(PatchError::Compressor { .. })), "{res:?}");
    assert!(got.is_empty());
    h.compressor = patch::identity(15);
    let mut p = Vec::new();
    h.write(&mut p).unwrap();
    patch::can_apply(&patch::read_header(&mut &p[..]).unwrap()).unwrap();
}

/// A slot partition holds its image from byte 0 and is larger than it: the applier reads the
/// base as a range of a larger file in place (no copy), and a range that is not the base is
/// refused before a byte is emitted.
#[test]
fn the_base_is_read_as_a_range_of_a_larger_file() {
    let d = tempfile::tempdir().unwrap();
    let (b, t) = plain_pair();
    let (base, target) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let (p, _) = build(PatchKind::Plain, &base, &target);
    let mut disk = noise(4096, 99);
    disk.extend_from_slice(&b);
    disk.extend_from_slice(&noise(1 << 16, 98));
    let f = std::fs::File::open(write(d.path(), "disk", &disk)).unwrap();
    let run = |offset: u64| {
        let mut got = Vec::new();
        let base = patch::Base {
            file: &f,
            offset,
            len: b.len() as u64,
        };
        let res = patch::apply(&mut &p[..], base, &mut |x: &[u8]| {
            got.extend_from_slice(x);
            Ok(())
        });
        (res, got)
    };
    let (res, got) = run(4096);
    res.unwrap();
    assert!(got == t, "the range at 4096 is the base");
    let (res, got) = run(4095);
    assert!(matches!(res, Err(PatchError::WrongBase { .. })), "{res:?}");
    assert!(got.is_empty(), "nothing emitted from a wrong base");
}

#[test]
fn a_resumed_apply_skips_the_ops_whose_output_is_held_and_still_reads_them() {
    let d = tempfile::tempdir().unwrap();
    let (b, t) = plain_pair();
    let (base, target) = (write(d.path(), "b", &b), write(d.path(), "t", &t));
    let (p, _) = build(PatchKind::Plain, &base, &target);
    let f = std::fs::File::open(&base).unwrap();
    let run = |needed: &dyn Fn(std::ops::Range<u64>) -> bool, p: &[u8]| {
        let mut got = Vec::new();
        let res = patch::apply_needed(
            &mut &p[..],
            patch::Base::whole(&f).unwrap(),
            needed,
            &mut |at: u64, b: &[u8]| {
                got.push((at, b.len()));
                Ok(())
            },
        );
        (res, got)
    };
    // Nothing needed: every op skipped, nothing emitted, the size still accounted for.
    let (res, got) = run(&|_| false, &p);
    let st = res.unwrap();
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(
        (st.bytes, st.skipped_bytes),
        (t.len() as u64, t.len() as u64)
    );
    assert_eq!(st.skipped_ops, st.ops);
    // Everything needed: what `apply` emits, at consecutive offsets.
    let (res, got) = run(&|_| true, &p);
    assert_eq!(res.unwrap().skipped_ops, 0);
    let mut at = 0u64;
    for (o, n) in &got {
        assert_eq!(*o, at);
        at += *n as u64;
    }
    assert_eq!(at, t.len() as u64);
    // A skipped op is still decoded: a patch cut inside it fails as before.
    let (res, _) = run(&|_| false, &p[..p.len() - 10]);
    assert!(matches!(res, Err(PatchError::Op { .. })), "{res:?}");
}
