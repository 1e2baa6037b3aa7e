use super::*;
use fleet_report::Transfer;
use proptest::prelude::*;

fn row(seq: u64, outcome: Outcome) -> Row {
    Row {
        node: "n".into(),
        site: "site-n".into(),
        seq,
        at: seq,
        received: 1000 + seq,
        channel: "c".into(),
        version: "v2".into(),
        generation: 2,
        outcome,
        seed: Some(1),
        dropped: 0,
    }
}

fn staged() -> Outcome {
    Outcome::Staged {
        bytes: 1,
        by: Transfer::Full,
    }
}

fn rolled_back() -> Outcome {
    Outcome::RolledBack {
        why: "check failed".into(),
    }
}

fn paused() -> Outcome {
    Outcome::Waiting {
        wait_for: WaitFor::Pause,
        until: None,
    }
}

fn retry(until: Option<u64>) -> Outcome {
    Outcome::Waiting {
        wait_for: WaitFor::Retry,
        until,
    }
}

/// A node that holds back the release that failed on it says so: the failure still counts,
/// labelled with when the retry is allowed, or that none comes; its retry is a later attempt.
#[test]
fn a_node_waiting_for_a_retry_stays_failed_and_says_until_when() {
    let rows = [
        row(1, staged()),
        row(2, rolled_back()),
        row(3, retry(Some(1_800_003_600))),
    ];
    let o = outcome(&rows).unwrap();
    assert_eq!((o.state, o.decided_by.seq), (NodeState::RolledBack, 2));
    assert_eq!(o.then_waiting, Some(WaitFor::Retry));
    assert_eq!(
        o.label(),
        "rolled back, waiting (retry after 2027-01-15T09:00:00Z)"
    );
    let held = [row(1, rolled_back()), row(2, retry(None))];
    assert_eq!(outcome(&held).unwrap().label(), "rolled back, not retried");
    let mut again = rows.to_vec();
    again.push(row(4, staged()));
    let o = outcome(&again).unwrap();
    assert_eq!((o.state, o.then_waiting), (NodeState::Staged, None));
}

#[test]
fn a_halted_canary_stays_rolled_back_while_it_waits_until_it_tries_again() {
    // The canary: staged, trial boot, rolled back, then the halt makes it wait.
    let rows = [
        row(1, staged()),
        row(2, Outcome::TrialBoot),
        row(3, rolled_back()),
        row(4, paused()),
    ];
    let o = outcome(&rows).unwrap();
    assert_eq!(o.state, NodeState::RolledBack);
    assert_eq!(o.decided_by.seq, 3, "the failure's report, with its reason");
    assert_eq!(o.then_waiting, Some(WaitFor::Pause));
    assert_eq!(o.newest.seq, 4);
    assert_eq!(o.label(), "rolled back, waiting (paused)");
    assert!(o.done());
    // The halt lifted, it stages again: a later attempt, the failure no longer counts.
    let mut again = rows.to_vec();
    again.push(row(5, staged()));
    let o = outcome(&again).unwrap();
    assert_eq!((o.state, o.then_waiting), (NodeState::Staged, None));
    assert!(!o.done());
    // And that attempt fails too: the newer failure.
    again.push(row(6, rolled_back()));
    assert_eq!(outcome(&again).unwrap().decided_by.seq, 6);
    // Only waits: waiting, the newest wait deciding.
    let waits = [row(1, paused()), row(2, paused())];
    let o = outcome(&waits).unwrap();
    assert_eq!(
        (o.state, o.decided_by.seq, o.then_waiting),
        (NodeState::Waiting, 2, None)
    );
    assert_eq!(outcome(std::iter::empty()), None);
}

#[test]
fn outcomes_are_per_release_and_node() {
    let mut other = row(1, Outcome::Blessed);
    other.node = "m".into();
    let mut v3 = row(5, staged());
    v3.version = "v3".into();
    v3.generation = 3;
    let rows = vec![row(1, rolled_back()), row(2, paused()), other, v3];
    let all = outcomes(&rows);
    let v2 = &all[&(2, "v2")];
    assert_eq!(v2["n"].label(), "rolled back, waiting (paused)");
    assert_eq!(v2["m"].state, NodeState::Blessed);
    assert_eq!(all[&(3, "v3")]["n"].state, NodeState::Staged);
}

fn any_outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(staged()),
        Just(Outcome::StageFailed { why: "x".into() }),
        Just(paused()),
        Just(Outcome::Waiting {
            wait_for: WaitFor::Wave,
            until: Some(9)
        }),
        Just(retry(Some(5))),
        Just(retry(None)),
        Just(Outcome::TrialBoot),
        Just(Outcome::Blessed),
        Just(rolled_back()),
        Just(Outcome::FellBack { why: "y".into() }),
        Just(Outcome::WithdrawnDropped),
    ]
}

fn history() -> impl Strategy<Value = Vec<Row>> {
    prop::collection::vec(any_outcome(), 1..12).prop_map(|os| {
        os.into_iter()
            .enumerate()
            .map(|(i, o)| row(i as u64 + 1, o))
            .collect()
    })
}

proptest! {
    /// The fold agrees with the rule as the docs state it: the newest report that is not a
    /// wait decides (else the newest wait), and a wait after it shows beside it.
    #[test]
    fn the_fold_is_the_stated_rule(rows in history()) {
        let o = outcome(&rows).unwrap();
        let newest = rows.last().unwrap();
        let decider = rows
            .iter()
            .rev()
            .find(|r| NodeState::of(&r.outcome) != NodeState::Waiting)
            .unwrap_or(newest);
        prop_assert_eq!(o.decided_by.seq, decider.seq);
        prop_assert_eq!(o.state, NodeState::of(&decider.outcome));
        prop_assert_eq!(o.newest.seq, newest.seq);
        let then = match (&newest.outcome, o.state) {
            (Outcome::Waiting { wait_for, .. }, s) if s != NodeState::Waiting => Some(*wait_for),
            _ => None,
        };
        prop_assert_eq!(o.then_waiting, then);
    }

    /// The order the reports come in does not matter, only their numbers.
    #[test]
    fn the_order_of_the_rows_does_not_matter(rows in history(), seed in any::<u64>()) {
        let mut shuffled = rows.clone();
        let n = shuffled.len();
        for i in 0..n {
            shuffled.swap(i, (seed.rotate_left(i as u32) as usize) % n);
        }
        prop_assert_eq!(outcome(&rows), outcome(&shuffled));
    }

    /// A failure stands through any number of waits.
    #[test]
    fn waits_never_clear_a_failure(rows in history(), waits in 0usize..5) {
        let mut rows = rows;
        let next = rows.len() as u64 + 1;
        rows.push(row(next, rolled_back()));
        for i in 0..waits as u64 {
            rows.push(row(next + 1 + i, paused()));
        }
        let o = outcome(&rows).unwrap();
        prop_assert_eq!(o.state, NodeState::RolledBack);
        prop_assert_eq!(o.decided_by.seq, next);
        prop_assert_eq!(o.then_waiting.is_some(), waits > 0);
    }
}
