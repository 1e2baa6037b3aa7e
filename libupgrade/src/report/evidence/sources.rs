//! Reading what a bundle carries from the node (the effects; `compose` decides what goes in):
//! the tail of each service log, of the kernel log and of pstore's records, and the versions.
//! Every read is best effort: what cannot be read is left out, and said in a `missing` line.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::compose::{Piece, TAIL_BYTES};

/// The last [`TAIL_BYTES`] of the file at `path` (lossy UTF-8); None when it cannot be read.
pub fn file_tail(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let from = len.saturating_sub(TAIL_BYTES as u64);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES as u64).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// One `/dev/kmsg` record (`prio,seq,usec,flags;text`) as `[   seconds] text`.
fn kmsg_line(record: &str) -> Option<String> {
    let (head, text) = record.split_once(';')?;
    let usec: u64 = head.split(',').nth(2)?.parse().ok()?;
    let text = text.lines().next().unwrap_or("");
    Some(format!(
        "[{:>5}.{:06}] {text}",
        usec / 1_000_000,
        usec % 1_000_000
    ))
}

/// The kernel log's tail: `/dev/kmsg` (a character device) read record by record without
/// blocking, from the oldest record the kernel still holds; any other file, its tail.
pub fn kernel_log(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return file_tail(path);
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut lines = std::collections::VecDeque::new();
    let mut total = 0usize;
    let mut buf = vec![0u8; 8192];
    // Bounded: the kernel's ring holds at most a few MiB of records.
    for _ in 0..100_000 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let Some(line) = kmsg_line(&String::from_utf8_lossy(&buf[..n])) else {
                    continue;
                };
                total += line.len() + 1;
                lines.push_back(line);
                while total > TAIL_BYTES {
                    total -= lines.pop_front().map_or(0, |l| l.len() + 1);
                }
            }
            // A record overwritten while reading: the next read goes on with the next one.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    let v: Vec<String> = lines.into();
    Some(v.join("\n"))
}

/// The service logs of `paths` present on the node, as `log/<file stem>` pieces.
pub fn service_logs(paths: &[std::path::PathBuf]) -> Vec<Piece> {
    paths
        .iter()
        .filter_map(|p| {
            let text = file_tail(p)?;
            let stem = p.file_stem()?.to_string_lossy().into_owned();
            Some(Piece {
                name: format!("log/{stem}"),
                text,
            })
        })
        .collect()
}

/// pstore's records (a panic's kernel log saved by the firmware or a RAM buffer), as
/// `pstore/<file>` pieces, newest name last; none when the directory is absent or empty.
pub fn pstore(dir: &Path) -> Vec<Piece> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<_> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|n| {
            Some(Piece {
                text: file_tail(&dir.join(&n))?,
                name: format!("pstore/{n}"),
            })
        })
        .collect()
}

/// Remove the pstore records `pieces` carry (`pstore/<file>` under `dir`), once they are sealed
/// in a kept bundle: a firmware backend's space is small (an EFI variable store holds a few
/// panics), and a record left there would be sent again with the next fallback's bundle.
/// Best effort: a record that cannot be removed is logged.
pub fn remove_pstore(dir: &Path, pieces: &[Piece]) {
    for n in pieces.iter().filter_map(|p| p.name.strip_prefix("pstore/")) {
        let path = dir.join(n);
        if let Err(e) = std::fs::remove_file(&path) {
            log::warn!(
                "pstore record {} not removed after its bundle: {e}",
                path.display()
            );
        }
    }
}

/// `name=value` lines: this build, the running kernel, the running release file's keys.
pub fn versions(release_file: &Path) -> Vec<(String, String)> {
    let mut out = vec![(
        "k3os-ops".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    )];
    if let Ok(k) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        out.push(("kernel".into(), k.trim().to_string()));
    }
    let rel = std::fs::read_to_string(release_file).unwrap_or_default();
    for line in rel.lines().take(16) {
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().trim_matches('"');
            out.push((
                format!("release.{}", k.trim().to_lowercase()),
                v.to_string(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmsg_records_become_timed_lines() {
        assert_eq!(
            kmsg_line("6,339,5140900,-;NET: Registered protocol family 10\n SUBSYSTEM=net\n")
                .unwrap(),
            "[    5.140900] NET: Registered protocol family 10"
        );
        assert_eq!(kmsg_line("garbage"), None);
    }

    #[test]
    fn a_files_tail_and_the_pstore_records_are_read() {
        let d = tempfile::tempdir().unwrap();
        let big = "x".repeat(TAIL_BYTES) + "\nlast line\n";
        std::fs::write(d.path().join("kubelet.log"), &big).unwrap();
        let t = file_tail(&d.path().join("kubelet.log")).unwrap();
        assert_eq!(t.len(), TAIL_BYTES);
        assert!(t.ends_with("last line\n"));
        assert_eq!(kernel_log(&d.path().join("kubelet.log")).unwrap(), t);
        let logs = service_logs(&[d.path().join("kubelet.log"), d.path().join("absent.log")]);
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].name, "log/kubelet");
        let ps = d.path().join("pstore");
        std::fs::create_dir(&ps).unwrap();
        std::fs::write(ps.join("dmesg-efi-2"), "Kernel panic - not syncing").unwrap();
        std::fs::write(ps.join("dmesg-efi-1"), "Oops").unwrap();
        let p = pstore(&ps);
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["pstore/dmesg-efi-1", "pstore/dmesg-efi-2"]);
        assert!(pstore(&d.path().join("none")).is_empty());
        remove_pstore(&ps, &p[..1]);
        let left: Vec<_> = pstore(&ps).into_iter().map(|x| x.name).collect();
        assert_eq!(left, ["pstore/dmesg-efi-2"], "only the sealed record goes");
    }
}
