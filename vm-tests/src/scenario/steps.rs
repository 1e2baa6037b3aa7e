//! The steps every scenario is made of: scratch nodes, power on, wait for a boot and its
//! confirm, run an upgrade, reboot into a blessed slot, and the scenario's own bookkeeping
//! (notes, boots, failures naming the scenario). What the node says (`slot status`, the
//! workload) is read in `status`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bootconfig::Slot;
use libupgrade::state::SlotState;
use libupgrade::{SlotStatus, Status};

use super::Scenario;
use crate::error::{Error, Result};
use crate::monitor::sh_quote;
use crate::server::ReleaseServer;
use crate::target::Network;
use crate::vm::Vm;

/// From power-on to `K3OS-BOOTED` (TCG on a shared 2-core machine; ~15 s when idle).
pub(super) const BOOT: Duration = Duration::from_secs(300);
/// From `K3OS-BOOTED` to `K3OS-READY` (confirm + DHCP).
pub(super) const READY: Duration = Duration::from_secs(180);
pub(super) const CMD: Duration = Duration::from_secs(120);
pub(super) const DOWNLOAD: Duration = Duration::from_secs(900);
/// GRUB could load neither entry and waits in its menu: the node is stuck (a truck roll).
pub(super) const GRUB_STUCK: &str = "Failed to boot both default and fallback entries";

/// One node: a scratch copy of the target disk (and UEFI variables) that survives power cycles.
pub struct Node {
    name: String,
    dir: PathBuf,
    disk: PathBuf,
    vars: Option<PathBuf>,
    /// Host port forwarded to the guest's port 80 during the current boot (0 while offline).
    pub http_port: u16,
    /// Host port the guest's reports go to (`10.0.2.100:80` in the guest), fixed for the
    /// node's life so that a collector started or restarted on it is reached by every boot.
    /// Nothing listens on it unless the scenario starts a collector there.
    pub report_port: u16,
    power_ons: u32,
    /// Boots without any NIC (a site whose link is down).
    offline: bool,
    /// A raw image plugged in as a USB stick at every boot.
    usb_stick: Option<PathBuf>,
    /// A raw image attached read-only as a second virtio disk at every boot (a seed).
    seed: Option<PathBuf>,
    /// Memory (MiB) and vCPUs instead of the target's defaults.
    size: Option<(u32, u32)>,
}

impl Node {
    /// From the next power-on the node has no network at all.
    pub fn unplug_network(&mut self) {
        self.offline = true;
    }

    /// The node's disk image (read on the host while the node is off).
    pub fn disk_path(&self) -> &Path {
        &self.disk
    }

    /// The node's UEFI variable store (none on a BIOS target).
    pub fn vars_path(&self) -> Option<&Path> {
        self.vars.as_deref()
    }

    /// The node's directory (its disk, console logs, and what a scenario keeps beside them).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// From the next power-on `image` is attached read-only as a second virtio disk
    /// (`/dev/vdb`): the run-time seed of a Kubernetes node.
    pub fn attach_seed(&mut self, image: &Path) {
        self.seed = Some(image.to_path_buf());
    }

    /// From the next power-on the guest has `memory_mib` MiB and `cpus` vCPUs (a kubelet
    /// needs more than the plain test OS's 512 MiB).
    pub fn resize(&mut self, memory_mib: u32, cpus: u32) {
        self.size = Some((memory_mib, cpus));
    }

    /// From the next power-on `image` is plugged in as a USB mass-storage device.
    pub fn plug_usb_stick(&mut self, image: &Path) {
        self.usb_stick = Some(image.to_path_buf());
    }
}

pub(super) fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Server(format!("find a free port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| Error::Server(e.to_string()))?
        .port())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    let st = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .status()
        .map_err(|e| Error::io("run cp to copy", from, e))?;
    if !st.success() {
        return Err(Error::io(
            format!("cp {} ({st})", to.display()),
            from,
            std::io::Error::other("copy failed"),
        ));
    }
    Ok(())
}

/// The record of `slot` in `st`.
pub(super) fn sl(st: &Status, slot: Slot) -> &SlotStatus {
    st.slots
        .iter()
        .find(|s| s.slot == slot)
        .expect("status lists both slots")
}

