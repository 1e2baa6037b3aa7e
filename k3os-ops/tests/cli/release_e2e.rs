//! End to end: `k3os-ops release keygen/create/index` → `k3os-ops release serve` → channel
//! resolution → `Updater::stage` into a real slot of a GPT disk image (loop devices, ext4 boot
//! partition, GRUB env through `bootconfig::grub`). Every rejection (unsigned, wrongly signed,
//! tampered manifest, downgrade, other architecture) writes nothing at all; a tampered byte in
//! the rootfs is caught while staging and the slot can never be activated.
//!
//! Needs root, loop devices and mksquashfs (as CI has); without them the test fails saying so.
//! The disk fixture is the workspace's shared one (`testkit`).

use k3os_ops_testing::release as release_support;

use libupgrade::Release;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bootconfig::GrubBootloader;
use bootconfig::{BootEnv, Bootloader, Slot, SlotBoot};
use libupgrade::layout::GptLayout;
use libupgrade::manifest::{Arch, MANIFEST_FILE, SIGNATURE_FILE};
use libupgrade::state::SlotState;
use libupgrade::{channel, Error, NoProgress, Source, StageOptions, Updater};
use release_support::{bin, Server};
use testkit::{TestDisk, MIB};

fn k3os_ops(args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "k3os-ops {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Real squashfs + kernel + initrd inputs for `version`.
fn inputs(work: &Path, version: &str, generation: u64) -> [String; 3] {
    let tree = work.join(format!("{version}.tree"));
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::write(
        tree.join("etc/k3os-release"),
        format!("VERSION={version}\nGENERATION={generation}\n"),
    )
    .unwrap();
    fs::write(
        tree.join("payload"),
        testkit::pseudo_random(2 * MIB as usize, generation),
    )
    .unwrap();
    let sq = work.join(format!("{version}.squashfs"));
    testkit::run(Command::new("mksquashfs").arg(&tree).arg(&sq).args([
        "-noappend",
        "-quiet",
        "-all-root",
    ]));
    let k = work.join(format!("{version}.vmlinuz"));
    fs::write(&k, testkit::pseudo_random(300_000, generation + 10)).unwrap();
    let i = work.join(format!("{version}.initrd"));
    fs::write(&i, testkit::pseudo_random(100_000, generation + 20)).unwrap();
    [sq, k, i].map(|p| p.display().to_string())
}

fn create(work: &Path, key: &Path, out: &Path, version: &str, arch: &str, generation: u64) {
    let [r, k, i] = inputs(work, version, generation);
    let g = generation.to_string();
    let (key, out) = (key.display().to_string(), out.display().to_string());
    k3os_ops(&[
        "release",
        "create",
        "--rootfs",
        &r,
        "--kernel",
        &k,
        "--initrd",
        &i,
        "--version",
        version,
        "--arch",
        arch,
        "--key",
        &key,
        "-o",
        &out,
        "--generation",
        &g,
    ]);
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Everything a stage could write: the whole rootfs-b partition, every file under the boot
/// partition (kernels, GRUB env copies) and the state directory.
fn snapshot(disk: &TestDisk) -> (String, BTreeMap<PathBuf, Vec<u8>>) {
    use sha2::Digest;
    let (_, len) = disk.parts["rootfs-b"];
    let part = hex::encode(sha2::Sha256::digest(disk.part_bytes("rootfs-b", len)));
    let mut files = BTreeMap::new();
    for root in [&disk.boot_dir, &disk.state_dir] {
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.file_name().is_some_and(|n| n == "lost+found") {
                    continue;
                }
                if p.is_dir() {
                    files.insert(p.clone(), Vec::new());
                    stack.push(p);
                } else {
                    files.insert(p.clone(), fs::read(&p).unwrap());
                }
            }
        }
    }
    (part, files)
}

/// Which kind of error a rejection must produce.
type ErrorKind = fn(&Error) -> bool;

