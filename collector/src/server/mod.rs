//! The HTTP side: `POST /v1/reports`, `POST /v1/bundles` (see the crate docs for the checks
//! and statuses) and `GET /healthz`. Store calls run on the blocking pool, one at a time (the admit decision
//! and the insert under one lock, so two copies of one report cannot both be stored).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use fleet_report::{AllowList, NodeId, MAX_BUNDLE_BYTES, MAX_REPORT_BYTES};

use crate::admit::{self, Admit, Limits, Refused};
use crate::rate::RateLimiter;
use crate::store::Store;

/// The path reports are POSTed to.
pub const REPORTS_PATH: &str = "/v1/reports";
/// The path failure bundles are POSTed to (a node derives it from its report URL by replacing
/// the last path segment).
pub const BUNDLES_PATH: &str = "/v1/bundles";
/// The Content-Type a node sends a sealed bundle with.
pub const BUNDLE_CONTENT_TYPE: &str = "application/vnd.k3os-ops.bundle.v1";

/// A running collector's parts.
pub struct App {
    allow: AllowList,
    limits: Limits,
    rate: Mutex<RateLimiter>,
    store: Mutex<Box<dyn Store>>,
}

impl App {
    /// A collector accepting the nodes of `allow` into `store` under `limits`.
    pub fn new(allow: AllowList, store: Box<dyn Store>, limits: Limits) -> App {
        App {
            allow,
            rate: Mutex::new(RateLimiter::new(limits.burst, limits.per_sec)),
            limits,
            store: Mutex::new(store),
        }
    }

    /// Judge and maybe store one request body: the status and the one-line answer.
    pub fn receive(&self, body: &[u8]) -> (u16, String) {
        match self.try_receive(body) {
            Ok(Admit::Store) => (201, "stored".into()),
            Ok(Admit::Resend) => (200, "already stored (a resend)".into()),
            Err(r) => {
                log::warn!("report refused ({}): {}", r.status, r.why);
                (r.status, r.why)
            }
        }
    }

    /// Take one of `node`'s tokens (reports and bundles share them), or 429.
    fn take_token(&self, node: NodeId) -> Result<(), Refused> {
        let allowed = self
            .rate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(node, Instant::now());
        if allowed {
            return Ok(());
        }
        Err(Refused {
            status: 429,
            why: format!(
                "node {node} sends faster than {} reports or bundles/s (burst {})",
                self.limits.per_sec, self.limits.burst
            ),
        })
    }

    fn try_receive(&self, body: &[u8]) -> Result<Admit, Refused> {
        let v = admit::verify(body, &self.allow)?;
        self.take_token(v.report.node)?;
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let known = store
            .known(&v.report.node, v.report.seq)
            .map_err(unavailable)?;
        let verdict = admit::admit(&v, &known, &self.limits)?;
        if verdict == Admit::Store {
            store.insert(&v, crate::time::now()).map_err(unavailable)?;
        }
        Ok(verdict)
    }

    /// Judge and maybe store one failure bundle: the status and the one-line answer.
    pub fn receive_bundle(&self, body: &[u8]) -> (u16, String) {
        match self.try_receive_bundle(body) {
            Ok(Admit::Store) => (201, "stored".into()),
            Ok(Admit::Resend) => (200, "already stored (a resend)".into()),
            Err(r) => {
                log::warn!("bundle refused ({}): {}", r.status, r.why);
                (r.status, r.why)
            }
        }
    }

    /// The checks in order: size, envelope, signature, enrolment, rate, a resend and the
    /// node's quota before a byte is inflated; then the body (inflate, JSON, limits), and last
    /// whether its (version, attempt), which only the body names, is taken by other bytes.
    fn try_receive_bundle(&self, body: &[u8]) -> Result<Admit, Refused> {
        let (sealed, site) = admit::verify_bundle(body, &self.allow)?;
        self.take_token(sealed.node)?;
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let known = store
            .bundle_known(&sealed.node, body)
            .map_err(unavailable)?;
        if let Some(resend) = admit::admit_sealed(&sealed, &known, &self.limits.bundles)? {
            return Ok(resend);
        }
        let opened = sealed.inflate().map_err(admit::bundle_refusal)?;
        let b = &opened.bundle;
        let taken = store
            .bundle_body(&b.node.to_string(), &b.version, b.attempt)
            .map_err(unavailable)?
            .is_some();
        let verdict = admit::admit_opened(&opened, taken)?;
        store
            .insert_bundle(&opened, site, crate::time::now())
            .map_err(unavailable)?;
        Ok(verdict)
    }

