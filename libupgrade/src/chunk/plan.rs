//! Pure decisions of a chunked transfer: what each chunk of the target needs, and which HTTP
//! `Range` requests fetch the rest.
//!
//! Rules, each one a bound the tests check:
//! - a chunk already verified in the target is never fetched or written again (so across any
//!   number of interruptions, every byte is fetched once plus what was in flight);
//! - a chunk found in a local file is copied from there, unless the whole local reuse saves
//!   less than [`STREAM_BELOW`] of the file: then the missing chunks are fetched as one
//!   stream (one request per run of missing chunks, normally exactly one) — thousands of small
//!   requests are slower than one stream for a saving that small. Either way the bytes
//!   requested never exceed the file size (at most 1× a full download plus request headers);
//! - neighbouring fetched chunks coalesce into one request; a request never spans a chunk that
//!   is not fetched (gaps would be paid for in bandwidth, the scarce resource on a remote site).

use super::ChunkIndex;

/// Below this share of the file, local reuse is not worth splitting the download.
pub const STREAM_BELOW: f64 = 0.10;

/// Where a chunk can be copied from locally: source number and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRef {
    /// Index of the local file in the caller's list of sources ([`super::local::LocalFile`]s).
    pub source: usize,
    /// Byte offset of the chunk's copy in that source, relative to the start of its range.
    pub offset: u64,
}

/// What happens to one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Already in the target (verified).
    Keep,
    /// Copied from a local file.
    Copy(LocalRef),
    /// Fetched by range request number `.0`.
    Fetch(usize),
}

/// One HTTP range request: chunks `first..end` (indexes), bytes `start..stop` of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchRange {
    /// Index of the first chunk requested.
    pub first: usize,
    /// Index one past the last chunk requested.
    pub end: usize,
    /// Byte offset in the file where the request starts.
    pub start: u64,
    /// Byte offset in the file where it stops (exclusive).
    pub stop: u64,
}

impl FetchRange {
    /// Bytes requested.
    pub fn len(&self) -> u64 {
        self.stop - self.start
    }

    /// True when the range requests no byte.
    pub fn is_empty(&self) -> bool {
        self.stop == self.start
    }
}

/// The plan for one artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What happens to each chunk, by chunk index.
    pub actions: Vec<Action>,
    /// The range requests to make, in file order.
    pub ranges: Vec<FetchRange>,
    /// True when local reuse was given up for one stream.
    pub stream: bool,
    /// Bytes of chunks already verified in the target.
    pub keep_bytes: u64,
    /// Bytes of chunks copied from local files.
    pub copy_bytes: u64,
    /// Bytes of chunks fetched over the network.
    pub fetch_bytes: u64,
}

