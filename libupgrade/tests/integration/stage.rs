//! Staging on a real GPT disk image: loop devices, ext4 boot partition, real squashfs images,
//! file and HTTP sources (with connections dropped half way and a process restart), and every
//! rejection leaving the active slot untouched.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use libupgrade::Release;
use std::path::Path;
use std::time::Duration;

use bootconfig::{Slot, SlotBoot};
use libupgrade::layout::GptLayout;
use libupgrade::manifest::Arch;
use libupgrade::state::SlotState;
use libupgrade::{Error, NoProgress, Source, StageOptions, Updater};
use testkit::*;

fn updater(disk: &TestDisk, cfg: libupgrade::Config, loader: &ModelLoader) -> Updater {
    let layout = GptLayout::open(&disk.disk.path, &disk.boot_dir).expect("GPT of the test disk");
    Updater::with_parts(cfg, Box::new(layout), Box::new(loader.clone()))
}

fn fast() -> StageOptions {
    StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    }
}

fn assert_tree_eq(a: &Path, b: &Path) {
    let out = std::process::Command::new("diff")
        .arg("-r")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trees differ: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Stage `rel` and prove the slot holds exactly the release: mount rootfs-b read-only and
/// compare with the source tree; compare kernel and initrd bytes.
fn assert_staged(disk: &TestDisk, rel: &Path, tree: &Path) {
    let mnt = disk.dir.path().join("mnt-b");
    let (_lp, m) = disk.mount_rootfs("rootfs-b", &mnt);
    assert_tree_eq(tree, &mnt);
    sys_mount::Unmount::unmount(&m, sys_mount::UnmountFlags::empty()).unwrap();
    assert_eq!(
        std::fs::read(disk.boot_dir.join("b/vmlinuz")).unwrap(),
        std::fs::read(rel.join("vmlinuz")).unwrap()
    );
    assert_eq!(
        std::fs::read(disk.boot_dir.join("b/initrd")).unwrap(),
        std::fs::read(rel.join("initrd")).unwrap()
    );
}

#[test]
fn stage_from_a_directory_writes_the_inactive_slot_only() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = make_release(&k, rels.path(), "v2", 2, 3 * MIB as usize, Arch::host());
    let cfg = disk.config(&k.trust);
    let loader = ModelLoader::new(9);
    let u = updater(&disk, cfg, &loader);
    let a_before = disk.part_bytes("rootfs-a", 4 * MIB);

    let r = u
        .stage(
            &Release::at(Source::Path(rel.clone())),
            &fast(),
            &NoProgress,
        )
        .unwrap();
    assert_eq!(
        (r.slot, r.version.as_str(), r.generation, r.already_staged),
        (Slot::B, "v2", 2, false)
    );
    assert_staged(&disk, &rel, &rels.path().join("v2.tree"));
    assert_eq!(
        disk.part_bytes("rootfs-a", 4 * MIB),
        a_before,
        "the active slot was written"
    );

    let st = u.status().unwrap();
    assert_eq!(st.booted, Some(Slot::A));
    assert_eq!(st.slots[1].state, SlotState::Staged);
    assert_eq!(
        st.slots[0].state,
        SlotState::Good,
        "slot A was bootstrapped from its release file"
    );
    assert_eq!(
        st.next_boot,
        Slot::A,
        "staging alone never changes what boots"
    );
    // Staging the same release again is a no-op.
    assert!(
        u.stage(&Release::at(Source::Path(rel)), &fast(), &NoProgress)
            .unwrap()
            .already_staged
    );
}

