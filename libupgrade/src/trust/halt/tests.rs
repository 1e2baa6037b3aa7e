//! The halt role's rules, one test per attack the module docs name: the guard's key signs a
//! release, widens a rollout, lifts the publisher's pause, replays an old halt; and what a
//! node of the previous release reads.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ed25519_dalek::SigningKey;

use super::*;
use crate::manifest::{Arch, MANIFEST_FILE};
use crate::rollout::{Wave, Withdrawal};
use crate::trust::meta::{file_meta, DelegatedRole, Delegations, TargetCustom};

fn t(h: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
}

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// The guard's key.
const GUARD: u8 = 9;

fn waves() -> Rollout {
    Rollout {
        waves: vec![
            Wave {
                share_bp: 100,
                start: t(0),
            },
            Wave {
                share_bp: 10_000,
                start: t(72),
            },
        ],
        ..Rollout::default()
    }
}

/// Targets v2 (waves), v3 (paused by the publisher since t(1)), delegating `halt` to the
/// guard's key.
fn targets() -> Targets {
    let entry = |v: &str, g: u64, rollout: Rollout| {
        let mut m = file_meta(format!("manifest of {v}").as_bytes(), None);
        m.custom = Some(TargetCustom {
            version: v.into(),
            generation: g,
            arch: Arch::host(),
            rollout: Some(rollout),
        });
        (format!("{v}/{MANIFEST_FILE}"), m)
    };
    let paused = waves().pause(t(1)).unwrap();
    let k = Key::ed25519(&key(GUARD).verifying_key());
    Targets {
        type_: "targets".into(),
        spec_version: "1.0.0".into(),
        version: 4,
        expires: t(1000),
        targets: BTreeMap::from([entry("v2", 2, waves()), entry("v3", 3, paused)]),
        delegations: Some(Delegations {
            keys: BTreeMap::from([(k.id(), k.clone())]),
            roles: vec![DelegatedRole {
                name: HALT_ROLE.into(),
                keyids: vec![k.id()],
                threshold: 1,
                terminating: true,
                paths: Some(vec![HALT_PATHS.into()]),
            }],
        }),
    }
}

fn mark(h: i64) -> Mark {
    Mark {
        since: t(h),
        reason: "rolled_back 5 of 10".into(),
    }
}

/// `halt.json` halting `version` (none: empty) at version `v`, signed by `signer`.
fn halt_file(tg: &Targets, version: Option<&str>, v: u64, signer: u8) -> Vec<u8> {
    let m = mark(2);
    let (mut doc, _) = next_doc(None, tg, version.map(|x| (x, &m)), t(500)).unwrap();
    doc.version = v;
    Envelope::sign(&doc, &[key(signer)]).to_bytes()
}

fn verified(tg: &Targets, bytes: &[u8], seen: Option<&Seen>) -> Result<Option<Halts>, TrustError> {
    verify(tg, Some(bytes), "mem/halt.json", seen, Some(t(3)))
}

fn rollout_of<'a>(tg: &'a Targets, v: &str) -> &'a Rollout {
    tg.targets[&format!("{v}/{MANIFEST_FILE}")]
        .custom
        .as_ref()
        .unwrap()
        .rollout
        .as_ref()
        .unwrap()
}

#[test]
fn a_halt_signed_by_the_guard_holds_the_release_as_a_pause_and_nothing_else() {
    let mut tg = targets();
    let before = rollout_of(&tg, "v2").clone();
    let h = verified(&tg, &halt_file(&tg, Some("v2"), 1, GUARD), None)
        .unwrap()
        .unwrap();
    assert_eq!(h.seen.version, 1);
    let held = apply(&mut tg, &h.doc, t(3));
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].target, format!("v2/{MANIFEST_FILE}"));
    let after = rollout_of(&tg, "v2");
    assert_eq!(after.paused, Some(Pause { since: t(2) }));
    // Waves, shift, withdrawal, stop: untouched.
    assert_eq!(
        Rollout {
            paused: None,
            ..after.clone()
        },
        before
    );
    // A `since` after the node's clock holds from the node's clock on.
    let mut tg2 = targets();
    apply(&mut tg2, &h.doc, t(1));
    assert_eq!(rollout_of(&tg2, "v2").paused, Some(Pause { since: t(1) }));
}

