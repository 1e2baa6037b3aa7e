//! `channel::Index::parse`, what a node runs on a channel's `index.json` (local or http).
//!
//! Asserts: an accepted index re-serializes to one that parses to the same value, is sorted
//! newest first, and every entry path stays inside the channel (relative, no `..`, no scheme),
//! so `resolve` never joins an absolute path or URL onto the channel.
#![no_main]

use libfuzzer_sys::fuzz_target;
use libupgrade::channel::{Index, INDEX_FORMAT};
use libupgrade::manifest::Arch;

fuzz_target!(|data: &[u8]| {
    let Ok(ix) = Index::parse(data, "fuzz") else {
        return;
    };
    assert!(ix.format <= INDEX_FORMAT);
    let again = Index::parse(&ix.to_bytes(), "fuzz").expect("a parsed index re-parses");
    assert_eq!(again, ix);
    for w in ix.releases.windows(2) {
        assert!(w[0].generation >= w[1].generation, "newest first");
    }
    for e in &ix.releases {
        let p = std::path::Path::new(&e.path);
        assert!(!e.path.is_empty() && p.is_relative() && !e.path.contains("://"));
        assert!(p.components().all(|c| matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )));
    }
    for arch in [Arch::X86_64, Arch::Aarch64] {
        if let Some(e) = ix.find(None, arch) {
            assert!(ix
                .releases
                .iter()
                .filter(|o| o.arch == arch)
                .all(|o| o.generation <= e.generation));
        }
    }
});
