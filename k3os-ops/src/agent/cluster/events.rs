//! Kubernetes Events of the agent (`events.k8s.io/v1`), one new Event per call.
//!
//! Not kube-runtime's `Recorder`: it keys its series cache by (reason, action, type, objects)
//! without the message, so a second event with the same reason but new text only bumped the
//! first one's count and `kubectl describe` kept showing the stale text.
//! Repeats of the *same* text are already suppressed by the caller (`Agent::event_once`), so
//! plain creates stay few. Each event about a channel is published twice: regarding the Node
//! (`kubectl describe node`) and regarding the UpdateChannel (`kubectl describe upchan`).
//! The channel gets one per slot claim (`SlotClaimed`), per release (`SlotReleased`, whatever
//! ended the hold; `SlotReclaimed` when another agent took it back), per failure
//! (`RolledBack`, `HealthCheckFailed`, `DrainFailed`, `ActivateFailed`, …) and when a failure
//! pauses the rollout (`ChannelPaused`).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rand::Rng;

/// The `reportingController` of every event.
pub const REPORTING_CONTROLLER: &str = "k3os.io/k3os-ops-agent";

/// Creates Events for one agent instance (`reportingInstance`: the node name).
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    instance: String,
}

/// One event to publish.
#[derive(Debug, Clone)]
pub struct Note<'a> {
    pub warning: bool,
    pub reason: &'a str,
    pub note: &'a str,
}

impl Publisher {
    pub fn new(client: Client, instance: &str) -> Self {
        Publisher {
            client,
            instance: instance.to_string(),
        }
    }

    /// Create an Event regarding `regarding` (in its namespace; cluster-scoped objects such
    /// as Nodes in `default`, as kubectl expects), with `related` as secondary object.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
        n: &Note<'_>,
    ) -> Result<(), kube::Error> {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let name = format!(
            "{}.{:016x}",
            regarding.name.as_deref().unwrap_or("object"),
            rand::thread_rng().gen::<u64>()
        );
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(n.reason.chars().take(128).collect()),
            reason: Some(n.reason.chars().take(128).collect()),
            note: Some(n.note.chars().take(1000).collect()),
            type_: Some(if n.warning { "Warning" } else { "Normal" }.to_string()),
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            reporting_controller: Some(REPORTING_CONTROLLER.to_string()),
            reporting_instance: Some(self.instance.clone()),
            regarding: Some(regarding.clone()),
            related: related.cloned(),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &ev).await.map(|_| ())
    }
}
