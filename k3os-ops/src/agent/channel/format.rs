//! The versions of everything the agent writes and reads back, and their migrations.
//!
//! Rule: every format the agent stores is versioned; an older format is read as what it is and
//! rewritten in the current one on the next write (never an error); a format newer than this
//! binary knows is refused with a message naming both versions, and nothing is written to the
//! object that carries it.
//!
//! **`UpdateChannel` status** — marker `status.formatVersion` (an integer), current
//! [`STATUS_FORMAT`]:
//! - format 1 (v0.1.0, commit c063939; no marker): `latestVersion`, `slots[]` (`node`, `token`,
//!   `claimedAt`, `phase` ∈ `Claimed|Draining|Rebooting|RollingBack`, `wasUnschedulable`,
//!   `version`), `failures[]` (`node`, `version`, `at`, `reason`), `conditions[]`
//!   (`LatestResolved`, `Degraded`, `Paused`), `observedGeneration`.
//! - format 2: format 1 plus `formatVersion`, the derived `updating` (every holder, for the
//!   printer column), the condition types `Invalid`, `Complete` and `ChannelStale`, and the fleet counter's
//!   `nodes` (`total`, `updated`, `progress` = `updated/total`, `target`, `byVersion`,
//!   `byPhase`: counts, never a list of nodes) and `rollout` (`target`, `waves`, `wave`,
//!   `admitKey`, `settlingSince`; see `agent/rollout.rs`), all optional. Slot entries, tokens and failures mean
//!   exactly what they meant in format 1, so a slot claimed by a v0.1.0 agent is the same
//!   claim after the upgrade: it is honoured, counted against `concurrency`, and fenced by its
//!   token (a fence or release under another token is refused, see [`crate::agent::cluster::slots`]).
//!   Migration 1 → 2: decode unchanged, then every status write (always a compare-and-swap of
//!   the whole status, [`crate::agent::cluster::slots`]) recomputes `updating` and stamps `formatVersion: 2`.
//!   A v0.1.0 agent still running during the DaemonSet roll replaces the whole status with its
//!   own types, which drops both fields again: the result is a correct format-1 status, and
//!   the next write of a current agent migrates it again. The counter writes `nodes`, `rollout`
//!   and `Complete` again on its next count (a dropped `rollout` restarts nothing: the waves
//!   are derived from the nodes again, only a running `settleTime` starts over). Also in
//!   format 2 (v0.2.0, additive, nothing to migrate): the poller's `fleetRollout`
//!   (`clusterSeed`, `withdrawn`, `withdrawnTarget`, and on a pinned channel `heldTarget`; see
//!   `agent/channel/fleet_waves.rs` and `fleet_pinned.rs`) and
//!   the conditions `WaitingForWave` and `ReleaseWithdrawn`; an agent that does not know them
//!   drops them when it rewrites the status, and the poller writes them again at its next
//!   poll.
//!
//! **`UpdateChannel` spec** — written by humans, not versioned by a marker: fields are only
//! ever added, optional, with a default that keeps the earlier meaning. Since v0.1.0:
//! `paused` (default `false`: claims as before), `resumedAt` (absent: every failure counts,
//! as before), `windows` (empty: only `window`, as before), `rollout` (absent: no waves,
//! every selected node may claim, as before) and `ignoreRollout` (default `false`: a pinned
//! version follows the channel's signed rollouts; v0.1.0 knew no such rollouts). An agent of an
//! earlier release ignores all five (it claims regardless of waves until it is replaced, so start a rollout with waves
//! after the DaemonSet roll is done): during a DaemonSet roll it may still claim on a paused channel, stays
//! paused by failures that `resumedAt` forgave, and claims only in `window` (none: at any
//! time, so a channel that moves its windows into `windows` should keep one in `window`
//! until the roll is done) until it is replaced. Neither changes the status format: the `Paused` condition keeps its
//! meaning (claims are paused) and gains the reason `PausedBySpec`.
//!
//! **Node annotations** — marker `k3os.io/update-format` (a decimal string), current
//! [`NODE_FORMAT`], written in every annotation patch of the agent:
//! - format 1 (v0.1.0; no marker): `k3os.io/update-phase`, `update-target`, `update-progress`,
//!   `update-message` (informational), `update-token` (the claim token, written before the
//!   claim) and `update-cordoned` (`"true"` while the agent's own cordon stands).
//! - format 2: format 1 plus the marker and `update-version` (the version the node booted,
//!   written when it differs, read by the fleet counter); the same keys with the same values,
//!   and the phase `WaitingForWave` (a node staged but whose wave of `spec.rollout` has not
//!   started). Migration 1 → 2: nothing to convert; the next annotation patch adds the marker,
//!   the next reconcile `update-version`. A Node without `update-version` (a v0.1.0 agent still
//!   running) is counted under version `unknown` until its agent is replaced. Also in format 2
//!   (v0.2.0, additive, nothing to migrate): the phase `StageWaiting` (staging waits for a stage
//!   window or the next quota day; not a failure) and the annotation
//!   `k3os.io/update-stage-preview` (JSON carrying its own `format`, see
//!   [`crate::agent::reconcile::thin_report`]; agents before issue 34 wrote it as
//!   `k3os.io/stage-preview`, still read, removed at the next preview).
//!
//! **Leases** (`coordination.k8s.io/v1`, agent namespace): the node liveness Lease
//! `k3os-upgrade-node-<node>`, the poller Lease `k3os-upgrade-poller-<channel>` and (new in
//! v0.2.0) the fleet counter's Lease `k3os-upgrade-fleet-<channel>`, with the
//! fields Kubernetes defines (`holderIdentity` = the node, `renewTime`,
//! `leaseDurationSeconds`, `acquireTime`, `leaseTransitions`). Unchanged since v0.1.0; their
//! version is the name prefix: a change of their meaning must use new Lease names, so agents
//! of two releases never misread each other's liveness.
//!
//! Events are written, never read back, and carry no format.

