//! A real PostgreSQL server for one test: `initdb` and `pg_ctl` of Debian's `postgresql` 15
//! (installed by scripts/setup.sh), run as the `postgres` user (the server refuses root) in a
//! temporary directory on a free port, stopped when dropped. A missing binary or user fails the
//! test saying what to install; it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's postgresql 15 keeps its server binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A running server.
pub struct PgServer {
    dir: tempfile::TempDir,
    port: u16,
}

/// The uid and gid of `user` from /etc/passwd.
fn ids_of(user: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&user))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// Run `bin` of PG_BIN as the postgres user; panics with its output when it fails.
fn as_postgres(bin: &str, args: &[&str]) {
    let exe = Path::new(PG_BIN).join(bin);
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(&exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("runuser (util-linux) for {}: {e}", exe.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}): {}{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PgServer {
    /// Make a cluster and start it; panics naming what is missing.
    pub fn start() -> PgServer {
        for bin in ["initdb", "pg_ctl", "postgres"] {
            let p = Path::new(PG_BIN).join(bin);
            assert!(
                p.exists(),
                "{} is missing: install Debian's postgresql package (scripts/setup.sh does)",
                p.display()
            );
        }
        let (uid, gid) = ids_of("postgres").expect(
            "no `postgres` user: install Debian's postgresql package (scripts/setup.sh does)",
        );
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        let data = dir.path().join("data");
        let d = data.to_str().unwrap();
        as_postgres(
            "initdb",
            &[
                "-D",
                d,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let opts = format!(
            "-p {port} -h 127.0.0.1 -k {} -c fsync=off",
            dir.path().display()
        );
        let log: PathBuf = dir.path().join("server.log");
        as_postgres(
            "pg_ctl",
            &[
                "-D",
                d,
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        PgServer { dir, port }
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join("pg_ctl"))
            .args([
                "-D",
                data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .output();
    }
}
