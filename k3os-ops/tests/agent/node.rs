//! The agent's node side over the real `libupgrade::Updater`: k3OS-style dir layout in a
//! temp dir, real signed releases (mksquashfs) in a local channel, and a small in-memory
//! bootloader that counts tries. Checks what the decision logic relies on: versions, staged
//! vs activated vs failed slots, trial boots and their confirmation — Node-Ready as a health
//! check of the boot-assessment core, awaited before its single bless point, never a second
//! rollback path. And, through a signed channel with rollouts (issue 24), that resolving
//! `latest` for the cluster's seed writes nothing on the node and that only the node's own
//! `drop_withdrawn` drops a withdrawn staged release. A release that failed here and is held
//! back is reported by the agent's own resolution as a wait for a retry, once.

use crate::fleet_rig::{agent_request, stage_as_agent};
use agent::testing::{
    resolve_latest, ConfirmResult, Inactive, LibupgradeNode, NodeOps, NodeUpdateStatus,
    StageProgress,
};
use k3os_ops::agent;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use bootconfig::Slot;
use libupgrade::health::CheckResult;
use libupgrade::manifest::Arch;

struct Progress(Mutex<Vec<String>>);

impl StageProgress for Progress {
    fn begin(&self, what: &str, total: u64, already: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("begin {what} {total} {already}"));
    }
    fn advance(&self, _: u64) {}
    fn end(&self) {
        self.0.lock().unwrap().push("end".into());
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (mksquashfs is in squashfs-tools)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A signed release `version` in `channel/version/`, then the channel index rebuilt.
fn release(channel: &Path, secret: &Path, version: &str, generation: u64) {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree/etc");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(
        tree.join("k3os-release"),
        format!("VERSION={version}\nGENERATION={generation}\n"),
    )
    .unwrap();
    let sq = work.path().join("rootfs.squashfs");
    run(Command::new("mksquashfs")
        .arg(work.path().join("tree"))
        .arg(&sq)
        .args(["-noappend", "-quiet", "-all-root"]));
    std::fs::write(
        work.path().join("vmlinuz"),
        format!("kernel {version}").repeat(1000),
    )
    .unwrap();
    std::fs::write(
        work.path().join("initrd"),
        format!("initrd {version}").repeat(1000),
    )
    .unwrap();
    libupgrade::release::create(&libupgrade::release::CreateOptions {
        rootfs: sq,
        kernel: work.path().join("vmlinuz"),
        initrd: work.path().join("initrd"),
        version: version.into(),
        arch: Arch::host(),
        secret_key: secret.to_path_buf(),
        out_dir: channel.join(version),
        generation: Some(generation),
        scripts: Vec::new(),
        payloads: Vec::new(),
    })
    .expect("release create");
    libupgrade::channel::write_index(channel).expect("write index");
}

/// A simulated node (testkit) and the channel with v2 it updates from.
struct Rig {
    /// The publisher's keys, the node's trust dir and the channel.
    _publisher: tempfile::TempDir,
    node: testkit::sim::SimNode,
    channel: String,
}

impl Rig {
    fn new(tries: u8) -> Rig {
        Rig::with_generation(tries, 1)
    }

    fn with_generation(tries: u8, booted_generation: u64) -> Rig {
        let publisher = tempfile::tempdir().unwrap();
        let p = publisher.path();
        let (secret, public) = libupgrade::signing::generate_keypair(p, "publisher").unwrap();
        let trust = p.join("trust.d");
        std::fs::create_dir_all(&trust).unwrap();
        std::fs::copy(&public, trust.join(public.file_name().unwrap())).unwrap();
        let channel = p.join("channel");
        std::fs::create_dir_all(&channel).unwrap();
        release(&channel, &secret, "v2", 2);
        Rig {
            node: testkit::sim::SimNode::new(&trust, tries, booted_generation),
            channel: channel.display().to_string(),
            _publisher: publisher,
        }
    }

    /// Power-cycle through the loader.
    fn reboot(&mut self) -> Slot {
        self.node.power_cycle()
    }

    fn updater(&self) -> libupgrade::Updater {
        self.node.updater()
    }

    fn node(&self) -> LibupgradeNode {
        LibupgradeNode::new(self.updater(), vec!["false".into()])
    }

