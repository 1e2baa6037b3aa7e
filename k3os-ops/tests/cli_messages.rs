//! The text a user sees when a command fails, pinned through the real binary: printed once, on
//! one `error:` line, naming what was wrong and what to do. A node here is a temp dir with the
//! k3OS-style dir layout and a real GRUB env (bootconfig's own writer), booted on slot A.

mod release_support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bootconfig::{BootEnv, Slot, SlotBoot};
use libupgrade::manifest::Arch;
use release_support::{bin, create, fake_inputs, keys};

struct Node {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let (_, trust) = keys(p, "node");
        for d in ["system", "boot/grub", "state", "health.d"] {
            fs::create_dir_all(p.join(d)).unwrap();
        }
        bootconfig::grub::GrubBootloader::new(p.join("boot/grub"), 3)
            .install(&BootEnv {
                primary: Slot::A,
                a: SlotBoot::Good,
                b: SlotBoot::Bad,
            })
            .unwrap();
        fs::write(p.join("cmdline"), "root=/dev/vda4 ro k3os.slot=A\n").unwrap();
        fs::write(p.join("boot_id"), "boot-1\n").unwrap();
        fs::write(p.join("k3os-release"), "VERSION=v1\nGENERATION=5\n").unwrap();
        fs::write(p.join("mountinfo"), "").unwrap();
        let config = p.join("config.toml");
        fs::write(
            &config,
            format!(
                r#"bootloader = "grub"
tries = 3
state_dir = "{p}/state"
trust_dir = "{trust}"
health_dir = "{p}/health.d"
health_timeout_secs = 5
proc_cmdline = "{p}/cmdline"
release_file = "{p}/k3os-release"
mountinfo = "{p}/mountinfo"
boot_id_file = "{p}/boot_id"
builtin_health_check = false
[layout]
kind = "dir"
root = "{p}/system"
boot_dir = "{p}/boot"
"#,
                p = p.display(),
                trust = trust.display()
            ),
        )
        .unwrap();
        Node { dir, config }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn ops(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .env("K3OS_OPS_CONFIG", &self.config)
            .env_remove("RUST_BACKTRACE")
            .env_remove("K3OS_OPS_BARRIERS")
            .env_remove("K3OS_OPS_BARRIER_STOP")
            .output()
            .unwrap()
    }

    /// Run a command that must fail; returns its stderr, checked to be one `error:` line.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.ops(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "k3os-ops {args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("error: "),
            "k3os-ops {args:?}: expected one `error:` line, got:\n{err}"
        );
        assert!(
            !err.contains("Caused by"),
            "anyhow's multi-line report leaked:\n{err}"
        );
        eprintln!("k3os-ops {args:?}: {}", lines[0]);
        lines[0].to_string()
    }

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
