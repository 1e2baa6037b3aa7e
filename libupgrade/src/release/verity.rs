//! `release create --verity`: the rootfs's dm-verity tree and FEC made by `veritysetup format`
//! (Debian's cryptsetup-bin), checked against the nodes' own computation
//! ([`crate::verity`]) and recorded in the manifest ([`Verity`]) before it is signed.
//!
//! Neither the tree nor the FEC data is published: nodes compute both from the rootfs and
//! refuse a slot whose root hash, tree or FEC differ from what is signed. Running veritysetup
//! here as well (rather than only the node's code) means a release is only signed when the
//! reference implementation and the nodes agree byte for byte on it, so a node never refuses
//! a good release because of its own tree builder.
//!
//! The salt is derived from the rootfs's sha256 (`sha256("k3os-ops dm-verity salt 1\0" ‖
//! sha256 hex)`): the same rootfs gives the same release bytes (reproducible builds); the
//! salt's usual purpose, keeping one device's tree from serving for another's, does not
//! apply, since the root hash itself is signed per release.

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::ReleaseError;
use crate::manifest::{FileEntry, Verity, VERITY_HASH, VERITY_HASH_TYPE};
use crate::verity::{build_tree, fec_encode, BlockDevice, Geometry, BLOCK_SIZE};

/// FEC roots `release create --verity` uses unless told: 2 parity bytes per 253 (0.8 % of the
/// data and tree), which corrects any one damaged block of each FEC round, as Android's
/// default does.
pub const DEFAULT_FEC_ROOTS: u32 = 2;

/// The verity part of a release being made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerityOptions {
    /// Reed-Solomon parity bytes per codeword (2..=24).
    pub fec_roots: u32,
}

fn verity_err(path: &Path, what: String) -> ReleaseError {
    ReleaseError::Verity {
        path: path.to_path_buf(),
        what,
    }
}

/// The salt of a rootfs with sha256 `sha256_hex` (see the module docs).
pub fn salt_for(sha256_hex: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"k3os-ops dm-verity salt 1\0");
    h.update(sha256_hex.as_bytes());
    hex::encode(h.finalize())
}

/// Run `veritysetup format` over the rootfs `dir/rootfs.path`, check the nodes' computation
/// gives the same bytes, and return what the manifest records.
pub(super) fn format(
    dir: &Path,
    rootfs: &FileEntry,
    o: VerityOptions,
) -> Result<Verity, ReleaseError> {
    let data = dir.join(&rootfs.path);
    if rootfs.size % BLOCK_SIZE != 0 {
        return Err(verity_err(
            &data,
            format!(
                "{} bytes is not a whole number of 4096-byte blocks (mksquashfs pads to 4 KiB unless -nopad)",
                rootfs.size
            ),
        ));
    }
    let g = Geometry::new(rootfs.size / BLOCK_SIZE, o.fec_roots)
        .map_err(|e| verity_err(&data, e.to_string()))?;
    let salt = salt_for(&rootfs.sha256);
    let scratch = [".verity-tree.tmp", ".verity-fec.tmp"].map(|n| dir.join(n));
    let made = veritysetup(&data, &scratch, &salt, o.fec_roots);
    let read = |p: &PathBuf| std::fs::read(p).map_err(super::io_err(p));
    let result = made.and_then(|root| Ok((root, read(&scratch[0])?, read(&scratch[1])?)));
    for p in &scratch {
        std::fs::remove_file(p).ok();
    }
    let (root, tree, fec) = result?;
    ours_agree(&data, &g, &salt, (&root, &tree, &fec))?;
    Ok(Verity {
        hash_type: VERITY_HASH_TYPE,
        hash: VERITY_HASH.into(),
        data_block_size: BLOCK_SIZE,
        hash_block_size: BLOCK_SIZE,
        data_blocks: g.data_blocks,
        salt,
        root_hash: root,
        hash_offset: rootfs.size,
        hash_size: g.hash_size(),
        hash_sha256: hex::encode(Sha256::digest(&tree)),
        fec_roots: o.fec_roots,
        fec_offset: rootfs.size + g.hash_size(),
        fec_size: g.fec_size(),
        fec_sha256: hex::encode(Sha256::digest(&fec)),
    })
}

