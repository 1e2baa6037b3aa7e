use super::*;
use crate::testutil::{allow, signed, verified};
use fleet_report::Outcome;

#[test]
fn verify_answers_each_bad_input_with_its_status() {
    let a = allow();
    assert!(verify(&signed(1, "site-a", 1, Outcome::Blessed), &a).is_ok());
    let status = |body: &[u8]| verify(body, &a).unwrap_err().status;
    assert_eq!(status(&vec![b'x'; 2000]), 413);
    assert_eq!(status(b"k3os-report 1\nnope"), 400);
    // A report for another site than the node's: 403; an unknown node: 403.
    assert_eq!(status(&signed(1, "site-b", 1, Outcome::Blessed)), 403);
    assert_eq!(status(&signed(9, "site-a", 1, Outcome::Blessed)), 403);
    // Node 1's id, signed by node 9: 401.
    let mut forged =
        crate::testutil::report(1, "site-a", 1, Outcome::RolledBack { why: "x".into() });
    forged.node = crate::testutil::id(9);
    let mut body = forged.sign(&crate::testutil::key(9)).unwrap();
    let theirs = crate::testutil::id(9).to_string();
    let victim = crate::testutil::id(1).to_string();
    let at = body
        .windows(64)
        .position(|w| w == theirs.as_bytes())
        .unwrap();
    body[at..at + 64].copy_from_slice(victim.as_bytes());
    assert_eq!(status(&body), 401);
    // Numbers above what BIGINT holds.
    assert_eq!(
        status(&signed(1, "site-a", u64::MAX, Outcome::Blessed)),
        400
    );
}

#[test]
fn admit_stores_new_numbers_answers_resends_and_refuses_replays_and_full_nodes() {
    let l = Limits {
        rows_per_node: 3,
        ..Limits::default()
    };
    let v = verified(1, "site-a", 5, Outcome::Blessed);
    assert_eq!(admit(&v, &Known::default(), &l), Ok(Admit::Store));
    let stored = Known {
        max_seq: Some(5),
        same_seq: Some(v.bytes.clone()),
        rows: 1,
    };
    assert_eq!(admit(&v, &stored, &l), Ok(Admit::Resend));
    // The same number with other bytes (an old report re-signed? a reset node): 409.
    let other = verified(1, "site-a", 5, Outcome::TrialBoot);
    assert_eq!(admit(&other, &stored, &l).unwrap_err().status, 409);
    // An older number not stored (a replay of something pruned or never sent): 409.
    let old = verified(1, "site-a", 4, Outcome::Blessed);
    let known = Known {
        max_seq: Some(5),
        same_seq: None,
        rows: 1,
    };
    let e = admit(&old, &known, &l).unwrap_err();
    assert_eq!(e.status, 409);
    assert!(e.why.contains("replay"), "{}", e.why);
    let full = Known {
        max_seq: Some(5),
        same_seq: None,
        rows: 3,
    };
    let e = admit(&verified(1, "site-a", 6, Outcome::Blessed), &full, &l).unwrap_err();
    assert_eq!(e.status, 507);
    assert!(e.why.contains("(3)"), "{}", e.why);
}

#[test]
fn a_bundle_is_answered_as_a_resend_or_refused_by_its_node_s_quota_before_it_is_inflated() {
    use crate::testutil::{opened, sealed};
    let q = BundleQuota {
        count: 2,
        bytes: 10_000,
    };
    let body = sealed(1, 1, "x");
    let a = allow();
    let (s, site) = verify_bundle(&body, &a).unwrap();
    assert_eq!((s.node, site), (crate::testutil::id(1), "site-a"));
    let size = body.len() as u64;
    let known = |resend, count, bytes| BundleKnown {
        resend,
        count,
        bytes,
    };
    assert_eq!(admit_sealed(&s, &known(false, 0, 0), &q), Ok(None));
    assert_eq!(
        admit_sealed(&s, &known(true, 2, 10_000), &q),
        Ok(Some(Admit::Resend)),
        "a resend even when full"
    );
    assert_eq!(
        admit_sealed(&s, &known(false, 2, 0), &q)
            .unwrap_err()
            .status,
        507
    );
    assert_eq!(
        admit_sealed(&s, &known(false, 1, 10_000 - size), &q),
        Ok(None),
        "exactly full"
    );
    let e = admit_sealed(&s, &known(false, 1, 10_001 - size), &q).unwrap_err();
    assert_eq!(e.status, 507);
    assert!(
        e.why.contains("quota (2 bundles, 10000 bytes)"),
        "{}",
        e.why
    );
    // After inflating: the (version, attempt) taken by other bytes is 409.
    let o = opened(1, 1, "x");
    assert_eq!(admit_opened(&o, false), Ok(Admit::Store));
    let e = admit_opened(&o, true).unwrap_err();
    assert_eq!(e.status, 409);
    assert!(
        e.why.contains("attempt 1 of v2 with other bytes"),
        "{}",
        e.why
    );
    // An unenrolled node's well-signed bundle is 403, before anything is inflated.
    assert_eq!(
        verify_bundle(&sealed(9, 1, "x"), &a).unwrap_err().status,
        403
    );
}
