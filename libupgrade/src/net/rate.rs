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

//! And a download schedule ([`super::schedule::Schedule`], `--stage-until`, the agent's stage
//! windows): the limiter re-reads its rate from the schedule at every read, on an injectable
//! [`Clock`], so a window opening or closing mid-file changes the rate at once; between
//! windows it fetches nothing and waits; after the last one the attempt stops, resumable.
//! A server pushes a response's bytes ahead of the reader (socket buffers), so under a
//! schedule no request may carry bytes that could not arrive before its window closes:
//! [`Throttle::grant`] caps every request to about one second of the rate and to what the rate
//! delivers before the window ends (and a window without a rate to [`UNRATED_REQUEST`]). A
//! request therefore never straddles a boundary, and crossing one re-fetches nothing: the next
//! request starts where the last one ended. Each window starts with an empty token bucket, so
//! the bytes a window carries are at most its rate times its elapsed time plus the one
//! request in flight.

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::schedule::{Allowance, Schedule};

/// Largest read passed through at once, so a capped stream flows smoothly.
const STEP: usize = 64 << 10;

/// Largest request in a schedule window without a rate: how far such a window's end may be
/// overrun by the request in flight.
pub const UNRATED_REQUEST: u64 = 8 << 20;

/// Where the limiter reads the time and waits (tests inject a virtual one).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time (UTC).
    fn now(&self) -> DateTime<Utc>;
    /// Block the calling thread for `d` (a virtual clock advances instead).
    fn sleep(&self, d: Duration);
}

/// The system's clock and `std::thread::sleep`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

pub use crate::error::Stop;

/// Caps the bytes per second taken through it (shared by every reader of one stage): a fixed
/// cap (`--max-rate`), a [`Schedule`] whose rate it re-reads at every read, or both (the
/// lower rate wins).
#[derive(Debug)]
pub struct RateLimit {
    cap: Option<u64>,
    schedule: Option<Schedule>,
    clock: Arc<dyn Clock>,
    bucket: Mutex<Bucket>,
}

/// The token bucket: when it was last filled, the tokens then, and the window it belongs to.
#[derive(Debug)]
struct Bucket {
    at: DateTime<Utc>,
    tokens: f64,
    window: Option<DateTime<Utc>>,
}

impl RateLimit {
    /// A fixed cap on the system clock, with one second of burst.
    pub fn new(bytes_per_sec: u64) -> RateLimit {
        RateLimit::with(Some(bytes_per_sec.max(1)), None, Arc::new(SystemClock))
    }

    /// A cap and/or a schedule, on `clock`.
    pub fn with(cap: Option<u64>, schedule: Option<Schedule>, clock: Arc<dyn Clock>) -> RateLimit {
        let now = clock.now();
        RateLimit {
            // Without a schedule the bucket starts full (one second of burst, as always);
            // a schedule's windows each start empty (see the module docs).
            bucket: Mutex::new(Bucket {
                at: now,
                tokens: cap.filter(|_| schedule.is_none()).unwrap_or(0) as f64,
                window: None,
            }),
            cap,
            schedule,
            clock,
        }
    }

    /// The fixed cap, if any.
    pub fn bytes_per_sec(&self) -> Option<u64> {
        self.cap
    }

    /// The rate in force at `now` and the window it belongs to (`None`: no limit now).
    fn rate_at(&self, now: DateTime<Utc>) -> (Option<u64>, Option<DateTime<Utc>>) {
        match self.schedule.as_ref().map(|s| s.at(now)) {
            None => (self.cap, None),
            Some(Allowance::Open { rate, since, .. }) => (min_rate(self.cap, rate), Some(since)),
            // Bytes of a request that overran an unrated window's end: not paced.
            Some(_) => (None, None),
        }
    }

