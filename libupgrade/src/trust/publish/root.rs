//! The channel's root: its first version and each rotation, each written as one
//! [`Publish`] transaction (`N.root.json`, then `root.json`).

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Utc};

use super::{publish_err, signers_for, verified, Publish, RoleSpec, SigningKey, VerifyingKey};
use crate::trust::meta::{Envelope, Key, Role, RoleKeys, Root, SPEC_VERSION};
use crate::trust::TrustError;

fn build_root(
    version: u64,
    roles: &BTreeMap<Role, RoleSpec>,
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    let mut keys = BTreeMap::new();
    let mut out = BTreeMap::new();
    for role in Role::ALL {
        let spec = roles
            .get(&role)
            .ok_or_else(|| publish_err("root", format!("no keys given for the {role} role")))?;
        let n = spec.keys.len() as u32;
        if spec.threshold == 0 || spec.threshold > n {
            return Err(publish_err(
                "root",
                format!(
                    "{role} threshold {} must be between 1 and its {n} key(s)",
                    spec.threshold
                ),
            ));
        }
        let mut ids = Vec::new();
        for vk in &spec.keys {
            let k = Key::ed25519(vk);
            let id = k.id();
            if !ids.contains(&id) {
                ids.push(id.clone());
            }
            keys.insert(id, k);
        }
        out.insert(
            role,
            RoleKeys {
                keyids: ids,
                threshold: spec.threshold,
            },
        );
    }
    Ok(Root {
        type_: "root".into(),
        spec_version: SPEC_VERSION.into(),
        consistent_snapshot: false,
        version,
        expires,
        keys,
        roles: out,
    })
}

/// Write root version 1 (`1.root.json` and `root.json`), signed by `signers` (a threshold of
/// its root keys). Refuses a channel that already has a root.
pub fn init_root(
    dir: &Path,
    roles: &BTreeMap<Role, RoleSpec>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    if dir.join(Role::Root.file()).exists() || dir.join("1.root.json").exists() {
        return Err(publish_err(
            dir.join(Role::Root.file()).display().to_string(),
            "the channel already has a root; use `k3os-ops release root rotate`",
        ));
    }
    let root = build_root(1, roles, expires)?;
    let mut p = Publish::empty(dir);
    let env = Envelope::sign(&root, &signers_for(&[&root], Role::Root, signers));
    env.check_role(
        &root,
        Role::Root,
        &format!("{}: new root version 1", p.path_of("1.root.json")),
    )?;
    let bytes = env.to_bytes();
    p.stage("1.root.json", bytes.clone());
    p.stage(Role::Root.file(), bytes);
    p.commit()?;
    Ok(root)
}

/// Publish root N+1: `changes` replace those roles' keys (others keep theirs); it is signed by
/// every signer that is a root key of root N or N+1, and must carry a threshold of both.
pub fn rotate_root(
    dir: &Path,
    changes: &BTreeMap<Role, RoleSpec>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    let p = Publish::begin(dir)?;
    let new = stage_rotation(p, changes, signers, expires)?;
    Ok(new)
}

/// [`rotate_root`] in the transaction `p`, committed.
fn stage_rotation(
    mut p: Publish,
    changes: &BTreeMap<Role, RoleSpec>,
    signers: &[SigningKey],
    expires: DateTime<Utc>,
) -> Result<Root, TrustError> {
    let old = verified(&p)?.root.clone();
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
        let spec = match changes.get(&role) {
            Some(s) => s.clone(),
            None => {
                let rk = &old.roles[&role];
                let keys = rk
                    .keyids
                    .iter()
                    .filter_map(|id| old.keys.get(id))
                    .filter_map(|k| {
                        let raw: [u8; 32] = hex::decode(&k.keyval.public).ok()?.try_into().ok()?;
                        VerifyingKey::from_bytes(&raw).ok()
                    })
                    .collect();
                RoleSpec {
                    keys,
                    threshold: rk.threshold,
                }
            }
        };
        roles.insert(role, spec);
    }
    let new = build_root(old.version + 1, &roles, expires)?;
    let env = Envelope::sign(&new, &signers_for(&[&old, &new], Role::Root, signers));
    let name = format!("{}.root.json", new.version);
    let what = format!("{}: new root version {}", p.path_of(&name), new.version);
    env.check_role(
        &old,
        Role::Root,
        &format!("{what} (against root {})", old.version),
    )?;
    env.check_role(&new, Role::Root, &what)?;
    let bytes = env.to_bytes();
    p.stage(&name, bytes.clone());
    p.stage(Role::Root.file(), bytes);
    p.commit()?;
    Ok(new)
}
