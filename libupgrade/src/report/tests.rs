use super::*;
use fleet_report::{Outcome, Transfer, WaitFor};
use std::net::TcpListener;

fn reporter(dir: &Path, url: &str, limits: Limits) -> Reporter {
    Reporter {
        state_dir: dir.to_path_buf(),
        url: url.to_string(),
        site: "site-7".into(),
        spool: Spool::new(dir, limits),
    }
}

fn note(outcome: Outcome) -> Note {
    Note {
        outcome,
        version: "v2".into(),
        generation: 2,
    }
}

fn spooled(r: &Reporter) -> Vec<fleet_report::Report> {
    r.spool
        .pending()
        .unwrap()
        .into_iter()
        .map(|(_, p, _)| {
            fleet_report::parse(&std::fs::read(p).unwrap())
                .unwrap()
                .report
        })
        .collect()
}

#[test]
fn reports_are_signed_numbered_and_carry_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(dir.path(), "http://127.0.0.1:9/", Limits::default());
    r.spool(vec![], Some("http://ch/stable"), Wait::Unchanged);
    assert!(
        r.spool.pending().unwrap().is_empty(),
        "no outcome, no report"
    );
    assert!(!dir.path().join(KEY_FILE).exists(), "no report, no key yet");
    r.spool(
        vec![note(Outcome::TrialBoot), note(Outcome::Blessed)],
        None,
        Wait::Unchanged,
    );
    let got = spooled(&r);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].seq, got[0].seq + 1);
    assert_eq!(got[0].channel, "http://ch/stable");
    assert_eq!(got[0].site, "site-7");
    assert_eq!(got[1].outcome, Outcome::Blessed);
    let key = key::load_or_create(dir.path()).unwrap();
    assert_eq!(got[0].node, NodeId::of(&key.verifying_key()));
}

#[test]
fn a_full_spool_drops_the_oldest_and_every_later_report_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(
        dir.path(),
        "http://127.0.0.1:9/",
        Limits {
            files: 3,
            bytes: 1 << 20,
        },
    );
    for _ in 0..5 {
        r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    }
    let got = spooled(&r);
    assert_eq!(got.len(), 3);
    assert_eq!(
        got.last().unwrap().dropped,
        1,
        "report 5 was made when 1 was dropped"
    );
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    let got = spooled(&r);
    assert_eq!(got.last().unwrap().dropped, 2, "{got:?}");
    // Bytes bound too: two reports' worth.
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(
        dir.path(),
        "http://127.0.0.1:9/",
        Limits {
            files: 100,
            bytes: 1300,
        },
    );
    for _ in 0..4 {
        r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    }
    let total: u64 = r.spool.pending().unwrap().iter().map(|(_, _, n)| n).sum();
    assert!(
        total <= 1300 && r.spool.pending().unwrap().len() >= 2,
        "{total}"
    );
}

#[test]
fn a_wait_is_reported_once_until_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(dir.path(), "http://127.0.0.1:9/", Limits::default());
    let wait = |until| {
        Wait::Now(
            Some(17),
            Some((
                note(Outcome::Waiting {
                    wait_for: WaitFor::Wave,
                    until: Some(until),
                }),
                format!("v3 3 Wave {until}"),
            )),
        )
    };
    for _ in 0..5 {
        r.spool(vec![], None, wait(100));
    }
    assert_eq!(
        spooled(&r).len(),
        1,
        "an idle waiting node reports its wait once"
    );
    let meta_before = std::fs::read(r.spool.dir().join("spool.json")).unwrap();
    r.spool(vec![], None, wait(100));
    assert_eq!(
        std::fs::read(r.spool.dir().join("spool.json")).unwrap(),
        meta_before,
        "and writes nothing"
    );
    r.spool(vec![], None, wait(200));
    assert_eq!(spooled(&r).len(), 2, "a new start is a new wait");
    r.spool(vec![], None, Wait::Now(None, None));
    r.spool(vec![], None, wait(200));
    assert_eq!(
        spooled(&r).len(),
        3,
        "waiting again after a resolution without a wait"
    );
}

