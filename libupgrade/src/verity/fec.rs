//! dm-verity FEC: parity computed round by round over interleaved blocks, and the repair of
//! erased blocks of one round.

use super::rs::Codec;
use super::{BlockDevice, Geometry, BLOCK_SIZE};

const BS: usize = BLOCK_SIZE as usize;

/// The `rsn` blocks of round `r` (block `j·rounds + r` at `j`; zeros past the covered blocks
/// and for a block that cannot be read, which the scrub counted damaged: an erasure).
fn read_round(dev: &dyn BlockDevice, g: &Geometry, r: u64) -> Vec<u8> {
    let rsn = g.rsn() as usize;
    let mut buf = vec![0u8; rsn * BS];
    for j in 0..rsn {
        let b = j as u64 * g.rounds() + r;
        let at = &mut buf[j * BS..(j + 1) * BS];
        if b < g.fec_blocks() && dev.read_block(b, at).is_err() {
            at.fill(0);
        }
    }
    buf
}

/// Compute the FEC parity of `dev`'s data and tree blocks (the tree must be written) and write
/// it to the FEC area (`g.fec_size()` bytes).
///
/// Block `j·rounds + r` is byte row `j` of every codeword of round `r`, so reading the blocks in
/// order feeds each codeword its bytes in order: one sequential read of the device (what an SD
/// card or a disk reads fastest), with every codeword's parity register in memory (the FEC
/// area's size, 0.8 % of the data at 2 roots).
pub fn encode(dev: &dyn BlockDevice, g: &Geometry) -> std::io::Result<()> {
    let codec = Codec::new(g.roots as usize);
    let roots = g.roots as usize;
    let mut par = vec![0u8; g.fec_size() as usize];
    let mut block = vec![0u8; BS];
    for b in 0..g.rsn() * g.rounds() {
        if b < g.fec_blocks() {
            dev.read_block(b, &mut block)?;
        } else {
            block.fill(0);
        }
        let r = (b % g.rounds()) as usize;
        let regs = &mut par[r * BS * roots..(r + 1) * BS * roots];
        for (i, d) in block.iter().enumerate() {
            codec.feed(&mut regs[i * roots..(i + 1) * roots], *d);
        }
    }
    dev.write_fec(0, &par)
}

/// What a round's repair may rely on: the blocks the tree found damaged (erasures) and the
/// ones it could not judge. Every other block verified, so a decoding that would change one
/// of them is a miscorrection (with 2 roots any damage "decodes" as one error) and is refused.
pub(super) struct Suspects<'a> {
    /// Blocks the tree found damaged.
    pub damaged: &'a [u64],
    /// Blocks below a damaged tree block.
    pub unverified: &'a std::collections::BTreeSet<u64>,
}

/// Repair round `r` from its parity. Writes back every block that changed, only when every
/// codeword of the round decodes changing suspect blocks alone; returns those blocks (empty:
/// nothing written).
pub(super) fn repair_round(
    dev: &dyn BlockDevice,
    g: &Geometry,
    codec: &Codec,
    r: u64,
    sus: &Suspects,
) -> std::io::Result<Vec<u64>> {
    let erased: Vec<u64> = sus
        .damaged
        .iter()
        .copied()
        .filter(|b| b % g.rounds() == r)
        .collect();
    let block = |j: usize| j as u64 * g.rounds() + r;
    let may_change = |j: usize| erased.contains(&block(j)) || sus.unverified.contains(&block(j));
    let (rsn, roots) = (g.rsn() as usize, g.roots as usize);
    let mut buf = read_round(dev, g, r);
    let before = buf.clone();
    let mut par = vec![0u8; BS * roots];
    dev.read_fec(r * (BS * roots) as u64, &mut par)?;
    let pos: Vec<usize> = erased
        .iter()
        .map(|b| ((b - r) / g.rounds()) as usize)
        .collect();
    let mut cw = vec![0u8; rsn + roots];
    for i in 0..BS {
        for j in 0..rsn {
            cw[j] = buf[j * BS + i];
        }
        cw[rsn..].copy_from_slice(&par[i * roots..(i + 1) * roots]);
        if !codec.correct(&mut cw, &pos) {
            return Ok(Vec::new());
        }
        for j in 0..rsn {
            if buf[j * BS + i] != cw[j] {
                if !may_change(j) {
                    return Ok(Vec::new());
                }
                buf[j * BS + i] = cw[j];
            }
        }
    }
    let mut written = Vec::new();
    for j in 0..rsn {
        let range = j * BS..(j + 1) * BS;
        if buf[range.clone()] != before[range.clone()] {
            let b = block(j);
            dev.write_block(b, &buf[range])?;
            written.push(b);
        }
    }
    Ok(written)
}
