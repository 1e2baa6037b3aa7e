//! The syslinux backend against files in a temporary directory: the rendered conf, the ADV
//! round trip, a trial cycle read back as the contract says, the choice for every state, and
//! missing or older files.

use super::*;

fn cfg(primary: Slot) -> SyslinuxConfig {
    let e = |s: &str| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: "root=/dev/vda4 console=ttyS0".into(),
    };
    SyslinuxConfig {
        entries: [e("a"), e("b")],
        primary,
        timeout_tenths: 30,
        serial: true,
        panic_secs: 10,
    }
}

/// A syslinux dir with our conf and a fake ldlinux.sys (4 KiB of code + empty ADV).
fn setup(primary: Slot) -> (tempfile::TempDir, SyslinuxBootloader) {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join(CONF_FILE), render_conf(&cfg(primary))).unwrap();
    let mut ld = vec![0x90u8; 4096];
    ld.extend_from_slice(&Adv::empty().0);
    std::fs::write(d.path().join(LDLINUX_FILE), ld).unwrap();
    let s = SyslinuxBootloader::new(d.path());
    (d, s)
}

#[test]
fn render_conf_has_labels_default_and_args() {
    let t = render_conf(&cfg(Slot::B));
    assert!(t.starts_with("SERIAL 0 115200\n"));
    assert!(t.contains("\nDEFAULT b\n"));
    assert!(t.contains("LABEL a\n  LINUX /a/vmlinuz\n  INITRD /a/initrd\n  APPEND root=/dev/vda4 console=ttyS0 k3os.slot=A panic=10\n"));
    assert!(t.contains("APPEND root=/dev/vda4 console=ttyS0 k3os.slot=B panic=10\n"));
    assert!(t.contains("# k3os-state: primary=B a=bad b=good"));
    assert!(t.contains("PROMPT 1\nTIMEOUT 30\n"));
    let t0 = render_conf(&SyslinuxConfig {
        timeout_tenths: 0,
        serial: false,
        ..cfg(Slot::A)
    });
    assert!(t0.contains("PROMPT 0\n") && !t0.contains("TIMEOUT") && !t0.contains("SERIAL"));
}

#[test]
fn adv_empty_is_valid_and_set_round_trips() {
    let mut a = Adv::empty();
    assert!(Adv::copy_valid(&a.0[..ADV_SIZE]));
    assert_eq!(a.boot_once(), None);
    a.set(2, b"menu").unwrap();
    a.set(ADV_BOOTONCE, b"b").unwrap();
    assert_eq!(a.boot_once().as_deref(), Some("b"));
    a.set(ADV_BOOTONCE, b"a").unwrap();
    assert_eq!(a.get(2), Some(&b"menu"[..]));
    assert_eq!(&a.0[8..16], &[2, 4, b'm', b'e', b'n', b'u', 1, 1]);
    a.set(ADV_BOOTONCE, b"").unwrap();
    assert_eq!(a.boot_once(), None);
    assert!(Adv::copy_valid(&a.0[ADV_SIZE..]));
    let mut torn = a.0;
    torn[100] ^= 1;
    assert!(!Adv::copy_valid(&torn[..ADV_SIZE]));
    assert_eq!(
        Adv::load(&torn),
        (a.clone(), true),
        "copy 1 is used when copy 0 is bad"
    );
    torn[ADV_SIZE + 100] ^= 1;
    assert_eq!(Adv::load(&torn), (Adv::empty(), false));
    assert!(a.set(ADV_BOOTONCE, &[b'x'; 256]).is_err());
}

#[test]
fn trial_cycle_reads_as_the_contract_says() {
    let (_d, s) = setup(Slot::A);
    assert_eq!(
        s.read().unwrap(),
        BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad
        }
    );
    s.try_slot(Slot::B, 3).unwrap();
    let v = s.view().unwrap();
    assert_eq!(
        v.env,
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Trying { tries_left: 1 }
        }
    );
    assert_eq!((v.choice, v.once), (Slot::B, Some(Slot::B)));
    assert!(
        s.read_conf().unwrap().contains("\nDEFAULT a\n"),
        "DEFAULT stays on the good slot during a trial"
    );
    // The loader consumes the record (as syslinux does before booting it).
    let (raw, off) = s.read_adv_raw().unwrap();
    let (mut adv, _) = Adv::load(&raw);
    adv.set(ADV_BOOTONCE, b"").unwrap();
    crate::atomic::write_at(s.ldlinux_path(), off, &adv.0).unwrap();
    let v = s.view().unwrap();
    assert_eq!(v.env.b, SlotBoot::Trying { tries_left: 0 });
    assert_eq!(v.choice, Slot::A, "exhausted trial falls back to DEFAULT");
    s.mark_good(Slot::B).unwrap();
    let v = s.view().unwrap();
    assert_eq!(
        v.env,
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Good
        }
    );
    assert_eq!((v.choice, v.once), (Slot::B, None));
    assert!(s.read_conf().unwrap().contains("\nDEFAULT b\n"));
    s.mark_bad(Slot::A).unwrap();
    assert_eq!(s.read().unwrap().a, SlotBoot::Bad);
    assert_eq!(s.max_tries(), 1);
}

