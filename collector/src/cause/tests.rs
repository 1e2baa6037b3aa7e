use super::*;
use crate::testutil::{bundle, id};
use fleet_report::Outcome;
use proptest::prelude::*;

fn ev(node: &str, why: &str, checks: &[&str]) -> Evidence {
    Evidence {
        node: node.into(),
        why: why.into(),
        checks: checks.iter().map(|c| c.to_string()).collect(),
    }
}

#[test]
fn nine_of_ten_canaries_share_the_kubelet_s_line() {
    let mut failed: Vec<Evidence> = (0..9)
        .map(|n| {
            ev(
                &format!("n{n}"),
                "health check 20-kubelet failed",
                &[&format!(
                    "I1207 04:0{n}:00 starting\nkubelet: failed to load config\nexit status 1"
                )],
            )
        })
        .collect();
    failed.push(ev("n9", "slot B did not boot: kernel panic", &[]));
    let c = common_line(&failed).unwrap();
    assert_eq!(
        c.to_string(),
        "9 of 10 failed node(s): kubelet: failed to load config",
        "the check's line beats the why held by as many, and the longer \"exit status 1\" \
         line is as common but shorter"
    );
    // The order of the nodes does not matter.
    failed.reverse();
    assert_eq!(common_line(&failed), Some(c));
}

#[test]
fn nothing_is_named_when_the_failures_share_no_line_or_only_a_minority_does() {
    assert_eq!(common_line(&[]), None);
    assert_eq!(
        common_line(&[ev("a", "disk full", &[])]),
        None,
        "one node shares nothing"
    );
    let split = [
        ev("a", "disk full", &[]),
        ev("b", "disk full", &[]),
        ev("c", "kernel panic", &[]),
        ev("d", "oom killed", &[]),
        ev("e", "timeout", &[]),
    ];
    assert_eq!(common_line(&split), None, "2 of 5 is not half");
    let half = &split[..4];
    assert_eq!(
        common_line(half).unwrap().to_string(),
        "2 of 4 failed node(s): disk full"
    );
    // Short lines say nothing; a node counts once however often it repeats a line.
    let noisy = [
        ev("a", "FAIL", &["exit 1\nFAIL"]),
        ev("b", "FAIL", &["exit 1"]),
    ];
    assert_eq!(common_line(&noisy), None);
    let repeated = [
        ev("a", "disk full", &["disk full\ndisk full"]),
        ev("b", "x: other", &[]),
        ev("c", "y: other", &[]),
    ];
    assert_eq!(common_line(&repeated), None, "1 node of 3, however often");
}

#[test]
fn hostile_text_is_escaped_when_shown() {
    let e = [
        ev("a", "\u{1b}[31m<b>x</b>", &[]),
        ev("b", "\u{1b}[31m<b>x</b>", &[]),
    ];
    let c = common_line(&e).unwrap();
    assert_eq!(c.line, "\u{1b}[31m<b>x</b>", "kept as sent");
    assert!(!c.to_string().contains('\u{1b}'), "{c}");
}

fn row(n: u8, seq: u64, outcome: Outcome, received: u64) -> Row {
    Row {
        node: id(n).to_string(),
        site: "site-a".into(),
        seq,
        at: seq,
        received,
        channel: "c".into(),
        version: "v2".into(),
        generation: 2,
        outcome,
        seed: Some(1),
        dropped: 0,
    }
}

