//! Helpers shared by the integration tests: running host tools and failing (never skipping)
//! with the reason when one is missing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bootconfig::{BootEnv, Slot, SlotBoot};

/// Run a tool and return its output; panics naming the tool and its package when it cannot run.
pub fn run(tool: &str, package: &str, args: &[&str]) -> Output {
    Command::new(tool).args(args).output().unwrap_or_else(|e| {
        panic!("{tool} (Debian package {package}) must be installed to run this test: {e}")
    })
}

/// Like [`run`] but the tool must succeed.
pub fn run_ok(tool: &str, package: &str, args: &[&str]) -> String {
    let out = run(tool, package, args);
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every BootEnv with tries in 0..=max.
pub fn all_envs(max: u8) -> Vec<BootEnv> {
    let mut states = vec![SlotBoot::Good, SlotBoot::Bad];
    states.extend((0..=max).map(|t| SlotBoot::Trying { tries_left: t }));
    let mut out = Vec::new();
    for primary in Slot::ALL {
        for &a in &states {
            for &b in &states {
                out.push(BootEnv { primary, a, b });
            }
        }
    }
    out
}

pub mod qemu;

/// Byte counts at which a write is cut: the byte-boundary classes of the brief. `usize::MAX`
/// means "complete" (for a replacement: complete but not renamed).
pub const CUTS: [usize; 8] = [0, 1, 511, 512, 513, 1023, 1024, usize::MAX];

/// Copy every regular file of `from` into `to` (recursively), creating directories.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst: PathBuf = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// `op` with its path moved from under `from` to the same place under `to`.
pub fn rebase(op: &bootconfig::WriteOp, from: &Path, to: &Path) -> bootconfig::WriteOp {
    use bootconfig::WriteOp;
    let p: PathBuf = to.join(op.path().strip_prefix(from).unwrap());
    match op {
        WriteOp::InPlace { offset, data, .. } => WriteOp::InPlace {
            path: p,
            offset: *offset,
            data: data.clone(),
        },
        WriteOp::Replace { data, .. } => WriteOp::Replace {
            path: p,
            data: data.clone(),
        },
    }
}

/// A copy of `base` after `ops[..i]` completed and a power cut hit `ops[i]` after `cut` bytes.
pub fn after_cut(
    base: &Path,
    ops: &[bootconfig::WriteOp],
    i: usize,
    cut: usize,
) -> tempfile::TempDir {
    let st = scratch();
    copy_tree(base, st.path());
    for op in &ops[..i] {
        rebase(op, base, st.path()).apply().unwrap();
    }
    rebase(&ops[i], base, st.path()).apply_torn(cut).unwrap();
    st
}

/// A scratch directory, in RAM (/dev/shm) when available: the power-cut tests create tens of
/// thousands of states and every write fsyncs.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// The cut points for `ops[i]`: the byte-boundary classes of [`CUTS`] plus every distinct state
/// a cut inside the range where the write changes the file leaves (there a cut leaves a mix
/// of old and new bytes; the fixed classes alone may all fall into unchanged padding).
pub fn cuts_for(base: &Path, ops: &[bootconfig::WriteOp], i: usize) -> Vec<usize> {
    use bootconfig::WriteOp;
    let st = scratch();
    copy_tree(base, st.path());
    for op in &ops[..i] {
        rebase(op, base, st.path()).apply().unwrap();
    }
    let mut cuts = CUTS.to_vec();
    if let WriteOp::InPlace { offset, data, .. } = rebase(&ops[i], base, st.path()) {
        let cur = std::fs::read(rebase(&ops[i], base, st.path()).path()).unwrap();
        let cur = &cur[offset as usize..offset as usize + data.len()];
        let diff: Vec<usize> = (0..data.len()).filter(|&k| cur[k] != data[k]).collect();
        // A cut after k bytes leaves new[..k] + old[k..]: cutting at k and k+1 gives the same
        // bytes unless byte k changes, so the distinct states are the cut at the first changed
        // byte and the cut just after each changed byte.
        if let Some(&first) = diff.first() {
            cuts.push(first);
            cuts.extend(diff.iter().map(|&k| k + 1));
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Overwrite the first occurrence of `from` in the file with `to` (same length or shorter):
/// byte damage that keeps the file's size, as flash and SD media do it.
pub fn damage(path: &Path, from: &[u8], to: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    let i = b
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{} holds no {:?}", path.display(), from));
    b[i..i + to.len()].copy_from_slice(to);
    std::fs::write(path, b).unwrap();
}

/// Every file under `dir` with its bytes, sorted by path: to show that a refused call wrote
/// nothing.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}
