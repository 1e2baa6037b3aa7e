//! `rollout-wave`: a node follows a release's rollout in the channel's signed metadata (issue
//! 24): it waits for its wave, takes the release after the wave's start, drops a staged
//! release the publisher withdrew, and boots the next one.
//!
//! The harness publishes a scratch channel with `libupgrade::trust::publish` (the code behind
//! `k3os-ops release targets|rollout|withdraw|timestamp`), signed by the images' root 1 keys
//! that every image trusts: v1 and v2 of the images (hard-linked), v2 rolled out in waves from
//! 1 % at T to 100 % at T+24h, T a day from now. The guest's resolution takes its time from
//! `K3OS_OPS_TEST_NOW` (libupgrade's test clock), so no clock is set. Steps:
//! 1. at T-1h, `upgrade --channel URL --version latest` stages nothing (exit 0) and says when
//!    this node's wave starts (a time between T and T+24h, from its seed); slot B untouched;
//!    Half an hour later the same poll downloads only `2.root.json` (404) and
//!    `timestamp.json`: the node kept the snapshot and targets it verified;
//! 2. at T+25h, `upgrade --stage-only` stages v2 into B (not activated);
//! 3. the publisher withdraws v2; the next `upgrade` at T+25h drops it: slot B marked bad
//!    (never activated, the next boot still A) and `slot status` says the channel withdrew
//!    it; the release still offered is v1, which the node runs, so nothing is staged;
//! 4. the publisher adds v3 under the same waves; `upgrade` at T+25h stages v3 into B and
//!    activates it; B boots v3 and is blessed.

use chrono::{DateTime, Duration, SubsecRound, Utc};
use ed25519_dalek::SigningKey;
use libupgrade::rollout::{Rollout, RolloutError, Wave};
use libupgrade::signing;
use libupgrade::state::SlotState;
use libupgrade::trust::meta::Role;
use libupgrade::trust::publish;

use bootconfig::Slot;

use super::rotation::{days, link_release, ROOT1_KEYS};
use super::steps::{sl, CMD, DOWNLOAD};
use super::Scenario;
use crate::error::{Error, Result};
use crate::server::ReleaseServer;
use crate::vm::Vm;

/// The channel's root 1 keys from the images: targets, then snapshot and timestamp.
struct Keys {
    targets: SigningKey,
    online: Vec<SigningKey>,
}

/// The rollout of v2 and v3: 1 % at `t`, all at `t` + 24 h.
fn waves(t: DateTime<Utc>) -> Rollout {
    Rollout {
        waves: vec![
            Wave {
                share_bp: 100,
                start: t,
            },
            Wave {
                share_bp: 10_000,
                start: t + Duration::hours(24),
            },
        ],
        ..Rollout::default()
    }
}

