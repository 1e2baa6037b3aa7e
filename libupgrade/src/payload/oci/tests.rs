//! Image archives built here with `tar` (one builder, [`Layout`]), plus skopeo's own output.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::*;

/// An image archive being built: blobs and JSON documents, written as a plain tar.
#[derive(Default)]
struct Layout {
    members: Vec<(String, Vec<u8>)>,
}

fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

fn descriptor(media: &str, b: &[u8]) -> serde_json::Value {
    serde_json::json!({"mediaType": media, "digest": digest(b), "size": b.len()})
}

impl Layout {
    fn blob(&mut self, b: &[u8]) -> &mut Self {
        let hex = digest(b)[7..].to_string();
        self.members
            .push((format!("blobs/sha256/{hex}"), b.to_vec()));
        self
    }

    /// One single-platform image: config, one layer, its manifest blob; returns the
    /// manifest's descriptor.
    fn image(&mut self, layer: &[u8]) -> serde_json::Value {
        let config =
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
                .to_vec();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
        }))
        .unwrap();
        self.blob(&config).blob(layer).blob(&manifest);
        descriptor("application/vnd.oci.image.manifest.v1+json", &manifest)
    }

    fn index(&mut self, manifests: Vec<serde_json::Value>) -> &mut Self {
        let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests});
        self.file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
        self.file("index.json", &serde_json::to_vec(&index).unwrap())
    }

    fn file(&mut self, name: &str, b: &[u8]) -> &mut Self {
        self.members.push((name.to_string(), b.to_vec()));
        self
    }

    fn write(&self, dir: &Path) -> PathBuf {
        let p = dir.join("images.tar");
        let mut t = tar::Builder::new(std::fs::File::create(&p).unwrap());
        for (name, b) in &self.members {
            let mut h = tar::Header::new_gnu();
            h.set_size(b.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            t.append_data(&mut h, name, &b[..]).unwrap();
        }
        t.finish().unwrap();
        p
    }
}

fn named(d: serde_json::Value, name: &str) -> serde_json::Value {
    let mut d = d;
    d["annotations"] = serde_json::json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name,
    });
    d
}

fn err(p: &Path) -> String {
    archive_images(p).unwrap_err().to_string()
}

#[test]
fn an_oci_layout_names_its_images() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Layout::default();
    let a = l.image(b"layer a");
    let b = l.image(b"layer b");
    l.index(vec![
        named(a, "docker.io/rancher/mirrored-pause:3.6"),
        named(b, "docker.io/rancher/klipper-lb:v0.4.4"),
    ]);
    assert_eq!(
        archive_images(&l.write(dir.path())).unwrap(),
        [
            "docker.io/rancher/klipper-lb:v0.4.4",
            "docker.io/rancher/mirrored-pause:3.6",
        ]
    );
}

#[test]
fn a_multi_platform_index_is_checked_one_level_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Layout::default();
    let amd = l.image(b"amd64 layer");
    let arm = l.image(b"arm64 layer");
    let inner =
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [amd, arm]}))
            .unwrap();
    l.blob(&inner);
    let d = descriptor("application/vnd.oci.image.index.v1+json", &inner);
    l.index(vec![named(d, "docker.io/library/k3os-ops:0.2.0")]);
    assert!(archive_images(&l.write(dir.path()))
        .unwrap()
        .contains(&"docker.io/library/k3os-ops:0.2.0".to_string()));
}

#[test]
fn a_missing_or_short_blob_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Layout::default();
    let a = l.image(b"layer a");
    l.members
        .retain(|(n, b)| !(n.starts_with("blobs/") && b == b"layer a"));
    l.index(vec![named(a, "x:1")]);
    let e = err(&l.write(dir.path()));
    assert!(
        e.contains("blob sha256:") && e.contains("is missing"),
        "{e}"
    );

    let mut l = Layout::default();
    let mut a = l.image(b"layer a");
    a["size"] = serde_json::json!(9999);
    l.index(vec![named(a, "x:1")]);
    let e = err(&l.write(dir.path()));
    assert!(e.contains("its descriptor says 9999"), "{e}");
}

