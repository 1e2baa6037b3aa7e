//! Property tests of maintenance windows and of `decide` (windows across midnight, week
//! wrap and daylight-saving changes; claims only when the rest of the window is long enough).

use k3os_ops::agent;

use std::collections::BTreeMap;

use agent::crd::*;
use agent::decide::{decide, Action, Inactive, NodeUpdateStatus, NodeView, Policy};
use agent::window::Window;
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
        prop_assert_eq!(decide(&ch, &node, at(T0)), Action::Idle(agent::decide::IdleReason::ForeignSlot));
    }
}

fn channel(version: Option<&str>) -> UpdateChannel {
    let mut ch = UpdateChannel::new(
        "stable",
        UpdateChannelSpec {
            url: "https://releases.example/stable/".into(),
            version: version.map(String::from),
            concurrency: 1,
            node_selector: BTreeMap::new(),
            window: None,
            drain: DrainSpec::default(),
            reboot_timeout: "15m".into(),
            max_failures: 1,
            max_rate: None,
        },
    );
    ch.status = Some(UpdateChannelStatus::default());
    ch
}

fn staged_node(version: &str) -> NodeView {
    NodeView {
        name: "n1".into(),
        labels: BTreeMap::new(),
        unschedulable: false,
        token: Some("tok".into()),
        update: NodeUpdateStatus {
            booted_version: Some("v1".into()),
            booted_on_trial: false,
            inactive: Inactive::Staged(version.into()),
            failed_trial: None,
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
        Action::Idle(agent::decide::IdleReason::NoTarget)
    );
    // latest resolves into status, never into spec.
    ch.status.as_mut().unwrap().latest_version = Some("v2".into());
    assert_eq!(
        decide(&ch, &node, now),
        Action::Stage {
            version: "v2".into()
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
        Action::Idle(agent::decide::IdleReason::UpToDate)
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
    assert_eq!(
        decide(&ch, &node, now),
        Action::Idle(agent::decide::IdleReason::FailedHere("v2".into()))
    );
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
        Action::Idle(agent::decide::IdleReason::NotSelected)
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
