//! `patch::read_header` and `patch::apply`, what a node runs on a per-pair patch from a
//! release server (after its sha256 matched the signed manifest, so this is the parser's
//! second line of defence).
//!
//! The input's base fields (sha256 and size, header bytes 19..59) are overwritten with the
//! fixed base's, so mutations reach the ops instead of stopping at the base check. Asserts:
//! no panic; nothing emitted past the header's target size, and the total never exceeds it;
//! an accepted patch emitted exactly the target's size with its sha256; an error names an op
//! or the header; a patch whose header does not parse emits nothing.
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
});
