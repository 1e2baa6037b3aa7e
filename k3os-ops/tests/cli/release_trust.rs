//! Signed channel metadata (TUF) against the attacks of the TUF specification that apply to a
//! static release server, each test named after its attack. Channels are served by
//! `k3os-ops release serve` (a well-behaved server that a mirror or attacker fills with files)
//! and by testkit's paced server (slow retrieval). Nodes are `testkit::SimNode`s (dir layout,
//! in-memory loader) resolving with `channel::resolve_with`, as `upgrade --channel` does.
//! Servers listen on 127.0.0.1 only.

use k3os_ops_testing::release as release_support;

use libupgrade::Release;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{Duration as Days, Utc};
use libupgrade::channel;
use libupgrade::channel::{ChannelError, MetadataPolicy, TrustOptions};
use libupgrade::manifest::Arch;
use libupgrade::trust::meta::{Envelope, Targets, Versions};
use libupgrade::trust::publish;
use libupgrade::trust::publish::{RoleSpec, SigningKey};
use libupgrade::trust::{meta::Role, TrustError};
use libupgrade::MinRate;
use libupgrade::{Error, NoProgress, StageOptions};
use release_support::Server;
use testkit::sim::SimNode;

/// A channel directory with signed metadata, its keys, and the releases in it (also the
/// fixture of `release_resign`).
pub(crate) struct Chan {
    pub(crate) t: tempfile::TempDir,
    pub(crate) dir: PathBuf,
    release: testkit::Keys,
    keys: BTreeMap<&'static str, SigningKey>,
}

fn key(dir: &Path, name: &str) -> SigningKey {
    let (secret, _) = libupgrade::signing::generate_keypair(dir, name).unwrap();
    libupgrade::signing::load_secret_key(&secret).unwrap()
}

impl Chan {
    /// Releases v1 and v2 (generations 1, 2); root v1 with root key `root1`, targets
    /// `targets1` (and `targets2` with threshold 2 when `targets_threshold` is 2), `snapshot`,
    /// `timestamp`; targets, snapshot and timestamp published.
    pub(crate) fn new(targets_threshold: u32) -> Chan {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("stable");
        fs::create_dir_all(&dir).unwrap();
        let release = testkit::keys();
        let kd = t.path().join("keys");
        let keys: BTreeMap<_, _> = [
            "root1",
            "root2",
            "targets1",
            "targets2",
            "targets3",
            "snapshot",
            "timestamp",
            "timestamp2",
        ]
        .into_iter()
        .map(|n| (n, key(&kd, n)))
        .collect();
        let c = Chan {
            t,
            dir,
            release,
            keys,
        };
        c.release("v1", 1);
        c.release("v2", 2);
        let targets: &[&str] = if targets_threshold == 2 {
            &["targets1", "targets2"]
        } else {
            &["targets1"]
        };
        let roles = BTreeMap::from([
            (Role::Root, c.spec(&["root1"], 1)),
            (Role::Targets, c.spec(targets, targets_threshold)),
            (Role::Snapshot, c.spec(&["snapshot"], 1)),
            (Role::Timestamp, c.spec(&["timestamp"], 1)),
        ]);
        publish::init_root(
            &c.dir,
            &roles,
            &[c.k("root1")],
            publish::expires_in(Days::days(365)),
        )
        .unwrap();
        let signers: Vec<_> = targets.iter().map(|n| c.k(n)).collect();
        c.publish(&signers, Days::days(7));
        c
    }

    pub(crate) fn k(&self, name: &str) -> SigningKey {
        self.keys[name].clone()
    }

    pub(crate) fn spec(&self, names: &[&str], threshold: u32) -> RoleSpec {
        RoleSpec {
            keys: names.iter().map(|n| self.keys[n].verifying_key()).collect(),
            threshold,
        }
    }

    /// A real (mksquashfs) release signed by the release key, in the channel directory.
    fn release(&self, version: &str, generation: u64) {
        testkit::make_release(
            &self.release,
            &self.dir,
            version,
            generation,
            4096,
            Arch::host(),
        );
        channel::write_index(&self.dir).unwrap();
    }

    /// Sign targets with `targets` keys, then snapshot and timestamp (timestamp lifetime `ts`).
    fn publish(&self, targets: &[SigningKey], ts: Days) {
        publish::write_targets(&self.dir, targets, publish::expires_in(Days::days(90))).unwrap();
        self.timestamp(ts);
    }

    pub(crate) fn timestamp(&self, ts: Days) {
        publish::write_timestamp(
            &self.dir,
            &[
                self.k("snapshot"),
                self.k("timestamp"),
                self.k("timestamp2"),
            ],
            publish::expires_in(Days::days(30)),
            publish::expires_in(ts),
        )
        .unwrap();
    }

