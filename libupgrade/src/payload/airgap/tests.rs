use super::*;

/// An archive `name` in `store` holding the one image `image` (the shared OCI-archive builder).
fn fixture(store: &Path, name: &str, image: &str) -> Archive {
    let object = store.join(name);
    std::fs::write(&object, testkit::image_archive(image, &[b"layer".to_vec()])).unwrap();
    let size = std::fs::metadata(&object).unwrap().len();
    Archive {
        name: name.into(),
        object,
        size,
        images: vec![image.to_string()],
    }
}

#[test]
fn activation_links_the_booted_slots_archives_and_only_removes_its_own_links() {
    let d = tempfile::tempdir().unwrap();
    let (store, airgap) = (d.path().join("store"), d.path().join("images"));
    std::fs::create_dir_all(&store).unwrap();
    let v1 = fixture(&store, "system-v1", "pause:3.6");
    let v2 = fixture(&store, "system-v2", "pause:3.7");
    let done = activate(&airgap, std::slice::from_ref(&v1)).unwrap();
    assert_eq!(done.linked, ["k3os-system-v1.tar"]);
    std::fs::write(airgap.join("operator.tar"), b"theirs").unwrap();
    std::os::unix::fs::symlink("/elsewhere", airgap.join("k3os-not-a-tar.txt")).unwrap();

    let done = activate(&airgap, std::slice::from_ref(&v2)).unwrap();
    assert_eq!(
        (done.linked, done.removed),
        (
            vec!["k3os-system-v2.tar".to_string()],
            vec!["k3os-system-v1.tar".to_string()]
        )
    );
    assert!(
        airgap.join("operator.tar").exists()
            && airgap.join("k3os-not-a-tar.txt").symlink_metadata().is_ok()
    );
    assert_eq!(check(&airgap, std::slice::from_ref(&v2)), Ok(()));

    // Again: nothing to do. A fallback to v1 links v1's again; the store kept it.
    assert_eq!(activate(&airgap, &[v2]).unwrap(), Activated::default());
    activate(&airgap, std::slice::from_ref(&v1)).unwrap();
    assert_eq!(check(&airgap, &[v1]), Ok(()));
}

#[test]
fn the_check_names_what_is_missing() {
    let d = tempfile::tempdir().unwrap();
    let airgap = d.path().join("images");
    let mut a = fixture(d.path(), "sys", "pause:3.6");
    let e = check(&airgap, std::slice::from_ref(&a)).unwrap_err();
    assert!(
        e.contains("k3os-sys.tar") && e.contains("No such file"),
        "{e}"
    );

    activate(&airgap, std::slice::from_ref(&a)).unwrap();
    a.images.push("coredns:1.10\u{7}".into());
    let e = check(&airgap, std::slice::from_ref(&a)).unwrap_err();
    assert!(e.ends_with("lacks coredns:1.10\\u{7}"), "{e}");

    a.size += 1;
    let e = check(&airgap, std::slice::from_ref(&a)).unwrap_err();
    assert!(e.contains("the release says"), "{e}");

    // A damaged object: no longer a tar of an image.
    std::fs::write(&a.object, b"garbage").unwrap();
    a.size = 7;
    assert!(check(&airgap, &[a]).is_err());
}