#[test]
fn a_halt_not_signed_by_a_threshold_of_the_delegated_keys_is_refused() {
    let tg = targets();
    for signer in [1u8, 2, 3, 4, 8] {
        let e = verified(&tg, &halt_file(&tg, Some("v2"), 1, signer), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("0 valid signature(s) by the halt role's keys"),
            "{e}"
        );
    }
    // No delegation: halt.json is not even read.
    let mut plain = targets();
    plain.delegations = None;
    assert_eq!(
        verify(&plain, Some(b"garbage"), "x", None, Some(t(3))).unwrap(),
        None
    );
}

#[test]
fn the_guard_key_cannot_sign_a_release() {
    let tg = targets();
    // A halt.json that lists a release target, with release custom data, is refused whole.
    let m = file_meta(b"evil manifest", None);
    let doc = serde_json::json!({
        "_type": "targets", "spec_version": "1.0.0", "version": 1, "expires": "2030-01-01T00:00:00Z",
        "targets": {"v9/manifest.json": {"length": m.length, "hashes": m.hashes,
            "custom": {"halt": {"since": "2026-01-01T00:00:00Z"}, "version": "v9", "generation": 9, "arch": Arch::host().as_str()}}}
    });
    let bytes = Envelope::sign(&doc, &[key(GUARD)]).to_bytes();
    let e = verified(&tg, &bytes, None).unwrap_err();
    assert!(
        e.to_string().contains("outside the halt role's paths"),
        "{e}"
    );
    // So is a nested path under halt/ (the delegated pattern is one segment).
    let doc = serde_json::json!({
        "_type": "targets", "spec_version": "1.0.0", "version": 1, "expires": "2030-01-01T00:00:00Z",
        "targets": {"halt/v9/manifest.json": {"length": 1, "hashes": {"sha256": "00"},
            "custom": {"halt": {"since": "2026-01-01T00:00:00Z"}}}}
    });
    let e = verified(&tg, &Envelope::sign(&doc, &[key(GUARD)]).to_bytes(), None).unwrap_err();
    assert!(
        e.to_string().contains("outside the halt role's paths"),
        "{e}"
    );
    // And the guard's key signing targets.json counts for nothing: it is in no root role
    // (the client tests check `check_role` against root; here the delegation refuses a
    // top-level key, see publish's tests).
}

#[test]
fn the_guard_cannot_widen_a_rollout_nor_lift_the_publishers_pause() {
    let mut tg = targets();
    // An entry carrying rollout data of its own (share 100 % now): only the mark is read.
    let sha = tg.targets[&format!("v2/{MANIFEST_FILE}")]
        .sha256()
        .unwrap()
        .to_string();
    let len = tg.targets[&format!("v2/{MANIFEST_FILE}")].length;
    let doc = serde_json::json!({
        "_type": "targets", "spec_version": "1.0.0", "version": 1, "expires": "2030-01-01T00:00:00Z",
        "targets": {"halt/v2": {"length": len, "hashes": {"sha256": sha},
            "custom": {"halt": {"since": "2027-01-15T08:00:00Z"},
                       "rollout": {"waves": [{"share_bp": 10000, "start": "2020-01-01T00:00:00Z"}]}}}}
    });
    let h = verified(&tg, &Envelope::sign(&doc, &[key(GUARD)]).to_bytes(), None)
        .unwrap()
        .unwrap();
    apply(&mut tg, &h.doc, t(3));
    assert_eq!(rollout_of(&tg, "v2").waves, waves().waves);
    // The publisher's pause of v3 stays exactly as signed, with or without a halt naming v3.
    for halt in [None, Some("v3")] {
        let mut tg = targets();
        let h = verified(&tg, &halt_file(&tg, halt, 1, GUARD), None)
            .unwrap()
            .unwrap();
        assert!(apply(&mut tg, &h.doc, t(3)).is_empty());
        assert_eq!(rollout_of(&tg, "v3").paused, Some(Pause { since: t(1) }));
    }
    // A withdrawn release stays withdrawn and is not "held" instead.
    let mut tg = targets();
    let v2 = format!("v2/{MANIFEST_FILE}");
    let c = tg.targets.get_mut(&v2).unwrap().custom.as_mut().unwrap();
    c.rollout.as_mut().unwrap().withdrawn = Some(Withdrawal { at: t(1) });
    let h = verified(&tg, &halt_file(&tg, Some("v2"), 1, GUARD), None)
        .unwrap()
        .unwrap();
    assert!(apply(&mut tg, &h.doc, t(3)).is_empty());
    assert_eq!(rollout_of(&tg, "v2").paused, None);
}

