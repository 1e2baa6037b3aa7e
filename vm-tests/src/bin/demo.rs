//! `just demo`: the whole story on one x86_64 node, printed as it happens.
//!
//! Boots the BIOS GRUB test disk (slot A = v1) under QEMU, shows `k3os-ops slot status`,
//! upgrades to v2 from an HTTP channel on the host while the node keeps serving, reboots into
//! slot B, and shows `slot status` again: B is now good and booted, A is the fallback.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vm_tests::server::ReleaseServer;
use vm_tests::target::{images_dir, workspace_root, Network};
use vm_tests::{Accel, Target, Vm};

const BOOT: Duration = Duration::from_secs(300);
const CMD: Duration = Duration::from_secs(60);
const UPGRADE: Duration = Duration::from_secs(900);

fn banner(s: &str) {
    println!("\n==== {s} ====");
}

fn boot_line(vm: &mut Vm) -> anyhow::Result<String> {
    let line = vm.expect_not("K3OS-BOOTED", &["Kernel panic", "K3OS-INITRD-FAILED"], BOOT)?;
    vm.expect_not("K3OS-READY", &["Kernel panic", "K3OS-ROLLBACK"], BOOT)?;
    vm.wait_shell(CMD)?;
    Ok(line.trim().to_string())
}

fn main() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let root = workspace_root();
    let target = Target::X86_64GrubBios;
    target.check_inputs(&root)?;
    let accel = Accel::for_target(target, &root);
    let dir = root.join("vm-tests/out/demo");
    let disk = scratch_disk(&dir, &target.disk(&root))?;
    let releases = target.releases(&root);
    let srv = ReleaseServer::start(&releases, 0)?;
    println!(
        "demo: {} on {} ({}), releases from {} served at 127.0.0.1:{}",
        target.name(),
        accel.as_str(),
        disk.display(),
        releases
            .strip_prefix(images_dir(&root).parent().unwrap_or(Path::new("/")))
            .unwrap_or(&releases)
            .display(),
        srv.port()
    );

    let free = || -> std::io::Result<u16> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        Ok(l.local_addr()?.port())
    };
    // No collector in the demo, and the test OS reports nowhere unless a scenario turns it on
    // (report-spool): no report is sent or spooled.
    let net = Network::User {
        http_port: free()?,
        report_port: free()?,
    };
    let cmd = target.qemu_command(accel, &disk, None, &dir.join("monitor.sock"), net, None);
    let mut vm = Vm::spawn(
        "demo",
        cmd,
        &dir.join("monitor.sock"),
        &dir.join("console.log"),
    )?;
    story(&mut vm, &srv)?;
    vm.stop()?;
    println!(
        "\ndemo: done in {:.0}s; console log in {}",
        t0.elapsed().as_secs_f64(),
        dir.join("console.log").display()
    );
    Ok(())
}

/// A fresh `dir` holding a sparse copy of `image`; returns the copy's path.
fn scratch_disk(dir: &Path, image: &Path) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let disk = dir.join("disk.img");
    let st = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(image)
        .arg(&disk)
        .status()?;
    if !st.success() {
        bail!("copying the test disk to {} failed", disk.display());
    }
    Ok(disk)
}

/// Power on, status, upgrade to v2 from `srv`, reboot, status: B must be good and booted.
fn story(vm: &mut Vm, srv: &ReleaseServer) -> anyhow::Result<()> {
    banner("power on");
    println!("{}", boot_line(vm)?);
    banner("k3os-ops slot status (before)");
    print!("{}", vm.run_ok("k3os-ops slot status", CMD)?);

    banner(&format!(
        "k3os-ops upgrade --source {}",
        srv.guest_url("v2")
    ));
    vm.run_streamed(
        &format!(
            "k3os-ops upgrade --progress lines --source {}",
            srv.guest_url("v2")
        ),
        UPGRADE,
        |line| println!("{line}"),
    )?;
    print!("{}", vm.run_ok("k3os-ops slot status", CMD)?);

    banner("reboot");
    vm.send_line("sync; reboot -f")?;
    let line = boot_line(vm)?;
    println!("{line}");
    if !line.contains("slot=B") || !line.contains("version=v2") {
        bail!("expected the node to come back on slot B with v2, console said: {line}");
    }
    banner("k3os-ops slot status (after)");
    let after = vm.run_ok("k3os-ops slot status", CMD)?;
    print!("{after}");
    if !after.contains("slot B (good, booted") {
        bail!("slot B is not good and booted after the upgrade:\n{after}");
    }
    Ok(())
}