    /// What init runs first thing on every boot: `k3os-ops slot confirm`.
    fn init_confirm(&self) -> libupgrade::Result<libupgrade::ConfirmReport> {
        self.node.init_confirm()
    }

    /// [`Self::init_confirm`] on a boot that must end on a good slot.
    fn init_confirm_good(&self, what: &str) -> libupgrade::ConfirmReport {
        self.node.init_confirm_good(what)
    }

    /// Stage v2 as the agent does.
    fn stage_v2(&self) {
        let node = self.node();
        stage_as_agent(
            &node,
            &agent_request(&self.channel, "v2", false, None),
            None,
            &Progress(Mutex::new(Vec::new())),
        )
        .unwrap();
    }
}

const LIMIT: Duration = Duration::from_secs(900);

fn node_ready(ok: bool) -> CheckResult {
    CheckResult {
        name: agent::testing::NODE_READY.into(),
        ok,
        detail: if ok {
            "Ready".into()
        } else {
            "the Node was not Ready within 300s".into()
        },
    }
}

/// The boot-time confirm leaves a trial the agent activated on trial: Node-Ready is awaited.
fn assert_pending(r: libupgrade::Result<libupgrade::ConfirmReport>) {
    match r.as_ref().map(|r| r.outcome()) {
        Ok(libupgrade::state::Outcome::Pending { waiting_for, .. }) => {
            assert_eq!(waiting_for.join(", "), agent::testing::NODE_READY)
        }
        _ => panic!("the boot-time confirm must wait for node-ready: {r:?}"),
    }
}

#[test]
fn stage_activate_boot_confirm_as_the_agent_sees_it() {
    let mut rig = Rig::new(3);
    let node = rig.node();
    let st = node.status().unwrap();
    assert_eq!(st.booted_version.as_deref(), Some("v1"), "{st:?}");
    assert!(!st.booted_on_trial);
    assert_eq!(st.inactive, Inactive::Empty);

    let seed = libupgrade::rollout::Seed::derived_from("cluster");
    assert_eq!(
        resolve_latest(&node, &rig.channel, seed).unwrap(),
        agent::testing::Latest {
            generation: Some(2),
            ..agent::testing::Latest::plain("v2")
        }
    );
    let progress = Progress(Mutex::new(Vec::new()));
    stage_as_agent(
        &node,
        &agent_request(&rig.channel, "v2", false, None),
        None,
        &progress,
    )
    .unwrap();
    assert!(
        progress
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("begin")),
        "no progress reported"
    );
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Staged("v2".into())
    );

    node.activate(LIMIT).unwrap();
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Activated("v2".into())
    );

    assert_eq!(rig.reboot(), Slot::B);
    let e = rig.node().status().unwrap_err().to_string();
    assert!(e.contains("not assessed"), "{e}");
    assert_pending(rig.init_confirm());
    let node = rig.node();
    let st = node.status().unwrap();
    assert_eq!(
        st,
        NodeUpdateStatus {
            booted_version: Some("v2".into()),
            booted_on_trial: true,
            inactive: Inactive::Staged("v1".into()),
            failed_trial: None,
            failed: Vec::new(),
        },
        "after the trial boot"
    );
    assert_eq!(
        node.confirm(node_ready(true)).unwrap(),
        ConfirmResult::Healthy
    );
    assert!(!node.status().unwrap().booted_on_trial);
    let v = rig.updater().status().unwrap().verdict.unwrap();
    assert_eq!(v.outcome, libupgrade::state::Outcome::Blessed, "{v:?}");
    assert!(
        v.checks.iter().any(|c| c.name == "node-ready" && c.ok),
        "{v:?}"
    );
    assert_eq!(rig.reboot(), Slot::B, "blessed: B stays");
}