/// `K3OS-BOOTED slot=B version=v2` → (B, "v2").
pub fn parse_booted(line: &str) -> Option<(Slot, String)> {
    let rest = &line[line.find("K3OS-BOOTED")?..];
    let mut slot = None;
    let mut version = None;
    for w in rest.split_whitespace() {
        if let Some(s) = w.strip_prefix("slot=") {
            slot = match s {
                "A" => Some(Slot::A),
                "B" => Some(Slot::B),
                _ => None,
            };
        }
        if let Some(v) = w.strip_prefix("version=") {
            version = Some(v.to_string());
        }
    }
    Some((slot?, version?))
}

/// Bookkeeping: notes, failures, the release server.
impl Scenario {
    pub(super) fn note(&mut self, s: impl Into<String>) {
        let s = s.into();
        eprintln!("vm-tests: [{} {}] {s}", self.target, self.kind);
        self.notes.push(s);
    }

    pub(super) fn fail(&self, what: impl Into<String>) -> Error {
        Error::Check {
            scenario: self.kind.name().into(),
            target: self.target.name().into(),
            what: what.into(),
        }
    }

    pub(super) fn check(&self, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.fail(what()))
        }
    }

    pub(super) fn server(&self, rate: u64) -> Result<ReleaseServer> {
        ReleaseServer::start(&self.target.releases(&self.root), rate)
    }

    /// Count a boot the guest starts by itself (a panic reboot, a watchdog reset, a rollback).
    pub(super) fn count_boot(&mut self) {
        self.boots += 1;
    }
}

/// Nodes and their boots.
impl Scenario {
    /// A fresh node from the pristine disk image.
    pub fn node(&self, name: &str) -> Result<Node> {
        self.node_from(name, &self.target.disk(&self.root))
    }

    /// A fresh node from a copy of `image` (the current disk, or the previous release's).
    pub fn node_from(&self, name: &str, image: &Path) -> Result<Node> {
        let vars = self.target.firmware().map(|(_, vars)| vars);
        self.node_from_files(name, image, vars.as_deref())
    }

    /// A node with copies of `image` and of the UEFI variable store `vars` (the firmware's
    /// template, or a saved node's store; ignored on a target without UEFI).
    pub(super) fn node_from_files(
        &self,
        name: &str,
        image: &Path,
        vars: Option<&Path>,
    ) -> Result<Node> {
        let dir = self.out.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create node dir", &dir, e))?;
        let disk = dir.join("disk.img");
        copy(image, &disk)?;
        let vars = match (self.target.firmware(), vars) {
            (Some(_), Some(vars)) => {
                let v = dir.join("vars.fd");
                copy(vars, &v)?;
                Some(v)
            }
            _ => None,
        };
        Ok(Node {
            name: name.into(),
            dir,
            disk,
            vars,
            http_port: 0,
            report_port: free_port()?,
            power_ons: 0,
            offline: false,
            usb_stick: None,
            seed: None,
            size: None,
        })
    }

    /// Power the node on (a new QEMU process on the same disk).
    pub fn power_on(&mut self, node: &mut Node) -> Result<Vm> {
        self.boots += 1;
        self.start_qemu(node, None)
    }

    /// Start `node`'s QEMU resuming the guest state saved in `state` ([`Vm::save_state`]):
    /// no boot, the guest runs on from where it was saved, on `node`'s disk (which must be
    /// the disk as it was at that instant).
    pub(super) fn resume(&mut self, node: &mut Node, state: &Path) -> Result<Vm> {
        self.start_qemu(node, Some(state))
    }

    /// A new QEMU process for `node` (its boot, or with `incoming` its resumption).
    fn start_qemu(&mut self, node: &mut Node, incoming: Option<&Path>) -> Result<Vm> {
        node.power_ons += 1;
        let net = if node.offline {
            node.http_port = 0;
            Network::None
        } else {
            node.http_port = free_port()?;
            Network::User {
                http_port: node.http_port,
                report_port: node.report_port,
            }
        };
        let name = format!("{}/{}#{}", self.target, node.name, node.power_ons);
        let monitor = node.dir.join(format!("monitor-{}.sock", node.power_ons));
        let log = node.dir.join(format!("console-{}.log", node.power_ons));
        let mut cmd = self.target.qemu_command(
            self.accel,
            &node.disk,
            node.vars.as_deref(),
            &monitor,
            net,
            node.usb_stick.as_deref(),
        );
        // QEMU merges repeated -m / -smp options: the last one counts.
        if let Some((mem, cpus)) = node.size {
            cmd.arg("-m").arg(mem.to_string());
            cmd.arg("-smp").arg(cpus.to_string());
        }
        if let Some(seed) = &node.seed {
            cmd.arg("-drive").arg(format!(
                "file={},format=raw,if=virtio,readonly=on",
                seed.display()
            ));
        }
        if let Some(state) = incoming {
            let quoted = sh_quote(state).ok_or_else(|| {
                self.fail(format!(
                    "cannot name {} in a migration URI (quote in the path)",
                    state.display()
                ))
            })?;
            cmd.arg("-incoming").arg(format!("exec:cat {quoted}"));
        }
        Vm::spawn(&name, cmd, &monitor, &log)
    }

