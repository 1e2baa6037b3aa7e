//! The client workflow's rules, each test naming the TUF 1.0 section it checks. Metadata is
//! built in memory with [`Envelope::sign`] and served by a map (no files, no network).

use std::cell::RefCell;
use std::collections::BTreeMap;

use chrono::{Duration, SubsecRound, Utc};
use ed25519_dalek::SigningKey;

use super::super::meta::{self, Envelope, Key, MetaRef, Role, RoleKeys, Root, Targets, Versions};
use super::super::{Record, TrustError};
use super::{update, ExpiryRule, MetaSource, Verified};

/// A channel in memory: file name → bytes, and the names fetched (found or not), in order.
#[derive(Default)]
struct Files(RefCell<BTreeMap<String, Vec<u8>>>, RefCell<Vec<String>>);

impl MetaSource for Files {
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
        self.1.borrow_mut().push(name.to_string());
        let b = self.0.borrow().get(name).cloned();
        match b {
            Some(b) if b.len() as u64 > max => Err(TrustError::TooLarge {
                what: name.to_string(),
                max,
            }),
            b => Ok(b),
        }
    }
    fn location(&self, name: &str) -> String {
        format!("mem/{name}")
    }
}

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// A publisher: the keys of each role (by seed) and the versions it publishes next.
struct Repo {
    files: Files,
    root_version: u64,
    root_key: u8,
    role_keys: BTreeMap<Role, u8>,
}

impl Repo {
    /// Root 1 (root key 1, targets 2, snapshot 3, timestamp 4), targets/snapshot/timestamp at
    /// `v`.
    fn new(v: u64) -> Repo {
        let r = Repo {
            files: Files::default(),
            root_version: 0,
            root_key: 1,
            role_keys: BTreeMap::from([
                (Role::Root, 1),
                (Role::Targets, 2),
                (Role::Snapshot, 3),
                (Role::Timestamp, 4),
            ]),
        };
        r.publish_root(&r.role_keys.clone(), 1);
        let mut r = r;
        r.root_version = 1;
        r.publish(v, v, v);
        r
    }

    fn publish_root(&self, roles: &BTreeMap<Role, u8>, version: u64) {
        let mut keys = BTreeMap::new();
        let mut role_map = BTreeMap::new();
        for (role, seed) in roles {
            let k = Key::ed25519(&key(*seed).verifying_key());
            role_map.insert(
                *role,
                RoleKeys {
                    keyids: vec![k.id()],
                    threshold: 1,
                },
            );
            keys.insert(k.id(), k);
        }
        let root = Root {
            type_: "root".into(),
            spec_version: meta::SPEC_VERSION.into(),
            consistent_snapshot: false,
            version,
            expires: (Utc::now() + Duration::days(365)).trunc_subsecs(0),
            keys,
            roles: role_map,
        };
        // Signed by the previous root key and the new one.
        let mut signers = vec![key(self.root_key)];
        if roles[&Role::Root] != self.root_key {
            signers.push(key(roles[&Role::Root]));
        }
        let bytes = Envelope::sign(&root, &signers).to_bytes();
        let mut f = self.files.0.borrow_mut();
        f.insert(format!("{version}.root.json"), bytes.clone());
        f.insert("root.json".into(), bytes);
    }

    /// Root N+1 with `role`'s key replaced by the key of `seed`.
    fn rotate(&mut self, role: Role, seed: u8) {
        let mut roles = self.role_keys.clone();
        roles.insert(role, seed);
        self.publish_root(&roles, self.root_version + 1);
        self.root_version += 1;
        self.role_keys = roles;
        if role == Role::Root {
            self.root_key = seed;
        }
    }

    fn expires() -> chrono::DateTime<Utc> {
        (Utc::now() + Duration::days(7)).trunc_subsecs(0)
    }

    fn sign_as<T: serde::Serialize>(&self, role: Role, body: &T) -> Vec<u8> {
        Envelope::sign(body, &[key(self.role_keys[&role])]).to_bytes()
    }

    fn put(&self, name: &str, bytes: Vec<u8>) {
        self.files.0.borrow_mut().insert(name.into(), bytes);
    }

    fn get(&self, name: &str) -> Vec<u8> {
        self.files.0.borrow()[name].clone()
    }

