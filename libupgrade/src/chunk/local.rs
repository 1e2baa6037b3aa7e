//! Finding chunks a node already holds: in the target (what an interrupted attempt wrote, at
//! the index's own offsets) and in local files such as the running slot (anywhere: they are
//! cut with the index's parameters, so content shared between versions yields the same chunks).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use super::index::for_each_chunk;
use super::plan::LocalRef;
use super::{ChunkIndex, Digest, IndexError};

/// A byte range of a local file that may hold chunks of the release (the running slot's rootfs
/// partition, its kernel file…).
#[derive(Debug)]
pub struct LocalFile {
    /// The open file or block device.
    pub file: File,
    /// Where the range starts in the file, in bytes.
    pub offset: u64,
    /// The range's length in bytes.
    pub len: u64,
    /// For messages.
    pub name: String,
}

impl LocalFile {
    /// All of the file at `path`, opened read-only, named by its path.
    pub fn open(path: &std::path::Path) -> io::Result<LocalFile> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(LocalFile {
            file,
            offset: 0,
            len,
            name: path.display().to_string(),
        })
    }

    /// Read exactly `buf.len()` bytes at `pos` (relative to the range).
    pub fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()> {
        if pos + buf.len() as u64 > self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: read past its {} bytes", self.name, self.len),
            ));
        }
        self.file.read_exact_at(buf, self.offset + pos)
    }

    /// A sequential reader over the whole range.
    pub fn reader(&self) -> impl Read + '_ {
        AtReader {
            f: &self.file,
            pos: self.offset,
            end: self.offset + self.len,
        }
    }
}

/// Sequential reads through `pread`, so a shared `File` keeps no cursor state.
struct AtReader<'a> {
    f: &'a File,
    pos: u64,
    end: u64,
}

impl Read for AtReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.end - self.pos).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.f.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Which chunks are already correct in the target: read `target` (the first `avail` bytes of
/// it are meaningful) in order and compare each chunk's digest at its offset.
pub fn verify_in_place(index: &ChunkIndex, target: impl Read, avail: u64) -> io::Result<Vec<bool>> {
    let mut r = target.take(avail);
    let mut buf = vec![0u8; index.params.max as usize];
    let mut present = Vec::with_capacity(index.chunks.len());
    for c in &index.chunks {
        if c.end() > avail {
            break;
        }
        let data = &mut buf[..c.len as usize];
        match r.read_exact(data) {
            Ok(()) => present.push(super::digest(data) == c.digest),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
    }
    present.resize(index.chunks.len(), false);
    Ok(present)
}

/// For every chunk with `wanted[i]`, a place in `sources` holding the same bytes, if any.
/// Each source is read once, sequentially, and cut with the index's parameters; the search
/// stops early when everything wanted was found.
pub fn find_local(
    index: &ChunkIndex,
    wanted: &[bool],
    sources: &[LocalFile],
) -> Result<Vec<Option<LocalRef>>, IndexError> {
    let mut by_digest: HashMap<Digest, Vec<u32>> = HashMap::new();
    for (i, c) in index.chunks.iter().enumerate() {
        if wanted[i] {
            by_digest.entry(c.digest).or_default().push(i as u32);
        }
    }
    let mut found = vec![None; index.chunks.len()];
    for (s, src) in sources.iter().enumerate() {
        if by_digest.is_empty() {
            break;
        }
        for_each_chunk(src.reader(), index.params, |offset, data| {
            if let Some(ids) = by_digest.remove(&super::digest(data)) {
                for i in ids {
                    found[i as usize] = Some(LocalRef { source: s, offset });
                }
            }
            Ok(())
        })?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ChunkParams;
    use std::io::Write;

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        crate::chunk::index::tests_noise(n, seed)
    }

    #[test]
    fn finds_shared_chunks_in_a_shifted_local_file_and_verifies_in_place() {
        let p = ChunkParams::with_avg(8 << 10);
        let new = noise(600_000, 1);
        let ix = ChunkIndex::build(&new[..], p).unwrap();
        // The local file holds the second half of the new file, behind 12345 unrelated bytes
        // and at an offset inside a larger file.
        let mut local = noise(12_345, 5);
        local.extend_from_slice(&new[300_000..]);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&noise(4096, 6)).unwrap();
        f.write_all(&local).unwrap();
        let src = LocalFile {
            file: f,
            offset: 4096,
            len: local.len() as u64,
            name: "local".into(),
        };
        let wanted = vec![true; ix.chunks.len()];
        let found = find_local(&ix, &wanted, std::slice::from_ref(&src)).unwrap();
        let n = found.iter().filter(|f| f.is_some()).count();
        assert!(n * 2 >= ix.chunks.len() - 4, "{n} of {}", ix.chunks.len());
        assert!(found[0].is_none());
        for (c, f) in ix.chunks.iter().zip(&found) {
            if let Some(l) = f {
                let mut b = vec![0; c.len as usize];
                src.read_at(l.offset, &mut b).unwrap();
                assert_eq!(crate::chunk::digest(&b), c.digest);
            }
        }

        // In place: the target holds the first 200000 bytes, one of them flipped.
        let mut t = new[..200_000].to_vec();
        t[100_000] ^= 1;
        let present = verify_in_place(&ix, &t[..], t.len() as u64).unwrap();
        let bad = ix.chunks.iter().position(|c| c.end() > 100_000).unwrap();
        for (i, c) in ix.chunks.iter().enumerate() {
            assert_eq!(present[i], c.end() <= 200_000 && i != bad, "chunk {i}");
        }
    }
}