#[test]
fn node_not_ready_is_a_failed_health_check_and_the_core_rolls_back() {
    let mut rig = Rig::new(3);
    rig.stage_v2();
    rig.node().activate(LIMIT).unwrap();
    assert_eq!(rig.reboot(), Slot::B);
    assert_pending(rig.init_confirm());
    let r = rig.node().confirm(node_ready(false)).unwrap();
    let ConfirmResult::RolledBack(why) = r else {
        panic!("not Ready before the bless must roll back: {r:?}")
    };
    assert!(
        why.contains("node-ready") && why.contains("not Ready"),
        "{why}"
    );
    let v = rig.updater().status().unwrap().verdict.unwrap();
    assert_eq!(
        v.outcome,
        libupgrade::state::Outcome::RolledBack { to: Slot::A },
        "{v:?}"
    );
    assert_eq!(rig.reboot(), Slot::A, "the loader returns to A");
    rig.init_confirm_good("A is good");
    let st = rig.node().status().unwrap();
    assert_eq!(st.booted_version.as_deref(), Some("v1"), "{st:?}");
    assert_eq!(st.inactive, Inactive::Failed("v2".into()), "{st:?}");

    // With a `report_url`, the agent's own resolution of the channel (what it asks before
    // holding v2 back) reports the hold once, as a wait for a retry: held for good, since the
    // channel has no rollout allowing retries. The collector is away: it stays spooled.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let updater = rig.node.updater_with(|c| {
        c.report_url = Some(format!("http://127.0.0.1:{port}/v1/reports"));
        c.report_site = Some("site-1".into());
    });
    let spool = libupgrade::spool_dir(&updater.config().state_dir);
    let reporting = LibupgradeNode::new(updater, vec!["false".into()]);
    let seed = libupgrade::rollout::Seed::derived_from("cluster");
    for _ in 0..3 {
        resolve_latest(&reporting, &rig.channel, seed).unwrap();
    }
    let spooled: Vec<fleet_report::Report> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "report"))
        .map(|p| {
            fleet_report::parse(&std::fs::read(p).unwrap())
                .unwrap()
                .report
        })
        .collect();
    assert_eq!(spooled.len(), 1, "one hold, one report: {spooled:?}");
    assert_eq!(
        (
            spooled[0].v,
            spooled[0].version.as_str(),
            &spooled[0].outcome
        ),
        (
            2,
            "v2",
            &fleet_report::Outcome::Waiting {
                wait_for: fleet_report::WaitFor::Retry,
                until: None
            }
        ),
        "{spooled:?}"
    );
}

#[test]
fn after_the_bless_node_not_ready_is_recorded_and_nothing_rolls_back() {
    let mut rig = Rig::new(3);
    rig.stage_v2();
    // Activated by hand (`k3os-ops upgrade`): nothing awaited, init blesses at boot.
    rig.updater().activate().unwrap();
    assert_eq!(rig.reboot(), Slot::B);
    let rep = rig.init_confirm_good("blessed at boot");
    assert!(rep.newly_good);
    let r = rig.node().confirm(node_ready(false)).unwrap();
    let ConfirmResult::Unhealthy(why) = r else {
        panic!("a blessed slot is never rolled back silently: {r:?}")
    };
    assert!(why.contains("node-ready"), "{why}");
    assert_eq!(rig.reboot(), Slot::B, "B stays the good slot");
}

#[test]
fn an_unreported_node_ready_fails_at_its_limit_and_rolls_back() {
    let mut rig = Rig::new(3);
    rig.stage_v2();
    rig.node().activate(LIMIT).unwrap();
    assert_eq!(rig.reboot(), Slot::B);
    assert_pending(rig.init_confirm());
    // What `slot await-bless` does at the limit (k3s or the agent never came up).
    match rig
        .updater()
        .fail_awaited("not reported within 900 s of the boot")
    {
        Ok(Some(rep)) if matches!(rep.outcome(), libupgrade::state::Outcome::RolledBack { .. }) => {
            let failures = rep.failures();
            assert!(failures.contains("node-ready: not reported"), "{failures}")
        }
        other => panic!("expected a rollback: {other:?}"),
    }
    // Reported too late: the core has decided, the agent carries out its verdict.
    let r = rig.node().confirm(node_ready(true)).unwrap();
    assert!(matches!(r, ConfirmResult::RolledBack(_)), "{r:?}");
    assert_eq!(rig.reboot(), Slot::A);
}

