//! Equality-based label selectors (`k=v`, `k!=v`, `k`, `!k`), as the channel's
//! `spec.drain.podSelector` and `spec.blockingPodSelector` write them. Pure.

use std::collections::BTreeMap;

/// A text that is not an equality-based label selector (the text, unescaped: the caller names
/// the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a label selector (k=v, k!=v, k, !k joined by commas)")]
pub struct SelectorError(pub String);

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed equality-based label selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<Req>);

impl Selector {
    /// Parse `k=v`, `k==v`, `k!=v`, `k`, `!k` joined by commas; an empty text selects all.
    pub fn parse(s: &str) -> Result<Selector, SelectorError> {
        let bad = || SelectorError(s.to_string());
        let valid = |k: &str| {
            !k.is_empty() && !k.contains(|c: char| c.is_whitespace() || c == '=' || c == '!')
        };
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else {
                Req::Exists(part.into())
            };
            let key = match &req {
                Req::Eq(k, _) | Req::Ne(k, _) | Req::Exists(k) | Req::NotExists(k) => k,
            };
            if !valid(key) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::Ne(k, v) => labels.get(k) != Some(v),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }
}
