//! The simulated node side of the agent ([`NodeOps`]) shared by the agent's tests and the
//! fleet bench: no disk, no bootloader, only the versions a node's slots hold. Given a channel
//! ([`SimNode::with_channel`]: the releases its signed metadata lists, with their rollouts, and
//! a clock the test moves), it resolves `latest` or a pinned version with libupgrade's own
//! pure rollout decision (`libupgrade::rollout::offer`, `admission`) for the seed it is asked
//! with, and records those seeds; a stage of the resolved release is instant. Without a
//! channel it follows pinned versions only, each offered as by a channel without rollouts
//! ([`offered`]), and `latest` as [`SimNode::with_latest`] says. A recording node
//! ([`SimNode::recording`]) writes each call the agent makes into the fake API's log, so a
//! test checks the order of node calls and API writes (the `flow` tests). A node over a real
//! one ([`SimNode::powered_over`]: the fleet test's `LibupgradeNode` on testkit's disk) keeps
//! only the power simulated: its slots, stages and verdicts are the real node's.

use std::sync::mpsc as sync_mpsc;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k3os_ops::agent::testing::{
    ConfirmResult, Inactive, NodeError, NodeOps, NodeUpdateStatus, StageEnd, StageProgress,
    Withheld, NODE_READY,
};
use libupgrade::channel::RolloutNote;
use libupgrade::rollout::{self, Installed, Listed, Seed};
use libupgrade::state::ledger::PreviewRecord;
use libupgrade::{Origin, Release, Source, StageOptions, StageRequest};
use tokio::sync::mpsc;

use crate::fake_api::Log;

/// A reboot handed to the power driver: the node's index and the sender to answer on once
/// the driver has ended that node's agent.
pub type PowerRequest = (usize, sync_mpsc::Sender<()>);

/// The channel a simulated node resolves: the releases as its signed metadata lists them and
/// the time its resolutions take as now.
#[derive(Debug, Clone)]
pub struct SimChannel {
    /// The releases, with their rollouts.
    pub releases: Vec<Listed>,
    /// The resolution's clock.
    pub now: DateTime<Utc>,
}

/// A node whose staging is instant (nothing fetched), whose activation marks the staged slot
/// for the next boot and whose trial boot is healthy (unless [`SimNode::with_confirm`] says
/// otherwise). A reboot goes to the power driver given to [`SimNode::powered`], which ends the
/// agent and later calls [`SimNode::boot`]; a recording node's reboot returns (the test
/// power-cycles it); any other node ([`SimNode::new`]) refuses to reboot.
pub struct SimNode {
    index: usize,
    /// What the node's slots hold, as `status` reports it.
    slots: Mutex<NodeUpdateStatus>,
    power: Option<mpsc::UnboundedSender<PowerRequest>>,
    channel: Mutex<Option<SimChannel>>,
    /// Every seed a resolution or a stage was asked with, in order.
    seeds: Mutex<Vec<Option<Seed>>>,
    /// When set ([`SimNode::with_running_clock`]): the channel's clock runs with tokio's
    /// (paused) clock from this instant on.
    clock_from: Option<tokio::time::Instant>,
    /// When set ([`SimNode::recording`]): where each call the agent makes is written.
    log: Option<Log>,
    /// The boot-assessment core's verdict on every trial ([`SimNode::with_confirm`]).
    confirm: ConfirmResult,
    /// When set ([`SimNode::fail_status`]): what `status` fails with.
    status_error: Mutex<Option<NodeError>>,
    /// Without a channel: the version `latest` resolves to ([`SimNode::with_latest`]).
    latest: Option<String>,
    /// When set ([`SimNode::powered_over`]): the real node every call but `reboot` goes to.
    real: Option<Box<dyn NodeOps>>,
    /// When set ([`SimNode::reporting_confirms`]): the node's name and the log each confirm's
    /// Node-Ready report and verdict go into.
    confirms: Option<(String, Log)>,
}

