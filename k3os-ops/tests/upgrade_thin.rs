//! `k3os-ops upgrade` for sites on thin links, end to end through the real binary on a temp
//! node root (k3OS dir layout, a real GRUB env, a real squashfs): `--plan-only` prices the
//! stage and writes nothing, `--max-bytes` stops cleanly and the next run (from an offline
//! bundle, `release bundle` → `upgrade --bundle`) fetches exactly what the plan said was left;
//! `--extra-source` takes chunks from a local directory; a tampered bundle is refused naming
//! the member, a truncated one naming where it ends.

mod release_support;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bootconfig::{BootEnv, Slot, SlotBoot};
use libupgrade::manifest::Arch;
use release_support::{bin, create, keys};

struct Node {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        keys(p, "node");
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
trust_dir = "{p}/trust"
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
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.ops(args);
        assert!(
            out.status.success(),
            "k3os-ops {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A command that must fail with one `error:` line; returns it.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.ops(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "k3os-ops {args:?} succeeded");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(lines.len(), 1, "k3os-ops {args:?}: {err}");
        eprintln!("k3os-ops {args:?}: {}", lines[0]);
        lines[0].to_string()
    }

    /// A signed release `v2` (generation 6) whose rootfs is a real squashfs holding 3 MiB of
    /// incompressible data.
    fn release(&self) -> PathBuf {
        let tree = self.path().join("v2.tree");
        fs::create_dir_all(tree.join("etc")).unwrap();
        fs::write(tree.join("etc/k3os-release"), "VERSION=v2\nGENERATION=6\n").unwrap();
        fs::write(tree.join("payload"), testkit::pseudo_random(3 << 20, 7)).unwrap();
        let inputs = self.path().join("v2.in");
        fs::create_dir_all(&inputs).unwrap();
        let rootfs = inputs.join("rootfs");
        let out = Command::new("mksquashfs")
            .arg(&tree)
            .arg(&rootfs)
            .args(["-noappend", "-quiet", "-all-root"])
            .output()
            .expect("mksquashfs (squashfs-tools, installed by scripts/setup.sh)");
        assert!(out.status.success(), "{out:?}");
        fs::write(inputs.join("kernel"), testkit::pseudo_random(300_000, 8)).unwrap();
        fs::write(inputs.join("initrd"), testkit::pseudo_random(200_000, 9)).unwrap();
        let rel = self.path().join("v2");
        create(
            &(rootfs, inputs.join("kernel"), inputs.join("initrd")),
            &self.path().join("keys/node.key"),
            &rel,
            "v2",
            Arch::host(),
            Some(6),
        );
        rel
    }
}

/// The exact byte count in `--plan-only`'s total line.
fn planned_fetch(out: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .unwrap_or_else(|| panic!("no total line in:\n{out}"));
    let inner = line.split('(').nth(1).unwrap().split(' ').next().unwrap();
    inner.parse().unwrap()
}

fn release_size(rel: &Path) -> u64 {
    ["rootfs.squashfs", "vmlinuz", "initrd"]
        .iter()
        .map(|f| fs::metadata(rel.join(f)).unwrap().len())
        .sum()
}

