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
    #[error(
        "cannot run `{cmd}`: {source} (is the package providing it installed? \
         scripts/setup.sh installs every tool the image builder runs)"
    )]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing tool points the user at the project's setup script, not at a file on some
    /// development machine.
    #[test]
    fn a_missing_tool_names_the_setup_script() {
        let e = Error::Spawn {
            cmd: "mksquashfs".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let text = e.to_string();
        assert!(text.contains("`mksquashfs`"), "{text}");
        assert!(text.contains("scripts/setup.sh"), "{text}");
        assert!(!text.contains("/work/"), "{text}");
    }
}