impl SimNode {
    /// A node booted on `booted`, its other slot empty, that cannot reboot.
    pub fn new(booted: &str) -> SimNode {
        SimNode {
            index: 0,
            slots: Mutex::new(NodeUpdateStatus {
                booted_version: Some(booted.into()),
                booted_on_trial: false,
                inactive: Inactive::Empty,
                failed_trial: None,
                failed: Vec::new(),
            }),
            power: None,
            channel: Mutex::new(None),
            seeds: Mutex::new(Vec::new()),
            clock_from: None,
            log: None,
            confirm: ConfirmResult::Healthy,
            status_error: Mutex::new(None),
            latest: None,
            real: None,
            confirms: None,
        }
    }

    /// Node `index` of a fleet over `real` (a `LibupgradeNode` on a disk of its own): every
    /// call goes to `real` except `reboot`, which goes to `power` as [`SimNode::powered`]'s.
    pub fn powered_over(
        index: usize,
        real: impl NodeOps + 'static,
        power: mpsc::UnboundedSender<PowerRequest>,
    ) -> SimNode {
        SimNode {
            real: Some(Box::new(real)),
            ..SimNode::powered(index, "", power)
        }
    }

    /// The same node, writing each confirm into `log` as `NAME: CHECK ok=OK (DETAIL) ->
    /// VERDICT` (the Node-Ready report the agent made and the core's answer).
    pub fn reporting_confirms(self, name: &str, log: Log) -> SimNode {
        SimNode {
            confirms: Some((name.into(), log)),
            ..self
        }
    }

    /// A node booted on `booted` that writes each call the agent makes into `log` (the fake
    /// API's, so node calls and API writes are in one order): `node: stage V` (with ` capped
    /// at R B/s` under `maxRate`), `node: activate`, `node: confirm with node-ready ok|failed`,
    /// `node: reboot`. It reports a stage's progress (one file of 100 bytes), checks the
    /// agent's arguments (a trial leaves at least 10 minutes for Node-Ready; the check it
    /// confirms with is Node-Ready), and its reboot returns: the test power-cycles it with
    /// [`SimNode::boot`] or [`SimNode::fall_back`].
    pub fn recording(booted: &str, log: Log) -> SimNode {
        SimNode {
            log: Some(log),
            ..SimNode::new(booted)
        }
    }

    /// The same node, `latest` resolving to `version` (offered) while it has no channel.
    pub fn with_latest(self, version: &str) -> SimNode {
        SimNode {
            latest: Some(version.into()),
            ..self
        }
    }

    /// The same node, the boot-assessment core answering `verdict` for every trial.
    pub fn with_confirm(self, verdict: ConfirmResult) -> SimNode {
        SimNode {
            confirm: verdict,
            ..self
        }
    }

    /// Make `status` fail with `error` from now on (e.g. the boot not assessed yet); `None`:
    /// answer again.
    pub fn fail_status(&self, error: Option<NodeError>) {
        *self.status_error.lock().unwrap() = error;
    }

    /// Change what the slots hold (a failed trial's record, a slot staged meanwhile).
    pub fn edit_status(&self, edit: impl FnOnce(&mut NodeUpdateStatus)) {
        edit(&mut self.slots.lock().unwrap());
    }

    /// Write `line` into a recording node's log.
    fn record(&self, line: String) {
        if let Some(log) = &self.log {
            log.lock().unwrap().push(line);
        }
    }

    /// The same node, its channel's clock running from now on with tokio's clock (which a
    /// test pauses and advances): `SimChannel::now` is then the time at this call.
    pub fn with_running_clock(self) -> SimNode {
        SimNode {
            clock_from: Some(tokio::time::Instant::now()),
            ..self
        }
    }

    /// The time the channel's resolutions judge rollouts at.
    fn now(&self, ch: &SimChannel) -> DateTime<Utc> {
        let ran = self
            .clock_from
            .map_or(std::time::Duration::ZERO, |t| t.elapsed());
        ch.now + chrono::Duration::from_std(ran).expect("a test's span")
    }

