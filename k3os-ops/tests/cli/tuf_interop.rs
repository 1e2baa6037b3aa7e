//! Channel metadata against the TUF reference implementation, python-tuf 7.0.1 (installed by
//! `scripts/setup.sh`; a machine without it fails here, it does not skip), both directions:
//! - channels published by `k3os-ops release root init|rotate|targets|timestamp` verify with
//!   python-tuf's `ngclient.Updater`, before and after a root rotation;
//! - channels written by python-tuf's Metadata API get the same verdict from a node (the
//!   resolution `upgrade --channel` runs, `channel::resolve_with`) as from python-tuf's client,
//!   step by step, each client keeping what it trusted between steps. A table of both verdicts
//!   is printed for every step.
//!
//! The python side is `tests/tuf/interop.py`. Channels are served by `k3os-ops release serve`
//! on 127.0.0.1.

use crate::release_args::release_create;
use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use cli_support::ops;
use libupgrade::channel;
use libupgrade::channel::{MetadataPolicy, TrustOptions};
use libupgrade::manifest::Arch;
use libupgrade::MinRate;
use release_support::Server;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tuf/interop.py");

/// python3 with python-tuf importable, or a failure that says how to get it.
fn require_python_tuf() {
    let out = Command::new("python3")
        .args(["-c", "import tuf, tuf.ngclient; print(tuf.__version__)"])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "python-tuf is not installed (python3 cannot import tuf.ngclient: {}): run scripts/setup.sh",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("python3 cannot be run ({e}): run scripts/setup.sh"),
    }
}

/// A client's verdict on a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Ok,
    Refused(String),
}

impl Verdict {
    fn accepted(&self) -> bool {
        *self == Verdict::Ok
    }
    fn short(&self) -> &'static str {
        if self.accepted() {
            "ok"
        } else {
            "refused"
        }
    }
}

/// Run `interop.py args`; a python error other than a client's refusal fails the test.
fn py(args: &[&str]) -> (i32, String) {
    let out = Command::new("python3")
        .arg(SCRIPT)
        .args(args)
        .output()
        .expect("run python3");
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        code == 0 || code == 3,
        "interop.py {args:?} failed ({code}):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, stdout)
}

/// python-tuf's `Updater` on `url`, trusting what it kept in `metadir` (starting from `root`),
/// then downloading and checking `target`.
fn python_verdict(url: &str, metadir: &Path, root: &Path, target: &str) -> Verdict {
    let (m, r) = (metadir.display().to_string(), root.display().to_string());
    match py(&["client", url, &m, &r, target]) {
        (0, _) => Verdict::Ok,
        (_, why) => Verdict::Refused(why),
    }
}

/// A node that starts from root `root` and keeps its record in `dir/state`, with metadata
/// required (no fall back to an index).
fn node_trust(dir: &Path, root: &Path) -> TrustOptions {
    fs::create_dir_all(dir.join("state")).unwrap();
    let root_file = dir.join("root.json");
    if !root_file.exists() {
        fs::copy(root, &root_file).unwrap();
    }
    TrustOptions {
        root_file,
        store_file: dir.join("state/channel-trust.json"),
        policy: MetadataPolicy::Required,
        now: None,
        ignore_expiry: false,
        min_rate: Some(MinRate::DEFAULT),
        read_only: false,
    }
}

fn node_verdict(url: &str, trust: &TrustOptions) -> Verdict {
    match channel::resolve_with(url, None, Arch::host(), trust) {
        Ok(_) => Verdict::Ok,
        Err(e) => Verdict::Refused(e.to_string()),
    }
}

/// One scenario over a channel python-tuf writes: write steps, and checks where both clients
/// refresh and the expected verdict.
struct Case {
    name: &'static str,
    steps: &'static [Step],
}

enum Step {
    Write(&'static [&'static str]),
    Check(bool),
}

use Step::{Check, Write};

const INIT: &str = "init:arch={arch},threshold=1,v=5";

// Not a case here, as the two clients differ on purpose: after a rotation of the *snapshot* key
// alone, a lower snapshot version is accepted by a node (TUF 5.3.11 deletes the trusted
// timestamp and snapshot when either key rotates) and refused by python-tuf 7.0.1, whose
// trusted timestamp (its key unchanged) keeps bounding the snapshot version. Measured
// 2026-12-04; the node's side is libupgrade's `spec_5_3_11_*` unit tests.

