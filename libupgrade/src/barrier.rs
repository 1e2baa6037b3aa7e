//! Write barriers, announced for power-cut tests.
//!
//! Every durable step of stage, activate and confirm (after each fsync or rename that changes
//! what survives a power cut) calls [`hit`] with a name. Built with the `fault-injection`
//! feature, each barrier is printed on stderr (the console in the test VMs) as
//! `K3OS-BARRIER <n> <name>`; if `K3OS_OPS_BARRIER_STOP=<k>` is set, the process prints
//! `K3OS-BARRIER-STOP <k> <name>` at barrier k and then stops dead, so a harness can cut power
//! at exactly that point. Without the feature, [`hit`] compiles to nothing.

#[cfg(feature = "fault-injection")]
mod imp {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};

    static COUNT: AtomicU64 = AtomicU64::new(0);

    pub fn hit(name: &str) {
        let n = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
        let stop = std::env::var("K3OS_OPS_BARRIER_STOP")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "K3OS-BARRIER {n} {name}");
        if stop == Some(n) {
            let _ = writeln!(err, "K3OS-BARRIER-STOP {n} {name}");
            let _ = err.flush();
            drop(err);
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }

    /// Barriers announced so far by this process.
    pub fn count() -> u64 {
        COUNT.load(Ordering::SeqCst)
    }
}

#[cfg(not(feature = "fault-injection"))]
mod imp {
    #[inline(always)]
    pub fn hit(_name: &str) {}

    /// Barriers announced so far by this process (always 0 without `fault-injection`).
    pub fn count() -> u64 {
        0
    }
}

pub use imp::{count, hit};
