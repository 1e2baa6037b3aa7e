//! The manifest's parser, limits and serialization against hand-written and tampered input.

use super::*;

pub(crate) fn sample() -> Manifest {
    let e = |p: &str| FileEntry {
        path: p.into(),
        size: 10,
        sha256: "ab".repeat(32),
        chunks: None,
        patches: Vec::new(),
    };
    Manifest {
        format: FORMAT,
        version: "v2".into(),
        arch: Arch::X86_64,
        generation: 2,
        files: Files {
            rootfs: e("rootfs.squashfs"),
            kernel: e("vmlinuz"),
            initrd: e("initrd"),
        },
        boot: None,
        payloads: Vec::new(),
        verity: None,
    }
}

/// A payload of `kind` named `name`, in file `<name>.tar`.
pub(crate) fn payload(kind: &str, name: &str) -> Payload {
    Payload {
        kind: kind.into(),
        name: name.into(),
        file: FileEntry {
            path: format!("{name}.tar"),
            size: 2048,
            sha256: "ef".repeat(32),
            chunks: None,
            patches: Vec::new(),
        },
        images: vec!["docker.io/rancher/mirrored-pause:3.6".into()],
    }
}

#[test]
fn file_names_with_control_characters_are_refused() {
    for bad in ["root\0fs", "a\nb", &"x".repeat(256)] {
        let mut m = sample();
        m.files.kernel.path = bad.to_string();
        let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("files.kernel.path"), "{bad:?}: {e}");
        // The refusal names the bad text escaped: no control character reaches a terminal.
        assert!(!e.chars().any(char::is_control), "{bad:?}: {e:?}");
    }
}

#[test]
fn boot_section_is_optional_and_checked() {
    let m = sample();
    assert_eq!(
        m.reads(ScriptKind::GrubCfg),
        1,
        "a release made before v0.2.0"
    );
    let text = String::from_utf8(m.to_bytes()).unwrap();
    assert!(!text.contains("boot"), "{text}");
    let mut b = sample();
    b.boot = Some(BootSupport {
        grub_script: 2,
        extlinux_conf: 1,
        scripts: vec![ScriptFile {
            kind: ScriptKind::GrubCfg,
            version: 2,
            path: "grub.cfg".into(),
            size: 10,
            sha256: "cd".repeat(32),
        }],
    });
    assert_eq!(Manifest::parse(&b.to_bytes()).unwrap(), b);
    assert_eq!(b.reads(ScriptKind::GrubCfg), 2);
    assert_eq!(b.script(ScriptKind::GrubCfg).unwrap().version, 2);
    let text = String::from_utf8(b.to_bytes()).unwrap();
    assert!(
        text.contains("\"grub-script\": 2") && text.contains("\"kind\": \"grub-cfg\""),
        "{text}"
    );
    let mut bad = b.clone();
    bad.boot.as_mut().unwrap().scripts[0].version = 3;
    let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
    assert!(
        e.contains("boot.scripts[0].version") && e.contains("1..=2"),
        "{e}"
    );
    let mut bad = b.clone();
    bad.boot.as_mut().unwrap().scripts[0].path = "vmlinuz".into();
    let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
    assert!(e.contains("boot.scripts[0].path"), "{e}");
    let mut bad = b.clone();
    let dup = bad.boot.as_ref().unwrap().scripts[0].clone();
    bad.boot.as_mut().unwrap().scripts.push(ScriptFile {
        path: "other".into(),
        ..dup
    });
    let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
    assert!(e.contains("a second GRUB script"), "{e}");
    // A newer manifest format is refused naming both.
    let newer = String::from_utf8(m.to_bytes())
        .unwrap()
        .replace("\"format\": 1", "\"format\": 2");
    let e = Manifest::parse(newer.as_bytes()).unwrap_err().to_string();
    assert!(e.contains("format 2") && e.contains("format 1"), "{e}");
}

#[test]
fn round_trip() {
    let m = sample();
    assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
}

