//! A bandwidth cap for downloads (`--max-rate`): remote sites share a thin link with
//! production traffic. A token bucket with one second of burst; every network read of a stage
//! (chunk ranges and whole-file streams) passes through the same limiter.
//!
//! And its floor ([`MinRate`], TUF's slow-retrieval attack): a response that delivers fewer
//! than `bytes_per_sec` over a whole window is cut with a timed-out error, which the transfer
//! loops retry like a dropped connection (resuming where it stopped). A complete stall is cut
//! by the HTTP client's 60 s read timeout; this rule catches the trickle that never stalls.
//!
//! And a byte budget ([`Budget`], `--max-bytes`, the agent's daily quota): the network bytes
//! one stage attempt may read. Every network read counts against it; the transfer loops ask
//! for no more than it has left (range requests end where the budget does) and stop cleanly
//! when it is spent. The per-day accounting stays with the caller, which knows the day.

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Largest read passed through at once, so a capped stream flows smoothly.
const STEP: usize = 64 << 10;

/// Caps the bytes per second taken through it (shared by every reader of one stage).
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_sec: u64,
    /// (when the bucket was last filled, tokens in it then)
    state: Mutex<(Instant, f64)>,
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> RateLimit {
        let rate = bytes_per_sec.max(1);
        RateLimit {
            bytes_per_sec: rate,
            state: Mutex::new((Instant::now(), rate as f64)),
        }
    }

    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// Account for `n` bytes, sleeping until the bucket allows them.
    pub fn take(&self, n: usize) {
        let wait = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let rate = self.bytes_per_sec as f64;
            let now = Instant::now();
            let refill = now.duration_since(st.0).as_secs_f64() * rate;
            let tokens = (st.1 + refill).min(rate) - n as f64;
            *st = (now, tokens);
            if tokens < 0.0 {
                Duration::from_secs_f64(-tokens / rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

/// The network bytes one stage attempt may read (shared by every reader of the attempt).
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// The budget given.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes read against it so far.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Bytes it still allows.
    pub fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used())
    }

    fn spend(&self, n: u64) {
        self.used.fetch_add(n, Ordering::SeqCst);
    }
}

/// What the network reads of a stage attempt go through: an optional [`RateLimit`] and an
/// optional [`Budget`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Throttle<'a> {
    pub rate: Option<&'a RateLimit>,
    pub budget: Option<&'a Budget>,
}

impl Throttle<'_> {
    /// Bytes the budget still allows (unbounded without one).
    pub fn left(&self) -> u64 {
        self.budget.map_or(u64::MAX, Budget::left)
    }
}

/// A reader whose bytes are taken through a [`Throttle`].
pub struct Limited<'a, R> {
    inner: R,
    throttle: Throttle<'a>,
}

impl<'a, R: Read> Limited<'a, R> {
    pub fn new(inner: R, throttle: Throttle<'a>) -> Self {
        Limited { inner, throttle }
    }
}

impl<R: Read> Read for Limited<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = match self.throttle.rate {
            Some(_) => buf.len().min(STEP),
            None => buf.len(),
        };
        let n = self.inner.read(&mut buf[..want])?;
        if let Some(b) = self.throttle.budget {
            b.spend(n as u64);
        }
        if let Some(limit) = self.throttle.rate {
            limit.take(n);
        }
        Ok(n)
    }
}

/// The slowest a response may be over a whole window before it is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinRate {
    pub bytes_per_sec: u64,
    pub window: Duration,
}

impl MinRate {
    /// A few hundred bytes per second over a minute: far below any link worth using, far above
    /// a server holding the node hostage.
    pub const DEFAULT: MinRate = MinRate {
        bytes_per_sec: 256,
        window: Duration::from_secs(60),
    };
}

/// A reader cut when it falls below a [`MinRate`] over a window (no rule: passes through).
pub struct Watched<R> {
    inner: R,
    rule: Option<MinRate>,
    since: Instant,
    got: u64,
}

impl<R: Read> Watched<R> {
    pub fn new(inner: R, rule: Option<MinRate>) -> Self {
        Watched {
            inner,
            rule,
            since: Instant::now(),
            got: 0,
        }
    }
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let Some(rule) = self.rule else {
            return Ok(n);
        };
        self.got += n as u64;
        let elapsed = self.since.elapsed();
        if elapsed >= rule.window {
            let want = rule.bytes_per_sec as f64 * elapsed.as_secs_f64();
            if (self.got as f64) < want {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "timed out: {} bytes in {} s, slower than the minimum rate of {} bytes/s (--min-rate)",
                        self.got,
                        elapsed.as_secs(),
                        rule.bytes_per_sec
                    ),
                ));
            }
            self.since = Instant::now();
            self.got = 0;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields one byte per read, `gap` apart.
    struct Trickle(Duration);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            std::thread::sleep(self.0);
            buf[0] = 0;
            Ok(1)
        }
    }

    #[test]
    fn a_trickle_below_the_minimum_rate_is_cut_once_a_window_passed() {
        let rule = MinRate {
            bytes_per_sec: 100,
            window: Duration::from_millis(300),
        };
        let t = Instant::now();
        let mut r = Watched::new(Trickle(Duration::from_millis(20)), Some(rule));
        let e = io::copy(&mut r, &mut io::sink()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("minimum rate of 100 bytes/s"), "{e}");
        assert!(t.elapsed() >= rule.window && t.elapsed() < rule.window * 3);
        // Fast enough: never cut.
        let data = vec![0u8; 1 << 20];
        let mut r = Watched::new(&data[..], Some(rule));
        assert_eq!(io::copy(&mut r, &mut io::sink()).unwrap(), 1 << 20);
    }

    #[test]
    fn caps_the_rate_after_one_second_of_burst() {
        let limit = RateLimit::new(2 << 20);
        let data = vec![0u8; 5 << 20];
        let t = Instant::now();
        let mut r = Limited::new(
            &data[..],
            Throttle {
                rate: Some(&limit),
                budget: None,
            },
        );
        let n = io::copy(&mut r, &mut io::sink()).unwrap();
        assert_eq!(n, 5 << 20);
        // 2 MiB burst, then 3 MiB at 2 MiB/s: 1.5 s.
        let s = t.elapsed().as_secs_f64();
        assert!((1.35..2.5).contains(&s), "{s} s");
    }
}