    /// The bucket refilled to `now` at `rate` (emptied when a new window began).
    fn refill(b: &mut Bucket, now: DateTime<Utc>, rate: u64, window: Option<DateTime<Utc>>) {
        if window != b.window {
            *b = Bucket {
                at: now,
                tokens: 0.0,
                window,
            };
        }
        let secs = (now - b.at).as_seconds_f64().max(0.0);
        b.tokens = (b.tokens + secs * rate as f64).min(rate as f64);
        b.at = now;
    }

    /// Account for `n` bytes, waiting until the bucket allows them.
    pub fn take(&self, n: usize) {
        let now = self.clock.now();
        let (Some(rate), window) = self.rate_at(now) else {
            return;
        };
        let wait = {
            let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            Self::refill(&mut b, now, rate.max(1), window);
            b.tokens -= n as f64;
            (b.tokens < 0.0).then(|| Duration::from_secs_f64(-b.tokens / rate.max(1) as f64))
        };
        if let Some(wait) = wait {
            self.clock.sleep(wait);
        }
    }

    /// How many bytes a request opened now may ask for, at least `unit` (a chunk; 1 for a
    /// stream): waits on the clock while no window is open or the open one cannot deliver
    /// `unit` before it closes; [`Stop::Schedule`] when no window remains. Without a schedule:
    /// unbounded.
    pub fn grant(&self, unit: u64) -> Result<u64, Stop> {
        let Some(schedule) = &self.schedule else {
            return Ok(u64::MAX);
        };
        loop {
            let now = self.clock.now();
            let until = match schedule.at(now) {
                Allowance::Over { closed } => return Err(Stop::Schedule { closed }),
                Allowance::Wait { until } => until,
                Allowance::Open { rate, until, since } => {
                    let Some(rate) = min_rate(self.cap, rate) else {
                        return Ok(UNRATED_REQUEST.max(unit));
                    };
                    let tokens = {
                        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
                        Self::refill(&mut b, now, rate.max(1), Some(since));
                        b.tokens
                    };
                    let fits = tokens + (until - now).as_seconds_f64() * rate as f64;
                    let n = fits.min(rate.max(unit) as f64).max(0.0) as u64;
                    if n >= unit {
                        return Ok(n);
                    }
                    until
                }
            };
            let wait = (until - now).to_std().unwrap_or_default();
            log::info!(
                "download schedule: nothing may be fetched now; waiting {}s until {}",
                wait.as_secs(),
                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            self.clock.sleep(wait.max(Duration::from_millis(1)));
        }
    }
}

/// The lower of two optional rates (`None`: no limit).
fn min_rate(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The network bytes one stage attempt may read (shared by every reader of the attempt).
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    /// A budget of `limit` network bytes, none used yet.
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
    /// The shared rate limit and schedule (None: unlimited).
    pub rate: Option<&'a RateLimit>,
    /// The attempt's byte budget (None: unbounded).
    pub budget: Option<&'a Budget>,
}

impl Throttle<'_> {
    /// Bytes the budget still allows (unbounded without one).
    pub fn left(&self) -> u64 {
        self.budget.map_or(u64::MAX, Budget::left)
    }

    /// How many bytes the next request may ask for, at least `unit`: what the budget has
    /// left and the schedule allows now ([`RateLimit::grant`], which may wait for a window).
    /// The reason to stop when either cannot pay for `unit`.
    pub fn grant(&self, unit: u64) -> Result<u64, Stop> {
        let left = self.left();
        if left < unit.max(1) {
            let budget = self.budget.expect("only a budget runs out").limit();
            return Err(Stop::Budget { budget });
        }
        let n = self.rate.map_or(Ok(u64::MAX), |r| r.grant(unit))?;
        Ok(n.min(left))
    }
}

/// A reader whose bytes are taken through a [`Throttle`].
pub struct Limited<'a, R> {
    inner: R,
    throttle: Throttle<'a>,
}

