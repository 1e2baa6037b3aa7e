//! [`VirtualClock`]: a download schedule followed in virtual time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A [`libupgrade::Clock`] whose `sleep` advances it at once (a stage that waits hours
/// for a window runs in milliseconds), and which logs every reading together with a probe's
/// value, e.g. a [`crate::TestServer`]'s byte counter: what had been sent at that virtual
/// instant.
#[derive(Debug)]
pub struct VirtualClock {
    now: Mutex<DateTime<Utc>>,
    probe: Arc<AtomicU64>,
    /// (virtual time, probe) at every reading and after every sleep, in order.
    pub log: Mutex<Vec<(DateTime<Utc>, u64)>>,
}

impl VirtualClock {
    pub fn new(start: DateTime<Utc>, probe: Arc<AtomicU64>) -> Arc<VirtualClock> {
        Arc::new(VirtualClock {
            now: Mutex::new(start),
            probe,
            log: Mutex::new(Vec::new()),
        })
    }

    fn record(&self, t: DateTime<Utc>) {
        let p = self.probe.load(Ordering::SeqCst);
        self.log.lock().unwrap().push((t, p));
    }

    /// The log so far.
    pub fn samples(&self) -> Vec<(DateTime<Utc>, u64)> {
        self.log.lock().unwrap().clone()
    }
}

impl libupgrade::Clock for VirtualClock {
    fn now(&self) -> DateTime<Utc> {
        let t = *self.now.lock().unwrap();
        self.record(t);
        t
    }

    fn sleep(&self, d: Duration) {
        let t = {
            let mut now = self.now.lock().unwrap();
            *now += chrono::Duration::from_std(d).unwrap();
            *now
        };
        self.record(t);
    }
}