#[test]
fn chunk_index_refs_are_optional_and_checked() {
    let m = sample();
    let text = String::from_utf8(m.to_bytes()).unwrap();
    assert!(!text.contains("chunks"), "no index, no field: {text}");
    let mut c = sample();
    c.files.rootfs.chunks = Some(IndexRef {
        path: "rootfs.squashfs.chunks".into(),
        size: 76,
        sha256: "cd".repeat(32),
    });
    assert_eq!(Manifest::parse(&c.to_bytes()).unwrap(), c);
    let mut bad = c.clone();
    bad.files.rootfs.chunks.as_mut().unwrap().path = "vmlinuz".into();
    let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
    assert!(e.contains("files.rootfs.chunks.path"), "{e}");
    let mut bad = c;
    bad.files.rootfs.chunks.as_mut().unwrap().size = MAX_INDEX_SIZE + 1;
    let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
    assert!(e.contains("files.rootfs.chunks.size"), "{e}");
}

pub(crate) fn patch(base_version: &str, path: &str) -> PatchRef {
    PatchRef {
        base: PatchBase {
            version: base_version.into(),
            size: 9,
            sha256: "12".repeat(32),
        },
        kind: "squashfs".into(),
        path: path.into(),
        size: 3,
        sha256: "34".repeat(32),
        blocks: None,
    }
}

#[test]
fn a_patch_entry_without_a_block_count_reads_as_before_and_one_with_it_round_trips() {
    let mut m = sample();
    m.files.rootfs.patches = vec![patch("v1", "rootfs.from-v1.patch")];
    let before = String::from_utf8(m.to_bytes()).unwrap();
    assert!(
        !before.contains("blocks"),
        "no count, no field: the bytes the previous build wrote: {before}"
    );
    assert_eq!(
        Manifest::parse(before.as_bytes())
            .unwrap()
            .files
            .rootfs
            .patches[0]
            .blocks,
        None
    );
    m.files.rootfs.patches[0].blocks = Some(980);
    let after = m.to_bytes();
    assert!(String::from_utf8_lossy(&after).contains("\"blocks\": 980"));
    assert_eq!(Manifest::parse(&after).unwrap(), m);
}

#[test]
fn patches_are_optional_and_checked() {
    let text = String::from_utf8(sample().to_bytes()).unwrap();
    assert!(!text.contains("patches"), "no patch, no field: {text}");
    let mut m = sample();
    m.files.rootfs.patches = vec![patch("v1", "rootfs.from-v1.patch")];
    m.files.kernel.patches = vec![PatchRef {
        kind: "a-kind-from-the-future".into(),
        ..patch("v0", "vmlinuz.from-v0.patch")
    }];
    assert_eq!(
        Manifest::parse(&m.to_bytes()).unwrap(),
        m,
        "an unknown kind is kept"
    );
    let bad = |f: &dyn Fn(&mut Manifest), want: &str| {
        let mut b = m.clone();
        f(&mut b);
        let e = Manifest::parse(&b.to_bytes()).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
        assert!(!e.chars().any(char::is_control), "{e:?}");
    };
    bad(
        &|b| b.files.rootfs.patches[0].path = "vmlinuz".into(),
        "files.rootfs.patches[0].path",
    );
    bad(
        &|b| b.files.kernel.patches[0].path = "rootfs.from-v1.patch".into(),
        "files.kernel.patches[0].path",
    );
    bad(
        &|b| b.files.rootfs.patches[0].path = "../x\n".into(),
        "files.rootfs.patches[0].path",
    );
    bad(
        &|b| b.files.rootfs.patches[0].base.sha256 = "AB".repeat(32),
        "files.rootfs.patches[0].base.sha256",
    );
    bad(
        &|b| b.files.rootfs.patches[0].size = 0,
        "files.rootfs.patches[0].size",
    );
    bad(
        &|b| b.files.rootfs.patches[0].base.version = "v 1".into(),
        "files.rootfs.patches[0].base.version",
    );
    bad(
        &|b| b.files.rootfs.patches[0].kind = "Squash\u{1b}fs".into(),
        "files.rootfs.patches[0].kind",
    );
    // A boot script may not take a patch's name either.
    bad(
        &|b| {
            b.boot = Some(BootSupport {
                grub_script: 2,
                extlinux_conf: 1,
                scripts: vec![ScriptFile {
                    kind: ScriptKind::GrubCfg,
                    version: 2,
                    path: "rootfs.from-v1.patch".into(),
                    size: 1,
                    sha256: "cd".repeat(32),
                }],
            })
        },
        "boot.scripts[0].path",
    );
}