impl<'a, R: Read> Limited<'a, R> {
    /// Read `inner` through `throttle`.
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
    /// The slowest average allowed, in bytes per second.
    pub bytes_per_sec: u64,
    /// How long the average is taken over.
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

/// A reader cut when it falls below a [`MinRate`] over a window (no rule: passes through), or
/// when the attempt's deadline has passed ([`Watched::until`]). Every response body a stage
/// reads goes through one — manifest, signature, chunk indexes, boot scripts, artifacts — so a
/// server that trickles any of them cannot hold the node past its `--retry-for`.
pub struct Watched<R> {
    inner: R,
    rule: Option<MinRate>,
    deadline: Option<Instant>,
    since: Instant,
    got: u64,
}

impl<R: Read> Watched<R> {
    /// `inner` under the minimum-rate `rule` (None: no floor).
    pub fn new(inner: R, rule: Option<MinRate>) -> Self {
        Watched {
            inner,
            rule,
            deadline: None,
            since: Instant::now(),
            got: 0,
        }
    }

    /// Also cut the read once `deadline` has passed (None: no deadline).
    pub fn until(self, deadline: Option<Instant>) -> Self {
        Watched { deadline, ..self }
    }
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "timed out: the attempt's time to retry (--retry-for) ran out while reading",
            ));
        }
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
    fn a_read_past_the_deadline_is_cut_as_a_timeout() {
        let deadline = Instant::now() + Duration::from_millis(200);
        let t = Instant::now();
        let mut r = Watched::new(Trickle(Duration::from_millis(20)), None).until(Some(deadline));
        let e = io::copy(&mut r, &mut io::sink()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("--retry-for"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
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

    /// Virtual time: `sleep` advances it at once.
    #[derive(Debug)]
    struct Virtual(Mutex<DateTime<Utc>>);

    impl Clock for Virtual {
        fn now(&self) -> DateTime<Utc> {
            *self.0.lock().unwrap()
        }
        fn sleep(&self, d: Duration) {
            *self.0.lock().unwrap() += chrono::Duration::from_std(d).unwrap();
        }
    }

    #[test]
    fn a_schedule_grants_a_second_of_rate_up_to_the_window_end_and_waits_between_windows() {
        use super::super::schedule::Window;
        use chrono::TimeZone;
        let t = |s: i64| Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap();
        let clock = Arc::new(Virtual(Mutex::new(t(0))));
        let windows = vec![
            Window {
                start: t(10),
                end: t(13),
                rate: Some(1000),
            },
            Window {
                start: t(20),
                end: t(30),
                rate: None,
            },
        ];
        let s = Schedule::new(windows).unwrap();
        // A cap lower than the window's rate wins.
        let l = RateLimit::with(Some(800), Some(s), clock.clone());
        // Before the first window: waits for it, then about a second of the rate.
        assert_eq!(l.grant(100), Ok(800));
        assert_eq!(clock.now(), t(10));
        // Reading paces at the rate on the clock; the window carries 2400 bytes in all.
        let data = vec![0u8; 2000];
        let throttle = Throttle {
            rate: Some(&l),
            budget: None,
        };
        io::copy(&mut Limited::new(&data[..], throttle), &mut io::sink()).unwrap();
        assert_eq!(clock.now(), t(12) + chrono::Duration::milliseconds(500));
        // 400 bytes still arrive before the end: a unit of 300 fits, one of 500 waits for
        // the next window, which has no rate of its own (the cap still applies).
        assert_eq!(l.grant(300), Ok(400));
        assert_eq!(l.grant(500), Ok(800));
        assert_eq!(clock.now(), t(20));
        // Without a cap, a window without a rate gets bounded requests.
        let free = RateLimit::with(None, l.schedule.clone(), clock.clone());
        assert_eq!(free.grant(500), Ok(UNRATED_REQUEST));
        clock.sleep(Duration::from_secs(10));
        assert_eq!(l.grant(1), Err(Stop::Schedule { closed: t(30) }));
    }
}
