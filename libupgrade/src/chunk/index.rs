//! The chunk index of one artifact: its content-defined chunks in file order, each with its
//! length and sha256. Offsets are implied (each chunk starts where the previous ended), so an
//! index can only describe a whole file, without gaps or overlaps.
//!
//! File format (`<artifact file>.chunks`, little endian), 40 bytes of header then 36 per chunk:
//! ```text
//! "K3CHUNK1" | min u32 | avg u32 | max u32 | reserved u32 (0) | count u64 | total size u64
//! count × ( length u32 | sha256 [32] )
//! ```
//! A 1 GiB image at the default 32 KiB average needs ~32 k entries: 1.2 MB on the wire and in memory.
//! The parameters travel with the index so a node chunks its local files exactly as the
//! publisher did (content-defined boundaries only line up with the same parameters).

use std::io::{self, Read};

use byteorder::{ByteOrder, LittleEndian as LE};

use fastcdc::v2020::StreamCDC;

use super::Digest;

const MAGIC: &[u8; 8] = b"K3CHUNK1";
const HEADER: usize = 40;
const ENTRY: usize = 36;

/// FastCDC parameters (bytes): every chunk but the last is `min..=max` long, `avg` on average.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    /// Smallest chunk length in bytes (the last chunk may be shorter).
    pub min: u32,
    /// Target average chunk length in bytes.
    pub avg: u32,
    /// Largest chunk length in bytes.
    pub max: u32,
}

impl ChunkParams {
    /// The default: 32 KiB average (8 KiB min, 128 KiB max). Chosen by `just bench-delta` on
    /// real Debian squashfs images (README, "Delta updates"): for a monthly update a node
    /// fetched 11.5% of the image at 32 KiB, 13.7% at 64 KiB, 16.6% at 128 KiB (index
    /// included); the index costs 36 bytes per chunk (~1.1 MiB per GiB) and the request count
    /// stayed small (53 ranges).
    pub const DEFAULT: ChunkParams = ChunkParams::with_avg(32 << 10);

    /// `avg` with the usual FastCDC ratios (min = avg/4, max = avg×4).
    pub const fn with_avg(avg: u32) -> ChunkParams {
        ChunkParams {
            min: avg / 4,
            avg,
            max: avg * 4,
        }
    }

    /// Within what the fastcdc crate supports, even, ordered.
    pub fn check(&self) -> Result<(), IndexError> {
        use fastcdc::v2020 as f;
        let (min, avg, max) = (self.min as usize, self.avg as usize, self.max as usize);
        let ok = (f::MINIMUM_MIN..=f::MINIMUM_MAX).contains(&min)
            && (f::AVERAGE_MIN..=f::AVERAGE_MAX).contains(&avg)
            && (f::MAXIMUM_MIN..=f::MAXIMUM_MAX).contains(&max)
            && self.min <= self.avg
            && self.avg <= self.max
            && [self.min, self.avg, self.max].iter().all(|v| v % 2 == 0);
        if ok {
            Ok(())
        } else {
            Err(IndexError::Invalid(format!(
                "chunk sizes min {} avg {} max {} are outside what FastCDC supports",
                self.min, self.avg, self.max
            )))
        }
    }
}

/// One chunk of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Byte offset of the chunk in the file (implied by the lengths before it).
    pub offset: u64,
    /// Length of the chunk in bytes.
    pub len: u32,
    /// sha256 of the chunk's bytes.
    pub digest: Digest,
}

impl ChunkEntry {
    /// Byte offset one past the chunk's last byte.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

/// The chunks of one file, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkIndex {
    /// The parameters the file was chunked with.
    pub params: ChunkParams,
    /// Its chunks, in file order, without gaps.
    pub chunks: Vec<ChunkEntry>,
}

/// Why an index could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Reading the data to chunk failed.
    #[error("reading the data to chunk: {0}")]
    Io(#[from] io::Error),
    /// The index bytes are malformed, or the chunk parameters are unusable (text says what).
    #[error("not a chunk index: {0}")]
    Invalid(String),
}

impl ChunkIndex {
    /// Chunk everything `r` yields (one pass, a buffer of `params.max` bytes).
    pub fn build(r: impl Read, params: ChunkParams) -> Result<ChunkIndex, IndexError> {
        let mut chunks = Vec::new();
        for_each_chunk(r, params, |offset, data| {
            chunks.push(ChunkEntry {
                offset,
                len: data.len() as u32,
                digest: super::digest(data),
            });
            Ok(())
        })?;
        Ok(ChunkIndex { params, chunks })
    }

    /// Total bytes described.
    pub fn size(&self) -> u64 {
        self.chunks.last().map_or(0, ChunkEntry::end)
    }

