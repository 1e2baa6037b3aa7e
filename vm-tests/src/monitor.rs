//! A QEMU guest's HMP monitor (`-monitor unix:<path>,server=on,wait=off`): one command per
//! connection, its output read up to the next prompt; and what the harness does through it
//! besides a reset: saving the running guest's whole state to a file (a migration to
//! `exec:cat`) that a QEMU started with `-incoming` resumes.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The HMP monitor's prompt.
const PROMPT: &str = "(qemu) ";

/// How long the monitor may take to print its banner or answer a command.
const ANSWER: Duration = Duration::from_secs(5);

/// The monitor socket of one QEMU process.
pub struct Monitor {
    path: PathBuf,
}

impl Monitor {
    pub fn new(path: &Path) -> Monitor {
        Monitor {
            path: path.to_path_buf(),
        }
    }

    fn fail(&self, what: String) -> Error {
        Error::Monitor {
            path: self.path.clone(),
            what,
        }
    }

    /// Run one HMP command and return what it printed after the echoed command (`\r`
    /// removed). Returns once the next prompt shows the command was taken.
    pub fn command(&self, cmd: &str) -> Result<String> {
        let mut s =
            UnixStream::connect(&self.path).map_err(|e| self.fail(format!("connect: {e}")))?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok();
        // The banner ends with the first prompt; then come the echo of the command (QEMU's
        // readline redraws the line at each character), its output, and the next prompt.
        read_to_prompt(&mut s).map_err(|got| {
            self.fail(format!(
                "no prompt from the monitor: {:?}",
                String::from_utf8_lossy(&got)
            ))
        })?;
        s.write_all(format!("{cmd}\n").as_bytes())
            .map_err(|e| self.fail(format!("send `{cmd}`: {e}")))?;
        let got = read_to_prompt(&mut s).map_err(|got| {
            self.fail(format!(
                "`{cmd}` not acknowledged: {:?}",
                String::from_utf8_lossy(&got)
            ))
        })?;
        Ok(answer(&got))
    }

