//! `state.json` across releases. Both slots of a node read and write the one state file, and
//! they may run different releases (a trial of v0.2.0 falls back to a slot running v0.1.0), so:
//! today's reader understands what v0.1.0 wrote (tests/fixtures/v0.1.0/state.json, written by
//! v0.1.0's own code), and today's writer writes nothing v0.1.0 would refuse — every enum value
//! it can write is one v0.1.0 wrote too (v0.1.0 skips unknown fields but refuses unknown enum
//! values). A state file of a newer format is refused naming both formats, nothing rewritten.

use std::collections::BTreeSet;
use std::path::Path;

use libupgrade::state::store::StateStore;
use libupgrade::state::{Event, SlotState, STATE_FILE};
use libupgrade::Slot;

fn v010() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/state.json"))
        .unwrap()
}

/// Every value of the enums the state file holds. The matches have no wildcard: a new variant
/// does not compile here until it is added, and then fails the test below, which is the point
/// (a new variant needs a new state format, rolled out in two releases).
fn every_value() -> (Vec<SlotState>, Vec<Event>) {
    let states = vec![
        SlotState::Empty,
        SlotState::Invalid,
        SlotState::Staged,
        SlotState::Trying,
        SlotState::Good,
        SlotState::Bad,
    ];
    for s in &states {
        match s {
            SlotState::Empty
            | SlotState::Invalid
            | SlotState::Staged
            | SlotState::Trying
            | SlotState::Good
            | SlotState::Bad => {}
        }
    }
    let events = vec![
        Event::Bootstrap,
        Event::StageStarted,
        Event::Staged,
        Event::StageFailed,
        Event::Activated,
        Event::Confirmed,
        Event::HealthFailed,
        Event::FallbackTaken,
        Event::ActivationLost,
        Event::RolledBack,
        Event::MarkedBad,
        Event::Booted,
    ];
    for e in &events {
        match e {
            Event::Bootstrap
            | Event::StageStarted
            | Event::Staged
            | Event::StageFailed
            | Event::Activated
            | Event::Confirmed
            | Event::HealthFailed
            | Event::FallbackTaken
            | Event::ActivationLost
            | Event::RolledBack
            | Event::MarkedBad
            | Event::Booted => {}
        }
    }
    (states, events)
}

fn json_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_v010_state_file_is_read_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(STATE_FILE), v010()).unwrap();
    let store = StateStore::new(dir.path());
    let st = store.load().expect("v0.1.0's state file reads");
    assert_eq!(st.slot(Slot::A).state, SlotState::Good);
    assert_eq!(st.slot(Slot::B).version.as_deref(), Some("v2"));
    assert_eq!(st.slot(Slot::B).generation, Some(2));
    assert_eq!(st.history.len(), 16);
    assert_eq!(st.activation.as_ref().unwrap().slot, Slot::B);
    assert!(st.activation.as_ref().unwrap().awaits.is_none());
    // Written back by today's code and read again: nothing lost.
    store.save(&st, "test").unwrap();
    assert_eq!(store.load().unwrap(), st);
}

#[test]
fn todays_state_values_are_all_known_to_v010() {
    // Every enum value v0.1.0 writes, serialized by v0.1.0's own code (see fixtures/make.sh).
    let enums: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/state-enums.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let known: BTreeSet<String> = ["slot_states", "events"]
        .iter()
        .flat_map(|k| enums[k].as_array().unwrap().clone())
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let (states, events) = every_value();
    for name in states
        .iter()
        .map(json_name)
        .chain(events.iter().map(json_name))
    {
        assert!(
            known.contains(&name),
            "state.json value {name:?} is unknown to v0.1.0, which would refuse the whole file after a fallback to its slot"
        );
    }
}

#[test]
fn a_newer_state_format_is_refused_and_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let newer = String::from_utf8(v010())
        .unwrap()
        .replacen("\"format\": 1", "\"format\": 2", 1)
        .replace("\"slots\"", "\"slots_v2\"");
    let p = dir.path().join(STATE_FILE);
    std::fs::write(&p, &newer).unwrap();
    let e = StateStore::new(dir.path()).load().unwrap_err().to_string();
    assert!(
        e.contains("format 2 is newer") && e.contains("(format 1)") && e.contains("state.json"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&p).unwrap(), newer);
}

/// A node that rolled back from v2 under v0.1.0 (its slot B bad, the newest decision about it a
/// rollback): v0.1.0 kept no record of failed releases, and a v0.1.0 slot drops the field when
/// it rewrites the file after a fallback. Today's load rebuilds the record from the bad slot
/// (one attempt, the decision's time and reason), the next save keeps it, and a failure
/// recorded later counts on from it.
#[test]
fn a_v010_node_that_rolled_back_remembers_the_failed_release() {
    let mut v: serde_json::Value = serde_json::from_slice(&v010()).unwrap();
    v["slots"]["B"]["state"] = "bad".into();
    v["history"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "at": 1796300000u64, "slot": "B", "event": "rolled-back", "version": "v2",
            "generation": 2, "why": "50-app: app is down"
        }));
    assert!(v.get("failed").is_none(), "v0.1.0 has no such field");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(STATE_FILE), serde_json::to_vec(&v).unwrap()).unwrap();
    let store = StateStore::new(dir.path());
    let mut st = store.load().expect("v0.1.0's state file reads");
    let f = st
        .failed_for("v2", Some(2))
        .expect("the bad slot's release is remembered");
    assert_eq!(
        (f.attempts, f.at, f.why.as_str()),
        (1, 1796300000, "50-app: app is down")
    );
    assert!(
        st.failed_for("v2", Some(3)).is_none(),
        "another generation is another release"
    );
    store.save(&st, "test").unwrap();
    let text = std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    assert!(text.contains("\"failed\""), "{text}");
    assert_eq!(store.load().unwrap(), st, "the migration is applied once");
    // The next stage overwrites slot B; the record stays. A second failed trial counts on.
    st.transition(Slot::B, Event::StageStarted, "stage v2 again")
        .unwrap();
    st.transition(Slot::B, Event::Staged, "staged").unwrap();
    st.transition(Slot::B, Event::Activated, "trial").unwrap();
    st.transition(Slot::B, Event::HealthFailed, "50-app: still down")
        .unwrap();
    st.transition(Slot::B, Event::RolledBack, "back to A")
        .unwrap();
    let f = st.failed_for("v2", Some(2)).unwrap();
    assert_eq!(
        (f.attempts, f.why.as_str()),
        (2, "50-app: still down"),
        "one attempt, once"
    );
    // v0.1.0 reads today's file: it only skips the new field (no enum value is new).
    store.save(&st, "test").unwrap();
    let back: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(STATE_FILE)).unwrap()).unwrap();
    assert_eq!(back["failed"][0]["attempts"], 2);
    // A blessed run of the release clears its record.
    st.transition(Slot::B, Event::Confirmed, "good at last")
        .unwrap();
    assert!(st.failed.is_empty(), "{:?}", st.failed);
}
