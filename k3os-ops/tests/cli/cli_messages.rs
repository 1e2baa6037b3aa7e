//! The text a user sees when a command fails, pinned through the real binary: printed once, on
//! one `error:` line, naming what was wrong and what to do. A node here is a temp dir with the
//! k3OS-style dir layout and a real GRUB env (bootconfig's own writer), booted on slot A.

use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use cli_support::Node;
use libupgrade::manifest::Arch;
use release_support::{create, fake_inputs};

/// Fixtures of this module on the shared test node.
trait SignedReleases {
    fn release(&self, name: &str, generation: u64) -> PathBuf;
}

impl SignedReleases for Node {
    /// A release signed by this node's trusted key, generation `generation`.
    fn release(&self, name: &str, generation: u64) -> PathBuf {
        let (secret, _) = (self.path().join("keys/node.key"), ());
        let inputs = fake_inputs(&self.path().join(format!("{name}.in")), name);
        let out = self.path().join(name);
        create(&inputs, &secret, &out, name, Arch::host(), Some(generation));
        out
    }
}

/// No sentence of `line` stands in it twice (the old report printed the cause again).
fn assert_no_repeats(line: &str) {
    let parts: Vec<&str> = line.split(": ").filter(|p| p.len() > 12).collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(p),
            "{p:?} is printed twice in: {line}"
        );
    }
}

#[test]
fn a_broken_manifest_is_reported_once() {
    let n = Node::new();
    let rel = n.release("v2", 6);
    // Signed by the trusted key, so the signature passes and the manifest's own check speaks.
    let broken = br#"{"format": 1, "version": "v2"}"#;
    fs::write(rel.join("manifest.json"), broken).unwrap();
    let sig = libupgrade::signing::sign(broken, &n.path().join("keys/node.key")).unwrap();
    fs::write(rel.join("manifest.json.sig"), sig).unwrap();
    let line = n.fails(&["upgrade", "--stage-only", "--source", rel.to_str().unwrap()]);
    assert!(
        line.contains("manifest") && line.contains("missing field"),
        "{line}"
    );
    assert!(!line.contains("signature"), "{line}");
    assert_no_repeats(&line);
}

/// Issue 34 item 4: a version is a plain name. `release create` refuses one before writing
/// anything, a node refuses a signed manifest naming one, and `upgrade --version` refuses one
/// before reading the channel; each names the value once, escaped, and the node is unchanged.
#[test]
fn a_version_that_is_not_a_plain_name_is_refused_naming_it_escaped() {
    let n = Node::new();
    let inputs = fake_inputs(&n.path().join("bad.in"), "bad");
    let out = n.path().join("bad-release");
    let s = |p: &Path| p.display().to_string();
    let key = s(&n.path().join("keys/node.key"));
    let (rootfs, kernel, initrd) = (s(&inputs.0), s(&inputs.1), s(&inputs.2));
    for v in ["../../../../x", "v1\u{1b}[2J"] {
        let args = [
            "release",
            "create",
            "--rootfs",
            &rootfs,
            "--kernel",
            &kernel,
            "--initrd",
            &initrd,
            "--version",
            v,
            "--arch",
            Arch::host().as_str(),
            "--key",
            &key,
            "-o",
            &s(&out),
            "--generation",
            "7",
        ];
        let line = n.fails(&args);
        let shown = format!("version \"{}\" is not a plain name", v.escape_debug());
        assert!(line.contains(&shown), "{line}");
        assert_eq!(
            line.matches(&v.escape_debug().to_string()).count(),
            1,
            "{line}"
        );
        assert!(!line.contains('\u{1b}'), "{line:?}");
        assert!(
            !out.exists(),
            "release create wrote {} before refusing",
            out.display()
        );
    }

    // A manifest signed by the node's trusted key that names a path as its version.
    let rel = n.release("v2", 6);
    let mut m: serde_json::Value =
        serde_json::from_slice(&fs::read(rel.join("manifest.json")).unwrap()).unwrap();
    m["version"] = "../../../../x".into();
    let bytes = serde_json::to_vec(&m).unwrap();
    fs::write(rel.join("manifest.json"), &bytes).unwrap();
    let sig = libupgrade::signing::sign(&bytes, &n.path().join("keys/node.key")).unwrap();
    fs::write(rel.join("manifest.json.sig"), sig).unwrap();
    let before = testkit::tree_bytes(n.path());
    let line = n.fails(&["upgrade", "--stage-only", "--source", rel.to_str().unwrap()]);
    assert!(
        line.contains("manifest field version: version \"../../../../x\" is not a plain name"),
        "{line}"
    );
    assert_no_repeats(&line);
    // The channel version an operator asks for: refused before the channel is read.
    let line = n.fails(&[
        "upgrade",
        "--stage-only",
        "--channel",
        &s(&n.path().join("no-such-channel")),
        "--version",
        "v2/../../x",
    ]);
    assert!(
        line.contains("version \"v2/../../x\" is not a plain name")
            && !line.contains("no-such-channel/"),
        "{line}"
    );
    testkit::assert_same_tree("node", &before, &testkit::tree_bytes(n.path()));
}