    /// Trust options of a node whose starting root is this channel's root version 1.
    fn node_trust(&self, name: &str) -> TrustOptions {
        let n = self.t.path().join(name);
        fs::create_dir_all(n.join("state")).unwrap();
        let root = n.join("root.json");
        if !root.exists() {
            fs::copy(self.dir.join("1.root.json"), &root).unwrap();
        }
        TrustOptions {
            root_file: root,
            store_file: n.join("state/channel-trust.json"),
            policy: MetadataPolicy::Auto,
            now: None,
            ignore_expiry: false,
            min_rate: Some(MinRate::DEFAULT),
            read_only: false,
        }
    }

    pub(crate) fn read(&self, name: &str) -> Vec<u8> {
        fs::read(self.dir.join(name)).unwrap()
    }

    pub(crate) fn write(&self, name: &str, bytes: &[u8]) {
        fs::write(self.dir.join(name), bytes).unwrap();
    }
}

fn resolve(
    url: &str,
    version: Option<&str>,
    trust: &TrustOptions,
) -> Result<channel::ResolvedRelease, ChannelError> {
    channel::resolve_with(url, version, Arch::host(), trust)
}

fn trust_err(e: ChannelError) -> TrustError {
    match e {
        ChannelError::Trust { source, .. } => source,
        other => panic!("expected a metadata refusal, got: {other}"),
    }
}

/// Re-sign `file` (a snapshot or timestamp) after `edit`, with `keys`, as an attacker holding
/// those keys would.
fn forge_versions(c: &Chan, role: Role, keys: &[SigningKey], edit: impl FnOnce(&mut Versions)) {
    let env = Envelope::parse(&c.read(role.file()), role.file()).unwrap();
    let mut body: Versions = env.body(role, role.file()).unwrap();
    edit(&mut body);
    c.write(role.file(), &Envelope::sign(&body, keys).to_bytes());
}

/// An attacker's targets.json (signed by `keys`) listing `extra` as a release, followed by a
/// snapshot and timestamp signed with the (online) snapshot and timestamp keys.
fn forge_targets(c: &Chan, keys: &[SigningKey], edit: impl FnOnce(&mut Targets)) {
    let env = Envelope::parse(&c.read("targets.json"), "targets.json").unwrap();
    let mut body: Targets = env.body(Role::Targets, "targets.json").unwrap();
    body.version += 1;
    edit(&mut body);
    c.write("targets.json", &Envelope::sign(&body, keys).to_bytes());
    forge_pins(c);
}

/// A snapshot over the current targets.json and a timestamp over it, signed with the online
/// snapshot and timestamp keys, as an attacker holding them would (the publisher's own
/// `release timestamp` refuses to sign over a targets file that does not verify).
fn forge_pins(c: &Chan) {
    let bytes = c.read("targets.json");
    let version = Envelope::parse(&bytes, "t")
        .unwrap()
        .body::<Targets>(Role::Targets, "t")
        .unwrap()
        .version;
    let m = libupgrade::trust::meta::file_meta(&bytes, None);
    forge_versions(c, Role::Snapshot, &[c.k("snapshot")], |s| {
        s.version += 1;
        s.meta.insert(
            "targets.json".into(),
            libupgrade::trust::meta::MetaRef {
                version,
                length: Some(m.length),
                hashes: Some(m.hashes.clone()),
            },
        );
    });
    let sn = c.read("snapshot.json");
    let sm = libupgrade::trust::meta::file_meta(&sn, None);
    let sv: Versions = Envelope::parse(&sn, "s")
        .unwrap()
        .body(Role::Snapshot, "s")
        .unwrap();
    forge_versions(c, Role::Timestamp, &[c.k("timestamp")], |t| {
        t.version += 1;
        t.meta.insert(
            "snapshot.json".into(),
            libupgrade::trust::meta::MetaRef {
                version: sv.version,
                length: Some(sm.length),
                hashes: Some(sm.hashes),
            },
        );
    });
}

/// The publisher's `release timestamp` refuses to sign over the channel as it is now, naming
/// `file`, and writes nothing.
fn publisher_refuses(c: &Chan, file: &str) {
    let before = testkit::tree_bytes(&c.dir);
    let e = publish::write_timestamp(
        &c.dir,
        &[c.k("snapshot"), c.k("timestamp")],
        publish::expires_in(Days::days(30)),
        publish::expires_in(Days::days(7)),
    )
    .unwrap_err();
    assert!(matches!(e, TrustError::Unverified { .. }), "{e}");
    assert!(e.to_string().contains(file), "{e}");
    testkit::assert_same_tree("channel", &before, &testkit::tree_bytes(&c.dir));
}