use std::collections::BTreeMap;

/// The `UpdateChannel` status format this agent writes (see the module docs).
pub const STATUS_FORMAT: u32 = 2;
/// Status format of v0.1.0, which wrote no marker.
pub const STATUS_FORMAT_V010: u32 = 1;
/// The Node annotation format this agent writes (see the module docs).
pub const NODE_FORMAT: u32 = 2;
/// Node annotation format of v0.1.0, which wrote no marker.
pub const NODE_FORMAT_V010: u32 = 1;
/// Node annotation holding `NODE_FORMAT`.
/// Node annotation keys of formats 1 and 2 (see the module docs).
pub const ANN_PHASE: &str = "k3os.io/update-phase";
pub const ANN_TARGET: &str = "k3os.io/update-target";
pub const ANN_PROGRESS: &str = "k3os.io/update-progress";
pub const ANN_MESSAGE: &str = "k3os.io/update-message";
pub const ANN_TOKEN: &str = "k3os.io/update-token";
pub const ANN_CORDONED: &str = "k3os.io/update-cordoned";
pub const ANN_FORMAT: &str = "k3os.io/update-format";
/// Node annotation (format 2): the version the node booted, for the fleet counter.
pub const ANN_VERSION: &str = "k3os.io/update-version";

/// A format this agent cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "{what} is in format {found}, newer than format {known} that this agent (k3os-ops {agent}) knows; upgrade the agent. Nothing was written to it"
    )]
    Newer {
        what: String,
        found: u64,
        known: u32,
        agent: &'static str,
    },
    #[error(
        "{what} has format marker {value}, which this agent (k3os-ops {agent}, format {known}) cannot read; nothing was written to it"
    )]
    Unreadable {
        what: String,
        value: String,
        known: u32,
        agent: &'static str,
    },
}

const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The format of an `UpdateChannel`'s status, from the raw object (before it is decoded into
/// today's types, which a newer format may not fit). No status or no marker: v0.1.0's.
pub fn status_format(what: &str, channel: &serde_json::Value) -> Result<u32, FormatError> {
    match channel.pointer("/status/formatVersion") {
        None | Some(serde_json::Value::Null) => Ok(STATUS_FORMAT_V010),
        Some(v) => match v.as_u64() {
            Some(n) => check(what, n, STATUS_FORMAT),
            None => Err(FormatError::Unreadable {
                what: what.to_string(),
                value: v.to_string(),
                known: STATUS_FORMAT,
                agent: AGENT_VERSION,
            }),
        },
    }
}

/// The format of a decoded status' marker (see [`status_format`]).
pub fn check_status(what: &str, found: Option<u64>) -> Result<u32, FormatError> {
    match found {
        None => Ok(STATUS_FORMAT_V010),
        Some(n) => check(what, n, STATUS_FORMAT),
    }
}

/// The format of a Node's `k3os.io/update-*` annotations. No marker: v0.1.0's.
pub fn node_format(what: &str, annotations: &BTreeMap<String, String>) -> Result<u32, FormatError> {
    match annotations.get(ANN_FORMAT) {
        None => Ok(NODE_FORMAT_V010),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) => check(what, n, NODE_FORMAT),
            Err(_) => Err(FormatError::Unreadable {
                what: what.to_string(),
                value: format!("'{v}'"),
                known: NODE_FORMAT,
                agent: AGENT_VERSION,
            }),
        },
    }
}

fn check(what: &str, found: u64, known: u32) -> Result<u32, FormatError> {
    match u32::try_from(found) {
        Ok(n) if n <= known => Ok(n),
        _ => Err(FormatError::Newer {
            what: what.to_string(),
            found,
            known,
            agent: AGENT_VERSION,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_markers_are_v010_and_known_ones_are_read() {
        assert_eq!(status_format("c", &json!({"spec": {}})), Ok(1));
        assert_eq!(status_format("c", &json!({"status": {"slots": []}})), Ok(1));
        assert_eq!(
            status_format("c", &json!({"status": {"formatVersion": 2}})),
            Ok(2)
        );
        assert_eq!(node_format("n", &BTreeMap::new()), Ok(1));
        let a = BTreeMap::from([(ANN_FORMAT.to_string(), "2".to_string())]);
        assert_eq!(node_format("n", &a), Ok(2));
    }

    #[test]
    fn newer_markers_are_refused_naming_both_versions() {
        let e = status_format(
            "UpdateChannel k3os-system/stable",
            &json!({"status": {"formatVersion": 3}}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("format 3") && e.contains("format 2"), "{e}");
        assert!(
            e.contains(AGENT_VERSION) && e.contains("k3os-system/stable"),
            "{e}"
        );
        let a = BTreeMap::from([(ANN_FORMAT.to_string(), "7".to_string())]);
        let e = node_format("Node n1", &a).unwrap_err().to_string();
        assert!(e.contains("format 7") && e.contains("format 2"), "{e}");
        let a = BTreeMap::from([(ANN_FORMAT.to_string(), "v3".to_string())]);
        assert!(matches!(
            node_format("Node n1", &a),
            Err(FormatError::Unreadable { .. })
        ));
        assert!(matches!(
            status_format("c", &json!({"status": {"formatVersion": "x"}})),
            Err(FormatError::Unreadable { .. })
        ));
    }
}
