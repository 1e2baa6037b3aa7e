//! What dm-verity costs a node that computes its tree and FEC itself, against the bytes it
//! would fetch otherwise (issue 34 item 5; README "dm-verity").
//!
//! For each rootfs given as an argument (default: a generated `VERITY_BENCH_MIB` MiB, 128,
//! of incompressible bytes, as a squashfs's compressed blocks are), times on the same file:
//! - ours: the tree (`libupgrade::verity::build_tree`) and the FEC (`fec_encode`, 2 roots),
//!   as the stage runs them after writing a slot (one read of the rootfs, one of the
//!   interleaved rounds);
//! - reference: `veritysetup format --no-superblock --fec-device … --fec-roots 2`;
//! - the scrub of a clean device (`slot verify`'s read).
//!
//! and prints the tree and FEC bytes, as a share of the rootfs: what fetching them instead
//! would add to every release. Run with `cargo bench -p libupgrade --bench verity [-- FILE…]`.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use libupgrade::verity::{build_tree, fec_encode, scrub, BlockDevice, FileDevice, Geometry, Scrub};
use sha2::Digest;

const MIB: u64 = 1 << 20;

fn noise(path: &Path, mib: u64) {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..mib * MIB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(path, bytes).unwrap();
}

fn bench(rootfs: &Path, work: &Path) {
    let size = std::fs::metadata(rootfs).unwrap().len();
    let blocks = size / 4096;
    let g = Geometry::new(blocks, 2).unwrap();
    let salt = [7u8; 32];
    let side = work.join("tree+fec");
    let f = Arc::new(File::open(rootfs).unwrap());
    let t = Arc::new(
        File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&side)
            .unwrap(),
    );
    t.set_len(g.hash_size() + g.fec_size()).unwrap();
    let dev = FileDevice {
        data: (f, 0),
        data_blocks: blocks,
        hash: (t.clone(), 0),
        fec: (t, g.hash_size()),
    };
    let t0 = Instant::now();
    let tree = build_tree(&dev, &g, &salt).unwrap();
    let tree_s = t0.elapsed().as_secs_f64();
    for (k, b) in tree.bytes.chunks(4096).enumerate() {
        dev.write_block(blocks + k as u64, b).unwrap();
    }
    let t1 = Instant::now();
    fec_encode(&dev, &g).unwrap();
    let fec_s = t1.elapsed().as_secs_f64();
    let mut fec = vec![0u8; g.fec_size() as usize];
    dev.read_fec(0, &mut fec).unwrap();
    let t2 = Instant::now();
    let out = scrub(
        &dev,
        &Scrub {
            geometry: &g,
            salt: &salt,
            root: tree.root,
            fec_sha256: sha2::Sha256::digest(&fec).into(),
            repair: false,
        },
    )
    .unwrap();
    let scrub_s = t2.elapsed().as_secs_f64();
    assert!(out.clean(), "{out:?}");
    let t3 = Instant::now();
    let st = Command::new("veritysetup")
        .args([
            "format",
            "--no-superblock",
            "--fec-roots=2",
            &format!("--salt={}", hex::encode(salt)),
        ])
        .arg("--fec-device")
        .arg(work.join("vs-fec"))
        .arg(rootfs)
        .arg(work.join("vs-tree"))
        .output()
        .unwrap();
    let vs_s = t3.elapsed().as_secs_f64();
    assert!(st.status.success());
    let mb = size as f64 / 1e6;
    let (ts, fs) = (g.hash_size() as f64, g.fec_size() as f64);
    println!("{}: {:.1} MB, {blocks} blocks", rootfs.display(), mb);
    println!(
        "  tree {:.0} kB ({:.2} %), FEC {:.0} kB ({:.2} %), together {:.2} MB ({:.2} % of the rootfs)",
        ts / 1e3,
        100.0 * ts / size as f64,
        fs / 1e3,
        100.0 * fs / size as f64,
        (ts + fs) / 1e6,
        100.0 * (ts + fs) / size as f64
    );
    println!(
        "  ours: tree {tree_s:.2} s ({:.0} MB/s), FEC {fec_s:.2} s ({:.0} MB/s), together {:.2} s",
        mb / tree_s,
        mb / fec_s,
        tree_s + fec_s
    );
    println!("  veritysetup format (tree + FEC): {vs_s:.2} s; scrub of the clean device: {scrub_s:.2} s ({:.0} MB/s)", mb / scrub_s);
}

fn main() {
    let work = tempfile::tempdir().unwrap();
    let args: Vec<PathBuf> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .collect();
    let files = if args.is_empty() {
        let mib = std::env::var("VERITY_BENCH_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(128);
        let p = work.path().join("rootfs.noise");
        noise(&p, mib);
        vec![p]
    } else {
        args
    };
    for f in files {
        bench(&f, work.path());
    }
}
