//! The bookkeeping effects several steps share: undo this agent's cordon, give the node and
//! the slot back, record a failed update on the channel. Each returns the Events that say what
//! it did, for the tick to return (`Done`).

use chrono::Utc;

use super::kube_store::KubeChannelStore;
use super::publish::Say;
use super::slots;
use crate::agent::channel::format::ANN_CORDONED;
use crate::agent::context::Agent;
use crate::agent::errors::{AgentError, KubeContext};

impl Agent {
    /// Uncordon if (and only if) this agent cordoned the node (its `update-cordoned` mark).
    pub(in crate::agent) async fn undo_cordon(&self) -> Result<Option<Say>, AgentError> {
        let node = self
            .nodes()
            .get(&self.settings.node)
            .await
            .kube_ctx(|| format!("read own Node {}", self.settings.node))?;
        let ours = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CORDONED))
            .is_some_and(|v| v == "true");
        if ours {
            super::drain::set_unschedulable(&self.nodes(), &self.settings.node, false).await?;
            self.annotate(&[(ANN_CORDONED, None)]).await?;
            return Ok(Some(
                Say::info(
                    "Uncordoned",
                    "uncordoned the node (the agent had cordoned it)".into(),
                )
                .about_node(),
            ));
        }
        Ok(None)
    }

    /// Give the node and the slot back: undo our cordon (a node is never left cordoned by us
    /// without a slot), release the slot held under `token`; the Events that say so
    /// (`Uncordoned`, `SlotReleased` with `why`).
    pub(in crate::agent) async fn give_back(
        &self,
        store: &KubeChannelStore,
        token: &str,
        why: &str,
    ) -> Result<Vec<Say>, AgentError> {
        let mut said: Vec<Say> = self.undo_cordon().await?.into_iter().collect();
        let released = slots::release(store, &self.settings.node, token, Utc::now()).await?;
        said.extend(super::publish::released(released, why));
        Ok(said)
    }

    /// Record that `version` failed here (counted in the metrics) with `reason`; with `token`
    /// the slot moves to `RollingBack` (`keep_slot`) or is released by the same write. The
    /// caller reports what the record caused ([`super::publish::failure_recorded`]) after its own report.
    pub(in crate::agent) async fn record_failure(
        &self,
        store: &KubeChannelStore,
        token: Option<&str>,
        version: &str,
        reason: &str,
        keep_slot: bool,
    ) -> Result<slots::FailureOutcome, AgentError> {
        self.clients
            .metrics
            .count(crate::agent::metrics::Outcome::Failure);
        let node = &self.settings.node;
        Ok(
            slots::record_failure(store, node, token, version, reason, keep_slot, Utc::now())
                .await?,
        )
    }
}
