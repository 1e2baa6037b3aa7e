//! Running the external tools the images are made with (mksquashfs, mkfs.ext4, mtools,
//! grub-mkimage, extlinux, ...), with the full command line in every error.

use std::ffi::OsStr;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// A command line being built; `run` executes it and fails with its stderr on a non-zero exit.
pub struct Cmd {
    cmd: Command,
    shown: String,
    stdin: Option<Vec<u8>>,
}

impl Cmd {
    pub fn new(program: impl AsRef<OsStr>) -> Cmd {
        let p = program.as_ref();
        Cmd {
            cmd: Command::new(p),
            shown: p.to_string_lossy().into_owned(),
            stdin: None,
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Cmd {
        let a = a.as_ref();
        self.shown.push(' ');
        self.shown.push_str(&a.to_string_lossy());
        self.cmd.arg(a);
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Cmd {
        self.cmd.env(k, v);
        self
    }

    pub fn stdin(mut self, bytes: Vec<u8>) -> Cmd {
        self.stdin = Some(bytes);
        self
    }

    /// Run to completion; returns stdout.
    pub fn run(mut self) -> Result<Vec<u8>> {
        self.cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        self.cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = self.cmd.spawn().map_err(|source| Error::Spawn {
            cmd: self.shown.clone(),
            source,
        })?;
        // Feed stdin from a thread while stdout is drained, or a filter (gzip) whose output
        // pipe fills up would block forever waiting for us to read.
        let feeder = self.stdin.take().map(|bytes| {
            let mut si = child.stdin.take().expect("stdin was piped");
            // A tool that exits early closes its stdin; the exit status reports why.
            std::thread::spawn(move || {
                let _ = si.write_all(&bytes);
            })
        });
        let out = child.wait_with_output().map_err(|source| Error::Spawn {
            cmd: self.shown.clone(),
            source,
        })?;
        if let Some(f) = feeder {
            let _ = f.join();
        }
        if !out.status.success() {
            let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if stderr.is_empty() {
                stderr = String::from_utf8_lossy(&out.stdout).trim().to_string();
            }
            return Err(Error::Command {
                cmd: self.shown,
                status: out.status.to_string(),
                stderr,
            });
        }
        Ok(out.stdout)
    }

    /// Run and return stdout as trimmed UTF-8.
    pub fn output(self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.run()?).trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_stdin_through_a_filter_does_not_deadlock() {
        let data: Vec<u8> = (0..4_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let out = Cmd::new("cat").stdin(data.clone()).run().unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn failure_names_command_and_stderr() {
        let e = Cmd::new("sh")
            .args(["-c", "echo nope >&2; exit 3"])
            .run()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sh -c") && e.contains("nope") && e.contains("3"),
            "{e}"
        );
        let e = Cmd::new("/nonexistent/tool").run().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/tool"), "{e}");
    }
}