#[test]
fn choice_equals_next_boot_for_every_representable_state() {
    let (_d, s) = setup(Slot::A);
    let states = [
        SlotBoot::Good,
        SlotBoot::Bad,
        SlotBoot::Trying { tries_left: 0 },
        SlotBoot::Trying { tries_left: 1 },
    ];
    for primary in Slot::ALL {
        for a in states {
            for b in states {
                let env = BootEnv { primary, a, b };
                s.install(&env).unwrap();
                assert_eq!(s.view().unwrap().choice, env.next_boot(), "{env:?}");
            }
        }
    }
}

#[test]
fn missing_files_are_named() {
    let d = tempfile::tempdir().unwrap();
    let s = SyslinuxBootloader::new(d.path());
    let e = s.read().unwrap_err().to_string();
    assert!(e.contains("extlinux.conf"), "{e}");
    std::fs::write(d.path().join(CONF_FILE), render_conf(&cfg(Slot::A))).unwrap();
    let e = s.read().unwrap_err().to_string();
    assert!(
        e.contains("ldlinux.sys") && e.contains("extlinux --install"),
        "{e}"
    );
    std::fs::write(d.path().join(LDLINUX_FILE), [0u8; 100]).unwrap();
    let e = s.read().unwrap_err().to_string();
    assert!(e.contains("found 100"), "{e}");
    std::fs::write(d.path().join(LDLINUX_FILE), [0u8; 2048]).unwrap();
    std::fs::write(d.path().join(CONF_FILE), "DEFAULT linux\n").unwrap();
    let e = s.read().unwrap_err().to_string();
    assert!(e.contains("DEFAULT a"), "{e}");
}

#[test]
fn conf_without_state_line_reads_default_good() {
    let (d, s) = setup(Slot::A);
    std::fs::write(
        d.path().join(CONF_FILE),
        "SERIAL 0 115200\nDEFAULT b\nLABEL a\n  LINUX /a\nLABEL b\n  LINUX /b\n",
    )
    .unwrap();
    assert_eq!(
        s.read().unwrap(),
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Bad,
            b: SlotBoot::Good
        }
    );
    s.mark_good(Slot::A).unwrap();
    let t = s.read_conf().unwrap();
    assert!(t.starts_with("SERIAL 0 115200\n"), "{t}");
    assert!(
        t.contains("\nDEFAULT a\n# k3os-state: primary=A a=good b=good\nLABEL a"),
        "{t}"
    );
}

#[test]
fn a_slots_root_hash_goes_on_its_append_line_and_survives_a_script_install() {
    let (d, s) = setup(Slot::A);
    s.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    let h = "ab".repeat(32);
    assert_eq!(s.verity(Slot::B).unwrap(), None);
    assert!(s.set_verity(Slot::B, Some(&h)).unwrap());
    let conf = std::fs::read_to_string(d.path().join(CONF_FILE)).unwrap();
    assert!(
        conf.contains(&format!(
            "APPEND root=/dev/vda4 console=ttyS0 k3os.slot=B panic=10 k3os.verity={h}\n"
        )),
        "{conf}"
    );
    assert!(conf.contains("APPEND root=/dev/vda4 console=ttyS0 k3os.slot=A panic=10\n"));
    assert_eq!(s.verity(Slot::B).unwrap().as_deref(), Some(&*h));
    assert_eq!(s.verity(Slot::A).unwrap(), None);
    // A trial and a release's conf installed later keep it; a new hash replaces it.
    s.try_slot(Slot::B, 1).unwrap();
    assert!(s.install_script(&render_conf(&cfg(Slot::A))).is_ok());
    assert_eq!(s.verity(Slot::B).unwrap().as_deref(), Some(&*h));
    let h2 = "cd".repeat(32);
    s.set_verity(Slot::B, Some(&h2)).unwrap();
    let conf = std::fs::read_to_string(d.path().join(CONF_FILE)).unwrap();
    assert_eq!(conf.matches("k3os.verity=").count(), 1, "{conf}");
    assert_eq!(s.verity(Slot::B).unwrap().as_deref(), Some(&*h2));
    // A malformed hash: refused, nothing written.
    let e = s
        .set_verity(Slot::A, Some("AB CD"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("extlinux.conf") && e.contains("nothing was written"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join(CONF_FILE)).unwrap(),
        conf
    );
    s.set_verity(Slot::B, None).unwrap();
    assert_eq!(s.verity(Slot::B).unwrap(), None);
    assert!(!std::fs::read_to_string(d.path().join(CONF_FILE))
        .unwrap()
        .contains("k3os.verity"));
}