    /// The same node resolving `channel` (without one it follows only pinned versions).
    pub fn with_channel(self, channel: SimChannel) -> SimNode {
        *self.channel.lock().unwrap() = Some(channel);
        self
    }

    /// The same node with `version` staged (not activated) in its other slot.
    pub fn with_staged(self, version: &str) -> SimNode {
        self.slots.lock().unwrap().inactive = Inactive::Staged(version.into());
        self
    }

    /// Change the channel (publish, pause, withdraw) or move its clock.
    pub fn edit_channel(&self, edit: impl FnOnce(&mut SimChannel)) {
        edit(self.channel.lock().unwrap().as_mut().expect("a channel"));
    }

    /// The seeds this node was asked to resolve or stage with (`None`: a stage without one).
    pub fn seeds(&self) -> Vec<Option<Seed>> {
        self.seeds.lock().unwrap().clone()
    }

    /// What `rollout::offer` decides for this node at `seed` now, with the running and staged
    /// releases as the channel lists them.
    fn offer(&self, seed: Seed) -> Result<(SimChannel, Installed, rollout::Offer), NodeError> {
        let ch = self.channel.lock().unwrap().clone().ok_or_else(|| {
            NodeError::new("resolve", "a simulated node only follows pinned versions")
        })?;
        let s = self.slots.lock().unwrap();
        let installed = |v: &str| Installed {
            version: v.to_string(),
            generation: ch
                .releases
                .iter()
                .find(|l| l.version == v)
                .map_or(0, |l| l.generation),
        };
        let running = installed(s.booted_version.as_deref().unwrap_or_default());
        let staged = match &s.inactive {
            Inactive::Staged(v) => Some(installed(v)),
            _ => None,
        };
        let node = rollout::Node {
            seed,
            running: running.clone(),
            staged,
        };
        let offer = rollout::offer(&node, self.now(&ch), &ch.releases);
        Ok((ch, running, offer))
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
            s.booted_version = Some(v);
            s.booted_on_trial = true;
        }
    }

    /// The power cycle in which the bootloader falls back: the node comes back on the slot it
    /// ran, the one it was to try is marked failed.
    pub fn fall_back(&self) {
        let mut s = self.slots.lock().unwrap();
        let (Inactive::Activated(new) | Inactive::Staged(new)) = s.inactive.clone() else {
            panic!("nothing to fall back from: {:?}", s.inactive);
        };
        s.inactive = Inactive::Failed(new);
        s.booted_on_trial = false;
    }
}

impl SimNode {
    /// `latest` for `seed`: what `rollout::offer` takes, else the running release.
    fn resolve_latest(&self, seed: Seed) -> Result<Release, NodeError> {
        let (ch, running, offer) = self.offer(seed)?;
        let version = offer.take.map_or(running.version, |t| t.version);
        let note = RolloutNote {
            retries: retries(&ch, &version),
            ..note(seed, offer.waiting, withdrawn(&ch))
        };
        Ok(release(&version, note))
    }

    /// An explicitly named `version` for `seed`, as libupgrade resolves one: the release's
    /// rollout must admit the seed (unless `ignore_rollout`); a release this node staged goes
    /// on. A node without a channel follows a channel without rollouts: every version offered.
    fn resolve_version(
        &self,
        version: &str,
        seed: Seed,
        ignore_rollout: bool,
    ) -> Result<Release, NodeError> {
        let Some(ch) = self.channel.lock().unwrap().clone() else {
            return Ok(release(version, note(seed, None, Vec::new())));
        };
        let listed = ch
            .releases
            .iter()
            .find(|l| l.version == version)
            .ok_or_else(|| NodeError::new("resolve", format!("{version} is not listed")))?;
        let started =
            matches!(&self.slots.lock().unwrap().inactive, Inactive::Staged(v) if v == version);
        match rollout::admission(seed, self.now(&ch), listed, started) {
            Err(hold) if !ignore_rollout => Err(NodeError {
                withheld: Some(Withheld {
                    hold: hold.clone(),
                    withdrawn: withdrawn(&ch),
                }),
                ..NodeError::new("resolve", format!("{version} is not offered: {hold}"))
            }),
            _ => {
                let note = RolloutNote {
                    retries: retries(&ch, version),
                    ..note(seed, None, withdrawn(&ch))
                };
                Ok(release(version, note))
            }
        }
    }
}