#[test]
fn a_report_in_time_leaves_nothing_for_the_limit() {
    let mut rig = Rig::new(3);
    rig.stage_v2();
    rig.node().activate(LIMIT).unwrap();
    assert_eq!(rig.reboot(), Slot::B);
    assert_pending(rig.init_confirm());
    assert_eq!(
        rig.node().confirm(node_ready(true)).unwrap(),
        ConfirmResult::Healthy
    );
    assert!(rig.updater().fail_awaited("too late").unwrap().is_none());
    assert_eq!(rig.reboot(), Slot::B);
}

#[test]
fn a_spent_trial_reads_as_failed_so_the_agent_records_a_rollback() {
    let mut rig = Rig::new(1);
    rig.stage_v2();
    rig.node().activate(LIMIT).unwrap();
    assert_eq!(rig.reboot(), Slot::B); // the one try, never blessed (hangs before Ready)
    assert_pending(rig.init_confirm());
    assert_eq!(rig.reboot(), Slot::A); // the loader falls back
    rig.init_confirm_good("A is good");
    let u = rig.updater().status().unwrap();
    let v = u.verdict.clone().unwrap();
    assert!(
        matches!(
            v.other_slot,
            Some(libupgrade::state::OtherSlot::FallbackTaken { slot: Slot::B, .. })
        ),
        "the core records the fallback: {v:?}"
    );
    let st = rig.node().status().unwrap();
    assert_eq!(st.booted_version.as_deref(), Some("v1"), "{st:?}");
    assert_eq!(st.inactive, Inactive::Failed("v2".into()), "{st:?}");
}

#[test]
fn errors_name_the_channel_and_the_command() {
    let rig = Rig::new(3);
    let node = rig.node();
    let e = stage_as_agent(
        &node,
        &agent_request(&rig.channel, "v9", false, None),
        None,
        &Progress(Mutex::new(Vec::new())),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(&rig.channel) && e.contains("v9"), "{e}");
    let e = node.reboot().unwrap_err().to_string();
    assert!(e.contains("false") && e.contains("failed"), "{e}");
}

#[test]
fn a_downgrade_needs_an_explicit_pin() {
    // The node runs generation 5; the channel's v2 is generation 2.
    let rig = Rig::with_generation(3, 5);
    let node = rig.node();
    let progress = Progress(Mutex::new(Vec::new()));
    let e = stage_as_agent(
        &node,
        &agent_request(&rig.channel, "v2", false, None),
        None,
        &progress,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("generation"), "{e}");
    assert_eq!(node.status().unwrap().inactive, Inactive::Empty);
    stage_as_agent(
        &node,
        &agent_request(&rig.channel, "v2", true, None),
        None,
        &progress,
    )
    .unwrap();
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Staged("v2".into())
    );
}

/// A health check of `health.d` fails on the new version at boot; the
/// boot-time confirm rolls back. Back on the old slot, the agent's status carries what the
/// core recorded (`health-failed` with the check's output), from which the agent reports a
/// failed health check, not a bootloader fallback (`rolled_back_reason`, unit-tested there).
#[test]
fn a_boot_time_health_failure_reaches_the_agent_with_the_checks_output() {
    use std::os::unix::fs::PermissionsExt;
    let mut rig = Rig::new(3);
    let check = rig.node.path().join("health.d/10-etcd");
    std::fs::write(
        &check,
        "#!/bin/sh\nif [ \"$K3OS_VERSION\" = v2 ]; then echo 'etcd quorum lost on v2' >&2; exit 1; fi\n",
    )
    .unwrap();
    std::fs::set_permissions(&check, std::fs::Permissions::from_mode(0o755)).unwrap();
    rig.stage_v2();
    rig.node().activate(LIMIT).unwrap();
    assert_eq!(rig.reboot(), Slot::B);
    match rig.init_confirm() {
        Ok(rep) if matches!(rep.outcome(), libupgrade::state::Outcome::RolledBack { .. }) => {}
        other => panic!("the boot-time confirm must roll back: {other:?}"),
    }
    assert_eq!(rig.reboot(), Slot::A);
    rig.init_confirm_good("A is good");
    let st = rig.node().status().unwrap();
    assert_eq!(st.inactive, Inactive::Failed("v2".into()), "{st:?}");
    let f = st.failed_trial.expect("the core's record of the failure");
    assert_eq!(f.event, agent::testing::HEALTH_FAILED, "{f:?}");
    assert!(f.reason.contains("etcd quorum lost on v2"), "{f:?}");
}

