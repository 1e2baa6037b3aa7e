use super::*;
use fleet_report::{Outcome, Transfer, WaitFor};

fn row(node: &str, seq: u64, received: u64, outcome: Outcome) -> Row {
    Row {
        node: node.into(),
        site: format!("site-{node}"),
        seq,
        at: received,
        received,
        channel: "c".into(),
        version: "v2".into(),
        generation: 2,
        outcome,
        seed: None,
        dropped: 0,
    }
}

#[test]
fn the_lines_replay_each_node_s_outcome_and_end_where_the_tables_stand() {
    let staged = Outcome::Staged {
        bytes: 1,
        by: Transfer::Full,
    };
    let rows = [
        row("a", 1, 100, staged.clone()),
        row("a", 2, 110, Outcome::RolledBack { why: "x".into() }),
        row(
            "a",
            3,
            120,
            Outcome::Waiting {
                wait_for: WaitFor::Pause,
                until: None,
            },
        ),
        row("b", 1, 105, staged),
        row("b", 2, 130, Outcome::Blessed),
    ];
    let refs: Vec<&Row> = rows.iter().collect();
    let s = series(&refs);
    assert_eq!(s["offered"], vec![(100, 1), (105, 2)]);
    assert_eq!(s["staged"], vec![(100, 1), (105, 2)]);
    assert_eq!(s["failed"], vec![(110, 1)], "the wait does not clear it");
    assert_eq!(s["blessed"], vec![(130, 1)]);
}

#[test]
fn axes_are_round_and_labelled_with_dates() {
    assert_eq!(share_top(0.0), 0.1);
    assert_eq!(share_top(1.0), 1.0);
    assert_eq!(share_top(1.2), 2.0);
    assert_eq!(share_top(37.0), 50.0);
    assert_eq!(share_top(99.0), 100.0);
    assert_eq!(time_step(3600), 600);
    assert_eq!(time_step(3 * 86_400), 43_200);
    assert_eq!(percent(0.5), "0.5 %");
    assert_eq!(percent(20.0), "20 %");
    let mut lines: Steps = LINES[1..].iter().map(|l| (l.0, Vec::new())).collect();
    lines.insert("failed", vec![(1_800_000_000, 1)]);
    let marks = [Mark {
        at: 1_800_001_800,
        kind: "halt",
        label: "halted <by> the guard".into(),
    }];
    let planned = |t: u64| (t >= 1_800_000_000).then_some(0.01);
    let svg = chart("v2", &lines, &planned, 100, &marks, 1_800_003_600);
    // 08:00 to 09:00 UTC on 2027-01-15, ticks every 10 minutes; the date under the first.
    assert!(svg.contains(">08:00<tspan"), "{svg}");
    assert!(svg.contains(">2027-01-15</tspan>"), "{svg}");
    assert!(svg.contains(">08:50<tspan"), "{svg}");
    assert!(svg.contains("time (UTC)") && svg.contains("share of 100 enrolled node(s)"));
    assert!(
        svg.contains(">1 %</text>") && svg.contains(">0.2 %</text>"),
        "{svg}"
    );
    assert!(svg.contains("<title>halted &lt;by&gt; the guard at 2027-01-15T08:30:00Z</title>"));
    for k in ["planned", "offered", "staged", "blessed", "failed"] {
        assert!(svg.contains(&format!("<li class=\"{k}\"")), "{k}: {svg}");
    }
    assert!(
        svg.contains("<li class=\"failed\" data-count=\"1\""),
        "{svg}"
    );
    assert!(
        svg.contains("<li class=\"planned\" data-count=\"1\""),
        "{svg}"
    );
    assert!(!svg.contains("<script"));
}