#[test]
fn http_stage_survives_dropped_connections_and_resumes_with_range() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = make_release(&k, rels.path(), "v2", 2, 6 * MIB as usize, Arch::host());
    let srv = TestServer::start(rels.path().to_path_buf(), 3);
    let loader = ModelLoader::new(9);
    let u = updater(&disk, disk.config(&k.trust), &loader);
    let r = u
        .stage(
            &Release::at(Source::parse(&format!("{}v2/", srv.base))),
            &fast(),
            &NoProgress,
        )
        .unwrap();
    assert!(!r.resumed);
    assert_staged(&disk, &rel, &rels.path().join("v2.tree"));
    let reqs = srv.requests();
    assert!(
        reqs.iter()
            .any(|r| r.is_get_of("rootfs.squashfs") && r.range.is_some()),
        "no Range request was made: {reqs:?}"
    );
    assert_eq!(srv.drops.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn a_restarted_process_resumes_from_the_checkpoint_instead_of_starting_over() {
    let disk = TestDisk::new(64 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    // Larger than one 16 MiB checkpoint, so the first attempt leaves a durable checkpoint.
    let rel = make_release(&k, rels.path(), "v2", 2, 40 * MIB as usize, Arch::host());
    let srv = TestServer::start(rels.path().to_path_buf(), 1);
    let loader = ModelLoader::new(9);
    let mut cfg = disk.config(&k.trust);
    cfg.download_retries = 0;
    let u = updater(&disk, cfg.clone(), &loader);
    let src = Source::parse(&format!("{}v2", srv.base));
    let e = u
        .stage(&Release::at(src.clone()), &fast(), &NoProgress)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Fetch {
                retryable: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("rootfs.squashfs"), "{e}");
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
    assert_eq!(
        loader.env().b,
        SlotBoot::Bad,
        "a half-written slot must be bad in the loader"
    );

    // "Restart": a new Updater, as after a reboot or agent restart.
    cfg.download_retries = 5;
    let u2 = updater(&disk, cfg, &loader);
    let r = u2
        .stage(&Release::at(src.clone()), &fast(), &NoProgress)
        .unwrap();
    assert!(r.resumed, "did not resume");
    let total = std::fs::metadata(rel.join("rootfs.squashfs"))
        .unwrap()
        .len();
    assert!(
        r.bytes_written < total,
        "resumed run rewrote everything ({} of {total})",
        r.bytes_written
    );
    let reqs = srv.requests();
    // Range requests for the rootfs after the first (the probes ask for byte 0 only). The
    // server dropped the first body half way: the chunked resume re-verifies the target and
    // asks again from the chunk that was in flight (at most one max-size chunk before the drop).
    let resumed_at: Vec<u64> = reqs
        .iter()
        .filter(|r| r.is_get_of("/v2/rootfs.squashfs") && r.range != Some((0, Some(0))))
        .filter_map(|r| Some(r.range?.0))
        .filter(|n| *n > 0)
        .collect();
    assert!(
        matches!(resumed_at[..], [n] if n + u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max) >= total / 2 && n < total),
        "{reqs:?}"
    );
    assert_staged(&disk, &rel, &rels.path().join("v2.tree"));
}

/// Every rejection before writing: nothing at all changes (state, loader, both partitions).
#[test]
fn rejected_releases_write_nothing() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let other = keys();
    let rels = tempfile::tempdir().unwrap();
    let loader = ModelLoader::new(9);
    let cfg = disk.config(&k.trust);
    let u = updater(&disk, cfg.clone(), &loader);
    let b_before = disk.part_bytes("rootfs-b", MIB);
    let env_before = loader.env().clone();

    let foreign = if Arch::host() == Arch::X86_64 {
        Arch::Aarch64
    } else {
        Arch::X86_64
    };
    let wrong_arch = make_release(&k, rels.path(), "v2-arch", 2, 1000, foreign);
    let wrong_key = make_release(&other, rels.path(), "v2-key", 2, 1000, Arch::host());
    let unsigned = make_release(&k, rels.path(), "v2-unsigned", 2, 1000, Arch::host());
    std::fs::remove_file(unsigned.join("manifest.json.sig")).unwrap();
    let old = make_release(&k, rels.path(), "v0", 0, 1000, Arch::host());
    let tampered_manifest = make_release(&k, rels.path(), "v2-tm", 2, 1000, Arch::host());
    let m = std::fs::read_to_string(tampered_manifest.join("manifest.json")).unwrap();
    std::fs::write(
        tampered_manifest.join("manifest.json"),
        m.replace("\"generation\": 2", "\"generation\": 9"),
    )
    .unwrap();
    let huge = make_release(
        &k,
        rels.path(),
        "v2-huge",
        2,
        30 * MIB as usize,
        Arch::host(),
    );

    // Bootstrap the state as a node does on its first boot.
    u.confirm().ok();
    let state_before = std::fs::read(disk.state_dir.join("state.json")).unwrap();

    let cases: Vec<(&Path, &str)> = vec![
        (&wrong_arch, "aarch64"),
        (&wrong_key, "trust"),
        (&unsigned, "not signed"),
        (&old, "older than the installed generation 1"),
        (&tampered_manifest, "signature"),
        (&huge, "not enough space for the rootfs"),
    ];
    for (rel, want) in cases {
        let e = u
            .stage(
                &Release::at(Source::Path(rel.to_path_buf())),
                &fast(),
                &NoProgress,
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(want),
            "{}: error '{e}' does not mention '{want}'",
            rel.display()
        );
        assert_eq!(
            std::fs::read(disk.state_dir.join("state.json")).unwrap(),
            state_before,
            "{}: state changed",
            rel.display()
        );
        assert_eq!(
            *loader.env(),
            env_before,
            "{}: bootloader changed",
            rel.display()
        );
        assert_eq!(
            disk.part_bytes("rootfs-b", MIB),
            b_before,
            "{}: slot B written",
            rel.display()
        );
    }
    // The downgrade goes through when explicitly allowed.
    let opts = StageOptions {
        allow_downgrade: true,
        ..fast()
    };
    assert_eq!(
        u.stage(&Release::at(Source::Path(old)), &opts, &NoProgress)
            .unwrap()
            .generation,
        0
    );
    // 404 names the file.
    let srv = TestServer::start(rels.path().to_path_buf(), 0);
    let e = u
        .stage(
            &Release::at(Source::parse(&format!("{}nope/", srv.base))),
            &fast(),
            &NoProgress,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope/manifest.json") && e.contains("404"), "{e}");
}

/// Bad bytes found while writing: the slot stays invalid, the loader never boots it, the
/// active slot is untouched, and the error names the file with expected and found values.
#[test]
fn corrupt_or_truncated_artifacts_leave_the_slot_invalid() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let loader = ModelLoader::new(9);
    let u = updater(&disk, disk.config(&k.trust), &loader);
    let a_before = disk.part_bytes("rootfs-a", MIB);

    let bad = make_release(&k, rels.path(), "v2-bad", 2, 2 * MIB as usize, Arch::host());
    let p = bad.join("rootfs.squashfs");
    let mut bytes = std::fs::read(&p).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&p, &bytes).unwrap();
    let e = u
        .stage(
            &Release::at(Source::Path(bad.clone())),
            &fast(),
            &NoProgress,
        )
        .unwrap_err();
    let msg = e.to_string();
    // With a chunk index the flipped byte is caught in its chunk, before it is written.
    assert!(
        matches!(e, Error::Checksum { .. } | Error::ChunkDigest { .. })
            && msg.contains("rootfs")
            && msg.contains("expected")
            && msg.contains("found"),
        "{msg}"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
    assert_eq!(loader.env().b, SlotBoot::Bad);
    assert!(u.activate().is_err(), "an invalid slot was activated");
    assert_eq!(disk.part_bytes("rootfs-a", MIB), a_before);

    let short = make_release(
        &k,
        rels.path(),
        "v2-short",
        2,
        2 * MIB as usize,
        Arch::host(),
    );
    let p = short.join("initrd");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let e = u
        .stage(
            &Release::at(Source::Path(short.clone())),
            &fast(),
            &NoProgress,
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::Size { found, expected, .. } if found == len / 2 && expected == len),
        "{e}"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
    assert!(
        !disk.boot_dir.join("b/initrd").exists(),
        "a truncated initrd was put in place"
    );

    // Over HTTP, a file shorter than the manifest says is found by the preflight probe, before
    // a byte of any artifact is downloaded.
    let srv = TestServer::start(rels.path().to_path_buf(), 0);
    let mut cfg = disk.config(&k.trust);
    cfg.download_retries = 2;
    let u = updater(&disk, cfg, &loader);
    let e = u
        .stage(
            &Release::at(Source::parse(&format!("{}v2-short/", srv.base))),
            &fast(),
            &NoProgress,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("initrd") && e.contains("expected 200000 bytes, got 100000"),
        "{e}"
    );
    let reqs = srv.requests();
    assert!(
        reqs.iter()
            .all(|r| r.range.is_none() || r.range == Some((0, Some(0)))),
        "only the manifest, signature and byte-0 probes were requested: {reqs:?}"
    );
    assert_eq!(disk.part_bytes("rootfs-a", MIB), a_before);
}

