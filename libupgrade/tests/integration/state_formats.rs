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
