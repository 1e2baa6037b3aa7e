//! `collector serve`: receive, verify and store the fleet's reports (the `collector` crate
//! does the work; this only reads the arguments); `collector guard`: one run of the automatic
//! halt (`release::guard`); `collector delete-bundles`: free a node's bundle quota, printing
//! what it removed. Prints `collecting reports at
//! http://ADDR/v1/reports into DB` on stdout once listening (tests read the port from it when
//! given port 0) and one line per refused report on stderr.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct CollectorArgs {
    #[command(subcommand)]
    cmd: CollectorCmd,
}

#[derive(Subcommand, Debug)]
enum CollectorCmd {
    /// Serve `POST /v1/reports` and `POST /v1/bundles` (failure bundles) until stopped.
    Serve(ServeArgs),
    /// One run of the automatic halt (from cron): judge each release of --channel by the
    /// abort criteria over the reports in --db, sign a halt of each that meets them with the
    /// guard's stop-only key (`release delegate-halt`), record it; re-sign halt.json either way.
    Guard(crate::release::GuardArgs),
    /// Remove stored failure bundles of one node, all of them or those --version and --before
    /// select, in one transaction (all or nothing), printing each one removed: this frees the
    /// node's bundle quota (a node past it is refused with 507 until then).
    DeleteBundles(DeleteBundlesArgs),
}

#[derive(Args, Debug)]
struct DeleteBundlesArgs {
    /// The collector's database (`sqlite:PATH` or a `postgres://` URL).
    #[arg(long)]
    db: String,
    /// The node whose bundles are removed: its id, as `slot status` and the 507 show it.
    #[arg(long, value_parser = parse_node)]
    node: fleet_report::NodeId,
    /// Only the bundles of this release version.
    #[arg(long)]
    version: Option<String>,
    /// Only the bundles the collector received before this time (RFC 3339, the collector's
    /// clock).
    #[arg(long, value_parser = crate::upgrade::parse_time)]
    before: Option<DateTime<Utc>>,
}

fn parse_node(s: &str) -> Result<fleet_report::NodeId, String> {
    fleet_report::NodeId::parse(s).ok_or_else(|| {
        format!(
            "{:?} is not a node id (64 hex digits, as `slot status` shows it)",
            s.escape_debug().to_string()
        )
    })
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// The database: `sqlite:PATH` (created when missing) or a `postgres://` URL.
    #[arg(long)]
    db: String,
    /// The enrolled nodes: lines of `<node id> <site>` (`slot status` shows a node's id).
    #[arg(long)]
    allow: PathBuf,
    /// Most reports stored per node.
    #[arg(long, default_value_t = collector::Limits::default().rows_per_node)]
    rows_per_node: u64,
    /// Reports a node may send at once.
    #[arg(long, default_value_t = collector::Limits::default().burst)]
    burst: u32,
    /// Reports per second a node's allowance refills by (a failure bundle takes from the
    /// same allowance).
    #[arg(long, default_value_t = collector::Limits::default().per_sec)]
    per_sec: f64,
    /// Most failure bundles stored per node.
    #[arg(long, default_value_t = collector::Limits::default().bundles.count)]
    bundles_per_node: u64,
    /// Most failure-bundle bytes (sealed, summed) stored per node.
    #[arg(long, default_value_t = collector::Limits::default().bundles.bytes)]
    bundle_bytes_per_node: u64,
    /// Also serve the read-only dashboard (`GET /`) on this address: keep it inside the
    /// publisher's network, the report address faces the sites.
    #[arg(long)]
    dashboard: Option<SocketAddr>,
    /// The channel directory whose rollouts the dashboard shows (waves, the planned line,
    /// a pause and how to lift it).
    #[arg(long)]
    channel: Option<PathBuf>,
}

pub fn run(args: CollectorArgs) -> anyhow::Result<()> {
    match args.cmd {
        CollectorCmd::Serve(a) => serve(a),
        CollectorCmd::Guard(a) => crate::release::guard(a),
        CollectorCmd::DeleteBundles(a) => delete_bundles(a),
    }
}

fn delete_bundles(a: DeleteBundlesArgs) -> anyhow::Result<()> {
    let sel = collector::BundleSelection {
        node: a.node,
        version: a.version,
        received_before: a.before.map(|t| u64::try_from(t.timestamp()).unwrap_or(0)),
    };
    let mut store = collector::open(&a.db)?;
    let removed = store.delete_bundles(&sel)?;
    let kept = store.bundle_known(&sel.node, b"")?;
    if removed.is_empty() && kept.count == 0 && store.known(&sel.node, 0)?.rows == 0 {
        anyhow::bail!(
            "node {} has no reports and no bundles in {}: nothing removed (is the node id \
             right? `slot status` shows it)",
            sel.node,
            store.name()
        );
    }
    let mut out = std::io::stdout().lock();
    for line in removed_lines(&sel.node, &removed, &kept, store.name()) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// What `delete-bundles` prints: one line per bundle removed, then the node's total and what
/// it keeps; the node's text (version, why) escaped.
fn removed_lines(
    node: &fleet_report::NodeId,
    removed: &[collector::BundleRow],
    kept: &collector::BundleKnown,
    db: &str,
) -> Vec<String> {
    let mut out: Vec<String> = removed
        .iter()
        .map(|b| {
            let received = i64::try_from(b.received)
                .ok()
                .and_then(|s| DateTime::from_timestamp(s, 0))
                .map_or(b.received.to_string(), |t| {
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                });
            format!(
                "removed: {} attempt {} ({}, {} bytes, received {received}): {}",
                b.version.escape_debug(),
                b.attempt,
                serde_json::to_value(b.failure)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                b.size,
                b.why.escape_debug()
            )
        })
        .collect();
    out.push(format!(
        "node {node}: removed {} bundle(s), {} bytes, from {db}; {} kept ({} bytes)",
        removed.len(),
        removed.iter().map(|b| b.size).sum::<u64>(),
        kept.count,
        kept.bytes
    ));
    out
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.allow)
        .with_context(|| format!("reading the allow-list {}", a.allow.display()))?;
    let allow = fleet_report::AllowList::parse(&text)
        .with_context(|| format!("allow-list {}", a.allow.display()))?;
    let store = collector::open(&a.db)?;
    let db = store.name().to_string();
    let limits = collector::Limits {
        rows_per_node: a.rows_per_node,
        burst: a.burst,
        per_sec: a.per_sec,
        bundles: collector::BundleQuota {
            count: a.bundles_per_node,
            bytes: a.bundle_bytes_per_node,
        },
    };
    let app = Arc::new(collector::server::App::new(allow, store, limits));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let schedule = crate::release::schedule_source(a.channel.clone());
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        let addr = listener.local_addr()?;
        let dash = match a.dashboard {
            Some(d) => Some(
                tokio::net::TcpListener::bind(d)
                    .await
                    .with_context(|| format!("listening on {d} (--dashboard)"))?,
            ),
            None => None,
        };
        {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "collecting reports at http://{addr}{} into {db}",
                collector::server::REPORTS_PATH
            )?;
            if let Some(d) = &dash {
                writeln!(out, "dashboard at http://{}/", d.local_addr()?)?;
            }
            out.flush()?;
        }
        let reports = collector::server::serve(listener, app.clone());
        match dash {
            None => reports.await.context("serving reports"),
            Some(d) => {
                let page = collector::server::serve_dashboard(d, app, schedule);
                tokio::try_join!(reports, page)
                    .map(|_| ())
                    .context("serving reports and the dashboard")
            }
        }
    })
}
