//! The scenarios of the issue, each run against one [`Target`] on scratch copies of its disk:
//!
//! - `upgrade`: v1 on A stages v2 into B over HTTP while the workload keeps answering, reboots
//!   into v2 (confirmed, marked good, still v2 after another reboot), then upgrades v2→v3 into A.
//! - `fallback-panic` / `fallback-noconfirm`: a v2 that panics / never confirms (reset like a
//!   watchdog) uses up its tries, the bootloader falls back to A, and `slot status` on v1
//!   names the failed slot and why.
//! - `badhealth`: a v2 whose health check fails rolls back to v1 on its first boot.
//! - `powercut`: a dry run counts the write barriers of `upgrade`; then for each sampled
//!   barrier k the upgrade freezes at k, QEMU is killed, and the node must come up on a good
//!   slot with slot B either complete (re-stage reports it already staged, and it boots) or
//!   not bootable (and a new upgrade recovers).
//!
//! - `missing-kernel`: v2 is activated, then its kernel is deleted from /boot; the bootloader
//!   cannot load B and must fall back to A by itself (no human at the GRUB menu).
//! - `awaited-check`: v2 activated awaiting `node-ready` (as the agent activates): the
//!   boot-time confirm leaves B pending; unreported, init's background `slot await-bless`
//!   rolls back and reboots into A at the limit; reported (`slot confirm --passed`), B is
//!   blessed and stays.
//! - `upgrade-from-previous`: a disk built by the previous release's own code (CHANGELOG.md;
//!   `just images-previous`) boots its v1 with its k3os-ops; that old binary upgrades to a
//!   current-code v2, which boots under the old boot script and env and is blessed by the current
//!   binary; the current binary upgrades to v3 (blessed, current boot script), and a panicking v4
//!   falls back by itself. Then power cuts inside the first migrating write (the boot-time
//!   confirm of v2 on a node the old binary upgraded).
//!
//! Every run prints its wall time and the time of each boot; console logs stay in
//! `vm-tests/out/<target>/<scenario>/`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use bootconfig::{Slot, SlotBoot};
use libupgrade::state::{Event, SlotState};
use libupgrade::updater::{SlotStatus, Status};

use crate::error::{Error, Result};
use crate::server::{http_get, ReleaseServer};
use crate::target::{workspace_root, Accel, Target};
use crate::vm::Vm;

/// From power-on to `K3OS-BOOTED` (TCG on a shared 2-core machine; ~15 s when idle).
const BOOT: Duration = Duration::from_secs(300);
/// From `K3OS-BOOTED` to `K3OS-READY` (confirm + DHCP).
const READY: Duration = Duration::from_secs(180);
const CMD: Duration = Duration::from_secs(120);
const DOWNLOAD: Duration = Duration::from_secs(900);
/// GRUB could load neither entry and waits in its menu: the node is stuck (a truck roll).
const GRUB_STUCK: &str = "Failed to boot both default and fallback entries";
/// Rate of the release server while the upgrade scenario watches the workload.
const SLOW_RATE: u64 = 1 << 20;

/// A scenario of the issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScenarioKind {
    Upgrade,
    FallbackPanic,
    FallbackNoConfirm,
    BadHealth,
    PowerCut,
    MissingKernel,
    AwaitedCheck,
    UpgradeFromPrevious,
}

impl ScenarioKind {
    pub const ALL: [ScenarioKind; 8] = [
        ScenarioKind::Upgrade,
        ScenarioKind::FallbackPanic,
        ScenarioKind::FallbackNoConfirm,
        ScenarioKind::BadHealth,
        ScenarioKind::PowerCut,
        ScenarioKind::MissingKernel,
        ScenarioKind::AwaitedCheck,
        ScenarioKind::UpgradeFromPrevious,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Upgrade => "upgrade",
            ScenarioKind::FallbackPanic => "fallback-panic",
            ScenarioKind::FallbackNoConfirm => "fallback-noconfirm",
            ScenarioKind::BadHealth => "badhealth",
            ScenarioKind::PowerCut => "powercut",
            ScenarioKind::MissingKernel => "missing-kernel",
            ScenarioKind::AwaitedCheck => "awaited-check",
            ScenarioKind::UpgradeFromPrevious => "upgrade-from-previous",
        }
    }
}

impl fmt::Display for ScenarioKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScenarioKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<ScenarioKind> {
        ScenarioKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::Unknown {
                what: "scenario".into(),
                got: s.into(),
                expected: ScenarioKind::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// Knobs of a run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Power cuts at every barrier instead of a sample.
    pub all_barriers: bool,
    /// Keep the scratch disks after a successful run.
    pub keep: bool,
}

/// What a finished scenario measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: ScenarioKind,
    pub target: Target,
    pub accel: Accel,
    pub wall: Duration,
    pub boots: u32,
    /// Human lines: boot times, what was checked, figures.
    pub notes: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "== {} on {} ({}): PASS in {:.1}s, {} boots",
            self.scenario,
            self.target,
            self.accel.as_str(),
            self.wall.as_secs_f64(),
            self.boots
        )?;
        for n in &self.notes {
            writeln!(f, "   {n}")?;
        }
        Ok(())
    }
}

/// A scenario in progress: target, accelerator, server, notes.
pub struct Scenario {
    pub kind: ScenarioKind,
    pub target: Target,
    pub accel: Accel,
    pub opts: Options,
    root: PathBuf,
    out: PathBuf,
    started: Instant,
    boots: u32,
    notes: Vec<String>,
}

/// One node: a scratch copy of the target disk (and UEFI variables) that survives power cycles.
pub struct Node {
    name: String,
    dir: PathBuf,
    disk: PathBuf,
    vars: Option<PathBuf>,
    /// Host port forwarded to the guest's port 80 during the current boot.
    pub http_port: u16,
    power_ons: u32,
}

