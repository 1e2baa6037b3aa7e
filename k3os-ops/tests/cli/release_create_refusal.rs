//! `release create` is all or nothing for its output directory: it builds the release in a
//! hidden directory beside it and moves it into place only when complete, so a refusal at any
//! step leaves the output directory as it was: absent stays absent, an existing one keeps its
//! bytes, and no staging directory is left beside it. Two refusals: an image archive missing
//! a layer (found while the files are already being copied) and a rootfs that is no squashfs
//! (found before). The same inputs, corrected, then make the release. An output directory
//! that already holds an earlier build's files is left as it was too: one with its manifest is
//! refused as a release already there, one without it by the same two refusals, and one with a
//! directory where the release puts a file before anything is moved into it.

use std::fs;
use std::path::Path;

use k3os_ops_testing::cli::Node;
use testkit::{image_archive, image_archive_missing_layer, pseudo_random};

/// The inputs of `version` under `<node>/<version>.in/` (rootfs, kernel, initrd, one image
/// archive missing its last layer `broken.tar` and its complete twin `site.tar`).
fn inputs(n: &Node, version: &str) -> std::path::PathBuf {
    let dir = n.path().join(format!("{version}.in"));
    let tree = dir.join("tree");
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::write(
        tree.join("etc/k3os-release"),
        format!("VERSION={version}\n"),
    )
    .unwrap();
    testkit::squashfs(&tree, &dir.join("rootfs"), &[]);
    fs::write(dir.join("kernel"), pseudo_random(100_000, 8)).unwrap();
    fs::write(dir.join("initrd"), pseudo_random(50_000, 9)).unwrap();
    let layers = [pseudo_random(300_000, 31), pseudo_random(200_000, 32)];
    let name = "registry.local/site/app:1";
    fs::write(
        dir.join("broken.tar"),
        image_archive_missing_layer(name, &layers),
    )
    .unwrap();
    fs::write(dir.join("site.tar"), image_archive(name, &layers)).unwrap();
    dir
}

/// The names in `dir` (the output's parent): no staging directory may stay behind.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn create_args(n: &Node, ins: &Path, out: &Path, rootfs: &str, image: &str) -> Vec<String> {
    let p = |f: &str| ins.join(f).display().to_string();
    let mut v: Vec<String> = ["release", "create", "--rootfs"].map(String::from).to_vec();
    v.extend([
        p(rootfs),
        "--kernel".into(),
        p("kernel"),
        "--initrd".into(),
        p("initrd"),
    ]);
    v.extend(["--version", "v2", "--generation", "2", "--arch"].map(String::from));
    v.push(libupgrade::manifest::Arch::host().as_str().into());
    v.push("--key".into());
    v.push(n.path().join("keys/node.key").display().to_string());
    v.extend(["--image".into(), format!("site={}", p(image))]);
    v.extend(["-o".into(), out.display().to_string()]);
    v
}

#[test]
fn a_refused_release_create_leaves_its_output_directory_as_it_was() {
    let n = Node::new();
    let ins = inputs(&n, "v2");
    let parent = n.path().join("channel");
    fs::create_dir_all(&parent).unwrap();
    let absent = parent.join("v2");
    let existing = parent.join("v2-existing");
    fs::create_dir_all(&existing).unwrap();
    fs::write(existing.join("NOTES"), b"the publisher's own file\n").unwrap();
    let refusals = [
        (
            "an image archive missing a layer",
            "rootfs",
            "broken.tar",
            "is missing",
        ),
        (
            "a rootfs that is no squashfs",
            "kernel",
            "site.tar",
            "not a squashfs image",
        ),
    ];
    for (why, rootfs, image, said) in refusals {
        for out in [&absent, &existing] {
            let case = format!("release create into {} with {why}", out.display());
            let before_parent = names(&parent);
            let before = out.exists().then(|| testkit::tree_bytes(out));
            let args = create_args(&n, &ins, out, rootfs, image);
            let out_run = n.ops(&args.iter().map(String::as_str).collect::<Vec<_>>());
            let err = String::from_utf8_lossy(&out_run.stderr);
            assert!(!out_run.status.success(), "{case}: created it");
            assert!(err.contains(said), "{case}: no {said:?} in {err}");
            assert_eq!(names(&parent), before_parent, "{case}: the parent changed");
            match &before {
                None => assert!(!out.exists(), "{case}: {} was made", out.display()),
                Some(b) => testkit::assert_same_tree(&case, b, &testkit::tree_bytes(out)),
            }
        }
    }
    // Corrected, both are made; the existing directory keeps its own file.
    for out in [&absent, &existing] {
        let args = create_args(&n, &ins, out, "rootfs", "site.tar");
        n.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.join("manifest.json").is_file());
    }
    assert_eq!(
        fs::read(existing.join("NOTES")).unwrap(),
        b"the publisher's own file\n"
    );
    assert_eq!(names(&parent), ["v2", "v2-existing"]);
}

