//! The release keys are the formats the common tools use, checked with the real tool (Debian's
//! `openssl`, installed by scripts/setup.sh): `openssl pkey` reads what `release keygen` writes
//! and derives the same public key; `openssl pkeyutl -verify -rawin` accepts a manifest
//! signature made by `release create`; and a key made by `openssl genpkey -algorithm ed25519`
//! signs a release that `release verify` accepts.

use k3os_ops_testing::release as release_support;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use base64::Engine;
use release_support::{bin, fake_inputs};

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (is openssl installed? scripts/setup.sh does)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn k3os_ops(args: &[&str]) -> Output {
    run(Command::new(bin()).args(args))
}

fn create_release(keyfile: &Path, work: &Path, out: &Path) {
    let (r, k, i) = fake_inputs(&work.join("in"), "v1");
    k3os_ops(&[
        "release",
        "create",
        "--rootfs",
        r.to_str().unwrap(),
        "--kernel",
        k.to_str().unwrap(),
        "--initrd",
        i.to_str().unwrap(),
        "--version",
        "v1",
        "--arch",
        "x86_64",
        "--generation",
        "1",
        "--key",
        keyfile.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
}

#[test]
fn openssl_reads_keygen_keys_and_verifies_our_signatures() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys");
    k3os_ops(&["release", "keygen", "-o", keys.to_str().unwrap()]);
    let secret = keys.join("release.key");
    let public = keys.join("release.pub");

    // openssl parses the secret key and derives exactly our public key file.
    let derived = run(Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&secret));
    assert_eq!(
        String::from_utf8_lossy(&derived.stdout),
        fs::read_to_string(&public).unwrap(),
        "openssl derives another public key from release.key"
    );
    run(Command::new("openssl")
        .args(["pkey", "-pubin", "-noout", "-in"])
        .arg(&public));

    // A signature made by `release create` verifies with openssl over manifest.json's bytes.
    let rel = tmp.path().join("rel");
    create_release(&secret, tmp.path(), &rel);
    let sig: serde_json::Value =
        serde_json::from_slice(&fs::read(rel.join("manifest.json.sig")).unwrap()).unwrap();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(sig["signature"].as_str().unwrap())
        .unwrap();
    let raw_path = tmp.path().join("sig.raw");
    fs::write(&raw_path, raw).unwrap();
    let out = run(Command::new("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey"])
        .arg(&public)
        .arg("-in")
        .arg(rel.join("manifest.json"))
        .arg("-sigfile")
        .arg(&raw_path));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Signature Verified Successfully"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_key_from_openssl_genpkey_signs_releases() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("ossl.key");
    run(Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&secret));
    let trust = tmp.path().join("trust");
    fs::create_dir_all(&trust).unwrap();
    run(Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&secret)
        .arg("-out")
        .arg(trust.join("ossl.pub")));

    let rel = tmp.path().join("rel");
    create_release(&secret, tmp.path(), &rel);
    let out = k3os_ops(&[
        "release",
        "verify",
        rel.to_str().unwrap(),
        "--trust-dir",
        trust.to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("signed by trusted key"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
