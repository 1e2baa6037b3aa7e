//! The Secure Boot pieces of the signed x86_64 UEFI path (docs/design/trust.md, "Secure
//! Boot"): the test `db` key and certificate, each slot's unified kernel image (UKI) and the
//! OVMF variable store with that certificate enrolled.
//!
//! - Key: an RSA-2048 key and a self-signed X.509 certificate made by `openssl req` in
//!   `images/out/keys/secure-boot/` (beside the release key; never committed). Kept while it
//!   exists, like the release key.
//! - UKI: systemd's EFI stub (Debian 12 `systemd-boot-efi`, systemd 252, which has no `ukify`)
//!   with `.osrel`, `.cmdline`, `.linux` and `.initrd` added by `objcopy` (binutils), each
//!   section placed after the stub's image at the stub's section alignment ([`layout`], a pure
//!   function of the stub's PE header). Signed for the firmware by `sbsign` and checked by
//!   `sbverify` (Debian `sbsigntool`): an Authenticode signer of our own would have to be
//!   tested against sbverify anyway, and these tools are what distributions sign with.
//! - Variable store: PyPI `virt-firmware`'s `virt-fw-vars` writes the certificate into PK,
//!   KEK and db of a copy of Debian's `OVMF_VARS_4M.fd` and turns Secure Boot on (no Microsoft
//!   keys: the test firmware trusts only the test publisher).

use std::fs;
use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian as LE};

use crate::error::{Error, IoContext, Result};
use crate::run::Cmd;

/// systemd's x86_64 UEFI stub (Debian 12 `systemd-boot-efi`).
pub const STUB_X64: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
/// The pristine OVMF variable store the enrolled one is made from.
pub const OVMF_VARS_TEMPLATE: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// OVMF built with Secure Boot (needs `-M q35,smm=on` and a secure pflash).
pub const OVMF_CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
/// Directory of the test `db` key under `images/out/keys/`.
pub const KEY_DIR: &str = "secure-boot";
/// Owner GUID of the test certificate's PK, KEK and db entries (fixed: any GUID works; a fixed
/// one keeps the variable store reproducible).
pub const OWNER_GUID: &str = "6b3f5d2a-1f0e-4d8c-9a3b-7c2e5f4a1b00";
/// Subject of the test certificate.
pub const SUBJECT: &str = "/CN=k3os test publisher Secure Boot db/";

/// A Secure Boot signing key: PEM private key and PEM certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SbKey {
    pub key: PathBuf,
    pub cert: PathBuf,
}

impl SbKey {
    /// The key pair's files in `dir` (made or not).
    pub fn in_dir(dir: &Path) -> SbKey {
        SbKey {
            key: dir.join("db.key"),
            cert: dir.join("db.crt"),
        }
    }
}

/// The test `db` key in `<keys>/secure-boot/`, made once with `openssl req` (kept while both
/// files exist; delete them to make a new one, and every UKI and variable store is then
/// rebuilt: their fingerprints hold the certificate).
pub fn ensure_key(keys: &Path) -> Result<SbKey> {
    let dir = keys.join(KEY_DIR);
    let k = SbKey::in_dir(&dir);
    if k.key.is_file() && k.cert.is_file() {
        return Ok(k);
    }
    fs::create_dir_all(&dir).ctx("create directory", &dir)?;
    Cmd::new("openssl")
        .args(["req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes"])
        .args(["-days", "3650", "-sha256", "-subj", SUBJECT, "-keyout"])
        .arg(&k.key)
        .arg("-out")
        .arg(&k.cert)
        .run()?;
    Ok(k)
}

/// What [`layout`] needs of the stub's PE32+ header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeImage {
    pub image_base: u64,
    pub size_of_image: u64,
    pub section_alignment: u64,
}

/// Read the PE32+ optional header of an EFI binary.
pub fn pe_image(bytes: &[u8]) -> std::result::Result<PeImage, String> {
    let at = |off: usize, len: usize| {
        bytes
            .get(off..off + len)
            .ok_or_else(|| format!("{} bytes: too short for a PE header", bytes.len()))
    };
    if at(0, 2)? != b"MZ" {
        return Err("no MZ signature: not a PE/EFI binary".into());
    }
    let pe = LE::read_u32(at(0x3c, 4)?) as usize;
    if at(pe, 4)? != b"PE\0\0" {
        return Err(format!("no PE signature at offset {pe:#x}"));
    }
    let opt = pe + 24;
    let magic = LE::read_u16(at(opt, 2)?);
    if magic != 0x20b {
        return Err(format!(
            "optional header magic {magic:#x}, expected 0x20b (PE32+)"
        ));
    }
    Ok(PeImage {
        image_base: LE::read_u64(at(opt + 24, 8)?),
        section_alignment: u64::from(LE::read_u32(at(opt + 32, 4)?)),
        size_of_image: u64::from(LE::read_u32(at(opt + 56, 4)?)),
    })
}

