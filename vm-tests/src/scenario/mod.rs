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
//! - `bundle-offline`: a site without a network. The host writes v2 as an offline bundle (the
//!   host `k3os-ops release bundle`) onto an ext4 USB stick image; the node, with no NIC at
//!   any boot, mounts the stick, `upgrade --bundle` stages and activates v2, which boots and
//!   is blessed.
//! - `reachability`: activations under a config with `[reachability]` (limit 60 s, default
//!   endpoint: the release server) await the built-in `reachable` check. v2-nonet never brings
//!   its network up: `slot await-bless` rolls back and reboots into A at the limit by itself;
//!   v2 reaches the server and is blessed by the check.
//! - `trust-rotation`: a node whose image trusts only root version 1 of its channel upgrades
//!   through a channel whose root was rotated to version 2 (new root and targets keys, the old
//!   targets key revoked) to a release signed by a key no trust.d holds: first targets signed by
//!   the revoked key are refused naming the role, and the release without metadata is refused
//!   for its signature; then it installs on the targets role's word and is blessed.
//! - `upgrade-patch`: v1 on A upgrades to a v2 that carries per-pair patches from v1:
//!   `--plan-only` says the rootfs comes by patch and prices it, the stage rebuilds it from the
//!   running slot by the patch (every output chunk checked, none taken by range) fetching what
//!   the plan said, and v2 boots and is blessed.
//! - `payload-images`: v2's image archive is staged into the payload store with the slot,
//!   v2 boots with the network cut and finds its images linked for k3s (checked at boot and by
//!   `skopeo inspect` on the objects), the prune after the bless keeps what A and B reference,
//!   and a rollback to v1 finds v1's images again.
//! - `report-spool`: the guest reports to a collector on the host (`k3os-ops collector
//!   serve`); the collector is stopped before a stage, the staged and trial-boot reports wait
//!   in the spool and arrive once it is back (numbered, a resend stored once), then a failing
//!   trial boot's `rolled_back` with its why and a good one's `blessed`.
//!
//! - `kube-node-joins`: the Kubernetes node variant (`-kube` disk; x86_64 and aarch64) boots
//!   with a seed disk made by the test and joins a control plane started on the host:
//!   containerd up, the slot's image archives imported (the agent's image for the node's
//!   platform), the Node registered and Ready, a pod of an image only the slot's payload
//!   carries Running (each step timed).
//! - `kube-join-refused`: the same node whose seed trusts another CA than the API server's:
//!   the join fails at once, naming the node and the kubelet's x509 reason, and the node keeps
//!   its good slot.
//! - `site-upgrade`: a real site: on that node, the agent deployed with `kubectl apply -k` as
//!   a user does (its image from the slot's payload) upgrades it v1-kube → v2-kube from a
//!   channel the host serves: stage before cordon, a drain with real evictions under a
//!   PodDisruptionBudget, the reboot, containerd importing v2's images, Ready, the agent's
//!   restarted pod confirming; judged by what `kubectl` shows and the API server's audit log.
//! - `site-rollback`: the same site with a v2 whose kubelet never starts: not blessed within
//!   the limit, the node rolls back to A by itself, Ready on v1, and the agent records the
//!   failure with its why, releases the claim and pauses the channel; a collector on the host
//!   stores the node's `rolled_back` report with that why.
//! - `site-faults`: the site of `site-upgrade` with a power cut while the stage writes,
//!   another during the drain, and the API server down while the node reboots into B: the
//!   node comes back on its good slot each time, the stage resumes, the drain completes, B is
//!   blessed.
//!
//! Every run prints its wall time and the time of each boot; console logs stay in
//! `vm-tests/out/<target>/<scenario>/`.
//!
//! # Layout
//! This file owns the catalogue ([`ScenarioKind`]), a run ([`Scenario::new`], [`Scenario::run`])
//! and its [`Report`]. `steps` holds the steps every scenario is made of (power on, wait for
//! a boot, confirm, `slot status`, upgrade, reboot into a blessed slot), `snapshot` a booted
//! v1 node saved once and resumed per use (`powercut`'s dry runs and cuts); each scenario family
//! has its own file built from those steps: `upgrade`, `fallback` (fallback-panic,
//! fallback-noconfirm, badhealth, missing-kernel), `awaited`, `powercut`, `previous`
//! (upgrade-from-previous), `offline` (bundle-offline), `reach` (reachability), `rotation`
//! (trust-rotation), `wave` (rollout-wave), `patch` (upgrade-patch), `payloads` (payload-images), `spool` (report-spool), `kube` (kube-node-joins, kube-join-refused), `site` (site-upgrade, site-rollback, site-faults). Data flows one way: this file → a family → `steps` → [`Vm`] /
//! [`crate::server`] / [`crate::target`]; the one link between families is `previous` using
//! `powercut`'s barrier formatter. A new scenario is a variant of [`ScenarioKind`], one arm in
//! [`Scenario::run`] and a function in its family's file.
//!
//! [`Vm`]: crate::vm::Vm

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::target::{workspace_root, Accel, Target};

