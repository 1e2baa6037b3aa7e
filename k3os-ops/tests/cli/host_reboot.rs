//! The reboot of a containerized k3os-ops (the agent's DaemonSet, the SUC Plan) runs the host's
//! `reboot` inside the namespaces of the host's PID 1, entered by k3os-ops itself: the image
//! holds one static binary and no `nsenter`.
//!
//! Measured here with real namespaces (root, `unshare` from util-linux): a process in a mount
//! namespace of its own plays the host's PID 1, with a `reboot` that exists only inside that
//! namespace (on a tmpfs mounted there) and that records where it ran. Running
//! [`Reboot::InHostOf`] against it must run that `reboot`, which this process cannot even see.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k3os_ops::node::Reboot;

/// A process in its own mount namespace, with `bin/reboot` visible only there.
struct FakeHost {
    child: Child,
}

impl FakeHost {
    fn start(dir: &Path) -> FakeHost {
        let bin = dir.join("bin");
        std::fs::create_dir(&bin).unwrap();
        let ready = dir.join("ready");
        // The fake `reboot` copies its mount namespace's tmpfs marker into a file outside the
        // tmpfs (visible to both namespaces), with shell builtins only (PATH names only `bin`).
        let script = format!(
            "mount -t tmpfs fakehost {bin} && \
             printf '#!/bin/sh\\nread ns < {bin}/.ns\\necho \"rebooted in $ns\" > {out}\\n' > {bin}/reboot && \
             chmod +x {bin}/reboot && echo fake-host-ns > {bin}/.ns && touch {ready} && exec sleep 120",
            bin = bin.display(),
            out = dir.join("out").display(),
            ready = ready.display(),
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux; installed by scripts/setup.sh) must run as root");
        let t = Instant::now();
        while !ready.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the fake host's mount namespace did not come up in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        FakeHost { child }
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn reboot_runs_in_the_namespaces_of_the_hosts_pid_1() {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::start(dir.path());
    let bin = dir.path().join("bin");
    // Here, the fake `reboot` does not exist: the tmpfs is mounted only in the host's namespace.
    assert!(
        !bin.join("reboot").exists(),
        "the tmpfs leaked out of its namespace"
    );

    let how = Reboot::InHostOf(host.child.id() as i32);
    // PATH names only the fake's directory: nothing else called `reboot` can be found.
    let st = how
        .command()
        .unwrap()
        .env("PATH", &bin)
        .status()
        .expect("run the reboot command");
    assert!(st.success(), "{how} failed: {st}");
    let out = std::fs::read_to_string(dir.path().join("out")).expect("the fake reboot ran");
    assert_eq!(out.trim(), "rebooted in fake-host-ns");
}

#[test]
fn a_missing_host_process_is_named() {
    let err = Reboot::InHostOf(i32::MAX).command().unwrap_err();
    assert!(
        format!("{err:#}").contains(&format!("/proc/{}/ns/", i32::MAX)),
        "{err:#}"
    );
}

#[test]
fn explicit_command_wins_and_is_shown_whole() {
    let how = Reboot::Command(vec!["/run/site/reboot-hook".into(), "--now".into()]);
    assert_eq!(how.to_string(), "/run/site/reboot-hook --now");
    let c = how.command().unwrap();
    assert_eq!(c.get_program(), "/run/site/reboot-hook");
}
