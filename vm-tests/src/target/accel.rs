//! The QEMU accelerator of a run: KVM only when a probe boot proves it works, else TCG.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::Target;

/// QEMU accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// The accelerator for `target`: KVM only when the guest has the host's architecture and a
    /// probe boot under KVM actually prints the kernel banner within 15 s (on these hosts
    /// /dev/kvm exists but guests hang under it, so it is never assumed). `VM_TESTS_ACCEL=tcg|kvm`
    /// overrides. The probe runs once per process; the choice and why are printed.
    pub fn for_target(target: Target, root: &Path) -> Accel {
        if target.arch() != std::env::consts::ARCH {
            return Accel::Tcg;
        }
        static PROBE: OnceLock<Accel> = OnceLock::new();
        *PROBE.get_or_init(|| {
            let (a, why) = match std::env::var("VM_TESTS_ACCEL").as_deref() {
                Ok("tcg") => (Accel::Tcg, "VM_TESTS_ACCEL=tcg".to_string()),
                Ok("kvm") => (Accel::Kvm, "VM_TESTS_ACCEL=kvm".to_string()),
                _ => probe_kvm(target, root),
            };
            eprintln!("vm-tests: accelerator {} ({why})", a.as_str());
            a
        })
    }
}

/// Boot the v1 kernel directly under KVM and look for its banner on the serial console.
fn probe_kvm(target: Target, root: &Path) -> (Accel, String) {
    if !Path::new("/dev/kvm").exists() {
        return (Accel::Tcg, "no /dev/kvm".into());
    }
    let kernel = target.releases(root).join("v1/vmlinuz");
    if !kernel.is_file() {
        return (Accel::Tcg, format!("no probe kernel {}", kernel.display()));
    }
    let out = std::env::temp_dir().join(format!("vm-tests-kvm-probe-{}.log", std::process::id()));
    let Ok(file) = std::fs::File::create(&out) else {
        return (Accel::Tcg, format!("cannot create {}", out.display()));
    };
    let child = Command::new(target.qemu_binary())
        .args([
            "-accel",
            "kvm",
            "-m",
            "256",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&kernel)
        .args(["-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"])
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return (Accel::Tcg, "cannot start QEMU for the KVM probe".into());
    };
    let start = Instant::now();
    let mut verdict = (
        Accel::Tcg,
        "a KVM guest printed no kernel banner within 15 s".to_string(),
    );
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(Some(st)) = child.try_wait() {
            verdict = (Accel::Tcg, format!("QEMU -accel kvm exited at once ({st})"));
            break;
        }
        if std::fs::read(&out)
            .map(|b| String::from_utf8_lossy(&b).contains("Linux version"))
            .unwrap_or(false)
        {
            verdict = (
                Accel::Kvm,
                format!(
                    "a KVM guest printed its banner in {:.1}s",
                    start.elapsed().as_secs_f64()
                ),
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&out);
    verdict
}
