//! The stage's dm-verity step (issue 34 item 5): after the rootfs is written and its squashfs
//! checked, a release whose manifest has `verity` gets its tree and FEC computed by the node
//! ([`crate::verity`]: 0 bytes fetched) and written after the squashfs, and the slot is only
//! recorded staged when the root hash is the signed one and the tree and FEC areas hash to
//! the signed sha256; then the slot's kept files record that they were written
//! ([`crate::slotfiles::mark_verity_written`], what the scrub reads). A mismatch leaves the
//! slot invalid (never booted); only the target slot is written. A release without `verity`
//! is staged as before.

use bootconfig::Slot;
use sha2::{Digest, Sha256};

use super::run::Env;
use crate::error::{Error, Result};
use crate::manifest::{Artifact, Manifest};
use crate::verity::{build_tree, fec_encode, BlockDevice, FileDevice, BLOCK_SIZE};

/// Compute, check and write the tree and FEC of `m`'s slot file `a` (the part whose kind
/// says `verity`: the rootfs) in `slot` (nothing without `m.verity`).
pub(super) fn write(env: &Env, slot: Slot, m: &Manifest, a: Artifact) -> Result<()> {
    let Some(v) = &m.verity else {
        return Ok(());
    };
    let place = env.layout.place(slot, a);
    let place = &place;
    let io = |op: &'static str| move |e: std::io::Error| Error::io(op, place, e);
    let refuse = |what: String| Error::Verity {
        slot,
        version: m.version.clone(),
        what,
    };
    let dev = env.layout.verity_device(slot, &m.version, v, true)?;
    let g = v.geometry();
    let tree = build_tree(&dev, &g, &v.salt_bytes()).map_err(io("read the rootfs to hash it"))?;
    if tree.root != v.root() {
        return Err(refuse(format!(
            "the rootfs written hashes to root {}, the signed manifest says {}",
            hex::encode(tree.root),
            v.root_hash
        )));
    }
    let tree_sha = hex::encode(Sha256::digest(&tree.bytes));
    if tree_sha != v.hash_sha256 {
        return Err(refuse(format!(
            "the tree computed has sha256 {tree_sha}, the signed manifest says {}",
            v.hash_sha256
        )));
    }
    for (k, b) in tree.bytes.chunks(BLOCK_SIZE as usize).enumerate() {
        dev.write_block(g.data_blocks + k as u64, b)
            .map_err(io("write the dm-verity tree"))?;
    }
    fec_encode(&dev, &g).map_err(io("write the dm-verity FEC"))?;
    let fec_sha = fec_sha256(&dev, v.fec_size).map_err(io("read the dm-verity FEC back"))?;
    if fec_sha != v.fec_sha256 {
        return Err(refuse(format!(
            "the FEC area computed has sha256 {fec_sha}, the signed manifest says {}",
            v.fec_sha256
        )));
    }
    dev.sync().map_err(io("fsync the dm-verity tree and FEC"))?;
    crate::slotfiles::mark_verity_written(&env.cfg.state_dir, slot, &v.root_hash)?;
    crate::barrier::hit("stage:verity-written");
    Ok(())
}

/// sha256 of the FEC area as written (read back, so what is hashed is what a boot reads).
fn fec_sha256(dev: &FileDevice, size: u64) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; BLOCK_SIZE as usize];
    let mut pos = 0;
    while pos < size {
        dev.read_fec(pos, &mut buf)?;
        h.update(&buf);
        pos += BLOCK_SIZE;
    }
    Ok(hex::encode(h.finalize()))
}