#[test]
fn a_halt_binds_to_the_exact_manifest_it_names() {
    let mut tg = targets();
    let m = mark(2);
    let (mut doc, _) = next_doc(None, &tg, Some(("v2", &m)), t(500)).unwrap();
    for e in doc.targets.values_mut() {
        e.hashes.insert("sha256".into(), "11".repeat(32));
    }
    assert!(apply(&mut tg, &doc, t(3)).is_empty());
}

#[test]
fn an_old_or_removed_halt_is_a_rollback_and_a_lifted_one_is_inert() {
    let tg = targets();
    let seen = Seen {
        keyids: vec![Key::ed25519(&key(GUARD).verifying_key()).id()],
        version: 5,
    };
    // Version 4 after 5: refused; 5 again: accepted.
    let e = verified(&tg, &halt_file(&tg, None, 4, GUARD), Some(&seen)).unwrap_err();
    assert!(e.to_string().contains("older than version 5"), "{e}");
    assert!(verified(&tg, &halt_file(&tg, Some("v2"), 5, GUARD), Some(&seen)).is_ok());
    // Removed after one was seen: refused; never seen: no halt.
    let e = verify(&tg, None, "mem/halt.json", Some(&seen), Some(t(3))).unwrap_err();
    assert!(
        e.to_string()
            .contains("missing, but this node verified halt version 5"),
        "{e}"
    );
    assert_eq!(
        verify(&tg, None, "mem/halt.json", None, Some(t(3))).unwrap(),
        None
    );
    // The publisher changed the guard's key: the old bound is forgotten.
    let mut rotated = tg.clone();
    let k = Key::ed25519(&key(10).verifying_key());
    let d = rotated.delegations.as_mut().unwrap();
    d.keys = BTreeMap::from([(k.id(), k.clone())]);
    d.roles[0].keyids = vec![k.id()];
    assert!(verified(&rotated, &halt_file(&rotated, None, 1, 10), Some(&seen)).is_ok());
    // Replaying a halt the publisher lifted holds nothing.
    let mut lifted = targets();
    let v2 = format!("v2/{MANIFEST_FILE}");
    let c = lifted
        .targets
        .get_mut(&v2)
        .unwrap()
        .custom
        .as_mut()
        .unwrap();
    let r = c.rollout.as_ref().unwrap().lift_halt(t(2), t(5)).unwrap();
    c.rollout = Some(r);
    let h = verified(
        &lifted,
        &halt_file(&lifted, Some("v2"), 6, GUARD),
        Some(&seen),
    );
    assert!(apply(&mut lifted, &h.unwrap().unwrap().doc, t(6)).is_empty());
    assert_eq!(
        active_for(
            &lifted,
            &next_doc(None, &tg, Some(("v2", &mark(2))), t(9)).unwrap().0,
            "v2"
        ),
        None
    );
}

#[test]
fn an_expired_halt_is_refused_unless_expiry_is_waived() {
    let tg = targets();
    let bytes = halt_file(&tg, Some("v2"), 1, GUARD); // expires t(500)
    let e = verify(&tg, Some(&bytes), "mem/halt.json", None, Some(t(501))).unwrap_err();
    assert!(e.to_string().contains("expired"), "{e}");
    assert!(verify(&tg, Some(&bytes), "mem/halt.json", None, None).is_ok());
}

