//! `upgrade`: v1 on A stages v2 into B over a slowed HTTP server while the workload keeps
//! answering (from the host and from the guest shell), v2 boots, is blessed and stays after
//! another reboot, having fetched only what v1 did not hold; then v2 → v3 into A.

use std::time::{Duration, Instant};

use bootconfig::Slot;
use libupgrade::state::SlotState;
use libupgrade::Status;

use super::steps::{sl, Node, CMD, DOWNLOAD};
use super::Scenario;
use crate::error::Result;
use crate::server::{http_get, ReleaseServer};
use crate::vm::Vm;

/// Rate of the release server while the scenario watches the workload.
const SLOW_RATE: u64 = 1 << 20;

/// What the workload did while the download ran.
struct Watched {
    /// Host polls answered "alive" while a body was in flight.
    polls_ok: u32,
    /// Guest-shell commands answered while a body was in flight (at most 3 are tried).
    shell_ok: u32,
}

impl Scenario {
    pub(super) fn upgrade(&mut self) -> Result<()> {
        let srv = self.server(SLOW_RATE)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;
        self.check(st.booted == Some(Slot::A), || {
            format!("status says booted {:?}, expected A", st.booted)
        })?;
        self.workload_alive(&node, "before the upgrade")?;

        self.upgrade_while_serving(&mut vm, &node, &srv)?;
        srv.set_rate(0);
        self.v2_blessed(&mut vm, &node, &srv)?;

        // Still v2 after another reboot.
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        self.ready(&mut vm)?;

        self.upgrade_v3_into_a(&mut vm, &srv)?;
        Ok(())
    }

    /// Stage + activate v2 in the background while the workload is polled; the upgrade must
    /// say it staged v2 into B and activated B, and the workload must have answered while
    /// bytes were in flight.
    fn upgrade_while_serving(
        &mut self,
        vm: &mut Vm,
        node: &Node,
        srv: &ReleaseServer,
    ) -> Result<()> {
        let t0 = Instant::now();
        vm.run_ok(
            &format!(
                "rm -f /tmp/upgrade.rc; {{ k3os-ops upgrade --quiet --source {}; echo $? >/tmp/upgrade.rc; }} >/tmp/upgrade.log 2>&1 &",
                srv.guest_url("v2")
            ),
            CMD,
        )?;
        let Watched { polls_ok, shell_ok } = self.watch_workload(vm, node, srv, t0)?;
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
            srv.body_sent(),
            SLOW_RATE >> 10
        ));
        Ok(())
    }

    /// Poll the workload from the host (and a few times from the guest shell) while the
    /// server sends bodies, until the background upgrade has ended.
    fn watch_workload(
        &mut self,
        vm: &mut Vm,
        node: &Node,
        srv: &ReleaseServer,
        t0: Instant,
    ) -> Result<Watched> {
        let mut w = Watched {
            polls_ok: 0,
            shell_ok: 0,
        };
        let mut saw_transfer = false;
        while t0.elapsed() < DOWNLOAD {
            if srv.active() == 0 {
                // Not downloading: before the first request, between artifacts, or finished.
                std::thread::sleep(Duration::from_millis(300));
                if srv.active() == 0 && vm.run("[ ! -e /tmp/upgrade.rc ]", CMD)?.rc != 0 {
                    break;
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
                Ok(b) if b.trim() == "alive" && srv.active() > 0 => w.polls_ok += 1,
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
            if w.shell_ok < 3 {
                let o = vm.run("wget -q -O - http://127.0.0.1/ && cat /proc/loadavg", CMD)?;
                if o.rc == 0 && o.output.contains("alive") && srv.active() > 0 {
                    w.shell_ok += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(w)
    }

    /// B holds v2 on trial (through the delta path) and boots next; after the reboot it is
    /// blessed, booted, next, and the workload answers on it.
    fn v2_blessed(&mut self, vm: &mut Vm, node: &Node, srv: &ReleaseServer) -> Result<()> {
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some("v2"))?;
        self.check_delta(&st, srv.body_sent())?;
        self.check(st.next_boot == Slot::B, || {
            format!("next boot is {}, expected B", st.next_boot)
        })?;

        let st = self.reboot_into_good(vm, Slot::B, "v2")?;
        self.check_b_blessed_and_booted(&st)?;
        self.workload_alive(node, "on v2")
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
}