#[test]
fn a_damaged_spool_meta_numbers_from_the_clock_above_earlier_reports() {
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(dir.path(), "http://127.0.0.1:9/", Limits::default());
    r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    let first = spooled(&r)[0].seq;
    std::fs::write(r.spool.dir().join("spool.json"), b"{garbage").unwrap();
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    let got = spooled(&r);
    assert!(got[1].seq > first, "{} after {first}", got[1].seq);
    // A newer format is refused: nothing is spooled or rewritten.
    std::fs::write(r.spool.dir().join("spool.json"), br#"{"format":9}"#).unwrap();
    let e = r
        .try_spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged)
        .unwrap_err()
        .to_string();
    assert!(e.contains("spool format 9 is newer"), "{e}");
    assert_eq!(spooled(&r).len(), 2);
}

#[test]
fn send_goes_oldest_first_keeps_what_cannot_go_now_and_counts_refusals() {
    let dir = tempfile::tempdir().unwrap();
    // 200, then 409 (a replayed number: dropped for good), then 503: stop, keep the rest.
    let (url, bodies) = testkit::report_sink(vec![200, 409, 503]);
    let r = reporter(dir.path(), &url, Limits::default());
    for o in [
        Outcome::TrialBoot,
        Outcome::Blessed,
        Outcome::WithdrawnDropped,
        Outcome::TrialBoot,
    ] {
        r.spool(vec![note(o)], None, Wait::Unchanged);
    }
    let before = spooled(&r);
    let out = r.send();
    let bodies: Vec<Vec<u8>> = bodies.try_iter().collect();
    assert_eq!((out.sent, out.refused, out.kept), (1, 1, 2), "{out:?}");
    assert!(
        out.stopped.as_deref().unwrap().contains("HTTP 503"),
        "{out:?}"
    );
    let sent: Vec<u64> = bodies
        .iter()
        .map(|b| fleet_report::parse(b).unwrap().report.seq)
        .collect();
    assert_eq!(sent, vec![before[0].seq, before[1].seq, before[2].seq]);
    let left: Vec<u64> = spooled(&r).iter().map(|r| r.seq).collect();
    assert_eq!(left, vec![before[2].seq, before[3].seq]);
    // The refusal is counted in the next report made.
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    assert_eq!(spooled(&r).last().unwrap().dropped, 1);
}

#[test]
fn an_unreachable_collector_keeps_everything_and_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on (bound, then closed).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = reporter(
        dir.path(),
        &format!("http://127.0.0.1:{port}/"),
        Limits::default(),
    );
    r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    let t = std::time::Instant::now();
    let out = r.send();
    assert!(t.elapsed() < send::SEND_BUDGET, "{:?}", t.elapsed());
    assert_eq!((out.sent, out.kept), (0, 1));
    assert!(out.stopped.as_deref().unwrap().contains("POST"), "{out:?}");
}