#[test]
fn create_serve_stage_and_every_rejection_writes_nothing() {
    testkit::require_root();
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s);
    let work = p("work");
    fs::create_dir_all(&work).unwrap();

    // Publisher: two keys (only "release" is trusted by the node), a channel, bad releases beside it.
    k3os_ops(&["release", "keygen", "-o", &p("keys").display().to_string()]);
    k3os_ops(&[
        "release",
        "keygen",
        "-o",
        &p("keys").display().to_string(),
        "--name",
        "rogue",
    ]);
    let trust = p("trust.d");
    fs::create_dir_all(&trust).unwrap();
    fs::copy(p("keys/release.pub"), trust.join("release.pub")).unwrap();
    let (key, rogue) = (p("keys/release.key"), p("keys/rogue.key"));

    let site = p("site");
    let chan = site.join("stable");
    fs::create_dir_all(&chan).unwrap();
    k3os_ops(&["release", "index", &chan.display().to_string()]);
    create(&work, &key, &chan.join("v6"), "v6", "x86_64", 6);
    create(&work, &key, &chan.join("v6-arm"), "v6", "aarch64", 6);
    let bad = site.join("bad");
    create(&work, &key, &bad.join("old"), "v4", "x86_64", 4);
    create(&work, &key, &bad.join("arm"), "v7-arm", "aarch64", 7);
    create(&work, &rogue, &bad.join("rogue"), "v7-rogue", "x86_64", 7);
    copy_dir(&chan.join("v6"), &bad.join("unsigned"));
    fs::remove_file(bad.join("unsigned").join(SIGNATURE_FILE)).unwrap();
    copy_dir(&chan.join("v6"), &bad.join("manifest-edited"));
    let m = fs::read_to_string(bad.join("manifest-edited").join(MANIFEST_FILE)).unwrap();
    fs::write(
        bad.join("manifest-edited").join(MANIFEST_FILE),
        m.replace("\"generation\": 6", "\"generation\": 9"),
    )
    .unwrap();
    copy_dir(&chan.join("v6"), &bad.join("rootfs-flipped"));
    let rf = bad.join("rootfs-flipped/rootfs.squashfs");
    let mut bytes = fs::read(&rf).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    fs::write(&rf, bytes).unwrap();
    // Publisher-side check catches it too.
    let out = Command::new(bin())
        .args(["release", "verify"])
        .arg(bad.join("rootfs-flipped"))
        .arg("--trust-dir")
        .arg(&trust)
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("rootfs.squashfs")
    );

    let srv = Server::start(&site);

    // Node: GPT disk image, slot A running generation 5, GRUB env on the ext4 boot partition.
    let disk = TestDisk::new(24 * MIB);
    let cfg = disk.config(&trust);
    fs::write(&cfg.release_file, "VERSION=v5\nGENERATION=5\n").unwrap();
    let grub_dir = disk.boot_dir.join("grub");
    fs::create_dir_all(&grub_dir).unwrap();
    let grub = GrubBootloader::new(&grub_dir, 3);
    grub.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    let layout = GptLayout::open(&disk.disk.path, &disk.boot_dir).unwrap();
    let node = Updater::with_parts(cfg, Box::new(layout), Box::new(grub.clone()));
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };

    let url = |rel: &str| Source::parse(&format!("{}{rel}/", srv.url));
    let before = snapshot(&disk);
    let rejections: [(&str, ErrorKind, &str); 6] = [
        (
            "bad/unsigned",
            |e| matches!(e, Error::Signature { .. }),
            "not signed",
        ),
        (
            "bad/rogue",
            |e| matches!(e, Error::Signature { .. }),
            "not trusted",
        ),
        (
            "bad/manifest-edited",
            |e| matches!(e, Error::Signature { .. }),
            "altered after signing",
        ),
        (
            "bad/old",
            |e| {
                matches!(
                    e,
                    Error::Downgrade {
                        found: 4,
                        installed: 5,
                        ..
                    }
                )
            },
            "older than the installed generation 5",
        ),
        (
            "bad/arm",
            |e| matches!(e, Error::Manifest { .. }),
            "built for aarch64",
        ),
        (
            "stable/v6-arm",
            |e| matches!(e, Error::Manifest { .. }),
            "this node is x86_64",
        ),
    ];
    for (rel, kind, words) in rejections {
        let e = node
            .stage(&Release::at(url(rel)), &opts, &NoProgress)
            .expect_err(rel);
        let msg = e.to_string();
        assert!(
            kind(&e) && msg.contains(words),
            "{rel}: unexpected error: {msg}"
        );
        assert!(
            before == snapshot(&disk),
            "{rel}: a rejected release wrote to the node"
        );
    }
    // Rejections name the trust dir when it is about trust.
    let e = node
        .stage(&Release::at(url("bad/rogue")), &opts, &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&trust.display().to_string()), "{e}");

    // A flipped byte in the rootfs: caught by its chunk's sha256 (signed through the chunk
    // index) before that chunk is written; never activatable.
    let e = node
        .stage(&Release::at(url("bad/rootfs-flipped")), &opts, &NoProgress)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::ChunkDigest { artifact, .. } if *artifact == libupgrade::manifest::Artifact::Rootfs
        ),
        "{e}"
    );
    let st = node.status().unwrap();
    assert_ne!(
        st.slots[1].state,
        SlotState::Staged,
        "a corrupt slot must not be staged"
    );
    assert!(matches!(
        node.activate(),
        Err(Error::SlotState { slot: Slot::B, .. })
    ));
    assert_eq!(
        grub.read().unwrap().next_boot(),
        Slot::A,
        "the node still boots the running slot"
    );

    // The good path: resolve latest for this node through the served channel, stage, activate.
    let resolved = channel::resolve(&format!("{}stable/", srv.url), None, Arch::host()).unwrap();
    assert_eq!((resolved.version.as_str(), resolved.generation), ("v6", 6));
    let r = node
        .stage(&Release::at(resolved.source.clone()), &opts, &NoProgress)
        .unwrap();
    assert_eq!(
        (r.slot, r.version.as_str(), r.generation),
        (Slot::B, "v6", 6)
    );
    assert_eq!(r.signed_by.len(), 16);
    let mnt = t.path().join("mnt-b");
    let (_lp, m) = disk.mount_rootfs("rootfs-b", &mnt);
    let diff = Command::new("diff")
        .arg("-r")
        .arg(work.join("v6.tree"))
        .arg(&mnt)
        .output()
        .unwrap();
    sys_mount::Unmount::unmount(&m, sys_mount::UnmountFlags::empty()).unwrap();
    assert!(
        diff.status.success(),
        "slot B differs from the release: {}",
        String::from_utf8_lossy(&diff.stdout)
    );
    assert_eq!(
        fs::read(disk.boot_dir.join("b/vmlinuz")).unwrap(),
        fs::read(chan.join("v6/vmlinuz")).unwrap()
    );
    assert_eq!(
        fs::read(disk.boot_dir.join("b/initrd")).unwrap(),
        fs::read(chan.join("v6/initrd")).unwrap()
    );
    assert_eq!(node.activate().unwrap(), Slot::B);
    let env = grub.read().unwrap();
    assert_eq!(
        (env.next_boot(), env.b),
        (Slot::B, SlotBoot::Trying { tries_left: 3 })
    );
}

