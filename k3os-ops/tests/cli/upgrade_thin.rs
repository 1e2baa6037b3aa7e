//! `k3os-ops upgrade` for sites on thin links, end to end through the real binary on a temp
//! node root (k3OS dir layout, a real GRUB env, a real squashfs): `--plan-only` prices the
//! stage and writes nothing, `--max-bytes` stops cleanly and the next run (from an offline
//! bundle, `release bundle` → `upgrade --bundle`) fetches exactly what the plan said was left;
//! `--extra-source` takes chunks from a local directory; a tampered bundle is refused naming
//! the member, a truncated one naming where it ends; `--stage-until` and `--stage-window`
//! stop at the end of their schedule with exit 75, and the next run continues. `release
//! create --patch-from` lists per-pair patches, `--plan-only` and the upgrade name them. A trial boot
//! whose site cannot be reached (`[reachability]`) rolls back by itself at the limit; one that
//! reaches an endpoint (a listener, any HTTP answer, the URL it was staged from) is blessed.

use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cli_support::Node;
use libupgrade::manifest::Arch;
use release_support::create;
use testkit::release_size;

/// Fixtures of this module on the shared test node.
trait ThinReleases {
    fn squashfs_release(&self) -> PathBuf;
    fn bundle(&self, rel: &Path) -> (PathBuf, String);
    fn stage_bundle(&self, bundle: &Path) -> String;
}

impl ThinReleases for Node {
    /// A signed release `v2` (generation 6) whose rootfs is a real squashfs holding 3 MiB of
    /// incompressible data.
    fn squashfs_release(&self) -> PathBuf {
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

    /// `release bundle REL -o <node>/v2.k3b`: the bundle and what the command printed.
    fn bundle(&self, rel: &Path) -> (PathBuf, String) {
        let bundle = self.path().join("v2.k3b");
        let out = self.ok(&[
            "release",
            "bundle",
            rel.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
        ]);
        (bundle, out)
    }

    /// `upgrade --stage-only --bundle BUNDLE`, which must succeed: its stdout.
    fn stage_bundle(&self, bundle: &Path) -> String {
        self.ok(&[
            "upgrade",
            "--stage-only",
            "--bundle",
            bundle.to_str().unwrap(),
        ])
    }
}

/// Fixtures of this module on the shared test node: patched releases.
trait PatchedReleases {
    fn patched_release(
        &self,
        version: &str,
        generation: u64,
        payload: &[u8],
        kernel_seed: u64,
        from: Option<&Path>,
    ) -> (PathBuf, String) {
        self.patched_release_of(
            version,
            generation,
            &[("payload", payload.to_vec())],
            kernel_seed,
            from,
        )
    }
    fn patched_release_of(
        &self,
        version: &str,
        generation: u64,
        files: &[(&str, Vec<u8>)],
        kernel_seed: u64,
        from: Option<&Path>,
    ) -> (PathBuf, String);
    fn runs_in_a(&self, rel: &Path, version: &str);
}

impl PatchedReleases for Node {
    /// `release create` through the binary: release `version` (generation `generation`) whose
    /// rootfs is a squashfs made with the images' options holding `files`, with a kernel and
    /// initrd of noise (`kernel_seed`), patched from `from`; the directory and what it printed.
    fn patched_release_of(
        &self,
        version: &str,
        generation: u64,
        files: &[(&str, Vec<u8>)],
        kernel_seed: u64,
        from: Option<&Path>,
    ) -> (PathBuf, String) {
        let tree = self.path().join(format!("{version}.tree"));
        fs::create_dir_all(tree.join("etc")).unwrap();
        fs::write(
            tree.join("etc/k3os-release"),
            format!("VERSION={version}\nGENERATION={generation}\n"),
        )
        .unwrap();
        for (name, bytes) in files {
            fs::write(tree.join(name), bytes).unwrap();
        }
        let inputs = self.path().join(format!("{version}.in"));
        fs::create_dir_all(&inputs).unwrap();
        let rootfs = inputs.join("rootfs");
        let out = Command::new("mksquashfs")
            .arg(&tree)
            .arg(&rootfs)
            .args([
                "-noappend",
                "-quiet",
                "-all-root",
                "-no-xattrs",
                "-comp",
                "zstd",
            ])
            .args(["-no-fragments", "-mkfs-time", "0", "-all-time", "0"])
            .output()
            .expect("mksquashfs (squashfs-tools, installed by scripts/setup.sh)");
        assert!(out.status.success(), "{out:?}");
        let mut kernel = testkit::pseudo_random(300_000, 8);
        kernel[100_000..120_000].copy_from_slice(&testkit::pseudo_random(20_000, kernel_seed));
        fs::write(inputs.join("kernel"), kernel).unwrap();
        fs::write(inputs.join("initrd"), testkit::pseudo_random(200_000, 9)).unwrap();
        let from = from.map(|f| f.to_str().unwrap().to_string());
        let extra: Vec<&str> = from
            .iter()
            .flat_map(|f| ["--patch-from", f.as_str()])
            .collect();
        self.create_release(version, generation, &extra)
    }

