use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use super::*;

const SALT: [u8; 32] = [7; 32];

/// Deterministic bytes (xorshift), with runs of zeros so blocks are not all alike.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if (i / 4096) % 5 == 3 {
                0
            } else {
                x as u8
            }
        })
        .collect()
}

/// A one-file device: data, then the tree, then the FEC area (the GPT slot layout).
fn device(dir: &Path, data: &[u8], g: &Geometry) -> (FileDevice, std::path::PathBuf) {
    let p = dir.join("dev.img");
    std::fs::write(&p, data).unwrap();
    let f = Arc::new(File::options().read(true).write(true).open(&p).unwrap());
    f.set_len(data.len() as u64 + g.hash_size() + g.fec_size())
        .unwrap();
    let hash = data.len() as u64;
    let dev = FileDevice {
        data: (f.clone(), 0),
        data_blocks: g.data_blocks,
        hash: (f.clone(), hash),
        fec: (f, hash + g.hash_size()),
    };
    (dev, p)
}

/// Build the tree and FEC of `data` in place; returns the device, its path and the tree.
fn format(dir: &Path, data: &[u8], roots: u32) -> (FileDevice, std::path::PathBuf, Geometry, Tree) {
    let g = Geometry::new(data.len() as u64 / BLOCK_SIZE, roots).unwrap();
    let (dev, p) = device(dir, data, &g);
    let t = build_tree(&dev, &g, &SALT).unwrap();
    for (k, b) in t.bytes.chunks(BLOCK_SIZE as usize).enumerate() {
        dev.write_block(g.data_blocks + k as u64, b).unwrap();
    }
    fec_encode(&dev, &g).unwrap();
    (dev, p, g, t)
}

fn veritysetup(dir: &Path, data: &[u8], roots: u32) -> (Vec<u8>, Vec<u8>, String) {
    let d = dir.join("vs-data");
    std::fs::write(&d, data).unwrap();
    let out = Command::new("veritysetup")
        .args(["format", "--no-superblock", "--hash", "sha256"])
        .arg(format!("--salt={}", hex::encode(SALT)))
        .arg(format!("--fec-device={}", dir.join("vs-fec").display()))
        .arg(format!("--fec-roots={roots}"))
        .arg(&d)
        .arg(dir.join("vs-hash"))
        .output()
        .expect("veritysetup runs (scripts/setup.sh installs cryptsetup-bin)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let root = text
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap()
        .trim()
        .to_string();
    (
        std::fs::read(dir.join("vs-hash")).unwrap(),
        std::fs::read(dir.join("vs-fec")).unwrap(),
        root,
    )
}

#[test]
fn tree_and_fec_are_veritysetups_bytes() {
    // One block (no tree level: the root is the block's digest), one full hash block, one
    // past it, two levels, and FEC roots at both ends of what the kernel takes.
    for (blocks, roots) in [(1u64, 2u32), (128, 2), (129, 24), (836, 2), (20_000, 8)] {
        let dir = tempfile::tempdir().unwrap();
        let data = bytes(blocks as usize * 4096, blocks);
        let (dev, p, g, t) = format(dir.path(), &data, roots);
        let (tree, fec, root) = veritysetup(dir.path(), &data, roots);
        assert_eq!(hex::encode(t.root), root, "{blocks} blocks: root hash");
        assert_eq!(
            t.bytes.len() as u64,
            g.hash_size(),
            "{blocks} blocks: tree size"
        );
        assert!(
            t.bytes == tree,
            "{blocks} blocks: tree bytes differ from veritysetup's"
        );
        assert_eq!(fec.len() as u64, g.fec_size(), "{blocks} blocks: FEC size");
        let all = std::fs::read(&p).unwrap();
        let at = (data.len() as u64 + g.hash_size()) as usize;
        assert!(
            all[at..] == fec[..],
            "{blocks} blocks, {roots} roots: FEC differs"
        );
        drop(dev);
    }
}

fn scrub_of<'a>(g: &'a Geometry, t: &Tree, fec: &[u8], repair: bool) -> Scrub<'a> {
    use sha2::Digest;
    Scrub {
        geometry: g,
        salt: &SALT,
        root: t.root,
        fec_sha256: sha2::Sha256::digest(fec).into(),
        repair,
    }
}

