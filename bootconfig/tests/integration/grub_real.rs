//! The generated grub.cfg against the real GRUB: `grub-script-check` parses it, and Debian's
//! `grub-emu` runs its selection script and menu on an ext4 disk image holding our env files
//! (including torn ones), with `save_env` writing through the image's block lists. Every result
//! is compared with `bootconfig::simulate_boot`, the model the power-cut tests use.
//! Fails (never skips) when grub-common, grub-emu or e2fsprogs are missing.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use crate::common;

use std::path::Path;
use std::time::Instant;

use bootconfig::WriteOp;
use bootconfig::{
    render_cfg, render_signed_cfg, simulate_boot, BootEntry, GrubBootloader, GrubConfig,
    MENU_MARKER,
};
use bootconfig::{BootEnv, Bootloader, Slot, SlotBoot};
use common::{after_cut, all_envs, copy_tree, cuts_for, damage, run, run_ok};

fn cfg(max_tries: u8, serial: bool, timeout_secs: u32) -> GrubConfig {
    let e = |s: &str, dev: u8| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd.img"),
        cmdline: format!("root=/dev/vda{dev} ro console=ttyS0,115200 k3os.mode=disk"),
    };
    GrubConfig {
        entries: [e("a", 4), e("b", 5)],
        max_tries,
        timeout_secs,
        serial,
        panic_secs: 10,
    }
}