#[test]
fn create_on_a_full_disk_fails_cleanly() {
    testkit::require_root();
    let t = tempfile::tempdir().unwrap();
    let (key, _trust) = release_support::keys(t.path(), "k");
    let inputs = release_support::fake_inputs(&t.path().join("in"), "big");
    // A 64 KiB filesystem: the 100 KB rootfs cannot fit.
    let small = t.path().join("small");
    fs::create_dir(&small).unwrap();
    let mount = sys_mount::Mount::builder()
        .fstype("tmpfs")
        .data("size=64k")
        .mount("tmpfs", &small)
        .expect("mount a small tmpfs (needs root)");
    let out = small.join("rel");
    let (r, k, i) = (
        inputs.0.display().to_string(),
        inputs.1.display().to_string(),
        inputs.2.display().to_string(),
    );
    let result = Command::new(bin())
        .args([
            "release",
            "create",
            "--rootfs",
            &r,
            "--kernel",
            &k,
            "--initrd",
            &i,
            "--version",
            "v1",
            "--arch",
            "x86_64",
        ])
        .arg("--key")
        .arg(&key)
        .arg("-o")
        .arg(&out)
        .args(["--generation", "1"])
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&result.stderr).into_owned();
    let left: Vec<_> = fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    sys_mount::Unmount::unmount(&mount, sys_mount::UnmountFlags::empty()).unwrap();
    assert!(!result.status.success(), "create on a full disk succeeded");
    assert!(
        err.contains(".rootfs.squashfs.part") && err.contains("No space left"),
        "{err}"
    );
    assert!(left.is_empty(), "partial files left behind: {left:?}");
}

