//! Listing UpdateChannels one by one, and which channel updates a node.
//!
//! **Decoding.** The channels are listed untyped and decoded one at a time: a malformed
//! object (e.g. `concurrency: 5000000000`, stored before the schema had a maximum) is set
//! aside as a [`BadChannel`] and reported on that channel, while the others go on (decoding
//! the list as a whole, one such object made every list fail in every agent).
//!
//! **Formats.** Before decoding, each channel's `status.formatVersion` is checked
//! ([`super::format`]): a newer format than this agent knows is set aside as a
//! [`NewerChannel`] (reported, never used nor written, not even its `Invalid` condition),
//! since today's types may misread it.
//!
//! **Precedence** ([`pick`]; an invalid channel sorting first by name must not shadow a
//! valid one). When several channels select a node:
//! 1. a channel holding a slot for the node wins (its update must finish or be released);
//! 2. otherwise only *valid* channels compete (the spec decodes and its durations, window and
//!    concurrency validate): an invalid channel never shadows a valid one;
//! 3. among them the most specific `nodeSelector` (most labels) wins, then the smallest name;
//! 4. with no valid candidate, the first invalid one by name is picked, so its problem is
//!    reported on the node.
//!
//! Every losing candidate is returned, so the caller reports the conflict.

use std::collections::BTreeMap;

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};

use super::crd::UpdateChannel;
use super::spec::Policy;

/// A channel decoded and its spec parsed, once per reconcile: what every decision and step
/// reads (it derefs to the resource).
#[derive(Debug, Clone)]
pub struct Channel {
    pub resource: UpdateChannel,
    /// The parsed spec, or the message naming the field that makes the channel invalid.
    pub policy: Result<Policy, String>,
}

impl Channel {
    pub fn new(resource: UpdateChannel) -> Channel {
        let policy = Policy::from_spec(&resource.spec);
        Channel { resource, policy }
    }

    pub fn name(&self) -> &str {
        self.resource.metadata.name.as_deref().unwrap_or_default()
    }
}

impl std::ops::Deref for Channel {
    type Target = UpdateChannel;
    fn deref(&self) -> &UpdateChannel {
        &self.resource
    }
}

/// A channel object that does not decode into [`UpdateChannel`].
#[derive(Debug, Clone)]
pub struct BadChannel {
    pub name: String,
    /// The object as read (its status and resourceVersion are what the `Invalid` condition's
    /// compare-and-swap write starts from).
    pub object: serde_json::Value,
    /// The decoding error, naming the field.
    pub error: String,
}

/// A channel whose status is in a format newer than this agent knows: set aside unread and
/// never written (see [`super::format`]).
#[derive(Debug, Clone)]
pub struct NewerChannel {
    pub name: String,
    pub error: super::format::FormatError,
}

/// The channels of a namespace, decoded one by one, sorted by name.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    pub channels: Vec<Channel>,
    pub bad: Vec<BadChannel>,
    pub newer: Vec<NewerChannel>,
}

/// The untyped API of UpdateChannels in `namespace`.
pub fn dynamic_api(client: Client, namespace: &str) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<UpdateChannel>(&());
    Api::namespaced_with(client, namespace, &ar)
}

/// Decode one listed object.
pub fn decode(obj: DynamicObject) -> Result<UpdateChannel, BadChannel> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let value = serde_json::to_value(&obj).map_err(|e| BadChannel {
        name: name.clone(),
        object: serde_json::Value::Null,
        error: e.to_string(),
    })?;
    serde_json::from_value::<UpdateChannel>(value.clone()).map_err(|e| BadChannel {
        name,
        object: value,
        error: format!("does not decode: {e}"),
    })
}

