//! Test fixtures: node keys, signed reports, an allow-list.

use ed25519_dalek::SigningKey;
use fleet_report::{AllowList, NodeId, Outcome, Report, Verified};

/// Node `n`'s key.
pub fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

/// Node `n`'s id.
pub fn id(n: u8) -> NodeId {
    NodeId::of(&key(n).verifying_key())
}

/// A report by node `n` for `site`, number `seq`.
pub fn report(n: u8, site: &str, seq: u64, outcome: Outcome) -> Report {
    Report {
        v: outcome.format(),
        node: id(n),
        site: site.into(),
        seq,
        at: seq.wrapping_add(1_800_000_000),
        channel: "http://127.0.0.1:1/stable".into(),
        version: "v2".into(),
        generation: 2,
        outcome,
        seed: Some(u32::from(n) * 1000),
        dropped: 0,
    }
}

/// The envelope of `report(n, site, seq, outcome)` signed by node `n`.
pub fn signed(n: u8, site: &str, seq: u64, outcome: Outcome) -> Vec<u8> {
    report(n, site, seq, outcome).sign(&key(n)).unwrap()
}

/// The verified form of [`signed`].
pub fn verified(n: u8, site: &str, seq: u64, outcome: Outcome) -> Verified {
    fleet_report::parse(&signed(n, site, seq, outcome)).unwrap()
}

/// Nodes 1 and 2 at site-a, node 3 at site-b.
pub fn allow() -> AllowList {
    AllowList::parse(&format!(
        "{} site-a\n{} site-a\n{} site-b\n",
        id(1),
        id(2),
        id(3)
    ))
    .unwrap()
}

/// A failure bundle of node `n`'s attempt `attempt` of v2, failed with `why`, with a health
/// check's output that says the same and a kernel log tail.
pub fn bundle(n: u8, attempt: u32, why: &str) -> fleet_report::Bundle {
    fleet_report::Bundle {
        format: fleet_report::BUNDLE_FORMAT,
        node: id(n),
        version: "v2".into(),
        generation: 2,
        attempt,
        slot: "B".into(),
        time: "2027-01-15T08:00:00Z".into(),
        failure: fleet_report::Failure::HealthCheck,
        why: why.into(),
        versions: "k3os-ops=0.2.0\nkernel=6.1.0-57-amd64\n".into(),
        redacted: 1,
        sections: vec![
            fleet_report::Section {
                name: "health/20-kubelet".into(),
                text: format!("{why}\n"),
                cut_bytes: 0,
            },
            fleet_report::Section {
                name: "log/kernel".into(),
                text: "[    1.000000] systemd[1]: Started kubelet.\n".into(),
                cut_bytes: 0,
            },
        ],
    }
}

/// [`bundle`] sealed by node `n`.
pub fn sealed(n: u8, attempt: u32, why: &str) -> Vec<u8> {
    bundle(n, attempt, why).seal(&key(n)).unwrap()
}

/// [`sealed`], opened.
pub fn opened(n: u8, attempt: u32, why: &str) -> fleet_report::Opened {
    fleet_report::open_bundle(&sealed(n, attempt, why)).unwrap()
}
