//! Write barriers, announced for power-cut tests.
//!
//! Every durable step of stage, activate and confirm (after each fsync or rename that changes
//! what survives a power cut) calls [`hit`] with a name. Barriers are compiled into every build
//! (one binary serves the test images, `just demo`, the container image and real nodes) and
//! stay silent unless the environment asks:
//! - `K3OS_OPS_BARRIERS=1`: each barrier is printed on stderr (the console in the test VMs) as
//!   `K3OS-BARRIER <n> <name>`, so a harness can count them in a dry run;
//! - `K3OS_OPS_BARRIER_STOP=<k>`: the process prints every barrier and, at barrier k,
//!   `K3OS-BARRIER-STOP <k> <name>` and then stops dead, so a harness can cut power at exactly
//!   that point;
//! - a file `barrier-stop` in the state directory holding `<k>` does the same as
//!   `K3OS_OPS_BARRIER_STOP=<k>` for the next [`Updater::confirm`](crate::Updater::confirm)
//!   (`slot confirm`, run by init on every boot), counting barriers from the start of that
//!   process; it is consumed (removed durably) before any barrier of the confirm is hit, so
//!   exactly one run stops. It hands the stop to a process the harness cannot give an environment to: `slot
//!   confirm` run by init on the next boot (power cuts during `confirm`). The environment
//!   variable wins when both are set.
//!
//! Why not a cargo feature: a separate fault-injection build doubled the static musl builds in
//! CI and made `just demo` print barrier lines. An unset variable costs one `getenv` per
//! barrier (a few dozen per upgrade); setting it needs the same root access as killing the
//! process, so it adds no new way to stop an update.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

static COUNT: AtomicU64 = AtomicU64::new(0);
/// Barrier to stop at, armed from the state directory's file (0: none).
static FILE_STOP: AtomicU64 = AtomicU64::new(0);

/// The stop file in the state directory.
pub const STOP_FILE: &str = "barrier-stop";

fn parse_stop_file(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&k| k > 0)
}

/// Consume `<state_dir>/barrier-stop` if there is one: remove it durably, then arm this process
/// to stop at the barrier it names. Returns that barrier number. A file that names no barrier
/// (anything but a positive number) is consumed too, and reported.
pub fn arm_from_state_dir(state_dir: &Path) -> Result<Option<u64>> {
    let path = state_dir.join(STOP_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("read barrier stop file", &path, e)),
    };
    std::fs::remove_file(&path).map_err(|e| Error::io("consume barrier stop file", &path, e))?;
    bootconfig::atomic::fsync_dir(state_dir)?;
    let k = parse_stop_file(&text).ok_or_else(|| Error::State {
        path: path.clone(),
        what: format!(
            "expected the number of the barrier to stop at, found {:?} (removed)",
            text.trim()
        ),
    })?;
    FILE_STOP.store(k, Ordering::SeqCst);
    Ok(Some(k))
}

/// What the environment asks of the barriers (pure, so it is unit-tested without `set_var`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mode {
    announce: bool,
    stop_at: Option<u64>,
}

fn mode(announce: Option<&str>, stop: Option<&str>) -> Mode {
    let stop_at = stop.and_then(|v| v.trim().parse::<u64>().ok());
    let announce = matches!(announce.map(str::trim), Some(v) if !v.is_empty() && v != "0");
    Mode {
        announce: announce || stop_at.is_some(),
        stop_at,
    }
}

/// Record a write barrier named `name` (announce it, or stop here, if the environment asks).
pub fn hit(name: &str) {
    let n = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    let env_stop = std::env::var("K3OS_OPS_BARRIER_STOP").ok();
    let file_stop = match FILE_STOP.load(Ordering::SeqCst) {
        0 => None,
        k => Some(k.to_string()),
    };
    let m = mode(
        std::env::var("K3OS_OPS_BARRIERS").ok().as_deref(),
        env_stop.as_deref().or(file_stop.as_deref()),
    );
    if !m.announce {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "K3OS-BARRIER {n} {name}");
    if m.stop_at == Some(n) {
        let _ = writeln!(err, "K3OS-BARRIER-STOP {n} {name}");
        let _ = err.flush();
        drop(err);
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Barriers passed so far by this process.
pub fn count() -> u64 {
    COUNT.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_unless_asked() {
        assert_eq!(
            mode(None, None),
            Mode {
                announce: false,
                stop_at: None
            }
        );
        assert_eq!(
            mode(Some("0"), None),
            Mode {
                announce: false,
                stop_at: None
            }
        );
        assert_eq!(
            mode(Some(""), Some("x")),
            Mode {
                announce: false,
                stop_at: None
            }
        );
        assert_eq!(
            mode(Some("1"), None),
            Mode {
                announce: true,
                stop_at: None
            }
        );
        assert_eq!(
            mode(None, Some(" 7 ")),
            Mode {
                announce: true,
                stop_at: Some(7)
            }
        );
    }

    #[test]
    fn the_stop_file_is_consumed_once_and_names_a_barrier() {
        assert_eq!(parse_stop_file(" 4\n"), Some(4));
        assert_eq!(parse_stop_file("0"), None);
        assert_eq!(parse_stop_file("confirm"), None);
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            arm_from_state_dir(d.path()).unwrap(),
            None,
            "no file: not armed"
        );
        std::fs::write(d.path().join(STOP_FILE), "x").unwrap();
        let e = arm_from_state_dir(d.path()).unwrap_err().to_string();
        assert!(e.contains("barrier-stop") && e.contains("\"x\""), "{e}");
        assert!(
            !d.path().join(STOP_FILE).exists(),
            "a bad file is consumed too"
        );
        assert_eq!(FILE_STOP.load(Ordering::SeqCst), 0, "and arms nothing");
        // Arm far beyond any barrier this test process hits, then disarm.
        std::fs::write(d.path().join(STOP_FILE), "1000000\n").unwrap();
        assert_eq!(arm_from_state_dir(d.path()).unwrap(), Some(1_000_000));
        assert!(!d.path().join(STOP_FILE).exists(), "consumed");
        assert_eq!(FILE_STOP.load(Ordering::SeqCst), 1_000_000);
        assert_eq!(arm_from_state_dir(d.path()).unwrap(), None, "only once");
        FILE_STOP.store(0, Ordering::SeqCst);
    }

    #[test]
    fn counts_every_barrier_even_when_silent() {
        let before = count();
        hit("test:one");
        hit("test:two");
        assert!(count() >= before + 2);
    }
}