const CASES: &[Case] = &[
    Case {
        name: "plain good repository",
        steps: &[Write(&[INIT]), Check(true)],
    },
    Case {
        name: "root rotation revoking the targets key",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&[
                "rotate:role=root,key=root2",
                "rotate:role=targets,key=targetsB",
                "targets:v=6",
                "snapshot:v=6",
                "timestamp:v=6",
            ]),
            Check(true),
            Write(&["targets:v=7,keys=targets1", "snapshot:v=7", "timestamp:v=7"]),
            Check(false),
        ],
    },
    Case {
        name: "targets threshold 2, both signatures",
        steps: &[Write(&["init:arch={arch},threshold=2,v=1"]), Check(true)],
    },
    Case {
        name: "targets threshold 2, one signature short",
        steps: &[
            Write(&["init:arch={arch},threshold=2,v=1"]),
            Check(true),
            Write(&["targets:v=2,keys=targets2", "snapshot:v=2", "timestamp:v=2"]),
            Check(false),
        ],
    },
    Case {
        name: "expired timestamp",
        steps: &[Write(&[INIT, "timestamp:v=6,days=-1"]), Check(false)],
    },
    Case {
        name: "expired targets",
        steps: &[
            Write(&[INIT, "targets:v=6,days=-1", "snapshot:v=6", "timestamp:v=6"]),
            Check(false),
        ],
    },
    Case {
        name: "rollback: lower timestamp version",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&["timestamp:v=4"]),
            Check(false),
        ],
    },
    Case {
        name: "rollback: lower snapshot version",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&["snapshot:v=4", "timestamp:v=6"]),
            Check(false),
        ],
    },
    Case {
        name: "rollback: lower targets version",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&["targets:v=4", "snapshot:v=6", "timestamp:v=6"]),
            Check(false),
        ],
    },
    Case {
        name: "sha512-only snapshot reference, substituted snapshot",
        steps: &[
            Write(&[INIT, "timestamp:v=6,hashes=sha512", "substitute-snapshot"]),
            Check(false),
        ],
    },
    Case {
        name: "sha256+sha512 snapshot reference, both right",
        steps: &[
            Write(&[INIT, "timestamp:v=6,hashes=sha256+sha512"]),
            Check(true),
        ],
    },
    Case {
        name: "targets key rotated, lower targets version (5.5.5)",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&[
                "rotate:role=targets,key=targetsB",
                "targets:v=3",
                "snapshot:v=6",
                "timestamp:v=6",
            ]),
            Check(false),
        ],
    },
    Case {
        name: "snapshot key rotated after a fast-forwarded targets (5.3.11)",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&["targets:v=1000", "snapshot:v=6", "timestamp:v=6"]),
            Check(true),
            Write(&[
                "rotate:role=snapshot,key=snapshotB",
                "targets:v=6",
                "snapshot:v=7",
                "timestamp:v=7",
            ]),
            Check(true),
        ],
    },
    Case {
        name: "timestamp key rotated, lower timestamp and snapshot versions",
        steps: &[
            Write(&[INIT]),
            Check(true),
            Write(&[
                "rotate:role=timestamp,key=timestampB",
                "snapshot:v=2",
                "timestamp:v=2",
            ]),
            Check(true),
        ],
    },
];

/// One row of the printed table.
struct Row {
    case: &'static str,
    check: usize,
    expected: bool,
    node: Verdict,
    python: Verdict,
}

