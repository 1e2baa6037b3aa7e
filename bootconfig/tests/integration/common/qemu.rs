//! QEMU boot helpers: the Debian amd64 kernel, busybox initramfs images, one BIOS boot.

use std::path::{Path, PathBuf};

use bootconfig::Slot;

use super::{run, run_ok};

pub const PART_OFFSET: u64 = 1 << 20;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The kernel: `K3OS_TEST_KERNEL`, else extracted from the cached Debian package.
pub fn kernel(work: &Path) -> PathBuf {
    if let Ok(k) = std::env::var("K3OS_TEST_KERNEL") {
        return PathBuf::from(k);
    }
    let debs = workspace().join(".cache/debs/x86_64");
    let deb = std::fs::read_dir(&debs)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("linux-image-") && n.contains("amd64") && n.ends_with(".deb")
        })
        .unwrap_or_else(|| {
            panic!(
                "no kernel: set K3OS_TEST_KERNEL or put linux-image-*-amd64*.deb into {} \
                 (apt-get download linux-image-6.1.0-57-amd64)",
                debs.display()
            )
        });
    let x = work.join("kernel");
    std::fs::create_dir_all(&x).unwrap();
    let tar = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*'",
            deb.display(),
            x.display()
        ))
        .status()
        .unwrap();
    assert!(
        tar.success(),
        "extracting the kernel from {} failed",
        deb.display()
    );
    let boot = x.join("boot");
    std::fs::read_dir(&boot)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// A gzip'd newc initramfs: busybox and an /init that prints the command line, then reboots
/// (`panic`: exits instead, so the kernel panics and `panic=1` reboots).
pub fn initrd(work: &Path, name: &str, panic: bool) -> PathBuf {
    let root = work.join(format!("ird-{name}"));
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .unwrap_or_else(|e| panic!("/bin/busybox (Debian package busybox-static) is needed: {e}"));
    let end = if panic {
        "echo K3OS-PANICKING; exit 1"
    } else {
        "/bin/busybox reboot -f"
    };
    let init = format!(
        "#!/bin/busybox sh\n/bin/busybox mount -t proc proc /proc\n\
         echo \"K3OS-CMDLINE $(/bin/busybox cat /proc/cmdline)\"\n{end}\n"
    );
    std::fs::write(root.join("init"), init).unwrap();
    run_ok(
        "chmod",
        "coreutils",
        &["+x", root.join("init").to_str().unwrap()],
    );
    let out = work.join(format!("{name}.img"));
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc 2>/dev/null | gzip > '{}'",
            root.display(),
            out.display()
        ))
        .status()
        .unwrap();
    assert!(
        st.success(),
        "building initramfs {name} (cpio, gzip) failed"
    );
    out
}

/// Boot the disk once (BIOS, TCG); returns the `k3os.slot=` of the command line the kernel got
/// and whether the guest's init panicked.
pub fn boot(disk: &Path) -> (Slot, bool) {
    let (slot, panicked, _) = boot_cmdline(disk);
    (slot, panicked)
}

/// [`boot`], with the `K3OS-CMDLINE …` line the guest printed.
#[allow(dead_code)]
pub fn boot_cmdline(disk: &Path) -> (Slot, bool, String) {
    let out = run(
        "timeout",
        "coreutils",
        &[
            "180",
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            "256",
            "-drive",
            &format!("file={},format=raw", disk.display()),
            "-nographic",
            "-no-reboot",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_ne!(
        out.status.code(),
        Some(127),
        "qemu-system-x86_64 (package qemu-system-x86) is needed"
    );
    let line = text
        .lines()
        .find_map(|l| l.find("K3OS-CMDLINE ").map(|i| l[i..].to_string()))
        .unwrap_or_else(|| {
            panic!(
                "the guest printed no command line ({}):\n{text}",
                out.status
            )
        });
    let slot = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("k3os.slot="))
        .unwrap_or_else(|| panic!("no k3os.slot= on the command line: {line}"))
        .parse()
        .unwrap();
    (slot, text.contains("K3OS-PANICKING"), line)
}

/// A 64 MiB disk image file with an MBR and one bootable Linux partition at [`PART_OFFSET`].
pub fn dos_disk(disk: &Path) {
    super::run_ok(
        "truncate",
        "coreutils",
        &["-s", "64M", disk.to_str().unwrap()],
    );
    let mut sfdisk = std::process::Command::new("sfdisk")
        .args(["-q", disk.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk (package fdisk) is needed");
    use std::io::Write;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: dos\nstart=2048, type=83, bootable\n")
        .unwrap();
    assert!(sfdisk.wait().unwrap().success(), "sfdisk failed");
}