/// v0.1.0's manifest types (commit c063939, named by CHANGELOG.md), as they were: no
/// `deny_unknown_fields`, three entries of path/size/sha256. A manifest of this release with
/// patches (and chunk indexes and a boot section) must read there as the same release.
mod v010 {
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct FileEntry {
        pub path: String,
        pub size: u64,
        pub sha256: String,
    }
    #[derive(Deserialize)]
    pub struct Files {
        pub rootfs: FileEntry,
        pub kernel: FileEntry,
        pub initrd: FileEntry,
    }
    #[derive(Deserialize)]
    pub struct Manifest {
        pub format: u32,
        pub version: String,
        pub arch: super::Arch,
        pub generation: u64,
        pub files: Files,
    }
}

#[test]
fn v010_reads_a_manifest_with_patches_as_the_same_release() {
    let mut m = sample();
    m.files.rootfs.patches = vec![PatchRef {
        blocks: Some(980),
        ..patch("v1", "rootfs.from-v1.patch")
    }];
    m.files.initrd.patches = vec![patch("v1", "initrd.from-v1.patch")];
    m.files.rootfs.chunks = Some(IndexRef {
        path: "rootfs.squashfs.chunks".into(),
        size: 76,
        sha256: "cd".repeat(32),
    });
    let old: v010::Manifest = serde_json::from_slice(&m.to_bytes()).unwrap();
    assert_eq!(
        (old.format, old.version.as_str(), old.arch, old.generation),
        (FORMAT, "v2", Arch::X86_64, 2)
    );
    for (o, n) in [
        (&old.files.rootfs, &m.files.rootfs),
        (&old.files.kernel, &m.files.kernel),
        (&old.files.initrd, &m.files.initrd),
    ] {
        assert_eq!((&o.path, o.size, &o.sha256), (&n.path, n.size, &n.sha256));
    }
}

#[test]
fn rejects_other_arch_and_bad_fields() {
    let m = sample();
    let e = m.check_arch(Arch::Aarch64).unwrap_err().to_string();
    assert!(e.contains("x86_64") && e.contains("aarch64"), "{e}");

    let mut bad = sample();
    bad.files.kernel.path = "../etc/passwd".into();
    let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
    assert!(e.contains("files.kernel.path"), "{e}");

    let mut bad = sample();
    bad.files.rootfs.sha256 = "xyz".into();
    assert!(Manifest::parse(&bad.to_bytes())
        .unwrap_err()
        .to_string()
        .contains("files.rootfs.sha256"));

    let json = String::from_utf8(sample().to_bytes()).unwrap();
    let missing = json.replace("\"initrd\": {", "\"initrd_gone\": {");
    let e = Manifest::parse(missing.as_bytes()).unwrap_err().to_string();
    assert!(e.contains("initrd"), "{e}");
}

/// A manifest v0.1.0 accepted (printable, no spaces) is still read, so a node reads what
/// it runs or keeps; only a release created or staged must have a plain name.
#[test]
fn a_version_that_is_no_plain_name_is_read_but_refused_for_a_new_release() {
    for v in ["v1:beta", "../../../../x", "v2/rc"] {
        let m = Manifest {
            version: v.into(),
            ..sample()
        };
        let read = Manifest::parse(&m.to_bytes()).unwrap();
        let e = read.check_version_name().unwrap_err().to_string();
        assert!(
            e.starts_with("manifest field version: version \"") && e.contains("not a plain name"),
            "{e}"
        );
    }
    assert!(sample().check_version_name().is_ok());
}