#[test]
fn outcomes_map_to_reports() {
    let staged = |patched: bool, reused: u64, already: bool| crate::StageReport {
        slot: bootconfig::Slot::B,
        version: "v2".into(),
        generation: 2,
        signed_by: String::new(),
        already_staged: already,
        resumed: false,
        bytes_written: 10,
        bytes_fetched: 7,
        bytes_reused: reused,
        bytes_from_mirrors: 0,
        chunks_refused: 0,
        patched: if patched {
            vec![crate::PatchOutcome {
                artifact: crate::manifest::Artifact::Rootfs.into(),
                from: "v1".into(),
                patch_fetched: 7,
                rebuilt: 10,
                mismatched_chunks: 0,
                fell_back: None,
                base_hashed: false,
                skipped: 0,
            }]
        } else {
            vec![]
        },
    };
    let by = |r| match outcome::of_stage(&Ok(r), None, None).unwrap().outcome {
        Outcome::Staged { by, bytes } => {
            assert_eq!(bytes, 7);
            by
        }
        o => panic!("{o:?}"),
    };
    assert_eq!(by(staged(false, 0, false)), Transfer::Full);
    assert_eq!(by(staged(false, 3, false)), Transfer::Chunks);
    assert_eq!(by(staged(true, 3, false)), Transfer::Patch);
    assert_eq!(
        outcome::of_stage(&Ok(staged(false, 0, true)), None, None),
        None
    );
    let failed = outcome::of_stage(
        &Err(crate::Error::Usage("disk on fire".into())),
        Some("v3"),
        Some(3),
    )
    .unwrap();
    assert_eq!(failed.version, "v3");
    let stopped = crate::Error::Stopped {
        why: crate::Stop::Budget { budget: 1 },
        fetched: 1,
        left: 2,
    };
    assert_eq!(
        outcome::of_stage(&Err(stopped), None, None),
        None,
        "a budget stop is no failure"
    );
    assert!(failed.outcome.why().unwrap().contains("disk on fire"));
}

#[test]
fn a_verdict_reports_what_changed_the_booted_slot_and_the_fallback() {
    use crate::boot::assess::{Outcome as B, Verdict};
    use crate::state::{OtherSlot, SlotState};
    let verdict = |outcome, other_slot| Verdict {
        boot_id: "b".into(),
        slot: bootconfig::Slot::B,
        version: Some("v2".into()),
        outcome,
        reason: "check node-ready failed".into(),
        other_slot,
        checks: vec![],
        loader_damage: vec![],
    };
    let kinds = |notes: Vec<Note>| notes.iter().map(|n| n.outcome.kind()).collect::<Vec<_>>();
    let blessed = verdict(B::Blessed, None);
    assert_eq!(
        kinds(outcome::of_verdict(&blessed, None, 2, SlotState::Trying)),
        ["blessed"]
    );
    assert!(
        outcome::of_verdict(&blessed, None, 2, SlotState::Good).is_empty(),
        "a second confirm"
    );
    assert!(outcome::of_verdict(&verdict(B::Good, None), None, 2, SlotState::Good).is_empty());
    let rolled = verdict(
        B::RolledBack {
            to: bootconfig::Slot::A,
        },
        None,
    );
    let notes = outcome::of_verdict(&rolled, None, 2, SlotState::Trying);
    assert_eq!(notes[0].outcome.why(), Some("check node-ready failed"));
    assert!(outcome::of_verdict(&rolled, None, 2, SlotState::Bad).is_empty());
    let fell = verdict(
        B::Good,
        Some(OtherSlot::FallbackTaken {
            slot: bootconfig::Slot::A,
            used: 3,
            tries: 3,
        }),
    );
    let notes = outcome::of_verdict(&fell, Some(("v3", 3)), 2, SlotState::Good);
    assert_eq!(kinds(notes.clone()), ["fell_back"]);
    assert_eq!((notes[0].version.as_str(), notes[0].generation), ("v3", 3));
    assert!(notes[0].outcome.why().unwrap().contains("3 of 3 tries"));
}

#[test]
fn a_long_or_odd_channel_and_version_still_make_a_signed_report() {
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(dir.path(), "http://127.0.0.1:9/", Limits::default());
    let channel = format!("https://é.example/{}\u{7}", "é".repeat(300));
    let n = Note {
        outcome: Outcome::Blessed,
        version: format!("v\n{}", "ü".repeat(100)),
        generation: 3,
    };
    r.spool(vec![n], Some(&channel), Wait::Unchanged);
    let got = spooled(&r);
    assert_eq!(got.len(), 1, "the report was made");
    assert!(got[0].channel.len() <= 256 && got[0].channel.starts_with("https://é.example/é"));
    assert!(got[0].version.len() <= 128 && got[0].version.starts_with("vü"));
    assert_eq!(fit("a\u{1b}[31mb", 10), "a[31mb");
}

fn meta(r: &Reporter) -> spool::Meta {
    r.spool.meta().unwrap()
}