fn flip(p: &Path, at: u64, n: usize) {
    use std::os::unix::fs::FileExt;
    let f = File::options().read(true).write(true).open(p).unwrap();
    let mut b = vec![0u8; n];
    f.read_exact_at(&mut b, at).unwrap();
    for v in &mut b {
        *v ^= 0x5a;
    }
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn scrub_repairs_flipped_data_and_tree_blocks_and_reports_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(3000 * 4096, 3);
    let (dev, p, g, t) = format(dir.path(), &data, 2);
    let fec_at = data.len() as u64 + g.hash_size();
    let fec = std::fs::read(&p).unwrap()[fec_at as usize..].to_vec();
    let pristine = std::fs::read(&p).unwrap();
    // Clean: nothing to do.
    let out = scrub(&dev, &scrub_of(&g, &t, &fec, true)).unwrap();
    assert!(out.clean() && out.repaired.is_empty(), "{out:?}");
    // A few bytes in two data blocks and one tree block (level 0): corrected, counted.
    flip(&p, 5 * 4096 + 100, 3);
    flip(&p, 2000 * 4096 + 4095, 1);
    flip(&p, data.len() as u64 + 4096 + 17, 5);
    let report = scrub(&dev, &scrub_of(&g, &t, &fec, false)).unwrap();
    assert!(!report.clean() && report.repaired.is_empty(), "{report:?}");
    assert_eq!(std::fs::read(&p).unwrap().len(), pristine.len());
    let out = scrub(&dev, &scrub_of(&g, &t, &fec, true)).unwrap();
    assert!(out.clean(), "{out:?}");
    assert_eq!(out.repaired.len(), 3, "{out:?}");
    assert!(
        std::fs::read(&p).unwrap() == pristine,
        "repaired bytes are the original"
    );
    // Three damaged blocks in one round (2 roots): beyond FEC, reported and left as they are.
    let r = g.rounds();
    for j in 0..3 {
        flip(&p, (7 + j * r) * 4096, 4096);
    }
    let damaged = std::fs::read(&p).unwrap();
    let out = scrub(&dev, &scrub_of(&g, &t, &fec, true)).unwrap();
    assert_eq!(out.damaged, vec![7, 7 + r, 7 + 2 * r], "{out:?}");
    assert!(out.repaired.is_empty() && !out.clean());
    assert!(
        std::fs::read(&p).unwrap() == damaged,
        "an unrepairable round is not written"
    );
}

#[test]
fn scrub_rewrites_a_damaged_fec_area_from_verified_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(300 * 4096, 9);
    let (dev, p, g, t) = format(dir.path(), &data, 4);
    let fec_at = data.len() as u64 + g.hash_size();
    let pristine = std::fs::read(&p).unwrap();
    let fec = pristine[fec_at as usize..].to_vec();
    flip(&p, fec_at + 10, 2);
    let out = scrub(&dev, &scrub_of(&g, &t, &fec, true)).unwrap();
    assert!(
        out.fec_damaged && out.fec_rewritten && out.clean(),
        "{out:?}"
    );
    assert!(std::fs::read(&p).unwrap() == pristine);
}

#[test]
fn geometry_refuses_what_the_kernel_does_not_take() {
    assert_eq!(Geometry::new(0, 2), Err(GeometryError::Empty));
    assert_eq!(Geometry::new(10, 1), Err(GeometryError::Roots(1)));
    assert_eq!(Geometry::new(10, 25), Err(GeometryError::Roots(25)));
    let g = Geometry::new(836, 2).unwrap();
    assert_eq!((g.hash_blocks(), g.rounds(), g.fec_size()), (8, 4, 32768));
}

/// A device whose `bad` blocks fail to read (EIO) until written, as a disk remaps a sector.
struct BadSectors {
    inner: FileDevice,
    bad: std::sync::Mutex<Vec<u64>>,
}

impl BlockDevice for BadSectors {
    fn read_block(&self, i: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.bad.lock().unwrap().contains(&i) {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        self.inner.read_block(i, buf)
    }
    fn write_block(&self, i: u64, buf: &[u8]) -> std::io::Result<()> {
        self.bad.lock().unwrap().retain(|b| *b != i);
        self.inner.write_block(i, buf)
    }
    fn read_fec(&self, pos: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_fec(pos, buf)
    }
    fn write_fec(&self, pos: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_fec(pos, buf)
    }
}

#[test]
fn an_unreadable_block_is_damaged_and_rewritten_from_fec() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(600 * 4096, 11);
    let (dev, p, g, t) = format(dir.path(), &data, 2);
    let fec_at = data.len() as u64 + g.hash_size();
    let fec = std::fs::read(&p).unwrap()[fec_at as usize..].to_vec();
    let tree_block = g.data_blocks + 1;
    let bad = BadSectors {
        inner: dev,
        bad: std::sync::Mutex::new(vec![42, tree_block]),
    };
    let report = scrub(&bad, &scrub_of(&g, &t, &fec, false)).unwrap();
    assert_eq!(report.damaged, vec![tree_block, 42], "{report:?}");
    let out = scrub(&bad, &scrub_of(&g, &t, &fec, true)).unwrap();
    assert!(out.clean(), "{out:?}");
    assert_eq!(out.repaired, vec![42, tree_block]);
    assert!(bad.bad.lock().unwrap().is_empty(), "both rewritten");
}