#[test]
fn payloads_are_optional_flattened_and_round_trip() {
    let text = String::from_utf8(sample().to_bytes()).unwrap();
    assert!(!text.contains("payloads"), "none, no field: {text}");
    let mut m = sample();
    m.payloads = vec![payload("image-archive", "k3s-images")];
    m.payloads[0].file.patches = vec![patch("v1", "k3s-images.tar.from-v1.patch")];
    let bytes = m.to_bytes();
    let text = String::from_utf8(bytes.clone()).unwrap();
    // The file entry's fields sit beside kind and name (serde flatten), as the contract says.
    assert!(text.contains("\"kind\": \"image-archive\""), "{text}");
    assert!(text.contains("\"path\": \"k3s-images.tar\""), "{text}");
    assert_eq!(Manifest::parse(&bytes).unwrap(), m);
}

#[test]
fn a_payload_of_an_unknown_kind_is_read_and_skipped_never_refused() {
    let mut m = sample();
    m.payloads = vec![
        payload("helm-chart", "traefik"),
        payload("image-archive", "k3s-images"),
    ];
    let read = Manifest::parse(&m.to_bytes()).unwrap();
    let parts: Vec<String> = crate::payload::kinds::parts(&read)
        .iter()
        .map(|p| p.part.key())
        .collect();
    assert_eq!(
        parts,
        ["rootfs", "kernel", "initrd", "payload:k3s-images"],
        "the three slot files, then the payloads this build knows"
    );
    assert_eq!(crate::payload::kinds::stored_payloads(&read).count(), 1);
    assert_eq!(
        read.entry(&Part::Payload("k3s-images".into()))
            .unwrap()
            .path,
        "k3s-images.tar"
    );
    assert!(read.entry(&Part::Payload("nope".into())).is_none());
}

#[test]
fn payload_fields_are_checked_and_names_are_unique() {
    let bad = |f: &dyn Fn(&mut Manifest), field: &str| {
        let mut m = sample();
        m.payloads = vec![payload("image-archive", "a"), payload("image-archive", "b")];
        m.payloads[1].file.path = "b.tar".into();
        f(&mut m);
        let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
        assert!(!e.chars().any(char::is_control), "{e:?}");
    };
    bad(&|m| m.payloads[1].name = "a".into(), "payloads[1].name");
    bad(&|m| m.payloads[0].name = "../x".into(), "payloads[0].name");
    bad(&|m| m.payloads[0].name = "a\nb".into(), "payloads[0].name");
    bad(
        &|m| m.payloads[0].kind = "Image Archive".into(),
        "payloads[0].kind",
    );
    bad(
        &|m| m.payloads[0].file.sha256 = "x".into(),
        "payloads[0].sha256",
    );
    bad(&|m| m.payloads[0].file.size = 0, "payloads[0].size");
    bad(
        &|m| m.payloads[1].file.path = "vmlinuz".into(),
        "payloads[1].path",
    );
    bad(
        &|m| m.payloads[1].file.path = "a.tar".into(),
        "payloads[1].path",
    );
    bad(
        &|m| m.payloads[0].images = vec!["has space".into()],
        "payloads[0].images[0]",
    );
    bad(
        &|m| m.payloads[0].file.patches = vec![patch("v1", "rootfs.squashfs")],
        "payloads[0].patches[0].path",
    );
}

/// The previous release's field set (v0.1.0, `v010`) reads a manifest with payloads as the
/// same three-file release: an old node stages the slot as before and ignores the payloads.
#[test]
fn the_previous_release_reads_a_manifest_with_payloads_as_the_same_slot() {
    let mut m = sample();
    m.payloads = vec![payload("image-archive", "k3s-images")];
    m.payloads[0].file.chunks = Some(IndexRef {
        path: "k3s-images.tar.chunks".into(),
        size: 76,
        sha256: "cd".repeat(32),
    });
    let bytes = m.to_bytes();
    assert!(Manifest::parse(&bytes).is_ok());
    let old: v010::Manifest = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((old.version.as_str(), old.generation), ("v2", 2));
    for (o, n) in [
        (&old.files.rootfs, &m.files.rootfs),
        (&old.files.kernel, &m.files.kernel),
        (&old.files.initrd, &m.files.initrd),
    ] {
        assert_eq!((&o.path, o.size, &o.sha256), (&n.path, n.size, &n.sha256));
    }
}

