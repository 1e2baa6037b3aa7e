//! The simulated node side of the agent ([`NodeOps`]) shared by the idle-agent test and the
//! fleet bench: no disk, no bootloader, only the versions a node's slots hold. The tests that
//! check what the agent asks of a node in which order (`flow`, `kube_mock`: a logging
//! `FakeNode` each) and the fleet test over the real `LibupgradeNode` (`fleet_rig`) keep
//! fakes of their own: they look at the calls, not only at their outcome.

use std::sync::mpsc as sync_mpsc;
use std::sync::Mutex;
use std::time::Duration;

use k3os_ops::agent::host::ops::{ConfirmResult, NodeError, NodeOps, StageEnd, StageProgress};
use k3os_ops::agent::host::status::{Inactive, NodeUpdateStatus};
use libupgrade::StageRequest;
use tokio::sync::mpsc;

/// A reboot handed to the power driver: the node's index and the sender to answer on once
/// the driver has ended that node's agent.
pub type PowerRequest = (usize, sync_mpsc::Sender<()>);

/// What the node's slots hold.
struct Slots {
    booted: String,
    on_trial: bool,
    inactive: Inactive,
}

/// A node whose staging is instant (nothing fetched), whose activation marks the staged slot
/// for the next boot and whose trial boot is healthy. A reboot goes to the power driver
/// given to [`SimNode::powered`], which ends the agent and later calls [`SimNode::boot`];
/// a node without one ([`SimNode::new`]) refuses to reboot.
pub struct SimNode {
    index: usize,
    slots: Mutex<Slots>,
    power: Option<mpsc::UnboundedSender<PowerRequest>>,
}

impl SimNode {
    /// A node booted on `booted`, its other slot empty, that cannot reboot.
    pub fn new(booted: &str) -> SimNode {
        SimNode {
            index: 0,
            slots: Mutex::new(Slots {
                booted: booted.into(),
                on_trial: false,
                inactive: Inactive::Empty,
            }),
            power: None,
        }
    }

    /// Node `index` of a fleet, booted on `booted`, whose reboots go to `power`.
    pub fn powered(
        index: usize,
        booted: &str,
        power: mpsc::UnboundedSender<PowerRequest>,
    ) -> SimNode {
        SimNode {
            index,
            power: Some(power),
            ..SimNode::new(booted)
        }
    }

    /// The power cycle: an activated slot boots on trial.
    pub fn boot(&self) {
        let mut s = self.slots.lock().unwrap();
        if let Inactive::Activated(v) = s.inactive.clone() {
            s.inactive = Inactive::Empty;
            s.booted = v;
            s.on_trial = true;
        }
    }
}

impl NodeOps for SimNode {
    fn status(&self) -> Result<NodeUpdateStatus, NodeError> {
        let s = self.slots.lock().unwrap();
        Ok(NodeUpdateStatus {
            booted_version: Some(s.booted.clone()),
            booted_on_trial: s.on_trial,
            inactive: s.inactive.clone(),
            failed_trial: None,
        })
    }
    fn resolve_latest(&self, _: &str) -> Result<String, NodeError> {
        Err(NodeError::new(
            "resolve",
            "a simulated node only follows pinned versions",
        ))
    }
    fn stage(
        &self,
        req: &StageRequest,
        _: Option<chrono::NaiveDate>,
        _: &dyn StageProgress,
    ) -> Result<StageEnd, NodeError> {
        let version = req.wanted.version().unwrap_or_default();
        self.slots.lock().unwrap().inactive = Inactive::Staged(version.into());
        Ok(StageEnd::Staged { fetched: 0 })
    }
    fn activate(&self, _: Duration) -> Result<(), NodeError> {
        let mut s = self.slots.lock().unwrap();
        if let Inactive::Staged(v) = &s.inactive {
            s.inactive = Inactive::Activated(v.clone());
        }
        Ok(())
    }
    fn confirm(&self, _: libupgrade::health::CheckResult) -> Result<ConfirmResult, NodeError> {
        self.slots.lock().unwrap().on_trial = false;
        Ok(ConfirmResult::Healthy)
    }
    fn reboot(&self) -> Result<(), NodeError> {
        let Some(power) = &self.power else {
            return Err(NodeError::new(
                "reboot",
                "this simulated node has no power driver",
            ));
        };
        // Blocks this spawn_blocking thread until the driver has ended the agent; the driver
        // answers at once (no virtual time may pass while a blocking task runs).
        let (done, ended) = sync_mpsc::channel();
        power.send((self.index, done)).expect("driver runs");
        let _ = ended.recv();
        Err(NodeError::new(
            "reboot",
            "the simulated power cycle ended this agent",
        ))
    }
}