impl Scenario {
    pub(super) fn rollout_wave(&mut self) -> Result<()> {
        let chan = self.out.join("channel");
        let keys = self.wave_keys()?;
        let t = (Utc::now() + Duration::days(1)).trunc_subsecs(0);
        self.publish_wave_channel(&chan, &keys, t)?;
        let srv = ReleaseServer::start(&chan, 0)?;
        let url = srv.guest_root();
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;

        self.waits_for_its_wave(&mut vm, &url, t)?;
        self.waiting_polls_cost_two_requests(&mut vm, &srv, &url, t)?;
        let after = t + Duration::hours(25);
        self.stages_after_the_start(&mut vm, &url, after)?;
        let withdraw =
            |r: Option<&Rollout>| Ok(r.cloned().unwrap_or_default().withdraw(Utc::now()));
        self.set_rollout(&chan, &keys, "v2", &withdraw)?;
        self.withdrawn_is_dropped(&mut vm, &url, after)?;

        link_release(
            &self.target.releases(&self.root).join("v3"),
            &chan.join("v3"),
        )?;
        publish::write_targets(&chan, std::slice::from_ref(&keys.targets), days(90))
            .map_err(|e| self.wave_publish_failed(&chan, e))?;
        self.set_rollout(&chan, &keys, "v3", &|_| Ok(waves(t)))?;
        let t0 = std::time::Instant::now();
        let out = vm.run_ok(&upgrade(&url, after, ""), DOWNLOAD)?;
        self.check(
            out.contains("staged v3") && out.contains("activated slot B"),
            || format!("after the start of its wave v3 must be staged and activated:\n{out}"),
        )?;
        self.note(format!(
            "{}: v3 (same waves) staged and activated after the start in {:.1}s",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        let st = self.reboot_into_good(&mut vm, Slot::B, "v3")?;
        self.check_b_blessed_and_booted(&st)?;
        if !self.opts.keep {
            let _ = std::fs::remove_dir_all(&chan);
        }
        Ok(())
    }

    fn wave_publish_failed(&self, chan: &std::path::Path, e: impl std::fmt::Display) -> Error {
        self.fail(format!(
            "publishing the scratch channel {}: {e}",
            chan.display()
        ))
    }

    fn wave_keys(&self) -> Result<Keys> {
        let dir = self.target.channel_keys(&self.root);
        let load = |name: &str| {
            let p = dir.join(format!("{name}.key"));
            signing::load_secret_key(&p).map_err(|e| self.fail(format!("{}: {e}", p.display())))
        };
        Ok(Keys {
            targets: load(ROOT1_KEYS[1])?,
            online: vec![load(ROOT1_KEYS[2])?, load(ROOT1_KEYS[3])?],
        })
    }

    /// v1 and v2 of the images under root 1, v2 rolled out in waves from `t`.
    fn publish_wave_channel(
        &mut self,
        chan: &std::path::Path,
        keys: &Keys,
        t: DateTime<Utc>,
    ) -> Result<()> {
        let releases = self.target.releases(&self.root);
        for v in ["v1", "v2"] {
            link_release(&releases.join(v), &chan.join(v))?;
        }
        let root1 = self.target.channel_root_dir(&self.root);
        for f in ["1.root.json", Role::Root.file()] {
            std::fs::copy(root1.join(f), chan.join(f))
                .map_err(|e| Error::io("copy channel root", root1.join(f), e))?;
        }
        publish::write_targets(chan, std::slice::from_ref(&keys.targets), days(90))
            .map_err(|e| self.wave_publish_failed(chan, e))?;
        self.set_rollout(chan, keys, "v2", &|_| Ok(waves(t)))?;
        self.note(format!(
            "scratch channel {}: v2 rolled out 1 % at {t}, 100 % a day later",
            chan.display()
        ));
        Ok(())
    }

    /// Re-sign targets with `version`'s rollout edited, then snapshot and timestamp (what
    /// `release rollout|withdraw` do).
    fn set_rollout(
        &self,
        chan: &std::path::Path,
        keys: &Keys,
        version: &str,
        edit: &dyn Fn(Option<&Rollout>) -> std::result::Result<Rollout, RolloutError>,
    ) -> Result<()> {
        publish::write_rollout(
            chan,
            version,
            edit,
            std::slice::from_ref(&keys.targets),
            days(90),
        )
        .map_err(|e| self.wave_publish_failed(chan, e))?;
        publish::write_timestamp(chan, &keys.online, days(30), days(7))
            .map_err(|e| self.wave_publish_failed(chan, e))?;
        Ok(())
    }

    /// Step 1: before its wave, nothing is staged and the node says when its wave starts.
    fn waits_for_its_wave(&mut self, vm: &mut Vm, url: &str, t: DateTime<Utc>) -> Result<()> {
        let out = vm.run_ok(&upgrade(url, t - Duration::hours(1), ""), DOWNLOAD)?;
        let starts = out
            .split("v2 waits: this node's wave starts at ")
            .nth(1)
            .and_then(|rest| rest.get(..23))
            .and_then(|s| {
                DateTime::parse_from_str(&format!("{s} +0000"), "%Y-%m-%d %H:%M:%S UTC %z").ok()
            })
            .map(|d| d.with_timezone(&Utc));
        self.check(
            out.contains("nothing to stage")
                && starts.is_some_and(|s| s >= t && s <= t + Duration::hours(24)),
            || {
                format!(
                    "before its wave the node must stage nothing and name its wave's start (between {t} and a day later):\n{out}"
                )
            },
        )?;
        let st = self.status(vm)?;
        let b = sl(&st, Slot::B);
        self.check(
            !matches!(b.state, SlotState::Staged | SlotState::Trying) && st.next_boot == Slot::A,
            || format!("slot B must be untouched while the node waits: {b:?}"),
        )?;
        self.note(format!(
            "{}: before its wave: nothing staged, the wave starts at {}",
            vm.name(),
            starts.map(|s| s.to_rfc3339()).unwrap_or_default()
        ));
        Ok(())
    }

    /// Step 1, again half an hour later: the node kept the snapshot and targets it verified
    /// (`<state_dir>/channel-meta/v1/`), so a poll of the unchanged channel downloads only the
    /// next root's probe (404) and the timestamp.
    fn waiting_polls_cost_two_requests(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        url: &str,
        t: DateTime<Utc>,
    ) -> Result<()> {
        let before = srv.request_count();
        let out = vm.run_ok(&upgrade(url, t - Duration::minutes(30), ""), DOWNLOAD)?;
        let polled: Vec<String> = srv
            .requests_since(before)
            .iter()
            .map(ToString::to_string)
            .collect();
        let is = |line: &String, file: &str, status: u16| {
            line.starts_with("GET ")
                && line.contains(&format!("/{file} "))
                && line.contains(&format!("-> {status} "))
        };
        self.check(
            out.contains("nothing to stage")
                && polled.len() == 2
                && is(&polled[0], "2.root.json", 404)
                && is(&polled[1], "timestamp.json", 200),
            || {
                format!(
                    "a second poll of the unchanged channel must fetch only 2.root.json (404) and timestamp.json:\n{}\n{out}",
                    polled.join("\n")
                )
            },
        )?;
        let kept = vm.run_ok("ls /var/lib/k3os-ops/channel-meta/v1/*/", CMD)?;
        self.check(
            kept.contains("snapshot.json") && kept.contains("targets.json"),
            || format!("the node must keep the verified snapshot and targets:\n{kept}"),
        )?;
        self.note(format!(
            "{}: waiting poll: {} requests ({})",
            vm.name(),
            polled.len(),
            polled.join(", ")
        ));
        Ok(())
    }

    /// Step 2: after the wave's start v2 is staged into B (not activated).
    fn stages_after_the_start(
        &mut self,
        vm: &mut Vm,
        url: &str,
        after: DateTime<Utc>,
    ) -> Result<()> {
        let t0 = std::time::Instant::now();
        let out = vm.run_ok(&upgrade(url, after, "--stage-only"), DOWNLOAD)?;
        self.check(out.contains("staged v2"), || {
            format!("after its wave's start the node must stage v2:\n{out}")
        })?;
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::B, SlotState::Staged, Some("v2"))?;
        self.note(format!(
            "{}: after the start: v2 staged into B in {:.1}s",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Step 3: the withdrawn, staged v2 is dropped by the next upgrade: B bad, never
    /// activated, `slot status` says why; v1 (running) is what is offered.
    fn withdrawn_is_dropped(&mut self, vm: &mut Vm, url: &str, after: DateTime<Utc>) -> Result<()> {
        let out = vm.run_ok(&upgrade(url, after, ""), DOWNLOAD)?;
        self.check(
            out.contains("the staged v2 is withdrawn") && out.contains("nothing to stage"),
            || format!("the next upgrade must drop the withdrawn v2 and stage nothing:\n{out}"),
        )?;
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::B, SlotState::Bad, Some("v2"))?;
        let why = sl(&st, Slot::B)
            .last_decision
            .as_ref()
            .map(|d| d.why.clone())
            .unwrap_or_default();
        self.check(
            why.contains("withdrawn") && st.next_boot == Slot::A && st.booted == Some(Slot::A),
            || {
                format!(
                    "slot B must be bad because v2 was withdrawn, A booting next: {why:?}, next {}",
                    st.next_boot
                )
            },
        )?;
        let text = vm.run_ok("k3os-ops slot status", CMD)?;
        self.check(text.contains("withdrawn"), || {
            format!("`slot status` must say v2 was withdrawn:\n{text}")
        })?;
        self.note(format!("{}: withdrawn v2 dropped from B: {why}", vm.name()));
        Ok(())
    }
}

/// `upgrade` of the channel's latest with the resolution's clock at `now`.
fn upgrade(url: &str, now: DateTime<Utc>, extra: &str) -> String {
    format!(
        "{}={} k3os-ops upgrade --quiet {extra} --channel {url} --version latest",
        libupgrade::channel::TEST_NOW_ENV,
        now.to_rfc3339()
    )
}