/// A collector that refuses every report (403): each is set aside and tried again only once
/// due, twice as late each time, and dropped and counted at the third refusal; nothing stops
/// the send, and `slot status` says what happened.
#[test]
fn a_refused_report_is_set_aside_retried_with_backoff_then_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (url, bodies) = testkit::report_sink(vec![403; 6]);
    let r = reporter(dir.path(), &url, Limits::default());
    r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    let t0 = 1_800_000_000;
    let out = r.send_at(t0);
    assert_eq!(
        (out.sent, out.refused, out.set_aside, out.kept),
        (0, 0, 2, 2),
        "{out:?}"
    );
    assert!(
        out.stopped.is_none(),
        "a refusal does not stop the send: {out:?}"
    );
    assert_eq!(bodies.try_iter().count(), 2, "both were tried");
    assert!(r.status_lines()[0].starts_with(
        "reports: 2 refused by the collector (403 Forbidden), set aside after 1 try of 3"
    ));
    // Not due yet: nothing is sent.
    let out = r.send_at(t0 + refusal::RETRY_BASE_SECS - 1);
    assert_eq!((out.sent, out.set_aside, out.kept), (0, 2, 2), "{out:?}");
    assert_eq!(bodies.try_iter().count(), 0);
    let t1 = t0 + refusal::RETRY_BASE_SECS;
    r.send_at(t1);
    assert_eq!(bodies.try_iter().count(), 2);
    assert!(meta(&r).refused.values().all(|f| f.tries == 2));
    r.send_at(t1 + 2 * refusal::RETRY_BASE_SECS - 1);
    assert_eq!(
        bodies.try_iter().count(),
        0,
        "the second wait is twice the first"
    );
    let out = r.send_at(t1 + 2 * refusal::RETRY_BASE_SECS);
    assert_eq!((out.refused, out.set_aside, out.kept), (2, 0, 0), "{out:?}");
    assert!(r.spool.pending().unwrap().is_empty());
    let m = meta(&r);
    assert_eq!(m.dropped, 2);
    assert!(m.refused.is_empty());
    assert_eq!(
        r.status_lines(),
        ["reports: 2 refused by the collector (403 Forbidden), dropped after 3 tries"]
    );
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    assert_eq!(
        spooled(&r).last().unwrap().dropped,
        2,
        "the next report counts them"
    );
}

/// A refused report never holds a newer one back: the newer one is sent in the same round,
/// and once it is stored the refused one (which the collector can no longer take: its number
/// is lower) is dropped and counted.
#[test]
fn a_newer_report_goes_past_a_refused_one_which_is_then_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (url, bodies) = testkit::report_sink(vec![403, 201]);
    let r = reporter(dir.path(), &url, Limits::default());
    r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    let before = spooled(&r);
    let out = r.send_at(1_800_000_000);
    assert_eq!(
        (out.sent, out.refused, out.set_aside, out.kept),
        (1, 1, 0, 0),
        "{out:?}"
    );
    let sent: Vec<u64> = bodies
        .try_iter()
        .map(|b| fleet_report::parse(&b).unwrap().report.seq)
        .collect();
    assert_eq!(sent, [before[0].seq, before[1].seq]);
    assert_eq!(meta(&r).dropped, 1);
    assert_eq!(
        r.status_lines(),
        ["reports: 1 refused by the collector (403 Forbidden), dropped after 1 try: a newer report was stored, and the collector takes no older number"]
    );
}

