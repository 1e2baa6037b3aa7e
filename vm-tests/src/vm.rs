//! One running QEMU guest: its serial console (read by a thread into a buffer, mirrored to a
//! log file), line input to the guest's root shell, the HMP monitor ([`Monitor`]: `system_reset`,
//! saving the running guest's state to a file to resume it later), and a power cut (SIGKILL: the guest loses everything not yet written to the virtual disk, exactly
//! like pulling the plug; what QEMU already wrote to the image file stays).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::monitor::Monitor;

#[derive(Default)]
struct Console {
    data: Vec<u8>,
    eof: bool,
}

type Shared = Arc<(Mutex<Console>, Condvar)>;

/// Output of one command run in the guest shell.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    pub rc: i32,
    /// Everything the command printed (stdout and stderr share the console), `\r` removed.
    pub output: String,
}

/// A running guest.
pub struct Vm {
    name: String,
    child: Child,
    stdin: ChildStdin,
    console: Shared,
    /// Byte offset in the console buffer up to which output has been consumed by `expect`.
    cursor: usize,
    monitor: PathBuf,
    log: PathBuf,
    started: Instant,
    cmd_seq: u64,
}

impl Vm {
    /// Start `cmd` (a QEMU command line with `-serial stdio` and `-monitor unix:<monitor>`),
    /// mirroring the console to `log`.
    pub fn spawn(name: &str, mut cmd: Command, monitor: &Path, log: &Path) -> Result<Vm> {
        let _ = std::fs::remove_file(monitor);
        let logf =
            std::fs::File::create(log).map_err(|e| Error::io("create console log", log, e))?;
        let errlog = log.with_extension("qemu-stderr");
        let errf = std::fs::File::create(&errlog)
            .map_err(|e| Error::io("create QEMU stderr log", &errlog, e))?;
        let program = cmd.get_program().to_string_lossy().into_owned();
        let line = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        eprintln!("vm-tests: [{name}] {line}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(errf)
            .spawn()
            .map_err(|e| Error::Spawn {
                program,
                hint: "is QEMU installed?".into(),
                source: e,
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let console: Shared = Arc::new((Mutex::new(Console::default()), Condvar::new()));
        let c2 = console.clone();
        std::thread::spawn(move || {
            let mut logf = logf;
            let mut buf = [0u8; 8192];
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                let (lock, cv) = &*c2;
                let mut con = lock.lock().expect("console lock");
                if n == 0 {
                    con.eof = true;
                    cv.notify_all();
                    return;
                }
                con.data.extend_from_slice(&buf[..n]);
                let _ = logf.write_all(&buf[..n]);
                cv.notify_all();
            }
        });
        Ok(Vm {
            name: name.to_string(),
            child,
            stdin,
            console,
            cursor: 0,
            monitor: monitor.to_path_buf(),
            log: log.to_path_buf(),
            started: Instant::now(),
            cmd_seq: 0,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Time since QEMU was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The last `n` console lines (for error messages).
    pub fn tail(&self, n: usize) -> String {
        let con = self.console.0.lock().expect("console lock");
        tail_of(&con.data, n)
    }

    /// Wait until one of `patterns` appears in unconsumed console output; returns its index and
    /// the whole (completed) line it is on, and consumes output up to the end of that line.
    /// Earliest match wins when several patterns are present.
    pub fn expect_any(&mut self, patterns: &[&str], timeout: Duration) -> Result<(usize, String)> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.console.clone();
        let mut con = lock.lock().expect("console lock");
        loop {
            let hay = &con.data[self.cursor..];
            let mut best: Option<(usize, usize)> = None;
            for (i, p) in patterns.iter().enumerate() {
                if let Some(pos) = find(hay, p.as_bytes()) {
                    if best.is_none_or(|(_, b)| pos < b) {
                        best = Some((i, pos));
                    }
                }
            }
            if let Some((i, pos)) = best {
                let abs = self.cursor + pos;
                let line_start = con.data[..abs]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map(|p| p + 1)
                    .unwrap_or(0);
                if let Some(nl) = con.data[abs..].iter().position(|&b| b == b'\n') {
                    let end = abs + nl + 1;
                    let line = String::from_utf8_lossy(&con.data[line_start.max(self.cursor)..end])
                        .replace('\r', "");
                    self.cursor = end;
                    return Ok((i, line.trim_end().to_string()));
                }
                if con.eof {
                    let line = String::from_utf8_lossy(&con.data[line_start.max(self.cursor)..])
                        .replace('\r', "");
                    self.cursor = con.data.len();
                    return Ok((i, line.trim_end().to_string()));
                }
            }
            let waiting_for = patterns.join("` or `");
            if con.eof {
                drop(con);
                let status = self
                    .child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                return Err(Error::Exited {
                    vm: self.name.clone(),
                    waiting_for,
                    status,
                    log: self.log.clone(),
                    tail: self.tail(25),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let tail = tail_of(&con.data, 25);
                return Err(Error::Timeout {
                    vm: self.name.clone(),
                    waiting_for,
                    secs: timeout.as_secs(),
                    log: self.log.clone(),
                    tail,
                });
            }
            con = cv
                .wait_timeout(con, deadline - now)
                .expect("console lock")
                .0;
        }
    }

    /// Wait for `pattern`; returns the line it is on.
    pub fn expect(&mut self, pattern: &str, timeout: Duration) -> Result<String> {
        Ok(self.expect_any(&[pattern], timeout)?.1)
    }

    /// Wait for `want`; fail at once if one of `bad` shows up first.
    pub fn expect_not(&mut self, want: &str, bad: &[&str], timeout: Duration) -> Result<String> {
        let mut pats = vec![want];
        pats.extend_from_slice(bad);
        let (i, line) = self.expect_any(&pats, timeout)?;
        if i == 0 {
            Ok(line)
        } else {
            Err(Error::Unexpected {
                vm: self.name.clone(),
                expected: want.into(),
                saw: line,
                log: self.log.clone(),
                tail: self.tail(25),
            })
        }
    }

    /// Type one line into the console.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| self.stdin.flush())
            .map_err(|e| {
                Error::io(
                    format!("{}: write to the serial console", self.name),
                    &self.log,
                    e,
                )
            })
    }

    /// Send `cmd` to the guest's root shell framed by markers that only the shell's expansion
    /// produces (the echoed input cannot match), wait for the start marker and return the end
    /// marker (`@@E<n>@@ rc=`).
    fn start_cmd(&mut self, cmd: &str, timeout: Duration) -> Result<String> {
        self.cmd_seq += 1;
        let n = self.cmd_seq;
        self.send_line(&format!(
            "echo @@B$(({n}))@@; {{ {cmd}\n}}; echo \"@@E$(({n}))@@ rc=$?\""
        ))?;
        self.expect(&format!("@@B{n}@@"), timeout)?;
        Ok(format!("@@E{n}@@ rc="))
    }

    /// The exit code on an end-marker line (-1 if unreadable).
    fn rc_of(end_line: &str) -> i32 {
        end_line
            .rsplit("rc=")
            .next()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .unwrap_or(-1)
    }

    fn command_failed(&self, cmd: &str, rc: i32, output: String) -> Error {
        Error::Command {
            vm: self.name.clone(),
            cmd: cmd.into(),
            rc,
            output,
        }
    }

    /// Run `cmd` in the guest's root shell and wait for it.
    pub fn run(&mut self, cmd: &str, timeout: Duration) -> Result<CmdOutput> {
        let end = self.start_cmd(cmd, timeout)?;
        let from = self.cursor;
        let line = self.expect(&end, timeout)?;
        let con = self.console.0.lock().expect("console lock");
        let upto = con.data[..self.cursor]
            .windows(end.len())
            .rposition(|w| w == end.as_bytes())
            .unwrap_or(from);
        let output = String::from_utf8_lossy(&con.data[from..upto.max(from)]).replace('\r', "");
        drop(con);
        Ok(CmdOutput {
            rc: Self::rc_of(&line),
            output,
        })
    }

    /// [`Vm::run_ok`], handing each line of output to `each` as the guest prints it (for a
    /// live view of a long command, e.g. the download progress in `just demo`).
    pub fn run_streamed(
        &mut self,
        cmd: &str,
        timeout: Duration,
        mut each: impl FnMut(&str),
    ) -> Result<()> {
        let end = self.start_cmd(cmd, timeout)?;
        let mut output = String::new();
        loop {
            let (i, line) = self.expect_any(&[&end, "\n"], timeout)?;
            if i == 0 {
                return match Self::rc_of(&line) {
                    0 => Ok(()),
                    rc => Err(self.command_failed(cmd, rc, output)),
                };
            }
            each(&line);
            output.push_str(&line);
            output.push('\n');
        }
    }

    /// Wait until the guest shell answers: the shell on the console may open its tty a moment
    /// after `K3OS-READY`, and input typed before that is lost, so probe with short timeouts.
    pub fn wait_shell(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.run("true", Duration::from_secs(5)) {
                Ok(_) => return Ok(()),
                Err(Error::Timeout { .. }) if Instant::now() < deadline => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Vm::run`] and require exit code 0.
    pub fn run_ok(&mut self, cmd: &str, timeout: Duration) -> Result<String> {
        let out = self.run(cmd, timeout)?;
        if out.rc != 0 {
            return Err(self.command_failed(cmd, out.rc, out.output));
        }
        Ok(out.output)
    }

    /// Hardware reset through the QEMU monitor (what a watchdog does): the guest reboots at once,
    /// nothing is flushed.
    pub fn system_reset(&mut self) -> Result<()> {
        self.monitor("system_reset")?;
        eprintln!(
            "vm-tests: [{}] system_reset (watchdog) at {:.1}s",
            self.name,
            self.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Run one HMP command on the QEMU monitor and return what it printed.
    pub fn monitor(&mut self, cmd: &str) -> Result<String> {
        Monitor::new(&self.monitor).command(cmd)
    }

    /// Wait until the guest runs ([`Monitor::running`]): a resumed guest, before the console
    /// is typed into, since input that arrives while its state loads can be lost (the serial
    /// port's saved state is loaded over what it had received). The monitor socket appears a
    /// moment after QEMU starts.
    pub fn wait_running(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match Monitor::new(&self.monitor).running() {
                Ok(true) => return Ok(()),
                Ok(false) => "the guest is not running yet".to_string(),
                Err(e) => e.to_string(),
            };
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::Exited {
                    vm: self.name.clone(),
                    waiting_for: "the resumed guest to run".into(),
                    status: status.to_string(),
                    log: self.log.clone(),
                    tail: self.tail(25),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Monitor {
                    path: self.monitor.clone(),
                    what: format!(
                        "the guest does not run within {}s: {last}",
                        timeout.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Save the running guest's whole state to `file` ([`Monitor::save_state`]); the guest
    /// stays stopped afterwards (stop or cut this `Vm`).
    pub fn save_state(&mut self, file: &Path, timeout: Duration) -> Result<()> {
        Monitor::new(&self.monitor).save_state(file, timeout)?;
        eprintln!(
            "vm-tests: [{}] state saved to {} at {:.1}s",
            self.name,
            file.display(),
            self.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Cut the power: SIGKILL QEMU and reap it.
    pub fn power_cut(mut self) -> Result<()> {
        self.cut_power()
    }

    /// [`Vm::power_cut`] keeping this `Vm` (its console log stays readable) until the node's
    /// next power-on replaces it.
    pub fn cut_power(&mut self) -> Result<()> {
        eprintln!(
            "vm-tests: [{}] power cut at {:.1}s",
            self.name,
            self.elapsed().as_secs_f64()
        );
        self.kill()
    }

    /// Stop the VM when its story is over (the demo's end): the same as a power cut, without
    /// calling it one, since nothing is being tested by it.
    pub fn stop(mut self) -> Result<()> {
        self.kill()
    }

    fn kill(&mut self) -> Result<()> {
        if let Ok(Some(_)) = self.child.try_wait() {
            return Ok(());
        }
        self.child
            .kill()
            .map_err(|e| Error::io(format!("{}: kill QEMU", self.name), &self.log, e))?;
        self.child
            .wait()
            .map_err(|e| Error::io(format!("{}: reap QEMU", self.name), &self.log, e))?;
        Ok(())
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_file(&self.monitor);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn tail_of(data: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(data).replace('\r', "");
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake "guest": sh reading the harness's lines (no QEMU), to test the console plumbing.
    fn fake() -> Vm {
        let dir = std::env::temp_dir().join(format!(
            "vm-tests-unit-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo K3OS-BOOTED slot=A version=v1; echo K3OS-READY; exec sh 2>&1",
        ]);
        Vm::spawn("fake", c, &dir.join("mon.sock"), &dir.join("console.log")).unwrap()
    }

    #[test]
    fn expect_returns_whole_line_and_consumes() {
        let mut vm = fake();
        let l = vm.expect("K3OS-BOOTED", Duration::from_secs(5)).unwrap();
        assert_eq!(l, "K3OS-BOOTED slot=A version=v1");
        vm.expect("K3OS-READY", Duration::from_secs(5)).unwrap();
        // Consumed: a second wait for BOOTED times out.
        let e = vm
            .expect("K3OS-BOOTED", Duration::from_millis(300))
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }

    #[test]
    fn run_frames_output_and_exit_code() {
        let mut vm = fake();
        vm.expect("K3OS-READY", Duration::from_secs(5)).unwrap();
        let o = vm
            .run("echo hello; echo world >&2; false", Duration::from_secs(5))
            .unwrap();
        assert_eq!(o.rc, 1);
        assert_eq!(o.output.trim(), "hello\nworld");
        let o = vm
            .run_ok("printf '{\"a\": 1}\\n'", Duration::from_secs(5))
            .unwrap();
        assert_eq!(o.trim(), "{\"a\": 1}");
        let e = vm
            .run_ok(
                "exit_code_7() { return 7; }; exit_code_7",
                Duration::from_secs(5),
            )
            .unwrap_err();
        assert!(matches!(e, Error::Command { rc: 7, .. }), "{e}");
    }

    #[test]
    fn expect_not_fails_on_bad_pattern_and_exit_is_reported() {
        let mut vm = fake();
        let e = vm
            .expect_not("K3OS-READY", &["K3OS-BOOTED"], Duration::from_secs(5))
            .unwrap_err();
        assert!(matches!(e, Error::Unexpected { .. }), "{e}");
        vm.send_line("exit 3").unwrap();
        let e = vm
            .expect("never-printed", Duration::from_secs(5))
            .unwrap_err();
        assert!(matches!(e, Error::Exited { .. }), "{e}");
    }
}
