//! `fleet_report::open_bundle`, what the collector runs on every failure bundle a node sends:
//! the input as a whole envelope, and as the body of an envelope the fixture key sealed (so
//! the inflate and JSON reader behind the signature are reached too).
//!
//! Asserts: an opened bundle came in at most `MAX_BUNDLE_BYTES`, is the fixture node's, keeps
//! every limit `Bundle::check` names, and seals again into an envelope that opens to the same
//! bundle but for what sealing cut to fit (the same fields and sections, each section's text
//! a tail of the one opened).
#![no_main]

use ed25519_dalek::SigningKey;
use fleet_report::{open_bundle, seal_body_for_fuzzing, NodeId, MAX_BUNDLE_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
    let sealed = seal_body_for_fuzzing(&key, data);
    for input in [data, &sealed[..]] {
        if let Ok(o) = open_bundle(input) {
            assert!(input.len() <= MAX_BUNDLE_BYTES);
            assert_eq!(o.bundle.node, NodeId::of(&key.verifying_key()));
            assert!(o.bundle.check().is_ok());
            let again = o.bundle.seal(&key).expect("an opened bundle seals again");
            let back = open_bundle(&again).expect("and opens").bundle;
            assert_eq!((&back.why, &back.version, back.attempt), (&o.bundle.why, &o.bundle.version, o.bundle.attempt));
            assert_eq!(back.sections.len(), o.bundle.sections.len());
            for (b, s) in back.sections.iter().zip(&o.bundle.sections) {
                assert!(s.text.ends_with(&b.text) && b.name == s.name);
            }
        }
    }
});