    /// Slot A runs `rel` (the k3OS dir layout's version directories), and the node keeps its
    /// manifest as an image builder does.
    fn runs_in_a(&self, rel: &Path, version: &str) {
        let sys = self.path().join("system");
        fs::create_dir_all(sys.join("rootfs").join(version)).unwrap();
        fs::create_dir_all(sys.join("kernel").join(version)).unwrap();
        fs::copy(
            rel.join("rootfs.squashfs"),
            sys.join("rootfs").join(version).join("rootfs.squashfs"),
        )
        .unwrap();
        for f in ["vmlinuz", "initrd"] {
            fs::copy(rel.join(f), sys.join("kernel").join(version).join(f)).unwrap();
        }
        let keep = self.path().join("state/slots/a");
        fs::create_dir_all(&keep).unwrap();
        fs::copy(rel.join("manifest.json"), keep.join("manifest.json")).unwrap();
    }
}

#[test]
fn release_create_patches_and_plan_only_and_the_upgrade_name_them() {
    let n = Node::new();
    let p1 = testkit::pseudo_random(3 << 20, 7);
    let mut p2 = p1.clone();
    p2[1 << 20..(1 << 20) + 40_000].copy_from_slice(&testkit::pseudo_random(40_000, 70));
    let (v1, _) = n.patched_release("v1", 5, &p1, 0, None);
    let (v2, printed) = n.patched_release("v2", 6, &p2, 71, Some(&v1));
    eprintln!("{printed}");
    for a in ["rootfs from v1 (squashfs)", "kernel from v1 (plain)"] {
        let line = printed
            .lines()
            .find(|l| l.contains(&format!("patch {a}")))
            .unwrap_or_else(|| panic!("no {a} patch line:\n{printed}"));
        assert!(
            line.contains("listed as") && line.contains("built in"),
            "{line}"
        );
    }
    assert!(
        printed.contains("patch initrd from v1 (plain)") && printed.contains("dropped"),
        "the unchanged initrd's patch is not smaller than no chunk at all:\n{printed}"
    );
    n.runs_in_a(&v1, "v1");
    let out = plan_then_stage_the_patches(&n, &v2, |l| l.ends_with("by patch from v1"));
    for a in ["rootfs", "kernel"] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{a} by patch from v1")))
            .unwrap_or_else(|| panic!("no {a} patch line:\n{out}"));
        assert!(
            !line.contains("fell back") && !line.contains("by range"),
            "{line}"
        );
    }
    assert_eq!(
        fs::read(n.path().join("system/rootfs/v2/rootfs.squashfs")).unwrap(),
        fs::read(v2.join("rootfs.squashfs")).unwrap()
    );
}

