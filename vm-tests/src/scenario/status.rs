//! What a scenario's node says and serves: `k3os-ops slot status --json` read off the shared
//! serial console (tagged lines only) and parsed with libupgrade's own types, the checks of
//! slots and trial tries made on it, and the workload's answer on the node's port 80.

use std::time::Duration;

use bootconfig::{Slot, SlotBoot};
use libupgrade::state::SlotState;
use libupgrade::Status;
use serde::de::DeserializeOwned;

use super::steps::{sl, Node, CMD};
use super::Scenario;
use crate::error::{Error, Result};
use crate::server::http_get;
use crate::vm::Vm;

/// What the node says and serves.
impl Scenario {
    /// `k3os-ops slot status --json`, parsed with libupgrade's own types.
    pub(super) fn status(&mut self, vm: &mut Vm) -> Result<Status> {
        status_json(vm)
    }

    /// `k3os-ops slot status --json` as a JSON value (any release's binary).
    pub(super) fn status_value(&mut self, vm: &mut Vm) -> Result<serde_json::Value> {
        status_json(vm)
    }

    pub(super) fn check_slot(
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

    /// B is good in the bootloader too, booted and booting next.
    pub(super) fn check_b_blessed_and_booted(&self, st: &Status) -> Result<()> {
        self.check(matches!(sl(st, Slot::B).boot, SlotBoot::Good), || {
            format!(
                "the bootloader has B as {:?}, expected good",
                sl(st, Slot::B).boot
            )
        })?;
        self.check(
            st.booted == Some(Slot::B) && st.next_boot == Slot::B,
            || format!("booted {:?} next {}, expected B/B", st.booted, st.next_boot),
        )
    }

    /// The tries the bootloader gives trial slot B (`after`: what put it on trial).
    pub(super) fn trial_tries(&self, st: &Status, after: &str) -> Result<u32> {
        match sl(st, Slot::B).boot {
            SlotBoot::Trying { tries_left } => Ok(tries_left as u32),
            b => Err(self.fail(format!(
                "bootloader has B as {b:?} after {after}, expected trying"
            ))),
        }
    }

    /// The workload on the node's port 80 answers "alive" (`when`: which boot, for the message).
    pub(super) fn workload_alive(&self, node: &Node, when: &str) -> Result<()> {
        let body = http_get(node.http_port, "/", Duration::from_secs(20))
            .map_err(|e| self.fail(format!("workload {when}: {e}")))?;
        self.check(body.trim() == "alive", || {
            format!("workload {when} answered {body:?}, expected \"alive\"")
        })
    }
}

/// `k3os-ops slot status --json` read as `T`. The guest's services and kernel write to the same
/// serial console (the confirm service's "slot B: … is good" can land between the JSON's lines),
/// so the guest tags each line of the JSON with a marker only the shell's expansion produces (the
/// echoed command cannot match), and only tagged lines are read.
fn status_json<T: DeserializeOwned>(vm: &mut Vm) -> Result<T> {
    let cmd = "k3os-ops slot status --json";
    let out = vm.run_ok(
        &format!(
            "{cmd} >/run/vm-tests-status.json && while IFS= read -r l || [ -n \"$l\" ]; do printf '%s\\n' \"{JSON_TAG_SH}$l\"; done </run/vm-tests-status.json"
        ),
        CMD,
    )?;
    let text = tagged_lines(&out);
    serde_json::from_str(&text).map_err(|e| Error::Json {
        vm: vm.name().into(),
        cmd: cmd.into(),
        err: e.to_string(),
        text: out.clone(),
    })
}

/// The tag [`status_json`] has the guest's shell print before each line of the JSON: `$((0))`
/// expands to `0`, so the typed command never contains [`JSON_TAG`] itself.
const JSON_TAG_SH: &str = "@@J$((0))@@ ";
const JSON_TAG: &str = "@@J0@@ ";

/// The text after [`JSON_TAG`] on each line that has it, as lines: another writer's text before
/// the tag on the same line, and other writers' whole lines, are dropped.
fn tagged_lines(out: &str) -> String {
    out.lines()
        .filter_map(|l| l.find(JSON_TAG).map(|i| &l[i + JSON_TAG.len()..]))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_read_around_other_writers_on_the_console() {
        let console = "@@J0@@ {\n[   9.1] random: crng init done\nslot B: 3 health check(s) passed; slot B is good\n[  9.2] x@@J0@@   \"slot\": \"B\"\n@@J0@@ }\n";
        let v: serde_json::Value = serde_json::from_str(&tagged_lines(console)).unwrap();
        assert_eq!(v, serde_json::json!({ "slot": "B" }));
        // The typed command (echoed) carries the unexpanded tag only.
        assert_eq!(
            tagged_lines(&format!("printf '%s\\n' \"{JSON_TAG_SH}$l\"")),
            ""
        );
    }
}
