//! `MemoryBootloader` (the in-memory loader other crates' tests use) follows the GRUB backend's
//! rules exactly: from every state, every transaction reads back the same, and a power-on
//! boots the same slot and counts the same try down as GRUB's script (the model held to the
//! real GRUB in grub_real.rs).

use crate::common;

use bootconfig::GrubBootloader;
use bootconfig::MemoryBootloader;
use bootconfig::{Bootloader, Slot};

#[test]
fn memory_loader_matches_grub_transaction_by_transaction() {
    let max = 3;
    let mut cases = 0;
    for before in common::all_envs(max) {
        for slot in Slot::ALL {
            for call in 0..(2 + max as usize + 2) {
                let d = common::scratch();
                let g = GrubBootloader::new(d.path(), max);
                g.install(&before).unwrap();
                let m = MemoryBootloader::new(max);
                *m.env() = before.clone();
                let run = |b: &dyn Bootloader| match call {
                    0 => b.mark_bad(slot),
                    1 => b.mark_good(slot),
                    // try_slot with 0..=max+1 tries: both clamp into 1..=max.
                    t => b.try_slot(slot, (t - 2) as u8),
                };
                run(&g).unwrap();
                run(&m).unwrap();
                assert_eq!(
                    m.read().unwrap(),
                    g.read().unwrap(),
                    "{before:?} call {call} on {slot}"
                );
                for _ in 0..(max + 1) {
                    let sim = g.simulate_boot().unwrap();
                    for op in &sim.countdown {
                        op.apply().unwrap();
                    }
                    assert_eq!(m.power_on(), sim.choice, "{before:?} call {call} on {slot}");
                    assert_eq!(m.read().unwrap(), g.read().unwrap());
                }
                cases += 1;
            }
        }
    }
    assert!(cases > 500, "{cases}");
}
