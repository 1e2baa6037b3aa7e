//! Channels: index ordering and `latest` over a served directory, `release create` keeping a
//! channel's index current, and `github-releases://` resolution against a local server that
//! imitates GitHub's releases API layout.

use k3os_ops_testing::release as release_support;

use std::fs;
use std::path::Path;
use std::process::Command;

use libupgrade::channel;

use libupgrade::channel::ChannelError;
use libupgrade::manifest::{Arch, MANIFEST_FILE, SIGNATURE_FILE};
use libupgrade::signing;
use release_support::{bin, create, fake_inputs, keys, Server};

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn cli_channel_create_index_resolve_over_http() {
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s).display().to_string();
    let (ok, out, err) = run(&["release", "keygen", "-o", &p("keys")]);
    assert!(ok, "{err}");
    assert!(out.contains("key id"), "{out}");
    fs::create_dir(t.path().join("trust")).unwrap();
    fs::copy(
        t.path().join("keys/release.pub"),
        t.path().join("trust/release.pub"),
    )
    .unwrap();
    let inputs = fake_inputs(&t.path().join("in"), "a");
    let (r, k, i) = (
        inputs.0.display().to_string(),
        inputs.1.display().to_string(),
        inputs.2.display().to_string(),
    );
    let create = |out: &str, version: &str, arch: &str, generation: Option<&str>| {
        let mut args = vec![
            "release", "create", "--rootfs", &r, "--kernel", &k, "--initrd", &i,
        ];
        args.extend(["--version", version, "--arch", arch, "--key"]);
        let key = p("keys/release.key");
        let mut owned = args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        owned.push(key);
        owned.extend(["-o".to_string(), out.to_string()]);
        if let Some(g) = generation {
            owned.extend(["--generation".to_string(), g.to_string()]);
        }
        let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
        run(&refs)
    };

    // Outside a channel the generation is required, and nothing is written.
    let (ok, _, err) = create(&p("loose"), "v1", "x86_64", None);
    assert!(!ok);
    assert!(err.contains("pass --generation N"), "{err}");
    assert!(!t.path().join("loose").exists());

    let chan = p("chan");
    fs::create_dir(&chan).unwrap();
    let (ok, out, err) = run(&["release", "index", &chan]);
    assert!(ok && out.contains("0 releases"), "{out}{err}");
    for (dir, v, arch) in [
        ("v1.0", "v1.0", "amd64"),
        ("v1.1", "v1.1", "x86_64"),
        ("v1.1-arm", "v1.1", "arm64"),
        ("v1.2", "v1.2", "x86_64"),
    ] {
        let (ok, out, err) = create(&format!("{chan}/{dir}"), v, arch, None);
        assert!(ok, "{dir}: {out}{err}");
    }
    let index = channel::read_local_index(Path::new(&chan)).unwrap();
    let got: Vec<_> = index
        .releases
        .iter()
        .map(|e| (e.version.as_str(), e.generation, e.arch, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("v1.2", 3, Arch::X86_64, "v1.2/"),
            ("v1.1", 2, Arch::Aarch64, "v1.1-arm/"),
            ("v1.1", 2, Arch::X86_64, "v1.1/"),
            ("v1.0", 1, Arch::X86_64, "v1.0/")
        ]
    );
    // A rebuilt index is identical.
    let before = fs::read(format!("{chan}/index.json")).unwrap();
    assert!(run(&["release", "index", &chan]).0);
    assert_eq!(fs::read(format!("{chan}/index.json")).unwrap(), before);

    let (ok, out, err) = run(&[
        "release",
        "verify",
        &format!("{chan}/v1.2"),
        "--trust-dir",
        &p("trust"),
    ]);
    assert!(ok && out.contains("all files match"), "{out}{err}");

    let srv = Server::start(Path::new(&chan));
    let latest = channel::resolve(&srv.url, None, Arch::X86_64).unwrap();
    assert_eq!((latest.version.as_str(), latest.generation), ("v1.2", 3));
    assert_eq!(latest.location, format!("{}v1.2/", srv.url));
    let arm = channel::resolve(
        &format!("{}index.json", srv.url),
        Some("latest"),
        Arch::Aarch64,
    )
    .unwrap();
    assert_eq!(
        (arm.version.as_str(), arm.location.clone()),
        ("v1.1", format!("{}v1.1-arm/", srv.url))
    );
    let old = channel::resolve(srv.url.trim_end_matches('/'), Some("v1.0"), Arch::X86_64).unwrap();
    assert_eq!(old.generation, 1);
    // The resolved source yields the signed manifest the node will verify.
    let m = old
        .source
        .read_small(MANIFEST_FILE, Default::default())
        .unwrap();
    let s = old
        .source
        .read_small(SIGNATURE_FILE, Default::default())
        .unwrap();
    signing::verify(&m, &s, &t.path().join("trust")).unwrap();

    let e = channel::resolve(&srv.url, Some("v9"), Arch::X86_64).unwrap_err();
    assert!(matches!(e, ChannelError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("v1.2 (x86_64, generation 3)"), "{e}");
    let (ok, out, _) = run(&["release", "resolve", &srv.url, "--arch", "aarch64"]);
    assert!(
        ok && out.contains("v1.1") && out.contains("v1.1-arm/"),
        "{out}"
    );
    let (ok, out, _) = run(&["release", "list", &srv.url]);
    assert!(ok && out.lines().count() == 4, "{out}");

    // An unsigned release directory is refused by the indexer, naming it.
    fs::remove_file(format!("{chan}/v1.0/{SIGNATURE_FILE}")).unwrap();
    let (ok, _, err) = run(&["release", "index", &chan]);
    assert!(
        !ok && err.contains("v1.0") && err.contains("no manifest.json.sig"),
        "{err}"
    );

    // A channel that is not there is reported with the URL tried.
    let e = channel::list(&format!("{}nope/", srv.url))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope/index.json") && e.contains("404"), "{e}");
}

