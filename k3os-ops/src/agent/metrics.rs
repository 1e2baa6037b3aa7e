//! The agent's Prometheus metrics and its small HTTP listener (`/metrics`, `/healthz`,
//! `/readyz`).
//!
//! Metrics are kept with the `prometheus-client` crate (the Prometheus project's own Rust
//! client: typed metric families, OpenMetrics/Prometheus text encoding) in one [`Metrics`]
//! registry per agent, every series labelled with the node. The listener is hyper 1's HTTP/1
//! server, already in this binary for `release serve` (well kept, the stack kube itself uses),
//! so no second HTTP stack is linked for three fixed routes.
//!
//! - `/healthz` (liveness): 200 while the process' runtime answers. Deliberately not tied to
//!   reconcile progress: a stage of a large release runs inside one reconcile for many minutes
//!   and must not be killed for it.
//! - `/readyz` (readiness): 200 once a reconcile has read this node and its channels from the
//!   API server (no channel at all counts: the DaemonSet is Ready before the first channel is
//!   made) with the watches' first lists in, 503 before and after [`NOT_READY_AFTER_ERRORS`]
//!   failed reconciles in a row.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Failed reconciles in a row after which `/readyz` answers 503.
pub const NOT_READY_AFTER_ERRORS: u32 = 3;

/// The phases the agent reports (the `k3os.io/update-phase` annotation values); each is a
/// series of `k3os_ops_update_phase`, 1 for the current one.
pub const PHASES: [super::phase::Phase; super::phase::Phase::ALL.len()] = super::phase::Phase::ALL;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChannelLabels {
    channel: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PreviewLabels {
    channel: String,
    /// `fetch` or `reuse`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    /// `booted` or `staged`.
    slot: String,
    version: String,
}

/// Counters of notable outcomes.
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// An update of this node failed (recorded in the channel's status).
    Failure,
    /// This node came back on (or went back to) its old slot.
    Rollback,
    /// This agent reclaimed a dead holder's slot.
    Reclaim,
    /// A reconcile returned an error.
    ReconcileError,
    /// A stage attempt failed (it is retried with back-off; each is also a `StageFailed`
    /// Event and phase).
    StageFailure,
}

/// All metrics of one agent.
pub struct Metrics {
    registry: Registry,
    phase: Family<PhaseLabels, Gauge>,
    current_phase: Mutex<Option<String>>,
    version: Family<VersionLabels, Gauge>,
    versions: Mutex<(Option<String>, Option<String>)>,
    downloaded: Counter,
    slot_held: Gauge<f64, AtomicU64>,
    drain: Histogram,
    failures: Counter,
    rollbacks: Counter,
    reclaims: Counter,
    reconcile_errors: Counter,
    stage_failures: Counter,
    channel_stale: Family<ChannelLabels, Gauge>,
    stage_preview: Family<PreviewLabels, Gauge>,
    token_node_bound: Gauge,
    ready: AtomicBool,
    errors_in_row: AtomicU32,
}

impl Metrics {
    /// A registry whose series all carry `node="<node>"`.
    pub fn new(node: &str) -> Metrics {
        let mut registry = Registry::with_prefix_and_labels(
            "k3os_ops",
            [(
                std::borrow::Cow::Borrowed("node"),
                std::borrow::Cow::Owned(node.to_string()),
            )]
            .into_iter(),
        );
        let r = &mut registry;
        let phase = register(
            r,
            "update_phase",
            "Current update phase of this node (1 for the current phase, 0 for the others)",
            Family::<PhaseLabels, Gauge>::default(),
        );
        for p in PHASES {
            phase
                .get_or_create(&PhaseLabels {
                    phase: p.as_str().to_string(),
                })
                .set(0);
        }
        Metrics {
            phase,
            current_phase: Mutex::new(None),
            version: register(
                r,
                "version_info",
                "Release versions on this node: slot=booted (running) and slot=staged (inactive slot, verified)",
                Family::<VersionLabels, Gauge>::default(),
            ),
            versions: Mutex::new((None, None)),
            downloaded: register(
                r,
                "downloaded_bytes",
                "Bytes of release artifacts written while staging",
                Counter::default(),
            ),
            slot_held: register(
                r,
                "slot_held_seconds",
                "Seconds this node has held its update slot (0 without a slot)",
                Gauge::<f64, AtomicU64>::default(),
            ),
            drain: register(
                r,
                "drain_duration_seconds",
                "Duration of drains of this node (successful or not)",
                Histogram::new([5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]),
            ),
            failures: register(r, "update_failures", "Failed updates of this node", Counter::default()),
            rollbacks: register(r, "rollbacks", "Returns of this node to its old slot", Counter::default()),
            reclaims: register(r, "reclaims", "Slots of dead holders reclaimed by this agent", Counter::default()),
            reconcile_errors: register(r, "reconcile_errors", "Reconciles that ended in an error", Counter::default()),
            stage_failures: register(r, "stage_failures", "Failed stage attempts of this node (each retried with back-off, each a StageFailed Event)", Counter::default()),
            channel_stale: register(
                r,
                "channel_stale",
                "1 while the channel's signed metadata is refused as expired (condition ChannelStale), 0 once it resolves fresh",
                Family::<ChannelLabels, Gauge>::default(),
            ),
            stage_preview: register(
                r,
                "stage_preview_bytes",
                "Bytes the next stage of the channel's target fetches (kind=fetch) and reuses (kind=reuse), as previewed before its first byte",
                Family::<PreviewLabels, Gauge>::default(),
            ),
            token_node_bound: register(
                r,
                "token_node_bound",
                "1 when the API server names this node in the agent's user info (a pod-bound token: deploy/node-scope.yaml can scope its writes), 0 otherwise",
                Gauge::default(),
            ),
            registry,
            ready: AtomicBool::new(false),
            errors_in_row: AtomicU32::new(0),
        }
    }

