//! Whether this boot was assessed (`k3os-ops slot confirm` ran): not yet is not an error but
//! a state, reported once (Node condition [`COND_BOOT_ASSESSED`]`=False`, a `BootNotAssessed`
//! Event, phase `NotAssessed`) and waited out; the condition turns `True` once it was.

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::agent::channel::crd::UpdateChannel;
use crate::agent::context::Agent;
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::host::ops::NodeError;
use crate::agent::phase::Phase;

/// The Node condition saying whether this boot was assessed (`k3os-ops slot confirm` ran);
/// written `False` while the agent waits for it.
pub const COND_BOOT_ASSESSED: &str = "K3osBootAssessed";

/// The [`COND_BOOT_ASSESSED`] condition of `node`, if present.
fn assessed_condition(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == COND_BOOT_ASSESSED)
        .map(|c| c.status == "True")
}

/// Set this Node's [`COND_BOOT_ASSESSED`] condition (strategic merge on `status.conditions`,
/// keyed by type: the kubelet's conditions stay).
async fn set_assessed_condition(cx: &Agent, ok: bool, message: &str) -> Result<(), AgentError> {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let patch = json!({"status": {"conditions": [{
        "type": COND_BOOT_ASSESSED,
        "status": if ok { "True" } else { "False" },
        "reason": if ok { "Assessed" } else { "NotAssessed" },
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }]}});
    let node = &cx.settings.node;
    cx.nodes()
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .kube_ctx(|| format!("set condition {COND_BOOT_ASSESSED} of Node {node}"))?;
    Ok(())
}

/// This boot was not assessed yet: say so once (Node condition, Event, phase) and wait.
pub(in crate::agent) async fn report_not_assessed(
    cx: &Agent,
    node: &Node,
    channel: Option<&UpdateChannel>,
    e: &NodeError,
) -> Result<(), AgentError> {
    if cx.remember(|m| std::mem::replace(&mut m.not_assessed_reported, true)) {
        return Ok(());
    }
    let text = e.message.clone();
    if assessed_condition(node) != Some(false) {
        set_assessed_condition(cx, false, &text).await?;
    }
    cx.phase(Phase::NotAssessed, &text).await?;
    cx.event(channel, true, "BootNotAssessed", text).await;
    Ok(())
}

/// The boot is assessed: turn a `False` [`COND_BOOT_ASSESSED`] (of this or an earlier
/// process) `True`.
pub(in crate::agent) async fn clear_not_assessed(
    cx: &Agent,
    node: &Node,
) -> Result<(), AgentError> {
    cx.remember(|m| m.not_assessed_reported = false);
    if assessed_condition(node) == Some(false) {
        set_assessed_condition(
            cx,
            true,
            "this boot was assessed by the boot-assessment core",
        )
        .await?;
    }
    Ok(())
}