/// Plan, then stage, v2 on `n`: the plan takes rootfs and kernel by patch (`planned` holds
/// for each's plan line) and prices exactly the two patches, and the stage fetches exactly
/// what the plan said. Returns the stage's output.
fn plan_then_stage_the_patches(n: &Node, v2: &Path, planned: impl Fn(&str) -> bool) -> String {
    let m = libupgrade::manifest::Manifest::parse(&fs::read(v2.join("manifest.json")).unwrap())
        .unwrap();
    let patches = m.files.rootfs.patches[0].size + m.files.kernel.patches[0].size;
    let src = v2.to_str().unwrap();
    let plan = n.ok(&["upgrade", "--plan-only", "--source", src]);
    eprintln!("{plan}");
    for a in ["rootfs", "kernel"] {
        let line = plan
            .lines()
            .find(|l| l.trim_start().starts_with(a))
            .unwrap();
        assert!(planned(line), "{line}");
    }
    assert_eq!(planned_fetch(&plan), patches, "{plan}");
    let out = n.ok(&["upgrade", "--stage-only", "--source", src]);
    eprintln!("{out}");
    assert!(
        out.contains(&format!("fetched ({patches} bytes)")),
        "the plan said {patches}: {out}"
    );
    out
}

#[test]
fn a_node_without_its_kept_manifest_proves_the_patch_base_by_hashing_and_fetches_only_the_patches()
{
    let n = Node::new();
    let p1 = testkit::pseudo_random(3 << 20, 17);
    let mut p2 = p1.clone();
    p2[2 << 20..(2 << 20) + 40_000].copy_from_slice(&testkit::pseudo_random(40_000, 72));
    let (v1, _) = n.patched_release("v1", 5, &p1, 0, None);
    let (v2, _) = n.patched_release("v2", 6, &p2, 73, Some(&v1));
    n.runs_in_a(&v1, "v1");
    // Imaged by another builder: slot A runs v1, but its manifest was never kept.
    fs::remove_file(n.path().join("state/slots/a/manifest.json")).unwrap();
    let out = plan_then_stage_the_patches(&n, &v2, |l| l.contains("by patch from v1"));
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("rootfs by patch from v1"))
        .unwrap_or_else(|| panic!("no rootfs patch line:\n{out}"));
    assert!(
        line.contains("base proven by hashing the running slot") && !line.contains("fell back"),
        "{line}"
    );
    assert_eq!(
        fs::read(n.path().join("system/rootfs/v2/rootfs.squashfs")).unwrap(),
        fs::read(v2.join("rootfs.squashfs")).unwrap()
    );
}