    /// Whether the agent's token is bound to this node (see `agent/cluster/token_scope.rs`).
    pub fn set_token_node_bound(&self, bound: bool) {
        self.token_node_bound.set(i64::from(bound));
    }

    /// The node entered `phase`.
    pub fn set_phase(&self, phase: super::phase::Phase) {
        let phase = phase.as_str();
        let mut cur = self.current_phase.lock().expect("not poisoned");
        if let Some(old) = cur.as_deref() {
            self.phase
                .get_or_create(&PhaseLabels {
                    phase: old.to_string(),
                })
                .set(0);
        }
        self.phase
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .set(1);
        *cur = Some(phase.to_string());
    }

    /// The booted and the staged version (`None`: unknown / nothing staged).
    pub fn set_versions(&self, booted: Option<&str>, staged: Option<&str>) {
        let mut cur = self.versions.lock().expect("not poisoned");
        for (slot, old, new) in [
            ("booted", cur.0.as_deref(), booted),
            ("staged", cur.1.as_deref(), staged),
        ] {
            if old == new {
                continue;
            }
            if let Some(o) = old {
                self.version.remove(&VersionLabels {
                    slot: slot.into(),
                    version: o.into(),
                });
            }
            if let Some(n) = new {
                self.version
                    .get_or_create(&VersionLabels {
                        slot: slot.into(),
                        version: n.into(),
                    })
                    .set(1);
            }
        }
        *cur = (booted.map(String::from), staged.map(String::from));
    }

    /// Whether `channel`'s signed metadata was last refused as expired.
    pub fn set_channel_stale(&self, channel: &str, stale: bool) {
        self.channel_stale
            .get_or_create(&ChannelLabels {
                channel: channel.to_string(),
            })
            .set(i64::from(stale));
    }

    /// The preview of `channel`'s next stage: bytes to fetch and to reuse.
    pub fn set_stage_preview(&self, channel: &str, fetch: u64, reuse: u64) {
        for (kind, v) in [("fetch", fetch), ("reuse", reuse)] {
            self.stage_preview
                .get_or_create(&PreviewLabels {
                    channel: channel.to_string(),
                    kind: kind.to_string(),
                })
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }

    pub fn add_downloaded(&self, bytes: u64) {
        self.downloaded.inc_by(bytes);
    }

    pub fn set_slot_held(&self, seconds: f64) {
        self.slot_held.set(seconds);
    }

    pub fn observe_drain(&self, seconds: f64) {
        self.drain.observe(seconds);
    }

    pub fn count(&self, o: Outcome) {
        match o {
            Outcome::Failure => &self.failures,
            Outcome::Rollback => &self.rollbacks,
            Outcome::Reclaim => &self.reclaims,
            Outcome::ReconcileError => &self.reconcile_errors,
            Outcome::StageFailure => &self.stage_failures,
        }
        .inc();
    }

    /// A reconcile finished: `ok` marks the agent ready, errors count towards unready.
    pub fn reconciled(&self, ok: bool) {
        if ok {
            self.errors_in_row.store(0, Ordering::Relaxed);
            self.ready.store(true, Ordering::Relaxed);
        } else {
            self.count(Outcome::ReconcileError);
            let n = self.errors_in_row.fetch_add(1, Ordering::Relaxed) + 1;
            if n >= NOT_READY_AFTER_ERRORS {
                self.ready.store(false, Ordering::Relaxed);
            }
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Register `metric` under `name` and hand back the handle that updates it.
fn register<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The answer to one request: (status, content type, body).
pub fn route(metrics: &Metrics, path: &str) -> (u16, &'static str, String) {
    match path {
        "/metrics" => (
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => (200, "text/plain", "ok\n".into()),
        "/readyz" if metrics.is_ready() => (200, "text/plain", "ready\n".into()),
        "/readyz" => (
            503,
            "text/plain",
            "not ready: the Node and the UpdateChannels not read yet, or the last reconciles failed\n".into(),
        ),
        _ => (404, "text/plain", "not found\n".into()),
    }
}

/// Serve [`route`] on `listener` forever (one task per connection).
pub async fn serve(listener: tokio::net::TcpListener, metrics: std::sync::Arc<Metrics>) {
    use hyper::service::service_fn;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let (status, ctype, body) = route(&metrics, req.uri().path());
                let resp = hyper::Response::builder()
                    .status(status)
                    .header("content-type", ctype)
                    .body(body)
                    .expect("static response parts are valid");
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}

/// Bind `addr` and serve in the background; returns the bound address.
pub async fn spawn(
    addr: SocketAddr,
    metrics: std::sync::Arc<Metrics>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve(listener, metrics));
    Ok(bound)
}
