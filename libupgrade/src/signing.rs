//! Release signing: key pairs, detached manifest signatures, and verification against a trust dir.
//!
//! This module owns the on-disk formats of keys and signatures and the trust decision a node
//! makes before it stages a release. It uses `ed25519-dalek` (already a workspace dependency)
//! rather than a minisign crate: one well-reviewed primitive, no extra dependency in the node
//! binary, and keys in standard PKCS#8 v1 / SPKI PEM — the formats `openssl genpkey -algorithm
//! ed25519` writes and `openssl pkey` reads (tested against Debian 12's OpenSSL 3.0 in
//! `k3os-ops/tests/cli/release_openssl.rs`), so a publisher can keep their key in existing tooling
//! (HSM export, openssl) and check a signature with `openssl pkeyutl -verify -rawin`.
//!
//! Formats:
//! - secret key `<name>.key`: PKCS#8 v1 PEM (`-----BEGIN PRIVATE KEY-----`), created mode 0600 and
//!   never overwritten.
//! - public key `<name>.pub`: SPKI PEM (`-----BEGIN PUBLIC KEY-----`). A node's trust dir is a
//!   directory of such `*.pub` files; other files in it are ignored.
//! - signature `manifest.json.sig`: a small JSON document
//!   `{"format":1,"algorithm":"ed25519","key_id":"<16 hex>","signature":"<base64>"}` over the
//!   exact bytes of `manifest.json`. The key id (first 8 bytes of sha256 of the raw public key)
//!   only selects the key; trust comes from the signature verifying (`verify_strict`) under a
//!   key found in the trust dir.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use ed25519_dalek::pkcs8::spki::der::zeroize::Zeroizing;
use ed25519_dalek::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, KeypairBytes,
};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Format number of the signature file this module writes and reads.
pub const SIGNATURE_FORMAT: u32 = 1;
/// Extension of public key files in a trust dir.
pub const PUBLIC_KEY_EXT: &str = "pub";
/// Extension of secret key files written by [`generate_keypair`].
pub const SECRET_KEY_EXT: &str = "key";

/// Short identifier of a public key: the first 8 bytes of sha256(raw 32-byte key), in hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub String);

impl KeyId {
    /// The id of `key`.
    pub fn of(key: &VerifyingKey) -> KeyId {
        let digest = Sha256::digest(key.as_bytes());
        KeyId(hex::encode(&digest[..8]))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why signing or verification failed. Every variant names the file or directory involved.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    /// A key or signature file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Generating a key pair would overwrite an existing key file.
    #[error("{path} already exists; refusing to overwrite a key")]
    KeyExists {
        /// The key file that exists.
        path: PathBuf,
    },
    /// The key name given would not make a plain file name (has `/`, is `..`, …).
    #[error("key name '{name}' is not a plain file name")]
    KeyName {
        /// The name as given.
        name: String,
    },
    /// A secret key file is not an ed25519 PKCS#8 PEM key.
    #[error("secret key {path}: {why} (expected an ed25519 PKCS#8 PEM 'PRIVATE KEY')")]
    SecretKey {
        /// The secret key file.
        path: PathBuf,
        /// What the decoder found wrong.
        why: String,
    },
    /// A public key file of the trust dir is not an ed25519 SPKI PEM key.
    #[error("trusted key {path}: {why} (expected an ed25519 SPKI PEM 'PUBLIC KEY')")]
    PublicKey {
        /// The public key file.
        path: PathBuf,
        /// What the decoder found wrong.
        why: String,
    },
    /// The release has no signature file.
    #[error("release is unsigned: no signature to check against trust dir {trust_dir}")]
    Unsigned {
        /// The trust dir it would have been checked against.
        trust_dir: PathBuf,
    },
    /// The signature file is not the JSON document this module writes.
    #[error("malformed signature file (checked against trust dir {trust_dir}): {why}")]
    MalformedSignature {
        /// The trust dir it was checked against.
        trust_dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The trust dir could not be listed.
    #[error("trust dir {trust_dir} cannot be read: {source}")]
    TrustDir {
        /// The trust dir.
        trust_dir: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The trust dir holds no `*.pub` files.
    #[error("trust dir {trust_dir} holds no public keys (*.{PUBLIC_KEY_EXT}): no release can be trusted")]
    EmptyTrustDir {
        /// The trust dir.
        trust_dir: PathBuf,
    },
    /// The signature names a key that is not in the trust dir.
    #[error("release is signed by key {key_id}, which is not trusted: trust dir {trust_dir} holds only {}",
        trusted.iter().map(|k| k.0.as_str()).collect::<Vec<_>>().join(", "))]
    UntrustedKey {
        /// The key id the signature file names.
        key_id: KeyId,
        /// The trust dir searched.
        trust_dir: PathBuf,
        /// The ids of the keys the trust dir does hold.
        trusted: Vec<KeyId>,
    },
    /// The signature does not verify under the trusted key it names.
    #[error("signature by trusted key {key_id} ({key_file}) does not match the manifest: the manifest was altered after signing or the signature is damaged")]
    BadSignature {
        /// The key's id.
        key_id: KeyId,
        /// The trust dir's file holding that key.
        key_file: PathBuf,
    },
}

/// The signature file's JSON shape.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignatureFile {
    format: u32,
    algorithm: String,
    key_id: String,
    signature: String,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SigningError + '_ {
    move |source| SigningError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Create `DIR/NAME.key` (mode 0600) and `DIR/NAME.pub`; `dir` is created if missing.
/// Refuses to overwrite either file.
pub fn generate_keypair(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), SigningError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(SigningError::KeyName {
            name: name.to_string(),
        });
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let secret_path = dir.join(format!("{name}.{SECRET_KEY_EXT}"));
    let public_path = dir.join(format!("{name}.{PUBLIC_KEY_EXT}"));
    for p in [&secret_path, &public_path] {
        if p.symlink_metadata().is_ok() {
            return Err(SigningError::KeyExists { path: p.clone() });
        }
    }
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let secret_pem = secret_key_pem(&key).map_err(|e| SigningError::SecretKey {
        path: secret_path.clone(),
        why: e.to_string(),
    })?;
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .map_err(|e| SigningError::PublicKey {
            path: public_path.clone(),
            why: e.to_string(),
        })?;