#[test]
fn a_release_that_is_not_a_squashfs_is_refused_before_it_is_staged() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let junk = work.path().join("rootfs.squashfs");
    std::fs::write(&junk, pseudo_random(MIB as usize, 7)).unwrap();
    std::fs::write(work.path().join("k"), b"kernel").unwrap();
    std::fs::write(work.path().join("i"), b"initrd").unwrap();
    // `release create` refuses a rootfs that is not a squashfs, so sign one by hand, as a
    // careless or hostile publisher could.
    let dir = rels.path().join("v2");
    std::fs::create_dir_all(&dir).unwrap();
    let entry = |src: &Path, name: &str| {
        std::fs::copy(src, dir.join(name)).unwrap();
        let (size, sha256) = libupgrade::release::sha256_file(src).unwrap();
        libupgrade::manifest::FileEntry {
            path: name.into(),
            size,
            sha256,
            chunks: None,
            patches: Vec::new(),
        }
    };
    let m = libupgrade::manifest::Manifest {
        format: libupgrade::manifest::FORMAT,
        version: "v2".into(),
        arch: Arch::host(),
        generation: 2,
        files: libupgrade::manifest::Files {
            rootfs: entry(&junk, "rootfs.squashfs"),
            kernel: entry(&work.path().join("k"), "vmlinuz"),
            initrd: entry(&work.path().join("i"), "initrd"),
        },
        boot: None,
        payloads: Vec::new(),
        verity: None,
    };
    std::fs::write(dir.join("manifest.json"), m.to_bytes()).unwrap();
    std::fs::write(
        dir.join("manifest.json.sig"),
        libupgrade::signing::sign(&m.to_bytes(), &k.secret).unwrap(),
    )
    .unwrap();
    let loader = ModelLoader::new(9);
    let u = updater(&disk, disk.config(&k.trust), &loader);
    let e = u
        .stage(&Release::at(Source::Path(dir)), &fast(), &NoProgress)
        .unwrap_err();
    assert!(matches!(e, Error::BadImage { slot: Slot::B, .. }), "{e}");
    assert!(e.to_string().contains("squashfs"), "{e}");
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
}