#[test]
fn render_cfg_passes_grub_script_check() {
    let d = tempfile::tempdir().unwrap();
    for (max, serial) in [(1, false), (3, true), (9, false), (255, true)] {
        let f = d.path().join(format!("grub-{max}.cfg"));
        std::fs::write(&f, render_cfg(&cfg(max, serial, 3))).unwrap();
        let out = run("grub-script-check", "grub-common", &[f.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "grub-script-check rejected {}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // And it does catch a broken script (so the check above can fail).
    let f = d.path().join("broken.cfg");
    std::fs::write(&f, "if [ a = b ]; then\n").unwrap();
    assert!(
        !run("grub-script-check", "grub-common", &[f.to_str().unwrap()])
            .status
            .success()
    );
}

/// The signed image's chooser script parses too (it is built into the GRUB image, where a
/// syntax error would be found only at boot).
#[test]
fn render_signed_cfg_passes_grub_script_check() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("signed.cfg");
    let images = ["(hd0,gpt3)/a/k3os.efi", "(hd0,gpt3)/b/k3os.efi"];
    std::fs::write(
        &f,
        render_signed_cfg(&cfg(3, true, 0), "(hd0,gpt3)/grub/k3os", images),
    )
    .unwrap();
    let out = run("grub-script-check", "grub-common", &[f.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "grub-script-check rejected {}: {}",
        f.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rendered grub.cfg (`text`) with each entry's `linux`/`initrd` replaced by a report and
/// `halt`, so grub-emu boots the default entry through the real menu and stops; serial
/// commands (grub-emu has no serial port) dropped.
fn emu_cfg(text: &str) -> String {
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("serial ") && !l.starts_with("terminal_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (script, menu) = text
        .split_once(MENU_MARKER)
        .expect("render_cfg has the menu marker");
    // Report what the script saw after its range checks, before the choice and countdown.
    let mut out = script.replacen(
        "# Choice (BootEnv::next_boot)",
        "echo \"K3OS-SEEN ${K3OS_PRIMARY} ${K3OS_A} ${K3OS_A_TRIES} ${K3OS_B} ${K3OS_B_TRIES}\"\n# Choice (BootEnv::next_boot)",
        1,
    );
    assert!(
        out.contains("K3OS-SEEN"),
        "render_cfg lost the choice comment this test hooks into"
    );
    let mut slot = "";
    for line in menu.lines() {
        if line.contains("--id k3os-A") {
            slot = "A";
        } else if line.contains("--id k3os-B") {
            slot = "B";
        }
        if let Some(args) = line.trim_start().strip_prefix("linux ") {
            // One word per line (the emulated terminal wraps at 80 columns): the words GRUB
            // hands `linux`, which joins them with spaces into the kernel command line.
            out.push_str(&format!(
                "  for k3os_w in {args}; do echo \"K3OS-ARG ${{k3os_w}}\"; done\n"
            ));
            out.push_str(&format!(
                "  echo \"K3OS-BOOTED {slot} copy=${{k3os_copy}}\"\n"
            ));
        } else if line.trim_start().starts_with("initrd ") {
            out.push_str("  halt\n");
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

struct Emu {
    /// The booted entry's kernel path and arguments, as GRUB expanded them, space-joined.
    linux: String,
    /// `K3OS-SEEN` line: primary, A state, A tries, B state, B tries after range checks.
    seen: String,
    booted: Slot,
    copy: String,
    /// Env files after the boot, read back from the image (None: absent).
    files: Vec<(String, Option<Vec<u8>>)>,
}

const FILES: [&str; 5] = ["lock1", "env1", "lock2", "env2", "good"];

/// Boot grub-emu on an ext4 image whose /grub holds the k3os/ files of `grub_dir`, running the
/// script `grub_dir/grub.cfg` when there is one (a node made by an earlier release), else
/// today's [`render_cfg`].
fn emu_boot(grub_dir: &Path, max: u8) -> Emu {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    copy_tree(grub_dir, &root.join("grub"));
    let text = std::fs::read_to_string(grub_dir.join("grub.cfg"))
        .unwrap_or_else(|_| render_cfg(&cfg(max, false, 0)));
    std::fs::write(root.join("grub/grub.cfg"), emu_cfg(&text)).unwrap();
    let img = work.path().join("disk.img");
    let img_s = img.to_str().unwrap();
    run_ok(
        "mkfs.ext4",
        "e2fsprogs",
        &[
            "-q",
            "-F",
            "-O",
            "^metadata_csum,^64bit",
            "-d",
            root.to_str().unwrap(),
            img_s,
            "8M",
        ],
    );
    let map = work.path().join("device.map");
    std::fs::write(&map, format!("(hd0) {img_s}\n")).unwrap();
    let out = run(
        "timeout",
        "coreutils",
        &[
            "60",
            "grub-emu",
            "-m",
            map.to_str().unwrap(),
            "-r",
            "hd0",
            "-d",
            "/grub",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code() != Some(127),
        "grub-emu (Debian package grub-emu) must be installed to run this test: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .split(['\n', '\r'])
        .find_map(|l| {
            l.find("K3OS-BOOTED ")
                .map(|i| l[i + "K3OS-BOOTED ".len()..].to_string())
        })
        .unwrap_or_else(|| {
            panic!(
                "grub-emu booted no k3os entry ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let mut words = line.split_whitespace();
    let booted: Slot = words.next().unwrap().parse().unwrap();
    let copy = words
        .next()
        .unwrap()
        .trim_start_matches("copy=")
        .to_string();
    let files = FILES
        .iter()
        .map(|f| {
            let o = run(
                "debugfs",
                "e2fsprogs",
                &["-R", &format!("cat /grub/k3os/{f}"), img_s],
            );
            let present = !String::from_utf8_lossy(&o.stderr).contains("File not found");
            (f.to_string(), present.then_some(o.stdout))
        })
        .collect();
    let seen = stdout
        .split(['\n', '\r'])
        .find_map(|l| {
            l.find("K3OS-SEEN ")
                .map(|i| l[i + "K3OS-SEEN ".len()..].trim().to_string())
        })
        .unwrap_or_else(|| panic!("grub-emu printed no K3OS-SEEN line:\n{stdout}"));
    // The terminal wraps at 80 columns, also inside a word (a root hash): join the lines from
    // the first word to the BOOTED line, then split at the markers.
    let args = stdout
        .find("K3OS-ARG")
        .map_or("", |i| &stdout[i..])
        .split("K3OS-BOOTED")
        .next()
        .unwrap_or("")
        .replace(['\n', '\r'], "");
    let linux = args
        .split("K3OS-ARG")
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Emu {
        linux,
        seen,
        booted,
        copy,
        files,
    }
}

fn read_files(grub_dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    FILES
        .iter()
        .map(|f| {
            (
                f.to_string(),
                std::fs::read(grub_dir.join("k3os").join(f)).ok(),
            )
        })
        .collect()
}

/// Boot the real GRUB on the state in `grub_dir` and check it against the model: same slot,
/// same copy, and the same bytes in every env file afterwards (countdown included).
fn check_against_model(grub_dir: &Path, max: u8) -> Slot {
    let sim = simulate_boot(grub_dir, max).unwrap();
    let emu = emu_boot(grub_dir, max);
    let copy = sim.source.to_string();
    let word = |s: SlotBoot| match s {
        SlotBoot::Good => ("good", 0),
        SlotBoot::Trying { tries_left } => ("try", tries_left),
        SlotBoot::Bad => ("bad", 0),
    };
    let (sa, ta) = word(sim.seen.a);
    let (sb, tb) = word(sim.seen.b);
    let seen = format!("{} {sa} {ta} {sb} {tb}", sim.seen.primary);
    assert_eq!(
        emu.seen,
        seen,
        "state seen by real GRUB vs model on {}",
        grub_dir.display()
    );
    assert_eq!(
        (emu.booted, emu.copy.as_str()),
        (sim.choice, copy.as_str()),
        "real GRUB vs model on {}",
        grub_dir.display()
    );
    let after = tempfile::tempdir().unwrap();
    copy_tree(grub_dir, after.path());
    for op in &sim.countdown {
        let rel = op.path().strip_prefix(grub_dir).unwrap();
        match op {
            WriteOp::InPlace { offset, data, .. } => WriteOp::InPlace {
                path: after.path().join(rel),
                offset: *offset,
                data: data.clone(),
            },
            WriteOp::Replace { data, .. } => WriteOp::Replace {
                path: after.path().join(rel),
                data: data.clone(),
            },
        }
        .apply()
        .unwrap();
    }
    assert_eq!(
        emu.files,
        read_files(after.path()),
        "env files after GRUB's countdown vs model"
    );
    emu.booted
}

#[test]
fn grub_emu_boots_next_boot_for_every_state_and_counts_down() {
    let started = Instant::now();
    let max = 2;
    let d = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(d.path(), max);
    let mut runs = 0;
    for env in all_envs(max) {
        g.install(&env).unwrap();
        let booted = check_against_model(d.path(), max);
        assert_eq!(booted, env.next_boot(), "{env:?}");
        runs += 1;
    }
    eprintln!("grub-emu: {runs} boots in {:?}", started.elapsed());
}

#[test]
fn grub_emu_trial_sequence_falls_back_after_max_tries() {
    let max = 3;
    let d = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(d.path(), max);
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    g.try_slot(Slot::B, 3).unwrap();
    let mut boots = Vec::new();
    for _ in 0..5 {
        let emu = emu_boot(d.path(), max);
        boots.push(emu.booted);
        // Carry the real GRUB's writes over to the next boot.
        for (f, bytes) in emu.files {
            std::fs::write(d.path().join("k3os").join(f), bytes.unwrap()).unwrap();
        }
    }
    assert_eq!(boots, [Slot::B, Slot::B, Slot::B, Slot::A, Slot::A]);
    assert_eq!(
        emu_boot(d.path(), max).linux,
        "/a/vmlinuz root=/dev/vda4 ro console=ttyS0,115200 k3os.mode=disk k3os.slot=A panic=10"
    );
    assert_eq!(
        g.read().unwrap(),
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Trying { tries_left: 0 }
        }
    );
    g.mark_good(Slot::A).unwrap();
    assert_eq!(emu_boot(d.path(), max).booted, Slot::A);
}

#[test]
fn grub_emu_handles_missing_and_garbage_env_files() {
    let max = 3;
    let d = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(d.path(), max);
    g.install(&BootEnv {
        primary: Slot::B,
        a: SlotBoot::Good,
        b: SlotBoot::Good,
    })
    .unwrap();
    let k = d.path().join("k3os");
    // Copy 1 gone: copy 2 is used.
    std::fs::remove_file(k.join("env1")).unwrap();
    assert_eq!(check_against_model(d.path(), max), Slot::B);
    // Lock 1 garbage: counts as editing.
    g.install(&BootEnv {
        primary: Slot::B,
        a: SlotBoot::Good,
        b: SlotBoot::Good,
    })
    .unwrap();
    std::fs::write(k.join("lock1"), [0u8; 1024]).unwrap();
    std::fs::write(
        k.join("env1"),
        b"# GRUB Environment Block\nK3OS_PRIMARY=A\n",
    )
    .unwrap();
    assert_eq!(check_against_model(d.path(), max), Slot::B);
    // Both copies gone: the last-good record (B, confirmed by install) boots.
    for f in ["env1", "env2", "lock1", "lock2"] {
        std::fs::remove_file(k.join(f)).unwrap();
    }
    assert_eq!(check_against_model(d.path(), max), Slot::B);
    // Everything gone: defaults (primary A, both bad) still boot something.
    std::fs::remove_file(k.join("good")).unwrap();
    assert_eq!(check_against_model(d.path(), max), Slot::A);
}

/// A damaged env copy that still loads must not cost the fallback, under the real GRUB:
/// `K3OS_A=good` → `K3OS_A=gXod` in env1. GRUB takes copy 2 and boots the trial slot, counting down in copy 2 only; with copy 2
/// damaged as well it boots the slot last confirmed good.
#[test]
fn grub_emu_a_damaged_copy_is_not_used_and_both_damaged_boot_the_last_good_slot() {
    let max = 3;
    let d = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(d.path(), max);
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    g.try_slot(Slot::B, 3).unwrap();
    let k = d.path().join("k3os");
    damage(&k.join("env1"), b"K3OS_A=good", b"K3OS_A=gXod");
    let emu = emu_boot(d.path(), max);
    assert_eq!((emu.booted, emu.copy.as_str()), (Slot::B, "2"));
    assert_eq!(emu.seen, "B good 0 try 3");
    assert_eq!(check_against_model(d.path(), max), Slot::B);
    damage(&k.join("env2"), b"K3OS_B_TRIES=3", b"K3OS_B_TRIES=7");
    let emu = emu_boot(d.path(), max);
    assert_eq!((emu.booted, emu.copy.as_str()), (Slot::A, "good"));
    assert_eq!(emu.seen, "A good 0 bad 0");
    assert_eq!(check_against_model(d.path(), max), Slot::A);
    // The next Rust write restores both copies from the state GRUB used.
    g.mark_bad(Slot::B).unwrap();
    assert!(g.integrity().unwrap().damaged.is_empty());
    let emu = emu_boot(d.path(), max);
    assert_eq!((emu.booted, emu.copy.as_str()), (Slot::A, "1"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Random damage to random bytes of one env copy or lock (aimed at the names and values),
    /// from a random state: the real GRUB agrees with the model byte for byte and boots what
    /// it booted before the damage (the other copy holds the same state).
    #[test]
    fn grub_emu_damage_to_one_copy_boots_as_before(
        env_index in 0usize..all_envs(2).len(),
        file in proptest::sample::select(vec!["env1", "env2", "lock1", "lock2"]),
        hits in proptest::collection::vec((0usize..160, proptest::prelude::any::<u8>()), 1..4),
    ) {
        let max = 2;
        let env = all_envs(max)[env_index].clone();
        let d = tempfile::tempdir().unwrap();
        let g = GrubBootloader::new(d.path(), max);
        g.install(&env).unwrap();
        let path = d.path().join("k3os").join(file);
        let mut b = std::fs::read(&path).unwrap();
        for (i, x) in hits {
            b[i] = x;
        }
        std::fs::write(&path, b).unwrap();
        let booted = check_against_model(d.path(), max);
        proptest::prop_assert_eq!(booted, env.next_boot(), "{:?}", env);
    }
}

/// A power cut at every byte class of every write of each Rust transaction, judged by the
/// real GRUB: it must boot the old or the new choice (and agree with the model).
#[test]
fn grub_emu_power_cut_during_rust_writes_boots_old_or_new() {
    let max = 3;
    let started = Instant::now();
    type Transaction = Box<dyn Fn(&GrubBootloader)>;
    let transactions: Vec<(BootEnv, Transaction)> = vec![
        (
            BootEnv {
                primary: Slot::A,
                a: SlotBoot::Good,
                b: SlotBoot::Bad,
            },
            Box::new(|g| g.try_slot(Slot::B, 3).unwrap()),
        ),
        (
            BootEnv {
                primary: Slot::B,
                a: SlotBoot::Good,
                b: SlotBoot::Trying { tries_left: 2 },
            },
            Box::new(|g| g.mark_good(Slot::B).unwrap()),
        ),
        (
            BootEnv {
                primary: Slot::B,
                a: SlotBoot::Good,
                b: SlotBoot::Good,
            },
            Box::new(|g| g.mark_bad(Slot::A).unwrap()),
        ),
    ];
    let mut runs = 0;
    for (before, tx) in transactions {
        let base = tempfile::tempdir().unwrap();
        let g = GrubBootloader::new(base.path(), max);
        g.install(&before).unwrap();
        let old = before.next_boot();
        let done = tempfile::tempdir().unwrap();
        copy_tree(base.path(), done.path());
        let gd = GrubBootloader::new(done.path(), max);
        tx(&gd);
        let new = gd.read().unwrap().next_boot();
        // Recover the transaction's writes by planning it the same way.
        let target = gd.read().unwrap();
        let ops = g.plan(&target).unwrap();
        for i in 0..ops.len() {
            for cut in cuts_for(base.path(), &ops, i) {
                let st = after_cut(base.path(), &ops, i, cut);
                let booted = check_against_model(st.path(), max);
                assert!(
                    booted == old || booted == new,
                    "op {i} cut {cut}: booted {booted}, old {old}, new {new}"
                );
                runs += 1;
            }
        }
    }
    eprintln!("grub-emu power-cut runs: {runs} in {:?}", started.elapsed());
}

/// A power cut while GRUB itself counts down (its own `save_env` writes, torn at every class
/// and inside the changed bytes): the real GRUB's next boot agrees with the model.
#[test]
fn grub_emu_power_cut_during_grub_countdown() {
    let max = 3;
    let base = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(base.path(), max);
    g.install(&BootEnv {
        primary: Slot::B,
        a: SlotBoot::Good,
        b: SlotBoot::Trying { tries_left: 1 },
    })
    .unwrap();
    let sim = simulate_boot(base.path(), max).unwrap();
    assert_eq!(sim.countdown.len(), 6);
    let mut runs = 0;
    for i in 0..sim.countdown.len() {
        for cut in cuts_for(base.path(), &sim.countdown, i) {
            let st = after_cut(base.path(), &sim.countdown, i, cut);
            let booted = check_against_model(st.path(), max);
            // Before the countdown B had its last try; after it, none: A.
            assert!(booted == Slot::B || booted == Slot::A);
            runs += 1;
        }
    }
    assert!(runs > 6 * 8);
}

/// Two faults under the real GRUB: copy 2 damaged, then GRUB's own countdown into copy 1 torn
/// at every byte class. GRUB agrees with the model and boots the trial slot (copy 1 intact,
/// before or after the countdown) or the last confirmed slot — never a slot marked bad.
#[test]
fn grub_emu_countdown_cut_with_the_other_copy_damaged() {
    let max = 3;
    let base = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(base.path(), max);
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    g.try_slot(Slot::B, 2).unwrap();
    damage(
        &base.path().join("k3os/env2"),
        b"K3OS_B_TRIES=2",
        b"K3OS_B_TRIES=9",
    );
    let sim = simulate_boot(base.path(), max).unwrap();
    assert_eq!(sim.choice, Slot::B);
    assert_eq!(sim.countdown.len(), 3, "copy 1 only: lock, env, lock");
    let mut runs = 0;
    for i in 0..sim.countdown.len() {
        for cut in common::CUTS {
            let st = after_cut(base.path(), &sim.countdown, i, cut);
            let booted = check_against_model(st.path(), max);
            assert!(booted == Slot::B || booted == Slot::A, "op {i} cut {cut}");
            runs += 1;
        }
    }
    assert_eq!(runs, 24);
}

/// The fixtures of a node made by v0.1.0 (its grub.cfg, its env copies), and the same node
/// after today's Rust wrote it, under the real GRUB running v0.1.0's script: GRUB agrees with
/// the model (script 1 rules, picked from the installed grub.cfg), counts down the way the
/// model says, and every state Rust writes under script 1 boots `next_boot`.
#[test]
fn grub_emu_runs_the_v010_script_as_modelled() {
    let max = 3;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0");
    let v1_cfg = std::fs::read_to_string(fixtures.join("grub.cfg")).unwrap();
    let mut runs = 0;
    for (state, boots) in [
        ("installed", Slot::A),
        ("trying-b", Slot::B),
        ("trying-b-counted", Slot::B),
        ("good-b", Slot::B),
    ] {
        let d = tempfile::tempdir().unwrap();
        copy_tree(&fixtures.join(state), d.path());
        std::fs::write(d.path().join("grub.cfg"), &v1_cfg).unwrap();
        assert_eq!(
            simulate_boot(d.path(), max).unwrap().script,
            bootconfig::GrubScript::V1
        );
        assert_eq!(check_against_model(d.path(), max), boots, "{state}");
        runs += 1;
    }
    // Today's writes (values, K3OS_CHECK, last-good record) under v0.1.0's script.
    let d = tempfile::tempdir().unwrap();
    copy_tree(&fixtures.join("installed"), d.path());
    std::fs::write(d.path().join("grub.cfg"), &v1_cfg).unwrap();
    let g = GrubBootloader::new(d.path(), max);
    for env in all_envs(max).into_iter().step_by(7) {
        g.install(&env).unwrap();
        assert_eq!(
            check_against_model(d.path(), max),
            env.next_boot(),
            "{env:?}"
        );
        runs += 1;
    }
    // A trial armed by today's Rust, counted down by v0.1.0's script to exhaustion.
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    g.try_slot(Slot::B, 3).unwrap();
    let mut boots = Vec::new();
    for _ in 0..4 {
        boots.push(check_against_model(d.path(), max));
        for op in simulate_boot(d.path(), max).unwrap().countdown {
            op.apply().unwrap();
        }
    }
    assert_eq!(boots, [Slot::B, Slot::B, Slot::B, Slot::A]);
    assert!(runs > 8);
}

#[test]
fn grub_emu_passes_each_slots_verity_root_hash_and_fails_closed_on_a_damaged_file() {
    let max = 2;
    let d = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(d.path(), max);
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    let plain =
        "/a/vmlinuz root=/dev/vda4 ro console=ttyS0,115200 k3os.mode=disk k3os.slot=A panic=10";
    assert_eq!(emu_boot(d.path(), max).linux, plain, "no file: as before");
    let hash = "0123456789abcdef".repeat(4);
    assert!(g.set_verity(Slot::B, Some(&hash)).unwrap());
    let emu = emu_boot(d.path(), max);
    assert_eq!(
        emu.linux, plain,
        "slot A boots without B's hash (and has none of its own)"
    );
    g.try_slot(Slot::B, max).unwrap();
    let emu = emu_boot(d.path(), max);
    assert_eq!(emu.booted, Slot::B);
    assert!(
        emu.linux
            .ends_with(&format!("k3os.slot=B panic=10 k3os.verity={hash}")),
        "{}",
        emu.linux
    );
    assert_eq!(g.verity(Slot::B).unwrap().as_deref(), Some(&*hash));
    // A damaged file: GRUB passes a value no initramfs accepts, as the model says.
    let f = d.path().join("k3os/verity-B");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[..4].copy_from_slice(b"XXXX");
    std::fs::write(&f, bytes).unwrap();
    let emu = emu_boot(d.path(), max);
    assert!(
        emu.linux.ends_with("k3os.verity=unreadable"),
        "{}",
        emu.linux
    );
    assert_eq!(g.verity(Slot::B).unwrap().as_deref(), Some("unreadable"));
    // Removed: slot B boots without dm-verity again.
    assert!(g.set_verity(Slot::B, None).unwrap());
    assert!(!emu_boot(d.path(), max).linux.contains("k3os.verity"));
}
