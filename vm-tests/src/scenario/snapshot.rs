//! A booted v1 node saved once and resumed many times: a scenario that needs many fresh v1
//! nodes (`powercut`: one per cut) boots v1 once ([`Scenario::booted_v1_snapshot`]), saves
//! the idle guest's whole state with a QEMU migration to a file and keeps its disk (and UEFI
//! variables) as they were at that instant; each [`Scenario::restore_v1`] gives a new node
//! its own copy of that disk and resumes the guest from the file instead of booting it.
//!
//! A resumed guest is the saved one: the same kernel, the same processes, the shell at its
//! prompt. What differs is outside it: a new QEMU process (a new console and log, a new
//! forwarded host port), and the wall clock, which stood still while the state sat in its
//! file; it is set to the host's time, as on a node that just booted (the RTC gives a booting
//! guest the host's time). Both ends are checked: the saved guest and every resumed one must
//! report A v1 booted, good and next.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bootconfig::Slot;
use libupgrade::state::SlotState;

use super::steps::{sl, Node, CMD};
use super::Scenario;
use crate::error::Result;
use crate::vm::Vm;

/// How long saving a guest's state may take (a few hundred MiB of RAM, mostly zero pages).
const SAVE: Duration = Duration::from_secs(180);

/// The saved v1 guest: its state and its disk (and UEFI variables) of that instant.
pub(super) struct V1Snapshot {
    state: PathBuf,
    disk: PathBuf,
    vars: Option<PathBuf>,
}

impl Scenario {
    /// Boot a fresh node to A v1 (the run's one real v1 boot), check it, and save the idle
    /// guest (its QEMU stops after the save).
    pub(super) fn booted_v1_snapshot(&mut self) -> Result<V1Snapshot> {
        let mut node = self.node("v1-snapshot")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.is_booted_v1(&mut vm, "before saving it")?;
        let state = node.dir().join("state.bin");
        let t0 = Instant::now();
        vm.save_state(&state, SAVE)?;
        vm.stop()?;
        let size = std::fs::metadata(&state)
            .map(|m| m.len())
            .map_err(|e| crate::error::Error::io("read the saved state's size", &state, e))?;
        self.note(format!(
            "v1 saved after its boot: {:.1} MiB of guest state in {:.1}s ({})",
            size as f64 / (1024.0 * 1024.0),
            t0.elapsed().as_secs_f64(),
            state.display()
        ));
        Ok(V1Snapshot {
            state,
            disk: node.disk_path().to_path_buf(),
            vars: node.vars_path().map(PathBuf::from),
        })
    }

    /// A new node `name` with its own copy of the snapshot's disk (and variables), its guest
    /// resumed from the snapshot: A v1, booted, confirmed, the shell answering.
    pub(super) fn restore_v1(&mut self, snap: &V1Snapshot, name: &str) -> Result<(Node, Vm)> {
        let t0 = Instant::now();
        let mut node = self.node_from_files(name, &snap.disk, snap.vars.as_deref())?;
        let mut vm = self.resume(&mut node, &snap.state)?;
        vm.wait_running(CMD)?;
        vm.wait_shell(CMD)?;
        let lag = self.set_guest_clock(&mut vm)?;
        self.is_booted_v1(&mut vm, "resumed")?;
        self.note(format!(
            "{}: resumed v1 from the snapshot in {:.1}s (guest clock was {lag} s behind; set)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        Ok((node, vm))
    }

    /// `slot status` says A v1 is booted, good and boots next.
    fn is_booted_v1(&mut self, vm: &mut Vm, when: &str) -> Result<()> {
        let st = self.status(vm)?;
        let a = sl(&st, Slot::A);
        self.check(
            st.booted == Some(Slot::A)
                && st.next_boot == Slot::A
                && a.state == SlotState::Good
                && a.version.as_deref() == Some("v1"),
            || {
                format!(
                    "{} {when}: not a booted A v1 node: booted {:?}, next {}, A {} {:?}",
                    vm.name(),
                    st.booted,
                    st.next_boot,
                    a.state,
                    a.version
                )
            },
        )
    }

    /// Set the guest's wall clock to the host's (UTC) and return how far behind it was, in
    /// seconds; fails when the guest's clock is not within 5 s of the host's afterwards.
    fn set_guest_clock(&mut self, vm: &mut Vm) -> Result<i64> {
        let guest = |vm: &mut Vm| -> Result<i64> {
            let out = vm.run_ok("date -u +%s", CMD)?;
            out.lines()
                .rev()
                .find_map(|l| l.trim().parse::<i64>().ok())
                .ok_or_else(|| self.fail(format!("`date -u +%s` printed no number: {out:?}")))
        };
        let before = guest(vm)?;
        let now = chrono::Utc::now();
        vm.run_ok(
            &format!(
                "date -u -s '{}' >/dev/null",
                now.format("%Y-%m-%d %H:%M:%S")
            ),
            CMD,
        )?;
        let after = guest(vm)?;
        let host = chrono::Utc::now().timestamp();
        self.check((after - host).abs() <= 5, || {
            format!("the guest's clock is {after} after setting it, the host's {host}")
        })?;
        Ok(now.timestamp() - before)
    }
}
