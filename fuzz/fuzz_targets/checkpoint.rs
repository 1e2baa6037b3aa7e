//! `checkpoint::Partial::load` on an arbitrary `download.json` (a damaged state partition):
//! `stage` calls it to decide whether to resume.
//!
//! Asserts: no panic; an accepted checkpoint saved again loads back equal.
#![no_main]

use k3os_fuzz::{put, scratch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let (src, copy) = (dir.join("src"), dir.join("copy"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&copy).unwrap();
    put(&src.join("download.json"), Some(data));
    if let Some(same) = libupgrade::fuzz_load_and_resave(&src, &copy) {
        assert!(same, "save then load");
    }
});