mod awaited;
mod bundles;
mod fallback;
mod kube;
mod offline;
mod panic_bundle;
mod patch;
mod payloads;
mod powercut;
mod previous;
mod reach;
mod rotation;
mod site;
mod snapshot;
mod spool;
mod status;
mod steps;
mod upgrade;
mod verity;
mod wave;

pub use powercut::{barrier_seed, parse_barriers, rotation, sample, STRIDE};
pub use previous::{first_migrating_barrier, LooseSlot, LooseStatus};
pub use steps::{parse_booted, Node};

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
    BundleOffline,
    Reachability,
    TrustRotation,
    RolloutWave,
    UpgradePatch,
    PayloadImages,
    ReportSpool,
    VerityFec,
    VerityFallback,
    KubeNodeJoins,
    SiteUpgrade,
    SiteRollback,
    SiteFaults,
    KubeJoinRefused,
}

impl ScenarioKind {
    pub const ALL: [ScenarioKind; 22] = [
        ScenarioKind::Upgrade,
        ScenarioKind::FallbackPanic,
        ScenarioKind::FallbackNoConfirm,
        ScenarioKind::BadHealth,
        ScenarioKind::PowerCut,
        ScenarioKind::MissingKernel,
        ScenarioKind::AwaitedCheck,
        ScenarioKind::UpgradeFromPrevious,
        ScenarioKind::BundleOffline,
        ScenarioKind::Reachability,
        ScenarioKind::TrustRotation,
        ScenarioKind::RolloutWave,
        ScenarioKind::UpgradePatch,
        ScenarioKind::PayloadImages,
        ScenarioKind::ReportSpool,
        ScenarioKind::VerityFec,
        ScenarioKind::VerityFallback,
        ScenarioKind::KubeNodeJoins,
        ScenarioKind::SiteUpgrade,
        ScenarioKind::SiteRollback,
        ScenarioKind::SiteFaults,
        ScenarioKind::KubeJoinRefused,
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
            ScenarioKind::BundleOffline => "bundle-offline",
            ScenarioKind::Reachability => "reachability",
            ScenarioKind::TrustRotation => "trust-rotation",
            ScenarioKind::RolloutWave => "rollout-wave",
            ScenarioKind::UpgradePatch => "upgrade-patch",
            ScenarioKind::PayloadImages => "payload-images",
            ScenarioKind::ReportSpool => "report-spool",
            ScenarioKind::VerityFec => "verity-fec",
            ScenarioKind::VerityFallback => "verity-fallback",
            ScenarioKind::KubeNodeJoins => "kube-node-joins",
            ScenarioKind::SiteUpgrade => "site-upgrade",
            ScenarioKind::SiteRollback => "site-rollback",
            ScenarioKind::SiteFaults => "site-faults",
            ScenarioKind::KubeJoinRefused => "kube-join-refused",
        }
    }

    /// Whether the scenario runs on `target` (`run … all` skips the others): the Kubernetes
    /// node disk exists for the GRUB UEFI targets (x86_64 and aarch64); the site scenarios run
    /// on x86_64 only.
    pub fn runs_on(self, target: Target) -> bool {
        match self {
            ScenarioKind::KubeNodeJoins => {
                matches!(target, Target::X86_64GrubEfi | Target::Aarch64GrubEfi)
            }
            ScenarioKind::SiteUpgrade | ScenarioKind::SiteRollback => {
                target == Target::X86_64GrubEfi
            }
            _ => true,
        }
    }

    /// A scenario of the Kubernetes node disk (`just images-kube-<arch>`).
    fn is_kube(self) -> bool {
        matches!(
            self,
            ScenarioKind::KubeNodeJoins
                | ScenarioKind::SiteUpgrade
                | ScenarioKind::SiteRollback
                | ScenarioKind::SiteFaults
                | ScenarioKind::KubeJoinRefused
        )
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
        crate::error::by_name("scenario", &ScenarioKind::ALL, ScenarioKind::name, s)
    }
}

