use super::*;
use crate::chunk::ChunkIndex;
use crate::manifest::{Artifact, IndexRef};
use sha2::{Digest, Sha256};

struct Fixture {
    t: tempfile::TempDir,
    key: PathBuf,
    trust: PathBuf,
}

fn fixture() -> Fixture {
    let t = tempfile::tempdir().unwrap();
    let (key, pk) = signing::generate_keypair(&t.path().join("keys"), "k").unwrap();
    let trust = t.path().join("trust");
    fs::create_dir(&trust).unwrap();
    fs::copy(pk, trust.join("k.pub")).unwrap();
    let mut rootfs = b"hsqs".to_vec();
    rootfs.extend((0..3_000_000u32).map(|i| (i % 251) as u8));
    fs::write(t.path().join("in.squashfs"), rootfs).unwrap();
    fs::write(t.path().join("in.kernel"), b"kernel bytes").unwrap();
    fs::write(t.path().join("in.initrd"), b"initrd bytes").unwrap();
    Fixture { t, key, trust }
}

impl Fixture {
    fn opts(
        &self,
        out: &Path,
        version: &str,
        arch: Arch,
        generation: Option<u64>,
    ) -> CreateOptions {
        let p = self.t.path();
        CreateOptions {
            rootfs: p.join("in.squashfs"),
            kernel: p.join("in.kernel"),
            initrd: p.join("in.initrd"),
            version: version.into(),
            arch,
            secret_key: self.key.clone(),
            out_dir: out.to_path_buf(),
            generation,
            scripts: Vec::new(),
            payloads: Vec::new(),
        }
    }
}

#[test]
fn create_writes_verifiable_release() {
    let f = fixture();
    let out = f.t.path().join("rel");
    let m = create(&f.opts(&out, "v1.0.0", Arch::X86_64, Some(7))).unwrap();
    assert_eq!(m.generation, 7);
    let bytes = fs::read(out.join(MANIFEST_FILE)).unwrap();
    assert_eq!(Manifest::parse(&bytes).unwrap(), m);
    signing::verify(
        &bytes,
        &fs::read(out.join(SIGNATURE_FILE)).unwrap(),
        &f.trust,
    )
    .unwrap();
    for (file, input) in [
        (ROOTFS_FILE, "in.squashfs"),
        (KERNEL_FILE, "in.kernel"),
        (INITRD_FILE, "in.initrd"),
    ] {
        assert_eq!(
            fs::read(out.join(file)).unwrap(),
            fs::read(f.t.path().join(input)).unwrap()
        );
    }
    let (vm, _) = verify_dir(&out, &f.trust).unwrap();
    assert_eq!(vm, m);
    let (size, sha) = sha256_file(&out.join(ROOTFS_FILE)).unwrap();
    assert_eq!(
        (size, sha),
        (m.files.rootfs.size, m.files.rootfs.sha256.clone())
    );
    assert_eq!(size, 3_000_004);
    // No temporary files left behind.
    let names: Vec<_> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 8, "{names:?}");
    let ix = m.files.rootfs.chunks.as_ref().expect("rootfs chunk index");
    let index = ChunkIndex::parse(&fs::read(out.join(&ix.path)).unwrap()).unwrap();
    assert_eq!(index.size(), m.files.rootfs.size);
    assert_eq!(index.params, ChunkParams::DEFAULT);
    assert_eq!(
        index,
        ChunkIndex::build(
            fs::File::open(out.join(ROOTFS_FILE)).unwrap(),
            ChunkParams::DEFAULT
        )
        .unwrap()
    );
    // A second create into the same directory is refused and changes nothing.
    let e = create(&f.opts(&out, "v1.0.1", Arch::X86_64, Some(8))).unwrap_err();
    assert!(matches!(e, ReleaseError::Exists { .. }), "{e}");
    assert_eq!(fs::read(out.join(MANIFEST_FILE)).unwrap(), bytes);
}

#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<(String, u64, u64)>>);