#[test]
fn repositories_python_tuf_writes_get_the_same_verdict_from_a_node_as_from_python_tuf() {
    require_python_tuf();
    let t = tempfile::tempdir().unwrap();
    let site = t.path().join("site");
    fs::create_dir_all(&site).unwrap();
    let srv = Server::start(&site);
    let arch = Arch::host().as_str();
    let mut rows = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let repo = site.join(format!("case{i}"));
        let repo_s = repo.display().to_string();
        let url = format!("{}case{i}/", srv.url);
        let clients = t.path().join(format!("clients{i}"));
        let mut check = 0;
        for step in case.steps {
            match step {
                Write(ops) => {
                    let mut args = vec!["write".to_string(), repo_s.clone()];
                    args.extend(ops.iter().map(|o| o.replace("{arch}", arch)));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    py(&args);
                }
                Check(expected) => {
                    check += 1;
                    let root = repo.join("1.root.json");
                    let node = node_verdict(&url, &node_trust(&clients.join("node"), &root));
                    let python =
                        python_verdict(&url, &clients.join("python"), &root, "v1/manifest.json");
                    rows.push(Row {
                        case: case.name,
                        check,
                        expected: *expected,
                        node,
                        python,
                    });
                }
            }
        }
    }
    println!(
        "{:<64} {:>5}  {:<8} {:<10} {:<8}",
        "case", "check", "node", "python-tuf", "expected"
    );
    for r in &rows {
        println!(
            "{:<64} {:>5}  {:<8} {:<10} {:<8}{}",
            r.case,
            r.check,
            r.node.short(),
            r.python.short(),
            if r.expected { "ok" } else { "refused" },
            if r.node.accepted() != r.python.accepted() {
                "  DISAGREE"
            } else {
                ""
            }
        );
    }
    for r in &rows {
        println!(
            "  {} #{}:\n    node: {:?}\n    python-tuf: {:?}",
            r.case, r.check, r.node, r.python
        );
    }
    let disagree: Vec<_> = rows
        .iter()
        .filter(|r| r.node.accepted() != r.python.accepted())
        .map(|r| format!("{} #{}", r.case, r.check))
        .collect();
    assert!(
        disagree.is_empty(),
        "node and python-tuf disagree on: {disagree:?}"
    );
    for r in &rows {
        assert_eq!(
            r.node.accepted(),
            r.expected,
            "{} #{}: both clients say {:?}, expected {}",
            r.case,
            r.check,
            r.node,
            if r.expected { "ok" } else { "refused" }
        );
    }
}

/// `k3os-ops args`, which must succeed.
fn ok(args: &[&str]) -> String {
    let out = ops(None, args);
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "k3os-ops {args:?} failed:\n{o}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    o
}

