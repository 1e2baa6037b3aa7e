//! The code rules the project writes down, as checks that fail CI when broken: no non-test
//! source file over [`MAX_FILE_LINES`] ([`sizes`]), the agent's layering as its module docs
//! state it ([`layering`]), and one public path per type in each crate ([`paths`]). The
//! function-length rule is clippy's `too_many_lines` (threshold in `clippy.toml`), not here.
//!
//! Each rule is a pure function over file texts and paths, unit-tested on samples here; the
//! test in `tests/code_rules.rs` runs them over the repository's tracked files. Rust is read
//! with `syn` (a parse, not a regex: `use` trees with braces and `self`, nested modules and
//! `#[cfg(test)]` items are what text matching gets wrong).

pub mod layering;
pub mod paths;
pub mod sizes;

pub use sizes::MAX_FILE_LINES;

/// Whether an item is compiled only for unit tests (`#[cfg(test)]`): the rules leave it out.
pub(crate) fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The leaves of a `use` tree below `prefix`: each name as it is bound here (a rename's new
/// name, `*` for a glob) with the path it stands for (a glob's: its module).
pub(crate) fn leaves(
    prefix: &mut Vec<String>,
    tree: &syn::UseTree,
    out: &mut Vec<(String, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            leaves(prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut full = prefix.clone();
            full.push(n.ident.to_string());
            out.push((n.ident.to_string(), full));
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            full.push(r.ident.to_string());
            out.push((r.rename.to_string(), full));
        }
        syn::UseTree::Glob(_) => out.push(("*".into(), prefix.clone())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                leaves(prefix, t, out);
            }
        }
    }
}
