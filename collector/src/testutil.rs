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
        v: fleet_report::FORMAT,
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