/// Where each added section goes: one after the other, past the stub's image, each at a
/// multiple of the stub's section alignment (at least a page). Returns `(name, vma)`.
pub fn layout(stub: &PeImage, sections: &[(&'static str, u64)]) -> Vec<(&'static str, u64)> {
    let align = stub.section_alignment.max(4096);
    let up = |x: u64| x.div_ceil(align) * align;
    let mut next = up(stub.image_base + stub.size_of_image);
    let mut out = Vec::new();
    for (name, size) in sections {
        out.push((*name, next));
        next = up(next + size.max(&1));
    }
    out
}

/// The contents of one UKI.
#[derive(Debug, Clone)]
pub struct UkiParts<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    /// The whole kernel command line (under Secure Boot the stub ignores any other).
    pub cmdline: &'a str,
    /// os-release text (`.osrel`).
    pub os_release: &'a str,
}

/// `os-release` of a test release's UKI.
pub fn os_release(version: &str) -> String {
    format!("NAME=k3OS\nID=k3os\nVERSION_ID={version}\nPRETTY_NAME=\"k3OS {version}\"\n")
}

/// Build the unsigned UKI `out` from `stub` and `parts` (`work`: scratch directory).
pub fn build_uki(stub: &Path, parts: &UkiParts, out: &Path, work: &Path) -> Result<()> {
    let stub_bytes = fs::read(stub).ctx("read", stub)?;
    let pe = pe_image(&stub_bytes).map_err(|what| Error::Input {
        path: stub.to_path_buf(),
        what,
    })?;
    fs::create_dir_all(work).ctx("create directory", work)?;
    let osrel = work.join("osrel");
    let cmdline = work.join("cmdline");
    fs::write(&osrel, parts.os_release).ctx("write", &osrel)?;
    fs::write(&cmdline, parts.cmdline).ctx("write", &cmdline)?;
    let files: [(&'static str, &Path); 4] = [
        (".osrel", &osrel),
        (".cmdline", &cmdline),
        (".linux", parts.kernel),
        (".initrd", parts.initrd),
    ];
    let mut sizes = Vec::new();
    for (name, f) in files {
        sizes.push((name, fs::metadata(f).ctx("stat", f)?.len()));
    }
    let mut cmd = Cmd::new("objcopy");
    for ((name, vma), (_, file)) in layout(&pe, &sizes).into_iter().zip(files) {
        cmd = cmd
            .arg("--add-section")
            .arg(format!("{name}={}", file.display()))
            .arg("--change-section-vma")
            .arg(format!("{name}={vma:#x}"));
    }
    cmd.arg(stub).arg(out).run()?;
    Ok(())
}

/// Sign `unsigned` with `key` into `out` (`sbsign`), then check it (`sbverify`).
pub fn sign(key: &SbKey, unsigned: &Path, out: &Path) -> Result<()> {
    Cmd::new("sbsign")
        .arg("--key")
        .arg(&key.key)
        .arg("--cert")
        .arg(&key.cert)
        .arg("--output")
        .arg(out)
        .arg(unsigned)
        .run()?;
    verify(&key.cert, out)
}

/// `sbverify --cert`: `file` carries a valid signature by `cert`'s key.
pub fn verify(cert: &Path, file: &Path) -> Result<()> {
    Cmd::new("sbverify")
        .arg("--cert")
        .arg(cert)
        .arg(file)
        .run()
        .map(drop)
}

/// A copy of `template` (an OVMF variable store) with `cert` as PK, KEK and db and Secure
/// Boot on, written to `out` (`virt-fw-vars`).
pub fn enrolled_vars(template: &Path, cert: &Path, out: &Path) -> Result<()> {
    Cmd::new("virt-fw-vars")
        .arg("--input")
        .arg(template)
        .arg("--set-pk")
        .arg(OWNER_GUID)
        .arg(cert)
        .arg("--add-kek")
        .arg(OWNER_GUID)
        .arg(cert)
        .arg("--add-db")
        .arg(OWNER_GUID)
        .arg(cert)
        .args(["--no-microsoft", "--sb", "--output"])
        .arg(out)
        .run()
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pe_bytes(base: u64, align: u32, size: u32) -> Vec<u8> {
        let mut b = vec![0u8; 0x200];
        b[..2].copy_from_slice(b"MZ");
        LE::write_u32(&mut b[0x3c..], 0x80);
        b[0x80..0x84].copy_from_slice(b"PE\0\0");
        let opt = 0x80 + 24;
        LE::write_u16(&mut b[opt..], 0x20b);
        LE::write_u64(&mut b[opt + 24..], base);
        LE::write_u32(&mut b[opt + 32..], align);
        LE::write_u32(&mut b[opt + 56..], size);
        b
    }

    #[test]
    fn reads_the_pe32_plus_header() {
        let pe = pe_image(&pe_bytes(0, 0x200, 0x19300)).unwrap();
        assert_eq!(
            pe,
            PeImage {
                image_base: 0,
                size_of_image: 0x19300,
                section_alignment: 0x200
            }
        );
        let mut pe32 = pe_bytes(0, 0x200, 0x1000);
        LE::write_u16(&mut pe32[0x80 + 24..], 0x10b);
        assert!(pe_image(&pe32).unwrap_err().contains("PE32+"));
        assert!(pe_image(b"MZ").unwrap_err().contains("too short"));
        assert!(pe_image(&[0u8; 0x200]).unwrap_err().contains("MZ"));
    }

    #[test]
    fn sections_follow_the_stub_without_overlap() {
        let pe = PeImage {
            image_base: 0,
            size_of_image: 0x19300,
            section_alignment: 0x200,
        };
        let l = layout(
            &pe,
            &[
                (".osrel", 0x20),
                (".cmdline", 0),
                (".linux", 0x7dd7c0),
                (".initrd", 5),
            ],
        );
        assert_eq!(
            l,
            vec![
                (".osrel", 0x1a000),
                (".cmdline", 0x1b000),
                (".linux", 0x1c000),
                (".initrd", 0x7fa000),
            ]
        );
    }

    /// A non-zero image base is part of every address (objcopy takes absolute VMAs), and a
    /// section alignment above a page is kept.
    #[test]
    fn layout_keeps_base_and_large_alignment() {
        let pe = PeImage {
            image_base: 0x1000_0000,
            size_of_image: 0x1,
            section_alignment: 0x10000,
        };
        let l = layout(&pe, &[(".a", 0x10001), (".b", 1)]);
        assert_eq!(l, vec![(".a", 0x1001_0000), (".b", 0x1003_0000)]);
    }
}
