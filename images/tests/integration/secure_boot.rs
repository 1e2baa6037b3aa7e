//! The signed UEFI path's build pieces with the real tools (openssl, objcopy, systemd's stub,
//! sbsign, sbverify, virt-fw-vars; scripts/setup.sh installs them): a UKI signed with the
//! test key verifies against its certificate only, an unsigned one does not, and the variable
//! store carries the certificate.

use std::fs;
use std::path::Path;
use std::process::Command;

use k3os_images::secboot::{self, SbKey, UkiParts};

fn sbverify_ok(cert: &Path, file: &Path) -> bool {
    Command::new("sbverify")
        .arg("--cert")
        .arg(cert)
        .arg(file)
        .output()
        .expect("sbverify (sbsigntool) must be installed")
        .status
        .success()
}

/// A UKI from the real stub: the sections land after it, hold the given bytes, and the
/// signature verifies against the test certificate only.
#[test]
fn a_signed_uki_verifies_against_its_certificate_only() {
    let t = tempfile::tempdir().unwrap();
    let key = secboot::ensure_key(&t.path().join("keys")).unwrap();
    assert_eq!(key, SbKey::in_dir(&t.path().join("keys/secure-boot")));
    let cert_before = fs::read(&key.cert).unwrap();
    assert_eq!(
        secboot::ensure_key(&t.path().join("keys")).unwrap(),
        key,
        "kept"
    );
    assert_eq!(fs::read(&key.cert).unwrap(), cert_before, "not remade");
    let other = secboot::ensure_key(&t.path().join("other")).unwrap();

    let (kernel, initrd) = (t.path().join("vmlinuz"), t.path().join("initrd"));
    fs::write(&kernel, vec![0x4b; 300_000]).unwrap();
    fs::write(&initrd, vec![0x1d; 70_000]).unwrap();
    let cmdline = "root=PARTLABEL=rootfs-b ro console=ttyS0 k3os.slot=B panic=5";
    let parts = UkiParts {
        kernel: &kernel,
        initrd: &initrd,
        cmdline,
        os_release: &secboot::os_release("v9"),
    };
    let (unsigned, signed) = (t.path().join("u.efi"), t.path().join("s.efi"));
    secboot::build_uki(
        Path::new(secboot::STUB_X64),
        &parts,
        &unsigned,
        &t.path().join("work"),
    )
    .unwrap();
    let bytes = fs::read(&unsigned).unwrap();
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(has(cmdline.as_bytes()), "the command line is in the image");
    assert!(has(b"VERSION_ID=v9"), "os-release is in the image");
    assert!(secboot::pe_image(&bytes).is_ok(), "still a PE32+ image");

    secboot::sign(&key, &unsigned, &signed).unwrap();
    assert!(sbverify_ok(&key.cert, &signed));
    assert!(!sbverify_ok(&key.cert, &unsigned), "unsigned is refused");
    assert!(
        !sbverify_ok(&other.cert, &signed),
        "another key's cert refuses it"
    );
    let e = secboot::verify(&other.cert, &signed)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sbverify"), "{e}");
}

/// The enrolled store holds the certificate (DER) and differs from the template.
#[test]
fn the_enrolled_variable_store_holds_the_certificate() {
    let t = tempfile::tempdir().unwrap();
    let key = secboot::ensure_key(t.path()).unwrap();
    let vars = t.path().join("vars.fd");
    secboot::enrolled_vars(Path::new(secboot::OVMF_VARS_TEMPLATE), &key.cert, &vars).unwrap();
    let der = Command::new("openssl")
        .args(["x509", "-outform", "der", "-in"])
        .arg(&key.cert)
        .output()
        .unwrap();
    assert!(der.status.success());
    let store = fs::read(&vars).unwrap();
    let template = fs::read(secboot::OVMF_VARS_TEMPLATE).unwrap();
    assert_eq!(store.len(), template.len(), "same flash size");
    let n = store
        .windows(der.stdout.len())
        .filter(|w| *w == der.stdout.as_slice())
        .count();
    assert_eq!(n, 3, "the certificate as PK, KEK and db");
}
