//! How agent errors are shown: one line of `Display` text, causes joined by `: `.
//!
//! kube's `Error::Api` displays as `ApiError: msg (ErrorResponse { … })`, a Rust debug dump
//! that ended up in `ReconcileError` events (issue 11, bug 10). [`kube_message`] renders an API
//! answer as `message (Reason, code)`; [`message`] walks an error chain and uses it for every
//! kube error in the chain.

/// One kube error as text without debug output.
pub fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() {
                "Failure"
            } else {
                s.reason.as_str()
            };
            format!("{} ({reason}, HTTP {})", s.message, s.code)
        }
        other => other.to_string(),
    }
}

/// The whole chain of `e`, outermost first, as `a: b: c` (kube errors via [`kube_message`]).
pub fn message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = match err.downcast_ref::<kube::Error>() {
            Some(k) => kube_message(k),
            None => err.to_string(),
        };
        // thiserror messages often repeat their source's text: print each once.
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        if err.downcast_ref::<kube::Error>().is_some() {
            break;
        }
        cur = err.source();
    }
    parts.join(": ")
}

/// [`message`] of an `anyhow` error.
pub fn anyhow_message(e: &anyhow::Error) -> String {
    message(e.as_ref())
}
