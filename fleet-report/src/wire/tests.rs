use super::*;
use crate::{AllowList, Outcome, Refusal, Transfer, WaitFor};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn report(k: &SigningKey, outcome: Outcome) -> Report {
    Report {
        v: outcome.format(),
        node: NodeId::of(&k.verifying_key()),
        site: "site-0042".into(),
        seq: 7,
        at: 1_800_000_000,
        channel: "https://releases.example/stable".into(),
        version: "v1.2.3".into(),
        generation: 12,
        outcome,
        seed: Some(4242),
        dropped: 0,
    }
}

fn every_outcome() -> Vec<Outcome> {
    vec![
        Outcome::Staged {
            bytes: 123_456_789,
            by: Transfer::Chunks,
        },
        Outcome::StageFailed {
            why: "sha256 mismatch".into(),
        },
        Outcome::Waiting {
            wait_for: WaitFor::Wave,
            until: Some(1_800_003_600),
        },
        Outcome::Waiting {
            wait_for: WaitFor::Pause,
            until: None,
        },
        Outcome::Waiting {
            wait_for: WaitFor::Retry,
            until: Some(1_800_007_200),
        },
        Outcome::Waiting {
            wait_for: WaitFor::Retry,
            until: None,
        },
        Outcome::TrialBoot,
        Outcome::Blessed,
        Outcome::RolledBack {
            why: "check node-ready failed".into(),
        },
        Outcome::FellBack {
            why: "3 tries used".into(),
        },
        Outcome::WithdrawnDropped,
    ]
}

#[test]
fn every_outcome_signs_and_parses_back_equal() {
    let k = key(1);
    for o in every_outcome() {
        let r = report(&k, o);
        let bytes = r.sign(&k).unwrap();
        assert!(bytes.len() <= MAX_REPORT_BYTES);
        let v = parse(&bytes).unwrap();
        assert_eq!(v.report, r);
        assert_eq!(v.bytes, bytes);
    }
}