#[test]
fn on_a_fast_link_the_plan_takes_chunks_and_says_why_unless_told_to_prefer_bytes() {
    let n = Node::new();
    let p1 = testkit::pseudo_random(3 << 20, 27);
    let mut p2 = p1.clone();
    p2[1 << 20..(1 << 20) + 40_000].copy_from_slice(&testkit::pseudo_random(40_000, 74));
    let (v1, _) = n.patched_release("v1", 5, &p1, 0, None);
    let (v2, _) = n.patched_release("v2", 6, &p2, 75, Some(&v1));
    n.runs_in_a(&v1, "v1");
    let m = libupgrade::manifest::Manifest::parse(&fs::read(v2.join("manifest.json")).unwrap())
        .unwrap();
    assert!(
        m.files.rootfs.patches[0].blocks.is_some(),
        "release create names the blocks a node recompresses: {:?}",
        m.files.rootfs.patches
    );
    let src = v2.to_str().unwrap();
    let rootfs = |plan: &str| -> (String, String) {
        let mut lines = plan
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("rootfs"));
        (
            lines.next().unwrap().to_string(),
            lines.next().unwrap().trim().to_string(),
        )
    };
    // Told 100 MB/s: a few hundred kB of chunks beat recompressing the changed file's blocks.
    let fast = [
        "upgrade",
        "--plan-only",
        "--source",
        src,
        "--max-rate",
        "100M",
    ];
    let plan = n.ok(&fast);
    eprintln!("{plan}");
    let (line, why) = rootfs(&plan);
    assert!(!line.contains("by patch"), "{line}");
    assert!(
        why.starts_with("(chunks finish sooner at ") && why.contains("(told)"),
        "{why}"
    );
    // The same link, bytes preferred: the patch, and the plan says so.
    let plan = n.ok(&[&fast[..], &["--prefer", "bytes"]].concat());
    let (line, why) = rootfs(&plan);
    assert!(line.ends_with("by patch from v1"), "{line}");
    assert_eq!(why, "(fewest bytes (prefer bytes))");
    // A thin link told: the patch finishes sooner.
    let thin = [
        "upgrade",
        "--plan-only",
        "--source",
        src,
        "--max-rate",
        "20K",
    ];
    let plan = n.ok(&thin);
    let (line, why) = rootfs(&plan);
    assert!(line.ends_with("by patch from v1"), "{line}");
    assert!(why.starts_with("(patch finishes sooner at "), "{why}");
    // The stage follows the fast plan to the byte.
    let plan = n.ok(&fast);
    let out = n.ok(&[
        "upgrade",
        "--stage-only",
        "--source",
        src,
        "--max-rate",
        "100M",
    ]);
    let planned = planned_fetch(&plan);
    assert!(
        out.contains(&format!("fetched ({planned} bytes)")),
        "the plan said {planned}: {out}"
    );
    assert_eq!(
        fs::read(n.path().join("system/rootfs/v2/rootfs.squashfs")).unwrap(),
        fs::read(v2.join("rootfs.squashfs")).unwrap()
    );
}

/// `n` bytes of text-like noise (16 letters: compresses about 2:1, so every block is
/// recompressed at zstd level 15 on the node).
fn letters(n: usize, seed: u64) -> Vec<u8> {
    testkit::pseudo_random(n, seed)
        .into_iter()
        .map(|b| b'a' + (b & 15))
        .collect()
}

fn as_refs(v: &[(String, Vec<u8>)]) -> Vec<(&str, Vec<u8>)> {
    v.iter().map(|(n, b)| (n.as_str(), b.clone())).collect()
}

/// The `<n>` of the `(<n> bytes) <what>` in `line`.
fn bytes_before(line: &str, what: &str) -> u64 {
    let head = &line[..line
        .find(what)
        .unwrap_or_else(|| panic!("no {what} in {line}"))];
    let inner = head.rsplit('(').next().unwrap().split(' ').next().unwrap();
    inner.parse().unwrap()
}