#[test]
fn the_signed_metadata_picks_the_release_and_pins_its_manifest() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    let r = resolve(&srv.url, None, &trust).unwrap();
    assert_eq!((r.version.as_str(), r.generation), ("v2", 2));
    let pin = r.pin.clone().expect("metadata pins the manifest");
    assert_eq!(pin.length, c.read("v2/manifest.json").len() as u64);
    let node = SimNode::new(&c.release.trust, 3, 1);
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    let rep = node
        .updater()
        .stage(&pinned(&r), &opts, &NoProgress)
        .unwrap();
    assert_eq!(rep.version, "v2");
    // The node recorded what it trusted.
    let store = libupgrade::trust::store::Store::load(&trust.store_file).unwrap();
    let rec = &store.channels[&srv.url];
    assert_eq!((rec.timestamp, rec.snapshot, rec.targets), (1, 1, 1));
}

/// The targets role is the manifest's authority: a pinned manifest installs on a node whose
/// trust.d has no key that signed it (here: no signature file at all), and the same release
/// without the pin is refused for its signature.
#[test]
fn the_targets_role_vouches_a_pinned_manifest_needs_no_trust_d_signature() {
    let c = Chan::new(1);
    fs::remove_file(c.dir.join("v2/manifest.json.sig")).unwrap();
    let srv = Server::start(&c.dir);
    let r = resolve(&srv.url, Some("v2"), &c.node_trust("node")).unwrap();
    let other = testkit::keys();
    let node = SimNode::new(&other.trust, 3, 1);
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    let rep = node
        .updater()
        .stage(&pinned(&r), &opts, &NoProgress)
        .unwrap();
    assert_eq!(rep.version, "v2");
    assert_eq!(
        rep.signed_by,
        "the channel's targets role (targets version 1, root version 1)"
    );
    let e = SimNode::new(&other.trust, 3, 1)
        .updater()
        .stage(&Release::at(r.source.clone()), &opts, &NoProgress)
        .unwrap_err();
    assert!(matches!(e, Error::Signature { .. }), "{e}");
    assert!(e.to_string().contains("release is not signed"), "{e}");
}

/// Two processes of one node (the agent, an operator's upgrade) check a channel one at a
/// time: while one holds the trust record's lock, the other waits, then goes on.
#[test]
fn concurrent_checks_on_one_node_take_turns_on_its_trust_record() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    let held = libupgrade::trust::store::Store::lock(&trust.store_file).unwrap();
    let (url, t2) = (srv.url.clone(), trust.clone());
    let other = std::thread::spawn(move || resolve(&url, None, &t2).map(|r| r.version));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!other.is_finished(), "resolved while the record was locked");
    drop(held);
    assert_eq!(other.join().unwrap().unwrap(), "v2");
    assert!(trust.store_file.is_file());
}

