//! Writes the seed corpora in `fuzz/seeds/<target>/` from the real files the project's own
//! code makes (the same writers the tests use) and the v0.1.0 fixtures. Run by hand after a
//! format change: `cargo run --manifest-path fuzz/Cargo.toml --example seeds` (the output is
//! committed; `just fuzz` does not regenerate it).

use std::path::{Path, PathBuf};

use bootconfig::{render_cfg, GrubBootloader, GrubConfig};
use bootconfig::GrubEnv;
use bootconfig::{render_conf, Adv, SyslinuxBootloader, SyslinuxConfig, ADV_BOOTONCE};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use k3os_fuzz::join_files;
use libupgrade::channel::{Index, IndexEntry};
use libupgrade::chunk::{ChunkIndex, ChunkParams};
use libupgrade::manifest::{Arch, BootSupport, FileEntry, Files, IndexRef, Manifest, ScriptFile, ScriptKind, FORMAT};
use libupgrade::state::store::StateStore;
use libupgrade::state::{Event, State};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds")
}

fn seed(target: &str, name: &str, bytes: &[u8]) {
    let d = root().join(target);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(name), bytes).unwrap();
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bootconfig/tests/fixtures/v0.1.0")
}

fn entry(s: &str) -> BootEntry {
    BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: format!("root=PARTLABEL=rootfs-{s} ro console=ttyS0 quiet"),
    }
}

fn read_opt(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok()
}

/// The five files of a GRUB dir, in the `grub_boot` input order.
fn grub_files(dir: &Path) -> Vec<Option<Vec<u8>>> {
    ["env1", "env2", "lock1", "lock2", "good"]
        .iter()
        .map(|n| read_opt(&dir.join("k3os").join(n)))
        .collect()
}

fn grub_input(sel: u8, op: u8, files: &[Option<Vec<u8>>], cfg: Option<&[u8]>) -> Vec<u8> {
    let mut parts: Vec<Option<&[u8]>> = files.iter().map(|f| f.as_deref()).collect();
    parts.push(cfg);
    let mut v = vec![sel, op];
    v.extend(join_files(&parts));
    v
}

fn grub() {
    let fx = fixtures();
    let v010_cfg = std::fs::read(fx.join("grub.cfg")).unwrap();
    // v0.1.0's files as v0.1.0 wrote them, under its own script.
    for state in ["installed", "trying-b", "trying-b-counted", "good-b"] {
        let files = grub_files(&fx.join(state));
        for (i, f) in files.iter().enumerate() {
            if let Some(f) = f {
                seed("grubenv", &format!("v010-{state}-{i}"), f);
            }
        }
        seed(
            "grub_boot",
            &format!("v010-{state}"),
            &grub_input(1, 0, &files, None),
        );
    }
    // Today's writer under today's script: installed, trial armed, counted down, confirmed.
    let cfg = GrubConfig {
        entries: [entry("a"), entry("b")],
        max_tries: 3,
        timeout_secs: 0,
        serial: true,
        panic_secs: 5,
    };
    let text = render_cfg(&cfg);
    let t = tempfile::tempdir().unwrap();
    let g = GrubBootloader::new(t.path(), 3);
    g.install_fresh(
        &BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        },
        &text,
    )
    .unwrap();
    let snap = |name: &str, op: u8| {
        let files = grub_files(t.path());
        for (i, f) in files.iter().enumerate() {
            if let Some(f) = f {
                seed("grubenv", &format!("v020-{name}-{i}"), f);
            }
        }
        seed(
            "grub_boot",
            &format!("v020-{name}"),
            &grub_input(2, op, &files, None),
        );
    };
    snap("installed", 2);
    g.try_slot(Slot::B, 3).unwrap();
    snap("trying-b", 0);
    for op in g.simulate_boot().unwrap().countdown {
        op.apply().unwrap();
    }
    snap("trying-b-counted", 1);
    g.mark_good(Slot::B).unwrap();
    snap("good-b", 3);
    // Copy 1 torn mid-write (lock editing, half a block), under an arbitrary script text.
    let mut files = grub_files(t.path());
    if let Some(e) = files[0].as_mut() {
        e.truncate(300);
    }
    files[2] = Some(
        GrubEnv::from_pairs([("K3OS_EDITING", "1")])
            .to_bytes()
            .unwrap(),
    );
    seed(
        "grub_boot",
        "v020-torn-copy1",
        &grub_input(3, 4, &files, Some(v010_cfg.as_slice())),
    );
    grub_plain_blocks();
}