/// `version` as a channel without rollouts resolves it: offered, nothing withdrawn (the fake
/// nodes of the tests that look at the agent's calls, not at the rollouts).
pub fn offered(version: &str) -> Release {
    release(
        version,
        note(Seed::new(0).expect("0 is a seed"), None, Vec::new()),
    )
}

/// What a simulated channel resolution says of the rollouts.
fn note(seed: Seed, waiting: Option<rollout::Waiting>, withdrawn: Vec<String>) -> RolloutNote {
    RolloutNote {
        seed,
        waiting,
        toward: None,
        ignored: None,
        drop_staged: None,
        nothing_newer: false,
        withdrawn,
        retries: None,
    }
}

/// The simulated channel's release `version` (no files: a simulated stage writes nothing).
fn release(version: &str, note: RolloutNote) -> Release {
    Release {
        version: Some(version.to_string()),
        origin: Origin::Channel {
            channel: "sim".into(),
            wanted: version.to_string(),
            location: format!("sim/{version}"),
            signed: true,
            rollout: Some(Box::new(note)),
        },
        ..Release::at(Source::Path(format!("/sim/{version}").into()))
    }
}

/// The retries the rollout of `ch`'s release `version` allows, as libupgrade's resolution
/// notes them.
fn retries(ch: &SimChannel, version: &str) -> Option<rollout::Retries> {
    ch.releases
        .iter()
        .find(|l| l.version == version)
        .and_then(|l| l.rollout.as_ref())
        .and_then(|r| r.retries)
}

/// The versions of the releases `ch` lists as withdrawn, oldest first.
fn withdrawn(ch: &SimChannel) -> Vec<String> {
    let mut gone: Vec<&Listed> = ch
        .releases
        .iter()
        .filter(|l| l.rollout.as_ref().is_some_and(|r| r.withdrawn.is_some()))
        .collect();
    gone.sort_by_key(|l| l.generation);
    gone.into_iter().map(|l| l.version.clone()).collect()
}