/// `release create` of release `version` (fake inputs: metadata is what is tested here).
fn create(work: &Path, chan: &Path, key: &Path, version: &str, generation: u64) {
    let (r, k, i) = release_support::fake_inputs(&work.join(version), version);
    let args = release_create((&r, &k, &i), chan, key, version, generation);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn channels_k3os_ops_publishes_verify_with_python_tuf_across_a_root_rotation() {
    require_python_tuf();
    let t = tempfile::tempdir().unwrap();
    let p = |n: &str| t.path().join(n);
    let s = |n: &str| p(n).display().to_string();
    let keys = p("keys");
    for name in [
        "release",
        "root1",
        "root2",
        "targets1",
        "targets2",
        "snapshot",
        "timestamp",
    ] {
        ok(&["release", "keygen", "-o", &s("keys"), "--name", name]);
    }
    let k = |n: &str| keys.join(n).display().to_string();
    let chan: PathBuf = p("site/stable");
    fs::create_dir_all(&chan).unwrap();
    ok(&["release", "index", &s("site/stable")]);
    create(&p("work"), &chan, &keys.join("release.key"), "v2", 2);
    ok(&[
        "release",
        "root",
        "init",
        &s("site/stable"),
        "--root-key",
        &k("root1.key"),
        "--targets-key",
        &k("targets1.pub"),
        "--snapshot-key",
        &k("snapshot.pub"),
        "--timestamp-key",
        &k("timestamp.pub"),
    ]);
    let publish = |targets_key: &str| {
        ok(&[
            "release",
            "targets",
            &s("site/stable"),
            "--key",
            &k(targets_key),
        ]);
        ok(&[
            "release",
            "timestamp",
            &s("site/stable"),
            "--snapshot-key",
            &k("snapshot.key"),
            "--timestamp-key",
            &k("timestamp.key"),
        ]);
    };
    publish("targets1.key");
    let srv = Server::start(&p("site"));
    let url = format!("{}stable/", srv.url);
    let root1 = p("root1.json");
    fs::copy(chan.join("1.root.json"), &root1).unwrap();
    let md = p("python");
    let v = python_verdict(&url, &md, &root1, "v2/manifest.json");
    assert_eq!(v, Verdict::Ok, "python-tuf on root 1");

    // Root 2: a new root key, the targets key replaced (targets1 revoked); v3 published.
    ok(&[
        "release",
        "root",
        "rotate",
        &s("site/stable"),
        "--sign-key",
        &k("root1.key"),
        "--root-key",
        &k("root2.key"),
        "--targets-key",
        &k("targets2.pub"),
    ]);
    create(&p("work"), &chan, &keys.join("release.key"), "v3", 3);
    publish("targets2.key");
    // The same python client (it trusts root 1 and the versions it saw) walks to root 2; a
    // fresh one starting from root 1 too.
    assert_eq!(
        python_verdict(&url, &md, &root1, "v3/manifest.json"),
        Verdict::Ok,
        "python-tuf after the root rotation"
    );
    assert_eq!(
        python_verdict(&url, &p("python-fresh"), &root1, "v3/manifest.json"),
        Verdict::Ok,
        "a fresh python-tuf client from root 1"
    );
    // And it trusts root 2 now: python-tuf's record holds version 2.
    let kept = fs::read_to_string(md.join("root.json")).unwrap();
    assert!(kept.contains("\"version\": 2"), "{kept}");

    // The guard's halt role (issue 32): a delegation in targets.json that python-tuf reads
    // (its refresh, and a release's target found in the top-level targets) for the same
    // client and a fresh one.
    ok(&["release", "keygen", "-o", &s("keys"), "--name", "halt"]);
    ok(&[
        "release",
        "delegate-halt",
        &s("site/stable"),
        "--halt-key",
        &k("halt.pub"),
        "--key",
        &k("targets2.key"),
        "--snapshot-key",
        &k("snapshot.key"),
        "--timestamp-key",
        &k("timestamp.key"),
    ]);
    let tg = fs::read_to_string(chan.join("targets.json")).unwrap();
    assert!(
        tg.contains("\"delegations\"") && tg.contains("halt/*"),
        "{tg}"
    );
    for (dir, what) in [
        (&md, "the same python-tuf client"),
        (&p("python-3"), "a fresh one"),
    ] {
        assert_eq!(
            python_verdict(&url, dir, &root1, "v3/manifest.json"),
            Verdict::Ok,
            "{what} with the halt delegation"
        );
    }
    // A halt of v3 written and signed by python-tuf's Metadata API with the halt key holds a
    // node resolving through our client, as the guard's own does.
    let root1_arg = root1.display().to_string();
    let resolve = || {
        ops(
            None,
            &[
                "release", "resolve", &url, "--root", &root1_arg, "--seed", "0",
            ],
        )
    };
    let before = String::from_utf8_lossy(&resolve().stdout).into_owned();
    assert!(before.contains("v3 ("), "{before}");
    let out = Command::new("python3")
        .args(["-c", PY_HALT, &s("site/stable"), &k("halt.key")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python-tuf writing halt.json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held = resolve();
    let o = String::from_utf8_lossy(&held.stdout);
    assert!(held.status.success(), "{o}");
    // v3 held, the node is offered v2 (the newest release not held).
    assert!(
        o.contains("v3 waits: the rollout is paused since") && o.contains("v2 ("),
        "{o}"
    );
}

/// python-tuf writes `halt.json` of the delegated `halt` role halting v3 (argv: channel
/// directory, the halt role's PKCS#8 key) and verifies it against our targets' delegation.
const PY_HALT: &str = "import sys
from datetime import datetime, timedelta, timezone
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import Metadata, Targets, TargetFile
chan, keyfile = sys.argv[1], sys.argv[2]
priv = load_pem_private_key(open(keyfile, 'rb').read(), None)
signer = CryptoSigner(priv, SSlibKey.from_crypto(priv.public_key()))
tg = Metadata.from_file(chan + '/targets.json')
m = tg.signed.targets['v3/manifest.json']
now = datetime.now(timezone.utc).replace(microsecond=0)
mark = {'halt': {'since': (now - timedelta(minutes=1)).strftime('%Y-%m-%dT%H:%M:%SZ'), 'reason': 'python-tuf'}}
t = TargetFile(m.length, {'sha256': m.hashes['sha256']}, 'halt/v3', unrecognized_fields={'custom': mark})
md = Metadata(Targets(version=1, expires=now + timedelta(days=7), targets={'halt/v3': t}))
md.sign(signer)
md.to_file(chan + '/halt.json')
tg.signed.verify_delegate('halt', md.signed_bytes, md.signatures)
";