/// Run `release create` with `args`; it must refuse saying `said` and leave `out` and its
/// parent exactly as they were.
fn assert_refused_untouched(n: &Node, case: &str, args: &[String], out: &Path, said: &str) {
    let parent = out.parent().unwrap();
    let before_parent = names(parent);
    let before = testkit::tree_bytes(out);
    let run = n.ops(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{case}: created it");
    assert!(err.contains(said), "{case}: no {said:?} in {err}");
    assert_eq!(names(parent), before_parent, "{case}: the parent changed");
    testkit::assert_same_tree(case, &before, &testkit::tree_bytes(out));
}

#[test]
fn a_refused_release_create_leaves_an_earlier_builds_files_as_they_were() {
    let n = Node::new();
    let ins = inputs(&n, "v2");
    let parent = n.path().join("channel");
    fs::create_dir_all(&parent).unwrap();
    // An earlier build of the release, complete.
    let held = parent.join("v2-held");
    let args = create_args(&n, &ins, &held, "rootfs", "site.tar");
    n.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // The same files without their manifest and signature (a half-removed release), and
    // again with a directory where the release puts its image archive.
    let stale = parent.join("v2-stale");
    let blocked = parent.join("v2-blocked");
    for d in [&stale, &blocked] {
        fs::create_dir_all(d).unwrap();
        for e in fs::read_dir(&held).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), d.join(e.file_name())).unwrap();
        }
        fs::remove_file(d.join("manifest.json")).unwrap();
        fs::remove_file(d.join("manifest.json.sig")).unwrap();
    }
    // An earlier build's bytes differ from this one's: a file moved in would show.
    for e in fs::read_dir(&blocked).unwrap() {
        let p = e.unwrap().path();
        let mut b = fs::read(&p).unwrap();
        b.extend_from_slice(b"earlier build");
        fs::write(&p, b).unwrap();
    }
    fs::remove_file(blocked.join("site.tar")).unwrap();
    fs::create_dir_all(blocked.join("site.tar")).unwrap();
    fs::write(blocked.join("site.tar/NOTES"), b"kept\n").unwrap();

    let good = |out: &Path| create_args(&n, &ins, out, "rootfs", "site.tar");
    assert_refused_untouched(
        &n,
        "into a release",
        &good(&held),
        &held,
        "already holds a release",
    );
    for (why, rootfs, image, said) in [
        ("a missing layer", "rootfs", "broken.tar", "is missing"),
        ("no squashfs", "kernel", "site.tar", "not a squashfs image"),
    ] {
        let args = create_args(&n, &ins, &stale, rootfs, image);
        assert_refused_untouched(
            &n,
            &format!("over an earlier build's files, {why}"),
            &args,
            &stale,
            said,
        );
    }
    assert_refused_untouched(
        &n,
        "a directory in the way",
        &good(&blocked),
        &blocked,
        "is in the way",
    );
    // Over the earlier build's files, corrected: made.
    n.ok(&good(&stale).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(stale.join("manifest.json").is_file());
}
