//! `k3os-ops agent`'s main: logging, the start-up line, the Kubernetes client, the metrics
//! listener, then [`run_agent`]: the background tasks, the watches that wake the loop (see
//! [`super::cluster::cache`]), and the reconcile loop
//! with its single error policy ([`super::errors::AgentError::retry`]: a lost compare-and-swap
//! reconciles again at once; anything else is logged, published as a `ReconcileError` event once
//! per text and backed off up to 10 resync periods; never exit on a reconcile error).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::cluster::kube_store::node_lease_name;
use super::context::{Agent, Next};
use super::errors::Retry;
use super::fleet::background::{reclaim_loop, renew_node_lease};
use super::fleet::poller::{poll_loop, Polls};
use super::host::ops::NodeOps;
use super::AgentArgs;

/// Run the agent until a fatal error.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let node = args.node_name.clone().context(
        "the node name is required: --node-name or NODE_NAME (DaemonSet: fieldRef spec.nodeName)",
    )?;
    // The start-up line (the image test waits for it). /proc/cmdline is read from the
    // container's own /proc: the kernel command line is not namespaced.
    let cmdline = std::fs::read_to_string("/proc/cmdline")
        .map(|c| format!("{} bytes", c.trim_end().len()))
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    tracing::info!(
        "k3os-ops agent {} starting on node {node} (namespace {}, kernel command line {cmdline}, metrics on {})",
        env!("CARGO_PKG_VERSION"),
        args.namespace,
        args.metrics_addr
    );
    libupgrade::http::install_crypto_provider();
    let node_ops = Arc::new(super::host::node::LibupgradeNode::open(
        args.config.clone(),
    )?);
    let agent = start_agent(&args, &node, node_ops.clone()).await?;
    if args.scrub_hours > 0 {
        let every = Duration::from_secs(args.scrub_hours * 3600);
        tokio::spawn(scrub_loop(agent.clone(), node_ops, every));
    }
    let bound = super::metrics::spawn(args.metrics_addr, agent.clients.metrics.clone())
        .await
        .with_context(|| {
            format!(
                "listen on {} for /metrics, /healthz and /readyz",
                args.metrics_addr
            )
        })?;
    tracing::info!("serving /metrics, /healthz and /readyz on {bound}");
    let periods = Periods {
        resync: Duration::from_secs(args.resync_secs.max(5)),
        poll: Polls {
            every: Duration::from_secs(args.poll_secs.max(30)),
            waiting: Duration::from_secs(args.wait_poll_secs.max(args.poll_secs).max(30)),
        },
        count: Duration::from_secs(args.count_secs.max(5)),
    };
    run_agent(agent, periods).await
}

/// The periods of the agent's loops (its command-line options).
#[derive(Debug, Clone, Copy)]
pub struct Periods {
    /// Between reconciles when nothing changes (`--resync-secs`).
    pub resync: Duration,
    /// Between polls of `latest` (`--poll-secs`, `--wait-poll-secs`).
    pub poll: Polls,
    /// Between fleet counts (`--count-secs`).
    pub count: Duration,
}

/// Everything an agent runs once it has a client: its watches (when it has watch caches), the
/// node Lease renewal, the reclaim loop, the `latest` poller, the fleet counter, and the
/// reconcile loop. The tasks end with this future (the fleet bench aborts it to power a node
/// off).
pub async fn run_agent(agent: Arc<Agent>, periods: Periods) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut changes = None;
    if let Some(w) = &agent.clients.watched {
        w.spawn(&mut tasks, &agent.clients.client, &agent.settings.namespace);
        changes = Some(w.changes.subscribe());
    }
    tasks.spawn(renew_node_lease(agent.clone()));
    tasks.spawn(reclaim_loop(agent.clone()));
    tasks.spawn(poll_loop(agent.clone(), periods.poll));
    tasks.spawn(super::fleet::counter::count_loop(
        agent.clone(),
        periods.count,
    ));
    agent
        .event(
            None,
            false,
            "AgentStarted",
            format!("k3os-ops agent {} started", env!("CARGO_PKG_VERSION")),
        )
        .await;
    reconcile_loop(&agent, periods.resync, changes).await
}