    fn targets_bytes(&self, v: u64) -> Vec<u8> {
        self.sign_as(
            Role::Targets,
            &Targets {
                type_: "targets".into(),
                spec_version: meta::SPEC_VERSION.into(),
                version: v,
                expires: Self::expires(),
                targets: BTreeMap::new(),
                delegations: None,
            },
        )
    }

    fn versions_bytes(&self, role: Role, v: u64, file: &str, r: MetaRef) -> Vec<u8> {
        self.sign_as(
            role,
            &Versions {
                type_: role.as_str().into(),
                spec_version: meta::SPEC_VERSION.into(),
                version: v,
                expires: Self::expires(),
                meta: BTreeMap::from([(file.to_string(), r)]),
            },
        )
    }

    /// A `meta` entry for `bytes` at version `v` listing the hashes `algs`.
    fn meta_ref(v: u64, bytes: &[u8], algs: &[&str]) -> MetaRef {
        MetaRef {
            version: v,
            length: Some(bytes.len() as u64),
            hashes: Some(
                algs.iter()
                    .map(|a| (a.to_string(), meta::digest_hex(a, bytes).unwrap()))
                    .collect(),
            ),
        }
    }

    /// Publish targets `tv`, snapshot `sv` (naming targets `tv`), timestamp `ts` (naming
    /// snapshot `sv`), each reference listing sha256.
    fn publish(&self, tv: u64, sv: u64, ts: u64) {
        self.put("targets.json", self.targets_bytes(tv));
        self.pin(Role::Snapshot, sv, tv);
        self.pin(Role::Timestamp, ts, sv);
    }

    /// Sign `role` (snapshot or timestamp) version `v` over the current file it names
    /// (targets.json, snapshot.json), which is at version `named`, listing its sha256; every
    /// other file stays byte for byte as it is (what the channel's cron job re-signs).
    fn pin(&self, role: Role, v: u64, named: u64) {
        let file = match role {
            Role::Snapshot => "targets.json",
            _ => "snapshot.json",
        };
        let bytes = self.versions_bytes(
            role,
            v,
            file,
            Self::meta_ref(named, &self.get(file), &["sha256"]),
        );
        self.put(role.file(), bytes);
    }

    /// A node's starting record: this channel's root version 1.
    fn node(&self) -> Record {
        Record::from_root(&self.get("1.root.json"), "1.root.json").unwrap()
    }

    fn update(&self, rec: &Record) -> Result<Record, TrustError> {
        let clock = ExpiryRule {
            now: Utc::now(),
            ignore_expiry: false,
        };
        update(&self.files, None, rec, &clock).map(|v| v.record)
    }

    /// An update that may use `kept`, with the names it downloaded from the channel.
    fn update_kept(
        &self,
        rec: &Record,
        kept: &Files,
    ) -> (Result<Verified, TrustError>, Vec<String>) {
        let clock = ExpiryRule {
            now: Utc::now(),
            ignore_expiry: false,
        };
        self.files.1.borrow_mut().clear();
        let r = update(&self.files, Some(kept), rec, &clock);
        (r, self.files.1.take())
    }
}

/// The timestamp lists `algs` for the current snapshot; then the snapshot is replaced by
/// another of the same version and length (its expiry moved by one second), re-signed with the
/// snapshot key, as an attacker holding that key would.
fn substitute_snapshot(r: &Repo, algs: &[&str]) {
    let sn = r.get("snapshot.json");
    let env = Envelope::parse(&sn, "snapshot.json").unwrap();
    let body: Versions = env.body(Role::Snapshot, "snapshot.json").unwrap();
    let mut forged = body.clone();
    forged.expires += Duration::seconds(1);
    let forged = r.sign_as(Role::Snapshot, &forged);
    assert_eq!(forged.len(), sn.len(), "the substitute keeps the length");
    assert_ne!(forged, sn);
    let ts = r.versions_bytes(
        Role::Timestamp,
        body.version,
        "snapshot.json",
        Repo::meta_ref(body.version, &sn, algs),
    );
    r.put("timestamp.json", ts);
    r.put("snapshot.json", forged);
}

