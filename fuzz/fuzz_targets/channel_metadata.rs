//! The node's TUF client workflow, `libupgrade::trust::update` (what `upgrade --channel` and the
//! agent run on a channel's metadata), and the envelope parser `trust::meta::Envelope::parse`, over
//! files a hostile server controls.
//!
//! Input: `2.root.json SEP timestamp.json SEP snapshot.json SEP targets.json`. An empty part
//! is the fixture channel's own file (signed by fixed keys, so the fuzzer starts on the
//! accepting path), except `2.root.json`, which is then missing (the chain ends at root 1).
//! The node trusts the fixture's root version 1.
//!
//! The fuzzed snapshot and targets are also given as the node's kept files
//! ([`libupgrade::trust::kept::Kept`]) against the genuine channel.
//!
//! Asserts: every envelope that parses re-serializes to one that parses equal; an accepted
//! update never leaves root version 1 (only root 1's key could sign root 2, and the fuzzer
//! has no key) and its targets are exactly the fixture's (the only targets body any key
//! signed), with the record's versions those of the fixture's files; whatever is kept, the
//! genuine channel is accepted with its own targets, and a kept file is used only when it is
//! the genuine file; nothing panics.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ed25519_dalek::SigningKey;
use k3os_fuzz::split_files;
use libfuzzer_sys::fuzz_target;
use libupgrade::trust::meta::{sha256_hex, Envelope, Targets, SPEC_VERSION};
use libupgrade::trust::publish;
use libupgrade::trust::publish::RoleSpec;
use libupgrade::trust::client::ExpiryRule;
use libupgrade::trust::meta::Role;
use libupgrade::trust::{update, MetaSource, Record, TrustError};
use serde_json::json;

struct Fixture {
    record: Record,
    clock: ExpiryRule,
    /// timestamp.json, snapshot.json, targets.json as published.
    files: [Vec<u8>; 3],
    targets: Targets,
}

const FAR: &str = "2100-01-01T00:00:00Z";

fn meta_ref(version: u64, bytes: &[u8]) -> serde_json::Value {
    json!({"version": version, "length": bytes.len(), "hashes": {"sha256": sha256_hex(bytes)}})
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let keys: Vec<SigningKey> = (1..=4u8)
            .map(|i| SigningKey::from_bytes(&[i; 32]))
            .collect();
        let roles: BTreeMap<Role, RoleSpec> =
            [Role::Root, Role::Targets, Role::Snapshot, Role::Timestamp]
                .into_iter()
                .zip(&keys)
                .map(|(r, k)| {
                    (
                        r,
                        RoleSpec {
                            keys: vec![k.verifying_key()],
                            threshold: 1,
                        },
                    )
                })
                .collect();
        let dir = tempfile::tempdir().unwrap();
        publish::init_root(dir.path(), &roles, &keys[..1], FAR.parse().unwrap()).unwrap();
        let root = std::fs::read(dir.path().join("root.json")).unwrap();
        let record = Record::from_root(&root, "fixture root").unwrap();
        let manifest = b"{\"fuzz\":\"manifest\"}";
        let targets = json!({
            "_type": "targets", "spec_version": SPEC_VERSION, "version": 3, "expires": FAR,
            "targets": {"v2/manifest.json": {
                "length": manifest.len(), "hashes": {"sha256": sha256_hex(manifest)},
                "custom": {"version": "v2", "generation": 2, "arch": "x86_64"}}}
        });
        let tg = Envelope::sign(&targets, &keys[1..2]).to_bytes();
        let snapshot = json!({
            "_type": "snapshot", "spec_version": SPEC_VERSION, "version": 5, "expires": FAR,
            "meta": {"targets.json": meta_ref(3, &tg)}
        });
        let sn = Envelope::sign(&snapshot, &keys[2..3]).to_bytes();
        let timestamp = json!({
            "_type": "timestamp", "spec_version": SPEC_VERSION, "version": 7, "expires": FAR,
            "meta": {"snapshot.json": meta_ref(5, &sn)}
        });
        let ts = Envelope::sign(&timestamp, &keys[3..4]).to_bytes();
        Fixture {
            record,
            clock: ExpiryRule {
                now: "2026-12-03T00:00:00Z".parse().unwrap(),
                ignore_expiry: false,
            },
            files: [ts, sn, tg],
            targets: serde_json::from_value(targets).unwrap(),
        }
    })
}

/// The channel as the input describes it.
struct Files<'a>(BTreeMap<&'static str, &'a [u8]>);

impl MetaSource for Files<'_> {
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
        match self.0.get(name) {
            Some(b) if b.len() as u64 > max => Err(TrustError::TooLarge {
                what: name.into(),
                max,
            }),
            Some(b) => Ok(Some(b.to_vec())),
            None => Ok(None),
        }
    }
    fn location(&self, name: &str) -> String {
        format!("fuzz/{name}")
    }
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let parts = split_files(data, 4);
    for p in parts.iter().flatten() {
        if let Ok(env) = Envelope::parse(p, "fuzz") {
            let again =
                Envelope::parse(&env.to_bytes(), "fuzz").expect("a parsed envelope re-parses");
            assert_eq!(again, env);
        }
    }
    let mut files = BTreeMap::new();
    if let Some(r2) = parts[0] {
        files.insert("2.root.json", r2);
    }
    for (i, name) in ["timestamp.json", "snapshot.json", "targets.json"]
        .into_iter()
        .enumerate()
    {
        files.insert(name, parts[i + 1].unwrap_or(&f.files[i]));
    }
    // The fuzzed snapshot and targets as the node's kept files, against the genuine channel:
    // whatever is kept, the update is the genuine one (a kept file is re-checked, never
    // trusted), and a kept file is used only when it is byte for byte the genuine one.
    let genuine = BTreeMap::from([
        ("timestamp.json", &f.files[0][..]),
        ("snapshot.json", &f.files[1][..]),
        ("targets.json", &f.files[2][..]),
    ]);
    let kept = BTreeMap::from_iter(
        [("snapshot.json", parts[2]), ("targets.json", parts[3])]
            .into_iter()
            .filter_map(|(n, p)| p.map(|p| (n, p))),
    );
    let v = update(&Files(genuine), Some(&Files(kept)), &f.record, &f.clock)
        .expect("the genuine channel is accepted whatever the node kept");
    assert_eq!(v.targets, f.targets, "a kept file changed the targets");
    assert!(!v.snapshot.kept || v.snapshot.bytes == f.files[1]);
    assert!(!v.targets_file.kept || v.targets_file.bytes == f.files[2]);
    if let Ok(v) = update(&Files(files), None, &f.record, &f.clock) {
        assert_eq!(v.record.root_version(), 1, "walked to a root no key signed");
        assert_eq!(v.targets, f.targets, "accepted targets no key signed");
        assert_eq!(
            (v.record.timestamp, v.record.snapshot, v.record.targets),
            (7, 5, 3)
        );
    }
});
