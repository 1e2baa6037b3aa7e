//! `ChunkIndex::parse`, what a node runs on `<artifact>.chunks` from a release server.
//!
//! Asserts: an accepted index re-serializes byte for byte (apart from the reserved word, which
//! the writer always writes as 0), holds exactly as many entries as its bytes carry (no
//! allocation from the declared count alone), every chunk within `1..=max`, contiguous from 0,
//! adding up to the declared total.
#![no_main]

use libfuzzer_sys::fuzz_target;
use libupgrade::chunk::ChunkIndex;

fuzz_target!(|data: &[u8]| {
    let Ok(ix) = ChunkIndex::parse(data) else {
        return;
    };
    assert_eq!(
        40 + 36 * ix.chunks.len(),
        data.len(),
        "entries backed by bytes"
    );
    assert!(ix.chunks.capacity() <= ix.chunks.len().max(1) * 2);
    let mut off = 0u64;
    for c in &ix.chunks {
        assert_eq!(c.offset, off);
        assert!(c.len >= 1 && c.len <= ix.params.max);
        off = c.end();
    }
    assert_eq!(ix.size(), off);
    let mut want = data.to_vec();
    want[20..24].fill(0);
    assert_eq!(ix.to_bytes(), want, "re-serialization");
    assert_eq!(ChunkIndex::parse(&ix.to_bytes()).unwrap(), ix);
});