#[test]
fn spec_5_5_2_a_sha512_only_reference_refuses_a_substituted_snapshot() {
    let r = Repo::new(1);
    substitute_snapshot(&r, &["sha512"]);
    let e = r.update(&r.node()).unwrap_err();
    assert!(matches!(e, TrustError::Mismatch { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("mem/snapshot.json") && m.contains("sha512"),
        "{m}"
    );
    assert!(m.contains("as timestamp.json lists"), "{m}");
}

#[test]
fn spec_5_5_2_both_hashes_listed_and_one_wrong_is_refused() {
    let r = Repo::new(1);
    // sha256 of the real snapshot, sha512 of the real one too, but the sha256 is then spoilt.
    let sn = r.get("snapshot.json");
    let mut mr = Repo::meta_ref(1, &sn, &["sha256", "sha512"]);
    mr.hashes
        .as_mut()
        .unwrap()
        .insert("sha256".into(), meta::sha256_hex(b"another file"));
    r.put(
        "timestamp.json",
        r.versions_bytes(Role::Timestamp, 1, "snapshot.json", mr),
    );
    let e = r.update(&r.node()).unwrap_err();
    assert!(matches!(e, TrustError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("sha256"), "{e}");
    // And both right: accepted.
    let r = Repo::new(1);
    let sn = r.get("snapshot.json");
    r.put(
        "timestamp.json",
        r.versions_bytes(
            Role::Timestamp,
            1,
            "snapshot.json",
            Repo::meta_ref(1, &sn, &["sha256", "sha512"]),
        ),
    );
    r.update(&r.node()).unwrap();
}

#[test]
fn spec_5_5_2_an_unknown_hash_algorithm_is_refused_not_passed() {
    let r = Repo::new(1);
    let tg = r.get("targets.json");
    let mut mr = Repo::meta_ref(1, &tg, &["sha256"]);
    mr.hashes
        .as_mut()
        .unwrap()
        .insert("blake9\n".into(), "00".into());
    let sn = r.versions_bytes(Role::Snapshot, 1, "targets.json", mr);
    r.put(
        "timestamp.json",
        r.versions_bytes(
            Role::Timestamp,
            1,
            "snapshot.json",
            Repo::meta_ref(1, &sn, &["sha256"]),
        ),
    );
    r.put("snapshot.json", sn);
    let e = r.update(&r.node()).unwrap_err();
    assert!(
        matches!(
            e,
            TrustError::UnknownHash {
                role: Role::Targets,
                ..
            }
        ),
        "{e}"
    );
    let m = e.to_string();
    assert!(
        m.contains("mem/targets.json") && m.contains("snapshot.json") && m.contains("targets file"),
        "{m}"
    );
    assert!(
        m.contains("'blake9\\n'"),
        "the algorithm is named, escaped: {m}"
    );
}

#[test]
fn spec_5_5_2_an_empty_hashes_object_is_refused() {
    let r = Repo::new(1);
    let sn = r.get("snapshot.json");
    let mut mr = Repo::meta_ref(1, &sn, &["sha256"]);
    mr.hashes = Some(BTreeMap::new());
    r.put(
        "timestamp.json",
        r.versions_bytes(Role::Timestamp, 1, "snapshot.json", mr),
    );
    let e = r.update(&r.node()).unwrap_err();
    assert!(e.to_string().contains("empty hashes"), "{e}");
}

#[test]
fn spec_5_5_5_the_trusted_snapshot_bounds_targets_across_a_targets_key_rotation() {
    let mut r = Repo::new(5);
    let rec = r.update(&r.node()).unwrap();
    assert_eq!((rec.timestamp, rec.snapshot, rec.targets), (5, 5, 5));
    r.rotate(Role::Targets, 12);
    r.publish(3, 6, 6);
    let e = r.update(&rec).unwrap_err();
    assert!(
        matches!(
            e,
            TrustError::Rollback {
                role: Role::Targets,
                seen: 5,
                found: 3,
                ..
            }
        ),
        "{e}"
    );
    // A root-key rotation does not reset it either.
    r.rotate(Role::Root, 11);
    assert!(r.update(&rec).is_err());
    r.publish(5, 7, 7);
    let rec = r.update(&rec).unwrap();
    assert_eq!((rec.timestamp, rec.snapshot, rec.targets), (7, 7, 5));
}

#[test]
fn spec_5_3_11_rotating_the_snapshot_key_recovers_from_a_fast_forwarded_targets_version() {
    let mut r = Repo::new(5);
    // The targets version was fast-forwarded to 1000 and the node trusted it.
    r.publish(1000, 6, 6);
    let rec = r.update(&r.node()).unwrap();
    assert_eq!(rec.targets, 1000);
    // The repository goes back to targets 6; the snapshot key is rotated (5.3.11).
    r.publish(6, 7, 7);
    assert!(matches!(
        r.update(&rec).unwrap_err(),
        TrustError::Rollback {
            role: Role::Targets,
            ..
        }
    ));
    r.rotate(Role::Snapshot, 13);
    r.publish(6, 1, 7);
    let rec = r.update(&rec).unwrap();
    assert_eq!((rec.timestamp, rec.snapshot, rec.targets), (7, 1, 6));
}

#[test]
fn spec_5_3_11_rotating_the_timestamp_key_resets_timestamp_and_snapshot_only() {
    let mut r = Repo::new(5);
    let rec = r.update(&r.node()).unwrap();
    r.rotate(Role::Timestamp, 14);
    // Lower timestamp and snapshot versions are taken after the rotation...
    r.publish(5, 2, 2);
    let rec2 = r.update(&rec).unwrap();
    assert_eq!((rec2.timestamp, rec2.snapshot, rec2.targets), (2, 2, 5));
    // ...but not a lower targets version: the snapshot key did not change.
    r.publish(4, 3, 3);
    assert!(matches!(
        r.update(&rec).unwrap_err(),
        TrustError::Rollback {
            role: Role::Targets,
            seen: 5,
            found: 4,
            ..
        }
    ));
}

#[test]
fn spec_5_4_and_5_5_versions_never_go_back_without_a_rotation() {
    let r = Repo::new(5);
    let rec = r.update(&r.node()).unwrap();
    for (tv, sv, ts, role) in [
        (5, 5, 4, Role::Timestamp),
        (5, 4, 6, Role::Snapshot),
        (4, 6, 6, Role::Targets),
    ] {
        r.publish(tv, sv, ts);
        let e = r.update(&rec).unwrap_err();
        assert!(
            matches!(e, TrustError::Rollback { role: found, .. } if found == role),
            "{role}: {e}"
        );
    }
    // A rotation of the root key alone keeps every bound.
    let mut r = r;
    r.rotate(Role::Root, 11);
    r.publish(5, 5, 4);
    assert!(r.update(&rec).is_err());
    r.publish(5, 5, 5);
    r.update(&rec).unwrap();
}

/// A record's root, timestamp, snapshot and targets versions (its time floor is the clock's).
fn versions(r: &Record) -> [u64; 4] {
    [r.root_version(), r.timestamp, r.snapshot, r.targets]
}

/// What a node keeps of `v`: its snapshot and targets files, as the channel resolution keeps
/// them ([`crate::trust::kept::Kept`]).
fn keep(v: &Verified) -> Files {
    let f = Files::default();
    f.0.borrow_mut()
        .insert("snapshot.json".into(), v.snapshot.bytes.clone());
    f.0.borrow_mut()
        .insert("targets.json".into(), v.targets_file.bytes.clone());
    f
}

/// python-tuf's ngclient loads its local snapshot and targets before downloading them: an
/// unchanged channel costs the root probe and the timestamp; a changed one downloads what
/// changed, and the result is the same as without kept files.
#[test]
fn kept_files_spare_the_downloads_of_an_unchanged_channel_only() {
    let r = Repo::new(1);
    let (first, fetched) = r.update_kept(&r.node(), &Files::default());
    let first = first.unwrap();
    assert_eq!(
        fetched,
        [
            "2.root.json",
            "timestamp.json",
            "snapshot.json",
            "targets.json"
        ]
    );
    assert!(!first.snapshot.kept && !first.targets_file.kept);
    let kept = keep(&first);

    // Unchanged: two requests, nothing new.
    let (again, fetched) = r.update_kept(&first.record, &kept);
    let again = again.unwrap();
    assert_eq!(fetched, ["2.root.json", "timestamp.json"]);
    assert!(again.snapshot.kept && again.targets_file.kept);
    assert_eq!(again.targets, first.targets);

    // A new timestamp over the same snapshot: still two.
    r.pin(Role::Timestamp, 2, 1);
    let (resigned, fetched) = r.update_kept(&again.record, &kept);
    assert_eq!(fetched, ["2.root.json", "timestamp.json"]);
    assert_eq!(resigned.unwrap().record.timestamp, 2);

    // A new snapshot over the same targets (the daily re-sign): the snapshot is downloaded,
    // the targets kept.
    r.pin(Role::Snapshot, 2, 1);
    r.pin(Role::Timestamp, 3, 2);
    let (sn, fetched) = r.update_kept(&again.record, &kept);
    let sn = sn.unwrap();
    assert_eq!(fetched, ["2.root.json", "timestamp.json", "snapshot.json"]);
    assert!(!sn.snapshot.kept && sn.targets_file.kept);

    // New targets: everything after the timestamp is downloaded, the same as with no kept
    // files.
    r.publish(2, 3, 4);
    let (tg, fetched) = r.update_kept(&sn.record, &keep(&sn));
    let tg = tg.unwrap();
    assert_eq!(
        fetched,
        [
            "2.root.json",
            "timestamp.json",
            "snapshot.json",
            "targets.json"
        ]
    );
    assert_eq!(tg.targets.version, 2);
    assert_eq!(
        versions(&tg.record),
        versions(&r.update(&sn.record).unwrap())
    );
}

/// A kept file is checked exactly as a downloaded one; any failure costs a download, never the
/// update: damaged, signed by a key the root does not name, another version than the new
/// timestamp pins (older, or a forged one of the pinned version and length).
#[test]
fn a_kept_file_that_fails_any_check_is_downloaded_instead() {
    let r = Repo::new(1);
    let first = r.update_kept(&r.node(), &Files::default()).0.unwrap();
    let older = {
        let old = keep(&first);
        r.publish(2, 2, 2);
        old
    };
    // The snapshot the new timestamp pins, re-signed with another expiry by its own key: the
    // same version and length, another sha256.
    let forged_snapshot = {
        let sn = r.get("snapshot.json");
        let body: Versions = Envelope::parse(&sn, "s")
            .unwrap()
            .body(Role::Snapshot, "s")
            .unwrap();
        assert_eq!(body.version, 2);
        let mut forged = body.clone();
        forged.expires += Duration::seconds(1);
        let forged = r.sign_as(Role::Snapshot, &forged);
        assert_eq!(forged.len(), sn.len());
        forged
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("damaged", b"{\"signed\": ".to_vec()),
        (
            "signed by the targets key",
            r.sign_as(Role::Targets, &serde_json::json!({"_type": "snapshot"})),
        ),
        ("older", older.0.borrow()["snapshot.json"].clone()),
        ("forged, same version and length", forged_snapshot),
    ];
    let want = r.update(&first.record).unwrap();
    for (what, bytes) in cases {
        let kept = keep(&first);
        kept.0.borrow_mut().insert("snapshot.json".into(), bytes);
        let (v, fetched) = r.update_kept(&first.record, &kept);
        let v = v.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!v.snapshot.kept, "{what}: kept snapshot used");
        assert!(fetched.contains(&"snapshot.json".to_string()), "{what}");
        assert_eq!(versions(&v.record), versions(&want), "{what}");
    }
    // A kept targets file of the pinned version but another body (its key re-signed it):
    // the snapshot's sha256 refuses it and the channel's targets are downloaded.
    let now = r.update_kept(&first.record, &Files::default()).0.unwrap();
    let kept = keep(&now);
    let mut other: Targets = Envelope::parse(&now.targets_file.bytes, "t")
        .unwrap()
        .body(Role::Targets, "t")
        .unwrap();
    other.expires += Duration::seconds(1);
    kept.0
        .borrow_mut()
        .insert("targets.json".into(), r.sign_as(Role::Targets, &other));
    let (v, fetched) = r.update_kept(&now.record, &kept);
    let v = v.unwrap();
    assert!(v.snapshot.kept && !v.targets_file.kept);
    assert_eq!(fetched.last().map(String::as_str), Some("targets.json"));
    assert_eq!(v.targets, now.targets);
}

/// A kept file never hides a refusal: when the channel's own file is bad, the error is the
/// channel's, even if the kept one would have passed an older pin.
#[test]
fn a_bad_channel_file_is_refused_whatever_is_kept() {
    let r = Repo::new(1);
    let first = r.update_kept(&r.node(), &Files::default()).0.unwrap();
    let kept = keep(&first);
    r.publish(2, 2, 2);
    let mut sn = r.get("snapshot.json");
    let last = sn.len() - 3;
    sn[last] ^= 1;
    r.put("snapshot.json", sn);
    let (v, _) = r.update_kept(&first.record, &kept);
    let e = v.unwrap_err();
    assert!(
        matches!(e, TrustError::Mismatch { ref location, .. } if location == "mem/snapshot.json"),
        "{e}"
    );
}
