//! The signature file parser and check of `libupgrade::signing::verify`, against a trust dir
//! holding one fixed key.
//!
//! Input: `manifest SEP manifest.json.sig` (an empty manifest part means the fixed manifest the
//! seeds' signature was made over). Asserts: verify never accepts anything but the fixed
//! manifest with the one signature the key made over it (the seeds hold that pair, so the
//! fuzzer starts next to the accepting path), and never panics on any signature file.
#![no_main]

use std::sync::OnceLock;

use base64::Engine;
use ed25519_dalek::pkcs8::EncodePublicKey;
use ed25519_dalek::SigningKey;
use k3os_fuzz::split_files;
use libfuzzer_sys::fuzz_target;
use libupgrade::signing::{sign_with, verify};

struct Fixture {
    _dir: tempfile::TempDir,
    trust: std::path::PathBuf,
    signature: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let key = SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
        let dir = tempfile::tempdir().unwrap();
        let trust = dir.path().join("trust");
        std::fs::create_dir(&trust).unwrap();
        let pem = key
            .verifying_key()
            .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .unwrap();
        std::fs::write(trust.join("release.pub"), pem).unwrap();
        let file: serde_json::Value =
            serde_json::from_slice(&sign_with(k3os_fuzz::SIGNED_MANIFEST, &key)).unwrap();
        let signature = base64::engine::general_purpose::STANDARD
            .decode(file["signature"].as_str().unwrap())
            .unwrap();
        Fixture {
            _dir: dir,
            trust,
            signature,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let parts = split_files(data, 2);
    let manifest = parts[0].unwrap_or(k3os_fuzz::SIGNED_MANIFEST);
    let sig = parts[1].unwrap_or_default();
    if verify(manifest, sig, &f.trust).is_ok() {
        assert_eq!(
            manifest,
            k3os_fuzz::SIGNED_MANIFEST,
            "accepted another manifest"
        );
        let file: serde_json::Value = serde_json::from_slice(sig).unwrap();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(file["signature"].as_str().unwrap().trim())
            .unwrap();
        assert_eq!(raw, f.signature, "accepted another signature");
    }
});