#[test]
fn a_downgrade_names_the_flag_that_allows_it() {
    let n = Node::new();
    let rel = n.release("v0", 3);
    let line = n.fails(&["upgrade", "--stage-only", "--source", rel.to_str().unwrap()]);
    assert!(
        line.contains("generation 3, older than the installed generation 5")
            && line.contains("pass --allow-downgrade"),
        "{line}"
    );
    assert_no_repeats(&line);
}

#[test]
fn a_failed_confirm_says_which_check_failed() {
    let n = Node::new();
    let check = n.path().join("health.d/50-app");
    fs::write(&check, "#!/bin/sh\necho app is down >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&check, fs::Permissions::from_mode(0o755)).unwrap();
    let line = n.fails(&["slot", "confirm"]);
    assert!(
        line.starts_with("error: slot confirm: ") && line.contains("50-app"),
        "a failed confirm must say which check failed: {line}"
    );
    assert_no_repeats(&line);
}

#[test]
fn status_speaks_the_json_vocabulary() {
    let n = Node::new();
    let out = n.ops(&["slot", "mark-bad", "b", "--reason", "bad flash"]);
    assert!(out.status.success(), "{out:?}");
    let human = String::from_utf8_lossy(&n.ops(&["slot", "status"]).stdout).into_owned();
    let json = String::from_utf8_lossy(&n.ops(&["slot", "status", "--json"]).stdout).into_owned();
    assert!(
        human.contains("marked-bad") && !human.contains("MarkedBad"),
        "{human}"
    );
    assert!(json.contains("\"marked-bad\""), "{json}");
}

/// A tmpfs of `size` mounted at `at` for the test (needs root, as CI has), unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(
            st.success(),
            "mounting a {size} tmpfs at {} failed: this test needs root (CI runs as root)",
            at.display()
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_names_the_place_and_sizes_people_read() {
    let n = Node::new();
    let rel = n.path().join("big");
    let inputs = fake_inputs(&n.path().join("big.in"), "big");
    fs::write(&inputs.0, {
        let mut b = b"hsqs".to_vec();
        b.resize(3 << 20, 7);
        b
    })
    .unwrap();
    create(
        &inputs,
        &n.path().join("keys/node.key"),
        &rel,
        "v9",
        Arch::host(),
        Some(9),
    );
    let _fs = Tmpfs::mount(&n.path().join("system"), "1m");
    let line = n.fails(&["upgrade", "--stage-only", "--source", rel.to_str().unwrap()]);
    assert!(
        line.contains("not enough space for the rootfs: it needs 3.0 MiB")
            && line.contains("slot B")
            && line.contains("has room for only 1")
            && line.contains("MiB"),
        "{line}"
    );
    assert!(
        !line.contains("k3OS style"),
        "the whole layout description is nested in: {line}"
    );
    assert_no_repeats(&line);
}

/// The bug of the boot-integrity issue, seen through the CLI: one env copy damaged so that it
/// still parses (`K3OS_A=good` -> `K3OS_A=gXod`) must not demote the running, confirmed slot,
/// and `slot status` must name the damaged copy and the one the loader reads.
#[test]
fn status_names_a_damaged_env_copy_and_the_copy_in_use() {
    let n = Node::new();
    let env1 = n.path().join("boot/grub/k3os/env1");
    let text = fs::read(&env1).unwrap();
    let at = text
        .windows(b"K3OS_A=good".len())
        .position(|w| w == b"K3OS_A=good")
        .expect("env1 holds K3OS_A=good");
    let mut damaged = text.clone();
    damaged[at + "K3OS_A=g".len()] = b'X';
    fs::write(&env1, &damaged).unwrap();

    let out = n.ops(&["slot", "status"]);
    let human = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{human}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        human.contains("WARNING: copy 1") && human.contains("env1") && human.contains("is damaged"),
        "status does not name the damaged copy:\n{human}"
    );
    assert!(
        human.contains("Loader reads: copy 2"),
        "status does not say the loader reads copy 2:\n{human}"
    );
    assert!(
        human.contains("[x] slot A (good, booted"),
        "the confirmed running slot must stay good:\n{human}"
    );

    // The next write restores both copies from the intact state; B stays bad.
    let out = n.ops(&["slot", "mark-bad", "b"]);
    assert!(out.status.success(), "{out:?}");
    let human = String::from_utf8_lossy(&n.ops(&["slot", "status"]).stdout).into_owned();
    assert!(!human.contains("WARNING"), "{human}");
    assert!(human.contains("Next boot:  slot A"), "{human}");
}