#[test]
fn a_docker_archive_names_its_repo_tags() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Layout::default();
    l.file("abc.json", b"{}").file("abc/layer.tar", b"layer");
    let m = serde_json::json!([{"Config": "abc.json", "RepoTags": ["rancher/mirrored-coredns-coredns:1.10.1"], "Layers": ["abc/layer.tar"]}]);
    l.file("manifest.json", &serde_json::to_vec(&m).unwrap());
    let p = l.write(dir.path());
    assert_eq!(
        archive_images(&p).unwrap(),
        ["rancher/mirrored-coredns-coredns:1.10.1"]
    );

    l.members.retain(|(n, _)| n != "abc/layer.tar");
    let e = err(&l.write(dir.path()));
    assert!(
        e.contains("names 'abc/layer.tar', which is not in the archive"),
        "{e}"
    );
}

#[test]
fn bad_archives_are_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("images.tar.zst");
    std::fs::write(&p, [0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]).unwrap();
    assert!(err(&p).contains("is zstd-compressed: publish the plain .tar"));

    let mut l = Layout::default();
    l.file("hello.txt", b"hi");
    assert!(err(&l.write(dir.path())).contains("has neither index.json"));

    let mut l = Layout::default();
    let a = l.image(b"layer");
    l.index(vec![a]);
    assert!(err(&l.write(dir.path())).contains("names no image"));

    let mut l = Layout::default();
    let a = l.image(b"layer");
    l.index(vec![named(a, "evil\u{1b}[2J:1")]);
    let e = err(&l.write(dir.path()));
    assert!(e.contains("\\u{1b}") && !e.contains('\u{1b}'), "{e}");

    let mut l = Layout::default();
    l.index(vec![
        serde_json::json!({"digest": "sha256:../../etc", "size": 1}),
    ]);
    assert!(err(&l.write(dir.path())).contains("is not a digest"));

    // Cut inside a layer: its header says more bytes than the file has.
    let mut l = Layout::default();
    let a = l.image(&[7u8; 4096]);
    l.index(vec![named(a, "x:1")]);
    let p = l.write(dir.path());
    let full = std::fs::read(&p).unwrap();
    let at = full.windows(64).position(|w| w == [7u8; 64]).unwrap() + 100;
    std::fs::write(&p, &full[..at]).unwrap();
    assert!(err(&p).contains("truncated"), "{}", err(&p));

    std::fs::write(dir.path().join("short.tar"), b"not a tar at all").unwrap();
    assert!(archive_images(&dir.path().join("short.tar")).is_err());
}

/// What the tar crate and serde_json say quotes the archive's own text (a member's name, a
/// JSON string): it is escaped too (the `image_archive` fuzz target's first finding).
#[test]
fn the_readers_own_messages_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Layout::default();
    l.file("oci-layout\u{1e}\u{1b}[2J", b"{}");
    let p = l.write(dir.path());
    let mut b = std::fs::read(&p).unwrap();
    b[148..156].copy_from_slice(b"zz\x1bzzzz\0"); // the header's checksum field
    std::fs::write(&p, &b).unwrap();
    let e = err(&p);
    assert!(
        e.contains("not a tar") && !e.chars().any(char::is_control),
        "{e:?}"
    );

    let mut l = Layout::default();
    l.file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    l.file("index.json", b"{\"schemaVersion\": \"\x1b[2J\"}");
    let e = err(&l.write(dir.path()));
    assert!(
        e.contains("is not valid") && !e.chars().any(char::is_control),
        "{e:?}"
    );
}

/// The archive skopeo (a real OCI tool, installed by scripts/setup.sh) writes from one of
/// ours is read the same: our reading is not only of our own writing.
#[test]
fn skopeo_s_archives_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Layout::default();
    let a = l.image(b"layer a");
    l.index(vec![named(a, "docker.io/library/app:1")]);
    let src = l.write(dir.path());
    let out = dir.path().join("copied.tar");
    let status = std::process::Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--quiet"])
        .arg(format!(
            "oci-archive:{}:docker.io/library/app:1",
            src.display()
        ))
        .arg(format!(
            "oci-archive:{}:docker.io/library/app:2",
            out.display()
        ))
        .status()
        .expect("skopeo runs (scripts/setup.sh installs it)");
    assert!(status.success(), "skopeo copy: {status}");
    let names = archive_images(&out).unwrap();
    assert!(
        names.contains(&"docker.io/library/app:2".to_string()),
        "{names:?}"
    );
}