#[test]
fn failures_pair_each_failed_node_with_its_newest_bundle_and_name_the_common_line() {
    let failed = |why: &str| Outcome::RolledBack { why: why.into() };
    let rows = vec![
        row(1, 1, failed("health check 20-kubelet failed"), 10),
        row(2, 1, failed("health check 20-kubelet failed"), 11),
        row(
            2,
            2,
            Outcome::Waiting {
                wait_for: fleet_report::WaitFor::Pause,
                until: None,
            },
            12,
        ),
        row(3, 1, Outcome::Blessed, 13),
        row(4, 1, failed("check node-ready timed out"), 14),
    ];
    let why = "kubelet: failed to load config";
    let bundles = vec![
        bundle(1, 1, "old"),
        bundle(1, 2, why),
        bundle(2, 1, why),
        bundle(3, 1, "a blessed node's old bundle"),
    ];
    let f = failures(&rows, &bundles, None);
    assert_eq!(f.len(), 1);
    let v2 = &f[0];
    let nodes: Vec<(String, Option<u32>)> = v2
        .failed
        .iter()
        .map(|f| (f.node.clone(), f.bundle.as_ref().map(|b| b.attempt)))
        .collect();
    let mut want = vec![
        (id(1).to_string(), Some(2)),
        (id(2).to_string(), Some(1)),
        (id(4).to_string(), None),
    ];
    want.sort();
    assert_eq!(
        nodes, want,
        "node 3 blessed: not failed, its bundle not shown"
    );
    assert_eq!(
        v2.common.as_ref().map(ToString::to_string).as_deref(),
        Some("2 of 3 failed node(s): kubelet: failed to load config")
    );
    // Only failures decided after a lift count for the guard.
    let after = failures(&rows, &bundles, Some(13));
    assert_eq!(after[0].failed.len(), 1);
    assert_eq!(after[0].common, None);
}

proptest! {
    /// Whatever the evidence: the named line is held by exactly `nodes` of the `of` failed
    /// nodes, by at least two and half of them, no line is held by more, and the answer does
    /// not depend on the nodes' order.
    #[test]
    fn the_common_line_is_the_most_shared_and_order_free(
        nodes in prop::collection::vec(
            (0u8..6, prop::collection::vec(0usize..5, 0..4), 0usize..5), 0..12),
    ) {
        const LINES: [&str; 5] = ["kubelet: failed to load config", "disk full", "oom",
            "containerd: dial unix", "x509: certificate has expired"];
        let e: Vec<Evidence> = nodes.iter().map(|(n, checks, why)| Evidence {
            node: format!("n{n}"),
            why: LINES[*why].to_string(),
            checks: checks.iter().map(|c| LINES[*c].to_string()).collect(),
        }).collect();
        let holders = |line: &str| e.iter()
            .filter(|x| x.why == line || x.checks.iter().any(|c| c == line))
            .map(|x| x.node.as_str()).collect::<BTreeSet<_>>().len() as u64;
        let of = e.iter().map(|x| x.node.as_str()).collect::<BTreeSet<_>>().len() as u64;
        let got = common_line(&e);
        let mut rev = e.clone();
        rev.reverse();
        prop_assert_eq!(&common_line(&rev), &got);
        let best = LINES.iter().filter(|l| l.len() >= MIN_LINE_CHARS).map(|l| holders(l)).max().unwrap_or(0);
        match got {
            Some(c) => {
                prop_assert_eq!(c.of, of);
                prop_assert_eq!(holders(&c.line), c.nodes);
                prop_assert_eq!(c.nodes, best);
                prop_assert!(c.nodes >= 2 && c.nodes * 2 >= of);
            }
            None => prop_assert!(best < 2 || best * 2 < of),
        }
    }
}

#[test]
fn only_the_newest_bundle_of_each_failed_node_is_shown() {
    let failed = Outcome::RolledBack { why: "x".into() };
    let rows = vec![
        row(1, 1, failed.clone(), 10),
        row(2, 1, Outcome::Blessed, 11),
    ];
    let b = |n: u8, attempt: u32, version: &str| crate::BundleRow {
        node: id(n).to_string(),
        site: "site-a".into(),
        version: version.into(),
        generation: 2,
        attempt,
        slot: "B".into(),
        time: String::new(),
        failure: fleet_report::Failure::HealthCheck,
        why: String::new(),
        received: 0,
        size: 0,
    };
    let all = vec![
        b(1, 1, "v2"),
        b(1, 3, "v2"),
        b(1, 2, "v2"),
        b(1, 9, "v3"),
        b(2, 1, "v2"),
    ];
    let shown: Vec<(u32, &str)> = shown(&rows, &all)
        .into_iter()
        .map(|r| (r.attempt, r.version.as_str()))
        .collect();
    assert_eq!(
        shown,
        vec![(3, "v2")],
        "node 2 blessed; node 1 never reported on v3"
    );
}