/// The whole cycle on the disk with the real GRUB backend (two env copies on the ext4 boot
/// partition): each "power-on" runs bootconfig's model of our grub.cfg, including the countdown
/// writes GRUB's save_env performs, which bootconfig checks against the real GRUB (grub-emu).
#[test]
fn grub_on_disk_trial_confirm_and_fallback() {
    use bootconfig::BootEnv;
    use bootconfig::{simulate_boot, GrubBootloader};
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let v2 = make_release(&k, rels.path(), "v2", 2, MIB as usize, Arch::host());
    let v3 = make_release(&k, rels.path(), "v3", 3, MIB as usize, Arch::host());
    let grub_dir = disk.boot_dir.join("grub");
    std::fs::create_dir_all(&grub_dir).unwrap();
    let entry = |s: &str| bootconfig::BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: format!("root=PARTLABEL=rootfs-{s} ro"),
    };
    let grub_cfg = bootconfig::GrubConfig {
        entries: [entry("a"), entry("b")],
        max_tries: 3,
        timeout_secs: 0,
        serial: true,
        panic_secs: 5,
    };
    std::fs::write(grub_dir.join("grub.cfg"), bootconfig::render_cfg(&grub_cfg)).unwrap();
    GrubBootloader::new(&grub_dir, 3)
        .install(&BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        })
        .unwrap();
    let cfg = disk.config(&k.trust);
    let mk = || Updater::open(cfg.clone()).expect("open the node from its config");
    let mut boots = 0;
    let mut power_on = |cfg: &libupgrade::Config| {
        let sim = simulate_boot(&grub_dir, 3).unwrap();
        for op in &sim.countdown {
            op.apply().unwrap();
        }
        boots += 1;
        boot_as(cfg, sim.choice, &format!("boot-{boots}"));
        sim.choice
    };

    mk().confirm().expect_good("confirm");
    mk().stage(&Release::at(Source::Path(v2)), &fast(), &NoProgress)
        .unwrap();
    mk().activate().unwrap();
    assert_eq!(mk().status().unwrap().slots[1].tries_left, Some(3));
    assert_eq!(power_on(&cfg), Slot::B);
    assert_eq!(
        mk().status().unwrap().slots[1].tries_left,
        Some(2),
        "GRUB counted one try"
    );
    std::fs::write(&cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
    mk().confirm().expect_good("confirm");
    assert_eq!(power_on(&cfg), Slot::B, "confirmed B keeps booting");
    assert_eq!(mk().status().unwrap().slots[1].boot, SlotBoot::Good);

    // v3 into A; it never confirms: three tries, then GRUB falls back to B.
    mk().stage(&Release::at(Source::Path(v3)), &fast(), &NoProgress)
        .unwrap();
    mk().activate().unwrap();
    for _ in 0..3 {
        assert_eq!(power_on(&cfg), Slot::A);
    }
    assert_eq!(power_on(&cfg), Slot::B);
    let r = mk().confirm().expect_good("confirm");
    assert!(r.other_slot.unwrap().why.contains("3 of 3 tries"));
    let st = mk().status().unwrap();
    assert_eq!(
        (st.slots[0].state, st.slots[0].boot),
        (SlotState::Bad, SlotBoot::Bad)
    );
    assert_eq!(st.next_boot, Slot::B);
}