/// List the UpdateChannels of `namespace`, decoding each on its own.
pub async fn list(client: &Client, namespace: &str) -> Result<Listed, kube::Error> {
    let objs = dynamic_api(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(sort_out(namespace, objs.items))
}

/// The channel objects of `namespace` (listed or watched), decoded each on its own.
pub fn sort_out(namespace: &str, objs: Vec<DynamicObject>) -> Listed {
    let mut out = Listed::default();
    for obj in objs {
        let name = obj.metadata.name.clone().unwrap_or_default();
        let what = format!("the status of UpdateChannel {namespace}/{name}");
        if let Err(error) = super::format::status_format(&what, &obj.data) {
            out.newer.push(NewerChannel { name, error });
            continue;
        }
        match decode(obj) {
            Ok(ch) => out.channels.push(Channel::new(ch)),
            Err(bad) => out.bad.push(bad),
        }
    }
    out.channels.sort_by(|a, b| a.name().cmp(b.name()));
    out.bad.sort_by(|a, b| a.name.cmp(&b.name));
    out.newer.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The outcome of [`pick`].
#[derive(Debug, Clone)]
pub struct Picked<'a> {
    pub channel: &'a Channel,
    /// Why it won (for the conflict report).
    pub why: &'static str,
    /// Other channels selecting the node, with why each lost.
    pub losers: Vec<(String, String)>,
}

/// The channel for `node` with `labels` among `channels` (see the module docs for the rule).
pub fn pick<'a>(
    node: &str,
    channels: &'a [Channel],
    labels: &BTreeMap<String, String>,
) -> Option<Picked<'a>> {
    let holding = channels
        .iter()
        .find(|c| c.status.as_ref().is_some_and(|s| s.slot_of(node).is_some()));
    let selecting: Vec<&Channel> = channels.iter().filter(|c| c.selects(labels)).collect();
    let mut valid: Vec<&Channel> = selecting
        .iter()
        .copied()
        .filter(|c| c.policy.is_ok())
        .collect();
    valid.sort_by(|a, b| {
        b.spec
            .node_selector
            .len()
            .cmp(&a.spec.node_selector.len())
            .then_with(|| a.name().cmp(b.name()))
    });
    let (winner, why) = if let Some(h) = holding {
        (h, "it holds an update slot for this node")
    } else if let Some(v) = valid.first() {
        (
            *v,
            "the valid channel with the most specific nodeSelector (then the smallest name)",
        )
    } else {
        (*selecting.first()?, "no valid channel selects this node")
    };
    let losers = selecting
        .iter()
        .filter(|c| c.name() != winner.name())
        .map(|c| {
            let reason = match &c.policy {
                Err(e) => format!("invalid: {e}"),
                Ok(_) => format!(
                    "valid, nodeSelector of {} label(s)",
                    c.spec.node_selector.len()
                ),
            };
            (c.name().to_string(), reason)
        })
        .collect();
    Some(Picked {
        channel: winner,
        why,
        losers,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{pick, Channel};
    use crate::agent::channel::crd::UpdateChannel;

    /// The test channel `name` selecting the nodes with the labels `selector`.
    fn ch(name: &str, selector: &[(&str, &str)]) -> Channel {
        let selector: BTreeMap<String, String> = selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Channel::new(
            UpdateChannel::test()
                .name(name)
                .spec_with(|s| s.node_selector = selector)
                .build(),
        )
    }

    /// The precedence rule among valid channels: the most specific nodeSelector wins, then the
    /// smallest name.
    #[test]
    fn the_most_specific_valid_channel_wins() {
        let labels: BTreeMap<String, String> = [
            ("pool".to_string(), "edge".to_string()),
            ("zone".into(), "a".into()),
        ]
        .into();
        let chans = vec![
            ch("a-all", &[]),
            ch("b-pool", &[("pool", "edge")]),
            ch("c-pool-zone", &[("pool", "edge"), ("zone", "a")]),
            ch("d-other", &[("pool", "core")]),
        ];
        let p = pick("n1", &chans, &labels).unwrap();
        assert_eq!(
            p.channel.resource.metadata.name.as_deref(),
            Some("c-pool-zone")
        );
        let losers: Vec<&str> = p.losers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(losers, ["a-all", "b-pool"]);
        let tie = vec![ch("y", &[("pool", "edge")]), ch("x", &[("pool", "edge")])];
        let p = pick("n1", &tie, &labels).unwrap();
        assert_eq!(p.channel.resource.metadata.name.as_deref(), Some("x"));
    }
}