/// One GitHub release in the imitation API.
struct GhRel {
    tag: &'static str,
    draft: bool,
    prerelease: bool,
    /// (asset name, file on disk under `dl/<tag>/`)
    assets: Vec<String>,
}

/// The `GET /repos/OWNER/REPO/releases` answer for `rels` (assets under `root/dl/<tag>/`),
/// every asset uploaded at `stamp`.
fn releases_json(base: &str, root: &Path, rels: &[GhRel], stamp: &str) -> String {
    let items: Vec<serde_json::Value> = rels
        .iter()
        .enumerate()
        .map(|(n, r)| {
            serde_json::json!({
                "url": format!("{base}api/repos/acme/nodeos/releases/{n}"),
                "id": 1000 + n,
                "tag_name": r.tag,
                "name": format!("Release {}", r.tag),
                "draft": r.draft,
                "prerelease": r.prerelease,
                "created_at": "2026-12-01T10:00:00Z",
                "assets": r.assets.iter().enumerate().map(|(k, a)| serde_json::json!({
                    "id": 5000 + 10 * n + k,
                    "name": a,
                    "content_type": "application/octet-stream",
                    "state": "uploaded",
                    "size": fs::metadata(root.join("dl").join(r.tag).join(a)).unwrap().len(),
                    "updated_at": stamp,
                    "browser_download_url": format!("{base}dl/{}/{a}", r.tag),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::to_string_pretty(&items).unwrap()
}

/// Copy a release directory's files into `dl/<tag>/` as assets, each name prefixed.
fn publish(release_dir: &Path, dl: &Path, prefix: &str) -> Vec<String> {
    fs::create_dir_all(dl).unwrap();
    let mut names = Vec::new();
    for e in fs::read_dir(release_dir).unwrap() {
        let e = e.unwrap();
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        fs::copy(e.path(), dl.join(&name)).unwrap();
        names.push(name);
    }
    names.sort();
    names
}

#[test]
fn github_releases_resolution() {
    let t = tempfile::tempdir().unwrap();
    let (key, trust) = keys(t.path(), "gh");
    let root = t.path().join("site");
    fs::create_dir_all(root.join("api/repos/acme/nodeos")).unwrap();
    let log = t.path().join("requests.log");
    let srv = Server::start_logged(&root, &log);
    let build = t.path().join("build");

    // v1: single-arch release with plain asset names.
    create(
        &fake_inputs(&build.join("in1"), "one"),
        &key,
        &build.join("v1"),
        "v1.0.0",
        Arch::X86_64,
        Some(1),
    );
    let v1 = publish(&build.join("v1"), &root.join("dl/v1.0.0"), "");
    // v2: both architectures in one release, arch-prefixed assets.
    create(
        &fake_inputs(&build.join("in2"), "two-x86"),
        &key,
        &build.join("v2x"),
        "v2.0.0",
        Arch::X86_64,
        Some(2),
    );
    create(
        &fake_inputs(&build.join("in2a"), "two-arm"),
        &key,
        &build.join("v2a"),
        "v2.0.0",
        Arch::Aarch64,
        Some(2),
    );
    let mut v2 = publish(&build.join("v2x"), &root.join("dl/v2.0.0"), "x86_64-");
    v2.extend(publish(
        &build.join("v2a"),
        &root.join("dl/v2.0.0"),
        "arm64-",
    ));
    // v3-rc: a prerelease with a higher generation; v4: a draft.
    create(
        &fake_inputs(&build.join("in3"), "three"),
        &key,
        &build.join("v3"),
        "v3.0.0-rc1",
        Arch::X86_64,
        Some(3),
    );
    let v3 = publish(&build.join("v3"), &root.join("dl/v3.0.0-rc1"), "");
    create(
        &fake_inputs(&build.join("in4"), "four"),
        &key,
        &build.join("v4"),
        "v4.0.0",
        Arch::X86_64,
        Some(4),
    );
    let v4 = publish(&build.join("v4"), &root.join("dl/v4.0.0"), "");
    // v0.9.0: an old release whose manifest asset is garbage; it must not block `latest`.
    fs::create_dir_all(root.join("dl/v0.9.0")).unwrap();
    fs::write(root.join("dl/v0.9.0/manifest.json"), "<html>oops</html>").unwrap();
    let rels = [
        GhRel {
            tag: "v4.0.0",
            draft: true,
            prerelease: false,
            assets: v4,
        },
        GhRel {
            tag: "v3.0.0-rc1",
            draft: false,
            prerelease: true,
            assets: v3,
        },
        GhRel {
            tag: "v2.0.0",
            draft: false,
            prerelease: false,
            assets: v2,
        },
        GhRel {
            tag: "v1.0.0",
            draft: false,
            prerelease: false,
            assets: v1,
        },
        GhRel {
            tag: "v0.9.0",
            draft: false,
            prerelease: false,
            assets: vec![MANIFEST_FILE.to_string()],
        },
    ];
    fs::write(
        root.join("api/repos/acme/nodeos/releases"),
        releases_json(&srv.url, &root, &rels, "2026-12-01T10:00:00Z"),
    )
    .unwrap();
    let _github = release_support::github_api(&format!("{}api", srv.url));
    let ch = "github-releases://acme/nodeos";

    let latest = channel::resolve(ch, None, Arch::X86_64).unwrap();
    assert_eq!(
        (latest.version.as_str(), latest.generation),
        ("v2.0.0", 2),
        "no draft, no prerelease"
    );
    assert_eq!(
        latest.location,
        format!("{}dl/v2.0.0/x86_64-manifest.json", srv.url)
    );
    let m = latest
        .source
        .read_small(MANIFEST_FILE, Default::default())
        .unwrap();
    let s = latest
        .source
        .read_small(SIGNATURE_FILE, Default::default())
        .unwrap();
    signing::verify(&m, &s, &trust).unwrap();
    let mut rootfs = Vec::new();
    std::io::Read::read_to_end(
        &mut latest.source.open("rootfs.squashfs", 0).unwrap().0,
        &mut rootfs,
    )
    .unwrap();
    assert_eq!(rootfs, fs::read(build.join("v2x/rootfs.squashfs")).unwrap());

    // Manifests are fetched once per process: a second resolution (an agent's next poll) only
    // asks the API.
    let manifest_gets = || {
        fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("manifest.json ->"))
            .count()
    };
    let first = manifest_gets();
    assert_eq!(channel::resolve(ch, None, Arch::X86_64).unwrap(), latest);
    assert_eq!(manifest_gets(), first, "manifests were downloaded again");
    let api_lines = || {
        fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("/api/repos/acme/nodeos/releases ->"))
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        api_lines().last().map(String::as_str),
        Some("304"),
        "the API page was not re-requested conditionally: {:?}",
        api_lines()
    );
    // Re-uploaded assets (new updated_at) are fetched again.
    let api_file = root.join("api/repos/acme/nodeos/releases");
    fs::write(
        &api_file,
        releases_json(&srv.url, &root, &rels, "2026-12-02T09:00:00Z"),
    )
    .unwrap();
    assert_eq!(channel::resolve(ch, None, Arch::X86_64).unwrap(), latest);
    assert_eq!(
        manifest_gets(),
        first + 3,
        "re-uploaded manifests were not fetched again"
    );

    // Asked for by name, the broken release is an error naming its manifest URL.
    let e = channel::resolve(ch, Some("v0.9.0"), Arch::X86_64)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dl/v0.9.0/manifest.json") && e.contains("not valid JSON"),
        "{e}"
    );

    let arm = channel::resolve(ch, Some("latest"), Arch::Aarch64).unwrap();
    assert_eq!((arm.version.as_str(), arm.generation), ("v2.0.0", 2));
    assert_eq!(
        arm.source.location("vmlinuz"),
        format!("{}dl/v2.0.0/arm64-vmlinuz", srv.url)
    );
    let m = arm
        .source
        .read_small(MANIFEST_FILE, Default::default())
        .unwrap();
    assert_eq!(
        libupgrade::manifest::Manifest::parse(&m).unwrap().arch,
        Arch::Aarch64
    );

    // Asked for by version: the prerelease and an old release are reachable, the draft is not.
    let rc = channel::resolve(ch, Some("v3.0.0-rc1"), Arch::X86_64).unwrap();
    assert_eq!(rc.generation, 3);
    let old = channel::resolve(ch, Some("v1.0.0"), Arch::X86_64).unwrap();
    assert_eq!(
        old.source.location(SIGNATURE_FILE),
        format!("{}dl/v1.0.0/manifest.json.sig", srv.url)
    );
    let e = channel::resolve(ch, Some("v4.0.0"), Arch::X86_64).unwrap_err();
    assert!(matches!(e, ChannelError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("skipped v0.9.0"), "{e}");
    let e = channel::resolve(ch, Some("v1.0.0"), Arch::Aarch64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no release v1.0.0 for aarch64"), "{e}");

    let index = channel::list(ch).unwrap();
    let got: Vec<_> = index
        .releases
        .iter()
        .map(|e| (e.path.as_str(), e.arch, e.generation))
        .collect();
    assert_eq!(
        got,
        [
            ("v3.0.0-rc1", Arch::X86_64, 3),
            ("v2.0.0", Arch::Aarch64, 2),
            ("v2.0.0", Arch::X86_64, 2),
            ("v1.0.0", Arch::X86_64, 1)
        ]
    );

    // The CLI resolves through the same path.
    let (ok, out, err) = run(&["release", "resolve", ch, "--arch", "x86_64"]);
    assert!(
        ok && out.contains("v2.0.0") && out.contains("generation 2"),
        "{out}{err}"
    );

    // A repository the API does not know: the error names the URL and the status.
    let e = channel::resolve("github-releases://acme/other", None, Arch::X86_64)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/repos/acme/other/releases") && e.contains("404"),
        "{e}"
    );
    // A corrupt API answer is named too.
    fs::write(
        root.join("api/repos/acme/nodeos/releases"),
        "{\"message\": \"API rate limit exceeded\"}",
    )
    .unwrap();
    let e = channel::resolve(ch, None, Arch::X86_64)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/repos/acme/nodeos/releases") && e.contains("not valid JSON"),
        "{e}"
    );
}
