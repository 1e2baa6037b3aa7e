//! One public path per type: a struct, enum, trait, union or type alias of a crate is named
//! from outside the crate by exactly one path. Where a type is public in its own module and
//! also re-exported (`pub mod manifest` holding `pub struct Manifest`, and `pub use
//! manifest::Manifest` at the root), readers and docs meet two names for one thing.
//!
//! [`public_paths`] walks a crate's module tree from its root file as rustc would (`mod x;` is
//! `x.rs` or `x/mod.rs`; inline modules), keeps what is reachable through `pub` modules only,
//! and follows `pub use` chains (globs included) to the defining item. Items under
//! `#[cfg(test)]` are left out; re-exports of other crates' types are not this crate's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{is_cfg_test, leaves};

/// Where a type is defined: its module path (below the crate) and name.
pub type Def = (Vec<String>, String);

/// One module as read: its types, its re-exports and its child modules.
#[derive(Default, Debug)]
struct Module {
    public: bool,
    /// Public types defined here.
    types: BTreeSet<String>,
    /// `pub use` leaves: exported name → the path as written (segments), or a glob (`*`).
    uses: Vec<(String, Vec<String>)>,
}

/// The crate's modules, keyed by path (the root is `[]`).
type Tree = BTreeMap<Vec<String>, Module>;

fn is_pub(v: &syn::Visibility) -> bool {
    matches!(v, syn::Visibility::Public(_))
}

/// Read the module at `path` (its items), whose file is `file` (for `mod x;` children).
fn read_items(
    tree: &mut Tree,
    path: Vec<String>,
    public: bool,
    items: &[syn::Item],
    dir: &Path,
) -> Result<(), String> {
    let mut m = Module {
        public,
        ..Default::default()
    };
    for item in items {
        let (attrs, vis, name) = match item {
            syn::Item::Struct(i) => (&i.attrs, &i.vis, Some(&i.ident)),
            syn::Item::Enum(i) => (&i.attrs, &i.vis, Some(&i.ident)),
            syn::Item::Trait(i) => (&i.attrs, &i.vis, Some(&i.ident)),
            syn::Item::Union(i) => (&i.attrs, &i.vis, Some(&i.ident)),
            syn::Item::Type(i) => (&i.attrs, &i.vis, Some(&i.ident)),
            syn::Item::Use(i) => (&i.attrs, &i.vis, None),
            syn::Item::Mod(i) => (&i.attrs, &i.vis, None),
            _ => continue,
        };
        if is_cfg_test(attrs) {
            continue;
        }
        match item {
            syn::Item::Use(u) if is_pub(vis) => leaves(&mut Vec::new(), &u.tree, &mut m.uses),
            syn::Item::Mod(md) => {
                let mut child = path.clone();
                child.push(md.ident.to_string());
                let child_public = public && is_pub(vis);
                match &md.content {
                    Some((_, inner)) => read_items(
                        tree,
                        child,
                        child_public,
                        inner,
                        &dir.join(md.ident.to_string()),
                    )?,
                    None => {
                        read_file_module(tree, child, child_public, dir, &md.ident.to_string())?
                    }
                }
            }
            _ if is_pub(vis) => {
                if let Some(n) = name {
                    m.types.insert(n.to_string());
                }
            }
            _ => {}
        }
    }
    tree.insert(path, m);
    Ok(())
}

fn read_file_module(
    tree: &mut Tree,
    path: Vec<String>,
    public: bool,
    dir: &Path,
    name: &str,
) -> Result<(), String> {
    let flat = dir.join(format!("{name}.rs"));
    let (file, child_dir): (PathBuf, PathBuf) = if flat.is_file() {
        (flat, dir.join(name))
    } else {
        (dir.join(name).join("mod.rs"), dir.join(name))
    };
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    read_items(tree, path, public, &parsed.items, &child_dir)
}

/// Resolve `written` (a `use` path in module `at`) to a module path of this crate, or `None`
/// when it leaves the crate.
fn resolve_module(tree: &Tree, at: &[String], written: &[String]) -> Option<Vec<String>> {
    let mut cur: Vec<String> = at.to_vec();
    let mut rest = written;
    match written.first().map(String::as_str) {
        Some("crate") => {
            cur.clear();
            rest = &written[1..];
        }
        Some("self") | Some("super") => {}
        // A bare first segment: a child module of `at`, else another crate.
        Some(first) => {
            let mut child = at.to_vec();
            child.push(first.to_string());
            if !tree.contains_key(&child) {
                return None;
            }
        }
        None => return Some(cur),
    }
    for s in rest {
        match s.as_str() {
            "self" => {}
            "super" => {
                cur.pop()?;
            }
            _ => cur.push(s.clone()),
        }
    }
    tree.contains_key(&cur).then_some(cur)
}