impl Progress for Recorder {
    fn begin(&self, what: &str, total: u64, _already: u64) {
        self.0.lock().unwrap().push((what.to_string(), total, 0));
    }
    fn advance(&self, bytes: u64) {
        self.0.lock().unwrap().last_mut().unwrap().2 += bytes;
    }
    fn end(&self) {}
}

#[test]
fn progress_reports_every_byte_of_each_file() {
    let f = fixture();
    let rec = Recorder::default();
    let m = create_with_progress(
        &f.opts(&f.t.path().join("rel"), "v1", Arch::X86_64, Some(1)),
        &rec,
    )
    .unwrap();
    let got = rec.0.into_inner().unwrap();
    let want: Vec<_> = crate::manifest::Artifact::ALL
        .iter()
        .map(|a| {
            let e = m.files.get(*a);
            (e.path.clone(), e.size, e.size)
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn verify_dir_catches_tampered_file_and_missing_signature() {
    let f = fixture();
    let out = f.t.path().join("rel");
    create(&f.opts(&out, "v1", Arch::X86_64, Some(1))).unwrap();
    let rootfs = out.join(ROOTFS_FILE);
    let mut bytes = fs::read(&rootfs).unwrap();
    bytes[1_000_000] ^= 1;
    fs::write(&rootfs, &bytes).unwrap();
    let e = verify_dir(&out, &f.trust).unwrap_err();
    assert!(matches!(e, ReleaseError::FileMismatch { .. }), "{e}");
    assert!(e.to_string().contains("rootfs.squashfs"), "{e}");
    fs::remove_file(out.join(SIGNATURE_FILE)).unwrap();
    let e = verify_dir(&out, &f.trust).unwrap_err();
    assert!(
        matches!(e, ReleaseError::Signing(SigningError::Unsigned { .. })),
        "{e}"
    );
}

#[test]
fn verify_dir_catches_an_index_that_does_not_match_its_file() {
    let f = fixture();
    let out = f.t.path().join("rel");
    // Sign a manifest whose rootfs index was made for other bytes (a publisher bug).
    let m = create(&f.opts(&out, "v1", Arch::X86_64, Some(1))).unwrap();
    let mut other = fs::read(out.join(ROOTFS_FILE)).unwrap();
    other[2_000_000] ^= 1;
    let bytes = ChunkIndex::build(&other[..], ChunkParams::DEFAULT)
        .unwrap()
        .to_bytes();
    let r = m.files.rootfs.chunks.clone().unwrap();
    fs::write(out.join(&r.path), &bytes).unwrap();
    let mut m2 = m.clone();
    m2.files.rootfs.chunks = Some(IndexRef {
        sha256: hex::encode(Sha256::digest(&bytes)),
        size: bytes.len() as u64,
        ..r
    });
    let key = signing::load_secret_key(&f.key).unwrap();
    fs::write(
        out.join(SIGNATURE_FILE),
        signing::sign_with(&m2.to_bytes(), &key),
    )
    .unwrap();
    fs::write(out.join(MANIFEST_FILE), m2.to_bytes()).unwrap();
    let e = verify_dir(&out, &f.trust).unwrap_err().to_string();
    assert!(
        e.contains("chunk index of") && e.contains("does not match"),
        "{e}"
    );
}

#[test]
fn without_chunking_no_index_is_written() {
    let f = fixture();
    let out = f.t.path().join("rel");
    let m = create_with(
        &f.opts(&out, "v1", Arch::X86_64, Some(1)),
        None,
        &NoProgress,
    )
    .unwrap();
    assert!(Artifact::ALL
        .iter()
        .all(|a| m.files.get(*a).chunks.is_none()));
    assert_eq!(fs::read_dir(&out).unwrap().count(), 5);
    verify_dir(&out, &f.trust).unwrap();
}

#[test]
fn refuses_bad_inputs_before_writing() {
    let f = fixture();
    let out = f.t.path().join("rel");
    let mut o = f.opts(&out, "v1", Arch::X86_64, Some(1));
    o.rootfs = f.t.path().join("in.kernel");
    let e = create(&o).unwrap_err();
    assert!(matches!(e, ReleaseError::NotSquashfs { .. }), "{e}");
    assert!(e.to_string().contains("in.kernel"), "{e}");

    let mut o = f.opts(&out, "v1", Arch::X86_64, Some(1));
    fs::write(f.t.path().join("empty"), b"").unwrap();
    o.initrd = f.t.path().join("empty");
    assert!(matches!(
        create(&o).unwrap_err(),
        ReleaseError::EmptyInput { what: "initrd", .. }
    ));

    let e = create(&f.opts(&out, "bad version", Arch::X86_64, Some(1))).unwrap_err();
    assert!(e.to_string().contains("version"), "{e}");

    let e = create(&f.opts(&out, "v1", Arch::X86_64, None)).unwrap_err();
    assert!(matches!(e, ReleaseError::GenerationRequired { .. }), "{e}");

    let mut o = f.opts(&out, "v1", Arch::X86_64, Some(1));
    o.secret_key = f.trust.join("k.pub");
    assert!(matches!(create(&o).unwrap_err(), ReleaseError::Signing(_)));
    assert!(!out.exists(), "nothing may be written for refused input");
}

#[test]
fn channel_generation_and_index() {
    let f = fixture();
    let ch = f.t.path().join("channel");
    fs::create_dir(&ch).unwrap();
    channel::write_index(&ch).unwrap();
    let m1 = create(&f.opts(&ch.join("v1"), "v1", Arch::X86_64, None)).unwrap();
    assert_eq!(m1.generation, 1);
    let m2 = create(&f.opts(&ch.join("v2"), "v2", Arch::X86_64, None)).unwrap();
    assert_eq!(m2.generation, 2);
    // Same version for another architecture shares the generation.
    let m2a = create(&f.opts(&ch.join("v2-arm"), "v2", Arch::Aarch64, None)).unwrap();
    assert_eq!(m2a.generation, 2);
    // A generation already used for that arch is refused.
    let e = create(&f.opts(&ch.join("v9"), "v9", Arch::X86_64, Some(1))).unwrap_err();
    assert!(matches!(e, ReleaseError::GenerationTaken { .. }), "{e}");
    let index = channel::read_local_index(&ch).unwrap();
    let got: Vec<_> = index
        .releases
        .iter()
        .map(|e| (e.version.as_str(), e.generation, e.arch, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("v2", 2, Arch::Aarch64, "v2-arm/"),
            ("v2", 2, Arch::X86_64, "v2/"),
            ("v1", 1, Arch::X86_64, "v1/")
        ]
    );
    // A release copied into the channel without re-indexing still counts.
    create(&f.opts(&f.t.path().join("elsewhere"), "v7", Arch::X86_64, Some(7))).unwrap();
    fs::create_dir(ch.join("v7")).unwrap();
    for e in fs::read_dir(f.t.path().join("elsewhere")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), ch.join("v7").join(e.file_name())).unwrap();
    }
    let m8 = create(&f.opts(&ch.join("v8"), "v8", Arch::X86_64, None)).unwrap();
    assert_eq!(m8.generation, 8);
    let index = channel::read_local_index(&ch).unwrap();
    assert_eq!(index.releases[0].path, "v8/");
    assert_eq!(index.releases[1].path, "v7/");
}

#[allow(clippy::too_many_lines)] // one release built and checked field by field
/// `release create --patch-from` N-1 and N-2: a patch per artifact per base, listed only when
/// smaller than that base's chunk plan (unchanged artifacts cost no chunk: dropped), a rootfs
/// the squashfs kind cannot read gets a plain patch (saying why), and `release verify` checks
/// every listed patch file.
#[test]
fn patches_from_two_bases_are_listed_when_smaller_and_verified() {
    let f = fixture();
    let p = f.t.path();
    let rootfs = p.join("in.squashfs");
    let change = |at: usize, seed: u8| {
        let mut b = fs::read(&rootfs).unwrap();
        for (i, x) in b[at..at + 5000].iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        fs::write(&rootfs, b).unwrap();
    };
    let v1 = p.join("v1");
    create(&f.opts(&v1, "v1", Arch::X86_64, Some(1))).unwrap();
    change(1_000_000, 1);
    let v2 = p.join("v2");
    let chunking = Some(ChunkParams::DEFAULT);
    let (m2, built) = create_patched(
        &f.opts(&v2, "v2", Arch::X86_64, Some(2)),
        chunking,
        std::slice::from_ref(&v1),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(built.len(), 3, "{built:?}");
    let r = &built[0];
    assert_eq!(
        (r.artifact.clone(), r.kind.as_str(), r.kept),
        (Artifact::Rootfs.into(), "plain", true)
    );
    assert!(r.size < r.chunk_fetch, "{r:?}");
    assert!(r.note.as_deref().is_some_and(|n| !n.is_empty()), "{r:?}");
    for b in &built[1..] {
        assert!(!b.kept && b.chunk_fetch == 0 && b.path.is_none(), "{b:?}");
    }
    let listed = &m2.files.rootfs.patches;
    assert_eq!(listed.len(), 1);
    let m1 = Manifest::parse(&fs::read(v1.join(MANIFEST_FILE)).unwrap()).unwrap();
    assert_eq!(
        (
            listed[0].base.version.as_str(),
            &listed[0].base.sha256,
            listed[0].base.size
        ),
        ("v1", &m1.files.rootfs.sha256, m1.files.rootfs.size)
    );
    assert!(m2.files.kernel.patches.is_empty() && m2.files.initrd.patches.is_empty());
    verify_dir(&v2, &f.trust).unwrap();

    // N-1 (named by its manifest) and N-2: one rootfs patch each, under their own names.
    change(2_000_000, 2);
    let v3 = p.join("v3");
    let (m3, _) = create_patched(
        &f.opts(&v3, "v3", Arch::X86_64, Some(3)),
        chunking,
        &[v2.join(MANIFEST_FILE), v1.clone()],
        &NoProgress,
    )
    .unwrap();
    let from: Vec<_> = m3
        .files
        .rootfs
        .patches
        .iter()
        .map(|p| p.base.version.as_str())
        .collect();
    assert_eq!(from, ["v2", "v1"]);
    assert_ne!(
        m3.files.rootfs.patches[0].path,
        m3.files.rootfs.patches[1].path
    );
    verify_dir(&v3, &f.trust).unwrap();
    let patch = v3.join(&m3.files.rootfs.patches[1].path);
    fs::write(&patch, b"not the signed patch").unwrap();
    let e = verify_dir(&v3, &f.trust).unwrap_err();
    assert!(
        matches!(e, ReleaseError::FileMismatch { .. }) && e.to_string().contains(".patch"),
        "{e}"
    );

    // A base of another architecture is refused, naming both.
    let arm = p.join("arm");
    create(&f.opts(&arm, "a1", Arch::Aarch64, Some(1))).unwrap();
    let e = create_patched(
        &f.opts(&p.join("v4"), "v4", Arch::X86_64, Some(4)),
        chunking,
        &[arm],
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("aarch64") && e.contains("x86_64"), "{e}");
    assert!(!p.join("v4").exists(), "refused before anything was copied");
}

/// `--verity`: the manifest records veritysetup's root hash and the geometry; the release
/// directory holds nothing more (nodes compute tree and FEC); the same release made without
/// it is the release of before, byte for byte apart from the field.
#[test]
fn verity_records_veritysetups_root_hash_and_nothing_more_is_published() {
    let f = fixture();
    let mut rootfs = b"hsqs".to_vec();
    rootfs.extend((0..(300 * 4096 - 4) as u32).map(|i| (i % 253) as u8));
    fs::write(f.t.path().join("in.squashfs"), &rootfs).unwrap();
    let (plain_dir, verity_dir) = (f.t.path().join("plain"), f.t.path().join("verity"));
    let opts = |out: &Path| f.opts(out, "v1", Arch::X86_64, Some(1));
    let (plain, _) = create_with_verity(&opts(&plain_dir), None, &[], None, &NoProgress).unwrap();
    let vo = VerityOptions { fec_roots: 2 };
    let (m, _) = create_with_verity(&opts(&verity_dir), None, &[], Some(vo), &NoProgress).unwrap();
    let v = m.verity.clone().expect("verity recorded");
    assert!(plain.verity.is_none());
    assert!(
        !String::from_utf8(fs::read(plain_dir.join(MANIFEST_FILE)).unwrap())
            .unwrap()
            .contains("verity")
    );
    assert_eq!(
        Manifest {
            verity: None,
            ..m.clone()
        },
        plain
    );
    let names = |d: &Path| {
        let mut n: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        n.sort();
        n
    };
    assert_eq!(
        names(&plain_dir),
        names(&verity_dir),
        "no tree or FEC file is published"
    );
    assert_eq!(
        (v.data_blocks, v.hash_offset, v.fec_roots),
        (300, 300 * 4096, 2)
    );
    assert_eq!(v.salt, salt_for(&m.files.rootfs.sha256));
    // veritysetup verify agrees with the recorded root hash over a tree it makes again.
    let tree = f.t.path().join("tree");
    let out = std::process::Command::new("veritysetup")
        .args(["format", "--no-superblock", &format!("--salt={}", v.salt)])
        .arg(verity_dir.join(ROOTFS_FILE))
        .arg(&tree)
        .output()
        .unwrap();
    assert!(out.status.success());
    let ok = std::process::Command::new("veritysetup")
        .args(["verify", "--no-superblock", &format!("--salt={}", v.salt)])
        .arg(verity_dir.join(ROOTFS_FILE))
        .arg(&tree)
        .arg(&v.root_hash)
        .status()
        .unwrap();
    assert!(ok.success());
    // Signed: a node's parse sees the same field.
    let (vm, _) = verify_dir(&verity_dir, &f.trust).unwrap();
    assert_eq!(vm.verity, Some(v.clone()));
    // A root hash the rootfs does not have, signed anyway: `release verify` refuses it, once.
    let mut forged = m.clone();
    forged.verity.as_mut().unwrap().root_hash = "ab".repeat(32);
    fs::write(verity_dir.join(MANIFEST_FILE), forged.to_bytes()).unwrap();
    let key = signing::load_secret_key(&f.key).unwrap();
    fs::write(
        verity_dir.join(SIGNATURE_FILE),
        signing::sign_with(&forged.to_bytes(), &key),
    )
    .unwrap();
    let e = verify_dir(&verity_dir, &f.trust).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "its root hash is {}, the signed manifest says {}",
            v.root_hash,
            "ab".repeat(32)
        )),
        "{e}"
    );
    assert_eq!(e.matches(&v.root_hash).count(), 1, "{e}");
}

#[test]
fn verity_refuses_a_rootfs_of_partial_blocks_naming_it() {
    let f = fixture(); // 3,000,004 bytes: not whole 4 KiB blocks
    let out = f.t.path().join("rel");
    let vo = VerityOptions { fec_roots: 2 };
    let e = create_with_verity(
        &f.opts(&out, "v1", Arch::X86_64, Some(1)),
        None,
        &[],
        Some(vo),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("rootfs.squashfs")
            && e.contains("3000004 bytes is not a whole number of 4096-byte blocks"),
        "{e}"
    );
    assert!(!out.join(MANIFEST_FILE).exists(), "nothing signed");
    let vo = VerityOptions { fec_roots: 30 };
    fs::write(
        f.t.path().join("in.squashfs"),
        [b"hsqs".as_slice(), &[0; 4092]].concat(),
    )
    .unwrap();
    let e = create_with_verity(
        &f.opts(&f.t.path().join("r2"), "v1", Arch::X86_64, Some(1)),
        None,
        &[],
        Some(vo),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("FEC roots 30 is not within 2..=24"), "{e}");
}