/// A cut after an artifact's temp file was renamed into place but before the checkpoint
/// recorded it: the checkpoint still says "kernel, N bytes" while no temp file exists. Resume
/// must start that file over, not extend a missing file with zeros (found by the QEMU
/// power-cut scenario at the `artifact-renamed` barrier).
#[test]
fn resume_after_a_cut_between_rename_and_checkpoint_starts_the_file_over() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    // A tiny rootfs (under the server's 64 KiB drop threshold), so the dropped body is the kernel.
    let rel = make_release(&k, rels.path(), "v2", 2, 1000, Arch::host());
    let srv = TestServer::start(rels.path().to_path_buf(), 0);
    let loader = ModelLoader::new(9);
    let mut cfg = disk.config(&k.trust);
    // Stopped in the middle of the kernel by a byte budget: a stop keeps the partial file and
    // its checkpoint, as the process killed by a power cut would (a failure discards them).
    let src = Source::parse(&format!("{}v2/", srv.base));
    let budget = StageOptions {
        max_bytes: Some(1000 + (200 << 10)),
        ..fast()
    };
    let e = updater(&disk, cfg.clone(), &loader)
        .stage(&Release::at(src.clone()), &budget, &NoProgress)
        .unwrap_err();
    assert!(matches!(e, Error::Stopped { .. }), "{e}");
    let tmp = disk.boot_dir.join("b/.vmlinuz.partial");
    assert!(
        std::fs::metadata(&tmp).unwrap().len() > 0,
        "the interrupted kernel left no partial file"
    );
    // The power cut: the file went into place, the checkpoint never heard of it.
    std::fs::rename(&tmp, disk.boot_dir.join("b/vmlinuz")).unwrap();

    cfg.download_retries = 3;
    let r = updater(&disk, cfg, &loader)
        .stage(&Release::at(src.clone()), &fast(), &NoProgress)
        .unwrap();
    assert!(r.resumed);
    assert_staged(&disk, &rel, &rels.path().join("v2.tree"));
}

/// Every `.partial` file under `dir`, recursively.
fn partial_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            found.extend(partial_files(&p));
        } else if p.to_string_lossy().ends_with(".partial") {
            found.push(p);
        }
    }
    found
}

/// A stage that fails in the middle of the kernel or initrd leaves none of it on the boot
/// filesystem, which is small and also holds the loader's env copies (issue 25: a kernel
/// declared 256 MiB and refused left 257 MiB behind).
#[test]
fn a_failed_stage_leaves_no_partial_kernel_or_initrd_on_the_boot_filesystem() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let loader = ModelLoader::new(9);
    let u = updater(&disk, disk.config(&k.trust), &loader);
    for file in ["initrd", "vmlinuz"] {
        let rel = make_release(
            &k,
            rels.path(),
            &format!("v2-{file}"),
            2,
            2 * MIB as usize,
            Arch::host(),
        );
        let p = rel.join(file);
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&p, &bytes).unwrap();
        let e = u
            .stage(&Release::at(Source::Path(rel)), &fast(), &NoProgress)
            .unwrap_err();
        assert!(
            matches!(e, Error::Checksum { .. } | Error::ChunkDigest { .. }),
            "{file}: {e}"
        );
        assert_eq!(
            partial_files(&disk.boot_dir),
            Vec::<std::path::PathBuf>::new(),
            "{file}"
        );
        assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
    }
}
