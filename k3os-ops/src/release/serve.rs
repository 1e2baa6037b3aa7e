//! `release serve`: a static file server for a channel directory.
//!
//! Built on tower-http's `ServeDir` (the tower-http version kube already pulls in) driven by
//! hyper 1 through hyper-util: conditional and Range requests (206 with Content-Range, 416 for
//! unsatisfiable ranges), HEAD, and path traversal protection come from that well-used code
//! rather than a hand-written HTTP parser. It prints `serving DIR at http://ADDR/` on stdout
//! once listening (tests read the bound port from it when given port 0) and one line per
//! request on stderr.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tower_http::services::ServeDir;

pub fn serve(dir: &Path, listen: SocketAddr) -> anyhow::Result<()> {
    if !dir.is_dir() {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(run(dir, listen))
}

async fn run(dir: &Path, listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "serving {} at http://{addr}/", dir.display())?;
        out.flush()?;
    }
    let service =
        TowerToHyperService::new(ServeDir::new(dir).append_index_html_on_directories(false));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => r.context("accepting a connection")?,
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        };
        let service = service.clone();
        tokio::spawn(async move {
            let logged = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let line = format!(
                    "{peer} {} {}{}",
                    req.method(),
                    req.uri().path(),
                    req.headers()
                        .get(hyper::header::RANGE)
                        .and_then(|v| v.to_str().ok())
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                );
                let fut = hyper::service::Service::call(&service, req);
                async move {
                    let res = fut.await;
                    if let Ok(r) = &res {
                        eprintln!("{line} -> {}", r.status().as_u16());
                    }
                    res
                }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), logged)
                .await
            {
                eprintln!("{peer}: connection error: {e}");
            }
        });
    }
    Ok(())
}
