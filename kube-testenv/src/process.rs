//! The control plane's processes: started with their output in a log file, killed when
//! dropped, and killed by the kernel when the thread that started them ends.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process that is killed (and reaped) when this is dropped.
pub struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl KillOnDrop {
    /// `Some(status)` when the process has exited already.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().ok().flatten()
    }
}

/// A free TCP port on 127.0.0.1 (bound and released: another process may take it first, which
/// the servers' start then reports).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port on 127.0.0.1")
}

/// Start `bin` with `args`, stdout and stderr into `log`. It gets SIGKILL when the thread that
/// started it ends (PR_SET_PDEATHSIG): start the servers from a thread that lives as long as
/// they are needed, so they never outlive the test process (statics are not dropped at exit).
pub fn spawn(bin: &Path, args: &[String], log: &Path) -> KillOnDrop {
    use std::os::unix::process::CommandExt;
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("create log {}: {e}", log.display()));
    let err = out.try_clone().expect("clone log file handle");
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    KillOnDrop(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display())),
    )
}