#[test]
fn the_guard_keeps_a_live_halts_since_and_replaces_a_lifted_one() {
    let tg = targets();
    // Whole seconds, as TUF writes times (python-tuf refuses fractions).
    let ms = chrono::Duration::milliseconds(250);
    let m = Mark {
        since: t(2) + ms,
        ..mark(2)
    };
    let (first, added) = next_doc(None, &tg, Some(("v2", &m)), t(500) + ms).unwrap();
    assert_eq!(added, vec!["halt/v2".to_string()]);
    assert_eq!(first.version, 1);
    assert_eq!(first.expires, t(500));
    assert_eq!(first.targets["halt/v2"].custom.halt.since, t(2));
    let (again, added) = next_doc(Some(&first), &tg, Some(("v2", &mark(9))), t(600)).unwrap();
    assert!(added.is_empty());
    assert_eq!(again.version, 2);
    assert_eq!(again.targets["halt/v2"].custom.halt.since, t(2));
    let mut lifted = tg.clone();
    let v2 = format!("v2/{MANIFEST_FILE}");
    let c = lifted
        .targets
        .get_mut(&v2)
        .unwrap()
        .custom
        .as_mut()
        .unwrap();
    c.rollout = Some(c.rollout.as_ref().unwrap().lift_halt(t(2), t(5)).unwrap());
    let (third, added) = next_doc(Some(&again), &lifted, Some(("v2", &mark(9))), t(600)).unwrap();
    assert_eq!(added, vec!["halt/v2".to_string()]);
    assert_eq!(third.targets["halt/v2"].custom.halt.since, t(9));
    // Signed only with the delegated keys; other keys cannot make the threshold.
    assert!(sign(&tg, &third, &[key(1), key(GUARD)]).is_ok());
    assert!(sign(&tg, &third, &[key(1), key(2)]).is_err());
}

#[test]
fn lifting_a_halt_shifts_the_schedule_by_the_time_it_held() {
    let r = waves();
    // Held from t(2) to t(5): three hours later on the schedule, as a pause's resume does.
    let lifted = r.lift_halt(t(2), t(5)).unwrap();
    assert_eq!(lifted.paused_secs, 3 * 3600);
    assert_eq!(lifted.halt_lifted, Some(t(2)));
    assert_eq!(lifted.share_ppm_at(t(5)), r.share_ppm_at(t(2)));
    // A `since` far in the past counts from the first wave's start only.
    let early = r.lift_halt(t(-10_000), t(5)).unwrap();
    assert_eq!(early.paused_secs, 5 * 3600);
    // Lifting the same halt twice is refused.
    assert!(lifted.lift_halt(t(2), t(6)).is_err());
    // A publisher's pause since t(4) counts its own part at its resume.
    let paused = r.pause(t(4)).unwrap().lift_halt(t(2), t(5)).unwrap();
    assert_eq!(paused.paused_secs, 2 * 3600);
    assert_eq!(paused.resume(t(5)).unwrap().paused_secs, 3 * 3600);
}

#[test]
fn targets_and_records_of_the_previous_release_read_as_no_halt() {
    // targets.json's signed object as the previous release wrote it: no `delegations`.
    let prev = r#"{"_type":"targets","spec_version":"1.0.0","version":3,"expires":"2030-01-01T00:00:00Z","targets":{}}"#;
    let tg: Targets = serde_json::from_str(prev).unwrap();
    assert_eq!(tg.delegations, None);
    assert_eq!(delegation(&tg), None);
    // And written back without one: the same canonical bytes a previous node verified.
    assert_eq!(
        meta::canonical(&tg).unwrap(),
        meta::canonical(&serde_json::from_str::<serde_json::Value>(prev).unwrap()).unwrap()
    );
    // A record of the previous release (no `halt`).
    let rec = serde_json::json!({"root": {"signed": {}, "signatures": []}, "timestamp": 3, "snapshot": 3, "targets": 3});
    let r: crate::trust::Record = serde_json::from_value(rec).unwrap();
    assert_eq!(r.halt, None);
}