#[test]
fn kill_9_in_the_apply_keeps_the_chunks_written_and_redoes_at_most_the_op_in_flight() {
    use std::io::BufRead;
    let n = Node::new();
    // Eight 1 MiB files, each changed in v2: eight Data ops, every block recompressed.
    let files = |seed: u64| -> Vec<(String, Vec<u8>)> {
        (0..8u64)
            .map(|i| {
                let mut f = letters(1 << 20, 100 + i);
                if seed > 0 {
                    f[300_000..340_000].copy_from_slice(&letters(40_000, seed * 10 + i));
                }
                (format!("f{i}"), f)
            })
            .collect()
    };
    let (f1, f2) = (files(0), files(7));
    let (v1, _) = n.patched_release_of("v1", 5, &as_refs(&f1), 0, None);
    let (v2, _) = n.patched_release_of("v2", 6, &as_refs(&f2), 76, Some(&v1));
    n.runs_in_a(&v1, "v1");
    let m = libupgrade::manifest::Manifest::parse(&fs::read(v2.join("manifest.json")).unwrap())
        .unwrap();
    let rootfs = &m.files.rootfs;
    assert_eq!(rootfs.patches[0].kind, "squashfs", "{:?}", rootfs.patches);
    let src = v2.to_str().unwrap();
    let stage = [
        "upgrade",
        "--stage-only",
        "--source",
        src,
        "--progress",
        "lines",
    ];
    // The first run is killed once its progress says 40 % of the rootfs came from the patch.
    let mut child = std::process::Command::new(k3os_ops_testing::release::bin())
        .args(stage)
        .env("K3OS_OPS_CONFIG", &n.config)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    for line in err.lines() {
        let line = line.unwrap();
        let pct = line
            .strip_prefix("rootfs from patch ")
            .and_then(|l| l.split(": ").nth(1))
            .and_then(|l| l.trim_start().split('%').next())
            .and_then(|p| p.trim().parse::<u32>().ok());
        seen.push(line);
        if pct.is_some_and(|p| (40..100).contains(&p)) {
            break;
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert!(
        seen.iter().any(|l| l.starts_with("rootfs from patch ")),
        "the child never reached the apply: {seen:#?}"
    );
    // What the target holds after the kill, chunk by chunk against the signed index.
    let index = libupgrade::chunk::ChunkIndex::parse(
        &fs::read(v2.join(&rootfs.chunks.as_ref().unwrap().path)).unwrap(),
    )
    .unwrap();
    let written =
        fs::read(n.path().join("system/rootfs/v2/.rootfs.squashfs.partial")).unwrap_or_default();
    let kept: u64 = index
        .chunks
        .iter()
        .filter(|c| {
            let end = (c.offset + u64::from(c.len)) as usize;
            end <= written.len()
                && libupgrade::chunk::digest(&written[c.offset as usize..end]) == c.digest
        })
        .map(|c| u64::from(c.len))
        .sum();
    assert!(
        kept > 0 && kept < rootfs.size,
        "killed in the apply: {kept} of {} bytes written",
        rootfs.size
    );
    let out = n.ok(&stage);
    eprintln!("{out}");
    assert_eq!(
        fs::read(n.path().join("system/rootfs/v2/rootfs.squashfs")).unwrap(),
        fs::read(v2.join("rootfs.squashfs")).unwrap()
    );
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("rootfs by patch from v1"))
        .unwrap_or_else(|| panic!("no rootfs patch line:\n{out}"));
    assert!(!line.contains("fell back"), "{line}");
    let skipped = bytes_before(line, "already written skipped");
    // Redone: output rebuilt again although the target held it. At most the op in flight
    // (one file: ≤ 1 MiB of output) and the chunks at its two ends.
    let max_chunk = u64::from(index.params.max);
    let redone = (rootfs.size - skipped).saturating_sub(rootfs.size - kept);
    assert!(
        skipped > 0 && redone <= (1 << 20) + 2 * max_chunk,
        "{kept} bytes kept, {skipped} skipped, {redone} redone: {line}"
    );
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
    let rel = n.squashfs_release();
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
    let line = n.fails_with_one_error(&[
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
    let (bundle, out) = n.bundle(&rel);
    assert!(
        out.contains("bundle format 1") && out.contains("release v2"),
        "{out}"
    );
    let out = n.stage_bundle(&bundle);
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
    let rel = n.squashfs_release();
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
    let rel = n.squashfs_release();
    let (bundle, _) = n.bundle(&rel);
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
        let line =
            n.fails_with_one_error(&["upgrade", "--stage-only", "--bundle", bad.to_str().unwrap()]);
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
    let line =
        n.fails_with_one_error(&["upgrade", "--stage-only", "--bundle", cut.to_str().unwrap()]);
    assert!(
        line.contains("truncated") && line.contains("release/rootfs.squashfs"),
        "{line}"
    );
    // The intact bundle still installs, with no network at all.
    let out = n.stage_bundle(&bundle);
    assert!(out.contains("staged v2"), "{out}");
}

fn rfc3339(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[test]
fn stage_until_and_stage_windows_stop_resumable_with_exit_75_and_the_next_run_continues() {
    use std::time::{Duration, Instant, SystemTime};
    let n = Node::new();
    let rel = n.squashfs_release();
    let src = rel.to_str().unwrap();
    let total = release_size(&rel);
    let exit_75 = |args: &[&str]| {
        let out = n.ops(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(75), "k3os-ops {args:?}: {err}");
        let line = err.lines().find(|l| l.starts_with("error: ")).unwrap();
        assert!(
            line.contains("stopped at the end of the download schedule")
                && line.contains("later run resumes"),
            "{line}"
        );
        eprintln!("k3os-ops {args:?}: {line}");
    };

    // Refused before anything: a malformed window, a schedule already over.
    let line = n.fails_with_one_error(&["upgrade", "--stage-window", "tonight", "--source", src]);
    assert!(
        line.contains("'tonight' is not a window START/END"),
        "{line}"
    );
    let past = rfc3339(SystemTime::now() - Duration::from_secs(60));
    let line = n.fails_with_one_error(&["upgrade", "--stage-until", &past, "--source", src]);
    assert!(line.contains("download schedule ended at"), "{line}");
    // ... and the help says so, beside the clean stop at the end of a schedule (exit 75).
    let help = n.ok(&["upgrade", "--help"]);
    assert!(
        help.contains("A time already past is refused (exit 1)")
            && help.contains("after the last one it stops cleanly (exit 75)"),
        "{help}"
    );

    // 2 s at 256 KiB/s of a 3.5 MiB release.
    let until = rfc3339(SystemTime::now() + Duration::from_secs(2));
    let args = ["--max-rate", "256K", "--source", src];
    exit_75(
        &[
            &["upgrade", "--stage-only", "--stage-until", &until][..],
            &args,
        ]
        .concat(),
    );
    let rest1 = planned_fetch(&n.ok(&["upgrade", "--plan-only", "--source", src]));
    assert!(
        rest1 < total - 256 * 1024 && rest1 > total - 1024 * 1024,
        "{rest1} of {total} left after 2 s at 256 KiB/s"
    );

    // Two windows, the first a second from now: waits for it, fetches in both, stops after.
    let at = |s: u64| rfc3339(SystemTime::now() + Duration::from_secs(s));
    let w1 = format!("{}/{}@512K", at(1), at(2));
    let w2 = format!("{}/{}@256K", at(3), at(4));
    let t = Instant::now();
    exit_75(&[
        "upgrade",
        "--stage-only",
        "--stage-window",
        &w1,
        "--stage-window",
        &w2,
        "--source",
        src,
    ]);
    assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
    let rest2 = planned_fetch(&n.ok(&["upgrade", "--plan-only", "--source", src]));
    let got = rest1 - rest2;
    assert!(
        got > 512 * 1024 && got <= 768 * 1024 + 128 * 1024,
        "{got} bytes in 1 s at 512 KiB/s and 1 s at 256 KiB/s"
    );

    // No schedule: the rest, exactly as planned.
    let out = n.ok(&["upgrade", "--stage-only", "--source", src]);
    assert!(
        out.contains("staged v2") && out.contains(&format!("fetched ({rest2} bytes)")),
        "the plan said {rest2}: {out}"
    );
}

/// Fixtures of this module on the shared test node.
trait ThinTrial {
    fn reachability(&self, endpoints: &[String], within_secs: u64);
    fn trial_of(&self, src: &str);
    fn status(&self) -> String;
    fn blesses_the_trial(&self) -> String;
}

impl ThinTrial for Node {
    /// Add a `[reachability]` table to the node's config.
    fn reachability(&self, endpoints: &[String], within_secs: u64) {
        let mut c = fs::read_to_string(&self.config).unwrap();
        let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
        c.push_str(&format!(
            "[reachability]\nendpoints = [{}]\nwithin_secs = {within_secs}\n",
            list.join(", ")
        ));
        fs::write(&self.config, c).unwrap();
    }

    /// Stage `src`, activate it and boot it on trial: the boot-time confirm is pending (75)
    /// on the reachability check.
    fn trial_of(&self, src: &str) {
        self.ok(&["upgrade", "--stage-only", "--source", src]);
        self.ok(&["slot", "activate"]);
        fs::write(self.path().join("cmdline"), "ro k3os.slot=B\n").unwrap();
        fs::write(self.path().join("boot_id"), "boot-2\n").unwrap();
        let out = self.ops(&["slot", "confirm"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "{err}");
        assert!(err.contains("waiting for reachable"), "{err}");
    }

    fn status(&self) -> String {
        self.ok(&["slot", "status"])
    }

    /// `slot await-bless` succeeds and slot B is then good and booted; its stdout.
    fn blesses_the_trial(&self) -> String {
        let out = self.ok(&["slot", "await-bless"]);
        let status = self.status();
        assert!(status.contains("slot B (good, booted"), "{status}");
        out
    }
}

/// A 127.0.0.1 port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn an_unreachable_site_rolls_the_trial_back_at_the_limit_naming_the_endpoints() {
    let n = Node::new();
    let rel = n.squashfs_release();
    let closed = format!("tcp://127.0.0.1:{}", closed_port());
    n.reachability(std::slice::from_ref(&closed), 2);
    n.trial_of(rel.to_str().unwrap());
    let t0 = std::time::Instant::now();
    let line = n.fails_with_one_error(&["slot", "await-bless"]);
    assert!(t0.elapsed() >= std::time::Duration::from_secs(2));
    assert!(
        line.contains("reachable: not reported within 2 s of the boot")
            && line.contains(&format!("none of {closed} (")),
        "{line}"
    );
    let st = n.status();
    assert!(
        st.contains("Next boot:  slot A") && st.contains("slot B (bad, booted"),
        "{st}"
    );
}

#[test]
fn a_reachable_site_blesses_the_trial_any_http_answer_or_the_staged_url_counts() {
    // A listener after a closed port: the first endpoint that answers is enough.
    let n = Node::new();
    let rel = n.squashfs_release();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = format!("tcp://{}", listener.local_addr().unwrap());
    let closed = format!("tcp://127.0.0.1:{}", closed_port());
    n.reachability(&[closed, open.clone()], 30);
    n.trial_of(rel.to_str().unwrap());
    let out = n.blesses_the_trial();
    assert!(out.contains("slot B"), "{out}");

    // Any HTTP answer (a 404) counts.
    let n = Node::new();
    let rel = n.squashfs_release();
    let srv = testkit::TestServer::paced(n.path().to_path_buf(), 0);
    n.reachability(&[format!("{}no-such-file", srv.base)], 30);
    n.trial_of(rel.to_str().unwrap());
    n.blesses_the_trial();

    // No endpoints configured: the URL the release was staged from; a local source has none,
    // which activation refuses up front.
    let n = Node::new();
    let rel = n.squashfs_release();
    n.reachability(&[], 30);
    n.ok(&["upgrade", "--stage-only", "--source", rel.to_str().unwrap()]);
    let line = n.fails_with_one_error(&["slot", "activate"]);
    assert!(line.contains("not staged from an http(s) URL"), "{line}");
    let n = Node::new();
    let rel = n.squashfs_release();
    let srv = testkit::TestServer::paced(n.path().to_path_buf(), 0);
    let plain = fs::read_to_string(&n.config).unwrap();
    n.reachability(&[], 30);
    n.trial_of(&format!(
        "{}{}",
        srv.base,
        rel.file_name().unwrap().to_str().unwrap()
    ));
    // The awaits are the activating slot's; a trial release whose own config has no
    // [reachability] still probes the URL it was staged from.
    fs::write(&n.config, plain).unwrap();
    let asked = srv.request_count();
    n.blesses_the_trial();
    let last = srv.requests_since(asked);
    assert!(
        last.iter().any(|r| r.is_get_of("/v2/manifest.json")),
        "probed {last:?}"
    );
}
