//! Helpers shared by the fuzz targets (`fuzz_targets/`), the seed writer (`examples/seeds.rs`)
//! and the `grub-editenv` replay test (`tests/grub_editenv.rs`). Nothing here links libFuzzer.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bootconfig::grub_load;

/// Separates the files of a multi-file input (GRUB dir, syslinux dir): `file0 SEP file1 SEP …`.
/// An empty part is a missing file; parts past the end are missing too.
pub const SEP: &[u8] = b"\n~~k3os-fuzz-file~~\n";

/// The parts of `data`, exactly `n` of them (the last one takes the rest, separators included).
pub fn split_files(data: &[u8], n: usize) -> Vec<Option<&[u8]>> {
    let mut out = Vec::with_capacity(n);
    let mut rest = Some(data);
    for i in 0..n {
        let Some(r) = rest else {
            out.push(None);
            continue;
        };
        let cut = if i + 1 == n {
            None
        } else {
            r.windows(SEP.len()).position(|w| w == SEP)
        };
        let (part, next) = match cut {
            Some(c) => (&r[..c], Some(&r[c + SEP.len()..])),
            None => (r, None),
        };
        out.push(if part.is_empty() { None } else { Some(part) });
        rest = next;
    }
    out
}

/// `parts` joined back into one input (for the seed writer).
pub fn join_files(parts: &[Option<&[u8]>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(SEP);
        }
        out.extend_from_slice(p.unwrap_or_default());
    }
    out
}

/// A scratch directory for this process, on tmpfs when there is one, emptied on every call.
/// libFuzzer exits without running destructors, so the directory is named after the process
/// and those of processes that are gone are removed when the next one starts.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("k3os-fuzz-") {
                if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let d = base.join(format!("k3os-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).expect("scratch dir");
        d
    });
    for e in std::fs::read_dir(dir).expect("read scratch dir") {
        let p = e.expect("scratch entry").path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).expect("clear scratch dir");
        } else {
            std::fs::remove_file(&p).expect("clear scratch file");
        }
    }
    dir
}

/// Write `data` to `path`, or make sure there is no file there when `None`.
pub fn put(path: &Path, data: Option<&[u8]>) {
    match data {
        Some(d) => std::fs::write(path, d).expect("write scratch file"),
        None => {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What `grub-editenv FILE list` prints for a file holding `bytes` (GRUB's
/// `grub_envblk_iterate`, each variable printed with `printf("%s=%s\n")`, lossily decoded),
/// `None` when it refuses the file ("invalid environment block"). Built on
/// [`bootconfig::grub_load`]; `tests/grub_editenv.rs` checks it against the real tool.
pub fn editenv_list(bytes: &[u8]) -> Option<String> {
    let l = grub_load(bytes)?;
    Some(l.vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect())
}

/// The seed and fuzzing corpora of `target` (`fuzz/seeds/<target>`, `fuzz/corpus/<target>`).
pub fn corpus_dirs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["seeds", "corpus"]
        .iter()
        .map(|d| root.join(d).join(target))
        .filter(|p| p.is_dir())
        .collect()
}

/// Seed of the signing key the `signature` target trusts (a test key: never use it to sign).
pub const SIGNING_SEED: [u8; 32] = [0x5a; 32];

/// The manifest the `signature` seeds are signed over.
pub const SIGNED_MANIFEST: &[u8] = b"{\n  \"format\": 1,\n  \"version\": \"v2\"\n}\n";

/// The base every `patch` input applies to: 256 KiB of fixed pseudo-random bytes with a few
/// compressible runs (the seeds are real patches against it, `examples/seeds.rs`).
pub fn patch_base() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..256 << 10)
        .map(|i: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 8192 < 1024 {
                (i / 8192) as u8
            } else {
                (x >> 32) as u8
            }
        })
        .collect()
}