/// A spent trial the bootloader fell back from reaches the agent as that (the core's
/// `fallback-taken`, which `rolled_back_reason` reports as a fallback).
#[test]
fn a_fallback_reaches_the_agent_as_a_fallback() {
    let mut rig = Rig::new(1);
    rig.stage_v2();
    rig.node().activate(LIMIT).unwrap();
    assert_eq!(rig.reboot(), Slot::B);
    assert_pending(rig.init_confirm());
    assert_eq!(rig.reboot(), Slot::A);
    rig.init_confirm_good("A is good");
    let st = rig.node().status().unwrap();
    let f = st.failed_trial.expect("the core's record of the fallback");
    assert_eq!(f.event, agent::testing::FALLBACK_TAKEN, "{f:?}");
}

/// A rollout edit: the release's new rollout from its current one.
type Edit<'a> = &'a dyn Fn(Option<&libupgrade::rollout::Rollout>) -> libupgrade::rollout::Rollout;

/// The channel of `rig` signed as a TUF channel (one key per role, root 1) whose root the node
/// trusts; returns a function that re-signs targets with `version`'s rollout set by `edit`,
/// then snapshot and timestamp (what `release rollout|withdraw` do).
fn sign_channel(rig: &mut Rig) -> impl Fn(&str, Edit) {
    use libupgrade::trust::meta::Role;
    use libupgrade::trust::publish::{self, RoleSpec};
    let chan = std::path::PathBuf::from(&rig.channel);
    let keys = rig.node.path().join("channel-keys");
    let key = |name: &str| {
        let (secret, _) = libupgrade::signing::generate_keypair(&keys, name).unwrap();
        libupgrade::signing::load_secret_key(&secret).unwrap()
    };
    let (root, targets, snapshot, timestamp) = (
        key("root"),
        key("targets"),
        key("snapshot"),
        key("timestamp"),
    );
    let one = |k| RoleSpec {
        keys: vec![k],
        threshold: 1,
    };
    let roles = [
        (Role::Root, one(root.verifying_key())),
        (Role::Targets, one(targets.verifying_key())),
        (Role::Snapshot, one(snapshot.verifying_key())),
        (Role::Timestamp, one(timestamp.verifying_key())),
    ]
    .into_iter()
    .collect();
    let days = |n| publish::expires_in(chrono::Duration::days(n));
    publish::init_root(&chan, &roles, std::slice::from_ref(&root), days(365)).unwrap();
    publish::write_targets(&chan, std::slice::from_ref(&targets), days(90)).unwrap();
    let online = vec![snapshot, timestamp];
    publish::write_timestamp(&chan, &online, days(30), days(7)).unwrap();
    rig.node.cfg.channel_root = chan.join(Role::Root.file());
    move |version: &str, edit: Edit| {
        let edit = |r: Option<&libupgrade::rollout::Rollout>| Ok(edit(r));
        publish::write_rollout(
            &chan,
            version,
            &edit,
            std::slice::from_ref(&targets),
            days(90),
        )
        .unwrap();
        publish::write_timestamp(&chan, &online, days(30), days(7)).unwrap();
    }
}

