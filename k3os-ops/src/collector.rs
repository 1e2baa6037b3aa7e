//! `collector serve`: receive, verify and store the fleet's reports (the `collector` crate
//! does the work; this only reads the arguments); `collector guard`: one run of the automatic
//! halt (`release::guard`). Prints `collecting reports at
//! http://ADDR/v1/reports into DB` on stdout once listening (tests read the port from it when
//! given port 0) and one line per refused report on stderr.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
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
    }
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
