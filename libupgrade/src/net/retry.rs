//! The one retry policy of every transfer loop (probes, chunk indexes, boot scripts, streamed
//! and chunked artifact downloads): a transient failure — a retryable [`Error::Fetch`] such as
//! a dropped connection or a 5xx — is retried after a delay that starts at the stage's
//! `retry_delay` and doubles up to [`MAX_DELAY`], at most `limit` times in a row; bytes that
//! arrive reset both (a slow but moving download never gives up on a count). A stage attempt
//! also has an overall deadline (`--retry-for`): no retry starts that would wait past it. When
//! a loop gives up, [`Backoff::gave_up`] says after how many attempts and how long.
//!
//! A small module rather than `backon`/`backoff`: the loops need "reset on progress" in the
//! middle of a read loop and keep their own resumable position, which those crates' closure
//! retry shapes do not fit without a second state machine beside theirs; the policy itself is
//! these few lines, and one place to change it (bounded retrieval builds on it).

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The longest wait between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(30);

/// Failures in a row and the next delay.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    delay: Duration,
    failures: u32,
    limit: u32,
    started: Instant,
    deadline: Option<Instant>,
    /// Gave up because the next wait would pass the deadline.
    out_of_time: bool,
}

impl Backoff {
    /// Wait `first` after the first failure, at most `limit` failures in a row.
    pub fn new(first: Duration, limit: u32) -> Backoff {
        Backoff {
            first,
            delay: first,
            failures: 0,
            limit,
            started: Instant::now(),
            deadline: None,
            out_of_time: false,
        }
    }

    /// Start no retry whose wait would end after `deadline` (None: no deadline).
    pub fn until(mut self, deadline: Option<Instant>) -> Backoff {
        self.deadline = deadline;
        self
    }

    /// Why the loop stops, for its final error: `what` went wrong last, after how many
    /// attempts in a row and how long since the loop started.
    pub fn gave_up(&self, what: &str) -> String {
        let secs = self.started.elapsed().as_secs();
        if self.out_of_time {
            format!(
                "{what}; gave up after {} attempts and {secs} s: the next retry would pass the stage's deadline (--retry-for)",
                self.failures
            )
        } else {
            format!(
                "{what}; gave up after {} attempts in a row over {secs} s",
                self.failures
            )
        }
    }

    /// One more failure in a row: the delay to wait before the next attempt, or `None` once
    /// more than `limit` failures happened in a row (give up).
    pub fn failed(&mut self) -> Option<Duration> {
        self.failures += 1;
        if self.failures > self.limit {
            return None;
        }
        let d = self.delay;
        if self.deadline.is_some_and(|end| Instant::now() + d > end) {
            self.out_of_time = true;
            return None;
        }
        self.delay = (self.delay * 2).min(MAX_DELAY);
        Some(d)
    }

    /// Bytes arrived: the next failure is the first in a row again.
    pub fn progressed(&mut self) {
        self.failures = 0;
        self.delay = self.first;
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// After a failed attempt: `Ok(what went wrong)` when it was transient and the wait before
    /// the next attempt is over, else the error to fail with — a permanent one as it is, the
    /// last transient one saying why the loop gave up. `log_location` names it in the warning.
    pub fn attempt_failed(&mut self, log_location: &str, e: Error) -> Result<String> {
        match e {
            Error::Fetch {
                retryable: true,
                location,
                what,
            } => {
                if self.wait(log_location, &what) {
                    Ok(what)
                } else {
                    Err(Error::Fetch {
                        what: self.gave_up(&what),
                        location,
                        retryable: true,
                    })
                }
            }
            e => Err(e),
        }
    }

    /// [`Self::failed`], then log `what` at `location` and sleep; false when giving up.
    pub fn wait(&mut self, location: &str, what: &str) -> bool {
        match self.failed() {
            None => false,
            Some(d) => {
                log::warn!(
                    "{location}: {what}; attempt {}/{} in {d:?}",
                    self.failures,
                    self.limit
                );
                std::thread::sleep(d);
                true
            }
        }
    }
}

/// Run `f` until it succeeds, fails for good, or fails transiently more than the backoff's
/// limit in a row.
pub fn retrying<T>(mut backoff: Backoff, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    loop {
        match f() {
            Err(e) => {
                let loc = match &e {
                    Error::Fetch { location, .. } => location.clone(),
                    _ => String::new(),
                };
                backoff.attempt_failed(&loc, e)?;
            }
            ok => return ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_gives_up_after_the_limit_and_resets_on_progress() {
        let mut b = Backoff::new(Duration::from_secs(4), 5);
        let delays: Vec<_> = std::iter::from_fn(|| b.failed()).collect();
        assert_eq!(
            delays,
            [4, 8, 16, 30, 30].map(Duration::from_secs),
            "five retries, capped at 30 s"
        );
        assert_eq!(b.failed(), None);
        b.progressed();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.failed(), Some(Duration::from_secs(4)));
    }

    #[test]
    fn no_retry_starts_that_would_end_past_the_deadline() {
        let mut b = Backoff::new(Duration::from_secs(4), 100)
            .until(Some(Instant::now() + Duration::from_secs(10)));
        assert_eq!(b.failed(), Some(Duration::from_secs(4)));
        assert_eq!(b.failed(), Some(Duration::from_secs(8)));
        assert_eq!(
            b.failed(),
            None,
            "a 16 s wait would end past the 10 s deadline"
        );
        assert!(b.gave_up("HTTP 500").contains("deadline (--retry-for)"));
    }

    #[test]
    fn retrying_retries_only_transient_fetch_errors() {
        let mut calls = 0;
        let r: Result<()> = retrying(Backoff::new(Duration::ZERO, 2), || {
            calls += 1;
            Err(Error::Fetch {
                location: "x".into(),
                what: "dropped".into(),
                retryable: true,
            })
        });
        let e = r.unwrap_err().to_string();
        assert_eq!(calls, 3, "the first attempt and two retries");
        assert!(
            e.contains("dropped; gave up after 3 attempts in a row"),
            "{e}"
        );
        let mut calls = 0;
        let r: Result<()> = retrying(Backoff::new(Duration::ZERO, 2), || {
            calls += 1;
            Err(Error::Fetch {
                location: "x".into(),
                what: "404".into(),
                retryable: false,
            })
        });
        assert!(r.is_err());
        assert_eq!(calls, 1, "a permanent error fails at once");
    }
}
