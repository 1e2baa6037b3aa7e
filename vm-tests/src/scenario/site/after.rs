//! `site-upgrade` once the node runs v2-kube blessed: what a user reads with `kubectl` (the
//! channel's printer columns and conditions, the Node), the v2-only app Running with the
//! channel server stopped, the API server's audit log of the agent's requests, and the node's
//! own `slot status`; and the guest's logs when a step fails.

use std::path::Path;
use std::time::Duration;

use bootconfig::Slot;
use kube_testenv::TestEnv;
use libupgrade::state::SlotState;
use serde_json::Value;

use super::manifests::{AGENT_LABEL, AGENT_NS, APP, APP_IMAGE, CHANNEL, TARGET};
use super::{one_line, AGENT_USER, POD};
use crate::error::{Error, Result};
use crate::scenario::kube::NODE;
use crate::scenario::steps::CMD;
use crate::scenario::Scenario;
use crate::vm::Vm;

/// What the audit log says of the agent's ServiceAccount.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct AgentAudit {
    /// Requests it made.
    pub requests: usize,
    /// `verb resource/subresource name` of each request answered 403.
    pub forbidden: Vec<String>,
    /// Pods it evicted (Eviction API answered 201).
    pub evicted: Vec<String>,
    /// Reads of its own Node answered 200 (its in-cluster configuration works).
    pub node_reads: usize,
}

/// Read the audit log's JSON lines (level Metadata) for [`AGENT_USER`].
pub(super) fn agent_audit(log: &str) -> AgentAudit {
    let mut a = AgentAudit::default();
    for e in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if e["user"]["username"] != AGENT_USER {
            continue;
        }
        a.requests += 1;
        let o = &e["objectRef"];
        let name = o["name"].as_str().unwrap_or_default().to_string();
        match e["responseStatus"]["code"].as_u64() {
            Some(403) => a.forbidden.push(format!(
                "{} {}/{} {name}",
                e["verb"].as_str().unwrap_or_default(),
                o["resource"].as_str().unwrap_or_default(),
                o["subresource"].as_str().unwrap_or_default()
            )),
            Some(201) if o["subresource"] == "eviction" => a.evicted.push(name),
            Some(200) if e["verb"] == "get" && o["resource"] == "nodes" && name == NODE => {
                a.node_reads += 1
            }
            _ => {}
        }
    }
    a
}

/// `kubectl get upchan` output (header and one row) with the printer columns, [`TARGET`] and
/// `1/1` updated.
pub(super) fn shows_updated(table: &str) -> bool {
    let (head, row) = table.split_once('\n').unwrap_or((table, ""));
    ["VERSION", "LATEST", "UPDATING", "UPDATED", "CONCURRENCY"]
        .iter()
        .all(|c| head.contains(c))
        && row.contains(TARGET)
        && row.split_whitespace().any(|w| w == "1/1")
}