/// The Kubernetes client and the agent over `ops`, with this host's boot time and how long its Lease
/// was silent before this start.
async fn start_agent(
    args: &AgentArgs,
    node: &str,
    ops: Arc<super::host::node::LibupgradeNode>,
) -> anyhow::Result<Arc<Agent>> {
    let node = node.to_string();
    let writes = super::cluster::client::WriteCounter::new(&node);
    let client = super::cluster::client::infer(&writes)
        .await
        .context("connect to the Kubernetes API (in-cluster service account or KUBECONFIG)")?;
    let ops: Arc<dyn NodeOps> = ops;
    let self_pod = args
        .pod_name
        .as_ref()
        .map(|p| format!("{}/{p}", args.namespace));
    let mut agent =
        Agent::new(client.clone(), &args.namespace, &node, self_pod, ops).with_watches(writes);
    agent.settings.booted_at = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| super::reconcile::steps::host_boot_time(&s));
    let agent = Arc::new(agent);
    let scope = super::cluster::token_scope::check(&client, &node).await;
    agent.clients.metrics.set_token_node_bound(scope.is_node());
    if let Some(warning) = scope.warning(&node) {
        tracing::warn!("{warning}");
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.namespace);
    let silence = leases
        .get_opt(&node_lease_name(&node))
        .await
        .with_context(|| format!("read Lease {}/{}", args.namespace, node_lease_name(&node)))?
        .and_then(|l| l.spec?.renew_time)
        .map(|t| {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
            Duration::from_secs_f64(age.as_secs_f64().max(0.0))
        });
    agent.set_startup_silence(silence);
    Ok(agent)
}

/// Reconcile forever with the one error policy (see the module docs).
async fn reconcile_loop(
    agent: &Agent,
    resync: Duration,
    mut changes: Option<tokio::sync::watch::Receiver<u64>>,
) -> ! {
    let (mut errors, mut conflicts) = (0u32, 0u32);
    loop {
        match agent.reconcile().await {
            Ok(Next::Again) => {
                (errors, conflicts) = (0, 0);
                continue;
            }
            Ok(Next::Wait) => (errors, conflicts) = (0, 0),
            // A few at once; a conflict that keeps coming back is reported and backed off.
            Err(e) if e.retry() == Retry::Now && conflicts < 5 => {
                conflicts += 1;
                tracing::debug!("reconcile again at once: {}", super::errors::message(&e));
                continue;
            }
            Err(e) => {
                conflicts = 0;
                errors += 1;
                agent.report_error(&e).await;
            }
        }
        let pause = resync * errors.clamp(1, 10);
        match changes.as_mut() {
            // Any change of the channels or of this Node wakes the loop (a change during the
            // reconcile wakes it at once: the receiver remembers it).
            Some(rx) => {
                let _ = tokio::time::timeout(pause, rx.changed()).await;
            }
            None => tokio::time::sleep(pause).await,
        }
    }
}

/// Scrub the node every `every`, forever.
pub async fn scrub_loop(agent: Arc<Agent>, node: Arc<dyn NodeOps>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let n = node.clone();
        let slots = match tokio::task::spawn_blocking(move || n.verify_slots()).await {
            Ok(Ok(slots)) => slots,
            Ok(Err(e)) => {
                agent
                    .event(
                        None,
                        true,
                        "SlotScrubFailed",
                        // libupgrade's message, as the node gave it (not the op's name).
                        format!("dm-verity scrub: {}", e.message),
                    )
                    .await;
                continue;
            }
            Err(e) => {
                tracing::warn!("dm-verity scrub task: {e}");
                continue;
            }
        };
        for s in &slots {
            tracing::info!("dm-verity scrub: {}", crate::slot_verify::line(s));
        }
        if let Some((warning, reason, text)) = super::host::scrub::note(&slots) {
            agent.event(None, warning, reason, text).await;
        }
    }
}
