//! The syslinux ADV (`Adv::load`, `get`, `boot_once`, `set`) on the last 1024 bytes of an
//! arbitrary `ldlinux.sys`.
//!
//! Input: a mode byte, then the bytes. Mode even: the bytes are the raw 1024-byte ADV (both
//! copies, as read from the disk). Mode odd: the bytes are the 500-byte data area of a copy
//! that the target seals with correct magics and checksum into both copies (random mutation
//! almost never keeps a checksum valid, so this reaches the item parser and the editor).
//! Whatever follows the ADV is the value for `set`.
//!
//! Asserts: `load` yields two equal valid copies; every item `get` returns lies inside the
//! data area; `set` produces exactly the bytes of syslinux's own `syslinux_setadv`
//! (libinstaller/setadv.c, transcribed below), and a value it stored is found by `get`.
#![no_main]

use bootconfig::{Adv, ADV_SIZE};
use libfuzzer_sys::fuzz_target;

const ADV_LEN: usize = ADV_SIZE - 12;

/// syslinux 6.04 `syslinux_setadv` on a data area: `None` for EINVAL/ENOSPC.
fn c_setadv(adv: &[u8], tag: u8, data: &[u8]) -> Option<Vec<u8>> {
    if tag == 0 || data.len() > 255 {
        return None;
    }
    let mut t = adv.to_vec();
    let (mut rleft, mut left) = (ADV_LEN, ADV_LEN);
    let mut p = 0;
    while rleft >= 2 {
        let (ptag, plen) = (t[p], t[p + 1] as usize + 2);
        if ptag == 0 {
            break;
        }
        if ptag == tag {
            if plen >= rleft {
                break;
            }
            t.copy_within(p + plen..p + rleft, p);
            rleft -= plen;
        } else {
            if plen > rleft {
                break;
            }
            left -= plen;
            rleft -= plen;
            p += plen;
        }
    }
    if !data.is_empty() {
        if left < data.len() + 2 {
            return None;
        }
        t[p] = tag;
        t[p + 1] = data.len() as u8;
        t[p + 2..p + 2 + data.len()].copy_from_slice(data);
        p += data.len() + 2;
        left -= data.len() + 2;
    }
    t[p..p + left].fill(0);
    Some(t)
}

fn sealed(area: &[u8]) -> [u8; 2 * ADV_SIZE] {
    let mut c = [0u8; ADV_SIZE];
    c[0..4].copy_from_slice(&0x5a2d_2fa5u32.to_le_bytes());
    c[8..8 + ADV_LEN].copy_from_slice(area);
    let word = |c: &[u8], i: usize| u32::from_le_bytes(c[i..i + 4].try_into().unwrap());
    let csum = (8..ADV_SIZE - 4)
        .step_by(4)
        .fold(0xa304_1767u32, |s, i| s.wrapping_sub(word(&c, i)));
    c[4..8].copy_from_slice(&csum.to_le_bytes());
    c[ADV_SIZE - 4..].copy_from_slice(&0xdd28_bf64u32.to_le_bytes());
    let mut raw = [0u8; 2 * ADV_SIZE];
    raw[..ADV_SIZE].copy_from_slice(&c);
    raw[ADV_SIZE..].copy_from_slice(&c);
    raw
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (raw, value) = if mode % 2 == 0 {
        if rest.len() < 2 * ADV_SIZE {
            return;
        }
        let raw: [u8; 2 * ADV_SIZE] = rest[..2 * ADV_SIZE].try_into().unwrap();
        (raw, &rest[2 * ADV_SIZE..])
    } else {
        let mut area = [0u8; ADV_LEN];
        let n = rest.len().min(ADV_LEN);
        area[..n].copy_from_slice(&rest[..n]);
        (sealed(&area), &rest[n..])
    };
    let (adv, valid) = Adv::load(&raw);
    assert_eq!(adv.0[..ADV_SIZE], adv.0[ADV_SIZE..], "both copies equal");
    assert!(Adv::copy_valid(&adv.0[..ADV_SIZE]));
    if valid {
        assert!(
            adv.0[..ADV_SIZE] == raw[..ADV_SIZE] || adv.0[..ADV_SIZE] == raw[ADV_SIZE..],
            "a valid ADV is one of the copies on disk"
        );
    }
    let area = &adv.0[8..8 + ADV_LEN];
    for tag in 1..=255u8 {
        if let Some(d) = adv.get(tag) {
            let start = d.as_ptr() as usize - area.as_ptr() as usize;
            assert!(start + d.len() <= ADV_LEN);
        }
    }
    let _ = adv.boot_once();
    let value = &value[..value.len().min(300)];
    for (tag, v) in [(1u8, value), (1, &b""[..]), (2, value), (1, &b"b"[..])] {
        let mut edited = adv.clone();
        let got = edited
            .set(tag, v)
            .ok()
            .map(|()| edited.0[8..8 + ADV_LEN].to_vec());
        assert_eq!(got, c_setadv(area, tag, v), "set({tag}, {} bytes)", v.len());
        if got.is_some() {
            assert!(Adv::copy_valid(&edited.0[..ADV_SIZE]));
            assert_eq!(edited.0[..ADV_SIZE], edited.0[ADV_SIZE..]);
            assert_eq!(edited.get(tag), (!v.is_empty()).then_some(v));
        }
    }
});