/// `veritysetup format --no-superblock` into the two scratch files; returns the root hash.
fn veritysetup(
    data: &Path,
    scratch: &[PathBuf; 2],
    salt: &str,
    roots: u32,
) -> Result<String, ReleaseError> {
    let out = Command::new("veritysetup")
        .args(["format", "--no-superblock", "--hash=sha256", "--format=1"])
        .args(["--data-block-size=4096", "--hash-block-size=4096"])
        .arg(format!("--salt={salt}"))
        .arg(format!("--fec-roots={roots}"))
        .arg("--fec-device")
        .arg(&scratch[1])
        .arg(data)
        .arg(&scratch[0])
        .output()
        .map_err(|e| {
            verity_err(
                data,
                format!("cannot run veritysetup (Debian package cryptsetup-bin): {e}"),
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(verity_err(
            data,
            format!(
                "veritysetup format failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim().escape_debug()
            ),
        ));
    }
    let root = text
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .map(|r| r.trim().to_ascii_lowercase())
        .filter(|r| r.len() == 64 && r.bytes().all(|b| b.is_ascii_hexdigit()));
    root.ok_or_else(|| {
        verity_err(
            data,
            format!(
                "no root hash in veritysetup's output: {}",
                text.escape_debug()
            ),
        )
    })
}

/// `release verify` of a release with `verity`: the nodes' tree and FEC of the rootfs in
/// `dir` hash to the signed root hash, tree sha256 and FEC sha256 (so a publisher learns
/// before publishing what every node would refuse after writing the slot).
pub(super) fn check_dir(dir: &Path, rootfs: &FileEntry, v: &Verity) -> Result<(), ReleaseError> {
    let data = dir.join(&rootfs.path);
    let g = v.geometry();
    let (root, tree, fec) = compute(&data, &g, &v.salt)?;
    let found = [
        ("root hash", hex::encode(root), &v.root_hash),
        (
            "tree sha256",
            hex::encode(Sha256::digest(&tree)),
            &v.hash_sha256,
        ),
        (
            "FEC sha256",
            hex::encode(Sha256::digest(&fec)),
            &v.fec_sha256,
        ),
    ];
    for (what, computed, signed) in found {
        if computed != *signed {
            return Err(verity_err(
                &data,
                format!("its {what} is {computed}, the signed manifest says {signed}: every node would refuse the slot"),
            ));
        }
    }
    Ok(())
}

/// The rootfs file with the tree and FEC area in memory, for the cross-check.
struct InMemory {
    data: File,
    data_blocks: u64,
    tree: Vec<u8>,
    fec: RefCell<Vec<u8>>,
}

impl BlockDevice for InMemory {
    fn read_block(&self, i: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if i < self.data_blocks {
            return self.data.read_exact_at(buf, i * BLOCK_SIZE);
        }
        let at = ((i - self.data_blocks) * BLOCK_SIZE) as usize;
        buf.copy_from_slice(&self.tree[at..at + buf.len()]);
        Ok(())
    }
    fn write_block(&self, _i: u64, _buf: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other(
            "the release's rootfs is not written to",
        ))
    }
    fn read_fec(&self, pos: u64, buf: &mut [u8]) -> std::io::Result<()> {
        buf.copy_from_slice(&self.fec.borrow()[pos as usize..pos as usize + buf.len()]);
        Ok(())
    }
    fn write_fec(&self, pos: u64, buf: &[u8]) -> std::io::Result<()> {
        self.fec.borrow_mut()[pos as usize..pos as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
}

/// Root hash, tree bytes and FEC bytes.
type Computed = ([u8; 32], Vec<u8>, Vec<u8>);

/// The nodes' root hash, tree and FEC of the rootfs file `data`.
fn compute(data: &Path, g: &Geometry, salt: &str) -> Result<Computed, ReleaseError> {
    let dev = InMemory {
        data: File::open(data).map_err(super::io_err(data))?,
        data_blocks: g.data_blocks,
        tree: Vec::new(),
        fec: RefCell::new(vec![0; g.fec_size() as usize]),
    };
    let salt = hex::decode(salt).map_err(|e| verity_err(data, format!("salt: {e}")))?;
    let t = build_tree(&dev, g, &salt).map_err(super::io_err(data))?;
    let dev = InMemory {
        tree: t.bytes,
        ..dev
    };
    fec_encode(&dev, g).map_err(super::io_err(data))?;
    Ok((t.root, dev.tree, dev.fec.into_inner()))
}

/// Refuse the release unless the nodes' computation gives veritysetup's root, tree and FEC.
fn ours_agree(
    data: &Path,
    g: &Geometry,
    salt: &str,
    vs: (&str, &[u8], &[u8]),
) -> Result<(), ReleaseError> {
    let (root, tree, fec) = compute(data, g, salt)?;
    let (vs_root, vs_tree, vs_fec) = vs;
    if hex::encode(root) != vs_root || tree != vs_tree || fec != vs_fec {
        return Err(verity_err(
            data,
            format!(
                "the nodes' tree and FEC differ from veritysetup's (root {} vs {vs_root}): refusing to sign what nodes would refuse",
                hex::encode(root)
            ),
        ));
    }
    Ok(())
}
