//! Property tests of maintenance windows and of `decide` (windows across midnight, week
//! wrap and daylight-saving changes; claims only when the rest of the window is long enough).

use crate::agent;

use std::collections::BTreeMap;

use agent::channel::crd::*;
use agent::channel::spec::Policy;
use agent::channel::window::Window;
use agent::host::status::{Inactive, NodeUpdateStatus};
use agent::reconcile::decide::{decide, Action, NodeView};
use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use proptest::prelude::*;

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const WEEK: i64 = 7 * 86_400;

fn spec(mask: u8, start_min: u32, len_min: u32, tz: Option<&str>) -> WindowSpec {
    WindowSpec {
        days: (0..7)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| DAYS[i].to_string())
            .collect(),
        start: format!("{:02}:{:02}", start_min / 60, start_min % 60),
        length: format!("{len_min}m"),
        time_zone: tz.map(String::from),
    }
}

/// Reference for zones with a fixed offset: pure arithmetic on seconds since Monday 00:00
/// local. Returns the latest end among windows containing `t`.
fn reference(mask: u8, start_min: u32, len_min: u32, offset_secs: i64, t: i64) -> Option<i64> {
    // 1970-01-05 was a Monday.
    let local = t + offset_secs - 4 * 86_400;
    let week_pos = local.rem_euclid(WEEK);
    (0..7)
        .filter(|d| mask == 0 || mask & (1 << d) != 0)
        .filter_map(|d| {
            let start = d * 86_400 + i64::from(start_min) * 60;
            let since = (week_pos - start).rem_euclid(WEEK);
            (since < i64::from(len_min) * 60).then(|| t - since + i64::from(len_min) * 60)
        })
        .max()
}

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).unwrap()
}

