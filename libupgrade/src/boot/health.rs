//! Health checks run by `confirm` before a slot is marked good.
//!
//! Built in: the root filesystem is the booted slot's squashfs, mounted read-only, and the
//! running release file names the version the state file recorded for that slot. Extensible:
//! every executable regular file in the health directory is run in name order, each with a
//! timeout, with `K3OS_SLOT` and `K3OS_VERSION` in its environment; a non-zero exit, a signal
//! or a timeout fails the check, and the failure carries the check's last output lines.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub use crate::state::CheckResult;

/// A check registered by the caller of `confirm` (e.g. the agent's Node-Ready). It runs with
/// the built-in and `health.d` checks, before the single bless point; a failure counts like
/// any other check's.
pub trait HealthCheck {
    /// Check `slot`, which should hold `version`.
    fn check(&self, slot: bootconfig::Slot, version: Option<&str>) -> CheckResult;
}

/// A result the caller already has (e.g. the agent's Node-Ready, observed in the cluster).
impl HealthCheck for CheckResult {
    fn check(&self, _: bootconfig::Slot, _: Option<&str>) -> CheckResult {
        self.clone()
    }
}

/// One line of /proc/self/mountinfo that matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mounted device's (major, minor) numbers.
    pub dev: (u32, u32),
    /// Where it is mounted (octal escapes decoded).
    pub mount_point: String,
    /// Mounted read-only (per-mount or superblock option `ro`).
    pub read_only: bool,
    /// The filesystem type (`squashfs`, `ext4`, …).
    pub fstype: String,
    /// The mount source (a device path, or e.g. `overlay`; octal escapes decoded).
    pub source: String,
}

/// Parse mountinfo (see proc(5)): `id parent major:minor root mountpoint options [optional...] - fstype source superoptions`.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (maj, min) = l.get(2)?.split_once(':')?;
            let opts = l.get(5)?;
            Some(MountEntry {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                mount_point: unescape(l.get(4)?),
                read_only: opts.split(',').any(|o| o == "ro")
                    || r.get(2).is_some_and(|s| s.split(',').any(|o| o == "ro")),
                fstype: r.first()?.to_string(),
                source: unescape(r.get(1).unwrap_or(&"")),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Parse a `KEY=value` release file (`VERSION=`, `GENERATION=`), quotes optional.
pub fn parse_release_file(text: &str) -> (Option<String>, Option<u64>) {
    let mut version = None;
    let mut generation = None;
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().trim_matches('"').to_string();
            match k.trim() {
                "VERSION" => version = Some(v),
                "GENERATION" => generation = v.parse().ok(),
                _ => {}
            }
        }
    }
    (version, generation)
}

/// Run every executable in `dir` (name order) with `timeout` each.
pub fn run_check_dir(
    dir: &Path,
    timeout: Duration,
    env: &[(&str, String)],
) -> Result<Vec<CheckResult>> {
    let mut checks: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                std::fs::metadata(p)
                    .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                    .unwrap_or(false)
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io("read health check directory", dir, e)),
    };
    checks.sort();
    Ok(checks.iter().map(|p| run_check(p, timeout, env)).collect())
}

fn run_check(path: &Path, timeout: Duration, env: &[(&str, String)]) -> CheckResult {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut cmd = Command::new(path);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return CheckResult {
                name,
                ok: false,
                detail: format!("cannot run {}: {e}", path.display()),
            }
        }
    };
    // Drain output on threads so a chatty check cannot block on a full pipe.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = wait_within(&mut child, timeout);
    let output = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    let tail: Vec<&str> = output.lines().rev().take(3).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
    match status {
        Ok(st) if st.success() => CheckResult {
            name,
            ok: true,
            detail: tail,
        },
        Ok(st) => CheckResult {
            name,
            ok: false,
            detail: format!("{st}: {tail}"),
        },
        Err(why) => CheckResult {
            name,
            ok: false,
            detail: format!("{why}: {tail}"),
        },
    }
}

/// Read `r` to its end on a thread; the text read (lossy UTF-8).
fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut s);
        }
        String::from_utf8_lossy(&s).into_owned()
    })
}

/// The exit status of `child`, or why there is none: killed at `timeout`, or waiting failed.
fn wait_within(
    child: &mut std::process::Child,
    timeout: Duration,
) -> std::result::Result<std::process::ExitStatus, String> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st),
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {}s", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("wait failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_finds_readonly_squashfs() {
        let text = "22 1 254:4 / / ro,relatime shared:1 - squashfs /dev/vda4 ro\n\
                    23 22 0:5 / /dev rw - devtmpfs devtmpfs rw,size=1k\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].dev, (254, 4));
        assert!(m[0].read_only);
        assert_eq!(m[0].fstype, "squashfs");
        assert_eq!(m[0].source, "/dev/vda4");
        assert!(!m[1].read_only);
    }

    #[test]
    fn release_file() {
        assert_eq!(
            parse_release_file("VERSION=\"v2\"\nGENERATION=2\n"),
            (Some("v2".into()), Some(2))
        );
    }

    #[test]
    fn check_dir_runs_in_order_and_reports_failures_and_timeouts() {
        let d = tempfile::tempdir().unwrap();
        let write = |n: &str, body: &str| {
            let p = d.path().join(n);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        write("10-ok", "echo fine; [ \"$K3OS_SLOT\" = B ]");
        write("20-fail", "echo disk is sad >&2; exit 3");
        write("30-slow", "sleep 5");
        std::fs::write(d.path().join("40-not-executable"), "exit 1").unwrap();
        let r = run_check_dir(
            d.path(),
            Duration::from_millis(500),
            &[("K3OS_SLOT", "B".into())],
        )
        .unwrap();
        assert_eq!(
            r.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["10-ok", "20-fail", "30-slow"]
        );
        assert!(r[0].ok, "{:?}", r[0]);
        assert!(
            !r[1].ok && r[1].detail.contains("disk is sad") && r[1].detail.contains('3'),
            "{:?}",
            r[1]
        );
        assert!(!r[2].ok && r[2].detail.contains("timed out"), "{:?}", r[2]);
        assert!(
            run_check_dir(&d.path().join("missing"), Duration::from_secs(1), &[])
                .unwrap()
                .is_empty()
        );
    }
}
