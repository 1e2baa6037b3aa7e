//! The enrolment allow-list: which node keys may report, and for which site.
//!
//! A text file, one node per line: `<node id> <site>` (64 hex digits, a space, a site name);
//! blank lines and lines starting with `#` are ignored. A node id may appear once.

use std::collections::HashMap;

use crate::report::{valid_site, NodeId, Report};

/// The nodes a collector accepts reports from, each bound to its site.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    nodes: HashMap<NodeId, String>,
}

/// A line of an allow-list that is not `<node id> <site>`, or a node listed twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allow-list line {line}: {what}")]
pub struct AllowListError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong, with what was found.
    pub what: String,
}

/// Why an enrolment check refused a verified report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The node key is not enrolled at all (e.g. a site made up by whoever sent it).
    #[error("node {node} is not enrolled (report claims site {site:?})")]
    UnknownNode {
        /// The node the report names.
        node: NodeId,
        /// The site it claims, escaped.
        site: String,
    },
    /// The node is enrolled for another site than the report claims.
    #[error("node {node} is enrolled for site {enrolled:?}, the report claims site {claimed:?}")]
    WrongSite {
        /// The node.
        node: NodeId,
        /// Its enrolled site.
        enrolled: String,
        /// The site the report claims, escaped.
        claimed: String,
    },
}

impl AllowList {
    /// Parse an allow-list file's text.
    pub fn parse(text: &str) -> Result<AllowList, AllowListError> {
        let mut nodes = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |what: String| AllowListError { line: i + 1, what };
            let mut words = line.split_whitespace();
            let (Some(id), Some(site), None) = (words.next(), words.next(), words.next()) else {
                return Err(err(format!(
                    "expected `<node id> <site>`, found {:?}",
                    line.escape_debug().to_string()
                )));
            };
            let node = NodeId::parse(id)
                .filter(|n| n.key().is_some())
                .ok_or_else(|| {
                    err(format!(
                        "{:?} is not a node id (64 hex digits of an ed25519 public key)",
                        id.escape_debug().to_string()
                    ))
                })?;
            if !valid_site(site) {
                return Err(err(format!(
                    "{:?} is not a site name (1-63 of a-z 0-9 . _ -)",
                    site.escape_debug().to_string()
                )));
            }
            if let Some(first) = nodes.insert(node, site.to_string()) {
                return Err(err(format!(
                    "node {node} is listed again (first for site {first:?})"
                )));
            }
        }
        Ok(AllowList { nodes })
    }

    /// Enrol `node` for `site` (replacing an earlier site).
    pub fn enrol(&mut self, node: NodeId, site: &str) {
        self.nodes.insert(node, site.to_string());
    }

    /// The site `node` is enrolled for.
    pub fn site_of(&self, node: &NodeId) -> Option<&str> {
        self.nodes.get(node).map(String::as_str)
    }

    /// Number of enrolled nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node is enrolled.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether `report` (already verified) comes from an enrolled node for its own site.
    pub fn check(&self, report: &Report) -> Result<(), Refusal> {
        match self.nodes.get(&report.node) {
            None => Err(Refusal::UnknownNode {
                node: report.node,
                site: report.site.escape_debug().to_string(),
            }),
            Some(s) if *s != report.site => Err(Refusal::WrongSite {
                node: report.node,
                enrolled: s.clone(),
                claimed: report.site.escape_debug().to_string(),
            }),
            Some(_) => Ok(()),
        }
    }
}
