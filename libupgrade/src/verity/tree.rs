//! The hash tree of a verity device (format 1: `sha256(salt ‖ block)`, top level first).

use sha2::{Digest, Sha256};

use super::{BlockDevice, Geometry, BLOCK_SIZE, DIGEST_SIZE};

/// A computed tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The tree's bytes as they are stored after the data (top level first).
    pub bytes: Vec<u8>,
    /// The root hash.
    pub root: [u8; DIGEST_SIZE],
}

pub(super) fn digest(salt: &[u8], block: &[u8]) -> [u8; DIGEST_SIZE] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(block);
    h.finalize().into()
}

/// Hash every data block of `dev` and build the tree of `g` over them.
pub fn build_tree(dev: &dyn BlockDevice, g: &Geometry, salt: &[u8]) -> std::io::Result<Tree> {
    let bs = BLOCK_SIZE as usize;
    let mut block = vec![0u8; bs];
    let mut levels: Vec<Vec<u8>> = Vec::with_capacity(g.levels.len());
    for (l, n) in g.levels.iter().enumerate() {
        let mut level = vec![0u8; *n as usize * bs];
        let count = if l == 0 {
            g.data_blocks
        } else {
            g.levels[l - 1]
        };
        for i in 0..count {
            let src: &[u8] = if l == 0 {
                dev.read_block(i, &mut block)?;
                &block
            } else {
                &levels[l - 1][i as usize * bs..(i as usize + 1) * bs]
            };
            let d = digest(salt, src);
            let at = i as usize * DIGEST_SIZE;
            level[at..at + DIGEST_SIZE].copy_from_slice(&d);
        }
        levels.push(level);
    }
    let root = match levels.last() {
        Some(top) => digest(salt, top),
        None => {
            dev.read_block(0, &mut block)?;
            digest(salt, &block)
        }
    };
    let bytes = levels.into_iter().rev().flatten().collect();
    Ok(Tree { bytes, root })
}
