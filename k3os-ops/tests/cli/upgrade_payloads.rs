//! A release's payloads end to end through the real binary on a temp node root (issue 33):
//! `release create --image` publishes image archives (a real OCI image layout in a plain
//! tar) with chunk indexes and patches; `upgrade --plan-only` prices each payload (one the
//! store holds costs 0, a changed one its chunk or patch delta) and the stage fetches exactly
//! that; the objects land read-only in `<state>/payloads/objects/<sha256>`; `slot status`
//! lists each slot's payloads; a store budget too small refuses the release at plan time,
//! naming the bytes and writing nothing; `release bundle` carries the payloads; and a
//! `kill -9` at every `payload:` write barrier leaves both slots' payloads intact, the next
//! run completing the stage.

use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cli_support::Node;
use libupgrade::payload::object_path;
use testkit::{image_archive, pseudo_random, release_manifest};

/// The image archives of v1 and v2: `k3s` unchanged, `site` with one layer changed by 20 KB
/// (a workload bumped in the same maintenance), both sharing a base layer.
/// A release's image archives: (name, tar bytes).
type Images = Vec<(&'static str, Vec<u8>)>;

fn images() -> (Images, Images) {
    let base = pseudo_random(400_000, 31);
    let app1 = pseudo_random(600_000, 32);
    let mut app2 = app1.clone();
    app2[300_000..320_000].copy_from_slice(&pseudo_random(20_000, 33));
    let k3s = image_archive(
        "docker.io/rancher/mirrored-pause:3.6",
        std::slice::from_ref(&base),
    );
    let v1 = vec![
        ("k3s", k3s.clone()),
        (
            "site",
            image_archive("registry.local/site/app:1", &[base.clone(), app1]),
        ),
    ];
    let v2 = vec![
        ("k3s", k3s),
        (
            "site",
            image_archive("registry.local/site/app:2", &[base, app2]),
        ),
    ];
    (v1, v2)
}

/// `release create` through the binary: `version` (`generation`) with a small squashfs, a
/// kernel and initrd of noise, each of `images` as `--image NAME=FILE`, patched from `from`.
/// The directory and what it printed.
fn release(
    n: &Node,
    version: &str,
    generation: u64,
    images: &[(&str, Vec<u8>)],
    from: Option<&Path>,
) -> (PathBuf, String) {
    let inputs = n.path().join(format!("{version}.in"));
    let tree = inputs.join("tree");
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::write(
        tree.join("etc/k3os-release"),
        format!("VERSION={version}\nGENERATION={generation}\n"),
    )
    .unwrap();
    let rootfs = inputs.join("rootfs");
    testkit::squashfs(&tree, &rootfs, &[]);
    fs::write(inputs.join("kernel"), pseudo_random(100_000, 8)).unwrap();
    fs::write(inputs.join("initrd"), pseudo_random(50_000, 9)).unwrap();
    let mut specs = Vec::new();
    for (name, tar) in images {
        let p = inputs.join(format!("{name}-{version}.tar"));
        fs::write(&p, tar).unwrap();
        specs.push(format!("{name}={}", p.display()));
    }
    let mut extra = Vec::new();
    for s in &specs {
        extra.extend(["--image", s.as_str()]);
    }
    if let Some(f) = from {
        extra.extend(["--patch-from", f.to_str().unwrap()]);
    }
    n.create_release(version, generation, &extra)
}

/// Slot A runs `rel` (k3OS dir layout) and the node keeps its manifest and its payloads in
/// the store, as an image builder does.
fn runs_in_a(n: &Node, rel: &Path, version: &str) {
    let sys = n.path().join("system");
    for (d, f) in [
        ("rootfs", "rootfs.squashfs"),
        ("kernel", "vmlinuz"),
        ("kernel", "initrd"),
    ] {
        fs::create_dir_all(sys.join(d).join(version)).unwrap();
        fs::copy(rel.join(f), sys.join(d).join(version).join(f)).unwrap();
    }
    let keep = n.path().join("state/slots/a");
    fs::create_dir_all(&keep).unwrap();
    fs::copy(rel.join("manifest.json"), keep.join("manifest.json")).unwrap();
    for p in &release_manifest(rel).payloads {
        let obj = object_path(&n.path().join("state"), &p.file.sha256);
        fs::create_dir_all(obj.parent().unwrap()).unwrap();
        fs::copy(rel.join(&p.file.path), &obj).unwrap();
        fs::set_permissions(&obj, fs::Permissions::from_mode(0o444)).unwrap();
    }
}

/// The line of `out` about `what` (`payload site`, `total`).
fn line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.trim_start().starts_with(what))
        .unwrap_or_else(|| panic!("no {what} line in:\n{out}"))
}