    write_new(&secret_path, secret_pem.as_bytes(), 0o600)?;
    if let Err(e) = write_new(&public_path, public_pem.as_bytes(), 0o644) {
        let _ = fs::remove_file(&secret_path);
        return Err(e);
    }
    Ok((secret_path, public_path))
}

/// The secret key as PKCS#8 **v1** PEM (RFC 8410 `PrivateKeyInfo`, no embedded public key).
///
/// `SigningKey::to_pkcs8_pem` writes PKCS#8 v2 (`OneAsymmetricKey` with the public key), which
/// OpenSSL 3.0 (Debian 12) refuses with "unsupported"; v1 is what `openssl genpkey -algorithm
/// ed25519` writes and what every tool reads. The public key is derived from the seed anyway.
fn secret_key_pem(key: &SigningKey) -> Result<Zeroizing<String>, ed25519_dalek::pkcs8::Error> {
    let v1 = KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    v1.to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
}

/// Create a new file (never overwrite) with `mode`, write and fsync it.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), SigningError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                SigningError::KeyExists {
                    path: path.to_path_buf(),
                }
            } else {
                SigningError::Io {
                    path: path.to_path_buf(),
                    source: e,
                }
            }
        })?;
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// Load an ed25519 secret key from a PKCS#8 PEM file.
pub fn load_secret_key(path: &Path) -> Result<SigningKey, SigningError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| SigningError::SecretKey {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// Load an ed25519 public key from an SPKI PEM file.
pub fn load_public_key(path: &Path) -> Result<VerifyingKey, SigningError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| SigningError::PublicKey {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// Sign `manifest_bytes` with the secret key at `secret_key`; returns the signature file's bytes.
pub fn sign(manifest_bytes: &[u8], secret_key: &Path) -> Result<Vec<u8>, SigningError> {
    let key = load_secret_key(secret_key)?;
    Ok(sign_with(manifest_bytes, &key))
}

/// Sign with an already loaded key.
pub fn sign_with(manifest_bytes: &[u8], key: &SigningKey) -> Vec<u8> {
    let sig: Signature = key.sign(manifest_bytes);
    let file = SignatureFile {
        format: SIGNATURE_FORMAT,
        algorithm: "ed25519".into(),
        key_id: KeyId::of(&key.verifying_key()).0,
        signature: base64::engine::general_purpose::STANDARD.encode(sig.to_bytes()),
    };
    let mut out = serde_json::to_vec_pretty(&file).expect("signature serializes");
    out.push(b'\n');
    out
}

/// The public keys of a trust dir, with their files, sorted by file name.
pub fn trusted_keys(trust_dir: &Path) -> Result<Vec<(KeyId, PathBuf, VerifyingKey)>, SigningError> {
    let rd = fs::read_dir(trust_dir).map_err(|source| SigningError::TrustDir {
        trust_dir: trust_dir.to_path_buf(),
        source,
    })?;
    let mut paths = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|source| SigningError::TrustDir {
            trust_dir: trust_dir.to_path_buf(),
            source,
        })?;
        let p = entry.path();
        if p.extension().and_then(|e| e.to_str()) == Some(PUBLIC_KEY_EXT) && p.is_file() {
            paths.push(p);
        }
    }
    paths.sort();
    let mut keys = Vec::with_capacity(paths.len());
    let mut first_bad = None;
    for p in paths {
        match load_public_key(&p) {
            Ok(k) => keys.push((KeyId::of(&k), p, k)),
            // One bad file (empty, garbage, a half-copied key) must not block every update
            // while good keys remain: reported and skipped. With no good key left, the first
            // bad file's error says what is wrong.
            Err(e) => {
                log::warn!("trust dir: skipping {}: {e}", p.display());
                first_bad.get_or_insert(e);
            }
        }
    }
    match first_bad {
        Some(e) if keys.is_empty() => Err(e),
        _ => Ok(keys),
    }
}

