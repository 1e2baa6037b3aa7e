//! A bandwidth cap for downloads (`--max-rate`): remote sites share a thin link with
//! production traffic. A token bucket with one second of burst; every network read of a stage
//! (chunk ranges and whole-file streams) passes through the same limiter.

use std::io::{self, Read};
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

/// A reader whose bytes are taken through an optional [`RateLimit`].
pub struct Limited<'a, R> {
    inner: R,
    limit: Option<&'a RateLimit>,
}

impl<'a, R: Read> Limited<'a, R> {
    pub fn new(inner: R, limit: Option<&'a RateLimit>) -> Self {
        Limited { inner, limit }
    }
}

impl<R: Read> Read for Limited<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(limit) = self.limit else {
            return self.inner.read(buf);
        };
        let want = buf.len().min(STEP);
        let n = self.inner.read(&mut buf[..want])?;
        limit.take(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_the_rate_after_one_second_of_burst() {
        let limit = RateLimit::new(2 << 20);
        let data = vec![0u8; 5 << 20];
        let t = Instant::now();
        let mut r = Limited::new(&data[..], Some(&limit));
        let n = io::copy(&mut r, &mut io::sink()).unwrap();
        assert_eq!(n, 5 << 20);
        // 2 MiB burst, then 3 MiB at 2 MiB/s: 1.5 s.
        let s = t.elapsed().as_secs_f64();
        assert!((1.35..2.5).contains(&s), "{s} s");
    }
}