    /// Wait for `K3OS-BOOTED` and return the slot and version it names.
    pub(super) fn booted(&mut self, vm: &mut Vm) -> Result<(Slot, String)> {
        let t0 = vm.elapsed();
        let line = vm.expect_not(
            "K3OS-BOOTED",
            &[
                "K3OS-INITRD-FAILED",
                "K3OS-INITRD-PANIC",
                "Kernel panic",
                GRUB_STUCK,
            ],
            BOOT,
        )?;
        let (slot, version) = parse_booted(&line)
            .ok_or_else(|| self.fail(format!("cannot parse the boot line `{line}`")))?;
        let s = format!(
            "{}: booted slot {slot} version {version} after {:.1}s",
            vm.name(),
            (vm.elapsed() - t0).as_secs_f64()
        );
        self.note(s);
        Ok((slot, version))
    }

    /// Wait for the boot of `slot` running `version`.
    pub(super) fn expect_boot(&mut self, vm: &mut Vm, slot: Slot, version: &str) -> Result<()> {
        let (s, v) = self.booted(vm)?;
        self.check(s == slot && v == version, || {
            format!(
                "{}: booted slot {s} version {v}, expected slot {slot} version {version}",
                vm.name()
            )
        })
    }

    /// Power `node` on, fresh from its image: it must boot A v1, confirm and be ready.
    pub(super) fn boot_v1(&mut self, node: &mut Node) -> Result<Vm> {
        let mut vm = self.power_on(node)?;
        self.expect_boot(&mut vm, Slot::A, "v1")?;
        self.ready(&mut vm)?;
        Ok(vm)
    }

    /// Wait for `K3OS-CONFIRM ok` and `K3OS-READY`, then for the shell to answer.
    pub(super) fn ready(&mut self, vm: &mut Vm) -> Result<()> {
        let t0 = vm.elapsed();
        vm.expect_not(
            "K3OS-CONFIRM ok",
            &[
                "K3OS-CONFIRM failed",
                "K3OS-NOCONFIRM",
                "K3OS-ROLLBACK",
                "Kernel panic",
            ],
            READY,
        )?;
        vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
        vm.wait_shell(CMD)?;
        let t = (vm.elapsed() - t0).as_secs_f64();
        self.note(format!(
            "{}: confirmed and shell ready {t:.1}s after K3OS-BOOTED",
            vm.name()
        ));
        Ok(())
    }

    /// Reboot from the guest shell (`reboot -f` after a sync, like an operator would).
    pub(super) fn reboot(&mut self, vm: &mut Vm) -> Result<()> {
        vm.send_line("sync; reboot -f")?;
        self.boots += 1;
        Ok(())
    }

    /// Reboot into `slot` running `version`, whose activation awaits checks: the boot-time
    /// confirm must leave it pending (on trial; init starts `slot await-bless` in the
    /// background); returns once the shell answers.
    pub(super) fn reboot_into_pending(
        &mut self,
        vm: &mut Vm,
        slot: Slot,
        version: &str,
    ) -> Result<()> {
        self.reboot(vm)?;
        self.expect_boot(vm, slot, version)?;
        vm.expect_not(
            "K3OS-CONFIRM pending",
            &["K3OS-CONFIRM ok", "K3OS-CONFIRM failed", "Kernel panic"],
            READY,
        )?;
        vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
        vm.wait_shell(CMD)
    }