/// Plain blocks with escapes, comments and no warning line.
fn grub_plain_blocks() {
    let env = GrubEnv::from_pairs([
        ("a", "1"),
        ("path", "c:\\x\\"),
        ("multi", "x\ny\n"),
        ("e", ""),
    ]);
    seed("grubenv", "escapes", &env.to_bytes().unwrap());
    seed(
        "grubenv",
        "comments",
        b"# GRUB Environment Block\nA=1\n# note\nB=2\n##########",
    );
}

fn syslinux() {
    let fx = fixtures();
    let v010 = std::fs::read(fx.join("extlinux.conf")).unwrap();
    let cfg = SyslinuxConfig {
        entries: [entry("a"), entry("b")],
        primary: Slot::A,
        timeout_tenths: 1,
        serial: true,
        panic_secs: 5,
    };
    let current = render_conf(&cfg);
    // ldlinux.sys: some loader bytes, then the ADV.
    let ldlinux = |adv: &Adv| {
        let mut v = vec![0x90u8; 512];
        v.extend_from_slice(&adv.0);
        v
    };
    let empty = Adv::empty();
    let mut once = Adv::empty();
    once.set(ADV_BOOTONCE, b"b").unwrap();
    let mut two = once.clone();
    two.set(2, b"menu-saved").unwrap();
    for (name, adv) in [("empty", &empty), ("once-b", &once), ("two-tags", &two)] {
        let mut raw = vec![0u8];
        raw.extend_from_slice(&adv.0);
        raw.extend_from_slice(b"a");
        seed("syslinux_adv", &format!("raw-{name}"), &raw);
        let mut area = vec![1u8];
        area.extend_from_slice(&adv.0[8..8 + 500]);
        seed("syslinux_adv", &format!("sealed-{name}"), &area);
        for (cname, conf) in [("v010", v010.as_slice()), ("v020", current.as_bytes())] {
            for op in [0u8, 3] {
                let mut v = vec![op];
                v.extend(join_files(&[Some(conf), Some(&ldlinux(adv))]));
                seed("syslinux_read", &format!("{cname}-{name}-op{op}"), &v);
            }
        }
    }
    // A real sequence through the writer: trial of B armed, then confirmed.
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("extlinux.conf"), &current).unwrap();
    std::fs::write(t.path().join("ldlinux.sys"), ldlinux(&empty)).unwrap();
    let s = SyslinuxBootloader::new(t.path());
    s.try_slot(Slot::B, 1).unwrap();
    let files = |p: &Path| {
        let mut v = vec![2u8];
        let c = std::fs::read(p.join("extlinux.conf")).unwrap();
        let l = std::fs::read(p.join("ldlinux.sys")).unwrap();
        v.extend(join_files(&[Some(&c), Some(&l)]));
        v
    };
    seed("syslinux_read", "v020-trying-b", &files(t.path()));
    s.mark_good(Slot::B).unwrap();
    seed("syslinux_read", "v020-good-b", &files(t.path()));
}

fn manifest_sample() -> Manifest {
    let hex = |b: u8| format!("{b:02x}").repeat(32);
    let e = |p: &str, size: u64, b: u8| FileEntry {
        path: p.into(),
        size,
        sha256: hex(b),
        chunks: None,
        patches: Vec::new(),
    };
    Manifest {
        format: FORMAT,
        version: "v2".into(),
        arch: Arch::X86_64,
        generation: 2,
        files: Files {
            rootfs: e("rootfs.squashfs", 4 << 20, 0xab),
            kernel: e("vmlinuz", 1 << 20, 0x12),
            initrd: e("initrd", 1 << 19, 0x34),
        },
        boot: None,
        payloads: Vec::new(),
        verity: None,
    }
}