impl Scenario {
    /// The checks once the node runs [`TARGET`] blessed, Ready and uncordoned.
    pub(super) fn after_upgrade(
        &mut self,
        vm: &mut Vm,
        env: &mut TestEnv,
        kubectl: &Path,
    ) -> Result<()> {
        // The fleet counter refreshes the channel's counts on its own beat: wait for it, as a
        // user watching `kubectl get upchan -w` does.
        let get = ["-n", AGENT_NS, "get", "upchan", CHANNEL];
        let counted =
            self.wait_api(env, kubectl, POD, "`kubectl get upchan` showing 1/1", |k| {
                k(&get).map(|t| shows_updated(&t))
            })?;
        let run = |args: &[&str]| env.kubectl(kubectl, args);
        let table = run(&get).map_err(|e| self.fail(format!("kubectl get upchan: {e}")))?;
        self.note(format!(
            "kubectl get upchan ({counted:.1}s after the node's UpToDate): {}",
            one_line(&table)
        ));
        let ch: Value = run(&["-n", AGENT_NS, "get", "upchan", CHANNEL, "-o", "json"])
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let conds: Vec<String> = ch["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{}={} ({})", c["type"], c["status"], c["reason"]).replace('"', ""))
            .collect();
        self.check(conds.iter().any(|c| c.starts_with("Complete=True")), || {
            format!("the channel must say Complete=True: {conds:?}")
        })?;
        self.note(format!("UpdateChannel conditions: {}", conds.join(", ")));
        let node = run(&["get", "node", NODE]).unwrap_or_default();
        self.check(
            node.contains(" Ready") && !node.contains("SchedulingDisabled"),
            || format!("the Node must be Ready and schedulable:\n{node}"),
        )?;
        let jp = "-o=jsonpath={.items[*].status.containerStatuses[*].restartCount}";
        let restarts =
            run(&["-n", AGENT_NS, "get", "pods", "-l", AGENT_LABEL, jp]).unwrap_or_default();
        self.note(format!(
            "kubectl get node: {}; the agent pod's restarts: {restarts}",
            one_line(&node)
        ));
        let app = self.wait_api(env, kubectl, POD, "the v2-only app Running", |k| {
            let jp = "-o=jsonpath={.items[*].status.phase}";
            k(&["get", "pods", "-l", &format!("app={APP}"), jp]).map(|o| o.trim() == "Running")
        })?;
        self.note(format!(
            "api: {APP} ({APP_IMAGE}, only in {TARGET}'s payload) Running {app:.1}s after the bless, the channel server stopped"
        ));
        self.audit_checks(env)?;
        self.node_says_blessed(vm)
    }

    /// Wait until the audit log shows the agent reading its Node (at most [`POD`]): its pod
    /// reaches the API server at the overlay's address.
    pub(super) fn agent_reaches_api(&mut self, env: &TestEnv) -> Result<f64> {
        let t0 = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(env.audit_log()).unwrap_or_default();
            if agent_audit(&text).node_reads > 0 {
                return Ok(t0.elapsed().as_secs_f64());
            }
            if t0.elapsed() > POD {
                return Err(self.fail(format!(
                    "the agent pod never read its Node within {}s ({} in the audit log {})",
                    POD.as_secs(),
                    AGENT_USER,
                    env.audit_log().display()
                )));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// The audit log: the agent evicted the workload, and was refused nothing.
    pub(super) fn audit_checks(&mut self, env: &TestEnv) -> Result<()> {
        let p = env.audit_log();
        let text =
            std::fs::read_to_string(&p).map_err(|e| Error::io("read the audit log", &p, e))?;
        let a = agent_audit(&text);
        self.check(a.requests > 0 && a.forbidden.is_empty(), || {
            format!(
                "the agent's ServiceAccount must be refused nothing ({} requests); 403 for: {}",
                a.requests,
                a.forbidden.join(", ")
            )
        })?;
        self.check(a.evicted.iter().any(|p| p.starts_with(super::WEB)), || {
            format!(
                "the drain must evict {} through the Eviction API; evicted: {:?}",
                super::WEB,
                a.evicted
            )
        })?;
        self.note(format!(
            "audit log: {} requests by {AGENT_USER}, no 403; evictions (201): {}",
            a.requests,
            a.evicted.join(", ")
        ));
        Ok(())
    }

    /// `slot status` on the node: B booted, good, [`TARGET`]; containerd holds v2's images.
    pub(super) fn node_says_blessed(&mut self, vm: &mut Vm) -> Result<()> {
        vm.wait_shell(CMD)?;
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some(TARGET))?;
        self.check(st.booted == Some(Slot::B), || {
            format!("the node must run B: {st:?}")
        })?;
        let images = vm.run_ok("ctr -n k8s.io images ls -q", CMD)?;
        self.check(images.contains(APP_IMAGE), || {
            format!("containerd's k8s.io store lacks {APP_IMAGE}:\n{images}")
        })?;
        self.note(format!(
            "{}: slot status: B good {TARGET}, booted",
            vm.name()
        ));
        Ok(())
    }

    /// `e` with the agent pod's log tail, the console and the guest's logs.
    pub(super) fn site_logs(&mut self, vm: &mut Vm, e: Error) -> Error {
        let agent = vm
            .run(
                "tail -n 25 /var/log/pods/k3os-system_k3os-ops-agent-*/agent/*.log 2>&1",
                Duration::from_secs(20),
            )
            .map(|o| o.output)
            .unwrap_or_else(|e| format!("(the guest shell did not answer: {e})"));
        let e = self.fail(format!(
            "{}\n--- the agent pod's log, last lines:\n{agent}",
            e.detail()
        ));
        self.guest_logs(vm, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printer_columns_show_the_node_updated() {
        let head = "NAME   VERSION   LATEST   UPDATING   UPDATED   CONCURRENCY   AGE";
        assert!(shows_updated(&format!(
            "{head}\nsite   v2-kube      1/1   1   3m\n"
        )));
        assert!(!shows_updated(&format!(
            "{head}\nsite   v2-kube      0/1   1   3m\n"
        )));
        assert!(!shows_updated("site   v2-kube      1/1   1   3m\n"));
    }

    #[test]
    fn the_audit_log_names_the_agents_refusals_and_evictions() {
        let line = |user: &str, verb: &str, res: &str, sub: &str, name: &str, code: u32| {
            format!(
                r#"{{"kind":"Event","user":{{"username":"{user}"}},"verb":"{verb}","objectRef":{{"resource":"{res}","subresource":"{sub}","name":"{name}"}},"responseStatus":{{"code":{code}}}}}"#
            )
        };
        let log = [
            line(AGENT_USER, "create", "pods", "eviction", "site-web-1", 201),
            line(AGENT_USER, "create", "pods", "eviction", "site-web-2", 429),
            line(AGENT_USER, "patch", "nodes", "", "kube-node-1", 200),
            line("system:node:kube-node-1", "get", "secrets", "", "x", 403),
            "not json".to_string(),
        ]
        .join("\n");
        let a = agent_audit(&log);
        assert_eq!(a.requests, 3);
        assert_eq!(a.evicted, ["site-web-1"]);
        assert_eq!(a.node_reads, 0);
        let a = agent_audit(&line(AGENT_USER, "get", "nodes", "", NODE, 200));
        assert_eq!(a.node_reads, 1);
        assert!(a.forbidden.is_empty());
        let a = agent_audit(&line(AGENT_USER, "update", "nodes", "status", "n2", 403));
        assert_eq!(a.forbidden, ["update nodes/status n2"]);
    }
}