#[test]
fn arbitrary_software_a_manifest_other_than_the_signed_target_is_refused() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let r = resolve(&srv.url, Some("v2"), &c.node_trust("node")).unwrap();
    // The mirror swaps v2's manifest for v1's (correctly signed by the release key).
    c.write("v2/manifest.json", &c.read("v1/manifest.json"));
    c.write("v2/manifest.json.sig", &c.read("v1/manifest.json.sig"));
    let node = SimNode::new(&c.release.trust, 3, 1);
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    let e = node
        .updater()
        .stage(&pinned(&r), &opts, &NoProgress)
        .unwrap_err();
    assert!(matches!(e, Error::ManifestPin { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("target v2/manifest.json") && msg.contains("nothing was written"),
        "{msg}"
    );
    // And a targets.json signed by a key that is not a targets key is refused outright.
    forge_targets(&c, &[c.k("timestamp")], |_| {});
    let e = trust_err(resolve(&srv.url, None, &c.node_trust("node")).unwrap_err());
    assert!(
        matches!(
            e,
            TrustError::Threshold {
                role: Role::Targets,
                found: 0,
                need: 1,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn rollback_of_metadata_older_versions_are_refused() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    let old: Vec<_> = ["snapshot.json", "timestamp.json"]
        .iter()
        .map(|f| (f, c.read(f)))
        .collect();
    c.timestamp(Days::days(7));
    resolve(&srv.url, None, &trust).unwrap();
    // A mirror replays yesterday's (validly signed, unexpired) timestamp and snapshot.
    for (f, b) in &old {
        c.write(f, b);
    }
    let e = trust_err(resolve(&srv.url, None, &trust).unwrap_err());
    assert!(
        matches!(
            e,
            TrustError::Rollback {
                role: Role::Timestamp,
                seen: 2,
                found: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("rollback"), "{e}");
}

#[test]
fn rollback_of_releases_a_signed_targets_listing_only_older_releases_is_refused_by_generation() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    // The publisher's targets list only v1 now (e.g. a compromised targets key would do this).
    fs::remove_dir_all(c.dir.join("v2")).unwrap();
    channel::write_index(&c.dir).unwrap();
    c.publish(&[c.k("targets1")], Days::days(7));
    let r = resolve(&srv.url, None, &trust).unwrap();
    assert_eq!(r.version, "v1");
    let node = SimNode::new(&c.release.trust, 3, 2);
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    let e = node
        .updater()
        .stage(&pinned(&r), &opts, &NoProgress)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Downgrade {
                found: 1,
                installed: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn indefinite_freeze_an_expired_timestamp_is_refused_naming_role_and_expiry() {
    let c = Chan::new(1);
    c.timestamp(Days::days(-1));
    let srv = Server::start(&c.dir);
    let e = resolve(&srv.url, None, &c.node_trust("node")).unwrap_err();
    let (role, expires) = e.metadata_expired().expect("a typed expiry for the agent");
    assert_eq!(role, Role::Timestamp);
    let msg = e.to_string();
    assert!(
        msg.contains("timestamp metadata (version 2) expired at")
            && msg.contains(&libupgrade::trust::meta::time_str(&expires))
            && msg.contains("--ignore-expiry"),
        "{msg}"
    );
    // The operator's override takes it (signatures and versions still checked).
    let mut trust = c.node_trust("node");
    trust.ignore_expiry = true;
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
}

#[test]
fn clock_tolerance_days_behind_or_within_the_timestamp_lifetime_ahead_still_installs() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    for (days, ok) in [(-30, true), (5, true), (8, false)] {
        let mut trust = c.node_trust(&format!("node{days}"));
        trust.now = Some(Utc::now() + Days::days(days));
        let r = resolve(&srv.url, None, &trust);
        assert_eq!(
            r.is_ok(),
            ok,
            "clock {days} days off: {:?}",
            r.err().map(|e| e.to_string())
        );
    }
    // A clock that goes back below the last successful check does not reopen expired
    // metadata: the check uses the recorded time floor.
    let mut trust = c.node_trust("floor");
    trust.now = Some(Utc::now() + Days::days(6));
    resolve(&srv.url, None, &trust).unwrap();
    c.timestamp(Days::days(2));
    trust.now = Some(Utc::now() - Days::days(100));
    let e = trust_err(resolve(&srv.url, None, &trust).unwrap_err());
    assert!(
        matches!(
            e,
            TrustError::Expired {
                role: Role::Timestamp,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn endless_data_metadata_larger_than_its_bound_is_refused() {
    let c = Chan::new(1);
    let mut huge = c.read("timestamp.json");
    huge.truncate(huge.len() - 2);
    huge.extend(std::iter::repeat_n(b' ', 64 << 20));
    huge.extend(b"}\n");
    c.write("timestamp.json", &huge);
    let srv = Server::start(&c.dir);
    let t = Instant::now();
    let e = trust_err(resolve(&srv.url, None, &c.node_trust("node")).unwrap_err());
    assert!(matches!(e, TrustError::TooLarge { max: 16384, .. }), "{e}");
    assert!(e.to_string().contains("timestamp.json"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// A hostile server on 127.0.0.1: 404 for root versions, and every other file (here: the
/// channel's real timestamp.json) trickled one byte every 50 ms. Returns its base URL.
fn trickle_server(dir: PathBuf) -> String {
    use std::io::{BufRead, BufReader, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                let mut r = BufReader::new(conn.try_clone().unwrap());
                r.read_line(&mut line).unwrap();
                while r
                    .read_line(&mut String::new())
                    .map(|n| n > 2)
                    .unwrap_or(false)
                {}
                let name = line
                    .split(' ')
                    .nth(1)
                    .unwrap_or("/")
                    .trim_start_matches('/');
                let Ok(body) = fs::read(dir.join(name)) else {
                    let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
                    return;
                };
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                let _ = conn.write_all(head.as_bytes());
                for b in body {
                    std::thread::sleep(Duration::from_millis(50));
                    if conn.write_all(&[b]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    base
}

#[test]
fn slow_retrieval_a_trickled_metadata_file_is_cut_by_the_minimum_rate() {
    let c = Chan::new(1);
    let base = trickle_server(c.dir.clone());
    let mut trust = c.node_trust("node");
    trust.min_rate = Some(MinRate {
        bytes_per_sec: 200,
        window: Duration::from_secs(1),
    });
    let t = Instant::now();
    let e = trust_err(resolve(&base, None, &trust).unwrap_err());
    assert!(
        e.to_string().contains("timestamp.json")
            && e.to_string().contains("minimum rate of 200 bytes/s"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn extraneous_dependencies_a_release_outside_the_signed_targets_is_never_picked() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    // Someone drops v9 into the channel and re-indexes, without the targets key.
    c.release("v9", 9);
    let trust = c.node_trust("node");
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
    let e = resolve(&srv.url, Some("v9"), &trust)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no release v9") && e.contains("from signed targets version 1"),
        "{e}"
    );
    // The unsigned index would have picked it: that is what the metadata protects.
    assert_eq!(
        channel::resolve(&srv.url, None, Arch::host())
            .unwrap()
            .version,
        "v9"
    );
}

#[test]
fn mix_and_match_a_snapshot_from_another_publication_is_refused() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let old_targets = c.read("targets.json");
    c.release("v3", 3);
    c.publish(&[c.k("targets1")], Days::days(7));
    // New timestamp and snapshot, old targets.
    c.write("targets.json", &old_targets);
    let e = trust_err(resolve(&srv.url, None, &c.node_trust("node")).unwrap_err());
    assert!(matches!(e, TrustError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("targets.json"), "{e}");
}

#[test]
fn fast_forward_rotating_a_leaked_timestamp_key_recovers_the_nodes() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    let published = c.read("timestamp.json");
    // The attacker holds the timestamp key and pushes the node's version to 1000.
    forge_versions(&c, Role::Timestamp, &[c.k("timestamp")], |t| {
        t.version = 1000
    });
    resolve(&srv.url, None, &trust).unwrap();
    c.write("timestamp.json", &published);
    c.timestamp(Days::days(7));
    let e = trust_err(resolve(&srv.url, None, &trust).unwrap_err());
    assert!(matches!(e, TrustError::Rollback { seen: 1000, .. }), "{e}");
    // Rotate the timestamp key: nodes walking to root 2 forget the forged version.
    publish::rotate_root(
        &c.dir,
        &BTreeMap::from([(Role::Timestamp, c.spec(&["timestamp2"], 1))]),
        &[c.k("root1")],
        publish::expires_in(Days::days(365)),
    )
    .unwrap();
    c.timestamp(Days::days(7));
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
    let rec = &libupgrade::trust::store::Store::load(&trust.store_file)
        .unwrap()
        .channels[&srv.url];
    assert_eq!((rec.root_version(), rec.timestamp), (2, 3));
}

#[test]
fn malicious_mirror_metadata_of_another_root_or_altered_metadata_is_refused() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    // A mirror serving a channel it signed itself (its own root and keys).
    let evil = Chan::new(1);
    let mirror = Server::start(&evil.dir);
    let e = trust_err(resolve(&mirror.url, None, &trust).unwrap_err());
    assert!(
        matches!(
            e,
            TrustError::Threshold {
                role: Role::Timestamp,
                found: 0,
                ..
            }
        ),
        "{e}"
    );
    // A mirror editing a signed file (the target's hash) keeps a signature that no longer fits.
    let t = String::from_utf8(c.read("targets.json")).unwrap();
    let sha = libupgrade::trust::meta::sha256_hex(&c.read("v2/manifest.json"));
    c.write("targets.json", t.replace(&sha, &"0".repeat(64)).as_bytes());
    publisher_refuses(&c, "targets.json");
    forge_pins(&c);
    let e = resolve(&srv.url, None, &trust).unwrap_err().to_string();
    assert!(e.contains("0 valid signature(s) by targets keys"), "{e}");
}

#[test]
fn key_compromise_below_threshold_one_targets_key_cannot_ship_a_release() {
    let c = Chan::new(2);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
    // The publisher's tool refuses to sign below the threshold.
    let e = publish::write_targets(
        &c.dir,
        &[c.k("targets1")],
        publish::expires_in(Days::days(9)),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("1 valid signature(s) by targets keys") && e.contains("2 required"),
        "{e}"
    );
    // An attacker with targets1 (and the online snapshot/timestamp keys) lists a rogue release.
    c.release("v9", 9);
    forge_targets(&c, &[c.k("targets1")], |t| {
        let bytes = fs::read(c.dir.join("v9/manifest.json")).unwrap();
        let mut m = libupgrade::trust::meta::file_meta(&bytes, None);
        m.custom = Some(libupgrade::trust::meta::TargetCustom {
            version: "v9".into(),
            generation: 9,
            arch: Arch::host(),
            rollout: None,
        });
        t.targets.insert("v9/manifest.json".into(), m);
    });
    let e = trust_err(resolve(&srv.url, None, &trust).unwrap_err());
    assert!(
        matches!(
            e,
            TrustError::Threshold {
                role: Role::Targets,
                found: 1,
                need: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn revocation_a_targets_key_dropped_by_root_2_is_refused_on_nodes_that_saw_root_2() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    resolve(&srv.url, None, &trust).unwrap();
    publish::rotate_root(
        &c.dir,
        &BTreeMap::from([(Role::Targets, c.spec(&["targets2"], 1))]),
        &[c.k("root1")],
        publish::expires_in(Days::days(365)),
    )
    .unwrap();
    c.publish(&[c.k("targets2")], Days::days(7));
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
    // The revoked key signs a new list.
    forge_targets(&c, &[c.k("targets1")], |_| {});
    let e = trust_err(resolve(&srv.url, None, &trust).unwrap_err());
    assert!(
        matches!(
            e,
            TrustError::Threshold {
                role: Role::Targets,
                root_version: 2,
                found: 0,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn continuity_channels_without_metadata_resolve_from_their_index_until_metadata_was_trusted() {
    let c = Chan::new(1);
    let plain = tempfile::tempdir().unwrap();
    for f in fs::read_dir(&c.dir).unwrap() {
        let f = f.unwrap();
        if f.path().is_dir() && f.path().join("manifest.json").exists() {
            let to = plain.path().join(f.file_name());
            fs::create_dir_all(&to).unwrap();
            for g in fs::read_dir(f.path()).unwrap() {
                let g = g.unwrap();
                fs::copy(g.path(), to.join(g.file_name())).unwrap();
            }
        }
    }
    // index.json exactly as v0.1.0 wrote it (no `format` field).
    fs::write(
        plain.path().join("index.json"),
        format!(
            r#"{{"releases":[{{"version":"v2","generation":2,"arch":"{a}","path":"v2/"}},{{"version":"v1","generation":1,"arch":"{a}","path":"v1/"}}]}}"#,
            a = Arch::host()
        ),
    )
    .unwrap();
    let srv = Server::start(plain.path());
    // A node with a root, on a v0.1.0 channel: resolves from index.json, unpinned.
    let trust = c.node_trust("node");
    let r = resolve(&srv.url, None, &trust).unwrap();
    assert_eq!((r.version.as_str(), r.pin), ("v2", None));
    // A node whose config requires metadata refuses it, naming the missing file.
    let mut strict = c.node_trust("strict");
    strict.policy = MetadataPolicy::Required;
    let e = resolve(&srv.url, None, &strict).unwrap_err().to_string();
    assert!(
        e.contains("must carry signed metadata") && e.contains("timestamp.json is missing"),
        "{e}"
    );
    // Without a root at all, "required" names the root file.
    strict.root_file = plain.path().join("none.json");
    let e = resolve(&srv.url, None, &strict).unwrap_err().to_string();
    assert!(
        e.contains("no trusted root at") && e.contains("none.json"),
        "{e}"
    );
    // Once a node trusted a channel's metadata, stripping it is refused.
    let srv = Server::start(&c.dir);
    resolve(&srv.url, None, &trust).unwrap();
    fs::remove_file(c.dir.join("timestamp.json")).unwrap();
    let e = resolve(&srv.url, None, &trust).unwrap_err().to_string();
    assert!(
        e.contains("has trusted the channel's signed metadata before"),
        "{e}"
    );
}

#[test]
fn expiry_never_blocks_the_boot_time_confirm_or_a_rollback() {
    let c = Chan::new(1);
    let srv = Server::start(&c.dir);
    let mut node = SimNode::new(&c.release.trust, 3, 1);
    let trust = TrustOptions::from_config(&node.cfg);
    fs::copy(c.dir.join("1.root.json"), &trust.root_file).unwrap();
    let r = resolve(&srv.url, None, &trust).unwrap();
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    node.updater()
        .stage(&pinned(&r), &opts, &NoProgress)
        .unwrap();
    node.updater().activate().unwrap();
    // The channel goes stale, and the node's metadata files are even unreadable: boot-time
    // confirm and a rollback never read them.
    c.timestamp(Days::days(-1));
    assert!(resolve(&srv.url, None, &trust)
        .unwrap_err()
        .metadata_expired()
        .is_some());
    fs::write(&trust.root_file, b"garbage").unwrap();
    fs::write(&trust.store_file, b"garbage").unwrap();
    assert_eq!(node.power_cycle(), bootconfig::Slot::B);
    let rep = node.init_confirm().unwrap();
    assert_eq!(
        (rep.slot, rep.newly_good),
        (bootconfig::Slot::B, true),
        "{rep:?}"
    );
    assert_eq!(
        node.updater().rollback("operator asked").unwrap(),
        bootconfig::Slot::A
    );
}

/// The `GET /repos/acme/trusted/releases` answer: one release per `dl/<tag>/` directory, its
/// files as assets.
fn github_listing(base: &str, dl: &Path, tags: &[&str]) -> String {
    let items: Vec<serde_json::Value> = tags
        .iter()
        .enumerate()
        .map(|(n, tag)| {
            let mut names: Vec<String> = fs::read_dir(dl.join(tag))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            serde_json::json!({
                "tag_name": tag,
                "draft": false,
                "prerelease": *tag == channel::GITHUB_METADATA_TAG,
                "assets": names.iter().enumerate().map(|(k, a)| serde_json::json!({
                    "id": 100 * n + k,
                    "name": a,
                    "size": fs::metadata(dl.join(tag).join(a)).unwrap().len(),
                    "updated_at": "2026-12-03T10:00:00Z",
                    "browser_download_url": format!("{base}dl/{tag}/{a}"),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::to_string(&items).unwrap()
}

/// GitHub channels carry the same metadata as assets of the `channel-metadata` release; the
/// same client decides, and a release GitHub lists but the targets do not is never picked.
#[test]
fn github_channels_carry_the_metadata_as_release_assets() {
    let c = Chan::new(1);
    c.release("v9", 9); // listed on GitHub, never signed into the targets
    let site = c.t.path().join("gh");
    let dl = site.join("dl");
    let copy = |from: &Path, tag: &str, only: Option<&[&str]>| {
        fs::create_dir_all(dl.join(tag)).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_file() && only.is_none_or(|o| o.contains(&name.as_str())) {
                fs::copy(e.path(), dl.join(tag).join(&name)).unwrap();
            }
        }
    };
    for tag in ["v1", "v2", "v9"] {
        copy(&c.dir.join(tag), tag, None);
    }
    let meta: &[&str] = &[
        "root.json",
        "1.root.json",
        "targets.json",
        "snapshot.json",
        "timestamp.json",
    ];
    copy(&c.dir, channel::GITHUB_METADATA_TAG, Some(meta));
    fs::create_dir_all(site.join("api/repos/acme/trusted")).unwrap();
    let srv = Server::start(&site);
    let tags = ["v9", "v2", "v1", channel::GITHUB_METADATA_TAG];
    fs::write(
        site.join("api/repos/acme/trusted/releases"),
        github_listing(&srv.url, &dl, &tags),
    )
    .unwrap();
    let _github = release_support::github_api(&format!("{}api", srv.url));
    let ch = "github-releases://acme/trusted";
    assert_eq!(
        channel::resolve(ch, None, Arch::host()).unwrap().version,
        "v9"
    );
    let r = resolve(ch, None, &c.node_trust("node")).unwrap();
    assert_eq!((r.version.as_str(), r.generation), ("v2", 2));
    assert_eq!(r.location, format!("{}dl/v2/manifest.json", srv.url));
    let node = SimNode::new(&c.release.trust, 3, 1);
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    assert_eq!(
        node.updater()
            .stage(&pinned(&r), &opts, &NoProgress)
            .unwrap()
            .version,
        "v2"
    );
    // An expired timestamp asset is refused like anywhere else.
    c.timestamp(Days::days(-1));
    copy(&c.dir, channel::GITHUB_METADATA_TAG, Some(meta));
    fs::write(
        site.join("api/repos/acme/trusted/releases"),
        github_listing(&srv.url, &dl, &tags),
    )
    .unwrap();
    let e = resolve(ch, None, &c.node_trust("node")).unwrap_err();
    assert_eq!(
        e.metadata_expired().map(|(r, _)| r),
        Some(Role::Timestamp),
        "{e}"
    );
    // A GitHub channel without the metadata release (v0.1.0's kind) resolves from its listing
    // on a node that has a root.
    fs::create_dir_all(site.join("api/repos/acme/plain")).unwrap();
    fs::write(
        site.join("api/repos/acme/plain/releases"),
        github_listing(&srv.url, &dl, &["v2", "v1"]),
    )
    .unwrap();
    let r = resolve("github-releases://acme/plain", None, &c.node_trust("other")).unwrap();
    assert_eq!((r.version.as_str(), r.pin), ("v2", None));
}

/// The release `r` names, as a node's stage request resolves it: the version and the manifest
/// pin the signed metadata gave.
fn pinned(r: &libupgrade::channel::ResolvedRelease) -> Release {
    Release {
        version: Some(r.version.clone()),
        generation: Some(r.generation),
        pin: r.pin.clone(),
        ..Release::at(r.source.clone())
    }
}

/// The publisher's rollout edits (issue 24): a rollout is re-signed by the targets role, a
/// broken one or one for a release the targets do not list is refused with nothing written,
/// `release targets` keeps it when re-listing, and a mirror that strips it is refused like
/// any other change to signed targets.
#[test]
fn a_rollout_is_signed_by_the_targets_role_kept_when_re_listed_and_cannot_be_stripped() {
    use libupgrade::rollout::{Rollout, Wave};
    let c = Chan::new(1);
    let at = Utc::now();
    let waves = |share_bp| Rollout {
        waves: vec![Wave {
            share_bp,
            start: at + Days::days(1),
        }],
        ..Rollout::default()
    };
    let targets_version = |c: &Chan| -> u64 {
        Envelope::parse(&c.read("targets.json"), "t")
            .unwrap()
            .body::<Targets>(Role::Targets, "t")
            .unwrap()
            .version
    };
    let signers = [c.k("targets1")];
    let expires = publish::expires_in(Days::days(90));
    let before = targets_version(&c);
    let e = publish::write_rollout(&c.dir, "v2", &|_| Ok(waves(5_000)), &signers, expires)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("target v2/manifest.json") && e.contains("whole fleet"),
        "{e}"
    );
    let e = publish::write_rollout(&c.dir, "v9", &|_| Ok(waves(10_000)), &signers, expires)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lists no release \"v9\"") && e.contains("v1"),
        "{e}"
    );
    assert_eq!(targets_version(&c), before, "a refused edit wrote targets");
    publish::write_rollout(&c.dir, "v2", &|_| Ok(waves(10_000)), &signers, expires).unwrap();
    let rollout_of = |c: &Chan| {
        Envelope::parse(&c.read("targets.json"), "t")
            .unwrap()
            .body::<Targets>(Role::Targets, "t")
            .unwrap()
            .targets["v2/manifest.json"]
            .custom
            .clone()
            .unwrap()
            .rollout
    };
    assert_eq!(rollout_of(&c), Some(waves(10_000)));
    c.publish(&signers, Days::days(7));
    assert_eq!(
        rollout_of(&c),
        Some(waves(10_000)),
        "re-listing lost the rollout"
    );

    // A mirror strips the rollout from the signed targets: the node refuses the channel.
    let srv = Server::start(&c.dir);
    let trust = c.node_trust("node");
    let mut env = Envelope::parse(&c.read("targets.json"), "t").unwrap();
    env.signed["targets"]["v2/manifest.json"]["custom"]
        .as_object_mut()
        .unwrap()
        .remove("rollout");
    c.write("targets.json", &serde_json::to_vec(&env).unwrap());
    publisher_refuses(&c, "targets.json");
    forge_pins(&c);
    let e = trust_err(resolve(&srv.url, None, &trust).unwrap_err());
    assert!(matches!(e, TrustError::Threshold { .. }), "{e}");
}

/// The files `log` (a `release serve --listen` request log) gained since it had `seen` lines.
fn requests_since(log: &Path, seen: &mut usize) -> Vec<String> {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<String> = text
        .lines()
        .skip(*seen)
        .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
        .collect();
    *seen += lines.len();
    lines
}

/// Issue 24's "a few requests per waiting site": a node keeps the snapshot and targets it
/// verified (`trust::kept::Kept`), so a poll of an unchanged channel downloads only what TUF requires
/// every time, the next root's probe and the timestamp, as python-tuf's ngclient does. A node
/// whose state was written before files were kept (a trust record, no `channel-meta`) starts
/// keeping them at its next poll; a damaged kept file costs a download, never the poll;
/// `--plan-only`'s resolution (`Writes::Nothing`) keeps nothing.
#[test]
fn bandwidth_an_unchanged_channel_costs_the_root_probe_and_the_timestamp() {
    let c = Chan::new(1);
    let log = c.t.path().join("serve.log");
    let srv = Server::start_logged(&c.dir, &log);
    let mut seen = 0;
    let trust = c.node_trust("node");
    let state = trust.store_file.parent().unwrap().to_path_buf();
    let kept_dir = state.join(libupgrade::trust::KEPT_DIR);
    let all = [
        "/2.root.json",
        "/timestamp.json",
        "/snapshot.json",
        "/targets.json",
    ];

    // Looking only: verified, nothing kept.
    let look = TrustOptions {
        read_only: true,
        ..trust.clone()
    };
    assert_eq!(resolve(&srv.url, None, &look).unwrap().version, "v2");
    assert_eq!(requests_since(&log, &mut seen), all);
    assert!(!kept_dir.exists() && !trust.store_file.exists());

    // A node as the build before kept files left it: the trust record only.
    resolve(&srv.url, None, &trust).unwrap();
    fs::remove_dir_all(&kept_dir).unwrap();
    seen = requests_since(&log, &mut 0).len();
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
    assert_eq!(
        requests_since(&log, &mut seen),
        all,
        "first poll after the update"
    );
    for _ in 0..2 {
        assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
        assert_eq!(
            requests_since(&log, &mut seen),
            ["/2.root.json", "/timestamp.json"]
        );
    }

    // The daily timestamp re-sign changes the timestamp and the snapshot (its version moves):
    // the snapshot is downloaded, the targets are not.
    c.timestamp(Days::days(7));
    resolve(&srv.url, None, &trust).unwrap();
    assert_eq!(
        requests_since(&log, &mut seen),
        ["/2.root.json", "/timestamp.json", "/snapshot.json"]
    );

    // A damaged kept targets file: downloaded again, the poll goes on, the file is mended.
    let chan_dir = fs::read_dir(&kept_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::write(chan_dir.join("targets.json"), b"{\"signed\": {").unwrap();
    assert_eq!(resolve(&srv.url, None, &trust).unwrap().version, "v2");
    assert_eq!(
        requests_since(&log, &mut seen),
        ["/2.root.json", "/timestamp.json", "/targets.json"]
    );
    assert_eq!(
        fs::read(chan_dir.join("targets.json")).unwrap(),
        c.read("targets.json")
    );
    resolve(&srv.url, None, &trust).unwrap();
    assert_eq!(
        requests_since(&log, &mut seen),
        ["/2.root.json", "/timestamp.json"]
    );
}
