//! Errors of the image builder. Each names the file or command and what was expected vs found.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{cmd}`: {source} (is the package providing it installed? see /work/shared/notes/environment.md)")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed with {status}: {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{path}: {what}")]
    Input { path: PathBuf, what: String },
    #[error("disk layout: {0}")]
    Layout(String),
    #[error("GPT on {path}: {source}")]
    Gpt {
        path: PathBuf,
        #[source]
        source: gpt::GptError,
    },
    #[error("bootloader files in {path}: {source}")]
    Boot {
        path: PathBuf,
        #[source]
        source: bootconfig::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attach the operation and path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            op,
            path: path.into(),
            source,
        })
    }
}