fn manifests() {
    let m = manifest_sample();
    seed("manifest", "v010-plain", &m.to_bytes());
    let mut c = m.clone();
    c.arch = Arch::Aarch64;
    c.files.rootfs.chunks = Some(IndexRef {
        path: "rootfs.squashfs.chunks".into(),
        size: 4756,
        sha256: "cd".repeat(32),
    });
    c.boot = Some(BootSupport {
        grub_script: 2,
        extlinux_conf: 1,
        scripts: vec![
            ScriptFile {
                kind: ScriptKind::GrubCfg,
                version: 2,
                path: "grub.cfg".into(),
                size: 5000,
                sha256: "ef".repeat(32),
            },
            ScriptFile {
                kind: ScriptKind::ExtlinuxConf,
                version: 1,
                path: "extlinux.conf".into(),
                size: 400,
                sha256: "01".repeat(32),
            },
        ],
    });
    seed("manifest", "v020-chunks-boot", &c.to_bytes());
}

fn signatures() {
    let key = ed25519_dalek::SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
    let sig = libupgrade::signing::sign_with(k3os_fuzz::SIGNED_MANIFEST, &key);
    seed(
        "signature",
        "valid-fixed-manifest",
        &join_files(&[None, Some(&sig)]),
    );
    seed(
        "signature",
        "valid-explicit-manifest",
        &join_files(&[Some(k3os_fuzz::SIGNED_MANIFEST), Some(&sig)]),
    );
    let m = manifest_sample().to_bytes();
    seed(
        "signature",
        "other-manifest",
        &join_files(&[Some(&m), Some(&sig)]),
    );
}

fn chunk_indexes() {
    // Incompressible bytes (xorshift), so the chunker cuts at content-defined boundaries.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<u8> = (0..60_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let ix = ChunkIndex::build(&data[..], ChunkParams::with_avg(8 << 10)).unwrap();
    seed("chunk_index", "noise-60k-avg8k", &ix.to_bytes());
    let one = ChunkIndex::build(&data[..1000], ChunkParams::DEFAULT).unwrap();
    seed("chunk_index", "one-chunk-default", &one.to_bytes());
    let none = ChunkIndex::build(&b""[..], ChunkParams::DEFAULT).unwrap();
    seed("chunk_index", "empty", &none.to_bytes());
}

fn channels() {
    let e = |v: &str, g: u64, arch: Arch, path: &str| IndexEntry {
        version: v.into(),
        generation: g,
        arch,
        path: path.into(),
    };
    let ix = Index::new(vec![
        e("v2", 2, Arch::X86_64, "v2/"),
        e("v2", 2, Arch::Aarch64, "v2-arm64/"),
        e("v1", 1, Arch::X86_64, "v1"),
    ]);
    seed("channel_index", "v020", &ix.to_bytes());
    seed(
        "channel_index",
        "v010-no-format",
        br#"{"releases":[{"version":"v1","generation":1,"arch":"x86_64","path":"v1/"}]}"#,
    );
    let page = br#"[{"tag_name":"v2","draft":false,"prerelease":false,"assets":[
{"name":"x86_64-manifest.json","browser_download_url":"https://github.com/o/r/releases/download/v2/x86_64-manifest.json","id":11,"size":900,"updated_at":"2026-12-01T00:00:00Z"},
{"name":"manifest.json.sig","browser_download_url":"https://github.com/o/r/releases/download/v2/manifest.json.sig","id":12,"size":120},
{"name":"amd64-rootfs.squashfs","browser_download_url":"https://github.com/o/r/releases/download/v2/amd64-rootfs.squashfs","id":13,"size":4096},
{"name":"aarch64-manifest.json","browser_download_url":"https://github.com/o/r/releases/download/v2/aarch64-manifest.json","id":14,"size":900},
{"name":"vmlinuz","browser_download_url":"https://github.com/o/r/releases/download/v2/vmlinuz","id":15,"size":10}]},
{"tag_name":"v1","draft":true,"prerelease":true,"assets":[]}]"#;
    let link = br#"<https://api.github.com/repositories/1/releases?per_page=100&page=2>; rel="next", <https://api.github.com/repositories/1/releases?per_page=100&page=5>; rel="last""#;
    seed(
        "github_page",
        "two-releases",
        &join_files(&[Some(page), Some(link)]),
    );
    seed(
        "github_page",
        "empty-page",
        &join_files(&[Some(b"[]"), None]),
    );
}

