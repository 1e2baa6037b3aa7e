use ed25519_dalek::SigningKey;

use super::wire::{deflate, envelope};
use super::*;

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn bundle(k: &SigningKey) -> Bundle {
    Bundle {
        format: BUNDLE_FORMAT,
        node: NodeId::of(&k.verifying_key()),
        version: "v2".into(),
        generation: 2,
        attempt: 1,
        slot: "B".into(),
        time: "2026-12-07T04:00:00Z".into(),
        failure: Failure::HealthCheck,
        why: "health check 20-kubelet failed: kubelet: failed to load config".into(),
        versions: "k3os-ops=0.2.0\nkernel=6.1.0-57-amd64\n".into(),
        redacted: 2,
        sections: vec![
            Section {
                name: "health/20-kubelet".into(),
                text: "kubelet: failed to load config\n".into(),
                cut_bytes: 0,
            },
            Section {
                name: "log/kernel".into(),
                text: "[    0.000000] Linux version 6.1.0\n".into(),
                cut_bytes: 0,
            },
        ],
    }
}

/// Text that deflate cannot shrink much: log-like lines with pseudo-random hex.
fn noisy_log(bytes: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut s = String::new();
    while s.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!(
            "kubelet[{}]: E {:016x} {:016x}\n",
            x % 997,
            x,
            x.rotate_left(7)
        ));
    }
    s
}

#[test]
fn a_sealed_bundle_opens_to_the_same_bundle() {
    let k = key(1);
    let b = bundle(&k);
    let sealed = b.seal(&k).unwrap();
    assert!(sealed.starts_with(b"k3os-bundle 1 "));
    let opened = open(&sealed).unwrap();
    assert_eq!(opened.bundle, b);
    assert_eq!(opened.bytes, sealed);
}

#[test]
fn a_large_bundle_is_cut_from_the_head_of_its_longest_section_to_fit() {
    let k = key(2);
    let mut b = bundle(&k);
    let log = noisy_log(600 * 1024);
    b.sections.push(Section {
        name: "log/kubelet".into(),
        text: log.clone(),
        cut_bytes: 0,
    });
    let sealed = b.seal(&k).unwrap();
    assert!(sealed.len() <= MAX_BUNDLE_BYTES, "{} bytes", sealed.len());
    let got = open(&sealed).unwrap().bundle;
    let kept = &got.sections[2];
    assert!(kept.cut_bytes > 0 && !kept.text.is_empty());
    assert_eq!(kept.cut_bytes as usize + kept.text.len(), log.len());
    assert!(log.ends_with(&kept.text), "the newest lines are kept");
    // The short sections, first in importance, are whole.
    assert_eq!(got.sections[0], b.sections[0]);
}

#[test]
fn sealing_with_another_nodes_key_or_a_broken_limit_is_refused() {
    let b = bundle(&key(1));
    let e = b.seal(&key(2)).unwrap_err();
    assert!(e.to_string().contains("but the key is node"), "{e}");
    let mut bad = bundle(&key(1));
    bad.sections[0].name = "Health Check".into();
    let e = bad.seal(&key(1)).unwrap_err();
    assert!(
        e.to_string().contains("section name \"Health Check\""),
        "{e}"
    );
    let mut bad = bundle(&key(1));
    bad.slot = "C".into();
    assert!(bad
        .seal(&key(1))
        .unwrap_err()
        .to_string()
        .contains("neither A nor B"));
}

#[test]
fn a_changed_byte_anywhere_is_refused_by_the_signature_or_the_envelope() {
    let k = key(3);
    let sealed = bundle(&k).seal(&k).unwrap();
    for i in [20, sealed.len() - 1, sealed.len() / 2] {
        let mut t = sealed.clone();
        t[i] ^= 0x01;
        let e = open(&t).unwrap_err();
        assert!(
            matches!(e, BundleError::Signature { .. } | BundleError::Envelope(_)),
            "byte {i}: {e}"
        );
    }
}

#[test]
fn an_oversized_envelope_is_refused_before_it_is_read() {
    let e = open(&vec![b'x'; MAX_BUNDLE_BYTES + 1]).unwrap_err();
    assert_eq!(
        e,
        BundleError::TooLarge {
            found: MAX_BUNDLE_BYTES + 1
        }
    );
}

#[test]
fn a_signed_decompression_bomb_is_refused_at_its_limit() {
    let k = key(4);
    let node = NodeId::of(&k.verifying_key());
    let body = deflate(&vec![b' '; 4 * MAX_INFLATED_BYTES]).unwrap();
    assert!(body.len() < MAX_BUNDLE_BYTES);
    let e = open(&envelope(&k, &node, &body)).unwrap_err();
    assert!(e.to_string().contains("inflates to more than"), "{e}");
}

#[test]
fn verify_checks_the_signature_and_inflates_nothing() {
    let k = key(5);
    let node = NodeId::of(&k.verifying_key());
    // Not deflate at all: verify passes (it never looks at the body), inflate refuses.
    let sealed = envelope(&k, &node, b"\xff\xfe not deflate");
    let v = verify(&sealed).unwrap();
    assert_eq!((v.node, v.bytes), (node, &sealed[..]));
    assert!(matches!(v.inflate(), Err(BundleError::Body(_))));
    // Another key's signature under this node's id: refused before the body.
    let mut forged = envelope(&key(6), &node, b"x");
    assert!(matches!(
        verify(&forged),
        Err(BundleError::Signature { .. })
    ));
    forged.truncate(10);
    assert!(matches!(verify(&forged), Err(BundleError::Envelope(_))));
    let good = bundle(&k).seal(&k).unwrap();
    assert_eq!(
        verify(&good).unwrap().inflate().unwrap(),
        open(&good).unwrap()
    );
}

#[test]
fn bodies_that_are_not_bundles_of_this_format_are_refused_naming_why() {
    let k = key(5);
    let node = NodeId::of(&k.verifying_key());
    let seal_json = |json: serde_json::Value| {
        let body = deflate(&serde_json::to_vec(&json).unwrap()).unwrap();
        open(&envelope(&k, &node, &body)).unwrap_err().to_string()
    };
    let mut v = serde_json::to_value(bundle(&k)).unwrap();
    v["format"] = 2.into();
    assert!(seal_json(v).contains("format 2 is not the format this reader knows (1)"));
    let mut v = serde_json::to_value(bundle(&k)).unwrap();
    v["extra"] = "x".into();
    assert!(seal_json(v).contains("unknown field `extra`"));
    let other = serde_json::to_value(bundle(&key(6))).unwrap();
    assert!(seal_json(other).contains("inside an envelope signed by node"));
    let e = open(&envelope(&k, &node, b"not deflate")).unwrap_err();
    assert!(matches!(e, BundleError::Body(_)), "{e}");
}