    /// The index in its file format (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + ENTRY * self.chunks.len());
        v.extend_from_slice(MAGIC);
        for x in [self.params.min, self.params.avg, self.params.max, 0] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        v.extend_from_slice(&self.size().to_le_bytes());
        for c in &self.chunks {
            v.extend_from_slice(&c.len.to_le_bytes());
            v.extend_from_slice(&c.digest);
        }
        v
    }

    /// Parse and check an index: header, parameters, every length within `1..=max`, and the
    /// lengths adding up to the declared total.
    pub fn parse(b: &[u8]) -> Result<ChunkIndex, IndexError> {
        let bad = |w: String| Err(IndexError::Invalid(w));
        // The magic's last byte is the format version ("K3CHUNK1"): a newer one is refused
        // naming both, before anything else is read.
        if b.len() >= 8 && b[..7] == MAGIC[..7] && b[7].is_ascii_digit() && b[7] > MAGIC[7] {
            return bad(format!(
                "chunk index version {} is newer than this build of k3os-ops reads (version {}); upgrade k3os-ops first",
                b[7] as char, MAGIC[7] as char
            ));
        }
        if b.len() < HEADER || &b[..8] != MAGIC {
            return bad(format!(
                "{} bytes without the K3CHUNK1 header",
                b.len().min(HEADER)
            ));
        }
        let u32_at = |o: usize| LE::read_u32(&b[o..]);
        let u64_at = |o: usize| LE::read_u64(&b[o..]);
        let params = ChunkParams {
            min: u32_at(8),
            avg: u32_at(12),
            max: u32_at(16),
        };
        params.check()?;
        let count = u64_at(24);
        let total = u64_at(32);
        let body = (b.len() - HEADER) as u64;
        if body != count.saturating_mul(ENTRY as u64) {
            return bad(format!(
                "header says {count} chunks, the file holds {body} bytes of entries ({} each)",
                ENTRY
            ));
        }
        let mut chunks = Vec::with_capacity(count as usize);
        let mut offset = 0u64;
        for (i, e) in b[HEADER..].chunks_exact(ENTRY).enumerate() {
            let len = LE::read_u32(e);
            if len == 0 || len > params.max {
                return bad(format!(
                    "chunk {i} is {len} bytes long (allowed 1..={})",
                    params.max
                ));
            }
            chunks.push(ChunkEntry {
                offset,
                len,
                digest: e[4..].try_into().expect("32 bytes"),
            });
            offset += u64::from(len);
        }
        if offset != total {
            return bad(format!(
                "chunks add up to {offset} bytes, header says {total}"
            ));
        }
        Ok(ChunkIndex { params, chunks })
    }
}

/// Cut `r` into content-defined chunks and call `f(offset, bytes)` for each, in order.
pub fn for_each_chunk(
    r: impl Read,
    params: ChunkParams,
    mut f: impl FnMut(u64, &[u8]) -> Result<(), IndexError>,
) -> Result<(), IndexError> {
    params.check()?;
    let cdc = StreamCDC::new(
        r,
        params.min as usize,
        params.avg as usize,
        params.max as usize,
    );
    for c in cdc {
        let c = c.map_err(io::Error::from)?;
        f(c.offset, &c.data)?;
    }
    Ok(())
}

/// Deterministic incompressible test bytes (xorshift).
#[cfg(test)]
pub(crate) fn tests_noise(n: usize, seed: u64) -> Vec<u8> {
    tests::noise(n, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace's one test-bytes generator (testkit, a dev-dependency).
    pub(super) fn noise(n: usize, seed: u64) -> Vec<u8> {
        testkit::pseudo_random(n, seed)
    }

    #[test]
    fn round_trip_and_boundaries_resync_after_an_insertion() {
        let p = ChunkParams::with_avg(8 << 10);
        let a = noise(1 << 20, 1);
        let ia = ChunkIndex::build(&a[..], p).unwrap();
        assert_eq!(ia.size(), a.len() as u64);
        assert!(ia.chunks.len() > 64, "{}", ia.chunks.len());
        assert!(ia.chunks[..ia.chunks.len() - 1]
            .iter()
            .all(|c| c.len >= p.min && c.len <= p.max));
        assert_eq!(ChunkIndex::parse(&ia.to_bytes()).unwrap(), ia);

        // 100 bytes inserted near the start: only the chunks around the edit change.
        let mut b = a[..5000].to_vec();
        b.extend_from_slice(&noise(100, 9));
        b.extend_from_slice(&a[5000..]);
        let ib = ChunkIndex::build(&b[..], p).unwrap();
        let have: std::collections::HashSet<_> = ia.chunks.iter().map(|c| c.digest).collect();
        let new = ib
            .chunks
            .iter()
            .filter(|c| !have.contains(&c.digest))
            .count();
        assert!(new <= 3, "{new} of {} chunks changed", ib.chunks.len());
    }

    #[test]
    fn a_newer_index_version_is_refused_naming_both() {
        let ix = ChunkIndex::build(&noise(50_000, 3)[..], ChunkParams::with_avg(8 << 10)).unwrap();
        let mut b = ix.to_bytes();
        b[7] = b'2';
        let e = ChunkIndex::parse(&b).unwrap_err().to_string();
        assert!(
            e.contains("version 2 is newer") && e.contains("(version 1)"),
            "{e}"
        );
    }

    #[test]
    fn parse_refuses_corrupt_indexes_with_the_reason() {
        let ix = ChunkIndex::build(&noise(200_000, 2)[..], ChunkParams::with_avg(8 << 10)).unwrap();
        let good = ix.to_bytes();
        let e = ChunkIndex::parse(&good[..good.len() - 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("entries"), "{e}");
        let mut b = good.clone();
        b[32] ^= 1; // total size
        let e = ChunkIndex::parse(&b).unwrap_err().to_string();
        assert!(e.contains("add up"), "{e}");
        let mut b = good.clone();
        b[40..44].copy_from_slice(&0u32.to_le_bytes());
        let e = ChunkIndex::parse(&b).unwrap_err().to_string();
        assert!(e.contains("chunk 0 is 0 bytes"), "{e}");
        let e = ChunkIndex::parse(b"hello").unwrap_err().to_string();
        assert!(e.contains("K3CHUNK1"), "{e}");
        let mut b = good;
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(ChunkIndex::parse(&b).is_err());
    }
}