fn free_port() -> Result<u16> {
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

impl Scenario {
    /// Prepare `kind` on `target`; fails (with the reason) when an input is missing.
    pub fn new(kind: ScenarioKind, target: Target, opts: Options) -> Result<Scenario> {
        let root = workspace_root();
        target.check_inputs(&root)?;
        if kind == ScenarioKind::UpgradeFromPrevious {
            target.check_previous_inputs(&root)?;
        }
        let accel = Accel::for_target(target, &root);
        let out = root
            .join("vm-tests/out")
            .join(target.name())
            .join(kind.name());
        if out.exists() {
            std::fs::remove_dir_all(&out)
                .map_err(|e| Error::io("clear old scenario output", &out, e))?;
        }
        std::fs::create_dir_all(&out)
            .map_err(|e| Error::io("create scenario output dir", &out, e))?;
        Ok(Scenario {
            kind,
            target,
            accel,
            opts,
            root,
            out,
            started: Instant::now(),
            boots: 0,
            notes: Vec::new(),
        })
    }

    /// Run it to the end.
    pub fn run(mut self) -> Result<Report> {
        eprintln!(
            "vm-tests: == {} on {} ({})",
            self.kind,
            self.target,
            self.accel.as_str()
        );
        self.started = Instant::now();
        match self.kind {
            ScenarioKind::Upgrade => self.upgrade()?,
            ScenarioKind::FallbackPanic => self.fallback(false)?,
            ScenarioKind::FallbackNoConfirm => self.fallback(true)?,
            ScenarioKind::BadHealth => self.badhealth()?,
            ScenarioKind::PowerCut => self.powercut()?,
            ScenarioKind::MissingKernel => self.missing_kernel()?,
            ScenarioKind::AwaitedCheck => self.awaited_check()?,
            ScenarioKind::UpgradeFromPrevious => self.upgrade_from_previous()?,
        }
        if !self.opts.keep {
            for e in std::fs::read_dir(&self.out)
                .map_err(|e| Error::io("list scenario output", &self.out, e))?
                .flatten()
            {
                let p = e.path();
                if p.is_dir() {
                    for f in ["disk.img", "vars.fd"] {
                        let _ = std::fs::remove_file(p.join(f));
                    }
                }
            }
        }
        let r = Report {
            scenario: self.kind,
            target: self.target,
            accel: self.accel,
            wall: self.started.elapsed(),
            boots: self.boots,
            notes: self.notes,
        };
        eprint!("{r}");
        Ok(r)
    }

    fn note(&mut self, s: impl Into<String>) {
        let s = s.into();
        eprintln!("vm-tests: [{} {}] {s}", self.target, self.kind);
        self.notes.push(s);
    }

    fn fail(&self, what: impl Into<String>) -> Error {
        Error::Check {
            scenario: self.kind.name().into(),
            target: self.target.name().into(),
            what: what.into(),
        }
    }

    fn check(&self, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.fail(what()))
        }
    }

    fn server(&self, rate: u64) -> Result<ReleaseServer> {
        ReleaseServer::start(&self.target.releases(&self.root), rate)
    }

    /// A fresh node from the pristine disk image.
    pub fn node(&self, name: &str) -> Result<Node> {
        self.node_from(name, &self.target.disk(&self.root))
    }

    /// A fresh node from a copy of `image` (the current disk, or the previous release's).
    pub fn node_from(&self, name: &str, image: &Path) -> Result<Node> {
        let dir = self.out.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create node dir", &dir, e))?;
        let disk = dir.join("disk.img");
        copy(image, &disk)?;
        let vars = match self.target.firmware() {
            Some((_, vars)) => {
                let v = dir.join("vars.fd");
                copy(&vars, &v)?;
                Some(v)
            }
            None => None,
        };
        Ok(Node {
            name: name.into(),
            dir,
            disk,
            vars,
            http_port: 0,
            power_ons: 0,
        })
    }

    /// Power the node on (a new QEMU process on the same disk).
    pub fn power_on(&mut self, node: &mut Node) -> Result<Vm> {
        node.power_ons += 1;
        self.boots += 1;
        node.http_port = free_port()?;
        let name = format!("{}/{}#{}", self.target, node.name, node.power_ons);
        let monitor = node.dir.join(format!("monitor-{}.sock", node.power_ons));
        let log = node.dir.join(format!("console-{}.log", node.power_ons));
        let cmd = self.target.qemu_command(
            self.accel,
            &node.disk,
            node.vars.as_deref(),
            &monitor,
            node.http_port,
        );
        Vm::spawn(&name, cmd, &monitor, &log)
    }

    /// Wait for `K3OS-BOOTED` and return the slot and version it names.
    fn booted(&mut self, vm: &mut Vm) -> Result<(Slot, String)> {
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
        self.boots_note(vm, t0, &format!("booted slot {slot} version {version}"));
        Ok((slot, version))
    }

    fn boots_note(&mut self, vm: &Vm, since: Duration, what: &str) {
        let s = format!(
            "{}: {what} after {:.1}s",
            vm.name(),
            (vm.elapsed() - since).as_secs_f64()
        );
        self.note(s);
    }

    /// Wait for the boot of `slot` running `version`.
    fn expect_boot(&mut self, vm: &mut Vm, slot: Slot, version: &str) -> Result<()> {
        let (s, v) = self.booted(vm)?;
        self.check(s == slot && v == version, || {
            format!(
                "{}: booted slot {s} version {v}, expected slot {slot} version {version}",
                vm.name()
            )
        })
    }

    /// Power `node` on, fresh from its image: it must boot A v1, confirm and be ready.
    fn boot_v1(&mut self, node: &mut Node) -> Result<Vm> {
        let mut vm = self.power_on(node)?;
        self.expect_boot(&mut vm, Slot::A, "v1")?;
        self.ready(&mut vm)?;
        Ok(vm)
    }

    /// Wait for `K3OS-CONFIRM ok` and `K3OS-READY`, then for the shell to answer.
    fn ready(&mut self, vm: &mut Vm) -> Result<()> {
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

    /// `k3os-ops slot status --json`, parsed with libupgrade's own types.
    fn status(&mut self, vm: &mut Vm) -> Result<Status> {
        let cmd = "k3os-ops slot status --json";
        let out = vm.run_ok(cmd, CMD)?;
        let (a, b) = (out.find('{'), out.rfind('}'));
        let text = match (a, b) {
            (Some(a), Some(b)) if b > a => &out[a..=b],
            _ => &out[..],
        };
        serde_json::from_str(text).map_err(|e| Error::Json {
            vm: vm.name().into(),
            cmd: cmd.into(),
            err: e.to_string(),
            text: out.clone(),
        })
    }

    /// Reboot from the guest shell (`reboot -f` after a sync, like an operator would).
    fn reboot(&mut self, vm: &mut Vm) -> Result<()> {
        vm.send_line("sync; reboot -f")?;
        self.boots += 1;
        Ok(())
    }

    /// Run an upgrade in the foreground; returns its output.
    fn upgrade_to(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        version: &str,
        extra: &str,
    ) -> Result<String> {
        self.upgrade_to_env(vm, srv, version, "", extra)
    }

    /// [`Self::upgrade_to`] with `env` (`NAME=value …`) set for the k3os-ops process.
    fn upgrade_to_env(
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

    // ---------------------------------------------------------------- scenario 1

    fn upgrade(&mut self) -> Result<()> {
        let srv = self.server(SLOW_RATE)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;
        self.check(st.booted == Some(Slot::A), || {
            format!("status says booted {:?}, expected A", st.booted)
        })?;
        let body = http_get(node.http_port, "/", Duration::from_secs(20))
            .map_err(|e| self.fail(format!("workload before the upgrade: {e}")))?;
        self.check(body.trim() == "alive", || {
            format!("workload answered {body:?}, expected \"alive\"")
        })?;

        // Stage + activate v2 in the background while the workload is polled.
        let t0 = Instant::now();
        vm.run_ok(
            &format!(
                "rm -f /tmp/upgrade.rc; {{ k3os-ops upgrade --quiet --source {}; echo $? >/tmp/upgrade.rc; }} >/tmp/upgrade.log 2>&1 &",
                srv.guest_url("v2")
            ),
            CMD,
        )?;
        let mut polls_ok = 0u32;
        let mut shell_ok = 0u32;
        let mut saw_transfer = false;
        while t0.elapsed() < DOWNLOAD {
            if srv.active() == 0 {
                // Not downloading: before the first request, between artifacts, or finished.
                std::thread::sleep(Duration::from_millis(300));
                if srv.active() == 0 {
                    let running = vm.run("[ ! -e /tmp/upgrade.rc ]", CMD)?;
                    if running.rc != 0 {
                        break;
                    }
                }
                if !saw_transfer && t0.elapsed() > Duration::from_secs(180) {
                    let log = vm.run("cat /tmp/upgrade.log", CMD)?.output;
                    return Err(self.fail(format!(
                        "no download started within 180 s; requests {:?}; upgrade log:\n{log}",
                        srv.requests()
                    )));
                }
                continue;
            }
            saw_transfer = true;
            match http_get(node.http_port, "/", Duration::from_secs(10)) {
                Ok(b) if b.trim() == "alive" && srv.active() > 0 => polls_ok += 1,
                Ok(b) if b.trim() == "alive" => {}
                Ok(b) => {
                    return Err(self.fail(format!("workload answered {b:?} during the download")))
                }
                Err(e) => {
                    return Err(
                        self.fail(format!("workload did not answer during the download: {e}"))
                    )
                }
            }
            if shell_ok < 3 {
                let o = vm.run("wget -q -O - http://127.0.0.1/ && cat /proc/loadavg", CMD)?;
                if o.rc == 0 && o.output.contains("alive") && srv.active() > 0 {
                    shell_ok += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let out = vm.run(
            "while [ ! -e /tmp/upgrade.rc ]; do sleep 1; done; cat /tmp/upgrade.log; exit_with() { return $1; }; exit_with $(cat /tmp/upgrade.rc)",
            DOWNLOAD,
        )?;
        let dl = t0.elapsed();
        self.check(out.rc == 0, || {
            format!("upgrade to v2 exited {}: {}", out.rc, out.output)
        })?;
        self.check(
            out.output.contains("staged v2") && out.output.contains("into slot B"),
            || {
                format!(
                    "upgrade output does not say v2 was staged into B:\n{}",
                    out.output
                )
            },
        )?;
        self.check(out.output.contains("activated slot B"), || {
            format!(
                "upgrade output does not say B was activated:\n{}",
                out.output
            )
        })?;
        self.check(polls_ok >= 3 && shell_ok >= 1, || {
            format!("the workload was seen alive only {polls_ok} times from the host and {shell_ok} times from the guest shell while the download ran")
        })?;
        self.note(format!(
            "staged+activated v2 in {:.1}s ({} bytes served, rate cap {} KiB/s); during the download the workload answered {polls_ok} host polls and {shell_ok} guest-shell commands",
            dl.as_secs_f64(),
            srv.bytes_sent(),
            SLOW_RATE >> 10
        ));
        srv.set_rate(0);
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some("v2"))?;
        self.check_delta(&st, srv.bytes_sent())?;
        self.check(st.next_boot == Slot::B, || {
            format!("next boot is {}, expected B", st.next_boot)
        })?;

        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        self.check(matches!(sl(&st, Slot::B).boot, SlotBoot::Good), || {
            format!(
                "bootloader has B as {:?}, expected good",
                sl(&st, Slot::B).boot
            )
        })?;
        self.check(
            st.booted == Some(Slot::B) && st.next_boot == Slot::B,
            || format!("booted {:?} next {}, expected B/B", st.booted, st.next_boot),
        )?;
        let body = http_get(node.http_port, "/", Duration::from_secs(20))
            .map_err(|e| self.fail(format!("workload on v2: {e}")))?;
        self.check(body.trim() == "alive", || {
            format!("workload on v2 answered {body:?}")
        })?;

        // Still v2 after another reboot.
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        self.ready(&mut vm)?;

        // v2 -> v3 into A.
        let out = self.upgrade_to(&mut vm, &srv, "v3", "")?;
        self.check(
            out.contains("staged v3") && out.contains("into slot A"),
            || format!("upgrade output does not say v3 was staged into A:\n{out}"),
        )?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Trying, Some("v3"))?;
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::A, "v3")?;
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v3"))?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        Ok(())
    }

    /// v1 -> v2 took the delta path: what the running slot already held (kernel, initrd, most of
    /// the rootfs) was copied, only the rest (v2's new application payload, a few chunks of
    /// metadata) crossed the wire, and the server saw no more than that plus the manifest,
    /// indexes and probes.
    fn check_delta(&mut self, st: &Status, served: u64) -> Result<()> {
        let Some(t) = sl(st, Slot::B).transfer else {
            return Err(self.fail("slot status records no transfer for B".to_string()));
        };
        self.note(format!(
            "delta v1 -> v2: fetched {} and reused {} of {} bytes ({:.1}% fetched); the server sent {served}",
            t.fetched,
            t.reused,
            t.total,
            100.0 * t.fetched as f64 / t.total.max(1) as f64
        ));
        self.check(t.reused > 0 && t.fetched * 2 < t.total, || {
            format!("the delta path reused too little: {t:?}")
        })?;
        self.check(t.fetched + t.reused >= t.total, || {
            format!("fetched + reused does not cover the release: {t:?}")
        })?;
        self.check(served <= t.fetched + (512 << 10), || {
            format!(
                "the server sent {served} bytes, more than the {} fetched + 512 KiB of manifest, indexes and probes",
                t.fetched
            )
        })
    }

    fn check_slot(
        &self,
        st: &Status,
        slot: Slot,
        state: SlotState,
        version: Option<&str>,
    ) -> Result<()> {
        let s = sl(st, slot);
        self.check(
            s.state == state && (version.is_none() || s.version.as_deref() == version),
            || {
                format!(
                    "slot {slot} is {} {:?}, expected {state} {version:?}; status: {}",
                    s.state,
                    s.version,
                    serde_json::to_string(st).unwrap_or_default()
                )
            },
        )
    }

    // ---------------------------------------------------------------- scenario 2

    /// Activate a v2 that never makes it; count the boots the bootloader gives it.
    fn fallback(&mut self, noconfirm: bool) -> Result<()> {
        let version = if noconfirm {
            "v2-noconfirm"
        } else {
            "v2-panic"
        };
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.upgrade_to(&mut vm, &srv, version, "")?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some(version))?;
        let tries = match sl(&st, Slot::B).boot {
            SlotBoot::Trying { tries_left } => tries_left as u32,
            b => {
                return Err(self.fail(format!(
                    "bootloader has B as {b:?} after activation, expected trying"
                )))
            }
        };
        self.note(format!("activated {version} in B with {tries} tries"));
        self.reboot(&mut vm)?;
        self.sit_out_trial(&mut vm, version, tries, noconfirm, Slot::A, "v1")?;
        self.ready(&mut vm)?;
        self.explain_failed_b(&mut vm, version, &[Event::FallbackTaken])?;
        Ok(())
    }

    /// A trial slot (the other one of `good`) that never makes it, rebooting: count the boots
    /// the bootloader gives it (each panic or each unconfirmed boot reset like a watchdog) until
    /// it boots `good` running `good_version` by itself; exactly `tries` attempts.
    fn sit_out_trial(
        &mut self,
        vm: &mut Vm,
        version: &str,
        tries: u32,
        noconfirm: bool,
        good: Slot,
        good_version: &str,
    ) -> Result<()> {
        let t0 = Instant::now();
        let mut attempts = 0u32;
        loop {
            let pats: &[&str] = if noconfirm {
                &["K3OS-BOOTED", GRUB_STUCK]
            } else {
                &["K3OS-BOOTED", GRUB_STUCK, "K3OS-INITRD-PANIC"]
            };
            let (i, line) = vm.expect_any(pats, BOOT)?;
            if i == 1 {
                return Err(self.fail(format!(
                    "{}: the bootloader is stuck: `{line}` (console log {})",
                    vm.name(),
                    vm.log().display()
                )));
            }
            if i == 2 {
                attempts += 1;
                // panic=5 reboots the machine: one more boot.
                self.boots += 1;
                self.note(format!(
                    "{}: attempt {attempts} of B panicked in the initrd ({:.1}s)",
                    vm.name(),
                    t0.elapsed().as_secs_f64()
                ));
                self.check(attempts <= tries, || {
                    format!("B was booted {attempts} times, more than its {tries} tries")
                })?;
                continue;
            }
            let (slot, v) = parse_booted(&line)
                .ok_or_else(|| self.fail(format!("cannot parse the boot line `{line}`")))?;
            if slot == good {
                self.check(v == good_version, || {
                    format!("fell back to {good} but it runs {v}, expected {good_version}")
                })?;
                self.note(format!(
                    "{}: fell back to slot {good} {good_version} after {attempts} attempts of {} ({:.1}s)",
                    vm.name(),
                    good.other(),
                    t0.elapsed().as_secs_f64()
                ));
                break;
            }
            self.check(noconfirm && v == version, || {
                format!("unexpected boot of slot {slot} version {v}")
            })?;
            attempts += 1;
            self.check(attempts <= tries, || {
                format!("B was booted {attempts} times, more than its {tries} tries")
            })?;
            vm.expect_not("K3OS-NOCONFIRM", &["K3OS-CONFIRM", "Kernel panic"], READY)?;
            // The node runs but never confirms: give it until it is up, then the watchdog fires.
            vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
            self.note(format!(
                "{}: attempt {attempts} of B came up unconfirmed; watchdog reset",
                vm.name()
            ));
            vm.system_reset()?;
            self.boots += 1;
        }
        self.check(attempts == tries, || {
            format!("B was tried {attempts} times, expected exactly its {tries} tries")
        })?;
        Ok(())
    }

    /// On v1 after a failed B: status shows B bad, not bootable, and why; A good and booted.
    fn explain_failed_b(&mut self, vm: &mut Vm, version: &str, events: &[Event]) -> Result<()> {
        self.explain_failed_b_on(vm, "v1", version, events)
    }

    /// [`Self::explain_failed_b`] with A running `a_version`.
    fn explain_failed_b_on(
        &mut self,
        vm: &mut Vm,
        a_version: &str,
        version: &str,
        events: &[Event],
    ) -> Result<()> {
        let st = self.status(vm)?;
        self.check(
            st.booted == Some(Slot::A) && st.next_boot == Slot::A,
            || format!("booted {:?} next {}, expected A/A", st.booted, st.next_boot),
        )?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some(a_version))?;
        self.check_slot(&st, Slot::B, SlotState::Bad, Some(version))?;
        let b = sl(&st, Slot::B);
        self.check(matches!(b.boot, SlotBoot::Bad), || {
            format!("bootloader still has B as {:?}", b.boot)
        })?;
        let d = b
            .last_decision
            .as_ref()
            .ok_or_else(|| self.fail("status has no decision about slot B"))?;
        self.check(
            events.contains(&d.event) && !d.why.trim().is_empty(),
            || {
                format!(
                    "last decision about B is {:?} ({}), expected one of {events:?} with a reason",
                    d.event, d.why
                )
            },
        )?;
        let human = vm.run_ok("k3os-ops slot status", CMD)?;
        self.check(human.contains(&d.why), || {
            format!(
                "`slot status` does not show why B failed ({}):\n{human}",
                d.why
            )
        })?;
        self.note(format!(
            "slot status on {a_version}: B is bad, {:?}: {}",
            d.event, d.why
        ));
        Ok(())
    }

    // ---------------------------------------------------------------- scenario 3

    fn badhealth(&mut self) -> Result<()> {
        let version = "v2-badhealth";
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.upgrade_to(&mut vm, &srv, version, "")?;
        let st = self.status(&mut vm)?;
        let tries = sl(&st, Slot::B).tries_left.unwrap_or(0);
        self.reboot(&mut vm)?;
        let t0 = Instant::now();
        self.expect_boot(&mut vm, Slot::B, version)?;
        vm.expect_not(
            "K3OS-CONFIRM failed",
            &["K3OS-CONFIRM ok", "K3OS-NOCONFIRM"],
            READY,
        )?;
        vm.expect("K3OS-ROLLBACK", READY)?;
        self.boots += 1;
        self.expect_boot(&mut vm, Slot::A, "v1")?;
        self.note(format!("{}: B failed its health check and rolled back after one boot of {tries} tries ({:.1}s)", vm.name(), t0.elapsed().as_secs_f64()));
        self.ready(&mut vm)?;
        self.explain_failed_b(&mut vm, version, &[Event::HealthFailed, Event::RolledBack])?;
        Ok(())
    }

    // ---------------------------------------------------------------- missing kernel

    fn missing_kernel(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.upgrade_to(&mut vm, &srv, "v2", "")?;
        vm.run_ok("rm /boot/b/vmlinuz && sync", CMD)?;
        self.reboot(&mut vm)?;
        let t0 = Instant::now();
        let (slot, version) = self.booted(&mut vm)?;
        self.check(slot == Slot::A && version == "v1", || {
            format!("with B's kernel gone the node booted {slot} {version}, expected A v1")
        })?;
        self.note(format!(
            "{}: B's kernel missing, the bootloader fell back to A v1 ({:.1}s)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        let b = sl(&st, Slot::B);
        self.check(st.next_boot == Slot::A, || {
            format!("after the fallback B still boots next: {b:?}")
        })?;
        if let Some(d) = &b.last_decision {
            self.note(format!(
                "slot status on v1: B is {}, {:?}: {}",
                b.state, d.event, d.why
            ));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- awaited check

    /// Stage v2 and activate it awaiting `node-ready` within `limit_secs`, as the agent does;
    /// then reboot and wait until the boot-time confirm of B says it is pending.
    fn pending_trial(&mut self, vm: &mut Vm, srv: &ReleaseServer, limit_secs: u64) -> Result<()> {
        self.upgrade_to(vm, srv, "v2", "--stage-only")?;
        vm.run_ok(
            &format!("k3os-ops slot activate --await node-ready --within-secs {limit_secs}"),
            CMD,
        )?;
        self.reboot(vm)?;
        self.expect_boot(vm, Slot::B, "v2")?;
        vm.expect_not(
            "K3OS-CONFIRM pending",
            &["K3OS-CONFIRM ok", "K3OS-CONFIRM failed", "Kernel panic"],
            READY,
        )?;
        vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
        vm.wait_shell(CMD)?;
        let st = self.status(vm)?;
        let outcome = st.verdict.as_ref().map(|v| v.outcome.clone());
        self.check(
            matches!(outcome, Some(libupgrade::Outcome::Pending { .. }))
                && sl(&st, Slot::B).state == SlotState::Trying,
            || format!("B must be on trial, its bless pending: {st:?}"),
        )
    }

    fn awaited_check(&mut self) -> Result<()> {
        // Long enough for the shell and one `slot status` under TCG before it strikes.
        const LIMIT: u64 = 45;
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;

        // Never reported (k3s or the agent broken in v2): rolled back at the limit, by itself.
        self.pending_trial(&mut vm, &srv, LIMIT)?;
        let t0 = Instant::now();
        vm.expect_not(
            "K3OS-SHUTDOWN reboot",
            &["Kernel panic"],
            Duration::from_secs(LIMIT) + READY,
        )?;
        self.boots += 1;
        self.expect_boot(&mut vm, Slot::A, "v1")?;
        self.note(format!(
            "{}: node-ready never reported: await-bless rolled back and rebooted into A {:.1}s after B's shell was ready (limit {LIMIT} s)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        let b = sl(&st, Slot::B);
        let why = b
            .last_decision
            .as_ref()
            .map(|d| d.why.clone())
            .unwrap_or_default();
        self.check(
            b.state == SlotState::Bad
                && st.next_boot == Slot::A
                && why.contains(&format!("node-ready: not reported within {LIMIT} s")),
            || format!("B must be bad, with the missing node-ready as the reason: {b:?}"),
        )?;
        self.note(format!("slot status on v1: B is {}: {why}", b.state));

        // Reported in time: blessed, and it stays.
        self.pending_trial(&mut vm, &srv, 600)?;
        let out = vm.run_ok("k3os-ops slot confirm --passed node-ready", CMD)?;
        self.check(out.contains("slot B (v2) is good (confirmed now)"), || {
            format!("the report must bless B: {out}")
        })?;
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        self.note(format!(
            "{}: node-ready reported: B blessed, booted again as good",
            vm.name()
        ));
        Ok(())
    }

    // ---------------------------------------------------------------- scenario 4

    fn powercut(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        // Dry run: count the barriers of a complete upgrade.
        let mut node = self.node("dry-run")?;
        let mut vm = self.boot_v1(&mut node)?;
        let out = self.upgrade_to_env(&mut vm, &srv, "v2", "K3OS_OPS_BARRIERS=1", "")?;
        drop(vm);
        let barriers = parse_barriers(&out);
        self.check(!barriers.is_empty(), || {
            format!(
                "the upgrade printed no K3OS-BARRIER lines (K3OS_OPS_BARRIERS=1 was set):\n{out}"
            )
        })?;
        for (i, (n, _)) in barriers.iter().enumerate() {
            self.check(*n == i as u64 + 1, || {
                format!("barrier numbers are not 1..N: {barriers:?}")
            })?;
        }
        let total = barriers.len() as u64;
        let ks = sample(total, self.opts.all_barriers);
        self.note(format!(
            "upgrade has {total} barriers: {}; cutting at {ks:?}",
            barriers
                .iter()
                .map(|(n, name)| format!("{n}:{name}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        for k in ks {
            let name = &barriers[(k - 1) as usize].1;
            let t0 = Instant::now();
            let hit = self.cut_at(&srv, k, name)?;
            self.note(format!(
                "cut at barrier {k} ({hit}): recovered and verified in {:.1}s",
                t0.elapsed().as_secs_f64()
            ));
        }
        self.powercut_confirm(&srv)
    }

    /// Power cuts during `confirm` on the first boot of the new slot. init takes a one-shot
    /// request from the state partition (`/var/lib/k3os-ops/barrier-request`: `announce` or
    /// `stop k`, see images/files/rootfs-init.sh), so the cut lands inside the boot-time
    /// confirm. A dry run counts confirm's barriers; then the first and the last (every one
    /// with `--all-barriers`) are cut.
    fn powercut_confirm(&mut self, srv: &ReleaseServer) -> Result<()> {
        let mut node = self.node("confirm-dry-run")?;
        let mut vm = self.activated_v2(&mut node, srv, "announce")?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        let mut barriers = Vec::new();
        loop {
            let (i, line) = vm.expect_any(
                &["K3OS-BARRIER ", "K3OS-CONFIRM ok", "K3OS-CONFIRM failed"],
                READY,
            )?;
            match i {
                0 => barriers.extend(parse_barriers(&line)),
                1 => break,
                _ => return Err(self.fail(format!("confirm of v2 failed in the dry run: {line}"))),
            }
        }
        drop(vm);
        self.check(!barriers.is_empty(), || {
            "confirm printed no K3OS-BARRIER lines for barrier-request `announce`".to_string()
        })?;
        let total = barriers.len() as u64;
        let ks: Vec<u64> = if self.opts.all_barriers {
            (1..=total).collect()
        } else {
            let mut v = vec![1, total];
            v.dedup();
            v
        };
        self.note(format!(
            "confirm has {total} barriers: {}; cutting at {ks:?}",
            barriers
                .iter()
                .map(|(n, name)| format!("{n}:{name}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        for k in ks {
            let name = barriers[(k - 1) as usize].1.clone();
            let t0 = Instant::now();
            self.cut_confirm_at(srv, k, &name)?;
            self.note(format!(
                "confirm cut at barrier {k} ({name}): recovered and verified in {:.1}s",
                t0.elapsed().as_secs_f64()
            ));
        }
        Ok(())
    }

    /// A fresh node on v1 that staged and activated v2, with `request` left for the next
    /// boot's init; rebooted (the returned guest is booting).
    fn activated_v2(&mut self, node: &mut Node, srv: &ReleaseServer, request: &str) -> Result<Vm> {
        let mut vm = self.boot_v1(node)?;
        self.upgrade_to(&mut vm, srv, "v2", "")?;
        vm.run_ok(
            &format!("echo '{request}' >/var/lib/k3os-ops/barrier-request && sync"),
            CMD,
        )?;
        self.reboot(&mut vm)?;
        Ok(vm)
    }

    /// Cut the power at barrier `k` of the boot-time confirm of v2, then check the node comes
    /// up on a confirmed slot and that B ends good (booted) or recoverable.
    fn cut_confirm_at(&mut self, srv: &ReleaseServer, k: u64, name: &str) -> Result<()> {
        let mut node = self.node(&format!("confirm-cut-{k:02}"))?;
        let mut vm = self.activated_v2(&mut node, srv, &format!("stop {k}"))?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        vm.expect_not(
            &format!("K3OS-BARRIER-STOP {k} "),
            &["K3OS-CONFIRM ok", "K3OS-CONFIRM failed"],
            READY,
        )?;
        vm.power_cut()?;

        let mut vm = self.power_on(&mut node)?;
        let (slot, version) = self.booted(&mut vm)?;
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        let b = sl(&st, Slot::B).clone();
        self.note(format!(
            "confirm cut at {k} ({name}): came up on {slot} {version}; B is {} / bootloader {:?}",
            b.state, b.boot
        ));
        self.check(sl(&st, slot).state == SlotState::Good, || {
            format!(
                "the booted slot {slot} is {} after confirm",
                sl(&st, slot).state
            )
        })?;
        match slot {
            Slot::B => {
                self.check(version == "v2", || format!("B runs {version}"))?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))
            }
            Slot::A => {
                // The trial was spent (syslinux's one try) or given up: never blessed, never
                // booted next, and a new upgrade brings v2 back.
                self.check(version == "v1", || format!("A runs {version}"))?;
                self.check(
                    b.state != SlotState::Good && st.next_boot == Slot::A,
                    || {
                        format!(
                            "booted A but B is {} and boots next: {}",
                            b.state, st.next_boot
                        )
                    },
                )?;
                let out = self.upgrade_to(&mut vm, srv, "v2", "")?;
                self.check(out.contains("activated slot B"), || {
                    format!(
                        "re-running the upgrade after the confirm cut did not activate B:\n{out}"
                    )
                })?;
                self.reboot(&mut vm)?;
                self.expect_boot(&mut vm, Slot::B, "v2")?;
                self.ready(&mut vm)?;
                let st = self.status(&mut vm)?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))
            }
        }
    }

    /// Cut the power at barrier `k` of the v2 upgrade, then check the node and slot B.
    /// Returns the name of the barrier the upgrade actually stopped at.
    fn cut_at(&mut self, srv: &ReleaseServer, k: u64, name: &str) -> Result<String> {
        let mut node = self.node(&format!("cut-{k:02}"))?;
        let mut vm = self.boot_v1(&mut node)?;
        vm.send_line(&format!(
            "K3OS_OPS_BARRIER_STOP={k} k3os-ops upgrade --quiet --source {}; echo \"@@NOSTOP$(({k}))@@ rc=$?\"",
            srv.guest_url("v2")
        ))?;
        let (i, line) = vm.expect_any(
            &[
                &format!("K3OS-BARRIER-STOP {k} "),
                &format!("@@NOSTOP{k}@@"),
            ],
            DOWNLOAD,
        )?;
        // Download checkpoints are taken by bytes *and* time, so on a slower run barrier k can be
        // a different step than in the dry run (or past the last one): judge the cut by the
        // barrier actually hit.
        let hit = if i == 0 {
            line.split_whitespace()
                .last()
                .unwrap_or_default()
                .to_string()
        } else {
            self.check(line.contains("rc=0"), || {
                format!("the upgrade with a stop at barrier {k} failed: `{line}`")
            })?;
            "activate:completed".to_string()
        };
        if hit != name {
            self.note(format!(
                "barrier {k} is {hit} in this run ({name} in the dry run: checkpoints are time-driven)"
            ));
        }
        let name = hit.as_str();
        vm.power_cut()?;

        let mut vm = self.power_on(&mut node)?;
        let (slot, version) = self.booted(&mut vm)?;
        let activated = name.starts_with("activate:");
        match slot {
            Slot::A => self.check(version == "v1", || {
                format!("after the cut A runs {version}")
            })?,
            Slot::B => self.check(activated && version == "v2", || {
                format!("after a cut at {name} the node booted B {version}")
            })?,
        }
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        let booted = sl(&st, slot);
        self.check(booted.state == SlotState::Good, || {
            format!("the booted slot {slot} is {} after confirm", booted.state)
        })?;
        let b = sl(&st, Slot::B).clone();
        self.note(format!(
            "cut at {k} ({name}): came up on {slot} {version}; B is {} / bootloader {:?}",
            b.state, b.boot
        ));
        match b.state {
            SlotState::Good => {
                self.check(slot == Slot::B, || {
                    "B is good but the node did not boot it".to_string()
                })?;
            }
            SlotState::Staged | SlotState::Trying => {
                // Complete and valid: the same release stages as a no-op, and it boots.
                let out = self.upgrade_to(&mut vm, srv, "v2", "--stage-only")?;
                self.check(out.contains("already holds v2"), || {
                    format!(
                        "B is {} but re-staging v2 did not report it already staged:\n{out}",
                        b.state
                    )
                })?;
                if st.next_boot != Slot::B {
                    vm.run_ok("k3os-ops slot activate", CMD)?;
                }
                self.reboot(&mut vm)?;
                self.expect_boot(&mut vm, Slot::B, "v2")?;
                self.ready(&mut vm)?;
                let st = self.status(&mut vm)?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
            }
            SlotState::Empty | SlotState::Invalid | SlotState::Bad => {
                // Not valid: the bootloader must not pick it; a new upgrade must recover.
                self.check(slot == Slot::A && st.next_boot == Slot::A, || {
                    format!("B is {} but boots next ({})", b.state, st.next_boot)
                })?;
                self.check(
                    !matches!(b.boot, SlotBoot::Good | SlotBoot::Trying { .. }),
                    || format!("B is {} but the bootloader has it as {:?}", b.state, b.boot),
                )?;
                let out = self.upgrade_to(&mut vm, srv, "v2", "")?;
                self.check(out.contains("activated slot B"), || {
                    format!("re-running the upgrade after the cut did not activate B:\n{out}")
                })?;
                self.reboot(&mut vm)?;
                self.expect_boot(&mut vm, Slot::B, "v2")?;
                self.ready(&mut vm)?;
                let st = self.status(&mut vm)?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
            }
        }
        Ok(hit)
    }

    // ---------------------------------------------------------------- upgrade from previous

    /// The previous release's disk (built by its own code) upgraded by its own binary to the
    /// current code, then by the current binary, then a failing release; then power cuts
    /// inside the first migrating write.
    fn upgrade_from_previous(&mut self) -> Result<()> {
        let prev = Previous::load(&self.root, self.target)?;
        self.note(format!(
            "previous release {} (commit {}), its disk {}",
            prev.version,
            prev.commit,
            prev.disk.display()
        ));
        let srv = self.server(0)?;

        // 1. The previous release's node: A v1 running the previous k3os-ops, confirmed.
        let mut node = self.node_from("node", &prev.disk)?;
        let mut vm = self.boot_v1(&mut node)?;
        let sum = self.ops_sha256(&mut vm)?;
        self.check(sum == prev.ops_sha256, || {
            format!(
                "A v1 runs a k3os-ops with sha256 {sum}, not the previous release's ({})",
                prev.ops_sha256
            )
        })?;
        let st = self.loose_status(&mut vm)?;
        st.expect(self, "A", "good", "v1")?;
        self.check(st.booted.as_deref() == Some("A"), || {
            format!("the previous release's status says booted {:?}", st.booted)
        })?;
        let script_before = self.boot_script(&mut vm)?;
        self.note(format!(
            "step 1: A v1 runs {}'s k3os-ops (sha256 {}), confirmed; boot script version {script_before}",
            prev.version,
            &sum[..12]
        ));

        // 2. The OLD binary upgrades to a current-code v2; B boots under the old boot script and
        // env, the current binary's boot-time confirm blesses it (its barriers announced: the
        // power cuts below land in them).
        let out = self.upgrade_to(&mut vm, &srv, "v2", "")?;
        let st = self.loose_status(&mut vm)?;
        st.expect(self, "B", "trying", "v2")
            .map_err(|e| self.fail(format!("{e}; the old binary's upgrade printed:\n{out}")))?;
        self.check(st.next_boot.as_deref() == Some("B"), || {
            format!(
                "after the old binary's upgrade next boot is {:?}",
                st.next_boot
            )
        })?;
        vm.run_ok(
            "echo announce >/var/lib/k3os-ops/barrier-request && sync",
            CMD,
        )?;
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        let barriers = self.confirm_barriers(&mut vm)?;
        vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
        vm.wait_shell(CMD)?;
        let sum2 = self.ops_sha256(&mut vm)?;
        self.check(sum2 != prev.ops_sha256, || {
            "B v2 runs the previous release's k3os-ops, not the current one".to_string()
        })?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;
        self.check(matches!(sl(&st, Slot::B).boot, SlotBoot::Good), || {
            format!(
                "the bootloader has B as {:?}, expected good",
                sl(&st, Slot::B).boot
            )
        })?;
        self.check(
            st.booted == Some(Slot::B) && st.next_boot == Slot::B,
            || format!("booted {:?} next {}, expected B/B", st.booted, st.next_boot),
        )?;
        let script_b = self.boot_script(&mut vm)?;
        self.check(st.boot_script.installed == Some(script_b), || {
            format!(
                "slot status says the installed boot script is {:?}, the file is version {script_b}",
                st.boot_script
            )
        })?;
        self.check(script_b == script_before, || {
            format!("B's boot-time confirm replaced the boot script (version {script_before} -> {script_b}): B must be blessed under the previous release's script")
        })?;
        self.note(format!(
            "step 2: the old binary staged and activated v2; B v2 (current k3os-ops) booted under the previous boot script (version {script_before}) and its confirm blessed it; confirm barriers {}; boot script still version {script_b}",
            fmt_barriers(&barriers)
        ));

        // 3. The current binary upgrades to v3 (into A): blessed, and the node runs the current
        // boot script.
        let out = self.upgrade_to(&mut vm, &srv, "v3", "")?;
        self.check(
            out.contains("staged v3") && out.contains("into slot A"),
            || format!("upgrade output does not say v3 was staged into A:\n{out}"),
        )?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Trying, Some("v3"))?;
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::A, "v3")?;
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v3"))?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        let script_after = self.boot_script(&mut vm)?;
        let script_status = self.status_script_field(&mut vm)?;
        self.check(st.boot_script.installed == Some(script_after), || {
            format!(
                "slot status says the installed boot script is {:?}, the file is version {script_after}",
                st.boot_script
            )
        })?;
        let current = self.current_script();
        if self.release_carries_script("v3")? {
            self.check(script_after == current, || {
                format!("v3 carries the current boot script but after its activation the node runs version {script_after}, expected {current}")
            })?;
        } else {
            self.note(format!(
                "v3 carries no boot script (its manifest's boot.scripts has none for this loader): the node keeps version {script_after} (the current code renders {current}); not asserted"
            ));
        }
        self.note(format!(
            "step 3: the current binary upgraded to v3 into A, blessed; boot script version {script_after}; slot status reports: {script_status}"
        ));

        // 4. A failing release (panics in its initrd) falls back to A v3 by itself.
        self.upgrade_to(&mut vm, &srv, "v4-panic", "")?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some("v4-panic"))?;
        let tries = match sl(&st, Slot::B).boot {
            SlotBoot::Trying { tries_left } => tries_left as u32,
            b => {
                return Err(self.fail(format!(
                    "bootloader has B as {b:?} after activating v4-panic, expected trying"
                )))
            }
        };
        self.reboot(&mut vm)?;
        self.sit_out_trial(&mut vm, "v4-panic", tries, false, Slot::A, "v3")?;
        self.ready(&mut vm)?;
        self.explain_failed_b_on(&mut vm, "v3", "v4-panic", &[Event::FallbackTaken])?;
        drop(vm);

        // 5. Power cuts inside the first migrating write.
        let ks: Vec<u64> = if self.opts.all_barriers {
            barriers.iter().map(|(n, _)| *n).collect()
        } else {
            vec![first_migrating_barrier(&barriers)]
        };
        self.note(format!("power cuts in the migrating confirm at {ks:?}"));
        for k in ks {
            let name = barriers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, name)| name.clone())
                .unwrap_or_default();
            let t0 = Instant::now();
            self.previous_cut_at(&srv, &prev, k, &name)?;
            self.note(format!(
                "step 5: cut at confirm barrier {k} ({name}) of the migrating boot: recovered and verified in {:.1}s",
                t0.elapsed().as_secs_f64()
            ));
        }
        Ok(())
    }

    /// The boot-time confirm's `K3OS-BARRIER` lines, up to `K3OS-CONFIRM ok`.
    fn confirm_barriers(&mut self, vm: &mut Vm) -> Result<Vec<(u64, String)>> {
        let mut barriers = Vec::new();
        loop {
            let (i, line) = vm.expect_any(
                &[
                    "K3OS-BARRIER ",
                    "K3OS-CONFIRM ok",
                    "K3OS-CONFIRM failed",
                    "K3OS-CONFIRM pending",
                    "Kernel panic",
                ],
                READY,
            )?;
            match i {
                0 => barriers.extend(parse_barriers(&line)),
                1 => break,
                _ => {
                    return Err(self.fail(format!(
                    "{}: the boot-time confirm did not bless the slot: `{line}` (console log {})",
                    vm.name(),
                    vm.log().display()
                )))
                }
            }
        }
        self.check(!barriers.is_empty(), || {
            "confirm printed no K3OS-BARRIER lines for barrier-request `announce`".to_string()
        })?;
        Ok(barriers)
    }

    /// A fresh previous-release node upgraded to v2 by its old binary; confirm of v2's first
    /// boot stops at barrier `k` and the power is cut. The node must boot (never stuck), end
    /// blessed on B or safely on A, say why, and recover.
    fn previous_cut_at(
        &mut self,
        srv: &ReleaseServer,
        prev: &Previous,
        k: u64,
        name: &str,
    ) -> Result<()> {
        let mut node = self.node_from(&format!("cut-{k:02}"), &prev.disk)?;
        let mut vm = self.boot_v1(&mut node)?;
        self.upgrade_to(&mut vm, srv, "v2", "")?;
        vm.run_ok(
            &format!("echo 'stop {k}' >/var/lib/k3os-ops/barrier-request && sync"),
            CMD,
        )?;
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        vm.expect_not(
            &format!("K3OS-BARRIER-STOP {k} "),
            &["K3OS-CONFIRM ok", "K3OS-CONFIRM failed", "Kernel panic"],
            READY,
        )?;
        vm.power_cut()?;

        let mut vm = self.power_on(&mut node)?;
        let (slot, version) = self.booted(&mut vm)?;
        self.ready(&mut vm)?;
        match slot {
            Slot::B => {
                self.check(version == "v2", || format!("B runs {version}"))?;
                let st = self.status(&mut vm)?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
                self.note(format!(
                    "cut at {k} ({name}): came up on B v2, blessed; B bootloader {:?}",
                    sl(&st, Slot::B).boot
                ));
            }
            Slot::A => {
                // Safely back on the previous release (its own binary confirms A): B is not
                // good and not next, status says why; its old binary's upgrade recovers.
                self.check(version == "v1", || format!("A runs {version}"))?;
                let st = self.loose_status(&mut vm)?;
                st.expect(self, "A", "good", "v1")?;
                let b = st.slot("B");
                self.check(
                    b.is_some_and(|b| b.state != "good") && st.next_boot.as_deref() == Some("A"),
                    || {
                        format!(
                            "back on A v1 but B is {b:?} and next boot {:?}",
                            st.next_boot
                        )
                    },
                )?;
                let why = b.and_then(|b| b.why.clone()).unwrap_or_default();
                self.check(!why.trim().is_empty(), || {
                    format!("back on A v1 but status gives no reason about B: {b:?}")
                })?;
                self.note(format!(
                    "cut at {k} ({name}): came up on A v1 (previous binary); B is {}: {why}",
                    b.map(|b| b.state.as_str()).unwrap_or("?")
                ));
                self.upgrade_to(&mut vm, srv, "v2", "")?;
                self.reboot(&mut vm)?;
                self.expect_boot(&mut vm, Slot::B, "v2")?;
                self.ready(&mut vm)?;
                let st = self.status(&mut vm)?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
            }
        }
        Ok(())
    }

    /// sha256 of the k3os-ops the node runs.
    fn ops_sha256(&mut self, vm: &mut Vm) -> Result<String> {
        let out = vm.run_ok("sha256sum \"$(command -v k3os-ops)\"", CMD)?;
        out.split_whitespace()
            .find(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_string)
            .ok_or_else(|| self.fail(format!("no sha256 in `sha256sum k3os-ops`: {out}")))
    }

    /// The version of the boot script installed on /boot (`grub.cfg`, or `extlinux.conf`),
    /// read from the guest's file by bootconfig's own rules (v0.1.0's scripts have no marker
    /// line and are version 1).
    fn boot_script(&mut self, vm: &mut Vm) -> Result<u32> {
        let path = if self.target.uses_grub() {
            "/boot/grub/grub.cfg"
        } else {
            "/boot/syslinux/extlinux.conf"
        };
        let text = vm.run_ok(&format!("cat {path}"), CMD)?;
        let p = Path::new(path);
        let v = if self.target.uses_grub() {
            bootconfig::grub::GrubScript::of_cfg(p, &text).map(|v| v.number())
        } else {
            bootconfig::syslinux::conf_version(p, &text)
        };
        v.map_err(|e| self.fail(format!("{}: the installed {path}: {e}", vm.name())))
    }

    /// The version of the boot script the current code renders for this target.
    fn current_script(&self) -> u32 {
        if self.target.uses_grub() {
            bootconfig::grub::GrubScript::CURRENT.number()
        } else {
            bootconfig::syslinux::CONF_VERSION
        }
    }

    /// Whether current release `version` carries this target's boot script for the node to
    /// install (its manifest's `boot.scripts`).
    fn release_carries_script(&self, version: &str) -> Result<bool> {
        let m = self
            .target
            .releases(&self.root)
            .join(version)
            .join(libupgrade::manifest::MANIFEST_FILE);
        let text = std::fs::read(&m).map_err(|e| Error::io("read", &m, e))?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            Error::io(
                "parse",
                &m,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        let kind = if self.target.uses_grub() {
            "grub-cfg"
        } else {
            "extlinux-conf"
        };
        Ok(v.pointer("/boot/scripts")
            .and_then(|x| x.as_array())
            .is_some_and(|a| {
                a.iter()
                    .any(|f| f.get("kind").and_then(|k| k.as_str()) == Some(kind))
            }))
    }

    /// What the current binary's `slot status --json` says about the installed boot script
    /// (any top-level field naming a script), or that it says nothing.
    fn status_script_field(&mut self, vm: &mut Vm) -> Result<String> {
        fn find(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
            if let Some(o) = v.as_object() {
                for (k, x) in o {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    if k.contains("script") {
                        out.push(format!("{path}={x}"));
                    } else {
                        find(x, &path, out);
                    }
                }
            }
        }
        let v = self.status_value(vm)?;
        let mut fields = Vec::new();
        find(&v, "", &mut fields);
        Ok(if fields.is_empty() {
            "no script field".into()
        } else {
            fields.join(" ")
        })
    }

    /// `k3os-ops slot status --json` as a JSON value (any release's binary).
    fn status_value(&mut self, vm: &mut Vm) -> Result<serde_json::Value> {
        let cmd = "k3os-ops slot status --json";
        let out = vm.run_ok(cmd, CMD)?;
        let (a, b) = (out.find('{'), out.rfind('}'));
        let text = match (a, b) {
            (Some(a), Some(b)) if b > a => &out[a..=b],
            _ => &out[..],
        };
        serde_json::from_str(text).map_err(|e| Error::Json {
            vm: vm.name().into(),
            cmd: cmd.into(),
            err: e.to_string(),
            text: out.clone(),
        })
    }

    /// `slot status --json` read leniently: the previous release's binary may print other
    /// fields (or fewer) than libupgrade's current types.
    fn loose_status(&mut self, vm: &mut Vm) -> Result<LooseStatus> {
        let v = self.status_value(vm)?;
        Ok(LooseStatus::from_json(&v))
    }
}

/// The previous release's outputs for one target (images/out/previous/<arch>/).
struct Previous {
    version: String,
    commit: String,
    disk: PathBuf,
    /// sha256 of the k3os-ops in its v1 rootfs.
    ops_sha256: String,
}

impl Previous {
    fn load(root: &Path, target: Target) -> Result<Previous> {
        target.check_previous_inputs(root)?;
        let changelog = root.join("CHANGELOG.md");
        let text =
            std::fs::read_to_string(&changelog).map_err(|e| Error::io("read", &changelog, e))?;
        let (version, commit) =
            crate::target::previous_release(&text).expect("checked by check_previous_inputs");
        let sum = target.previous_dir(root).join("k3os-ops.sha256");
        let ops_sha256 = std::fs::read_to_string(&sum)
            .map_err(|e| Error::io("read", &sum, e))?
            .trim()
            .to_string();
        let stamp = target.previous_dir(root).join("previous.stamp");
        let built = std::fs::read_to_string(&stamp).unwrap_or_default();
        if !built.contains(&commit) {
            return Err(Error::Missing {
                what: format!("previous disks built from {version}'s commit {commit} (previous.stamp says otherwise)"),
                path: stamp,
                hint: "rebuild them with `just images-previous`".into(),
            });
        }
        Ok(Previous {
            version,
            commit,
            disk: target.previous_disk(root),
            ops_sha256,
        })
    }
}

/// One slot of [`LooseStatus`].
#[derive(Debug, Clone, Default)]
pub struct LooseSlot {
    pub slot: String,
    pub state: String,
    pub version: Option<String>,
    /// The reason of its last decision, if any.
    pub why: Option<String>,
}

/// `slot status --json` of any release: only the fields every release has had (v0.1.0 on).
#[derive(Debug, Clone, Default)]
pub struct LooseStatus {
    pub booted: Option<String>,
    pub next_boot: Option<String>,
    pub slots: Vec<LooseSlot>,
}

impl LooseStatus {
    pub fn from_json(v: &serde_json::Value) -> LooseStatus {
        let s =
            |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
        LooseStatus {
            booted: s(v, "booted"),
            next_boot: s(v, "next_boot"),
            slots: v
                .get("slots")
                .and_then(|x| x.as_array())
                .map(|a| {
                    a.iter()
                        .map(|x| LooseSlot {
                            slot: s(x, "slot").unwrap_or_default(),
                            state: s(x, "state").unwrap_or_default(),
                            version: s(x, "version"),
                            why: x.get("last_decision").and_then(|d| s(d, "why")),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    pub fn slot(&self, name: &str) -> Option<&LooseSlot> {
        self.slots.iter().find(|s| s.slot == name)
    }

    fn expect(&self, sc: &Scenario, slot: &str, state: &str, version: &str) -> Result<()> {
        let s = self.slot(slot);
        sc.check(
            s.is_some_and(|s| s.state == state && s.version.as_deref() == Some(version)),
            || format!("slot {slot} is {s:?}, expected {state} {version}; status: {self:?}"),
        )
    }
}

/// The first barrier of the migrating confirm that writes the bootloader's state (where the
/// env written by the previous release is first rewritten by the current code); the first
/// barrier when none is named so.
pub fn first_migrating_barrier(barriers: &[(u64, String)]) -> u64 {
    barriers
        .iter()
        .find(|(_, n)| n.contains("bootloader") || n.contains("grub") || n.contains("env"))
        .or(barriers.first())
        .map(|(k, _)| *k)
        .unwrap_or(1)
}

fn fmt_barriers(b: &[(u64, String)]) -> String {
    b.iter()
        .map(|(n, name)| format!("{n}:{name}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn sl(st: &Status, slot: Slot) -> &SlotStatus {
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

/// The `K3OS-BARRIER <n> <name>` lines of a command's output, in order.
pub fn parse_barriers(out: &str) -> Vec<(u64, String)> {
    out.lines()
        .filter_map(|l| {
            let rest = &l[l.find("K3OS-BARRIER ")? + "K3OS-BARRIER ".len()..];
            let (n, name) = rest.trim().split_once(' ')?;
            Some((n.parse().ok()?, name.trim().to_string()))
        })
        .collect()
}

/// Barriers to cut at: all, or the first, the last and every third.
pub fn sample(total: u64, all: bool) -> Vec<u64> {
    if total == 0 {
        return Vec::new();
    }
    let mut v: Vec<u64> = if all {
        (1..=total).collect()
    } else {
        (1..=total).step_by(3).collect()
    };
    if !v.contains(&total) {
        v.push(total);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_boot_lines_and_barriers() {
        assert_eq!(
            parse_booted("[  3.1] K3OS-BOOTED slot=B version=v2-panic"),
            Some((Slot::B, "v2-panic".into()))
        );
        assert_eq!(parse_booted("K3OS-BOOTED slot=unknown version=v1"), None);
        let out = "x\nK3OS-BARRIER 1 stage:bootloader-marked-bad\nK3OS-BARRIER 2 state:invalid\nstaged v2\n";
        assert_eq!(
            parse_barriers(out),
            vec![
                (1, "stage:bootloader-marked-bad".into()),
                (2, "state:invalid".into())
            ]
        );
    }

    #[test]
    fn migrating_barrier_and_loose_status() {
        let b = vec![
            (1, "confirm:boot-recorded".to_string()),
            (2, "confirm:bootloader-good".to_string()),
            (3, "confirm:state-good".to_string()),
        ];
        assert_eq!(first_migrating_barrier(&b), 2);
        assert_eq!(first_migrating_barrier(&b[..1]), 1);
        let v: serde_json::Value = serde_json::from_str(
            r#"{"booted":"A","next_boot":"A","bootloader":"grub","slots":[{"slot":"A","state":"good","version":"v1","last_decision":null},{"slot":"B","state":"bad","version":"v2","extra":1,"last_decision":{"event":"fallback_taken","why":"slot B did not confirm"}}]}"#,
        )
        .unwrap();
        let st = LooseStatus::from_json(&v);
        assert_eq!(st.booted.as_deref(), Some("A"));
        assert_eq!(st.slot("A").unwrap().version.as_deref(), Some("v1"));
        assert_eq!(
            st.slot("B").unwrap().why.as_deref(),
            Some("slot B did not confirm")
        );
    }

    #[test]
    fn sampling_keeps_first_and_last() {
        assert_eq!(sample(10, false), vec![1, 4, 7, 10]);
        assert_eq!(sample(11, false), vec![1, 4, 7, 10, 11]);
        assert_eq!(sample(3, true), vec![1, 2, 3]);
        assert_eq!(sample(1, false), vec![1]);
        assert!(sample(0, true).is_empty());
    }

    #[test]
    fn names_round_trip() {
        for k in ScenarioKind::ALL {
            assert_eq!(k.name().parse::<ScenarioKind>().unwrap(), k);
        }
        for t in Target::ALL {
            assert_eq!(t.name().parse::<Target>().unwrap(), t);
        }
        assert!("x86_64-uboot".parse::<Target>().is_err());
    }
}