/// The definition a name `name` in module `m` stands for, following re-exports.
fn definition(tree: &Tree, m: &[String], name: &str, depth: usize) -> Option<Def> {
    if depth > 16 {
        return None;
    }
    let module = tree.get(m)?;
    if module.types.contains(name) {
        return Some((m.to_vec(), name.to_string()));
    }
    for (exported, written) in &module.uses {
        if exported == name {
            let (last, dir) = written.split_last()?;
            let target = resolve_module(tree, m, dir)?;
            return definition(tree, &target, last, depth + 1);
        }
        if exported == "*" {
            let target = resolve_module(tree, m, written)?;
            if let Some(d) = definition(tree, &target, name, depth + 1) {
                return Some(d);
            }
        }
    }
    None
}

/// Every public path of every type of the crate whose root file is `root` (`src/lib.rs`),
/// grouped by definition.
pub fn public_paths(root: &Path) -> Result<BTreeMap<Def, BTreeSet<String>>, String> {
    let text = std::fs::read_to_string(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut tree = Tree::new();
    let dir = root.parent().unwrap_or(Path::new("."));
    read_items(&mut tree, Vec::new(), true, &parsed.items, dir)?;
    let mut out: BTreeMap<Def, BTreeSet<String>> = BTreeMap::new();
    let show = |m: &[String], n: &str| {
        let mut p = m.to_vec();
        p.push(n.to_string());
        p.join("::")
    };
    for (path, module) in tree.iter().filter(|(_, m)| m.public) {
        for t in &module.types {
            out.entry((path.clone(), t.clone()))
                .or_default()
                .insert(show(path, t));
        }
        for (exported, written) in &module.uses {
            let names: Vec<String> = if exported == "*" {
                let Some(target) = resolve_module(&tree, path, written) else {
                    continue;
                };
                tree[&target].types.iter().cloned().collect()
            } else {
                vec![exported.clone()]
            };
            for n in names {
                if let Some(def) = definition(&tree, path, &n, 0) {
                    out.entry(def).or_default().insert(show(path, &n));
                }
            }
        }
    }
    Ok(out)
}

/// The types of `paths` named by more than one public path, as messages naming the crate.
pub fn doubled(krate: &str, paths: &BTreeMap<Def, BTreeSet<String>>) -> Vec<String> {
    paths
        .iter()
        .filter(|(_, ps)| ps.len() > 1)
        .map(|((m, n), ps)| {
            let shown: Vec<String> = ps.iter().map(|p| format!("{krate}::{p}")).collect();
            format!(
                "{krate}: type {n} (defined in {krate}::{}) has {} public paths: {}; keep one \
                 (a private module with a `pub use`, or a public module without one)",
                if m.is_empty() {
                    "<root>".into()
                } else {
                    m.join("::")
                },
                ps.len(),
                shown.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, t) in files {
            let f = d.path().join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, t).unwrap();
        }
        d
    }

    #[test]
    fn a_type_public_in_its_module_and_reexported_has_two_paths() {
        let d = krate(&[
            ("lib.rs", "pub mod manifest;\nmod stage;\npub use manifest::Manifest;\npub use stage::Release;\n"),
            ("manifest.rs", "pub struct Manifest;\n#[cfg(test)] pub struct Fixture;\n"),
            ("stage/mod.rs", "mod plan;\npub use plan::*;\n"),
            ("stage/plan.rs", "pub struct Release;\npub(crate) struct Hidden;\n"),
        ]);
        let paths = public_paths(&d.path().join("lib.rs")).unwrap();
        let e = doubled("demo", &paths);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("type Manifest"), "{e:?}");
        assert!(
            e[0].contains("demo::Manifest, demo::manifest::Manifest"),
            "{e:?}"
        );
        let release = &paths[&(vec!["stage".into(), "plan".into()], "Release".into())];
        assert_eq!(release.iter().collect::<Vec<_>>(), ["Release"]);
    }

    #[test]
    fn other_crates_types_and_private_modules_do_not_count() {
        let d = krate(&[(
            "lib.rs",
            "pub use bootconfig::Slot;\nmod inner { pub struct A; }\npub use inner::A as B;\n",
        )]);
        let paths = public_paths(&d.path().join("lib.rs")).unwrap();
        assert!(doubled("demo", &paths).is_empty(), "{paths:?}");
        assert_eq!(paths.len(), 1);
    }
}
