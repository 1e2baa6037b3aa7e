//! A token bucket per node: `burst` reports at once, refilled at `per_sec`.

use std::collections::HashMap;
use std::time::Instant;

use fleet_report::NodeId;

/// Per-node token buckets. Only enrolled nodes reach it (after the allow-list check), so it
/// holds at most one entry per enrolled node.
#[derive(Debug)]
pub struct RateLimiter {
    burst: f64,
    per_sec: f64,
    buckets: HashMap<NodeId, (f64, Instant)>,
}

impl RateLimiter {
    /// Buckets of `burst` tokens refilled at `per_sec` tokens per second.
    pub fn new(burst: u32, per_sec: f64) -> RateLimiter {
        RateLimiter {
            burst: f64::from(burst),
            per_sec,
            buckets: HashMap::new(),
        }
    }

    /// Take one token of `node`'s bucket at `now`; false when it is empty.
    pub fn take(&mut self, node: NodeId, now: Instant) -> bool {
        let (tokens, last) = self.buckets.entry(node).or_insert((self.burst, now));
        let refill = now.saturating_duration_since(*last).as_secs_f64() * self.per_sec;
        *tokens = (*tokens + refill).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_refill_rate_per_node() {
        let mut r = RateLimiter::new(3, 2.0);
        let (a, b) = (NodeId([1; 32]), NodeId([2; 32]));
        let t = Instant::now();
        assert!((0..3).all(|_| r.take(a, t)));
        assert!(!r.take(a, t), "burst used up");
        assert!(r.take(b, t), "another node has its own bucket");
        assert!(
            r.take(a, t + Duration::from_millis(500)),
            "one token after 0.5 s at 2/s"
        );
        assert!(!r.take(a, t + Duration::from_millis(500)));
        assert!(
            (0..3).all(|_| r.take(a, t + Duration::from_secs(100))),
            "capped at the burst"
        );
        assert!(!r.take(a, t + Duration::from_secs(100)));
    }
}
