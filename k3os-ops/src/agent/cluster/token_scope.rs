//! Whether the agent's credentials are scoped to its node: the start-up check behind the
//! warning and the `k3os_ops_token_node_bound` metric.
//!
//! deploy/node-scope.yaml's ValidatingAdmissionPolicies let the agent write only its own Node,
//! Lease and slot, judged by the node name the API server puts into the user info of a token
//! the kubelet projected into the agent's pod ([`NODE_NAME_EXTRA`], Kubernetes >= 1.30). The
//! agent asks the API server what it sees (a SelfSubjectReview, `authentication.k8s.io/v1`)
//! rather than decoding its token itself: that is exactly the user info the policies judge,
//! whatever the credential (projected token, KUBECONFIG). This module owns that question
//! ([`check`]) and what its answer means ([`scope_of`], [`TokenScope::warning`], pure).

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, Client};

/// The user-info extra key in which the API server names the node of a pod-bound token.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// What the API server says about the node of the agent's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenScope {
    /// Bound to a pod on this agent's node: the node-scoped policies can apply.
    Node,
    /// Bound to a pod on another node (the pod's `NODE_NAME` and its token disagree).
    OtherNode(String),
    /// No node name: a plain or Secret-based token, or a cluster older than 1.30.
    Unbound,
    /// The API server did not answer the SelfSubjectReview (e.g. a cluster older than 1.28).
    Unknown(String),
}

impl TokenScope {
    /// Whether the credentials are bound to this agent's node (the metric's 1).
    pub fn is_node(&self) -> bool {
        *self == TokenScope::Node
    }

    /// The start-up warning for `node`'s agent, `None` when its token is bound to `node`.
    pub fn warning(&self, node: &str) -> Option<String> {
        let consequence = "deploy/node-scope.yaml's policies refuse its writes where they are \
                           installed; without them it works with rbac.yaml's cluster-wide rights";
        match self {
            TokenScope::Node => None,
            TokenScope::OtherNode(other) => Some(format!(
                "the agent of node {node:?} holds a token bound to a pod on node {other:?} \
                 (check NODE_NAME): {consequence}"
            )),
            TokenScope::Unbound => Some(format!(
                "the agent of node {node:?} holds a token that carries no node name \
                 ({NODE_NAME_EXTRA}; Kubernetes < 1.30, or not the token the kubelet projects \
                 into the pod): {consequence}"
            )),
            TokenScope::Unknown(why) => Some(format!(
                "the agent of node {node:?} could not ask the API server whether its token \
                 carries a node name (SelfSubjectReview: {why}): {consequence}"
            )),
        }
    }
}

/// What the user info's `extra` (as the API server reports it) says about `node`.
pub fn scope_of(extra: Option<&BTreeMap<String, Vec<String>>>, node: &str) -> TokenScope {
    match extra
        .and_then(|e| e.get(NODE_NAME_EXTRA))
        .map(Vec::as_slice)
    {
        Some([n]) if n == node => TokenScope::Node,
        Some([n]) => TokenScope::OtherNode(n.clone()),
        _ => TokenScope::Unbound,
    }
}

/// Ask the API server who this client is (SelfSubjectReview) and judge it for `node`.
pub async fn check(client: &Client, node: &str) -> TokenScope {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    match api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => scope_of(
            r.status
                .as_ref()
                .and_then(|s| s.user_info.as_ref())
                .and_then(|u| u.extra.as_ref()),
            node,
        ),
        Err(e) => TokenScope::Unknown(super::client::kube_message(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_pod_bound_token_on_this_node_is_scoped() {
        let e = extra(&[
            (NODE_NAME_EXTRA, &["node-a"]),
            ("authentication.kubernetes.io/pod-name", &["agent-x"]),
        ]);
        assert_eq!(scope_of(Some(&e), "node-a"), TokenScope::Node);
        assert!(scope_of(Some(&e), "node-a").is_node());
        assert_eq!(scope_of(Some(&e), "node-a").warning("node-a"), None);
    }

    #[test]
    fn a_token_of_another_node_is_named() {
        let e = extra(&[(NODE_NAME_EXTRA, &["node-b"])]);
        let s = scope_of(Some(&e), "node-a");
        assert_eq!(s, TokenScope::OtherNode("node-b".into()));
        assert!(!s.is_node());
        let w = s.warning("node-a").unwrap();
        assert!(w.contains("\"node-a\"") && w.contains("\"node-b\""), "{w}");
    }

    #[test]
    fn no_node_name_is_unbound_and_warned() {
        for e in [
            None,
            Some(extra(&[])),
            Some(extra(&[(NODE_NAME_EXTRA, &[])])),
            Some(extra(&[(NODE_NAME_EXTRA, &["node-a", "node-b"])])),
        ] {
            let s = scope_of(e.as_ref(), "node-a");
            assert_eq!(s, TokenScope::Unbound, "{e:?}");
            let w = s.warning("node-a").unwrap();
            assert!(
                w.contains(NODE_NAME_EXTRA) && w.contains("node-scope.yaml"),
                "{w}"
            );
        }
    }

    #[test]
    fn an_unanswered_review_is_warned_with_its_reason() {
        let w = TokenScope::Unknown("404 Not Found".into())
            .warning("node-a")
            .unwrap();
        assert!(w.contains("SelfSubjectReview: 404 Not Found"), "{w}");
    }

    #[test]
    fn a_node_name_with_control_characters_is_escaped_in_the_warning() {
        let e = extra(&[(NODE_NAME_EXTRA, &["evil\u{1b}[2J"])]);
        let w = scope_of(Some(&e), "node-a").warning("node-a").unwrap();
        assert!(!w.contains('\u{1b}'), "{w}");
    }
}
