//! `fleet_report::parse`, what the collector runs on every request body from whoever can reach
//! it, and `AllowList::parse` on the same bytes as text.
//!
//! Asserts: an accepted report is at most 1 KiB, is the fixture node's (the fuzzer holds no
//! other key the seeds were signed with) and is byte for byte what `Report::sign` writes for
//! the fields it holds (ed25519 signatures are deterministic), so nothing but the one canonical
//! signed form of a report is ever accepted; an allow-list that parses has no more entries
//! than lines and binds each node to one valid site.
#![no_main]

use ed25519_dalek::SigningKey;
use fleet_report::{parse, AllowList, NodeId, MAX_REPORT_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = parse(data) {
        assert!(data.len() <= MAX_REPORT_BYTES);
        let key = SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
        assert_eq!(v.report.node, NodeId::of(&key.verifying_key()));
        assert_eq!(v.report.sign(&key).expect("an accepted report signs"), data);
        assert_eq!(v.bytes, data);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(list) = AllowList::parse(text) {
            assert!(list.len() <= text.lines().count());
        }
    }
});
