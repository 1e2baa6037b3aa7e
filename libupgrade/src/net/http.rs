//! The one HTTP client configuration every network access of the library uses.
//!
//! `reqwest` (blocking API: the library is synchronous, disk-bound code; the agent calls it from
//! `spawn_blocking`) with rustls and the `ring` provider: pure Rust TLS that cross-compiles to the
//! static musl node binary without OpenSSL, and with the same provider kube-rs uses.
//! Server certificates are verified against the platform's roots via rustls-platform-verifier.

use std::sync::{Mutex, Once};
use std::time::Duration;

static PROVIDER: Once = Once::new();
/// No progress on a connect, read or write for this long aborts the request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The client, built once: building one loads the platform's certificate verifier and starts
/// the blocking client's runtime thread (tens of milliseconds), far too slow per range request
/// of a chunked download; a shared client also keeps connections alive between requests.
static CLIENT: Mutex<Option<reqwest::blocking::Client>> = Mutex::new(None);

/// Install `ring` as the process-wide rustls provider (idempotent).
pub fn install_crypto_provider() {
    PROVIDER.call_once(|| {
        // An error means another provider was installed first; that one is then used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A blocking client with sane timeouts for slow remote links: a connect timeout and a per-read
/// timeout (no progress for this long aborts the request; total time is unbounded because a
/// 1 GiB rootfs over a 1 Mbit/s link takes hours).
///
/// A node without any system CA certificates (the platform verifier then refuses to build) still
/// gets a client: plain `http://` works and every `https://` server fails verification (no
/// trusted roots) instead of every request failing with "builder error".
pub fn client() -> Result<reqwest::blocking::Client, reqwest::Error> {
    let mut cached = CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = cached.as_ref() {
        return Ok(c.clone());
    }
    let c = build()?;
    *cached = Some(c.clone());
    Ok(c)
}

fn build() -> Result<reqwest::blocking::Client, reqwest::Error> {
    install_crypto_provider();
    let builder = || {
        reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            // In the blocking client this bounds each connect, read and write, not the whole body.
            .timeout(READ_TIMEOUT)
            .user_agent(concat!("libupgrade/", env!("CARGO_PKG_VERSION")))
    };
    builder()
        .build()
        .or_else(|_| builder().tls_certs_only([]).build())
}
