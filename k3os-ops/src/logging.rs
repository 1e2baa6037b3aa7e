//! Warnings of the library on stderr for the one-shot commands (`upgrade`, `slot`, …): each
//! retry says why (`warning: URL: HTTP 503; attempt 2/20 in 2s`), also with `--quiet`, which
//! only silences the progress display. The retry loops wait at least their backoff between
//! two warnings, so the lines are rate-limited by construction. `K3OS_OPS_LOG=info` (or
//! `debug`) shows more. The agent logs through `tracing` instead (agent::run).

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr(LevelFilter);

impl Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= self.0
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let tag = match r.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug | Level::Trace => "debug",
        };
        eprintln!("{tag}: {}", r.args());
    }

    fn flush(&self) {}
}

/// Install the stderr logger (warnings and errors; more with `K3OS_OPS_LOG`).
pub fn init() {
    let level = match std::env::var("K3OS_OPS_LOG").as_deref() {
        Ok("debug") | Ok("trace") => LevelFilter::Debug,
        Ok("info") => LevelFilter::Info,
        Ok("error") => LevelFilter::Error,
        Ok("off") => LevelFilter::Off,
        _ => LevelFilter::Warn,
    };
    let logger: &'static Stderr = Box::leak(Box::new(Stderr(level)));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}
