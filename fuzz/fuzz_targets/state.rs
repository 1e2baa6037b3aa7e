//! `StateStore::load` on an arbitrary `state.json` (a damaged state partition), then what every
//! command does first with a loaded state: look up both slots and their last decisions.
//!
//! Asserts: no panic on any accepted file (both slot records present), and an accepted state
//! saved by `StateStore::save` loads back equal.
#![no_main]

use k3os_fuzz::{put, scratch};
use libfuzzer_sys::fuzz_target;
use libupgrade::state::store::StateStore;
use libupgrade::state::STATE_FILE;
use libupgrade::Slot;

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    put(&src.join(STATE_FILE), Some(data));
    let Ok(st) = StateStore::new(&src).load() else {
        return;
    };
    for s in Slot::ALL {
        let _ = st.slot(s);
        let _ = st.last_decision(s);
    }
    let copy = dir.join("copy");
    let store = StateStore::new(&copy);
    store.save(&st, "fuzz").unwrap();
    assert_eq!(store.load().unwrap(), st, "save then load");
});