/// Issue 24 on a real node: resolving `latest` for the cluster's seed (the poller, the claim
/// check) only looks: it records what it trusted and keeps the verified snapshot and targets
/// (as every TUF client does: the next poll of an unchanged channel downloads two small files),
/// but creates no seed file and leaves a withdrawn staged release in place; only
/// `drop_withdrawn` (the node's own tick) marks that slot bad, and only because the node's own
/// signed metadata withdraws it.
#[test]
fn resolving_latest_only_keeps_trust_and_only_the_nodes_tick_drops_a_withdrawn_release() {
    use libupgrade::rollout::{Rollout, Seed, Wave, Withdrawal};
    use libupgrade::trust::meta::Role;
    use std::fs;
    let mut rig = Rig::new(3);
    let publisher = rig._publisher.path().to_path_buf();
    let secret = publisher.join("publisher.key");
    release(std::path::Path::new(&rig.channel), &secret, "v1", 1);
    let set_rollout = sign_channel(&mut rig);
    let state = rig.node.cfg.state_dir.clone();
    let trust_record = state.join(libupgrade::trust::STORE_FILE);
    let seed_file = libupgrade::rollout::seed_path(&state);
    let seed = Seed::derived_from("0c9f6a52-uid");
    let later = chrono::Utc::now() + chrono::Duration::days(1);
    set_rollout("v2", &|_| Rollout {
        waves: vec![Wave {
            share_bp: 10_000,
            start: later,
        }],
        ..Rollout::default()
    });
    let node = rig.node();
    let l = resolve_latest(&node, &rig.channel, seed).unwrap();
    assert_eq!(l.version, "v1");
    let w = l.waiting.expect("v2 waits for its wave");
    assert_eq!(w.version, "v2");
    assert!(!seed_file.exists(), "the poller created the seed file");
    assert!(trust_record.exists(), "the poller records what it trusted");
    let kept = |role: Role| {
        let dir = state.join(libupgrade::trust::KEPT_DIR);
        let chan = fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        fs::read(chan.join(role.file())).unwrap()
    };
    let channel_file = |role: Role| fs::read(Path::new(&rig.channel).join(role.file())).unwrap();
    for role in [Role::Snapshot, Role::Targets] {
        assert_eq!(kept(role), channel_file(role), "kept {role}");
    }

    // The wave started: the stage (the agent's request, with the cluster's seed) takes v2 and
    // records what it trusted.
    set_rollout("v2", &|_| Rollout::default());
    assert_eq!(
        resolve_latest(&node, &rig.channel, seed).unwrap().version,
        "v2"
    );
    let req = libupgrade::StageRequest {
        seed: Some(seed),
        ..agent_request(&rig.channel, "v2", false, None)
    };
    stage_as_agent(&node, &req, None, &Progress(Mutex::new(Vec::new()))).unwrap();
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Staged("v2".into())
    );
    assert!(trust_record.exists(), "the stage records the trust");

    // Paused after this node staged v2: the node itself may go on (it started), but the
    // cluster's view (the poller, the claim check) counts no node's head start: v1 until
    // resumed, so the other nodes of the cluster do not take a paused release.
    set_rollout("v2", &|r| Rollout {
        paused: Some(libupgrade::rollout::Pause {
            since: chrono::Utc::now(),
        }),
        ..r.cloned().unwrap_or_default()
    });
    let l = resolve_latest(&node, &rig.channel, seed).unwrap();
    assert_eq!(l.version, "v1", "{l:?}");
    let held = l.waiting.expect("v2 is held by the pause");
    assert!(
        matches!(held.hold, libupgrade::rollout::Hold::Paused { .. }),
        "{held:?}"
    );
    let own = libupgrade::StageRequest {
        seed: Some(seed),
        ..libupgrade::StageRequest::new(libupgrade::Wanted::channel(&rig.channel, None))
    };
    let mine = rig.updater().resolve(&own).unwrap();
    assert_eq!(
        mine.version.as_deref(),
        Some("v2"),
        "the node itself goes on"
    );
    set_rollout("v2", &|r| Rollout {
        paused: None,
        ..r.cloned().unwrap_or_default()
    });

    // Withdrawn: the poller's resolution sees it and drops nothing.
    set_rollout("v2", &|r| Rollout {
        withdrawn: Some(Withdrawal {
            at: chrono::Utc::now(),
        }),
        ..r.cloned().unwrap_or_default()
    });
    let l = resolve_latest(&node, &rig.channel, seed).unwrap();
    assert_eq!(
        (l.version.as_str(), l.withdrawn.as_slice()),
        ("v1", &["v2".to_string()][..])
    );
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Staged("v2".into())
    );
    // The node's own tick drops it: slot B bad, never activated.
    assert_eq!(
        node.drop_withdrawn(&rig.channel, seed).unwrap().as_deref(),
        Some("v2")
    );
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Failed("v2".into())
    );
    assert_eq!(node.drop_withdrawn(&rig.channel, seed).unwrap(), None);
    assert!(
        !seed_file.exists(),
        "the cluster's seed never creates a node seed file"
    );
}