#[test]
fn the_wire_form_is_the_documented_one() {
    let k = key(1);
    let bytes = report(&k, Outcome::Blessed).sign(&k).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<&str> = text.splitn(3, '\n').collect();
    assert_eq!(lines[0], "k3os-report 1");
    assert_eq!(lines[1].len(), 88);
    assert!(lines[2].starts_with(r#"{"v":1,"node":""#), "{}", lines[2]);
    assert!(
        lines[2].contains(r#""outcome":{"kind":"blessed"}"#),
        "{}",
        lines[2]
    );
}

#[test]
fn a_long_reason_is_shortened_to_fit_1_kib() {
    let k = key(2);
    for why in ["x".repeat(5000), "é\n\"".repeat(2000), "\u{1}".repeat(900)] {
        let r = report(&k, Outcome::RolledBack { why: why.clone() });
        let bytes = r.sign(&k).unwrap();
        assert!(bytes.len() <= MAX_REPORT_BYTES, "{}", bytes.len());
        let got = parse(&bytes).unwrap().report;
        let w = got.outcome.why().unwrap();
        assert!(w.ends_with('…') || w.is_empty(), "{w:?}");
        assert!(why.starts_with(w.trim_end_matches('…')));
        // Shortened no more than needed: one more character would not fit.
        assert!(
            bytes.len() > MAX_REPORT_BYTES - 8,
            "shortened more than needed: {}",
            bytes.len()
        );
    }
}

#[test]
fn a_report_is_signed_only_by_its_own_node() {
    let r = report(&key(1), Outcome::Blessed);
    let e = r.sign(&key(2)).unwrap_err();
    assert!(e.to_string().contains("names node"), "{e}");
}

#[test]
fn tampered_bytes_do_not_verify() {
    let k = key(3);
    let bytes = report(&k, Outcome::Blessed).sign(&k).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    // Another site, another seq, another outcome: each breaks the signature.
    for (from, to) in [
        ("site-0042", "site-0043"),
        (r#""seq":7"#, r#""seq":8"#),
        ("blessed", "trial_boot"),
    ] {
        let t = text.replacen(from, to, 1);
        assert_ne!(t, text);
        let e = parse(t.as_bytes()).unwrap_err();
        assert!(matches!(e, ReportError::Signature { .. }), "{from}: {e}");
    }
    // Re-encoding the same report (whitespace) is not its canonical form.
    let spaced = text.replacen(r#""seq":7"#, r#""seq": 7"#, 1);
    let e = parse(spaced.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("canonical"), "{e}");
    // A forger's own key, claiming the victim's node id, signs nothing the victim's key verifies.
    let mut forged = report(&k, Outcome::RolledBack { why: "x".into() });
    forged.node = NodeId::of(&k.verifying_key());
    let other = key(4);
    let json = serde_json::to_vec(&forged).unwrap();
    let e = parse(&envelope(&other, &json)).unwrap_err();
    assert!(matches!(e, ReportError::Signature { .. }), "{e}");
}

#[test]
fn oversized_bodies_are_refused_before_reading() {
    let big = vec![b'a'; MAX_REPORT_BYTES + 1];
    assert_eq!(
        parse(&big).unwrap_err(),
        ReportError::TooLarge {
            found: MAX_REPORT_BYTES + 1
        }
    );
}

fn signed_json(k: &SigningKey, json: &str) -> Vec<u8> {
    envelope(k, json.as_bytes())
}

#[test]
fn bad_bodies_are_refused_naming_what_is_wrong() {
    let k = key(5);
    let good = serde_json::to_string(&report(&k, Outcome::Blessed)).unwrap();
    let cases = [
        (good.replacen(r#""v":1"#, r#""v":3"#, 1), "format 3"),
        (good.replacen(r#""v":1"#, r#""v":3"#, 1), "newer"),
        (good.replacen(r#""v":1"#, r#""v":0"#, 1), "format 0"),
        // Format 2 only for a wait for a retry, which format 1 cannot carry.
        (
            good.replacen(r#""v":1"#, r#""v":2"#, 1),
            "report format 2 does not match its outcome blessed (format 1)",
        ),
        (
            good.replacen(
                r#"{"kind":"blessed"}"#,
                r#"{"kind":"waiting","for":"retry"}"#,
                1,
            ),
            "report format 1 does not match its outcome waiting (format 2)",
        ),
        (good.replacen(r#""v":1,"#, "", 1), "no format number"),
        (good.replacen("site-0042", "Site_42", 1), "site"),
        (good.replacen("site-0042", "", 1), "site"),
        (good.replacen("site-0042", &"a".repeat(64), 1), "site"),
        (good.replacen(r#""seq":7"#, r#""seq":0"#, 1), "seq is 0"),
        (
            good.replacen(r#""seed":4242"#, r#""seed":1000000"#, 1),
            "not below 1000000",
        ),
        (good.replacen(r#""seq":7"#, r#""seq":-1"#, 1), "format 1"),
        (good.replacen("v1.2.3", "v1\\u0007", 1), "version"),
        (
            good.replacen(r#""at":"#, r#""evil":1,"at":"#, 1),
            "unknown field",
        ),
        (
            good.replacen(r#"{"kind":"blessed"}"#, r#"{"kind":"blessed","x":1}"#, 1),
            "canonical",
        ),
        (good.replacen(r#""seq":7"#, r#""seq":7.0"#, 1), "format 1"),
        (good.replacen("v1.2.3", "v1.2.\\u0033", 1), "canonical"),
        (
            good.replacen(r#""generation":12,"#, "", 1).replacen(
                r#""v":1,"#,
                r#""v":1,"generation":12,"#,
                1,
            ),
            "canonical",
        ),
        (good.replacen("blessed", "exploded", 1), "unknown variant"),
        (good[..good.len() - 1].to_string(), "EOF"),
    ];
    for (json, want) in cases {
        let e = parse(&signed_json(&k, &json)).unwrap_err().to_string();
        assert!(e.contains(want), "{json}\n→ {e}\n(wanted {want:?})");
    }
}

/// A wait for a retry goes as format 2 (what a collector of the previous release, which reads
/// only format 1, answers 400 naming); every other outcome stays format 1, byte for byte.
#[test]
fn only_a_wait_for_a_retry_is_format_2() {
    let k = key(1);
    for o in every_outcome() {
        let retry = matches!(
            o,
            Outcome::Waiting {
                wait_for: WaitFor::Retry,
                ..
            }
        );
        let text = String::from_utf8(report(&k, o).sign(&k).unwrap()).unwrap();
        let body = text.splitn(3, '\n').nth(2).unwrap();
        let want = if retry { r#"{"v":2,"# } else { r#"{"v":1,"# };
        assert!(body.starts_with(want), "{body}");
    }
    let r = report(
        &k,
        Outcome::Waiting {
            wait_for: WaitFor::Retry,
            until: Some(1_800_007_200),
        },
    );
    let text = String::from_utf8(r.sign(&k).unwrap()).unwrap();
    assert!(
        text.contains(r#""outcome":{"kind":"waiting","for":"retry","until":1800007200}"#),
        "{text}"
    );
    // A report that says format 1 for it cannot be signed.
    let e = Report { v: 1, ..r }.sign(&k).unwrap_err().to_string();
    assert!(
        e.contains("does not match its outcome waiting (format 2)"),
        "{e}"
    );
}

#[test]
fn bad_envelopes_are_refused() {
    let k = key(6);
    let good = report(&k, Outcome::Blessed).sign(&k).unwrap();
    let e = parse(b"GET / HTTP/1.1\r\n").unwrap_err().to_string();
    assert!(e.contains("expected first line"), "{e}");
    let mut no_sig = HEADER.to_vec();
    no_sig.extend_from_slice(b"abc");
    assert!(parse(&no_sig)
        .unwrap_err()
        .to_string()
        .contains("no signature line"));
    let mut short = good.clone();
    short.remove(HEADER.len());
    assert!(parse(&short)
        .unwrap_err()
        .to_string()
        .contains("signature line is 87"));
    let mut bad = good.clone();
    bad[HEADER.len()] = b'!';
    assert!(parse(&bad).unwrap_err().to_string().contains("not base64"));
}

#[test]
fn a_node_id_that_is_no_key_is_refused() {
    let k = key(7);
    let good = serde_json::to_string(&report(&k, Outcome::Blessed)).unwrap();
    let hexid = NodeId::of(&k.verifying_key()).to_string();
    // Not every 32-byte string decompresses to a curve point; find one that does not.
    let not_a_point = (0u8..=255)
        .map(|b| {
            let mut id = [b; 32];
            id[31] &= 0x7f;
            NodeId(id)
        })
        .find(|n| n.key().is_none())
        .expect("some byte pattern is not a point");
    let json = good.replacen(&hexid, &not_a_point.to_string(), 1);
    let e = parse(&signed_json(&k, &json)).unwrap_err().to_string();
    assert!(e.contains("not an ed25519 public key"), "{e}");
}

#[test]
fn the_allow_list_binds_a_node_to_its_site() {
    let (k1, k2) = (key(8), key(9));
    let (n1, n2) = (
        NodeId::of(&k1.verifying_key()),
        NodeId::of(&k2.verifying_key()),
    );
    let list = AllowList::parse(&format!("# sites\n{n1} site-0042\n\n{n2}   other\n")).unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list.check(&report(&k1, Outcome::Blessed)), Ok(()));
    // k2 is enrolled, but for "other": it cannot report for site-0042.
    let e = list.check(&report(&k2, Outcome::Blessed)).unwrap_err();
    assert!(matches!(e, Refusal::WrongSite { .. }), "{e}");
    // An invented node (any fresh key) is refused whatever site it claims.
    let e = list.check(&report(&key(10), Outcome::Blessed)).unwrap_err();
    assert!(matches!(e, Refusal::UnknownNode { .. }), "{e}");
}

#[test]
fn bad_allow_lists_name_the_line() {
    let n = NodeId::of(&key(8).verifying_key());
    for (text, want) in [
        (format!("{n}\n"), "line 1: expected"),
        (format!("\n{n} a b\n"), "line 2: expected"),
        ("abcd site\n".to_string(), "not a node id"),
        (format!("{n} Site!\n"), "not a site name"),
        (format!("{n} a\n{n} b\n"), "line 2: node"),
    ] {
        let e = AllowList::parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?} → {e}");
    }
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn parse_never_panics_and_accepts_only_signed_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn any_why_fits_and_round_trips(why in ".{0,2000}", seq in 1u64.., at in any::<u64>()) {
            let k = key(11);
            let mut r = report(&k, Outcome::StageFailed { why });
            r.seq = seq;
            r.at = at;
            let bytes = r.sign(&k).unwrap();
            prop_assert!(bytes.len() <= MAX_REPORT_BYTES);
            let got = parse(&bytes).unwrap().report;
            prop_assert_eq!(got.seq, seq);
            prop_assert_eq!(got.at, at);
        }
    }
}
