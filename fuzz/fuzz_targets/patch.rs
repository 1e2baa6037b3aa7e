//! `patch::read_header` and `patch::apply`, what a node runs on a per-pair patch from a
//! release server (after its sha256 matched the signed manifest, so this is the parser's
//! second line of defence).
//!
//! The input's base fields (sha256 and size, header bytes 19..59) are overwritten with the
//! fixed base's, so mutations reach the ops instead of stopping at the base check. Asserts:
//! no panic; nothing emitted past the header's target size, and the total never exceeds it;
//! an accepted patch emitted exactly the target's size with its sha256; an error names an op
//! or the header; a patch whose header does not parse emits nothing. Then `patch::apply_needed`
//! (a resumed stage) on the same input, wanting only the ranges an input byte picks: pieces
//! come at increasing offsets inside the target, and a patch `apply` accepted is accepted with
//! every byte emitted or skipped exactly once.
#![no_main]

use std::io::Write;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use libupgrade::patch::{self, PatchError};
use sha2::{Digest, Sha256};

fn base() -> &'static (tempfile::NamedTempFile, [u8; 32], u64) {
    static BASE: OnceLock<(tempfile::NamedTempFile, [u8; 32], u64)> = OnceLock::new();
    BASE.get_or_init(|| {
        let b = k3os_fuzz::patch_base();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&b).unwrap();
        (f, Sha256::digest(&b).into(), b.len() as u64)
    })
}

fuzz_target!(|data: &[u8]| {
    let (file, sha, size) = base();
    let mut p = data.to_vec();
    if p.len() >= 59 {
        p[19..51].copy_from_slice(sha);
        p[51..59].copy_from_slice(&size.to_le_bytes());
    }
    let header = patch::read_header(&mut &p[..]);
    let f = std::fs::File::open(file.path()).unwrap();
    let mut emitted = 0u64;
    let mut hash = Sha256::new();
    let res = patch::apply(&mut &p[..], patch::Base::whole(&f).unwrap(), &mut |b: &[u8]| {
        emitted += b.len() as u64;
        hash.update(b);
        Ok(())
    });
    let Ok(h) = header else {
        assert!(res.is_err());
        assert_eq!(emitted, 0, "emitted without a header");
        return;
    };
    assert!(emitted <= h.target_size, "emitted {emitted} past {}", h.target_size);
    let accepted = res.is_ok();
    match res {
        Ok(st) => {
            assert_eq!(st.bytes, h.target_size);
            assert_eq!(<[u8; 32]>::from(hash.finalize()), h.target_sha256);
        }
        Err(PatchError::Compressor { .. } | PatchError::WrongBase { .. } | PatchError::Header(_)) => {
            assert_eq!(emitted, 0, "emitted before a refusal");
        }
        Err(_) => {}
    }
    // A resumed apply wanting the 4 KiB pages whose index the last input byte's bits pick.
    let pick = data.last().copied().unwrap_or(0);
    let needed = |r: std::ops::Range<u64>| {
        let (first, end) = (r.start / 4096, r.end.div_ceil(4096));
        // Eight pages or more meet every bit; fewer are looked at one by one (a Copy op may
        // claim 2^60 bytes).
        (first..end.min(first + 8)).any(|page| pick >> (page % 8) & 1 == 1)
    };
    let mut next = 0u64;
    let mut total = 0u64;
    let res = patch::apply_needed(
        &mut &p[..],
        patch::Base::whole(&f).unwrap(),
        &needed,
        &mut |at: u64, b: &[u8]| {
            assert!(at >= next, "piece at {at} before {next}");
            assert!(at + b.len() as u64 <= h.target_size, "piece past the target");
            next = at + b.len() as u64;
            total += b.len() as u64;
            Ok(())
        },
    );
    if accepted {
        let st = res.expect("what apply accepts, a resumed apply accepts");
        assert_eq!(st.bytes, h.target_size);
        assert_eq!(total + st.skipped_bytes, h.target_size);
    }
});