/// Knobs of a run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Power cuts at every barrier instead of a sample.
    pub all_barriers: bool,
    /// Rotates the upgrade's power-cut sample (`powercut`; [`barrier_seed`] reads it).
    pub barrier_seed: u64,
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

impl Scenario {
    /// Prepare `kind` on `target`; fails (with the reason) when an input is missing.
    pub fn new(kind: ScenarioKind, target: Target, opts: Options) -> Result<Scenario> {
        let root = workspace_root();
        if kind.is_kube() {
            target.check_kube_inputs(&root)?;
        } else {
            target.check_inputs(&root)?;
        }
        if kind == ScenarioKind::UpgradeFromPrevious {
            target.check_previous_inputs(&root)?;
        }
        if kind == ScenarioKind::BundleOffline {
            target.check_bundle_inputs(&root)?;
        }
        if kind == ScenarioKind::Reachability {
            target.check_releases(&root, &["v2-nonet"])?;
        }
        if matches!(kind, ScenarioKind::VerityFec | ScenarioKind::VerityFallback) {
            target.check_releases(&root, &["v2-verity"])?;
        }
        if matches!(
            kind,
            ScenarioKind::TrustRotation | ScenarioKind::RolloutWave
        ) {
            target.check_channel_inputs(&root, &rotation::ROOT1_KEYS)?;
        }
        if matches!(
            kind,
            ScenarioKind::SiteUpgrade | ScenarioKind::SiteRollback | ScenarioKind::SiteFaults
        ) {
            target.check_releases(&root, &["v1-kube", "v2-kube", "v2-kubenotready"])?;
            target.check_channel_inputs(&root, &rotation::ROOT1_KEYS)?;
        }
        if kind == ScenarioKind::ReportSpool {
            target.check_releases(&root, &["v2-badhealth"])?;
            crate::collector::check_fleet_tool(&root)?;
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
            ScenarioKind::BundleOffline => self.bundle_offline()?,
            ScenarioKind::Reachability => self.reachability()?,
            ScenarioKind::TrustRotation => self.trust_rotation()?,
            ScenarioKind::RolloutWave => self.rollout_wave()?,
            ScenarioKind::UpgradePatch => self.upgrade_patch()?,
            ScenarioKind::PayloadImages => self.payload_images()?,
            ScenarioKind::ReportSpool => self.report_spool()?,
            ScenarioKind::VerityFec => self.verity_fec()?,
            ScenarioKind::VerityFallback => self.verity_fallback()?,
            ScenarioKind::KubeNodeJoins => self.kube_node_joins()?,
            ScenarioKind::SiteUpgrade => self.site_upgrade()?,
            ScenarioKind::SiteRollback => self.site_rollback()?,
            ScenarioKind::SiteFaults => self.site_faults()?,
            ScenarioKind::KubeJoinRefused => self.kube_join_refused()?,
        }
        if !self.opts.keep {
            self.drop_disks()?;
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

    /// Remove the nodes' scratch disks, UEFI variables, USB sticks and saved guest states
    /// (console logs stay).
    fn drop_disks(&self) -> Result<()> {
        for e in std::fs::read_dir(&self.out)
            .map_err(|e| Error::io("list scenario output", &self.out, e))?
            .flatten()
        {
            let p = e.path();
            if p.is_dir() {
                for f in ["disk.img", "vars.fd", "stick.img", "seed.img", "state.bin"] {
                    let _ = std::fs::remove_file(p.join(f));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The node joins on both GRUB UEFI disks (`just images-kube-x86_64`, `-aarch64`); the
    /// site scenarios on x86_64 only; the plain scenarios everywhere.
    #[test]
    fn kube_scenarios_run_where_a_kube_disk_is_built() {
        let on = |k: ScenarioKind| -> Vec<Target> {
            Target::ALL.into_iter().filter(|t| k.runs_on(*t)).collect()
        };
        assert_eq!(
            on(ScenarioKind::KubeNodeJoins),
            [Target::X86_64GrubEfi, Target::Aarch64GrubEfi]
        );
        assert_eq!(on(ScenarioKind::SiteUpgrade), [Target::X86_64GrubEfi]);
        assert_eq!(on(ScenarioKind::SiteRollback), [Target::X86_64GrubEfi]);
        assert_eq!(on(ScenarioKind::Upgrade), Target::ALL);
    }
}
