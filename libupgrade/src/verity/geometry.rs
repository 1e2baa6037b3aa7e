//! Where everything is: tree levels, hash blocks, FEC rounds and sizes, from the number of data
//! blocks and the FEC roots (pure).

/// The one data and hash block size supported (veritysetup's default; the page size).
pub const BLOCK_SIZE: u64 = 4096;
/// sha256 digest size.
pub const DIGEST_SIZE: usize = 32;
/// Digests per hash block.
const PER_BLOCK: u64 = BLOCK_SIZE / DIGEST_SIZE as u64;
/// FEC roots allowed: 2 (0.8 % of the data) to 24 (the kernel's limit, ~10 %).
pub const FEC_ROOTS: std::ops::RangeInclusive<u32> = 2..=24;

/// Why a geometry cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GeometryError {
    /// No data blocks.
    #[error("a verity device needs at least one data block")]
    Empty,
    /// FEC roots outside 2..=24 (the kernel's limits).
    #[error("FEC roots {0} is not within 2..=24")]
    Roots(u32),
}

/// The layout of a verity device with FEC: data blocks, then the tree (top level first), then
/// the FEC parity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Data blocks covered.
    pub data_blocks: u64,
    /// Hash blocks per level, level 0 (digests of data blocks) first.
    pub levels: Vec<u64>,
    /// FEC parity bytes per codeword.
    pub roots: u32,
}

impl Geometry {
    /// The geometry of `data_blocks` blocks with `roots` FEC roots.
    pub fn new(data_blocks: u64, roots: u32) -> Result<Geometry, GeometryError> {
        if data_blocks == 0 {
            return Err(GeometryError::Empty);
        }
        if !FEC_ROOTS.contains(&roots) {
            return Err(GeometryError::Roots(roots));
        }
        // As the kernel counts them: the levels needed to reach one digest per block index.
        let mut levels = Vec::new();
        let mut n = data_blocks;
        let mut shift = 0u32;
        while shift < 64 && (data_blocks - 1) >> shift != 0 {
            n = n.div_ceil(PER_BLOCK);
            levels.push(n);
            shift += PER_BLOCK.trailing_zeros();
        }
        Ok(Geometry {
            data_blocks,
            levels,
            roots,
        })
    }

    /// Hash blocks in all levels.
    pub fn hash_blocks(&self) -> u64 {
        self.levels.iter().sum()
    }

    /// Bytes of the tree.
    pub fn hash_size(&self) -> u64 {
        self.hash_blocks() * BLOCK_SIZE
    }

    /// Block index (within the tree) where `level` starts: the top level is first.
    pub fn level_start(&self, level: usize) -> u64 {
        self.levels[level + 1..].iter().sum()
    }

    /// Data bytes per codeword.
    pub fn rsn(&self) -> u64 {
        255 - u64::from(self.roots)
    }

    /// Blocks FEC covers: data then tree.
    pub fn fec_blocks(&self) -> u64 {
        self.data_blocks + self.hash_blocks()
    }

    /// FEC rounds: each round's codewords interleave `rsn` blocks `rounds` apart.
    pub fn rounds(&self) -> u64 {
        self.fec_blocks().div_ceil(self.rsn())
    }

    /// Bytes of FEC parity.
    pub fn fec_size(&self) -> u64 {
        self.rounds() * BLOCK_SIZE * u64::from(self.roots)
    }
}
