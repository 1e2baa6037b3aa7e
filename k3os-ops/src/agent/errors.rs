//! The agent's errors and how they are shown: [`AgentError`], one typed error for every step
//! of a reconcile, with the one policy the loop applies ([`AgentError::retry`]), and one line
//! of `Display` text, causes joined by `: `.
//!
//! kube's `Error::Api` displays as `ApiError: msg (ErrorResponse { … })`, a Rust debug dump
//! that is unreadable in a `ReconcileError` event (`kubectl describe` shows it verbatim).
//! [`kube_message`] ([`super::cluster::client`]) renders an API answer as `message (Reason, code)`;
//! [`message`] walks an error chain and uses it for every kube error in the chain.

pub use super::cluster::client::kube_message;
use super::cluster::drain::DrainError;
use super::cluster::slots::{SlotError, StoreError};
use super::host::ops::NodeError;

/// The whole chain of `e`, outermost first, as `a: b: c` ([`libupgrade::join_messages`]);
/// a kube error ends the chain, in [`kube_message`]'s words.
pub fn message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for err in std::iter::successors(Some(e), |e| e.source()) {
        if let Some(k) = err.downcast_ref::<kube::Error>() {
            parts.push(kube_message(k));
            break;
        }
        parts.push(err.to_string());
    }
    libupgrade::join_messages(parts)
}

/// What went wrong in one reconcile. Every variant names the object or operation; the reconcile
/// loop (agent/run.rs) applies one policy to all of them: [`AgentError::retry`].
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A request to the API server, with what it was for.
    #[error("{what}: {}", kube_message(.source))]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The update slot protocol (compare-and-swap on a channel's status).
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// Cordon or drain.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// The node side (libupgrade): stage, activate, assess, reboot.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A channel's spec cannot be used.
    #[error("UpdateChannel {channel}: {what}")]
    Spec { channel: String, what: String },
    /// The blocking task running a node operation died.
    #[error("node operation task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// When to reconcile again after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// At once and without an event: another writer won a compare-and-swap; the next read
    /// sees its write and decides again.
    Now,
    /// After the resync period, growing with consecutive errors; reported (log + one
    /// `ReconcileError` event per distinct text).
    Backoff,
}

impl AgentError {
    /// The channel's signed metadata was refused as expired (see [`super::cluster::stale`]).
    pub fn stale(&self) -> Option<&super::host::ops::StaleMetadata> {
        match self {
            AgentError::Node(e) => e.stale.as_ref(),
            _ => None,
        }
    }

    /// The one error policy of the reconcile loop.
    pub fn retry(&self) -> Retry {
        match self {
            AgentError::Slot(SlotError::Store {
                source: StoreError::Conflict,
                ..
            }) => Retry::Now,
            AgentError::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => Retry::Now,
            _ => Retry::Backoff,
        }
    }
}

/// Name what a kube request was for.
pub trait KubeContext<T> {
    fn kube_ctx(self, what: impl FnOnce() -> String) -> Result<T, AgentError>;
}

impl<T> KubeContext<T> for Result<T, kube::Error> {
    fn kube_ctx(self, what: impl FnOnce() -> String) -> Result<T, AgentError> {
        self.map_err(|source| AgentError::Kube {
            what: what(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("the object has been modified", "Conflict")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_lost_compare_and_swap_is_retried_at_once_and_the_rest_backs_off() {
        let lost = AgentError::Slot(SlotError::Store {
            channel: "stable".into(),
            source: StoreError::Conflict,
        });
        assert_eq!(lost.retry(), Retry::Now);
        let k = |code| AgentError::Kube {
            what: "annotate Node n1".into(),
            source: api(code),
        };
        assert_eq!(k(409).retry(), Retry::Now);
        assert_eq!(k(403).retry(), Retry::Backoff);
        assert_eq!(k(500).retry(), Retry::Backoff);
        let contention = AgentError::Slot(SlotError::Contention {
            channel: "stable".into(),
            attempts: 8,
        });
        assert_eq!(contention.retry(), Retry::Backoff);
        let spec = AgentError::Spec {
            channel: "stable".into(),
            what: "spec.rebootTimeout: must be above 0".into(),
        };
        assert_eq!(spec.retry(), Retry::Backoff);
    }

    #[test]
    fn the_text_names_the_operation_once_and_has_no_debug_dump() {
        let e = AgentError::Kube {
            what: "read own Node n1".into(),
            source: api(404),
        };
        let text = message(&e);
        assert_eq!(
            text,
            "read own Node n1: the object has been modified (Conflict, HTTP 404)"
        );
    }
}
