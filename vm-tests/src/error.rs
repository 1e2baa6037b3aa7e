//! The harness's errors: each names the VM, what was awaited and the console tail, so a failed
//! scenario says what the node did instead.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An input the scenario needs is not there (image, firmware, QEMU binary).
    #[error("cannot run: {what} {} does not exist ({hint})", path.display())]
    Missing {
        what: String,
        path: PathBuf,
        hint: String,
    },
    /// The clone lacks the commit of the previous release (shallow clone).
    #[error("cannot run: this clone lacks the history of the previous release {version} (commit {commit}, named by CHANGELOG.md), which upgrade-from-previous builds from the repository's own history; fetch it with `git fetch --unshallow` (or `git fetch origin {commit}`), then `just images-previous`")]
    NoHistory { version: String, commit: String },
    #[error("cannot start {program}: {source} ({hint})")]
    Spawn {
        program: String,
        hint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{vm}: no `{waiting_for}` on the console within {secs}s; console log {}; last lines:\n{tail}", log.display())]
    Timeout {
        vm: String,
        waiting_for: String,
        secs: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("{vm}: QEMU exited ({status}) while waiting for `{waiting_for}`; console log {}; last lines:\n{tail}", log.display())]
    Exited {
        vm: String,
        waiting_for: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{vm}: expected `{expected}` but the console showed `{saw}`; console log {}; last lines:\n{tail}", log.display())]
    Unexpected {
        vm: String,
        expected: String,
        saw: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{vm}: guest command `{cmd}` exited {rc}, expected 0; its output:\n{output}")]
    Command {
        vm: String,
        cmd: String,
        rc: i32,
        output: String,
    },
    #[error("{vm}: output of `{cmd}` is not the expected JSON ({err}); text:\n{text}")]
    Json {
        vm: String,
        cmd: String,
        err: String,
        text: String,
    },
    /// A command the harness runs on the host (writing a bundle, an ext4 image) failed.
    #[error("host command `{cmd}` failed ({status}); its output:\n{output}")]
    Host {
        cmd: String,
        status: String,
        output: String,
    },
    #[error("QEMU monitor {}: {what}", path.display())]
    Monitor { path: PathBuf, what: String },
    #[error("release server: {0}")]
    Server(String),
    /// A scenario's assertion about the node did not hold.
    #[error("{scenario} on {target}: {what}")]
    Check {
        scenario: String,
        target: String,
        what: String,
    },
    #[error("unknown {what} `{got}` (expected one of: {expected})")]
    Unknown {
        what: String,
        got: String,
        expected: String,
    },
}

impl Error {
    /// What went wrong without the scenario and target a [`Error::Check`] starts with (for an
    /// error that a scenario wraps into its own check, naming them once).
    pub fn detail(&self) -> String {
        match self {
            Error::Check { what, .. } => what.clone(),
            e => e.to_string(),
        }
    }

    pub fn io(what: impl Into<String>, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}

/// The item of `all` whose `name` is `got`, or [`Error::Unknown`] listing every name (the
/// parser behind the scenario and target names of the CLI).
pub fn by_name<T: Copy>(
    what: &str,
    all: &[T],
    name: fn(T) -> &'static str,
    got: &str,
) -> Result<T> {
    all.iter()
        .copied()
        .find(|t| name(*t) == got)
        .ok_or_else(|| Error::Unknown {
            what: what.into(),
            got: got.into(),
            expected: all.iter().map(|t| name(*t)).collect::<Vec<_>>().join(", "),
        })
}
