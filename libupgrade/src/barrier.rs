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
//!   that point.
//!
//! Why not a cargo feature: a separate fault-injection build doubled the static musl builds in
//! CI and made `just demo` print barrier lines. An unset variable costs one `getenv` per
//! barrier (a few dozen per upgrade); setting it needs the same root access as killing the
//! process, so it adds no new way to stop an update.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

static COUNT: AtomicU64 = AtomicU64::new(0);

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
    let m = mode(
        std::env::var("K3OS_OPS_BARRIERS").ok().as_deref(),
        std::env::var("K3OS_OPS_BARRIER_STOP").ok().as_deref(),
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
#[cfg(test)]
fn count() -> u64 {
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
    fn counts_every_barrier_even_when_silent() {
        let before = count();
        hit("test:one");
        hit("test:two");
        assert!(count() >= before + 2);
    }
}
