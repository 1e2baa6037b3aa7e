//! The fleet collector on the host: `k3os-ops collector serve` (the host-built binary with the
//! `fleet` feature, [`fleet_tool`]) on 127.0.0.1 at a port a node's reports are forwarded to
//! (`report_port`, [`crate::target::Network`]), its SQLite database and allow-list in the
//! scenario's directory. Stopping it is the dropped link; starting it again on the same port
//! and database is the link coming back. What it stored is read with the collector crate's own
//! query (`collector::open(..).rows()`, what `release rollout-status --reports` and the
//! dashboard read; `bundles()` for the failure bundles).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use collector::Row;

use crate::error::{Error, Result};

/// How long `collector serve` may take to say it listens (TCG guests keep the host busy).
const START: Duration = Duration::from_secs(60);

/// The host's `k3os-ops` with the collector: `VM_TESTS_FLEET_TOOL` (relative to the workspace
/// root unless absolute), else `debug/k3os-ops` under `CARGO_TARGET_DIR` or `<root>/target`
/// (`cargo build -p k3os-ops`; `just builds` makes it). The musl binary the images use is
/// built without the `fleet` feature and has no collector.
pub fn fleet_tool(root: &Path) -> PathBuf {
    if let Some(t) = std::env::var_os("VM_TESTS_FLEET_TOOL") {
        return root.join(t);
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"));
    target_dir.join("debug/k3os-ops")
}

/// The run needs [`fleet_tool`]: an error naming it and how to build it when it is missing.
pub fn check_fleet_tool(root: &Path) -> Result<()> {
    let tool = fleet_tool(root);
    if tool.is_file() {
        return Ok(());
    }
    Err(Error::Missing {
        what: "host k3os-ops with the collector (fleet feature)".into(),
        path: tool,
        hint: "run cargo build -p k3os-ops (or set VM_TESTS_FLEET_TOOL)".into(),
    })
}

/// A collector's place: binary, port, database, allow-list and logs.
pub struct CollectorSite {
    tool: PathBuf,
    port: u16,
    dir: PathBuf,
    starts: u32,
}

/// A running `collector serve`; killed when dropped.
pub struct Collector {
    child: Child,
    log: PathBuf,
}

impl CollectorSite {
    /// A collector ([`fleet_tool`] under the workspace `root`) on 127.0.0.1:`port`, keeping its
    /// database and logs in `dir`.
    pub fn new(root: &Path, port: u16, dir: &Path) -> Result<CollectorSite> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        check_fleet_tool(root)?;
        Ok(CollectorSite {
            tool: fleet_tool(root),
            port,
            dir: dir.into(),
            starts: 0,
        })
    }

    /// The database URL (`sqlite:PATH`).
    pub fn db(&self) -> String {
        format!("sqlite:{}", self.dir.join("reports.db").display())
    }

    fn allow_path(&self) -> PathBuf {
        self.dir.join("allow.txt")
    }

    /// Enrol `node` for `site` (one `<node id> <site>` line; the collector reads the
    /// allow-list when it starts).
    pub fn enrol(&self, node: &str, site: &str) -> Result<()> {
        let p = self.allow_path();
        std::fs::write(&p, format!("{node} {site}\n")).map_err(|e| Error::io("write", &p, e))
    }

    /// Start `collector serve` and wait until it listens.
    pub fn start(&mut self) -> Result<Collector> {
        self.starts += 1;
        let log = self.dir.join(format!("collector-{}.log", self.starts));
        let out = std::fs::File::create(&log).map_err(|e| Error::io("create", &log, e))?;
        let err = out.try_clone().map_err(|e| Error::io("dup", &log, e))?;
        let child = Command::new(&self.tool)
            .args(["collector", "serve", "--listen"])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--db")
            .arg(self.db())
            .arg("--allow")
            .arg(self.allow_path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Spawn {
                program: self.tool.display().to_string(),
                hint: "cargo build -p k3os-ops".into(),
                source: e,
            })?;
        let mut c = Collector { child, log };
        c.wait_listening()?;
        Ok(c)
    }

    /// Every report stored, by node and number (the collector's own query).
    pub fn rows(&self) -> Result<Vec<Row>> {
        let db = self.db();
        let mut store = collector::open(&db).map_err(|e| Error::Server(e.to_string()))?;
        let mut rows = store.rows().map_err(|e| Error::Server(e.to_string()))?;
        rows.sort_by(|a, b| (&a.node, a.seq).cmp(&(&b.node, b.seq)));
        Ok(rows)
    }

    /// Every failure bundle stored, with its sealed bytes as received.
    pub fn bundles(&self) -> Result<Vec<(collector::BundleRow, Vec<u8>)>> {
        let err = |e: collector::StoreError| Error::Server(e.to_string());
        let mut store = collector::open(&self.db()).map_err(err)?;
        let rows = store.bundles().map_err(err)?;
        let mut out = Vec::new();
        for r in rows {
            let body = store
                .bundle_body(&r.node, &r.version, r.attempt)
                .map_err(err)?
                .unwrap_or_default();
            out.push((r, body));
        }
        Ok(out)
    }
}

impl Collector {
    fn wait_listening(&mut self) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains("collecting reports at") {
                return Ok(());
            }
            let exited = self.child.try_wait().ok().flatten();
            if exited.is_some() || t0.elapsed() > START {
                let why = match exited {
                    Some(s) => format!("exited ({s})"),
                    None => format!("did not listen within {} s", START.as_secs()),
                };
                return Err(Error::Server(format!(
                    "collector serve {why}; its log {}:\n{text}",
                    self.log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What it printed (refused reports are one line each).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stop it at once (SIGKILL: the link drops; what it stored stays in the database).
    pub fn stop(mut self) -> Result<String> {
        self.kill();
        Ok(self.log_text())
    }

    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.kill();
    }
}
