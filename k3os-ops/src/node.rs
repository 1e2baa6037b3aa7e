//! What every node-side subcommand (`upgrade`, `slot …`, `bootloader install`) shares: the
//! node configuration argument, and rebooting the node.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use libupgrade::{Config, Updater};

/// Where the node configuration comes from (shared by `upgrade` and `slot`).
#[derive(Args, Debug, Clone)]
pub struct ConfigArg {
    /// Node configuration file.
    #[arg(long, env = "K3OS_OPS_CONFIG", default_value = libupgrade::DEFAULT_CONFIG, global = true)]
    pub config: PathBuf,
}

impl ConfigArg {
    pub fn updater(&self) -> anyhow::Result<Updater> {
        let cfg = Config::load(&self.config)?;
        Ok(Updater::open(cfg)?)
    }
}

/// Send the node's spooled reports at the end of a command (a node with a `report_url`);
/// never fails the command: what could not go stays spooled and is logged.
pub fn send_reports(u: &Updater) {
    if let Some(out) = u.send_reports() {
        if out.sent > 0 || out.refused > 0 {
            log::info!(
                "reports: {} sent, {} refused, {} still spooled",
                out.sent,
                out.refused,
                out.kept
            );
        }
    }
}

/// Send the node's kept failure bundles after its reports, within `allow` (a node with a
/// `report_url`); never fails the command: what could not go waits and is logged.
pub fn send_bundles(u: &Updater, allow: libupgrade::BundleAllowance) {
    if let Some(out) = u.send_bundles(allow) {
        if out.sent > 0 || out.refused > 0 {
            log::info!(
                "failure bundles: {} sent ({} bytes), {} refused, {} waiting",
                out.sent,
                out.bytes,
                out.refused,
                out.waiting
            );
        }
    }
}

/// When a command may send failure bundles: inside its download schedule's open window
/// (any time without one), within what its byte budget `max_bytes` has left after `fetched`.
pub fn bundle_allowance(
    schedule: Option<&libupgrade::Schedule>,
    max_bytes: Option<u64>,
    fetched: u64,
    now: chrono::DateTime<chrono::Utc>,
) -> libupgrade::BundleAllowance {
    let open = schedule.is_none_or(
        |s| matches!(s.at(now), libupgrade::Allowance::Open { rate, .. } if rate != Some(0)),
    );
    libupgrade::BundleAllowance {
        open,
        max_bytes: max_bytes.map(|m| m.saturating_sub(fetched)),
    }
}

/// Environment variable naming the reboot command (whitespace-separated argv); the agent reads
/// the same one. Unset: [`Reboot::from_env`] picks the host's own `reboot`.
pub const REBOOT_CMD_ENV: &str = "K3OS_OPS_REBOOT_CMD";

/// How this process reboots the node.
///
/// In a container (the agent's DaemonSet, the system-upgrade-controller Plan) the image holds
/// one static binary and no `reboot` or `nsenter`, but it runs with `hostPID` and privileges:
/// [`Reboot::InHostOf`] enters the mount, UTS, IPC and network namespaces of the host's PID 1
/// itself (setns(2) between fork and exec, what `nsenter -t 1 -m -u -i -n` does) and runs the
/// host's `reboot` there through the host's `/bin/sh`, so the host shuts down cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reboot {
    /// An explicit command (`K3OS_OPS_REBOOT_CMD`, or a test's).
    Command(Vec<String>),
    /// `reboot` run in the namespaces of this process (its PID as seen here).
    InHostOf(i32),
    /// `reboot` in this process's own namespaces (not in a container).
    Here,
}

impl Reboot {
    /// `K3OS_OPS_REBOOT_CMD` when set; else the host's PID 1 when this process runs in another
    /// mount namespace than it (a container with hostPID); else here.
    pub fn from_env() -> Reboot {
        if let Some(cmd) = std::env::var(REBOOT_CMD_ENV)
            .ok()
            .filter(|c| !c.trim().is_empty())
        {
            return Reboot::Command(cmd.split_whitespace().map(String::from).collect());
        }
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
        match (ns("1"), ns("self")) {
            (Some(host), Some(me)) if host != me => Reboot::InHostOf(1),
            _ => Reboot::Here,
        }
    }

