//! How `k3os-ops upgrade` shows a download: an indicatif bar on a terminal, or one line per
//! tenth of each artifact where nothing redraws a line (a serial console log, `just demo`,
//! a journal), or nothing.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Instant;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use libupgrade::units::Size;
use libupgrade::Progress;

/// `--progress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, else lines.
    Auto,
    /// An indicatif bar on stderr.
    Bar,
    /// One line on stderr per 10% of each artifact.
    Lines,
    /// Nothing.
    None,
}

/// The reporter for `mode`.
pub fn reporter(mode: ProgressMode) -> Box<dyn Progress> {
    let mode = match mode {
        ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
        ProgressMode::Auto => ProgressMode::Lines,
        m => m,
    };
    match mode {
        ProgressMode::Bar => Box::new(Bar::new()),
        ProgressMode::Lines => Box::new(Lines::default()),
        _ => Box::new(libupgrade::NoProgress),
    }
}

/// A progress bar per artifact, on stderr; its message counts bytes fetched vs reused.
struct Bar {
    bar: ProgressBar,
    what: Mutex<String>,
    /// (fetched, reused) of the current artifact.
    split: Mutex<(u64, u64)>,
}

impl Bar {
    fn new() -> Bar {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Bar {
            bar,
            what: Mutex::new(String::new()),
            split: Mutex::new((0, 0)),
        }
    }

    fn show_split(&self, fetched: u64, reused: u64) {
        let what = self.what.lock().unwrap_or_else(|p| p.into_inner());
        self.bar.set_message(format!(
            "{what} {} new, {} reused",
            Size(fetched),
            Size(reused)
        ));
    }
}

impl Progress for Bar {
    fn begin(&self, what: &str, total: u64, already: u64) {
        self.bar.reset();
        self.bar.set_length(total);
        self.bar.set_position(already);
        self.bar.set_message(what.to_string());
        *self.what.lock().unwrap_or_else(|p| p.into_inner()) = what.to_string();
        *self.split.lock().unwrap_or_else(|p| p.into_inner()) = (0, 0);
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn end(&self) {
        self.bar.finish();
    }
    fn fetched(&self, bytes: u64) {
        let (f, r) = {
            let mut s = self.split.lock().unwrap_or_else(|p| p.into_inner());
            s.0 += bytes;
            *s
        };
        self.show_split(f, r);
    }
    fn reused(&self, bytes: u64) {
        let (f, r) = {
            let mut s = self.split.lock().unwrap_or_else(|p| p.into_inner());
            s.1 += bytes;
            *s
        };
        self.show_split(f, r);
    }
}

#[derive(Default)]
struct LineState {
    what: String,
    total: u64,
    done: u64,
    /// Bytes held from an earlier attempt (not counted in the rate).
    already: u64,
    /// Last tenth printed.
    tenth: u64,
    /// Of `done`, bytes fetched over the network and reused from the node (chunked releases).
    fetched: u64,
    reused: u64,
    started: Option<Instant>,
}

/// One line per tenth.
#[derive(Default)]
struct Lines {
    st: Mutex<LineState>,
}

/// The tenth (0..=10) `done` of `total` has reached.
fn tenth(done: u64, total: u64) -> u64 {
    if total == 0 {
        10
    } else {
        (done.min(total) as u128 * 10 / total as u128) as u64
    }
}

fn line(st: &LineState) -> String {
    let secs = st.started.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    let rate = if secs > 0.0 {
        format!(
            ", {}/s",
            Size(((st.done - st.already.min(st.done)) as f64 / secs) as u64)
        )
    } else {
        String::new()
    };
    let split = if st.fetched + st.reused > 0 {
        format!("; {} fetched, {} reused", Size(st.fetched), Size(st.reused))
    } else {
        String::new()
    };
    format!(
        "{}: {:3}% ({} of {}{rate}{split})",
        st.what,
        st.tenth * 10,
        Size(st.done),
        Size(st.total)
    )
}

impl Progress for Lines {
    fn begin(&self, what: &str, total: u64, already: u64) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        *st = LineState {
            what: what.to_string(),
            total,
            done: already,
            already,
            tenth: tenth(already, total),
            started: Some(Instant::now()),
            fetched: 0,
            reused: 0,
        };
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{}", line(&st));
    }
    fn advance(&self, bytes: u64) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.done += bytes;
        let t = tenth(st.done, st.total);
        if t > st.tenth && t < 10 {
            st.tenth = t;
            let _ = writeln!(std::io::stderr().lock(), "{}", line(&st));
        }
    }
    fn fetched(&self, bytes: u64) {
        self.st.lock().unwrap_or_else(|p| p.into_inner()).fetched += bytes;
    }
    fn reused(&self, bytes: u64) {
        self.st.lock().unwrap_or_else(|p| p.into_inner()).reused += bytes;
    }
    fn end(&self) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        if st.tenth < 10 {
            st.tenth = 10;
            st.done = st.total.max(st.done);
            let _ = writeln!(std::io::stderr().lock(), "{}", line(&st));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenths() {
        assert_eq!(tenth(0, 100), 0);
        assert_eq!(tenth(9, 100), 0);
        assert_eq!(tenth(10, 100), 1);
        assert_eq!(tenth(99, 100), 9);
        assert_eq!(tenth(100, 100), 10);
        assert_eq!(tenth(150, 100), 10);
        assert_eq!(tenth(0, 0), 10);
        assert_eq!(tenth(u64::MAX, u64::MAX), 10);
    }

    #[test]
    fn a_line_reads_like_a_log() {
        let st = LineState {
            what: "rootfs".into(),
            total: 64 << 20,
            done: 32 << 20,
            already: 0,
            tenth: 5,
            started: None,
            fetched: 0,
            reused: 0,
        };
        assert_eq!(line(&st), "rootfs:  50% (32.0 MiB of 64.0 MiB)");
        let st = LineState {
            fetched: 4 << 20,
            reused: 28 << 20,
            ..st
        };
        assert_eq!(
            line(&st),
            "rootfs:  50% (32.0 MiB of 64.0 MiB; 4.0 MiB fetched, 28.0 MiB reused)"
        );
    }
}