#[test]
fn a_part_is_written_as_before_for_the_slot_files_and_as_payload_name_otherwise() {
    for a in Artifact::ALL {
        let j = serde_json::to_string(&Part::Slot(a)).unwrap();
        assert_eq!(
            j,
            serde_json::to_string(&a).unwrap(),
            "what earlier builds wrote"
        );
        assert_eq!(serde_json::from_str::<Part>(&j).unwrap(), Part::Slot(a));
    }
    let p = Part::Payload("k3s-images".into());
    let j = serde_json::to_string(&p).unwrap();
    assert_eq!(j, "\"payload:k3s-images\"");
    assert_eq!(serde_json::from_str::<Part>(&j).unwrap(), p);
    assert_eq!(p.to_string(), "payload k3s-images");
    for bad in ["\"payload:../x\"", "\"swap\"", "\"payload:\""] {
        assert!(serde_json::from_str::<Part>(bad).is_err(), "{bad}");
    }
}

/// [`sample`] with a `verity` entry of 836 data blocks and FEC roots 2 (root hash `cd…`).
pub(crate) fn with_verity() -> Manifest {
    let mut m = sample();
    m.files.rootfs.size = 836 * 4096;
    let g = crate::verity::Geometry::new(836, 2).unwrap();
    m.verity = Some(Verity {
        hash_type: 1,
        hash: "sha256".into(),
        data_block_size: 4096,
        hash_block_size: 4096,
        data_blocks: 836,
        salt: "07".repeat(32),
        root_hash: "cd".repeat(32),
        hash_offset: 836 * 4096,
        hash_size: g.hash_size(),
        hash_sha256: "ef".repeat(32),
        fec_roots: 2,
        fec_offset: 836 * 4096 + g.hash_size(),
        fec_size: g.fec_size(),
        fec_sha256: "12".repeat(32),
    });
    m
}

/// A manifest without `verity` (every one written before it) reads and writes as before; one
/// with it round-trips.
#[test]
fn verity_is_optional_and_round_trips() {
    let plain = sample().to_bytes();
    assert!(!String::from_utf8(plain.clone()).unwrap().contains("verity"));
    assert_eq!(Manifest::parse(&plain).unwrap(), sample());
    let m = with_verity();
    assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
}

/// Every value a node would trust is checked against the others: each tamper is refused
/// naming its field, escaped.
#[test]
fn verity_fields_that_disagree_are_refused_by_name() {
    type Edit = fn(&mut Verity);
    let cases: [(&str, Edit); 10] = [
        ("verity.hash", |v| v.hash = "md5\n".into()),
        ("verity.data_block_size", |v| v.data_block_size = 512),
        ("verity.data_blocks", |v| v.data_blocks = 835),
        ("verity.fec_roots", |v| v.fec_roots = 1),
        ("verity.hash_offset", |v| v.hash_offset += 4096),
        ("verity.hash_size", |v| v.hash_size = 4096),
        ("verity.fec_offset", |v| v.fec_offset = 0),
        ("verity.fec_size", |v| v.fec_size += 1),
        ("verity.salt", |v| v.salt = "0g".into()),
        ("verity.root_hash", |v| v.root_hash = "CD".repeat(32)),
    ];
    for (field, edit) in cases {
        let mut m = with_verity();
        edit(m.verity.as_mut().unwrap());
        let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("manifest field {field}:")),
            "{field}: {e}"
        );
        assert!(!e.chars().any(char::is_control), "{e:?}");
    }
    let mut m = with_verity();
    m.files.rootfs.size = u64::MAX - 4095;
    let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
    assert!(
        e.contains("verity.data_blocks") && e.contains("over the"),
        "{e}"
    );
    let mut m = with_verity();
    m.files.rootfs.size += 1;
    let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
    assert!(
        e.contains("verity.data_blocks") && e.contains("3424257 bytes"),
        "{e}"
    );
}
