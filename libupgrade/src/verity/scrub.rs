//! Re-read a verity device against its signed root hash: which blocks are damaged (a block
//! that cannot be read counts as damaged), and the repair of what FEC can correct (blocks
//! erased by the tree's verdict, round by round, then checked again from the root).

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use super::fec::{repair_round, Suspects};
use super::rs::Codec;
use super::tree::digest;
use super::{BlockDevice, Geometry, BLOCK_SIZE, DIGEST_SIZE};

const BS: usize = BLOCK_SIZE as usize;
/// Repair passes at most: a damaged hash block hides the state of the blocks below it until
/// it is repaired, so each pass can reveal more.
const PASSES: usize = 4;

/// What a scrub checks against (all from the signed manifest) and whether it may write.
#[derive(Debug, Clone)]
pub struct Scrub<'a> {
    /// The device's geometry.
    pub geometry: &'a Geometry,
    /// The tree's salt.
    pub salt: &'a [u8],
    /// The signed root hash.
    pub root: [u8; DIGEST_SIZE],
    /// The signed sha256 of the FEC area.
    pub fec_sha256: [u8; DIGEST_SIZE],
    /// Write repaired blocks (and a recomputed FEC area) back; false only reports.
    pub repair: bool,
}

/// What a scrub found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubOutcome {
    /// Blocks (data, then tree: index `data_blocks + n` is tree block `n`) still damaged.
    pub damaged: Vec<u64>,
    /// Blocks that could not be checked because a tree block above them is damaged.
    pub unverified: u64,
    /// Blocks corrected from FEC and written back.
    pub repaired: Vec<u64>,
    /// The FEC area does not hash to the signed sha256.
    pub fec_damaged: bool,
    /// The FEC area was recomputed from the verified data and tree and written back.
    pub fec_rewritten: bool,
}

impl ScrubOutcome {
    /// Every block verifies and the FEC area is the signed one (or was rewritten to it).
    pub fn clean(&self) -> bool {
        self.damaged.is_empty() && self.unverified == 0 && (!self.fec_damaged || self.fec_rewritten)
    }
}

/// The verdicts of one pass: blocks that fail against their verified parent (or the root),
/// and how many could not be checked because their parent failed.
struct Verdicts<'a> {
    salt: &'a [u8],
    bad: Vec<u64>,
    unverified: BTreeSet<u64>,
}

impl Verdicts<'_> {
    /// Block `i` could not be read (a bad sector: EIO; a short file): damaged, whatever its
    /// bytes would have been, so FEC rewrites it (a disk remaps a sector on write).
    fn unreadable(&mut self, i: u64) -> Option<Vec<u8>> {
        self.bad.push(i);
        None
    }

    /// Judge block `i` (the `k`-th of its level) against its parent's entry: its bytes when
    /// good (a hash block's children are judged against them), `None` when bad or unverified.
    fn judge(
        &mut self,
        parent: &[Option<Vec<u8>>],
        k: u64,
        block: &[u8],
        i: u64,
    ) -> Option<Vec<u8>> {
        let per = (BS / DIGEST_SIZE) as u64;
        // The root is the one entry above the top level (or above the one data block).
        let (p, entry) =
            if parent.len() == 1 && parent[0].as_ref().is_some_and(|r| r.len() == DIGEST_SIZE) {
                (0, 0)
            } else {
                (k / per, k % per)
            };
        let Some(pb) = &parent[p as usize] else {
            self.unverified.insert(i);
            return None;
        };
        let at = entry as usize * DIGEST_SIZE;
        if digest(self.salt, block)[..] == pb[at..at + DIGEST_SIZE] {
            Some(block.to_vec())
        } else {
            self.bad.push(i);
            None
        }
    }
}

fn check(
    dev: &dyn BlockDevice,
    g: &Geometry,
    salt: &[u8],
    root: &[u8],
) -> std::io::Result<(Vec<u64>, BTreeSet<u64>)> {
    let mut v = Verdicts {
        salt,
        bad: Vec::new(),
        unverified: BTreeSet::new(),
    };
    let mut block = vec![0u8; BS];
    let mut parent: Vec<Option<Vec<u8>>> = vec![Some(root.to_vec())];
    for l in (0..g.levels.len()).rev() {
        let start = g.level_start(l);
        let mut this = Vec::with_capacity(g.levels[l] as usize);
        for k in 0..g.levels[l] {
            let i = g.data_blocks + start + k;
            this.push(match dev.read_block(i, &mut block) {
                Ok(()) => v.judge(&parent, k, &block, i),
                Err(_) => v.unreadable(i),
            });
        }
        parent = this;
    }
    for b in 0..g.data_blocks {
        match dev.read_block(b, &mut block) {
            Ok(()) => v.judge(&parent, b, &block, b),
            Err(_) => v.unreadable(b),
        };
    }
    Ok((v.bad, v.unverified))
}

fn fec_hash(dev: &dyn BlockDevice, g: &Geometry) -> std::io::Result<[u8; DIGEST_SIZE]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; BS];
    let mut pos = 0;
    while pos < g.fec_size() {
        dev.read_fec(pos, &mut buf)?;
        h.update(&buf);
        pos += BLOCK_SIZE;
    }
    Ok(h.finalize().into())
}

/// Check every block of `dev` from the signed root down, and (with `s.repair`) correct the
/// damaged ones FEC can correct, pass after pass, then recompute a damaged FEC area once data
/// and tree verify.
pub fn scrub(dev: &dyn BlockDevice, s: &Scrub) -> std::io::Result<ScrubOutcome> {
    let g = s.geometry;
    let codec = Codec::new(g.roots as usize);
    let mut out = ScrubOutcome {
        // An unreadable FEC area is a damaged one: recomputed once data and tree verify.
        fec_damaged: fec_hash(dev, g).map_or(true, |h| h != s.fec_sha256),
        ..Default::default()
    };
    let mut touched = std::collections::BTreeSet::new();
    for pass in 0.. {
        let (bad, unverified) = check(dev, g, s.salt, &s.root)?;
        out.damaged = bad;
        out.unverified = unverified.len() as u64;
        if out.damaged.is_empty() || !s.repair || out.fec_damaged || pass == PASSES {
            break;
        }
        let rounds: std::collections::BTreeSet<u64> =
            out.damaged.iter().map(|b| b % g.rounds()).collect();
        let mut progress = false;
        let sus = Suspects {
            damaged: &out.damaged,
            unverified: &unverified,
        };
        for r in rounds {
            let written = repair_round(dev, g, &codec, r, &sus)?;
            progress |= !written.is_empty();
            touched.extend(written);
        }
        if !progress {
            break;
        }
    }
    out.repaired = touched
        .into_iter()
        .filter(|b| !out.damaged.contains(b))
        .collect();
    if s.repair && out.fec_damaged && out.damaged.is_empty() && out.unverified == 0 {
        super::fec::encode(dev, g)?;
        out.fec_rewritten = fec_hash(dev, g)? == s.fec_sha256;
    }
    Ok(out)
}