/// The exact byte count in a `--plan-only` line.
fn fetch_of(line: &str) -> u64 {
    let inner = line.split('(').nth(1).unwrap().split(' ').next().unwrap();
    inner.parse().unwrap()
}

/// Every payload of `rel` is in `state`'s store, read-only, with `rel`'s bytes.
fn assert_objects(state: &Path, rel: &Path) {
    for p in &release_manifest(rel).payloads {
        let obj = object_path(state, &p.file.sha256);
        assert_eq!(
            fs::read(&obj).unwrap_or_else(|e| panic!("{}: {e}", obj.display())),
            fs::read(rel.join(&p.file.path)).unwrap(),
            "payload {}",
            p.name
        );
        let mode = fs::metadata(&obj).unwrap().permissions().mode() & 0o777;
        assert!(mode == 0o444 || !cfg!(target_os = "linux"), "{mode:o}");
    }
}

#[test]
fn release_create_image_then_plan_stage_and_slot_status_count_the_payloads() {
    let n = Node::new();
    let (i1, i2) = images();
    let (v1, _) = release(&n, "v1", 5, &i1, None);
    let (v2, printed) = release(&n, "v2", 6, &i2, Some(&v1));
    eprintln!("{printed}");
    for name in ["k3s", "site"] {
        assert!(
            printed.contains(&format!("(image-archive {name}, 1 image(s))")),
            "{printed}"
        );
    }
    let m2 = release_manifest(&v2);
    let site = m2.payload("site").unwrap();
    assert_eq!(
        site.images,
        ["registry.local/site/app:2"],
        "read from the archive"
    );
    assert_eq!(
        m2.payload("k3s").unwrap().images,
        ["docker.io/rancher/mirrored-pause:3.6"]
    );
    assert!(site.file.chunks.is_some(), "a chunk index: {site:?}");
    runs_in_a(&n, &v1, "v1");

    let src = v2.to_str().unwrap();
    let plan = n.ok(&["upgrade", "--plan-only", "--source", src]);
    eprintln!("{plan}");
    assert_eq!(
        fetch_of(line(&plan, "payload k3s")),
        0,
        "the store holds it: {plan}"
    );
    let site_fetch = fetch_of(line(&plan, "payload site"));
    assert!(
        site_fetch > 0 && site_fetch < site.file.size / 4,
        "the changed archive costs its delta, {site_fetch} of {}: {plan}",
        site.file.size
    );
    let planned = fetch_of(line(&plan, "total"));
    let out = n.ok(&["upgrade", "--stage-only", "--source", src]);
    eprintln!("{out}");
    assert!(
        out.contains(&format!("fetched ({planned} bytes)")),
        "the plan said {planned}: {out}"
    );
    let state = n.path().join("state");
    assert_objects(&state, &v1);
    assert_objects(&state, &v2);

    let status = n.ok(&["slot", "status"]);
    eprintln!("{status}");
    let listed: Vec<&str> = status
        .lines()
        .filter(|l| l.trim_start().starts_with("payload:"))
        .collect();
    assert_eq!(listed.len(), 4, "two per slot: {status}");
    assert!(listed.iter().all(|l| l.ends_with("in store")), "{status}");
    assert!(
        listed.iter().any(|l| l.contains(&format!(
            "image-archive site {} sha256 {}",
            libupgrade::units::Size(site.file.size),
            &site.file.sha256[..12]
        ))),
        "{status}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&n.ok(&["slot", "status", "--json"])).unwrap();
    assert_eq!(json["slots"][1]["payloads"][1]["name"], "site", "{json}");
    assert_eq!(json["slots"][1]["payloads"][1]["in_store"], true, "{json}");

    let t = &json["slots"][1]["transfer"];
    assert_eq!(
        t["fetched"].as_u64().unwrap() + t["reused"].as_u64().unwrap(),
        t["total"].as_u64().unwrap(),
        "a payload the store held counts as reused: {t}"
    );
    assert_eq!(t["fetched"].as_u64().unwrap(), planned, "{t}");
    // A missing object is said, never hidden.
    let obj = object_path(&state, &site.file.sha256);
    fs::remove_file(&obj).unwrap();
    let status = n.ok(&["slot", "status"]);
    assert!(
        status.contains("image-archive site") && status.contains("MISSING"),
        "{status}"
    );
}

#[test]
fn a_bundle_carries_the_payloads_and_an_offline_stage_counts_them() {
    let n = Node::new();
    let (i1, i2) = images();
    let (v1, _) = release(&n, "v1", 5, &i1, None);
    let (v2, _) = release(&n, "v2", 6, &i2, None);
    runs_in_a(&n, &v1, "v1");
    let bundle = n.path().join("v2.k3b");
    n.ok(&[
        "release",
        "bundle",
        v2.to_str().unwrap(),
        "-o",
        bundle.to_str().unwrap(),
    ]);
    let b = bundle.to_str().unwrap();
    let plan = n.ok(&["upgrade", "--plan-only", "--bundle", b]);
    eprintln!("{plan}");
    assert_eq!(fetch_of(line(&plan, "payload k3s")), 0, "{plan}");
    assert!(fetch_of(line(&plan, "payload site")) > 0, "{plan}");
    let out = n.ok(&["upgrade", "--stage-only", "--bundle", b]);
    eprintln!("{out}");
    assert!(
        out.contains(&format!(
            "fetched ({} bytes)",
            fetch_of(line(&plan, "total"))
        )),
        "{out}"
    );
    assert_objects(&n.path().join("state"), &v2);
}

#[test]
fn a_release_over_the_store_budget_is_refused_at_plan_time_naming_the_bytes() {
    let n = Node::new();
    let (i1, i2) = images();
    let (v1, _) = release(&n, "v1", 5, &i1, None);
    let (v2, _) = release(&n, "v2", 6, &i2, None);
    runs_in_a(&n, &v1, "v1");
    let m1 = release_manifest(&v1);
    let m2 = release_manifest(&v2);
    let held: u64 = m1.payloads.iter().map(|p| p.file.size).sum();
    let needed = m2.payload("site").unwrap().file.size;
    let budget = held + needed - 1;
    let cfg = fs::read_to_string(&n.config).unwrap();
    fs::write(
        &n.config,
        format!("payload_store_max_bytes = {budget}\n{cfg}"),
    )
    .unwrap();
    // Nothing written but the proofs of v1's objects (hashed once when first counted: a
    // store written without proofs), which change no decision.
    let state = |n: &Node| {
        let mut t = testkit::tree_bytes(&n.path().join("state"));
        t.retain(|k, _| !k.starts_with("payloads/proofs"));
        t
    };
    let before = state(&n);
    for verb in ["--plan-only", "--stage-only"] {
        let e = n.fails_with_one_error(&["upgrade", verb, "--source", v2.to_str().unwrap()]);
        for want in [
            "release v2".to_string(),
            format!("({} bytes)", needed),
            format!("({} bytes)", held),
            format!("({} bytes, ", budget),
            "payload_store_max_bytes".to_string(),
        ] {
            assert!(e.contains(&want), "{want}: {e}");
        }
    }
    assert_eq!(state(&n), before, "nothing written");
}

/// Run `upgrade --stage-only --source rel` stopped dead at write barrier `k` (killed with
/// SIGKILL there, what a power cut leaves of a process); returns the barrier's name.
fn cut_at(n: &Node, rel: &Path, k: u64) -> String {
    let mut c = Command::new(release_support::bin())
        .args(["upgrade", "--stage-only", "--source", rel.to_str().unwrap()])
        .env("K3OS_OPS_CONFIG", &n.config)
        .env("K3OS_OPS_BARRIER_STOP", k.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = BufReader::new(c.stderr.take().unwrap());
    let mut name = None;
    for l in err.lines() {
        let l = l.unwrap();
        if let Some(rest) = l.strip_prefix(&format!("K3OS-BARRIER-STOP {k} ")) {
            name = Some(rest.to_string());
            break;
        }
    }
    c.kill().unwrap();
    c.wait().unwrap();
    name.unwrap_or_else(|| panic!("the stage ended before barrier {k}"))
}

/// The write barriers of a whole stage of `rel` on `n`: (number, name).
fn barriers(n: &Node, rel: &Path) -> Vec<(u64, String)> {
    let out = Command::new(release_support::bin())
        .args(["upgrade", "--stage-only", "--source", rel.to_str().unwrap()])
        .env("K3OS_OPS_CONFIG", &n.config)
        .env("K3OS_OPS_BARRIERS", "1")
        .env_remove("K3OS_OPS_BARRIER_STOP")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("K3OS-BARRIER "))
        .map(|l| {
            let (k, name) = l.split_once(' ').unwrap();
            (k.parse().unwrap(), name.to_string())
        })
        .collect()
}

/// A node running v1 in A whose store also holds `stale`'s bytes as an object no slot
/// references (left by a release slot B held before), so the stage's prune has work.
fn node_with_stale(v1: &Path, stale: &[u8]) -> Node {
    let n = Node::new();
    runs_in_a(&n, v1, "v1");
    let sha = libupgrade::chunk::digest(stale);
    let obj = object_path(&n.path().join("state"), &hex::encode(sha));
    fs::write(obj, stale).unwrap();
    n
}

#[test]
fn kill_9_at_every_payload_barrier_leaves_both_slots_payloads_intact() {
    let keys = Node::new();
    let (i1, mut i2) = images();
    // Both archives change, so the stage writes two objects.
    i2[0].1 = image_archive(
        "docker.io/rancher/mirrored-pause:3.7",
        &[pseudo_random(50_000, 40)],
    );
    let (v1, _) = release(&keys, "v1", 5, &i1, None);
    let (v2, _) = release(&keys, "v2", 6, &i2, Some(&v1));
    let stale = pseudo_random(10_000, 41);
    let dry = node_with_stale(&v1, &stale);
    fs::copy(
        keys.path().join("trust/node.pub"),
        dry.path().join("trust/node.pub"),
    )
    .unwrap();
    let all = barriers(&dry, &v2);
    let cuts: Vec<&(u64, String)> = all
        .iter()
        .filter(|(_, b)| b.starts_with("payload:"))
        .collect();
    let names: Vec<&str> = cuts.iter().map(|(_, b)| b.as_str()).collect();
    assert_eq!(
        names,
        [
            "payload:object-pruned",
            "payload:object-renamed",
            "payload:object-renamed"
        ],
        "{all:?}"
    );
    for (k, want) in cuts {
        let n = node_with_stale(&v1, &stale);
        fs::copy(
            keys.path().join("trust/node.pub"),
            n.path().join("trust/node.pub"),
        )
        .unwrap();
        let got = cut_at(&n, &v2, *k);
        assert_eq!(&got, want, "barrier {k}");
        let state = n.path().join("state");
        // The running slot's payloads are intact after the cut, and the status says so.
        assert_objects(&state, &v1);
        let status = n.ok(&["slot", "status"]);
        assert!(!status.contains("MISSING"), "cut at {k} ({want}): {status}");
        // The next run completes the stage; both slots' payloads are there.
        n.ok(&["upgrade", "--stage-only", "--source", v2.to_str().unwrap()]);
        assert_objects(&state, &v1);
        assert_objects(&state, &v2);
        let status = n.ok(&["slot", "status"]);
        assert_eq!(
            status.matches("in store").count(),
            4,
            "cut at {k}: {status}"
        );
    }
}

/// Power `n` on through GRUB's script (its countdown written as GRUB's `save_env` would) into
/// release `version` (`generation`); returns the slot booted.
fn power_on(n: &Node, boot: u32, version: &str, generation: u64) -> bootconfig::Slot {
    let sim = bootconfig::simulate_boot(&n.path().join("boot/grub"), 3).unwrap();
    bootconfig::apply_all(&sim.countdown).unwrap();
    let p = n.path();
    let slot = sim.choice;
    fs::write(
        p.join("cmdline"),
        format!("root=/dev/vda4 ro k3os.slot={slot}\n"),
    )
    .unwrap();
    fs::write(p.join("boot_id"), format!("boot-{boot}\n")).unwrap();
    fs::write(
        p.join("k3os-release"),
        format!("VERSION={version}\nGENERATION={generation}\n"),
    )
    .unwrap();
    slot
}

#[test]
fn a_bless_prunes_what_no_slot_references_and_keeps_both_slots_payloads() {
    let n = Node::new();
    let (i1, i2) = images();
    let (v1, _) = release(&n, "v1", 5, &i1, None);
    let (v2, _) = release(&n, "v2", 6, &i2, None);
    runs_in_a(&n, &v1, "v1");
    n.ok(&["upgrade", "--stage-only", "--source", v2.to_str().unwrap()]);
    // Left by releases no slot holds any more: an object and an abandoned partial one.
    let state = n.path().join("state");
    let stale = pseudo_random(10_000, 42);
    let stale_obj = object_path(&state, &hex::encode(libupgrade::chunk::digest(&stale)));
    fs::write(&stale_obj, &stale).unwrap();
    let partial =
        libupgrade::payload::objects_dir(&state).join(format!(".{}.partial", "ab".repeat(32)));
    fs::write(&partial, b"half").unwrap();

    n.ok(&["slot", "activate"]);
    assert_eq!(power_on(&n, 2, "v2", 6), bootconfig::Slot::B);
    let out = n.ok(&["slot", "confirm"]);
    eprintln!("{out}");
    let status = n.ok(&["slot", "status"]);
    assert!(status.contains("[x] slot B (good"), "{status}");
    assert!(
        !stale_obj.exists() && !partial.exists(),
        "pruned after the bless"
    );
    // Slot A keeps v1's payloads (a fallback or rollback finds its images), B v2's.
    assert_objects(&state, &v1);
    assert_objects(&state, &v2);
    assert_eq!(status.matches("in store").count(), 4, "{status}");
    let left = fs::read_dir(libupgrade::payload::objects_dir(&state))
        .unwrap()
        .count();
    assert_eq!(
        left, 3,
        "v1's two archives and v2's changed one; k3s is shared"
    );
}

#[test]
fn a_budget_stop_in_a_new_payload_resumes_and_an_extra_source_supplies_the_rest() {
    let n = Node::new();
    let (i1, mut i2) = images();
    i2.push((
        "metrics",
        image_archive(
            "docker.io/rancher/mirrored-metrics-server:v0.7",
            &[pseudo_random(900_000, 43)],
        ),
    ));
    let (v1, _) = release(&n, "v1", 5, &i1, None);
    let (v2, _) = release(&n, "v2", 6, &i2, None);
    runs_in_a(&n, &v1, "v1");
    let src = v2.to_str().unwrap();
    let plan = n.ok(&["upgrade", "--plan-only", "--source", src]);
    let total = fetch_of(line(&plan, "total"));
    let metrics = release_manifest(&v2)
        .payload("metrics")
        .unwrap()
        .file
        .clone();
    assert!(
        fetch_of(line(&plan, "payload metrics")) == metrics.size,
        "{plan}"
    );

    let e = n.fails_with_one_error(&[
        "upgrade",
        "--stage-only",
        "--max-bytes",
        "400K",
        "--source",
        src,
    ]);
    assert!(
        e.contains("byte budget") && e.contains("left to fetch"),
        "{e}"
    );
    let plan = n.ok(&["upgrade", "--plan-only", "--source", src]);
    eprintln!("{plan}");
    assert!(
        plan.contains("continuing an interrupted download"),
        "{plan}"
    );
    let rest = fetch_of(line(&plan, "total"));
    assert!(rest <= total - (400 << 10) + 65_536, "{rest} of {total}");

    // The rest of the new archive comes from a medium holding the release's file.
    let medium = n.path().join("usb");
    fs::create_dir_all(&medium).unwrap();
    fs::copy(v2.join(&metrics.path), medium.join(&metrics.path)).unwrap();
    let args = ["--source", src, "--extra-source", medium.to_str().unwrap()];
    let plan = n.ok(&[&["upgrade", "--plan-only"][..], &args].concat());
    assert_eq!(fetch_of(line(&plan, "payload metrics")), 0, "{plan}");
    let out = n.ok(&[&["upgrade", "--stage-only"][..], &args].concat());
    eprintln!("{out}");
    assert!(
        out.contains(&format!(
            "fetched ({} bytes)",
            fetch_of(line(&plan, "total"))
        )),
        "{out}"
    );
    assert_objects(&n.path().join("state"), &v2);
}