// 2020-01-01 .. 2031-01-01
const T0: i64 = 1_577_836_800;
const T1: i64 = 1_924_992_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// UTC and fixed-offset zones agree with modular arithmetic, including windows that run
    /// past midnight and from Sunday into Monday.
    #[test]
    fn fixed_offset_windows_match_reference(
        mask in 0u8..128, start_min in 0u32..1440, len_min in 1u32..=10_080,
        t in T0..T1, zone in 0usize..3,
    ) {
        let (tz, off) = [(None, 0), (Some("Etc/GMT-5"), 5 * 3600), (Some("Etc/GMT+11"), -11 * 3600)][zone];
        let w = Window::parse(&spec(mask, start_min, len_min, tz)).unwrap();
        let got = w.open_until(at(t)).map(|e| e.timestamp());
        prop_assert_eq!(got, reference(mask, start_min, len_min, off, t));
        // A week later nothing changes.
        prop_assert_eq!(w.open_until(at(t + WEEK)).map(|e| e.timestamp() - WEEK), got);
    }

    /// In zones with daylight saving: a window belongs to its start day, starts at the
    /// requested wall time (or right after a spring-forward gap, or at the first of two
    /// fall-back occurrences), and lasts exactly its length in elapsed time.
    #[test]
    fn dst_windows_start_on_their_day_and_last_their_length(
        day in 0u32..4018, start_min in 0u32..1440, len_min in 1u32..=1200, zone in 0usize..5,
    ) {
        let tzname = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe", "America/Santiago"][zone];
        let tz: Tz = tzname.parse().unwrap();
        let date = NaiveDate::from_ymd_opt(2020, 1, 1).unwrap() + Duration::days(i64::from(day));
        let mask = 1u8 << date.weekday().num_days_from_monday();
        let w = Window::parse(&spec(mask, start_min, len_min, Some(tzname))).unwrap();
        let s = w.start_on(date).expect("the window starts on its weekday");
        prop_assert!(w.start_on(date + Duration::days(1)).is_none());
        let local = s.with_timezone(&tz);
        prop_assert_eq!(local.date_naive(), date, "window belongs to its start day");
        let wanted = NaiveTime::from_hms_opt(start_min / 60, start_min % 60, 0).unwrap();
        match tz.from_local_datetime(&date.and_time(wanted)) {
            chrono::LocalResult::Single(x) => prop_assert_eq!(x.with_timezone(&Utc), s),
            chrono::LocalResult::Ambiguous(first, _) => prop_assert_eq!(first.with_timezone(&Utc), s),
            chrono::LocalResult::None => {
                // In a gap: the first existing instant after it.
                prop_assert!(local.time() > wanted);
                prop_assert!(tz.from_local_datetime(&(local.naive_local() - Duration::minutes(1))).single().is_none());
            }
        }
        let len = Duration::minutes(i64::from(len_min));
        prop_assert_eq!(w.open_until(s), Some(s + len));
        prop_assert_eq!(w.open_until(s + len - Duration::seconds(1)), Some(s + len));
        prop_assert_eq!(w.open_until(s + len), None);
        prop_assert_eq!(w.open_until(s - Duration::seconds(1)), None);
        prop_assert_eq!(w.next_start(s - Duration::seconds(1)), Some(s));
    }

    /// `decide` claims only inside a window with at least drain timeout + reboot timeout left,
    /// and always claims at the start of a window that is long enough.
    #[test]
    fn decide_claims_only_when_the_update_fits(
        mask in 1u8..128, start_min in 0u32..1440, len_min in 1u32..=2880,
        t in T0..T1, zone in 0usize..3, reboot_min in 1u32..120, drain_min in 1u32..120,
    ) {
        let tz = [None, Some("Europe/Berlin"), Some("America/New_York")][zone];
        let mut ch = channel(Some("v2"));
        ch.spec.window = Some(spec(mask, start_min, len_min, tz));
        ch.spec.reboot_timeout = format!("{reboot_min}m");
        ch.spec.drain.timeout = format!("{drain_min}m");
        let w = Window::parse(ch.spec.window.as_ref().unwrap()).unwrap();
        let needed = Duration::minutes(i64::from(reboot_min + drain_min));
        let node = staged_node("v2");
        let now = at(t);
        match decide(&ch, &node, now) {
            Action::Claim { version } => {
                prop_assert_eq!(version, "v2");
                let end = w.open_until(now).expect("claimed outside the window");
                prop_assert!(end - now >= needed, "claimed with {} left, needed {}", end - now, needed);
            }
            Action::WaitForWindow { .. } => {
                prop_assert!(w.open_until(now).is_none_or(|end| end - now < needed));
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
        // At the next window start: claims iff the window is long enough.
        let s = w.next_start(now).unwrap();
        let fits = Duration::minutes(i64::from(len_min)) >= needed;
        let claimed = matches!(decide(&ch, &node, s), Action::Claim { .. });
        prop_assert!(claimed || !fits || w.open_until(s) != Some(s + Duration::minutes(i64::from(len_min))),
            "did not claim at window start {s}");
    }

    /// With several windows (`window` + `windows`, in DST zones and across the week wrap),
    /// `decide` claims exactly when the update fits one of them, and waits for the earliest
    /// next start of any of them otherwise.
    #[test]
    fn decide_with_several_windows_claims_when_one_fits(
        mask_a in 1u8..128, start_a in 0u32..1440, len_a in 1u32..=2880,
        mask_b in 1u8..128, start_b in 0u32..1440, len_b in 1u32..=2880,
        t in T0..T1, zone in 0usize..3, needed_min in 2u32..240,
    ) {
        let tz = [None, Some("Europe/Berlin"), Some("America/New_York")][zone];
        let mut ch = channel(Some("v2"));
        ch.spec.window = Some(spec(mask_a, start_a, len_a, tz));
        ch.spec.windows = vec![spec(mask_b, start_b, len_b, Some("Australia/Sydney"))];
        ch.spec.reboot_timeout = format!("{}m", needed_min / 2);
        ch.spec.drain.timeout = format!("{}m", needed_min - needed_min / 2);
        let a = Window::parse(ch.spec.window.as_ref().unwrap()).unwrap();
        let b = Window::parse(&ch.spec.windows[0]).unwrap();
        let needed = Duration::minutes(i64::from(needed_min));
        let now = at(t);
        let fits = |w: &Window| w.open_until(now).is_some_and(|end| end - now >= needed);
        match decide(&ch, &staged_node("v2"), now) {
            Action::Claim { .. } => prop_assert!(fits(&a) || fits(&b)),
            Action::WaitForWindow { next } => {
                prop_assert!(!fits(&a) && !fits(&b));
                let earliest = [a.next_start(now), b.next_start(now)].into_iter().flatten().min();
                prop_assert_eq!(next, earliest);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    /// A node that holds a slot never stages or claims; a paused channel never claims.
    #[test]
    fn held_slots_and_pauses_are_respected(
        phase in 0usize..4, booted_new in any::<bool>(), on_trial in any::<bool>(),
        inactive in 0usize..4, failures in 0u32..4, max_failures in 0u32..4,
    ) {
        let mut ch = channel(Some("v2"));
        ch.spec.max_failures = max_failures;
        let phase = [SlotPhase::Claimed, SlotPhase::Draining, SlotPhase::Rebooting, SlotPhase::RollingBack][phase];
        let st = ch.status.get_or_insert_with(Default::default);
        for i in 0..failures {
            st.failures.push(FailureRecord { node: format!("other{i}"), version: "v2".into(), at: at(T0), reason: "x".into() });
        }
        let mut node = staged_node("v2");
        node.update.booted_version = Some(if booted_new { "v2" } else { "v1" }.into());
        node.update.booted_on_trial = on_trial;
        node.update.inactive = [Inactive::Empty, Inactive::Staged("v2".into()), Inactive::Activated("v2".into()), Inactive::Failed("v2".into())][inactive].clone();
        let paused = max_failures > 0 && failures >= max_failures;
        let free = decide(&ch, &node, at(T0));
        prop_assert!(!(paused && matches!(free, Action::Claim { .. })), "claimed while paused");

        ch.status.as_mut().unwrap().slots.push(SlotEntry {
            node: "n1".into(), token: "tok".into(), claimed_at: at(T0), phase,
            was_unschedulable: Some(false), version: Some("v2".into()),
        });
        let held = decide(&ch, &node, at(T0));
        prop_assert!(!matches!(held, Action::Stage { .. } | Action::Claim { .. } | Action::Idle(_)), "{:?}", held);
        // The same slot under another token belongs to someone else.
        node.token = Some("other".into());
        prop_assert_eq!(decide(&ch, &node, at(T0)), Action::Idle(agent::reconcile::decide::IdleReason::ForeignSlot));
    }
}

fn channel(version: Option<&str>) -> UpdateChannel {
    UpdateChannel::test().version(version).build()
}

fn staged_node(version: &str) -> NodeView {
    NodeView {
        name: "n1".into(),
        labels: BTreeMap::new(),
        unschedulable: false,
        token: Some("tok".into()),
        cordoned_by_us: false,
        silent_at_start: None,
        not_ready: None,
        update: NodeUpdateStatus {
            booted_version: Some("v1".into()),
            booted_on_trial: false,
            inactive: Inactive::Staged(version.into()),
            failed_trial: None,
            failed: Vec::new(),
        },
    }
}

fn held(ch: &mut UpdateChannel, phase: SlotPhase) {
    ch.status.as_mut().unwrap().slots.push(SlotEntry {
        node: "n1".into(),
        token: "tok".into(),
        claimed_at: at(T0),
        phase,
        was_unschedulable: Some(false),
        version: Some("v2".into()),
    });
}

#[test]
fn the_per_node_flow_step_by_step() {
    let now = at(T0);
    let mut node = staged_node("v2");
    node.update.inactive = Inactive::Empty;
    let mut ch = channel(None);
    assert_eq!(
        decide(&ch, &node, now),
        Action::Idle(agent::reconcile::decide::IdleReason::NoTarget)
    );
    // latest resolves into status, never into spec.
    ch.status.as_mut().unwrap().latest_version = Some("v2".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::Stage {
            version: "v2".into(),
            release: None,
            retry: None
        }
    );
    node.update.inactive = Inactive::Staged("v2".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::Claim {
            version: "v2".into()
        }
    );
    held(&mut ch, SlotPhase::Claimed);
    assert_eq!(
        decide(&ch, &node, now),
        Action::Continue {
            phase: SlotPhase::Claimed,
            version: "v2".into()
        }
    );
    ch.status.as_mut().unwrap().slots[0].phase = SlotPhase::Rebooting;
    node.update.inactive = Inactive::Activated("v2".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::Continue {
            phase: SlotPhase::Rebooting,
            version: "v2".into()
        }
    );
    // Rebooted into v2 on trial.
    node.update.booted_version = Some("v2".into());
    node.update.booted_on_trial = true;
    node.update.inactive = Inactive::Staged("v1".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::Confirm {
            version: "v2".into(),
            held: true
        }
    );
    // Confirmed and released.
    node.update.booted_on_trial = false;
    ch.status.as_mut().unwrap().slots.clear();
    assert_eq!(
        decide(&ch, &node, now),
        Action::Idle(agent::reconcile::decide::IdleReason::UpToDate)
    );
}

#[test]
fn a_fallback_boot_is_a_rollback_and_is_not_retried() {
    let now = at(T0);
    let mut ch = channel(Some("v2"));
    held(&mut ch, SlotPhase::Rebooting);
    let mut node = staged_node("v2");
    // The loader fell back: still on v1, the v2 trial spent.
    node.update.inactive = Inactive::Failed("v2".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::RolledBack {
            version: "v2".into()
        }
    );
    ch.status.as_mut().unwrap().slots.clear();
    ch.status.as_mut().unwrap().failures.push(FailureRecord {
        node: "n1".into(),
        version: "v2".into(),
        at: now,
        reason: "x".into(),
    });
    assert!(matches!(
        decide(&ch, &node, now),
        Action::Idle(agent::reconcile::decide::IdleReason::FailedHere { version, .. }) if version == "v2"
    ));
}

#[test]
fn health_rollback_reboots_back_then_finishes() {
    let now = at(T0);
    let mut ch = channel(Some("v2"));
    held(&mut ch, SlotPhase::RollingBack);
    let mut node = staged_node("v2");
    node.update.booted_version = Some("v2".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::Continue {
            phase: SlotPhase::RollingBack,
            version: "v2".into()
        }
    );
    node.update.booted_version = Some("v1".into());
    node.update.inactive = Inactive::Failed("v2".into());
    assert_eq!(decide(&ch, &node, now), Action::FinishRollback);
}

#[test]
fn target_change_while_holding_releases_the_slot() {
    let mut ch = channel(Some("v3"));
    held(&mut ch, SlotPhase::Draining);
    assert!(matches!(
        decide(&ch, &staged_node("v2"), at(T0)),
        Action::Release { .. }
    ));
}

#[test]
fn unselected_nodes_and_invalid_specs() {
    let mut ch = channel(Some("v2"));
    ch.spec.node_selector.insert("pool".into(), "edge".into());
    assert_eq!(
        decide(&ch, &staged_node("v2"), at(T0)),
        Action::Idle(agent::reconcile::decide::IdleReason::NotSelected)
    );
    let mut ch = channel(Some("v2"));
    ch.spec.reboot_timeout = "soon".into();
    match decide(&ch, &staged_node("v2"), at(T0)) {
        Action::Invalid(m) => assert!(m.contains("spec.rebootTimeout"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(Policy::from_spec(&channel(Some("v2")).spec).is_ok());
}

#[test]
fn a_claim_not_started_before_the_window_closed_is_given_back() {
    let mut ch = channel(Some("v2"));
    // Saturday 23:00 UTC for 2h; drain 10m + reboot 15m needed.
    ch.spec.window = Some(spec(1 << 5, 23 * 60, 120, None));
    held(&mut ch, SlotPhase::Claimed);
    let node = staged_node("v2");
    let sat_2330 = at(Utc
        .with_ymd_and_hms(2026, 12, 5, 23, 30, 0)
        .unwrap()
        .timestamp());
    let sun_0050 = at(Utc
        .with_ymd_and_hms(2026, 12, 6, 0, 50, 0)
        .unwrap()
        .timestamp());
    assert_eq!(
        decide(&ch, &node, sat_2330),
        Action::Continue {
            phase: SlotPhase::Claimed,
            version: "v2".into()
        }
    );
    assert!(matches!(
        decide(&ch, &node, sun_0050),
        Action::Release { .. }
    ));
    // Once disruption started it is finished, window or not.
    ch.status.as_mut().unwrap().slots[0].phase = SlotPhase::Draining;
    assert_eq!(
        decide(&ch, &node, sun_0050),
        Action::Continue {
            phase: SlotPhase::Draining,
            version: "v2".into()
        }
    );
}

/// `spec.paused` stops new claims at once (the staged node waits), and a held slot carries on.
#[test]
fn spec_paused_stops_new_claims_but_not_a_held_slot() {
    let now = at(T0);
    let node = staged_node("v2");
    let mut ch = channel(Some("v2"));
    ch.spec.paused = true;
    assert_eq!(
        decide(&ch, &node, now),
        Action::PausedBySpec {
            version: "v2".into()
        }
    );
    held(&mut ch, SlotPhase::Draining);
    assert_eq!(
        decide(&ch, &node, now),
        Action::Continue {
            phase: SlotPhase::Draining,
            version: "v2".into()
        }
    );
}

/// A channel paused by failures resumes with `spec.resumedAt` (one `kubectl patch`): the
/// failures recorded before it no longer count, new failures count again, and the node that
/// failed still does not retry the version.
#[test]
fn resumed_at_resumes_a_channel_paused_by_failures() {
    let now = at(T0);
    let node = staged_node("v2");
    let mut ch = channel(Some("v2"));
    ch.status.as_mut().unwrap().failures.push(FailureRecord {
        node: "n9".into(),
        version: "v2".into(),
        at: at(T0) - Duration::hours(2),
        reason: "health".into(),
    });
    assert_eq!(
        decide(&ch, &node, now),
        Action::Paused {
            version: "v2".into()
        }
    );
    ch.spec.resumed_at = Some(at(T0) - Duration::hours(1));
    assert_eq!(
        decide(&ch, &node, now),
        Action::Claim {
            version: "v2".into()
        }
    );
    ch.status.as_mut().unwrap().failures.push(FailureRecord {
        node: "n8".into(),
        version: "v2".into(),
        at: at(T0) - Duration::minutes(5),
        reason: "health".into(),
    });
    assert_eq!(
        decide(&ch, &node, now),
        Action::Paused {
            version: "v2".into()
        }
    );
    let mut failed = staged_node("v2");
    failed.name = "n9".into();
    ch.status.as_mut().unwrap().failures.pop();
    assert!(matches!(
        decide(&ch, &failed, now),
        Action::Idle(agent::reconcile::decide::IdleReason::FailedHere { version, .. }) if version == "v2"
    ));
}

/// Saturday night and Wednesday night: claims in either, waits in between for the next one.
#[test]
fn two_weekly_windows() {
    let mut ch = channel(Some("v2"));
    let night = |day: &str| WindowSpec {
        days: vec![day.into()],
        start: "22:00".into(),
        length: "4h".into(),
        time_zone: Some("Europe/Berlin".into()),
    };
    ch.spec.windows = vec![night("sat"), night("wed")];
    let node = staged_node("v2");
    let berlin = |d: u32, h: u32| {
        chrono_tz::Europe::Berlin
            .with_ymd_and_hms(2026, 12, d, h, 0, 0)
            .unwrap()
            .with_timezone(&Utc)
    };
    // 2026-12-02 is a Wednesday, 2026-12-05 a Saturday.
    assert!(matches!(
        decide(&ch, &node, berlin(2, 22)),
        Action::Claim { .. }
    ));
    assert_eq!(
        decide(&ch, &node, berlin(3, 12)),
        Action::WaitForWindow {
            next: Some(berlin(5, 22))
        }
    );
    assert!(matches!(
        decide(&ch, &node, berlin(5, 23)),
        Action::Claim { .. }
    ));
    assert_eq!(
        decide(&ch, &node, berlin(6, 12)),
        Action::WaitForWindow {
            next: Some(berlin(9, 22))
        }
    );
    ch.spec.windows[1].start = "25:00".into();
    assert!(
        matches!(decide(&ch, &node, berlin(2, 22)), Action::Invalid(e) if e.starts_with("spec.windows[1]"))
    );
}