fn state_files(n: &Node) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for d in ["state", "system", "boot"] {
        let mut stack = vec![n.path().join(d)];
        while let Some(p) = stack.pop() {
            for e in fs::read_dir(&p).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    stack.push(e);
                } else {
                    out.push((e.clone(), fs::read(&e).unwrap_or_default()));
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn plan_only_then_a_budget_stop_then_the_rest_from_a_bundle() {
    let n = Node::new();
    let rel = n.release();
    let src = rel.to_str().unwrap();
    let total = release_size(&rel);

    let before = state_files(&n);
    let plan = n.ok(&["upgrade", "--plan-only", "--source", src]);
    eprintln!("{plan}");
    assert!(
        plan.contains("plan for v2 (generation 6) into slot B"),
        "{plan}"
    );
    assert!(plan.contains("rootfs") && plan.contains("kernel") && plan.contains("initrd"));
    assert_eq!(planned_fetch(&plan), total);
    assert_eq!(state_files(&n), before, "--plan-only wrote something");

    // Day 1: a 1 MiB budget.
    let line = n.fails(&[
        "upgrade",
        "--stage-only",
        "--max-bytes",
        "1M",
        "--source",
        src,
    ]);
    assert!(
        line.contains("byte budget of 1.0 MiB") && line.contains("left to fetch"),
        "{line}"
    );

    // The plan now continues the interrupted attempt and fetches only the rest.
    let plan = n.ok(&["upgrade", "--plan-only", "--source", src]);
    assert!(
        plan.contains("continuing an interrupted download"),
        "{plan}"
    );
    let rest = planned_fetch(&plan);
    assert!(rest < total - (1 << 20) + 65_536, "{rest} of {total}");

    // Day 2, offline: the same release from a bundle.
    let bundle = n.path().join("v2.k3b");
    let out = n.ok(&["release", "bundle", src, "-o", bundle.to_str().unwrap()]);
    assert!(
        out.contains("bundle format 1") && out.contains("release v2"),
        "{out}"
    );
    let out = n.ok(&[
        "upgrade",
        "--stage-only",
        "--bundle",
        bundle.to_str().unwrap(),
    ]);
    assert!(
        out.contains("staged v2") && out.contains("resuming"),
        "{out}"
    );
    assert!(
        out.contains(&format!("fetched ({rest} bytes)")),
        "the plan said {rest}: {out}"
    );
    let status = n.ok(&["slot", "status"]);
    assert!(status.contains("v2"), "{status}");
}

#[test]
fn an_extra_source_directory_is_used_before_the_origin() {
    let n = Node::new();
    let rel = n.release();
    let src = rel.to_str().unwrap();
    let total = release_size(&rel);
    let medium = n.path().join("usb");
    fs::create_dir_all(&medium).unwrap();
    for f in ["rootfs.squashfs", "vmlinuz", "initrd"] {
        fs::copy(rel.join(f), medium.join(f)).unwrap();
    }
    let args = ["--source", src, "--extra-source", medium.to_str().unwrap()];
    let plan = n.ok(&[&["upgrade", "--plan-only"][..], &args].concat());
    assert_eq!(planned_fetch(&plan), 0, "{plan}");
    let out = n.ok(&[&["upgrade", "--stage-only"][..], &args].concat());
    assert!(out.contains("fetched (0 bytes)"), "{out}");
    assert!(total > 3 << 20);
}

/// Member name → (data offset, size) of a bundle.
fn members(bundle: &Path) -> Vec<(String, u64, u64)> {
    let mut ar = tar::Archive::new(fs::File::open(bundle).unwrap());
    ar.entries_with_seek()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.path().unwrap().display().to_string(),
                e.raw_file_position(),
                e.size(),
            )
        })
        .collect()
}

#[test]
fn a_tampered_or_truncated_bundle_is_refused_naming_the_member() {
    let n = Node::new();
    let rel = n.release();
    let bundle = n.path().join("v2.k3b");
    n.ok(&[
        "release",
        "bundle",
        rel.to_str().unwrap(),
        "-o",
        bundle.to_str().unwrap(),
    ]);
    let list = members(&bundle);
    let names: Vec<&str> = list.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(names[0], "k3os-bundle.json");
    assert_eq!(
        &names[1..3],
        ["release/manifest.json", "release/manifest.json.sig"]
    );
    assert_eq!(names.len(), 9, "{names:?}");

    for (name, offset, size) in &list {
        let bad = n.path().join("bad.k3b");
        fs::copy(&bundle, &bad).unwrap();
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bad)
            .unwrap();
        // The first byte of JSON members (breaks their syntax), the middle of the others.
        let at = if name.ends_with(".json") { 0 } else { size / 2 };
        let mut b = [0u8];
        f.read_exact_at(&mut b, offset + at).unwrap();
        f.write_all_at(&[b[0] ^ 0x5a], offset + at).unwrap();
        drop(f);
        let line = n.fails(&["upgrade", "--stage-only", "--bundle", bad.to_str().unwrap()]);
        // The signature is checked over the manifest: a bad signature names the manifest.
        let named = name.strip_suffix(".sig").unwrap_or(name);
        assert!(line.contains(named), "{name}: {line}");
    }

    // Truncated inside the rootfs member.
    let (_, offset, size) = list
        .iter()
        .find(|m| m.0 == "release/rootfs.squashfs")
        .unwrap();
    let cut = n.path().join("cut.k3b");
    fs::copy(&bundle, &cut).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(offset + size / 2)
        .unwrap();
    let line = n.fails(&["upgrade", "--stage-only", "--bundle", cut.to_str().unwrap()]);
    assert!(
        line.contains("truncated") && line.contains("release/rootfs.squashfs"),
        "{line}"
    );
    // The intact bundle still installs, with no network at all.
    let out = n.ok(&[
        "upgrade",
        "--stage-only",
        "--bundle",
        bundle.to_str().unwrap(),
    ]);
    assert!(out.contains("staged v2"), "{out}");
}