/// The spool as builds before refusals were set aside wrote it (no `refused` fields) is read
/// and sent as before; and what this build writes is still read by such a build's `Meta`
/// (unknown fields are ignored), which then sends every report as before.
#[test]
fn a_spool_written_before_refusals_were_set_aside_is_read_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _bodies) = testkit::report_sink(vec![403, 201]);
    let r = reporter(dir.path(), &url, Limits::default());
    r.spool(vec![note(Outcome::TrialBoot)], None, Wait::Unchanged);
    let seq = spooled(&r)[0].seq;
    let old = format!(
        r#"{{"format":1,"next_seq":{},"dropped":3,"channel":"http://ch/stable","last_wait":null}}"#,
        seq + 1
    );
    std::fs::write(r.spool.dir().join("spool.json"), old).unwrap();
    let m = meta(&r);
    assert_eq!((m.dropped, m.channel.as_str()), (3, "http://ch/stable"));
    assert!(m.refused.is_empty() && m.refused_dropped.is_none());
    let out = r.send_at(1_800_000_000);
    assert_eq!((out.set_aside, out.kept), (1, 1), "{out:?}");
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct OldMeta {
        format: u32,
        next_seq: u64,
        dropped: u64,
        #[serde(default)]
        channel: String,
        #[serde(default)]
        seed: Option<u32>,
        #[serde(default)]
        last_wait: Option<String>,
    }
    let written = std::fs::read(r.spool.dir().join("spool.json")).unwrap();
    assert!(String::from_utf8_lossy(&written).contains("\"refused\""));
    let read: OldMeta = serde_json::from_slice(&written).unwrap();
    assert_eq!((read.format, read.next_seq, read.dropped), (1, seq + 1, 3));
    r.spool(vec![note(Outcome::Blessed)], None, Wait::Unchanged);
    assert_eq!(spooled(&r).last().unwrap().dropped, 3);
}

/// A release held back because it failed here is reported as a wait for a retry, in report
/// format 2, once per decision: the same hold at every poll is one report; a later failure
/// (another attempt count, another `until`) or a hold for good is a new one.
#[test]
fn a_release_held_back_after_a_failure_is_reported_once_as_a_wait_for_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let r = reporter(dir.path(), "http://127.0.0.1:9/", Limits::default());
    let rel = crate::Release {
        source: crate::Source::parse("/srv/v2"),
        version: Some("v2".into()),
        generation: Some(2),
        pin: None,
        origin: crate::Origin::Source,
    };
    let failed = |attempts| crate::state::FailedRelease {
        version: "v2".into(),
        generation: Some(2),
        attempts,
        at: 1_800_000_000,
        why: "50-app: app is down".into(),
    };
    let retries = Some(crate::rollout::Retries {
        count: 2,
        backoff_secs: 3600,
    });
    let now = chrono::DateTime::from_timestamp(1_800_000_100, 0).unwrap();
    let decide =
        |attempts, retries| crate::rollout::decide_retry(Some(&failed(attempts)), retries, now);
    let wait = |retry: &crate::rollout::Retry| Wait::Now(None, outcome::of_retry(&rel, retry));

    assert_eq!(
        outcome::of_retry(&rel, &crate::rollout::Retry::Proceed),
        None
    );
    for _ in 0..5 {
        r.spool(vec![], None, wait(&decide(1, retries)));
    }
    let sent = spooled(&r);
    assert_eq!(
        sent.len(),
        1,
        "one report for one hold, however often it polls"
    );
    assert_eq!(sent[0].v, 2);
    assert_eq!(
        sent[0].outcome,
        Outcome::Waiting {
            wait_for: WaitFor::Retry,
            until: Some(1_800_003_600),
        }
    );
    assert_eq!((sent[0].version.as_str(), sent[0].generation), ("v2", 2));
    // Failed again after its retry: a new hold, with the doubled backoff.
    r.spool(vec![], None, wait(&decide(2, retries)));
    // Its retries spent: held for good, no `until`.
    r.spool(vec![], None, wait(&decide(3, retries)));
    r.spool(vec![], None, wait(&decide(3, retries)));
    let sent = spooled(&r);
    let untils: Vec<_> = sent
        .iter()
        .map(|s| match s.outcome {
            Outcome::Waiting {
                wait_for: WaitFor::Retry,
                until,
            } => until,
            ref o => panic!("{o:?}"),
        })
        .collect();
    assert_eq!(untils, vec![Some(1_800_003_600), Some(1_800_007_200), None]);
}