/// Fixtures of this module on the shared test node.
trait AwaitedTrial {
    fn trial_awaiting_node_ready(&self, within_secs: &str);
    fn status_text(&self) -> String;
}

impl AwaitedTrial for Node {
    /// v2 staged into B and activated awaiting `node-ready` (as the agent does), then a
    /// "reboot" into B: the kernel command line and boot id change.
    fn trial_awaiting_node_ready(&self, within_secs: &str) {
        // A real squashfs: staging checks the image it wrote.
        let tree = self.path().join("v2.tree/etc");
        fs::create_dir_all(&tree).unwrap();
        fs::write(tree.join("k3os-release"), "VERSION=v2\nGENERATION=6\n").unwrap();
        let inputs = fake_inputs(&self.path().join("v2.in"), "v2");
        let _ = fs::remove_file(&inputs.0);
        let out = Command::new("mksquashfs")
            .arg(self.path().join("v2.tree"))
            .arg(&inputs.0)
            .args(["-noappend", "-quiet", "-all-root"])
            .output()
            .expect("mksquashfs (squashfs-tools, installed by scripts/setup.sh)");
        assert!(out.status.success(), "{out:?}");
        let rel = self.path().join("v2");
        create(
            &inputs,
            &self.path().join("keys/node.key"),
            &rel,
            "v2",
            Arch::host(),
            Some(6),
        );
        let out = self.ops(&["upgrade", "--stage-only", "--source", rel.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
        let out = self.ops(&[
            "slot",
            "activate",
            "--await",
            "node-ready",
            "--within-secs",
            within_secs,
        ]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("only after node-ready is reported"),
            "{out:?}"
        );
        fs::write(self.path().join("cmdline"), "ro k3os.slot=B\n").unwrap();
        fs::write(self.path().join("boot_id"), "boot-2\n").unwrap();
    }

    fn status_text(&self) -> String {
        String::from_utf8_lossy(&self.ops(&["slot", "status"]).stdout).into_owned()
    }
}

/// The boot-time confirm of a trial that awaits the agent's Node-Ready exits 75 (init starts
/// `await-bless` then) and says what it waits for; the report blesses it.
#[test]
fn a_trial_awaiting_node_ready_is_pending_until_it_is_reported() {
    let n = Node::new();
    n.trial_awaiting_node_ready("600");
    let out = n.ops(&["slot", "confirm"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not marked good yet: waiting for node-ready") && err.contains("within 600 s"),
        "{err}"
    );
    let st = n.status_text();
    assert!(
        st.contains("This boot:  slot B pending") && st.contains("[x] slot B (trying, booted"),
        "{st}"
    );
    let out = n.ops(&["slot", "confirm", "--passed", "node-ready"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("slot B (v2) is good (confirmed now)"),
        "{out:?}"
    );
    // Nothing is pending any more: await-bless returns at once.
    let out = n.ops(&["slot", "await-bless"]);
    assert!(out.status.success(), "{out:?}");
}

/// Not reported within the limit (k3s or the agent broken in the new version): await-bless
/// counts node-ready failed and the core rolls back to the good slot.
#[test]
fn await_bless_rolls_back_when_node_ready_never_comes() {
    let n = Node::new();
    n.trial_awaiting_node_ready("2");
    let out = n.ops(&["slot", "confirm"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let t0 = std::time::Instant::now();
    let line = n.fails(&["slot", "await-bless"]);
    assert!(t0.elapsed() >= std::time::Duration::from_secs(2));
    assert!(
        line.contains("node-ready: not reported within 2 s of the boot"),
        "{line}"
    );
    let st = n.status_text();
    assert!(
        st.contains("Next boot:  slot A") && st.contains("slot B (bad, booted"),
        "{st}"
    );
    assert!(st.contains("rolled-back"), "{st}");
}

#[test]
fn a_failed_report_is_a_failed_check_named_by_the_caller() {
    let n = Node::new();
    n.trial_awaiting_node_ready("600");
    let line = n.fails(&[
        "slot",
        "confirm",
        "--failed",
        "node-ready=kubelet never registered",
    ]);
    assert!(
        line.contains("node-ready: kubelet never registered"),
        "{line}"
    );
    let line = n.fails(&["slot", "confirm", "--failed", "node-ready"]);
    assert!(line.contains("expected NAME=WHY"), "{line}");
}

/// The boot config `bootloader install` and `release create --boot-config` read.
fn boot_config(p: &Path) -> PathBuf {
    let f = p.join("boot.toml");
    fs::write(
        &f,
        r#"format = 1
panic_secs = 5
[slots.a]
kernel = "/a/vmlinuz"
initrd = "/a/initrd"
cmdline = "root=PARTLABEL=rootfs-a ro console=ttyS0 quiet"
[slots.b]
kernel = "/b/vmlinuz"
initrd = "/b/initrd"
cmdline = "root=PARTLABEL=rootfs-b ro console=ttyS0 quiet"
[grub]
max_tries = 3
timeout_secs = 0
serial = true
[syslinux]
timeout_tenths = 1
serial = true
"#,
    )
    .unwrap();
    f
}

fn editenv(file: &Path, vars: &[&str]) {
    let run = |args: &[&str]| {
        let out = Command::new("grub-editenv")
            .arg(file)
            .args(args)
            .output()
            .expect("grub-editenv (Debian package grub-common) must be installed");
        assert!(out.status.success(), "grub-editenv {args:?}: {out:?}");
    };
    run(&["create"]);
    let mut set = vec!["set"];
    set.extend_from_slice(vars);
    run(&set);
}

/// The measurement of the upgrade-the-upgrader issue, through the binary: a GRUB node whose
/// env copies hold only the five variables v0.1.0 wrote (made with Debian's grub-editenv, as
/// an image builder with standard tools would) under v0.1.0's grub.cfg. `slot status` and
/// `slot confirm` read it (it was refused as "neither env copy is intact" before);
/// `bootloader install` keeps the state and moves the node to today's script.
#[test]
fn a_node_made_by_v010_is_read_and_migrated_by_bootloader_install() {
    let n = Node::new();
    let grub = n.path().join("boot/grub");
    for f in ["env1", "env2", "lock1", "lock2", "good"] {
        let _ = fs::remove_file(grub.join("k3os").join(f));
    }
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../bootconfig/tests/fixtures/v0.1.0/grub.cfg"),
        grub.join("grub.cfg"),
    )
    .unwrap();
    for c in ["env1", "env2"] {
        editenv(
            &grub.join("k3os").join(c),
            &[
                "K3OS_PRIMARY=A",
                "K3OS_A=good",
                "K3OS_A_TRIES=0",
                "K3OS_B=bad",
                "K3OS_B_TRIES=0",
            ],
        );
    }
    for l in ["lock1", "lock2"] {
        editenv(&grub.join("k3os").join(l), &["K3OS_EDITING=0"]);
    }
    let out = n.ok(&["slot", "status"]);
    assert!(out.contains("Boot script: GRUB script version 1"), "{out}");
    assert!(!out.contains("WARNING"), "{out}");
    n.ok(&["slot", "confirm"]);
    let cfg = boot_config(n.path());
    let out = n.ok(&[
        "bootloader",
        "install",
        "--boot-config",
        cfg.to_str().unwrap(),
    ]);
    assert!(
        out.contains("kept the boot state") && out.contains("was version 1"),
        "{out}"
    );
    let out = n.ok(&["slot", "status"]);
    assert!(out.contains("Boot script: GRUB script version 3"), "{out}");
    assert!(!out.contains("WARNING"), "{out}");
    let out = n.ok(&[
        "bootloader",
        "install",
        "--boot-config",
        cfg.to_str().unwrap(),
    ]);
    assert!(out.contains("nothing written"), "{out}");
    // A script newer than this build: every command refuses it, naming both versions.
    let text = fs::read_to_string(grub.join("grub.cfg")).unwrap();
    fs::write(
        grub.join("grub.cfg"),
        text.replace("k3os-grub-script: 3", "k3os-grub-script: 7"),
    )
    .unwrap();
    let e = n.fails(&["slot", "status"]);
    assert!(
        e.contains("version 7")
            && e.contains("up to version 3")
            && e.contains("nothing was rewritten"),
        "{e}"
    );
    let e = n.fails(&[
        "bootloader",
        "install",
        "--boot-config",
        cfg.to_str().unwrap(),
    ]);
    assert!(
        e.contains("version 7") && e.contains("up to version 3"),
        "{e}"
    );
}

/// A node with no loader files is told the real command that writes them, and that command
/// writes them (A good and primary, B bad); `bootloader render` prints the same script.
#[test]
fn missing_loader_files_name_bootloader_install_which_writes_them() {
    let n = Node::new();
    let grub = n.path().join("boot/grub");
    fs::remove_dir_all(grub.join("k3os")).unwrap();
    let e = n.fails(&["slot", "status"]);
    assert!(e.contains("k3os-ops bootloader install"), "{e}");
    let cfg = boot_config(n.path());
    let out = n.ok(&[
        "bootloader",
        "install",
        "--boot-config",
        cfg.to_str().unwrap(),
    ]);
    assert!(out.contains("slot A good and primary, slot B bad"), "{out}");
    let out = n.ok(&["slot", "status"]);
    assert!(
        out.contains("GRUB script version 3") && !out.contains("WARNING"),
        "{out}"
    );
    let rendered = n.ok(&[
        "bootloader",
        "render",
        "--boot-config",
        cfg.to_str().unwrap(),
        "--loader",
        "grub",
    ]);
    assert_eq!(rendered, fs::read_to_string(grub.join("grub.cfg")).unwrap());
    fs::write(&cfg, "format = 2\n").unwrap();
    let e = n.fails(&[
        "bootloader",
        "render",
        "--boot-config",
        cfg.to_str().unwrap(),
        "--loader",
        "grub",
    ]);
    assert!(
        e.contains("format 2 is newer") && e.contains("(format 1)"),
        "{e}"
    );
}

/// A channel whose `v7/` holds v6's correctly signed release (a mirror serving the wrong
/// release): `upgrade --channel … --version v7` refuses it before writing, naming both.
#[test]
fn a_channel_entry_that_holds_another_signed_release_is_refused() {
    let n = Node::new();
    let ch = n.path().join("channel");
    fs::create_dir_all(&ch).unwrap();
    let v6 = n.release("v6", 6);
    fs::rename(&v6, ch.join("v7")).unwrap();
    fs::write(
        ch.join("index.json"),
        format!(
            r#"{{"releases":[{{"version":"v7","generation":7,"arch":"{}","path":"v7/"}}]}}"#,
            Arch::host()
        ),
    )
    .unwrap();
    let out = n.ops(&[
        "upgrade",
        "--stage-only",
        "--channel",
        ch.to_str().unwrap(),
        "--version",
        "v7",
    ]);
    assert!(!out.status.success());
    // The resolution is reported first; then exactly one error line.
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    let line = errors[0];
    assert!(
        line.contains("the signed manifest is release v6, but v7 was asked for")
            && line.contains("nothing was written"),
        "{line}"
    );
    assert_no_repeats(line);
    let st = n.ok(&["slot", "status", "--json"]);
    assert!(!st.contains("\"v6\""), "slot B untouched: {st}");
}

/// A server that never answers: each retry is a warning line on stderr even with `--quiet`,
/// and the attempt ends at `--retry-for` with one error naming the URL, the last error, the
/// attempts and the time spent.
#[test]
fn retries_are_warned_even_when_quiet_and_end_at_retry_for() {
    let n = Node::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v2");
    let t = std::time::Instant::now();
    let out = n.ops(&[
        "upgrade",
        "--stage-only",
        "--quiet",
        "--source",
        &url,
        "--retry-for",
        "3s",
    ]);
    assert!(!out.status.success());
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let warnings = err.lines().filter(|l| l.starts_with("warning: ")).count();
    assert!(warnings >= 1, "{err}");
    assert!(
        err.lines()
            .filter(|l| l.starts_with("warning: "))
            .all(|l| l.contains(&format!("127.0.0.1:{port}")) && l.contains("attempt")),
        "{err}"
    );
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("Connection refused") && errors[0].contains("deadline (--retry-for)"),
        "{err}"
    );
}

/// `slot status` shows the agent's last stage preview (`stage-preview.json`, written by the
/// agent's node side through `libupgrade::state::ledger`), with exact bytes, in both views; a preview file
/// in a newer format is a warning naming the file, and the status is still shown.
#[test]
fn status_shows_the_agents_stage_preview() {
    let n = Node::new();
    let state = n.path().join("state");
    let human = n.ok(&["slot", "status"]);
    assert!(!human.contains("Stage Preview"), "no preview yet: {human}");
    libupgrade::state::ledger::record_preview(
        &state,
        &libupgrade::state::ledger::PreviewRecord {
            format: 1,
            version: "v2".into(),
            fetch: 3_145_728,
            reuse: 2048,
            bundle: None,
            at: None,
            by_patch: vec!["rootfs from v1".into()],
        },
    )
    .unwrap();
    let human = n.ok(&["slot", "status"]);
    assert!(
        human.contains("=== Stage Preview (agent) ===\nv2: fetch 3.0 MiB (3145728 bytes), reuse 2.0 KiB (2048 bytes); rootfs from v1 by patch"),
        "{human}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&n.ok(&["slot", "status", "--json"])).unwrap();
    assert_eq!(json["stage_preview"]["fetch"], 3_145_728);
    assert_eq!(json["stage_preview"]["version"], "v2");
    std::fs::write(
        state.join(libupgrade::state::ledger::PREVIEW_FILE),
        r#"{"format":2,"version":"v2","fetch":1,"reuse":1}"#,
    )
    .unwrap();
    let out = n.ops(&["slot", "status"]);
    assert!(
        out.status.success(),
        "a bad preview never fails the status: {out:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stage-preview.json") && err.contains("format 2 is newer"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("Stage Preview"));
}

/// `bootloader install --running-manifest FILE` records which build the booted slot runs (a
/// slot written by an image builder that kept none); a manifest of another release is refused
/// naming both, and nothing is recorded.
#[test]
fn bootloader_install_records_the_running_build() {
    let n = Node::new();
    let cfg = boot_config(n.path());
    let k = testkit::keys();
    let rels = n.path().join("rels");
    let other = testkit::make_release(&k, &rels, "v1-other", 4, 4096, Arch::host());
    let running = testkit::make_release(&k, &rels, "v1", 5, 4096, Arch::host());
    let install = |manifest: &Path| {
        [
            "bootloader".to_string(),
            "install".into(),
            "--boot-config".into(),
            cfg.to_str().unwrap().into(),
            "--running-manifest".into(),
            manifest.join("manifest.json").to_str().unwrap().into(),
        ]
    };
    let args = install(&other);
    let e = n.fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        e.contains("release v1-other (generation 4)")
            && e.contains("slot A runs v1 (generation 5)"),
        "{e}"
    );
    let args = install(&running);
    let out = n.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.contains("slot A: recorded the running build"), "{out}");
    assert_eq!(
        fs::read(n.path().join("state/slots/a/manifest.json")).unwrap(),
        fs::read(running.join("manifest.json")).unwrap(),
        "the running build's manifest is kept where staging keeps a slot's"
    );
}
