//! `trust::halt::verify` and `apply`: the node's reading of the guard's `halt.json`, the one
//! file a key that can only stop a rollout signs.
//!
//! The input is the body of a `halt.json`. Half the inputs (first byte even) are verified as
//! they are, against fixture targets whose `halt` delegation names the fixture key: the fuzzer
//! holds no key, so none may be accepted unless it is a seed signed before. The other half have
//! their body parsed as JSON and signed here with the fixture key, so mutation reaches
//! everything after the signature check: what **any** signed halt can do.
//!
//! Asserts: an accepted halt has only targets under `halt/` (one segment), a version not below
//! the recorded bound; and `apply` of it to the fixture targets changes nothing but
//! `rollout.paused` where it was unset (a release without rollout data gets exactly a default
//! rollout paused): waves, shifts, withdrawals, the publisher's own pause and every other
//! field are as before, so a signed halt can only stop.
#![no_main]

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ed25519_dalek::SigningKey;
use libfuzzer_sys::fuzz_target;
use libupgrade::manifest::Arch;
use libupgrade::rollout::{Pause, Rollout, Wave, Withdrawal};
use libupgrade::trust::halt::{apply, verify, Seen, HALT_PATHS, HALT_PREFIX, HALT_ROLE};
use libupgrade::trust::meta::{
    canonical, file_meta, DelegatedRole, Delegations, Envelope, Key, TargetCustom, Targets,
};

fn t(h: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
}

/// v1 without rollout data, v2 in waves, v3 paused by the publisher, v4 withdrawn; the halt
/// role delegated to the fixture key.
fn targets(key: &SigningKey) -> Targets {
    let waves = Rollout {
        waves: vec![
            Wave {
                share_bp: 100,
                start: t(0),
            },
            Wave {
                share_bp: 10_000,
                start: t(72),
            },
        ],
        paused_secs: 600,
        ..Rollout::default()
    };
    let entry = |v: &str, g: u64, rollout: Option<Rollout>| {
        let mut m = file_meta(v.as_bytes(), None);
        m.custom = Some(TargetCustom {
            version: v.into(),
            generation: g,
            arch: Arch::X86_64,
            rollout,
        });
        (format!("{v}/manifest.json"), m)
    };
    let k = Key::ed25519(&key.verifying_key());
    Targets {
        type_: "targets".into(),
        spec_version: "1.0.0".into(),
        version: 3,
        expires: t(10_000),
        targets: BTreeMap::from([
            entry("v1", 1, None),
            entry("v2", 2, Some(waves.clone())),
            entry(
                "v3",
                3,
                Some(Rollout {
                    paused: Some(Pause { since: t(1) }),
                    ..waves.clone()
                }),
            ),
            entry(
                "v4",
                4,
                Some(Rollout {
                    withdrawn: Some(Withdrawal { at: t(1) }),
                    ..waves
                }),
            ),
        ]),
        delegations: Some(Delegations {
            keys: BTreeMap::from([(k.id(), k.clone())]),
            roles: vec![DelegatedRole {
                name: HALT_ROLE.into(),
                keyids: vec![k.id()],
                threshold: 1,
                terminating: true,
                paths: Some(vec![HALT_PATHS.into()]),
            }],
        }),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let key = SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
    let tg = targets(&key);
    let bytes = if mode % 2 == 0 {
        body.to_vec()
    } else {
        let Ok(signed) = serde_json::from_slice::<serde_json::Value>(body) else {
            return;
        };
        // Only what canonical JSON can hold is signable (no floats): `Envelope::sign` signs
        // the publisher's own documents, which never carry one.
        if canonical(&signed).is_err() {
            return;
        }
        Envelope::sign(&signed, &[key.clone()]).to_bytes()
    };
    let seen = Seen {
        keyids: vec![Key::ed25519(&key.verifying_key()).id()],
        version: u64::from(mode / 2 % 4),
    };
    let Ok(Some(h)) = verify(&tg, Some(&bytes), "halt.json", Some(&seen), Some(t(5))) else {
        return;
    };
    assert!(h.doc.version >= seen.version);
    for path in h.doc.targets.keys() {
        let name = path.strip_prefix(HALT_PREFIX).expect("under halt/");
        assert!(!name.is_empty() && !name.contains('/'), "{path}");
    }
    let mut after = tg.clone();
    let held = apply(&mut after, &h.doc, t(5));
    assert_eq!(after.delegations, tg.delegations);
    assert_eq!(after.version, tg.version);
    assert_eq!(after.targets.len(), tg.targets.len());
    for (path, before) in &tg.targets {
        let now = &after.targets[path];
        assert_eq!((now.length, &now.hashes), (before.length, &before.hashes));
        let (b, a) = (
            before.custom.as_ref().unwrap(),
            now.custom.as_ref().unwrap(),
        );
        assert_eq!(
            (&a.version, a.generation, a.arch),
            (&b.version, b.generation, b.arch)
        );
        let was = b.rollout.clone().unwrap_or_default();
        let is = a.rollout.clone().unwrap_or_default();
        if held.iter().any(|x| &x.target == path) {
            assert!(was.paused.is_none() && was.withdrawn.is_none(), "{path}");
            assert!(is.paused.is_some_and(|p| p.since <= t(5)), "{path}");
            assert_eq!(Rollout { paused: None, ..is }, was, "{path}");
        } else {
            assert_eq!(a.rollout, b.rollout, "{path}");
        }
    }
});