fn states() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../libupgrade/tests/fixtures/v0.1.0");
    seed(
        "state",
        "v010",
        &std::fs::read(fx.join("state.json")).unwrap(),
    );
    let t = tempfile::tempdir().unwrap();
    let store = StateStore::new(t.path());
    let mut st = State::default();
    st.slot_mut(Slot::B).version = Some("v2".into());
    st.slot_mut(Slot::B).generation = Some(2);
    st.transition(Slot::B, Event::StageStarted, "writing v2")
        .expect("the seed state follows the slot lifecycle");
    st.transition(Slot::B, Event::Staged, "staged v2")
        .expect("the seed state follows the slot lifecycle");
    st.transition(Slot::B, Event::Activated, "activated")
        .expect("the seed state follows the slot lifecycle");
    st.last_boot_id = Some("0123456789abcdef".into());
    store.save(&st, "seed").unwrap();
    seed(
        "state",
        "v020-trying",
        &std::fs::read(store.path()).unwrap(),
    );
    seed(
        "checkpoint",
        "resuming-kernel",
        format!(
            r#"{{"slot":"B","manifest_sha256":"{}","done":["rootfs"],"current":["kernel",4096],"fetched":4194304,"reused":0}}"#,
            "ab".repeat(32)
        )
        .as_bytes(),
    );
    seed(
        "checkpoint",
        "v010-no-totals",
        format!(
            r#"{{"slot":"A","manifest_sha256":"{}","done":[],"current":null}}"#,
            "cd".repeat(32)
        )
        .as_bytes(),
    );
}

/// Real patches against `k3os_fuzz::patch_base()`: a plain one (Delta ops) and a squashfs one
/// between two small mksquashfs images (Copy, Literal and Data ops; its base fields are
/// replaced by the target's, so its ops read the fixed base: structure for the mutator).
fn patches() {
    use libupgrade::patch::{build, PatchKind};
    let d = tempfile::tempdir().unwrap();
    let base = k3os_fuzz::patch_base();
    let mut target = base.clone();
    target[5000..5010].copy_from_slice(b"0123456789");
    target.drain(70_000..71_000);
    target.extend_from_slice(&base[..3000]);
    std::fs::write(d.path().join("b"), &base).unwrap();
    std::fs::write(d.path().join("t"), &target).unwrap();
    let mut out = Vec::new();
    build(PatchKind::Plain, &d.path().join("b"), &d.path().join("t"), &mut out).unwrap();
    seed("patch", "plain-edits", &out);
    let mut out = Vec::new();
    build(PatchKind::Plain, &d.path().join("b"), &d.path().join("b"), &mut out).unwrap();
    seed("patch", "plain-identity", &out);
    for (name, data) in [("b.tree", &base[..100_000]), ("t.tree", &target[..120_000])] {
        let t = d.path().join(name);
        std::fs::create_dir_all(t.join("usr")).unwrap();
        std::fs::write(t.join("usr/file"), data).unwrap();
        std::fs::write(t.join("usr/text"), "the node the slot ".repeat(5000 + data.len() / 1000)).unwrap();
        let st = std::process::Command::new("mksquashfs")
            .arg(&t)
            .arg(d.path().join(name.replace("tree", "sq")))
            .args(["-noappend", "-all-root", "-no-xattrs", "-comp", "zstd", "-no-fragments"])
            .args(["-mkfs-time", "0", "-all-time", "0", "-quiet"])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
    }
    let mut out = Vec::new();
    build(PatchKind::Squashfs, &d.path().join("b.sq"), &d.path().join("t.sq"), &mut out).unwrap();
    seed("patch", "squashfs-ops", &out);
}