impl NodeOps for SimNode {
    fn rollout_clock(&self) -> DateTime<Utc> {
        if let Some(real) = &self.real {
            return real.rollout_clock();
        }
        match self.channel.lock().unwrap().as_ref() {
            Some(ch) => self.now(ch),
            None => Utc::now(),
        }
    }
    fn status(&self) -> Result<NodeUpdateStatus, NodeError> {
        if let Some(real) = &self.real {
            return real.status();
        }
        if let Some(e) = self.status_error.lock().unwrap().clone() {
            return Err(e);
        }
        Ok(self.slots.lock().unwrap().clone())
    }
    fn resolve(&self, req: &StageRequest) -> Result<Release, NodeError> {
        if let Some(real) = &self.real {
            return real.resolve(req);
        }
        self.seeds.lock().unwrap().push(req.seed);
        let seed = req
            .seed
            .ok_or_else(|| NodeError::new("resolve", "a request without a seed"))?;
        let no_channel = self.channel.lock().unwrap().is_none();
        match (req.wanted.version(), &self.latest) {
            (None, Some(latest)) if no_channel => self.resolve_version(latest, seed, false),
            (None, _) => self.resolve_latest(seed),
            (Some(v), _) => self.resolve_version(v, seed, req.ignore_rollout),
        }
    }
    fn drop_withdrawn(&self, channel: &str, seed: Seed) -> Result<Option<String>, NodeError> {
        if let Some(real) = &self.real {
            return real.drop_withdrawn(channel, seed);
        }
        self.seeds.lock().unwrap().push(Some(seed));
        if self.channel.lock().unwrap().is_none() {
            // A channel without rollouts withdraws nothing.
            return Ok(None);
        }
        let (_, _, offer) = self.offer(seed)?;
        let mut s = self.slots.lock().unwrap();
        match (offer.drop_staged, &s.inactive) {
            (Some(d), Inactive::Staged(v)) if d.version == *v => {
                s.inactive = Inactive::Failed(d.version.clone());
                Ok(Some(d.version))
            }
            _ => Ok(None),
        }
    }
    fn stage(
        &self,
        rel: &Release,
        opts: &StageOptions,
        book_on: Option<chrono::NaiveDate>,
        progress: &dyn StageProgress,
    ) -> Result<StageEnd, NodeError> {
        if let Some(real) = &self.real {
            return real.stage(rel, opts, book_on, progress);
        }
        let version = rel.version.clone().unwrap_or_default();
        if self.log.is_some() {
            progress.begin("rootfs", 100, 0);
            progress.advance(100);
            progress.end();
            let cap = opts
                .max_rate
                .map(|r| format!(" capped at {r} B/s"))
                .unwrap_or_default();
            self.record(format!("node: stage {version}{cap}"));
        }
        self.slots.lock().unwrap().inactive = Inactive::Staged(version);
        Ok(StageEnd::Staged { fetched: 0 })
    }
    fn activate(&self, node_ready_within: Duration) -> Result<(), NodeError> {
        if let Some(real) = &self.real {
            return real.activate(node_ready_within);
        }
        if self.log.is_some() {
            assert!(
                node_ready_within >= Duration::from_secs(600),
                "the trial must leave time to boot, start k3s and report Node-Ready: {node_ready_within:?}"
            );
            self.record("node: activate".into());
        }
        let mut s = self.slots.lock().unwrap();
        if let Inactive::Staged(v) = &s.inactive {
            s.inactive = Inactive::Activated(v.clone());
        }
        Ok(())
    }
    fn confirm(
        &self,
        node_ready: libupgrade::health::CheckResult,
    ) -> Result<ConfirmResult, NodeError> {
        if let Some(real) = &self.real {
            let line = format!(
                "{} ok={} ({})",
                node_ready.name, node_ready.ok, node_ready.detail
            );
            let verdict = real.confirm(node_ready);
            if let Some((name, log)) = &self.confirms {
                log.lock()
                    .unwrap()
                    .push(format!("{name}: {line} -> {verdict:?}"));
            }
            return verdict;
        }
        if self.log.is_some() {
            assert_eq!(node_ready.name, NODE_READY);
            let ok = if node_ready.ok { "ok" } else { "failed" };
            self.record(format!("node: confirm with node-ready {ok}"));
        }
        if self.confirm == ConfirmResult::Healthy {
            self.slots.lock().unwrap().booted_on_trial = false;
        }
        Ok(self.confirm.clone())
    }
    fn offline(&self, req: &StageRequest) -> Result<Option<Release>, NodeError> {
        match &self.real {
            Some(real) => real.offline(req),
            None => Ok(None),
        }
    }
    fn preview(
        &self,
        rel: &Release,
        opts: &StageOptions,
    ) -> Result<Option<PreviewRecord>, NodeError> {
        match &self.real {
            Some(real) => real.preview(rel, opts),
            None => Ok(None),
        }
    }
    fn fetched_on(&self, day: chrono::NaiveDate) -> Result<u64, NodeError> {
        match &self.real {
            Some(real) => real.fetched_on(day),
            None => Ok(0),
        }
    }
    fn reboot(&self) -> Result<(), NodeError> {
        if self.power.is_none() && self.log.is_some() {
            self.record("node: reboot".into());
            return Ok(());
        }
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
    fn verify_slots(&self) -> Result<Vec<libupgrade::SlotScrub>, NodeError> {
        match &self.real {
            Some(real) => real.verify_slots(),
            // A simulated node's slots carry no dm-verity tree: every slot is skipped.
            None => Ok(Vec::new()),
        }
    }
}