    /// The dashboard page over what is stored now, under `schedule`.
    pub fn dashboard(&self, schedule: &dyn crate::dashboard::Schedule) -> (u16, String) {
        let read = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            store.rows().and_then(|rows| {
                let actions = store.actions()?;
                let bundles = store.failed_bundles(&rows)?;
                Ok((rows, actions, bundles))
            })
        };
        match read {
            Ok((rows, actions, bundles)) => {
                let stored = crate::dashboard::Stored {
                    rows: &rows,
                    actions: &actions,
                    bundles: &bundles,
                };
                let enrolled = self.allow.len() as u64;
                (
                    200,
                    crate::dashboard::render(&stored, enrolled, schedule, crate::time::now()),
                )
            }
            Err(e) => (503, format!("{e}\n")),
        }
    }

    /// One stored bundle for download: its Content-Type and bytes (sealed as received, or its
    /// JSON), or the status (404, 503) and why.
    pub fn bundle_download(
        &self,
        node: &str,
        version: &str,
        attempt: u32,
        json: bool,
    ) -> Result<(&'static str, Vec<u8>), (u16, String)> {
        let body = self
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bundle_body(node, version, attempt)
            .map_err(|e| (503, e.to_string()))?
            .ok_or_else(|| {
                (
                    404,
                    format!(
                        "no bundle of node {:?} for attempt {attempt} of {:?}",
                        node.escape_debug().to_string(),
                        version.escape_debug().to_string()
                    ),
                )
            })?;
        if !json {
            return Ok((BUNDLE_CONTENT_TYPE, body));
        }
        let opened = fleet_report::open_bundle(&body).map_err(|e| (500, e.to_string()))?;
        let text = serde_json::to_vec_pretty(&opened.bundle).map_err(|e| (500, e.to_string()))?;
        Ok(("application/json", text))
    }

    /// Every stored failure bundle, without its bytes.
    pub fn bundles(&self) -> Result<Vec<crate::BundleRow>, crate::StoreError> {
        self.store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bundles()
    }

    /// Every stored report (for fleet status and tests).
    pub fn rows(&self) -> Result<Vec<crate::Row>, crate::StoreError> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).rows()
    }
}

/// The store failed: 503, naming the database.
fn unavailable(e: crate::StoreError) -> Refused {
    Refused {
        status: 503,
        why: e.to_string(),
    }
}

async fn post_bundle(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> (StatusCode, String) {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let why = match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => {
                    format!("bundle is more than the {MAX_BUNDLE_BYTES} bytes a bundle may have")
                }
                _ => format!("reading the bundle: {}", e.body_text().escape_debug()),
            };
            log::warn!("bundle refused ({}): {why}", e.status().as_u16());
            return (e.status(), why + "\n");
        }
    };
    let answer = tokio::task::spawn_blocking(move || app.receive_bundle(&body)).await;
    let (status, text) = answer.unwrap_or_else(|e| (500, format!("collector task failed: {e}")));
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        text + "\n",
    )
}

async fn post_report(State(app): State<Arc<App>>, body: Bytes) -> (StatusCode, String) {
    let answer = tokio::task::spawn_blocking(move || app.receive(&body)).await;
    let (status, text) = answer.unwrap_or_else(|e| (500, format!("collector task failed: {e}")));
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        text + "\n",
    )
}

/// The collector's routes over `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        // A longer body is refused with 413 before it is read whole (each route its limit).
        .route(
            REPORTS_PATH,
            post(post_report).layer(DefaultBodyLimit::max(MAX_REPORT_BYTES)),
        )
        .route(
            BUNDLES_PATH,
            post(post_bundle).layer(DefaultBodyLimit::max(MAX_BUNDLE_BYTES)),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(app)
}

/// Makes the schedule the dashboard shows, once per page (so a pause shows at once).
pub type ScheduleSource = Arc<dyn Fn() -> Box<dyn crate::dashboard::Schedule> + Send + Sync>;

/// The read-only dashboard (`GET /`) over `app`: meant for a listener of its own, inside the
/// publisher's network (the report port faces the sites).
pub fn dashboard_router(app: Arc<App>, schedule: ScheduleSource) -> Router {
    let downloads = app.clone();
    let json = app.clone();
    Router::new()
        .route(
            "/bundles/{node}/{version}/{attempt}",
            get(move |Path(key): Path<(String, String, u32)>| {
                download(downloads.clone(), key, false)
            }),
        )
        .route(
            "/bundles/{node}/{version}/{attempt}/json",
            get(move |Path(key): Path<(String, String, u32)>| download(json.clone(), key, true)),
        )
        .route(
            "/",
            get(move || {
                let (app, schedule) = (app.clone(), schedule.clone());
                async move {
                    let page =
                        tokio::task::spawn_blocking(move || app.dashboard(schedule().as_ref()))
                            .await
                            .unwrap_or_else(|e| (500, format!("dashboard task failed: {e}\n")));
                    (
                        StatusCode::from_u16(page.0).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
                        page.1,
                    )
                }
            }),
        )
}

/// A stored bundle as a download: the sealed bytes as received, or (`json`) the bundle as
/// JSON; never shown inline (`attachment`, `nosniff`), so no stored text runs as a page.
async fn download(
    app: Arc<App>,
    (node, version, attempt): (String, String, u32),
    json: bool,
) -> impl axum::response::IntoResponse {
    use axum::http::header;
    let answer =
        tokio::task::spawn_blocking(move || app.bundle_download(&node, &version, attempt, json))
            .await
            .unwrap_or_else(|e| Err((500, format!("dashboard task failed: {e}"))));
    let (status, ctype, body) = match answer {
        Ok((ctype, body)) => (200, ctype, body),
        Err((status, why)) => (
            status,
            "text/plain; charset=utf-8",
            (why + "\n").into_bytes(),
        ),
    };
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [
            (header::CONTENT_TYPE, ctype),
            (header::CONTENT_DISPOSITION, "attachment"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

/// Serve the dashboard of `app` on `listener` until the process ends.
pub async fn serve_dashboard(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    schedule: ScheduleSource,
) -> std::io::Result<()> {
    axum::serve(listener, dashboard_router(app, schedule)).await
}

/// Serve `app` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, app: Arc<App>) -> std::io::Result<()> {
    axum::serve(listener, router(app)).await
}

#[cfg(test)]
mod bundle_tests;
#[cfg(test)]
mod tests;