    /// Save the running guest's whole state (vCPUs, RAM, devices) to `file` with a QEMU
    /// migration to `exec:cat`. The migration is live: QEMU stops the guest for the last
    /// pages, so `file` is the guest at one instant, and the guest stays stopped
    /// (`postmigrate`) afterwards with its disk images flushed as they were at that instant
    /// (they are not in `file`: keep them with it). A QEMU started with `-incoming 'exec:cat
    /// FILE'` and otherwise the same devices resumes the guest from there. Returns once `file`
    /// is complete: `cat` writes `FILE.part`, renamed when it has written all of it.
    pub fn save_state(&self, file: &Path, timeout: Duration) -> Result<()> {
        let mut part = file.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let (Some(quoted), Some(part_quoted)) = (sh_quote(file), sh_quote(&part)) else {
            return Err(self.fail(format!(
                "cannot name {} in a migration URI (a quote in the path)",
                file.display()
            )));
        };
        let _ = std::fs::remove_file(file);
        // QEMU 7's default cap is 32 MiB/s: seconds lost for nothing on a local file.
        self.command("migrate_set_parameter max-bandwidth 4G")?;
        let out = self.command(&format!(
            "migrate -d \"exec:cat > {part_quoted} && mv {part_quoted} {quoted}\""
        ))?;
        if !out.trim().is_empty() {
            return Err(self.fail(format!("migrate refused: {}", out.trim())));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let info = self.command("info migrate")?;
            let status = migration_status(&info);
            if status == "completed" && file.exists() {
                return Ok(());
            }
            if status.starts_with("failed") || status.starts_with("cancelled") {
                return Err(self.fail(format!("saving the state to {}: {info}", file.display())));
            }
            if Instant::now() >= deadline {
                return Err(self.fail(format!(
                    "saving the state to {} did not complete within {}s: {info}",
                    file.display(),
                    timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the guest runs (`info status`; a QEMU started with `-incoming` runs it once
    /// the whole state is loaded).
    pub fn running(&self) -> Result<bool> {
        Ok(vm_status(&self.command("info status")?) == "running")
    }
}

/// The `VM status:` of `info status` (`running`, `paused (inmigrate)`, …; empty when none).
fn vm_status(info: &str) -> &str {
    info.lines()
        .find_map(|l| l.strip_prefix("VM status:"))
        .map(str::trim)
        .unwrap_or_default()
}

/// Read until what was read ends with the prompt ([`ANSWER`] at most); on a timeout or EOF,
/// the bytes seen so far as the error.
fn read_to_prompt(s: &mut UnixStream) -> std::result::Result<Vec<u8>, Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while start.elapsed() < ANSWER {
        match s.read(&mut buf) {
            Ok(0) => return Err(got),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.ends_with(PROMPT.as_bytes()) {
                    return Ok(got);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Err(got),
        }
    }
    Err(got)
}

/// A command's output: what follows the echoed command line, up to the prompt, `\r` removed.
fn answer(got: &[u8]) -> String {
    let text = String::from_utf8_lossy(got).replace('\r', "");
    let out = text.strip_suffix(PROMPT).unwrap_or(&text);
    out.split_once('\n')
        .map_or("", |(_, rest)| rest)
        .to_string()
}

/// The `Migration status:` of `info migrate` (empty when there is none).
fn migration_status(info: &str) -> &str {
    info.lines()
        .find_map(|l| l.strip_prefix("Migration status:"))
        .map(str::trim)
        .unwrap_or_default()
}

/// `path` in single quotes for `/bin/sh` (QEMU runs `exec:` migration URIs through it), or
/// `None` when it holds a quote (single or double: the HMP string around it uses the latter)
/// or is not UTF-8.
pub fn sh_quote(path: &Path) -> Option<String> {
    let p = path.to_str()?;
    (!p.contains(['\'', '"'])).then(|| format!("'{p}'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A monitor socket that prints the banner, reads one command line, answers with QEMU's
    /// echo (the readline redraw) and `output`, and returns the command it read.
    fn fake_monitor(output: &'static str) -> (Monitor, std::thread::JoinHandle<String>) {
        let dir = std::env::temp_dir().join(format!(
            "vm-tests-monitor-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mon.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            c.write_all(b"QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) ")
                .unwrap();
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while c.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
                line.push(b[0]);
            }
            c.write_all(b"i\x1b[K\x1b[Din\x1b[K\x1b[D\x1b[Dinfo migrate\x1b[K\r\n")
                .unwrap();
            c.write_all(output.as_bytes()).unwrap();
            c.write_all(PROMPT.as_bytes()).unwrap();
            String::from_utf8(line).unwrap()
        });
        (Monitor::new(&path), server)
    }

    #[test]
    fn a_command_returns_what_follows_its_echo() {
        let (m, server) =
            fake_monitor("globals:\r\nMigration status: completed\r\ntotal time: 254 ms\r\n");
        let out = m.command("info migrate").unwrap();
        assert_eq!(server.join().unwrap(), "info migrate");
        assert_eq!(
            out,
            "globals:\nMigration status: completed\ntotal time: 254 ms\n"
        );
        assert_eq!(migration_status(&out), "completed");
        assert_eq!(
            migration_status("Migration status: failed (x)\n"),
            "failed (x)"
        );
        assert_eq!(migration_status("globals:\n"), "");
        assert_eq!(
            vm_status("VM status: paused (inmigrate)\n"),
            "paused (inmigrate)"
        );
        assert_eq!(vm_status("VM status: running\n"), "running");
    }

    #[test]
    fn a_command_without_output_answers_empty() {
        let (m, server) = fake_monitor("");
        assert_eq!(m.command("system_reset").unwrap(), "");
        assert_eq!(server.join().unwrap(), "system_reset");
    }

    #[test]
    fn no_monitor_is_an_error_naming_the_socket() {
        let e = Monitor::new(Path::new("/nonexistent/mon.sock"))
            .command("info status")
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/mon.sock"), "{e}");
    }

    #[test]
    fn paths_are_quoted_for_the_shell_or_refused() {
        assert_eq!(
            sh_quote(Path::new("/w/out/v1 snapshot/state.bin")).as_deref(),
            Some("'/w/out/v1 snapshot/state.bin'")
        );
        assert_eq!(sh_quote(Path::new("/w/it's")), None);
        assert_eq!(sh_quote(Path::new("/w/\"x\"")), None);
    }
}
