use super::github::next_link;
use super::*;
use std::fs;

#[test]
fn index_formats_old_and_newer() {
    // v0.1.0 wrote no format field.
    let old = br#"{"releases":[{"version":"v1","generation":1,"arch":"x86_64","path":"v1/"}]}"#;
    let i = Index::parse(old, "index.json").unwrap();
    assert_eq!(i.format, 1);
    assert!(String::from_utf8(i.to_bytes())
        .unwrap()
        .contains("\"format\": 1"));
    let newer = br#"{"format":2,"entries":{}}"#;
    let e = Index::parse(newer, "channel x index.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("channel x index.json is index format 2") && e.contains("(format 1)"),
        "{e}"
    );
}

fn entry(v: &str, g: u64, arch: Arch, path: &str) -> IndexEntry {
    IndexEntry {
        version: v.into(),
        generation: g,
        arch,
        path: path.into(),
    }
}

#[test]
fn index_sorted_newest_first_and_latest_per_arch() {
    let unsorted = Index {
        format: INDEX_FORMAT,
        releases: vec![
            entry("v1", 1, Arch::X86_64, "v1/"),
            entry("v3-arm", 3, Arch::Aarch64, "v3a/"),
            entry("v2", 2, Arch::X86_64, "v2/"),
            entry("v10", 10, Arch::X86_64, "v10/"),
        ],
    };
    let index = Index::parse(&unsorted.to_bytes(), "test").unwrap();
    let order: Vec<_> = index.releases.iter().map(|e| e.generation).collect();
    assert_eq!(order, vec![10, 3, 2, 1]);
    assert_eq!(index.find(None, Arch::X86_64).unwrap().version, "v10");
    assert_eq!(
        index.find(Some("latest"), Arch::Aarch64).unwrap().version,
        "v3-arm"
    );
    assert_eq!(index.find(Some("v2"), Arch::X86_64).unwrap().path, "v2/");
    assert!(index.find(Some("v2"), Arch::Aarch64).is_none());
}

#[test]
fn index_entries_whose_version_is_not_a_plain_name_are_dropped() {
    let mixed = br#"{"releases":[{"version":"v1","generation":1,"arch":"x86_64","path":"v1/"},
        {"version":"../../x","generation":9,"arch":"x86_64","path":"x/"}]}"#;
    let i = Index::parse(mixed, "index.json").unwrap();
    let versions: Vec<&str> = i.releases.iter().map(|e| e.version.as_str()).collect();
    assert_eq!(versions, ["v1"]);
    assert_eq!(i.find(None, Arch::X86_64).unwrap().version, "v1");
}

#[test]
fn index_paths_must_stay_inside_channel() {
    for bad in ["../x/", "/etc/", "http://evil/", "a/../../b", ""] {
        let i = Index {
            format: INDEX_FORMAT,
            releases: vec![entry("v1", 1, Arch::X86_64, bad)],
        };
        let e = Index::parse(&i.to_bytes(), "t").unwrap_err();
        assert!(matches!(e, ChannelError::BadPath { .. }), "{bad}: {e}");
    }
}

#[test]
fn local_channel_resolve_and_not_found() {
    let t = tempfile::tempdir().unwrap();
    let i = Index {
        format: INDEX_FORMAT,
        releases: vec![
            entry("v1", 1, Arch::X86_64, "v1/"),
            entry("v2", 2, Arch::X86_64, "rel-2"),
        ],
    };
    fs::write(t.path().join(INDEX_FILE), i.to_bytes()).unwrap();
    let ch = t.path().to_str().unwrap();
    let r = resolve(ch, None, Arch::X86_64).unwrap();
    assert_eq!((r.version.as_str(), r.generation), ("v2", 2));
    assert_eq!(r.location, format!("{}/rel-2/", ch));
    assert_eq!(
        r.source.location(MANIFEST_FILE),
        format!("{}/rel-2/manifest.json", ch)
    );
    let r = resolve(&format!("file://{ch}/index.json"), Some("v1"), Arch::X86_64).unwrap();
    assert_eq!(r.location, format!("{}/v1/", ch));
    let e = resolve(ch, Some("v3"), Arch::X86_64)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no release v3 for x86_64") && e.contains("v2 (x86_64, generation 2)"),
        "{e}"
    );
    let e = resolve(ch, None, Arch::Aarch64).unwrap_err().to_string();
    assert!(e.contains("latest for aarch64"), "{e}");
    let e = list("/nonexistent/channel").unwrap_err().to_string();
    assert!(e.contains("/nonexistent/channel/index.json"), "{e}");
}

#[test]
fn channel_strings() {
    assert!(matches!(
        parse_channel("github-releases://rancher/k3os").unwrap(),
        Kind::GitHub { .. }
    ));
    for bad in [
        "github-releases://rancher",
        "github-releases://a/b/c",
        "github-releases://../x",
        "ftp://x/",
    ] {
        assert!(
            matches!(parse_channel(bad), Err(ChannelError::BadChannel { .. })),
            "{bad}"
        );
    }
    let Kind::Http { base, index } = parse_channel("http://h:1/chan").unwrap() else {
        panic!()
    };
    assert_eq!(
        (base.as_str(), index.as_str()),
        ("http://h:1/chan/", "http://h:1/chan/index.json")
    );
    let Kind::Http { base, index } = parse_channel("http://h:1/chan/index.json").unwrap() else {
        panic!()
    };
    assert_eq!(
        (base.as_str(), index.as_str()),
        ("http://h:1/chan/", "http://h:1/chan/index.json")
    );
}

#[test]
fn link_header_next() {
    let l = r#"<https://api.github.com/repositories/1/releases?page=2>; rel="next", <https://x/?page=5>; rel="last""#;
    assert_eq!(
        next_link(l).unwrap(),
        "https://api.github.com/repositories/1/releases?page=2"
    );
    assert_eq!(next_link(r#"<https://x/?page=1>; rel="prev""#), None);
}
