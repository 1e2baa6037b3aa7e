//! `Manifest::parse`, what a node runs on `manifest.json` from a release server (before the
//! signature check in `stage`, and on every GitHub release's manifest asset in `channel`).
//!
//! Asserts: an accepted manifest re-serializes (`to_bytes`, the bytes `release create` signs)
//! to a manifest that parses to the same value, and its declared sizes are within the
//! documented limits (chunk indexes `1..=MAX_INDEX_SIZE`, boot scripts `1..=MAX_SCRIPT_SIZE`,
//! artifacts not empty).
#![no_main]

use libfuzzer_sys::fuzz_target;
use libupgrade::manifest::{Artifact, Manifest, MAX_INDEX_SIZE, MAX_SCRIPT_SIZE};

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Manifest::parse(data) else {
        return;
    };
    let again = Manifest::parse(&m.to_bytes()).expect("a parsed manifest re-parses");
    assert_eq!(again, m);
    for a in Artifact::ALL {
        let f = m.files.get(a);
        assert!(f.size > 0);
        if let Some(c) = &f.chunks {
            assert!((1..=MAX_INDEX_SIZE).contains(&c.size));
        }
    }
    if let Some(b) = &m.boot {
        for s in &b.scripts {
            assert!((1..=MAX_SCRIPT_SIZE).contains(&s.size));
        }
    }
});
