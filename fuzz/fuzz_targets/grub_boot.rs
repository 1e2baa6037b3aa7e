//! GRUB's boot as the node models it (`GrubBootloader::simulate_boot` → `grub::simulate_boot`,
//! behind `read` and `integrity`) on arbitrary env copies, locks and last-good record in a
//! temp dir, under v0.1.0's `grub.cfg` (script 1), today's (script 2), none, or an arbitrary
//! one; then one Rust write transaction and the read back.
//!
//! Input: a config byte (`% 4`: none, v0.1.0's fixture, the rendered current script, the
//! sixth file), an op byte, then `env1 SEP env2 SEP lock1 SEP lock2 SEP good SEP grub.cfg`
//! (an empty part is a missing file). Asserts: `read` is the model's state (refused only when
//! no copy and no last-good record is readable), the state comes from an intact copy when it
//! says so, tries stay within the script's maximum, the slot booted is the state's
//! `next_boot`, a countdown only counts down a slot on trial with tries left and only writes
//! files under the GRUB dir; after a successful `mark_good` / `try_slot` / `mark_bad` the
//! state reads back as the transaction says, from intact, usable copies.
#![no_main]

use std::sync::OnceLock;

use bootconfig::{render_cfg, EnvSource, GrubBootloader, GrubConfig};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use k3os_fuzz::{put, scratch, split_files};
use libfuzzer_sys::fuzz_target;

const V010_CFG: &[u8] = include_bytes!("../../bootconfig/tests/fixtures/v0.1.0/grub.cfg");

fn current_cfg() -> &'static str {
    static CFG: OnceLock<String> = OnceLock::new();
    CFG.get_or_init(|| {
        let e = |s: &str| BootEntry {
            kernel: format!("/{s}/vmlinuz"),
            initrd: format!("/{s}/initrd"),
            cmdline: format!("root=PARTLABEL=rootfs-{s} ro"),
        };
        render_cfg(&GrubConfig {
            entries: [e("a"), e("b")],
            max_tries: 3,
            timeout_secs: 0,
            serial: true,
            panic_secs: 5,
        })
    })
}

fn tries_ok(env: &BootEnv, max: u8) -> bool {
    Slot::ALL.iter().all(|s| match env.get(*s) {
        SlotBoot::Trying { tries_left } => tries_left <= max,
        _ => true,
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (cfg_sel, op) = (data[0] % 4, data[1]);
    let root = scratch();
    let k3os = root.join("k3os");
    std::fs::create_dir(&k3os).unwrap();
    let parts = split_files(&data[2..], 6);
    for (i, name) in ["env1", "env2", "lock1", "lock2", "good"]
        .iter()
        .enumerate()
    {
        put(&k3os.join(name), parts[i]);
    }
    let cfg: Option<&[u8]> = match cfg_sel {
        0 => None,
        1 => Some(V010_CFG),
        2 => Some(current_cfg().as_bytes()),
        _ => parts[5],
    };
    put(&root.join("grub.cfg"), cfg);

    let g = GrubBootloader::new(root, 3);
    let Ok(sim) = g.simulate_boot() else {
        return;
    };
    let max = g.effective_max_tries().max(1);
    if let EnvSource::Copy(n) = sim.source {
        assert!(sim.intact[n as usize - 1], "state from a damaged copy");
    }
    assert!(
        tries_ok(&sim.seen, max),
        "tries above {max}: {:?}",
        sim.seen
    );
    assert_eq!(sim.choice, sim.seen.next_boot());
    if !sim.countdown.is_empty() {
        assert!(matches!(
            sim.seen.get(sim.choice),
            SlotBoot::Trying { tries_left } if (1..=max).contains(&tries_left)
        ));
    }
    for w in &sim.countdown {
        assert!(
            w.path().starts_with(&k3os),
            "countdown writes {:?}",
            w.path()
        );
    }
    // `read` is the model's state, refused only when nothing at all is readable.
    let nothing = sim.source == EnvSource::Nothing && sim.last_good.is_none();
    match g.read() {
        Ok(env) => assert!(
            !nothing && env == sim.seen,
            "read {env:?}, model {:?}",
            sim.seen
        ),
        Err(e) => assert!(nothing, "read refused a readable state: {e}"),
    }
    let _ = g.integrity();

    let slot = if op & 1 == 0 { Slot::A } else { Slot::B };
    let (res, want): (_, fn(&BootEnv, Slot) -> bool) = match (op >> 1) % 4 {
        0 => (g.mark_good(slot), |e, s| {
            e.primary == s && e.get(s) == SlotBoot::Good
        }),
        1 => (g.try_slot(slot, 2), |e, s| {
            e.primary == s && matches!(e.get(s), SlotBoot::Trying { tries_left } if tries_left > 0)
        }),
        2 => (g.mark_bad(slot), |e, s| e.get(s) == SlotBoot::Bad),
        _ => return,
    };
    if res.is_err() {
        return;
    }
    let after = g.simulate_boot().expect("read back what was written");
    assert!(
        want(&after.seen, slot),
        "op {op}: {:?} -> {:?}",
        sim.seen,
        after.seen
    );
    assert!(
        matches!(after.source, EnvSource::Copy(_)),
        "{:?}",
        after.source
    );
    assert_eq!(after.intact, [true, true], "both copies rewritten");
    assert_eq!(after.usable, [true, true], "both copies usable");
    assert!(tries_ok(&after.seen, max));
});