/// A sealed failure bundle by the fixture key (`bundle`), one cut to fit, and a raw
/// deflate body the target seals itself.
fn bundles() {
    use fleet_report::{Bundle, Failure, NodeId, Section, BUNDLE_FORMAT};
    let key = ed25519_dalek::SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
    let mut b = Bundle {
        format: BUNDLE_FORMAT,
        node: NodeId::of(&key.verifying_key()),
        version: "v2".into(),
        generation: 2,
        attempt: 1,
        slot: "B".into(),
        time: "2026-12-07T04:00:00Z".into(),
        failure: Failure::HealthCheck,
        why: "health check 20-kubelet failed".into(),
        versions: "k3os-ops=0.2.0\n".into(),
        redacted: 1,
        sections: vec![Section {
            name: "health/20-kubelet".into(),
            text: "kubelet: failed to load config: [REDACTED]\n".into(),
            cut_bytes: 0,
        }],
    };
    seed("bundle", "health-check", &b.seal(&key).unwrap());
    b.sections.push(Section {
        name: "log/kernel".into(),
        text: (0..20_000).map(|i| format!("[{i:>8}] line {:x}\n", i * 7919)).collect(),
        cut_bytes: 0,
    });
    seed("bundle", "cut-to-fit", &b.seal(&key).unwrap());
}

/// Signed reports of every outcome by the fixture key (`report`), and an allow-list.
fn reports() {
    use fleet_report::{NodeId, Outcome, Report, Transfer, WaitFor};
    let key = ed25519_dalek::SigningKey::from_bytes(&k3os_fuzz::SIGNING_SEED);
    let node = NodeId::of(&key.verifying_key());
    let outcomes = [
        Outcome::Staged { bytes: 48_000_000, by: Transfer::Patch },
        Outcome::StageFailed { why: "sha256 of rootfs \"x\" is not the manifest's".into() },
        Outcome::Waiting { wait_for: WaitFor::Wave, until: Some(1_800_000_000) },
        Outcome::Waiting { wait_for: WaitFor::Pause, until: None },
        Outcome::TrialBoot,
        Outcome::Blessed,
        Outcome::RolledBack { why: "x".repeat(2000) },
        Outcome::FellBack { why: "3 of 3 tries used".into() },
        Outcome::WithdrawnDropped,
        // Format 2 (last, so the earlier seeds keep their names).
        Outcome::Waiting { wait_for: WaitFor::Retry, until: Some(1_800_003_600) },
        Outcome::Waiting { wait_for: WaitFor::Retry, until: None },
    ];
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let r = Report {
            v: outcome.format(),
            node,
            site: "site-0001".into(),
            seq: i as u64 + 1,
            at: 1_800_000_000 + i as u64,
            channel: "http://127.0.0.1:8080/stable".into(),
            version: "v2".into(),
            generation: 2,
            outcome,
            seed: (i % 2 == 0).then_some(4242),
            dropped: i as u64 % 2,
        };
        seed("report", &format!("{}-{i}", r.outcome.kind()), &r.sign(&key).unwrap());
    }
    seed("report", "allow-list", format!("# enrolled\n{node} site-0001\n").as_bytes());
}

/// Image archives (`image_archive`): an OCI layout of two images sharing a layer's bytes, as
/// testkit's builder writes them (what `skopeo copy … oci-archive:` writes), one with a
/// single small layer, and both concatenated (a tar after a tar's end).
fn image_archives() {
    let base = b"base layer bytes".repeat(64);
    let one = testkit::image_archive("docker.io/library/app:1", &[base.clone(), b"v1".to_vec()]);
    seed("image_archive", "oci-two-layers", &one);
    let small = testkit::image_archive("k3os.test/pause:3.6", &[b"pause".to_vec()]);
    seed("image_archive", "oci-one-layer", &small);
    seed("image_archive", "oci-concatenated", &[one, small].concat());
}

/// Squashfs images (`squashfs`): what mksquashfs writes for a small tree, compressed and
/// uncompressed (`-noI -noD -noF`: the tables' bytes as they are, so mutation reaches the
/// inode chain's headers and the id table's pointers).
fn squashfs_images() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/os-release"), b"ID=k3os\n").unwrap();
    std::fs::write(tree.join("init"), b"#!/bin/sh\n").unwrap();
    for (name, extra) in [("zstd", &["-comp", "zstd"][..]), ("plain", &["-noI", "-noD", "-noF"][..])] {
        let out = dir.path().join(name);
        testkit::squashfs(&tree, &out, extra);
        seed("squashfs", &format!("mksquashfs-{name}"), &std::fs::read(&out).unwrap());
    }
}

fn main() {
    grub();
    syslinux();
    manifests();
    signatures();
    chunk_indexes();
    channels();
    states();
    patches();
    reports();
    bundles();
    image_archives();
    squashfs_images();
    println!("seeds written to {}", root().display());
}