/// A release published as GitHub release assets (arch-prefixed names, per-file URLs) stages
/// into a real slot through `github-releases://`.
#[test]
fn github_release_assets_stage_into_a_slot() {
    testkit::require_root();
    let t = tempfile::tempdir().unwrap();
    let work = t.path().join("work");
    fs::create_dir_all(&work).unwrap();
    k3os_ops(&[
        "release",
        "keygen",
        "-o",
        &t.path().join("keys").display().to_string(),
    ]);
    let trust = t.path().join("trust.d");
    fs::create_dir_all(&trust).unwrap();
    fs::copy(t.path().join("keys/release.pub"), trust.join("release.pub")).unwrap();
    let rel = t.path().join("rel");
    create(
        &work,
        &t.path().join("keys/release.key"),
        &rel,
        "v8",
        Arch::host().as_str(),
        8,
    );

    let site = t.path().join("site");
    let dl = site.join("dl/v8");
    fs::create_dir_all(&dl).unwrap();
    fs::create_dir_all(site.join("api/repos/acme/nodeos")).unwrap();
    let srv = Server::start(&site);
    let mut assets = Vec::new();
    for e in fs::read_dir(&rel).unwrap() {
        let e = e.unwrap();
        let name = format!(
            "{}-{}",
            Arch::host().as_str(),
            e.file_name().to_string_lossy()
        );
        fs::copy(e.path(), dl.join(&name)).unwrap();
        assets.push(serde_json::json!({
            "name": name,
            "browser_download_url": format!("{}dl/v8/{name}", srv.url),
        }));
    }
    let api = serde_json::json!([{ "tag_name": "v8", "draft": false, "prerelease": false, "assets": assets }]);
    fs::write(site.join("api/repos/acme/nodeos/releases"), api.to_string()).unwrap();
    let _github = release_support::github_api(&format!("{}api", srv.url));

    let disk = TestDisk::new(24 * MIB);
    let cfg = disk.config(&trust);
    let grub_dir = disk.boot_dir.join("grub");
    fs::create_dir_all(&grub_dir).unwrap();
    let grub = GrubBootloader::new(&grub_dir, 3);
    grub.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    let layout = GptLayout::open(&disk.disk.path, &disk.boot_dir).unwrap();
    let node = Updater::with_parts(cfg, Box::new(layout), Box::new(grub.clone()));

    let resolved = channel::resolve("github-releases://acme/nodeos", None, Arch::host()).unwrap();
    assert!(
        matches!(resolved.source, Source::Assets(_)),
        "{:?}",
        resolved.source
    );
    let opts = StageOptions {
        retry_delay: Duration::from_millis(20),
        ..StageOptions::default()
    };
    let r = node
        .stage(&Release::at(resolved.source.clone()), &opts, &NoProgress)
        .unwrap();
    assert_eq!(
        (r.slot, r.version.as_str(), r.generation),
        (Slot::B, "v8", 8)
    );
    let mnt = t.path().join("mnt-b");
    let (_lp, m) = disk.mount_rootfs("rootfs-b", &mnt);
    let diff = Command::new("diff")
        .arg("-r")
        .arg(work.join("v8.tree"))
        .arg(&mnt)
        .output()
        .unwrap();
    sys_mount::Unmount::unmount(&m, sys_mount::UnmountFlags::empty()).unwrap();
    assert!(
        diff.status.success(),
        "slot B differs from the release: {}",
        String::from_utf8_lossy(&diff.stdout)
    );
    assert_eq!(
        fs::read(disk.boot_dir.join("b/vmlinuz")).unwrap(),
        fs::read(rel.join("vmlinuz")).unwrap()
    );
    assert_eq!(node.status().unwrap().slots[1].state, SlotState::Staged);
}
