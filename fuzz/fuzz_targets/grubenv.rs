//! `GrubEnv::parse` (strict, Rust's own reader), `grub_load` (GRUB's `load_env`) and
//! `grub_set_in_place` (GRUB's `save_env`) on one arbitrary block.
//!
//! Asserts: a block the strict reader accepts (1) re-serializes to a block that parses to the
//! same variables, (2) is loaded by GRUB's `load_env` / `grub-editenv list` rules with exactly
//! the same variables (the last occurrence of a name winning), nothing broken; (3) GRUB's
//! in-place `save_env` of a variable into a block laid out as `grub-editenv` writes it (when
//! its padding can take the old value) keeps its size and reads back as the strict reader's
//! `set`.
#![no_main]

use bootconfig::{grub_load, grub_set_in_place, GrubEnv, HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let loaded = grub_load(data);
    let Ok(env) = GrubEnv::parse(data) else {
        return;
    };
    // (1) Round trip through the writer.
    let bytes = env
        .to_bytes_sized(data.len() + HEADER.len())
        .expect("a parsed env re-serializes");
    assert_eq!(GrubEnv::parse(&bytes).as_ref(), Ok(&env), "round trip");

    // (2) GRUB sees the same variables.
    let l = loaded.expect("GRUB's load_env accepts what the strict reader accepts");
    assert!(
        !l.broken,
        "GRUB stops early in a block the strict reader accepts"
    );
    let mut last_wins = GrubEnv::new();
    for (k, v) in &l.vars {
        last_wins.set(k.clone(), v.clone());
    }
    assert_eq!(
        last_wins, env,
        "GRUB's variables differ from the strict reader's"
    );

    // (3) save_env in place, on blocks as grub-editenv and our writer lay them out (header,
    // one line per variable, '#' padding), any size, names and values: GRUB's envblk_set
    // finds the free space without regard to escapes and, when the padding cannot take a
    // shorter value's move, leaves stale bytes (and writes past the block), so on other
    // layouts it is not expected to read back. Duplicate names never occur in this layout.
    if env.to_bytes_sized(data.len()).as_deref() == Ok(data) {
        for (name, value) in [("K3OS_A", "try"), ("K3OS_B_TRIES", ""), ("new", "x\\y\nz")] {
            let old = env.get(name).map_or(0, |v| {
                v.len() + v.bytes().filter(|&b| b == b'\\' || b == b'\n').count()
            });
            let pad = data.iter().rev().take_while(|&&b| b == b'#').count();
            let mut buf = data.to_vec();
            if old <= pad && grub_set_in_place(&mut buf, name, value) {
                assert_eq!(buf.len(), data.len());
                let mut want = env.clone();
                want.set(name, value);
                assert_eq!(
                    GrubEnv::parse(&buf).as_ref(),
                    Ok(&want),
                    "save_env of {name}={value:?}"
                );
            }
        }
    }
});
