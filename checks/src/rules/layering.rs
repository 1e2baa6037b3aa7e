//! The agent's layering (`k3os-ops/src/agent/mod.rs`): its layers are ordered, and a layer
//! uses only the layers below it and the shared modules. A shared module may use a layer (the
//! error renderer names the cluster's and the host's errors) only where that layer does not
//! lead back to it: nothing the agent does goes round in a circle.
//! [`imports`] reads which top-level agent modules one file names (in `use` trees and in paths,
//! `crate::agent::…` and `super::…` alike; `#[cfg(test)]` items aside), and [`breaks`] judges
//! those edges against [`LAYERS`] and [`SHARED`].

use std::collections::BTreeSet;

use syn::visit::Visit;

use super::{is_cfg_test, leaves};

/// The agent's layers, top to bottom: each may use those after it.
pub const LAYERS: &[&str] = &[
    "run",
    "fleet",
    "reconcile",
    "context",
    "cluster",
    "host",
    "channel",
];
/// Modules every layer may use.
pub const SHARED: &[&str] = &["errors", "metrics", "phase", "cooldown"];
/// Modules outside the rule: the test facade (it re-exports from every layer) and the deploy
/// manifests' tests.
pub const OUTSIDE: &[&str] = &["testing", "deploy_tests"];

/// The top-level agent modules that the file at `rel` (relative to the agent folder, e.g.
/// `cluster/drain.rs`) names, other than its own; `Err` when it does not parse.
pub fn imports(rel: &str, text: &str) -> Result<BTreeSet<String>, String> {
    let file = syn::parse_file(text).map_err(|e| format!("{rel}: does not parse: {e}"))?;
    let mut module: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    let own = module.first().cloned().unwrap_or_default();
    let mut v = Names {
        module,
        found: BTreeSet::new(),
    };
    v.visit_file(&file);
    v.found.remove(&own);
    Ok(v.found)
}

struct Names {
    /// The module being read, below `agent` (`["cluster", "drain"]`).
    module: Vec<String>,
    found: BTreeSet<String>,
}

impl Names {
    /// Record the agent module that `segments` (a path as written) starts in, if any.
    fn note(&mut self, segments: &[String]) {
        let mut at: Vec<String> = self.module.clone();
        let mut rest = segments;
        match segments.first().map(String::as_str) {
            Some("crate") => {
                if segments.get(1).map(String::as_str) != Some("agent") {
                    return;
                }
                at.clear();
                rest = &segments[2..];
            }
            Some("super") | Some("self") => {
                while let Some(s) = rest.first() {
                    match s.as_str() {
                        "super" => {
                            if at.pop().is_none() {
                                return; // above the agent: not ours to judge
                            }
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            _ => return,
        }
        let top = at.first().or(rest.first());
        if let Some(t) = top {
            self.found.insert(t.clone());
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(m) => &m.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        syn::visit::visit_item(self, i);
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut found = Vec::new();
        leaves(&mut Vec::new(), &u.tree, &mut found);
        for (_, path) in found {
            self.note(&path);
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 {
            self.note(&segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// Whether module `from` may use module `to` by the order alone (both top-level agent
/// modules); a shared module's use of a layer is judged by [`breaks`], which sees every edge.
pub fn allowed(from: &str, to: &str) -> bool {
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    if from == to || OUTSIDE.contains(&from) || SHARED.contains(&to) {
        return true;
    }
    match (rank(from), rank(to)) {
        (Some(f), Some(t)) => t > f,
        // A module in no layer is not in the written layering.
        _ => false,
    }
}

/// The edges of `edges` (file, from, to) that break the layering, as messages: a use against
/// the order, and a shared module's use of a layer that leads back to that shared module.
pub fn breaks(edges: &[(String, String, String)]) -> Vec<String> {
    let leads_to = |start: &str, goal: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start.to_string()];
        while let Some(m) = todo.pop() {
            if m == goal {
                return true;
            }
            if seen.insert(m.clone()) {
                todo.extend(edges.iter().filter(|e| e.1 == m).map(|e| e.2.clone()));
            }
        }
        false
    };
    edges
        .iter()
        .filter(|(_, from, to)| {
            if SHARED.contains(&from.as_str()) && !SHARED.contains(&to.as_str()) {
                leads_to(to, from)
            } else {
                !allowed(from, to)
            }
        })
        .map(|(file, from, to)| {
            format!(
                "k3os-ops/src/agent/{file}: `{from}` uses `{to}`, which the layering in \
                 agent/mod.rs does not allow (layers top to bottom: {}; shared: {}; a shared \
                 module uses no layer that leads back to it)",
                LAYERS.join(", "),
                SHARED.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(rel: &str, text: &str) -> Vec<String> {
        imports(rel, text).unwrap().into_iter().collect()
    }

    #[test]
    fn use_trees_paths_and_super_are_resolved() {
        let text = "use crate::agent::{host::ops::NodeOps, channel::spec};\n\
                    use super::super::context::Agent;\n\
                    use super::drain;\n\
                    fn f() { crate::agent::metrics::inc(); }\n\
                    #[cfg(test)] mod tests { use crate::agent::run::x; }\n";
        assert_eq!(
            names("cluster/slots/mod.rs", text),
            ["channel", "context", "host", "metrics"]
        );
    }

    #[test]
    fn the_written_layering_is_what_is_judged() {
        assert!(allowed("reconcile", "context"));
        assert!(allowed("context", "cluster"));
        assert!(allowed("host", "errors"));
        assert!(!allowed("channel", "host"));
        assert!(!allowed("cluster", "context"));
        assert!(allowed("testing", "run"));
        let edge = |f: &str, a: &str, b: &str| (f.to_string(), a.to_string(), b.to_string());
        let e = breaks(&[edge("channel/thin.rs", "channel", "host")]);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("`channel` uses `host`"), "{e:?}");
        // A shared module may name a lower layer's types, unless that layer uses it back.
        let fine = [
            edge("errors.rs", "errors", "cluster"),
            edge("reconcile/x.rs", "reconcile", "errors"),
        ];
        assert!(breaks(&fine).is_empty());
        let circle = [
            edge("errors.rs", "errors", "cluster"),
            edge("cluster/y.rs", "cluster", "host"),
            edge("host/z.rs", "host", "errors"),
        ];
        let e = breaks(&circle);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("`errors` uses `cluster`"), "{e:?}");
    }
}
