//! Stage progress as a short text for the `k3os.io/update-progress` annotation, and the
//! downloaded-bytes metric.

use std::sync::{Arc, Mutex};

use super::ops::StageProgress;

/// Stage progress turned into a short text, sent to the loop that writes the annotation.
pub struct AnnotationProgress {
    tx: tokio::sync::watch::Sender<String>,
    metrics: Arc<crate::agent::metrics::Metrics>,
    state: Mutex<(String, u64, u64)>,
}

impl AnnotationProgress {
    pub fn new(
        tx: tokio::sync::watch::Sender<String>,
        metrics: Arc<crate::agent::metrics::Metrics>,
    ) -> Self {
        AnnotationProgress {
            tx,
            metrics,
            state: Mutex::new((String::new(), 0, 0)),
        }
    }
    fn send(&self) {
        let s = self.state.lock().expect("not poisoned");
        let pct = s.1.saturating_mul(100).checked_div(s.2).unwrap_or(100);
        let _ = self.tx.send(format!(
            "{} {pct}% ({} of {} MiB)",
            s.0,
            s.1 >> 20,
            s.2 >> 20
        ));
    }
}

impl StageProgress for AnnotationProgress {
    fn begin(&self, what: &str, total: u64, already: u64) {
        *self.state.lock().expect("not poisoned") = (what.to_string(), already, total);
        self.send();
    }
    fn advance(&self, bytes: u64) {
        self.metrics.add_downloaded(bytes);
        self.state.lock().expect("not poisoned").1 += bytes;
        self.send();
    }
    fn end(&self) {
        let mut s = self.state.lock().expect("not poisoned");
        s.1 = s.2;
        drop(s);
        self.send();
    }
}