/// Check the detached signature `sig_file` over `manifest_bytes` against the keys in `trust_dir`.
///
/// Pass an empty `sig_file` when the release has no signature file: that is reported as
/// [`SigningError::Unsigned`]. Returns the id of the trusted key that made the signature.
pub fn verify(
    manifest_bytes: &[u8],
    sig_file: &[u8],
    trust_dir: &Path,
) -> Result<KeyId, SigningError> {
    // Read the trust dir first: a node with no keys must say so whatever the release looks like.
    let keys = trusted_keys(trust_dir)?;
    if keys.is_empty() {
        return Err(SigningError::EmptyTrustDir {
            trust_dir: trust_dir.to_path_buf(),
        });
    }
    if sig_file.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(SigningError::Unsigned {
            trust_dir: trust_dir.to_path_buf(),
        });
    }
    let malformed = |why: String| SigningError::MalformedSignature {
        trust_dir: trust_dir.to_path_buf(),
        why,
    };
    let parsed: SignatureFile = serde_json::from_slice(sig_file).map_err(|e| {
        malformed(format!(
            "not a format {SIGNATURE_FORMAT} signature document: {e}"
        ))
    })?;
    if parsed.format != SIGNATURE_FORMAT {
        return Err(malformed(format!(
            "format {} is not supported (expected {SIGNATURE_FORMAT})",
            parsed.format
        )));
    }
    if parsed.algorithm != "ed25519" {
        return Err(malformed(format!(
            "algorithm '{}' is not supported (expected ed25519)",
            parsed.algorithm
        )));
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(parsed.signature.trim())
        .map_err(|e| malformed(format!("signature is not base64: {e}")))?;
    let raw: [u8; 64] = raw
        .as_slice()
        .try_into()
        .map_err(|_| malformed(format!("signature is {} bytes, expected 64", raw.len())))?;
    let signature = Signature::from_bytes(&raw);
    let key_id = KeyId(parsed.key_id.to_ascii_lowercase());

    let Some((id, file, key)) = keys.iter().find(|(id, _, _)| *id == key_id) else {
        return Err(SigningError::UntrustedKey {
            key_id,
            trust_dir: trust_dir.to_path_buf(),
            trusted: keys.into_iter().map(|(id, _, _)| id).collect(),
        });
    };
    key.verify_strict(manifest_bytes, &signature)
        .map_err(|_| SigningError::BadSignature {
            key_id: id.clone(),
            key_file: file.clone(),
        })?;
    Ok(id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const MANIFEST: &[u8] = b"{\n  \"format\": 1,\n  \"version\": \"v1\"\n}\n";

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let (sk, pk) = generate_keypair(&t.path().join("keys"), "release").unwrap();
        let trust = t.path().join("trust");
        fs::create_dir(&trust).unwrap();
        fs::copy(&pk, trust.join("release.pub")).unwrap();
        (t, sk, trust)
    }

    #[test]
    fn a_bad_file_in_the_trust_dir_is_skipped_while_good_keys_remain() {
        let (_t, sk, trust) = setup();
        let sig = sign(MANIFEST, &sk).unwrap();
        fs::write(trust.join("empty.pub"), b"").unwrap();
        fs::write(trust.join("garbage.pub"), [0xff, 0xfe, 0x00, 0x01]).unwrap();
        verify(MANIFEST, &sig, &trust).expect("the good key still verifies");
        fs::remove_file(trust.join("release.pub")).unwrap();
        let e = verify(MANIFEST, &sig, &trust).unwrap_err().to_string();
        assert!(
            e.contains("empty.pub"),
            "with no good key the bad file is named: {e}"
        );
    }

    #[test]
    fn keygen_modes_and_no_overwrite() {
        let t = tempfile::tempdir().unwrap();
        let (sk, pk) = generate_keypair(t.path(), "k").unwrap();
        assert_eq!(
            fs::metadata(&sk).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(fs::read_to_string(&sk)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(fs::read_to_string(&pk)
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----"));
        let before = fs::read(&sk).unwrap();
        let e = generate_keypair(t.path(), "k").unwrap_err();
        assert!(matches!(e, SigningError::KeyExists { .. }), "{e}");
        assert_eq!(fs::read(&sk).unwrap(), before);
        assert!(matches!(
            generate_keypair(t.path(), "../x"),
            Err(SigningError::KeyName { .. })
        ));
    }

    #[test]
    fn sign_then_verify() {
        let (_t, sk, trust) = setup();
        let sig = sign(MANIFEST, &sk).unwrap();
        let id = verify(MANIFEST, &sig, &trust).unwrap();
        assert_eq!(
            id,
            KeyId::of(&load_secret_key(&sk).unwrap().verifying_key())
        );
        assert_eq!(id.0.len(), 16);
    }

    #[test]
    fn tampered_manifest_refused() {
        let (_t, sk, trust) = setup();
        let sig = sign(MANIFEST, &sk).unwrap();
        for i in 0..MANIFEST.len() {
            let mut m = MANIFEST.to_vec();
            m[i] ^= 0x01;
            let e = verify(&m, &sig, &trust).unwrap_err();
            assert!(
                matches!(e, SigningError::BadSignature { .. }),
                "byte {i}: {e}"
            );
            assert!(e.to_string().contains("altered"), "{e}");
        }
    }

    #[test]
    fn damaged_signature_refused() {
        let (_t, sk, trust) = setup();
        let sig = sign(MANIFEST, &sk).unwrap();
        let doc: SignatureFile = serde_json::from_slice(&sig).unwrap();
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&doc.signature)
            .unwrap();
        raw[10] ^= 0x80;
        let bad = SignatureFile {
            signature: base64::engine::general_purpose::STANDARD.encode(&raw),
            ..doc
        };
        let e = verify(MANIFEST, &serde_json::to_vec(&bad).unwrap(), &trust).unwrap_err();
        assert!(matches!(e, SigningError::BadSignature { .. }), "{e}");
    }

    #[test]
    fn wrong_key_refused_naming_trust_dir_and_keys() {
        let (t, _sk, trust) = setup();
        let (other_sk, _) = generate_keypair(&t.path().join("other"), "evil").unwrap();
        let sig = sign(MANIFEST, &other_sk).unwrap();
        let e = verify(MANIFEST, &sig, &trust).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, SigningError::UntrustedKey { .. }), "{msg}");
        assert!(msg.contains(&trust.display().to_string()), "{msg}");
        let other_id = KeyId::of(&load_secret_key(&other_sk).unwrap().verifying_key());
        assert!(msg.contains(&other_id.0), "{msg}");
    }

    #[test]
    fn forged_key_id_still_refused() {
        // A signature by an untrusted key that claims a trusted key's id must not verify.
        let (t, sk, trust) = setup();
        let (other_sk, _) = generate_keypair(&t.path().join("other"), "evil").unwrap();
        let sig = sign(MANIFEST, &other_sk).unwrap();
        let mut doc: SignatureFile = serde_json::from_slice(&sig).unwrap();
        doc.key_id = KeyId::of(&load_secret_key(&sk).unwrap().verifying_key()).0;
        let e = verify(MANIFEST, &serde_json::to_vec(&doc).unwrap(), &trust).unwrap_err();
        assert!(matches!(e, SigningError::BadSignature { .. }), "{e}");
    }

    #[test]
    fn empty_or_missing_trust_dir_refused() {
        let (t, sk, _trust) = setup();
        let sig = sign(MANIFEST, &sk).unwrap();
        let empty = t.path().join("empty");
        fs::create_dir(&empty).unwrap();
        fs::write(empty.join("README"), "not a key").unwrap();
        let e = verify(MANIFEST, &sig, &empty).unwrap_err();
        assert!(matches!(e, SigningError::EmptyTrustDir { .. }), "{e}");
        assert!(e.to_string().contains(&empty.display().to_string()));

        let missing = t.path().join("nope");
        let e = verify(MANIFEST, &sig, &missing).unwrap_err();
        assert!(matches!(e, SigningError::TrustDir { .. }), "{e}");
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn unsigned_and_malformed_refused() {
        let (_t, _sk, trust) = setup();
        let e = verify(MANIFEST, b"", &trust).unwrap_err();
        assert!(matches!(e, SigningError::Unsigned { .. }), "{e}");
        assert!(e.to_string().contains("unsigned"), "{e}");
        for junk in [
            &b"garbage"[..],
            b"{\"format\":1}",
            b"{\"format\":2,\"algorithm\":\"ed25519\",\"key_id\":\"00\",\"signature\":\"\"}",
        ] {
            let e = verify(MANIFEST, junk, &trust).unwrap_err();
            assert!(matches!(e, SigningError::MalformedSignature { .. }), "{e}");
            assert!(e.to_string().contains(&trust.display().to_string()), "{e}");
        }
        let short = br#"{"format":1,"algorithm":"ed25519","key_id":"00","signature":"AAAA"}"#;
        let e = verify(MANIFEST, short, &trust).unwrap_err();
        assert!(e.to_string().contains("expected 64"), "{e}");
    }

    #[test]
    fn any_trusted_key_verifies_for_key_rotation() {
        let (t, old_sk, trust) = setup();
        let (new_sk, new_pk) = generate_keypair(&t.path().join("new"), "next").unwrap();
        fs::copy(&new_pk, trust.join("next.pub")).unwrap();
        let a = verify(MANIFEST, &sign(MANIFEST, &old_sk).unwrap(), &trust).unwrap();
        let b = verify(MANIFEST, &sign(MANIFEST, &new_sk).unwrap(), &trust).unwrap();
        assert_ne!(a, b);
        assert_eq!(b, KeyId::of(&load_public_key(&new_pk).unwrap()));
        // Retiring the old key: its releases are refused from then on.
        fs::remove_file(trust.join("release.pub")).unwrap();
        let e = verify(MANIFEST, &sign(MANIFEST, &old_sk).unwrap(), &trust).unwrap_err();
        assert!(matches!(e, SigningError::UntrustedKey { .. }), "{e}");
    }

    #[test]
    fn broken_key_in_trust_dir_named() {
        // The only key is broken (with a good key beside it, it is skipped: see
        // a_bad_file_in_the_trust_dir_is_skipped_while_good_keys_remain).
        let (_t, sk, trust) = setup();
        fs::remove_file(trust.join("release.pub")).unwrap();
        fs::write(
            trust.join("broken.pub"),
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
        )
        .unwrap();
        let sig = sign(MANIFEST, &sk).unwrap();
        let e = verify(MANIFEST, &sig, &trust).unwrap_err();
        assert!(matches!(e, SigningError::PublicKey { .. }), "{e}");
        assert!(e.to_string().contains("broken.pub"), "{e}");
    }

    #[test]
    fn openssl_style_keys_interoperate() {
        // The secret PEM decodes back into the same key and the public PEM matches it.
        let t = tempfile::tempdir().unwrap();
        let (sk, pk) = generate_keypair(t.path(), "a").unwrap();
        let s = load_secret_key(&sk).unwrap();
        let p = load_public_key(&pk).unwrap();
        assert_eq!(s.verifying_key(), p);
        let e = load_secret_key(&pk).unwrap_err();
        assert!(e.to_string().contains("a.pub"), "{e}");
    }
}