    /// The command that reboots (not yet run). `InHostOf` opens the target's namespace files
    /// now and enters them in the child; the caller may still set its environment.
    pub fn command(&self) -> anyhow::Result<std::process::Command> {
        match self {
            Reboot::Command(argv) => {
                let (prog, args) = argv.split_first().context("empty reboot command")?;
                let mut c = std::process::Command::new(prog);
                c.args(args);
                Ok(c)
            }
            Reboot::Here => Ok(std::process::Command::new("reboot")),
            Reboot::InHostOf(pid) => in_namespaces_of(*pid, "exec reboot"),
        }
    }
}

impl std::fmt::Display for Reboot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reboot::Command(argv) => write!(f, "{}", argv.join(" ")),
            Reboot::Here => write!(f, "reboot"),
            Reboot::InHostOf(pid) => write!(f, "reboot in the namespaces of PID {pid}"),
        }
    }
}

/// `/bin/sh -c SCRIPT` in the mount, UTS, IPC and network namespaces of `pid`. The namespace
/// files are opened here (a missing PID or a kernel without them fails now, naming the file);
/// the child joins them after fork, the mount namespace last (joining it resets the child's
/// root and working directory to that namespace's, so `/bin/sh` is the target's).
pub fn in_namespaces_of(pid: i32, script: &str) -> anyhow::Result<std::process::Command> {
    use nix::sched::CloneFlags;
    use std::os::unix::process::CommandExt;
    let kinds = [
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("net", CloneFlags::CLONE_NEWNET),
        ("mnt", CloneFlags::CLONE_NEWNS),
    ];
    let mut files = Vec::new();
    for (kind, flag) in kinds {
        let path = format!("/proc/{pid}/ns/{kind}");
        let f = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
        files.push((f, flag));
    }
    let mut c = std::process::Command::new("/bin/sh");
    c.args(["-c", script]);
    // SAFETY: between fork and exec the closure makes only setns(2) calls on descriptors
    // opened before the fork; it allocates nothing.
    unsafe {
        c.pre_exec(move || {
            for (f, flag) in &files {
                nix::sched::setns(f, *flag).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    Ok(c)
}

/// Sync and reboot by [`Reboot::from_env`]: the command must succeed; without an explicit
/// command, when `reboot` cannot be run here, the syscall.
pub fn reboot() -> anyhow::Result<()> {
    nix::unistd::sync();
    let how = Reboot::from_env();
    let status = how.command()?.status();
    match (&how, status) {
        (_, Ok(s)) if s.success() => Ok(()),
        (Reboot::Here, _) => {
            nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT)
                .context("reboot(2)")?;
            Ok(())
        }
        (_, Ok(s)) => anyhow::bail!("{how} failed ({s})"),
        (_, Err(e)) => Err(e).with_context(|| format!("run {how}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use libupgrade::{Schedule, Window};

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn bundles_go_inside_the_open_window_within_the_budget_left() {
        let w = |start: &str, end: &str, rate| Window {
            start: at(start),
            end: at(end),
            rate,
        };
        let s = Schedule::new(vec![
            w("2026-12-07T01:00:00Z", "2026-12-07T02:00:00Z", None),
            w("2026-12-07T02:00:00Z", "2026-12-07T03:00:00Z", Some(0)),
        ])
        .unwrap();
        let open = |now| bundle_allowance(Some(&s), None, 0, at(now)).open;
        assert!(open("2026-12-07T01:30:00Z"));
        assert!(!open("2026-12-07T00:30:00Z"), "before the window");
        assert!(!open("2026-12-07T02:30:00Z"), "a rate-0 window is closed");
        assert!(!open("2026-12-07T04:00:00Z"), "after the schedule");
        let any = bundle_allowance(None, Some(100_000), 30_000, at("2026-12-07T04:00:00Z"));
        assert_eq!(
            any,
            libupgrade::BundleAllowance {
                open: true,
                max_bytes: Some(70_000)
            }
        );
        let spent = bundle_allowance(None, Some(100), 300, at("2026-12-07T04:00:00Z"));
        assert_eq!(spent.max_bytes, Some(0));
    }
}