    /// A trial of v2 on B whose awaited check `check` is never reported: `slot await-bless`
    /// rolls back and reboots into A (v1) by itself at `limit` s; B must then be bad, with the
    /// missing report (`check: not reported within LIMIT s`, plus `also` when given) as the
    /// reason. `what` names the case in the notes; `t0` is when B's shell was ready.
    pub(super) fn rolled_back_at_limit(
        &mut self,
        vm: &mut Vm,
        t0: Instant,
        limit: u64,
        (check, what, also): (&str, &str, Option<&str>),
    ) -> Result<()> {
        vm.expect_not(
            "K3OS-SHUTDOWN reboot",
            &["Kernel panic"],
            Duration::from_secs(limit) + READY,
        )?;
        self.count_boot();
        self.expect_boot(vm, Slot::A, "v1")?;
        self.note(format!(
            "{}: {what}: await-bless rolled back and rebooted into A {:.1}s after B's shell was ready (limit {limit} s)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.ready(vm)?;
        let st = self.status(vm)?;
        let b = sl(&st, Slot::B);
        let why = b
            .last_decision
            .as_ref()
            .map(|d| d.why.clone())
            .unwrap_or_default();
        self.check(
            b.state == SlotState::Bad
                && st.next_boot == Slot::A
                && why.contains(&format!("{check}: not reported within {limit} s"))
                && also.is_none_or(|a| why.contains(a)),
            || format!("B must be bad, with the missing `{check}` as the reason: {b:?}"),
        )?;
        self.note(format!("slot status on v1: B is {}: {why}", b.state));
        Ok(())
    }

    /// Reboot into `slot` running `version`, which must confirm and then be good; returns the
    /// status read on it.
    pub(super) fn reboot_into_good(
        &mut self,
        vm: &mut Vm,
        slot: Slot,
        version: &str,
    ) -> Result<Status> {
        self.reboot(vm)?;
        self.expect_boot(vm, slot, version)?;
        self.ready(vm)?;
        let st = self.status(vm)?;
        self.check_slot(&st, slot, SlotState::Good, Some(version))?;
        Ok(st)
    }
}

/// Upgrades run from the guest shell.
impl Scenario {
    /// Run an upgrade in the foreground; returns its output.
    pub(super) fn upgrade_to(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        version: &str,
        extra: &str,
    ) -> Result<String> {
        self.upgrade_to_env(vm, srv, version, "", extra)
    }

    /// [`Self::upgrade_to`] with `env` (`NAME=value …`) set for the k3os-ops process.
    pub(super) fn upgrade_to_env(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        version: &str,
        env: &str,
        extra: &str,
    ) -> Result<String> {
        let t0 = Instant::now();
        let out = vm.run_ok(
            &format!(
                "{env} k3os-ops upgrade --quiet {extra} --source {}",
                srv.guest_url(version)
            ),
            DOWNLOAD,
        )?;
        self.note(format!(
            "{}: upgrade to {version} {extra} took {:.1}s",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        Ok(out)
    }

    /// The current binary upgrades the node from B v2 to v3 in A, which boots and is blessed
    /// with B v2 still good; returns the status on A v3.
    pub(super) fn upgrade_v3_into_a(&mut self, vm: &mut Vm, srv: &ReleaseServer) -> Result<Status> {
        let out = self.upgrade_to(vm, srv, "v3", "")?;
        self.check(
            out.contains("staged v3") && out.contains("into slot A"),
            || format!("upgrade output does not say v3 was staged into A:\n{out}"),
        )?;
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::A, SlotState::Trying, Some("v3"))?;
        self.reboot(vm)?;
        self.expect_boot(vm, Slot::A, "v3")?;
        self.ready(vm)?;
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v3"))?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        Ok(st)
    }

    /// Upgrade to v2 again after a power cut left A running: it must activate B, which boots
    /// and is blessed (`after`: the cut, for the message).
    pub(super) fn upgrade_again_to_v2(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        after: &str,
    ) -> Result<()> {
        let out = self.upgrade_to(vm, srv, "v2", "")?;
        self.check(out.contains("activated slot B"), || {
            format!("re-running the upgrade after {after} did not activate B:\n{out}")
        })?;
        self.reboot_into_good(vm, Slot::B, "v2").map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_boot_lines() {
        assert_eq!(
            parse_booted("[  3.1] K3OS-BOOTED slot=B version=v2-panic"),
            Some((Slot::B, "v2-panic".into()))
        );
        assert_eq!(parse_booted("K3OS-BOOTED slot=unknown version=v1"), None);
    }
}
