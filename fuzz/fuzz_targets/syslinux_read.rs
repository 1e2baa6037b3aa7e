//! `SyslinuxBootloader::read` (the conf parser: `DEFAULT`, the state line, the version marker;
//! and the ADV's boot-once record) on an arbitrary `extlinux.conf` and `ldlinux.sys` in a temp
//! dir, then one write transaction and the read back.
//!
//! Input: an op byte, then `extlinux.conf SEP ldlinux.sys`. Asserts: what `read` reports is
//! what the loader boots (the view's choice is the read state's `next_boot`), and after a
//! successful `mark_good` / `try_slot` / `mark_bad` the files read back as that transaction
//! says, with `ldlinux.sys` unchanged in size (the ADV is written in place) and a valid ADV.
#![no_main]

use bootconfig::{Adv, SyslinuxBootloader, ADV_SIZE};
use bootconfig::{Bootloader, Slot, SlotBoot};
use k3os_fuzz::{put, scratch, split_files};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    let parts = split_files(rest, 2);
    put(&dir.join("extlinux.conf"), parts[0]);
    put(&dir.join("ldlinux.sys"), parts[1]);
    let b = SyslinuxBootloader::new(dir);
    let Ok(view) = b.view() else {
        return;
    };
    let env = b.read().expect("read after view");
    assert_eq!(env, view.env);
    if let Some(s) = view.once {
        assert_eq!(view.choice, s);
        assert_eq!(env.get(s), SlotBoot::Trying { tries_left: 1 });
    }
    let size = std::fs::metadata(b.ldlinux_path()).unwrap().len();
    let slot = if op & 1 == 0 { Slot::A } else { Slot::B };
    let (res, want): (_, fn(&bootconfig::BootEnv, Slot) -> bool) = match (op >> 1) % 3 {
        0 => (b.mark_good(slot), |e, s| {
            e.primary == s && e.get(s) == SlotBoot::Good
        }),
        1 => (b.try_slot(slot, 1), |e, s| {
            e.primary == s && e.get(s) == SlotBoot::Trying { tries_left: 1 } && e.next_boot() == s
        }),
        _ => (b.mark_bad(slot), |e, s| e.get(s) == SlotBoot::Bad),
    };
    if res.is_err() {
        return;
    }
    let after = b.view().expect("read back what was written");
    assert!(
        want(&after.env, slot),
        "op {op}: {env:?} -> {:?}",
        after.env
    );
    assert_eq!(
        std::fs::metadata(b.ldlinux_path()).unwrap().len(),
        size,
        "ldlinux.sys size"
    );
    let raw = std::fs::read(b.ldlinux_path()).unwrap();
    let adv: [u8; 2 * ADV_SIZE] = raw[raw.len() - 2 * ADV_SIZE..].try_into().unwrap();
    assert!(Adv::load(&adv).1, "a valid ADV after a write");
    assert!(after.adv_valid);
});
