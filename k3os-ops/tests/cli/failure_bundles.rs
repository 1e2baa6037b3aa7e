//! Failure bundles end to end through the binary, on the scratch node of `fleet_reports` and a
//! real `collector serve` on SQLite: a trial boot whose health check fails keeps a bundle of its
//! evidence on the state partition before the fallback; the good slot sends it after the
//! reports, through a dropped link, and the collector stores the very bytes the node sealed,
//! redacted by the node's rules. A bundle the collector refuses is set aside with its status and
//! never holds the reports back.

use std::path::Path;

use collector::Store;
use fleet_report::{Failure, Opened};
use k3os_ops_testing::cli::Node;
use k3os_ops_testing::release as release_support;

use crate::fleet_reports::{cli_support_boot_b, failing_check, node_id, stored, Collector, Site};

/// The node's `[failure_bundle]` table: its logs and kernel log in its own directory (the host's
/// `/dev/kmsg` is not this node's), and one redaction pattern of its own.
fn bundle_config(node: &Node) {
    let p = node.path().display().to_string();
    let mut cfg = std::fs::read_to_string(&node.config).unwrap();
    cfg.push_str(&format!(
        "[failure_bundle]\nlogs = [\"{p}/log/kubelet.log\", \"{p}/log/absent.log\"]\n\
         kernel_log = \"{p}/log/kmsg\"\npstore_dir = \"{p}/pstore\"\nredact = [\"store-[0-9]+\"]\n"
    ));
    std::fs::write(&node.config, cfg).unwrap();
    std::fs::create_dir_all(node.path().join("log")).unwrap();
    let mut kubelet = String::new();
    for i in 0..2000 {
        kubelet.push_str(&format!(
            "I1207 17:00:{:02} kubelet.go:{i}] syncing pods\n",
            i % 60
        ));
    }
    kubelet.push_str(
        "E1207 17:01:00 server.go:302] failed to load kubelet config: token=s3cr3tvalue \
         from 10.0.2.15 at store-0042\n",
    );
    std::fs::write(node.path().join("log/kubelet.log"), kubelet).unwrap();
    std::fs::write(
        node.path().join("log/kmsg"),
        "[    5.140900] virtio_net virtio0 eth0: link up\n",
    )
    .unwrap();
}

/// Pretend the loader fell back: the node runs slot A (v1) again, in a new boot.
fn boot_a(node: &Node) {
    std::fs::write(
        node.path().join("cmdline"),
        "root=/dev/vda4 ro k3os.slot=A\n",
    )
    .unwrap();
    std::fs::write(node.path().join("boot_id"), "boot-3\n").unwrap();
    std::fs::write(
        node.path().join("k3os-release"),
        "VERSION=v1\nGENERATION=5\n",
    )
    .unwrap();
    std::fs::remove_file(node.path().join("health.d/fails")).unwrap();
}

fn bundles(db: &Path) -> Vec<collector::BundleRow> {
    collector::SqliteStore::open(db).unwrap().bundles().unwrap()
}

/// The `failure bundle:` lines of `slot status`.
fn bundle_lines(node: &Node) -> Vec<String> {
    let lines: Vec<String> = node
        .ok(&["slot", "status"])
        .lines()
        .filter(|l| l.starts_with("failure bundle: "))
        .map(str::to_string)
        .collect();
    eprintln!("slot status: {lines:?}");
    lines
}

/// The one bundle kept on the node: its file's bytes.
fn kept_bytes(node: &Node) -> Vec<u8> {
    let dir = node.path().join("state").join(libupgrade::BUNDLE_DIR);
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bundle"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::read(&files[0]).unwrap()
}

/// Stage v2, activate it, boot it and fail its health check: rolled back by `slot confirm`.
fn fail_v2(site: &Site) {
    let node = &site.node;
    node.ok(&["upgrade", "--stage-only", "--channel", &site.srv.url]);
    node.ok(&["slot", "activate"]);
    cli_support_boot_b(node);
    failing_check(node);
    let out = node.ops(&["slot", "confirm"]);
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("disk on fire"), "{text}");
}

