//! Property tests: the parsers never panic on arbitrary bytes, and serialisation, GRUB's
//! load model and GRUB's in-place set agree with each other for arbitrary variable sets.

use bootconfig::{grub_load, grub_set_in_place, GrubEnv};
use bootconfig::{Adv, ADV_BOOTONCE, ADV_SIZE};
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_]{0,12}"
}

fn value() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![Just('\\'), Just('\n'), Just('#'), Just('='), any::<char>()],
        0..24,
    )
    .prop_map(|v| v.into_iter().filter(|c| *c != '\0').collect())
}

proptest! {
    #[test]
    fn env_round_trips_through_parse_and_grub_load(vars in prop::collection::vec((name(), value()), 0..8)) {
        let env = GrubEnv::from_pairs(vars);
        if let Ok(bytes) = env.to_bytes() {
            prop_assert_eq!(bytes.len(), 1024);
            prop_assert_eq!(&GrubEnv::parse(&bytes).unwrap(), &env);
            let loaded = grub_load(&bytes).unwrap();
            prop_assert!(!loaded.broken);
            let got: Vec<(String, String)> = loaded.vars;
            let want: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn grub_in_place_set_matches_rust_set(
        vars in prop::collection::vec((name(), value()), 0..6),
        edits in prop::collection::vec((name(), value()), 0..6),
    ) {
        let mut env = GrubEnv::from_pairs(vars);
        let Ok(mut buf) = env.to_bytes() else { return Ok(()) };
        for (k, v) in edits {
            let mut next = env.clone();
            next.set(k.clone(), v.clone());
            match next.to_bytes() {
                Ok(want) => {
                    prop_assert!(grub_set_in_place(&mut buf, &k, &v));
                    prop_assert_eq!(&buf, &want);
                    env = next;
                }
                Err(_) => prop_assert!(!grub_set_in_place(&mut buf.clone(), &k, &v)),
            }
        }
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1100), cut in 0usize..1100) {
        let _ = GrubEnv::parse(&bytes);
        let _ = grub_load(&bytes);
        let mut b = bytes.clone();
        let _ = grub_set_in_place(&mut b, "K3OS_A", "good");
        // A real block with garbage from `cut` on.
        let mut torn = GrubEnv::from_pairs([("K3OS_A", "good"), ("K3OS_B", "try")]).to_bytes().unwrap();
        let n = cut.min(torn.len());
        for (i, b) in torn[n..].iter_mut().enumerate() {
            *b = bytes.get(i).copied().unwrap_or(b'\n');
        }
        let _ = grub_load(&torn);
        let _ = GrubEnv::parse(&torn);
    }

    #[test]
    fn adv_load_and_set_never_panic(raw in prop::collection::vec(any::<u8>(), 2 * ADV_SIZE), label in "[a-z]{0,8}") {
        let raw: [u8; 2 * ADV_SIZE] = raw.try_into().unwrap();
        let (mut adv, _) = Adv::load(&raw);
        let _ = adv.boot_once();
        adv.set(ADV_BOOTONCE, label.as_bytes()).unwrap();
        prop_assert!(Adv::copy_valid(&adv.0[..ADV_SIZE]));
        prop_assert_eq!(adv.boot_once(), (!label.is_empty()).then_some(label));
    }
}
