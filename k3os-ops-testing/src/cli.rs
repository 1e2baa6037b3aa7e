//! The node of k3os-ops' CLI tests that run the real `k3os-ops` binary (`cli_messages`,
//! `upgrade_thin`, `release_trust_cli`, `rollout_cli`, the cluster fleet): a temp dir with
//! the k3OS-style layout, a real GRUB env written by bootconfig's own writer, booted on slot
//! A, trusting its own key; and running a command on it that must succeed or must fail with
//! one `error:` line. Test modules add their own fixtures as extension traits of [`Node`].

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bootconfig::{BootEnv, Slot, SlotBoot};

use crate::release::{bin, keys};

/// Run `k3os-ops args` with `config` as its `K3OS_OPS_CONFIG` (none: the binary's default),
/// without the environment's backtrace and barrier switches (they change what it prints and
/// where it stops).
pub fn ops(config: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("K3OS_OPS_BARRIERS")
        .env_remove("K3OS_OPS_BARRIER_STOP");
    if let Some(cfg) = config {
        c.env("K3OS_OPS_CONFIG", cfg);
    }
    c.output().unwrap()
}

/// Lay out a node in `p`: the k3OS dir layout, booted on slot A (v1, `generation`; slot B bad,
/// 3 tries), trusting the keys in `trust`; `extra` lines go into its config file (before the
/// layout table). Returns the config file's path.
pub fn write_node(p: &Path, generation: u64, trust: &Path, extra: &str) -> PathBuf {
    for d in ["system", "boot/grub", "state", "health.d"] {
        fs::create_dir_all(p.join(d)).unwrap();
    }
    bootconfig::GrubBootloader::new(p.join("boot/grub"), 3)
        .install(&BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        })
        .unwrap();
    fs::write(p.join("cmdline"), "root=/dev/vda4 ro k3os.slot=A\n").unwrap();
    fs::write(p.join("boot_id"), "boot-1\n").unwrap();
    fs::write(
        p.join("k3os-release"),
        format!("VERSION=v1\nGENERATION={generation}\n"),
    )
    .unwrap();
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
airgap_dir = "{p}/airgap"
health_timeout_secs = 5
proc_cmdline = "{p}/cmdline"
release_file = "{p}/k3os-release"
mountinfo = "{p}/mountinfo"
boot_id_file = "{p}/boot_id"
builtin_health_check = false
{extra}[layout]
kind = "dir"
root = "{p}/system"
boot_dir = "{p}/boot"
"#,
            p = p.display(),
            trust = trust.display()
        ),
    )
    .unwrap();
    config
}

/// A node booted on slot A (v1, generation 5; slot B bad, 3 tries) with a key pair
/// `keys/node.key` whose public key is in its trust dir; `config` is its config file.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl Default for Node {
    fn default() -> Node {
        Node::new()
    }
}

impl Node {
    /// A fresh node on slot A, generation 5, trusting its own key `node`.
    pub fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let (_, trust) = keys(dir.path(), "node");
        let config = write_node(dir.path(), 5, &trust, "");
        Node { dir, config }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn ops(&self, args: &[&str]) -> Output {
        ops(Some(&self.config), args)
    }

    /// `release create` through the binary from this node's inputs of `version`
    /// (`<version>.in/{rootfs,kernel,initrd}`), signed with `keys/node.key`, into `<version>/`,
    /// for this host's architecture, with `extra` arguments (`--image`, `--patch-from`, …): the
    /// release directory and what the command printed. The one way the CLI tests publish.
    pub fn create_release(
        &self,
        version: &str,
        generation: u64,
        extra: &[&str],
    ) -> (PathBuf, String) {
        let inputs = self.path().join(format!("{version}.in"));
        let p = |name: &str| inputs.join(name).to_str().unwrap().to_string();
        let (rootfs, kernel, initrd) = (p("rootfs"), p("kernel"), p("initrd"));
        let key = self.path().join("keys/node.key");
        let rel = self.path().join(version);
        let gen = generation.to_string();
        let mut args = vec![
            "release", "create", "--rootfs", &rootfs, "--kernel", &kernel,
        ];
        args.extend(["--initrd", &initrd, "--version", version]);
        args.extend(["--arch", libupgrade::manifest::Arch::host().as_str()]);
        args.extend(["--generation", &gen, "--key", key.to_str().unwrap()]);
        args.extend(["-o", rel.to_str().unwrap()]);
        args.extend(extra);
        let printed = self.ok(&args);
        (rel, printed)
    }

    /// Run a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ops(args);
        assert!(
            out.status.success(),
            "k3os-ops {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run a command that must fail; returns its stderr, checked to be one `error:` line
    /// and nothing else.
    pub fn fails(&self, args: &[&str]) -> String {
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

    /// Run a command that must fail with one `error:` line among what else it prints on
    /// stderr (progress, warnings); returns that line.
    pub fn fails_with_one_error(&self, args: &[&str]) -> String {
        let out = self.ops(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "k3os-ops {args:?} succeeded");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(lines.len(), 1, "k3os-ops {args:?}: {err}");
        eprintln!("k3os-ops {args:?}: {}", lines[0]);
        lines[0].to_string()
    }
}