#[test]
fn a_failed_health_checks_bundle_is_kept_then_sent_by_the_good_slot_through_a_dropped_link() {
    let site = Site::prepared("site-1", true, bundle_config);
    let (node, db) = (&site.node, &site.db);
    let collector = Collector::start(site.port, db, &site.allow);
    fail_v2(&site);
    // Kept in the failing slot; not sent from it (the fallback goes first).
    let rows = stored(db);
    assert_eq!(
        rows.last().unwrap().outcome.kind(),
        "rolled_back",
        "{rows:?}"
    );
    assert!(bundles(db).is_empty());
    let lines = bundle_lines(node);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].starts_with("failure bundle: v2 (generation 6) attempt 1, health check failed, ")
            && lines[0].ends_with("waiting to be sent"),
        "{lines:?}"
    );
    let sealed = kept_bytes(node);

    // The loader falls back to A while the link is down: the bundle waits.
    drop(collector);
    boot_a(node);
    let t = std::time::Instant::now();
    node.ok(&["slot", "confirm"]);
    assert!(
        t.elapsed().as_secs() < 15,
        "sending held the command: {:?}",
        t.elapsed()
    );
    assert!(bundle_lines(node)[0].ends_with("waiting to be sent"));

    // The link is back. An `upgrade` sends a bundle only within its byte budget and inside its
    // download windows (v2 failed here: it stages nothing, and sends its reports).
    let _collector = Collector::start(site.port, db, &site.allow);
    let url = site.srv.url.as_str();
    let upgrade = ["upgrade", "--stage-only", "--channel", url];
    node.ok(&[&upgrade[..], &["--max-bytes", "1000"]].concat());
    assert!(bundles(db).is_empty(), "a bundle over --max-bytes was sent");
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let window = format!(
        "{}/{}",
        later.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        (later + chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    node.ok(&[&upgrade[..], &["--stage-window", &window]].concat());
    assert!(
        bundles(db).is_empty(),
        "a bundle was sent outside the window"
    );
    // Within a budget it fits and with no window, the next `upgrade` sends it.
    node.ok(&[&upgrade[..], &["--max-bytes", "100000"]].concat());
    let rows = bundles(db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!(r.node, node_id(node));
    assert_eq!((r.site.as_str(), r.version.as_str()), ("site-1", "v2"));
    assert_eq!((r.generation, r.attempt, r.slot.as_str()), (6, 1, "B"));
    assert_eq!(r.failure, Failure::HealthCheck);
    assert!(r.why.contains("disk on fire"), "{}", r.why);
    let body = collector::SqliteStore::open(db)
        .unwrap()
        .bundle_body(&r.node, "v2", 1)
        .unwrap()
        .unwrap();
    assert_eq!(
        body, sealed,
        "the collector holds the bytes the node sealed"
    );
    eprintln!(
        "sealed failure bundle of v2's failed health check: {} bytes",
        body.len()
    );
    let Opened { bundle: b, .. } = fleet_report::open_bundle(&body).unwrap();
    let text = |name: &str| {
        b.sections
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no section {name} in {:?}", b.sections))
            .text
            .clone()
    };
    assert!(text("health/fails").contains("disk on fire"));
    assert!(
        text("slot/decisions").contains("slot B activated v2"),
        "{}",
        text("slot/decisions")
    );
    assert!(text("log/kernel").contains("eth0: link up"));
    let kubelet = text("log/kubelet");
    assert!(
        kubelet.contains("failed to load kubelet config"),
        "the newest lines are kept"
    );
    for secret in ["s3cr3tvalue", "10.0.2.15", "store-0042"] {
        assert!(!kubelet.contains(secret), "{secret} was not redacted");
    }
    assert!(b.redacted >= 3, "{}", b.redacted);
    assert!(b.versions.contains("release.version=v2"), "{}", b.versions);
    assert!(!b.sections.iter().any(|s| s.name == "log/absent"));

    // Sent once: `slot status` says so, text and json; a further command sends nothing more.
    let lines = bundle_lines(node);
    assert!(
        lines[0].contains(": sent ") && lines[0].ends_with("(201 Created)"),
        "{lines:?}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&node.ok(&["slot", "status", "--json"])).unwrap();
    let kept = &json["failure_bundles"][0];
    assert_eq!(kept["delivery"]["state"], "sent", "{json}");
    assert_eq!(
        (kept["version"].as_str(), kept["attempt"].as_u64()),
        (Some("v2"), Some(1))
    );
    assert_eq!(bundles(db).len(), 1);
}

#[test]
fn a_refused_bundle_is_set_aside_and_never_holds_the_reports_back() {
    let site = Site::prepared("site-1", true, bundle_config);
    let (node, db) = (&site.node, &site.db);
    let _collector = Collector::start(site.port, db, &site.allow);
    fail_v2(&site);
    // The kept bundle is damaged on the state partition: its signature no longer verifies.
    let dir = node.path().join("state").join(libupgrade::BUNDLE_DIR);
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bundle"))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&file, bytes).unwrap();

    boot_a(node);
    node.ok(&["slot", "confirm"]);
    assert!(bundles(db).is_empty());
    let lines = bundle_lines(node);
    assert!(
        lines[0].contains(": refused (401 Unauthorized: ") && lines[0].contains("1 of 3 tries"),
        "{lines:?}"
    );
    // A report made after the refusal still goes at once: v3 is published and staged.
    let inputs = release_support::squashfs_inputs(node.path(), "v3");
    release_support::create(
        &inputs,
        &node.path().join("keys/node.key"),
        &site.chan.join("v3"),
        "v3",
        libupgrade::manifest::Arch::host(),
        Some(7),
    );
    node.ok(&["release", "index", site.chan.to_str().unwrap()]);
    node.ok(&["upgrade", "--stage-only", "--channel", &site.srv.url]);
    let rows = stored(db);
    let last = rows.last().unwrap();
    assert_eq!(
        (last.outcome.kind(), last.version.as_str()),
        ("staged", "v3"),
        "{rows:?}"
    );
    // Not tried again before its time: still one try.
    assert!(bundle_lines(node)[0].contains("1 of 3 tries"));
}

/// Power the node on through GRUB's script (its countdown written as GRUB's `save_env` would)
/// in boot `boot`, without anything confirming it; returns the slot the loader chose.
fn power_on(node: &Node, boot: u32) -> bootconfig::Slot {
    let sim = bootconfig::simulate_boot(&node.path().join("boot/grub"), 3).unwrap();
    bootconfig::apply_all(&sim.countdown).unwrap();
    let p = node.path();
    std::fs::write(
        p.join("cmdline"),
        format!("root=/dev/vda4 ro k3os.slot={}\n", sim.choice),
    )
    .unwrap();
    std::fs::write(p.join("boot_id"), format!("boot-{boot}\n")).unwrap();
    sim.choice
}

/// A node made by v0.1.0 (its state file) stages v2, whose trial boots never reach userspace:
/// the loader spends its tries and falls back to A. The good slot's assessment writes a
/// `no_userspace` bundle from what survived (the loader's tries, the initramfs's dm-verity
/// record, a pstore record) and sends it.
#[test]
fn a_trial_that_never_reached_userspace_leaves_a_bundle_from_what_survived() {
    let site = Site::prepared("site-1", true, |n| {
        crate::fleet_reports::v010_state(n);
        bundle_config(n);
    });
    let (node, db) = (&site.node, &site.db);
    let _collector = Collector::start(site.port, db, &site.allow);
    node.ok(&["upgrade", "--stage-only", "--channel", &site.srv.url]);
    node.ok(&["slot", "activate"]);
    let mut boots = 1;
    let mut tried = 0;
    loop {
        boots += 1;
        match power_on(node, boots) {
            bootconfig::Slot::B => tried += 1,
            bootconfig::Slot::A => break,
        }
        assert!(boots < 10, "the loader never fell back");
    }
    assert_eq!(tried, 3);
    // What survived the trial boots: the initramfs's record and a panic in pstore.
    std::fs::write(
        node.path().join("state/verity-failure"),
        "format=1\nslot=B\nreason=dm-verity: root hash mismatch on /dev/vda5\n",
    )
    .unwrap();
    std::fs::create_dir_all(node.path().join("pstore")).unwrap();
    std::fs::write(
        node.path().join("pstore/dmesg-efi-176500000001"),
        "Kernel panic - not syncing: VFS: Unable to mount root fs\n",
    )
    .unwrap();
    node.ok(&["slot", "confirm"]);

    let rows = bundles(db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!(
        (r.version.as_str(), r.attempt, r.slot.as_str()),
        ("v2", 1, "B")
    );
    assert_eq!(r.failure, Failure::NoUserspace);
    let body = collector::SqliteStore::open(db)
        .unwrap()
        .bundle_body(&r.node, "v2", 1)
        .unwrap()
        .unwrap();
    let b = fleet_report::open_bundle(&body).unwrap().bundle;
    let names: Vec<&str> = b.sections.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "slot/decisions",
            "loader/tries",
            "initramfs/verity-failure",
            "pstore/dmesg-efi-176500000001"
        ],
        "the good slot's own logs are not the failed boots'"
    );
    assert!(
        b.sections[1].text.contains("after 3 of 3 boot tries"),
        "{:?}",
        b.sections[1]
    );
    assert!(b.sections[2].text.contains("root hash mismatch"));
    assert!(b.sections[3].text.contains("Kernel panic"));
    assert!(
        !node.path().join("pstore/dmesg-efi-176500000001").exists(),
        "a pstore record sealed in a kept bundle is removed from the firmware's small store"
    );
    let lines = bundle_lines(node);
    assert!(
        lines[0].contains("attempt 1, never reached userspace") && lines[0].contains(": sent "),
        "{lines:?}"
    );
}