/// Decide. `present[i]`: chunk `i` verified in the target; `local[i]`: a local copy of it.
pub fn plan(index: &ChunkIndex, present: &[bool], local: &[Option<LocalRef>]) -> Plan {
    let n = index.chunks.len();
    assert!(
        present.len() == n && local.len() == n,
        "one entry per chunk"
    );
    let size = index.size();
    let copyable: u64 = (0..n)
        .filter(|&i| !present[i] && local[i].is_some())
        .map(|i| u64::from(index.chunks[i].len))
        .sum();
    let stream = (copyable as f64) < STREAM_BELOW * size as f64;
    let mut p = Plan {
        actions: Vec::with_capacity(n),
        ranges: Vec::new(),
        stream,
        keep_bytes: 0,
        copy_bytes: 0,
        fetch_bytes: 0,
    };
    for (i, c) in index.chunks.iter().enumerate() {
        let len = u64::from(c.len);
        let action = match (present[i], local[i]) {
            (true, _) => {
                p.keep_bytes += len;
                Action::Keep
            }
            (false, Some(l)) if !stream => {
                p.copy_bytes += len;
                Action::Copy(l)
            }
            _ => {
                p.fetch_bytes += len;
                match p.ranges.last_mut() {
                    Some(r) if r.end == i => {
                        r.end = i + 1;
                        r.stop = c.end();
                    }
                    _ => p.ranges.push(FetchRange {
                        first: i,
                        end: i + 1,
                        start: c.offset,
                        stop: c.end(),
                    }),
                }
                Action::Fetch(p.ranges.len() - 1)
            }
        };
        p.actions.push(action);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{ChunkEntry, ChunkParams};
    use proptest::prelude::*;

    fn index(lens: &[u32]) -> ChunkIndex {
        let mut off = 0;
        let chunks = lens
            .iter()
            .map(|&len| {
                let c = ChunkEntry {
                    offset: off,
                    len,
                    digest: [0; 32],
                };
                off += u64::from(len);
                c
            })
            .collect();
        ChunkIndex {
            params: ChunkParams::DEFAULT,
            chunks,
        }
    }

    const L: Option<LocalRef> = Some(LocalRef {
        source: 0,
        offset: 7,
    });

    #[test]
    fn delta_coalesces_neighbours_and_never_spans_a_gap() {
        let ix = index(&[10; 6]);
        let present = [true, false, false, false, false, false];
        let local = [None, None, None, L, None, None];
        let p = plan(&ix, &present, &local);
        assert!(!p.stream);
        assert_eq!(
            p.actions,
            vec![
                Action::Keep,
                Action::Fetch(0),
                Action::Fetch(0),
                Action::Copy(L.unwrap()),
                Action::Fetch(1),
                Action::Fetch(1)
            ]
        );
        assert_eq!(
            p.ranges,
            vec![
                FetchRange {
                    first: 1,
                    end: 3,
                    start: 10,
                    stop: 30
                },
                FetchRange {
                    first: 4,
                    end: 6,
                    start: 40,
                    stop: 60
                }
            ]
        );
        assert_eq!((p.keep_bytes, p.copy_bytes, p.fetch_bytes), (10, 10, 40));
    }

    #[test]
    fn low_reuse_streams_but_never_refetches_what_the_target_holds() {
        // 1 of 20 chunks local (5% < 10%): one stream, the local chunk fetched with it.
        let ix = index(&[10; 20]);
        let mut local = vec![None; 20];
        local[10] = L;
        let mut present = vec![false; 20];
        present[..4].fill(true);
        let p = plan(&ix, &present, &local);
        assert!(p.stream);
        assert_eq!(
            p.ranges,
            vec![FetchRange {
                first: 4,
                end: 20,
                start: 40,
                stop: 200
            }]
        );
        assert_eq!(p.fetch_bytes, 160);
    }

    proptest! {
        #[test]
        fn bytes_requested_never_exceed_the_file_or_touch_kept_chunks(
            spec in proptest::collection::vec((1u32..300_000, any::<bool>(), any::<bool>()), 1..200)
        ) {
            let ix = index(&spec.iter().map(|s| s.0).collect::<Vec<_>>());
            let present: Vec<bool> = spec.iter().map(|s| s.1).collect();
            let local: Vec<_> = spec.iter().map(|s| if s.2 { L } else { None }).collect();
            let p = plan(&ix, &present, &local);
            let requested: u64 = p.ranges.iter().map(FetchRange::len).sum();
            prop_assert_eq!(requested, p.fetch_bytes);
            prop_assert!(requested <= ix.size());
            prop_assert_eq!(p.keep_bytes + p.copy_bytes + p.fetch_bytes, ix.size());
            for (i, a) in p.actions.iter().enumerate() {
                if present[i] { prop_assert_eq!(*a, Action::Keep); }
                if let Action::Fetch(r) = a {
                    let r = p.ranges[*r];
                    prop_assert!(r.first <= i && i < r.end);
                }
            }
            for r in &p.ranges {
                for i in r.first..r.end { prop_assert_eq!(p.actions[i], Action::Fetch(p.ranges.iter().position(|x| x == r).unwrap())); }
            }
            // Requests are maximal: two ranges never touch.
            for w in p.ranges.windows(2) { prop_assert!(w[0].end < w[1].first); }
            if !p.stream { prop_assert!(p.copy_bytes as f64 >= STREAM_BELOW * ix.size() as f64); }
        }
    }
}
