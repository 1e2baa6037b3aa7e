//! The TUF 1.0 metadata documents of a channel (root, targets, snapshot, timestamp), their
//! canonical JSON, key ids, and the signature threshold check. Pure: bytes in, verdicts out.
//!
//! Signatures are checked over the canonical JSON (OLPC, via `olpc-cjson`) of the `signed`
//! object *as received*, never of a re-serialised struct: fields this build does not know
//! are kept in what is verified, and documents written by other TUF tools (tuftool) check.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

use super::TrustError;

/// The TUF specification version this build writes; it reads any 1.x.
pub const SPEC_VERSION: &str = "1.0.0";

/// The four top-level roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The root of trust: names the keys and threshold of every role, itself included.
    Root,
    /// Lists the targets (the channel's release manifests) with their lengths and hashes.
    Targets,
    /// Pins the version (and optionally length and hashes) of `targets.json`.
    Snapshot,
    /// Pins the current `snapshot.json`; short-lived and re-signed often, so that a frozen
    /// channel shows.
    Timestamp,
}

impl Role {
    /// Every top-level role.
    pub const ALL: [Role; 4] = [Role::Root, Role::Targets, Role::Snapshot, Role::Timestamp];

    /// The role's name as TUF writes it (`_type`, the keys of root's `roles`): `root`, ….
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Root => "root",
            Role::Targets => "targets",
            Role::Snapshot => "snapshot",
            Role::Timestamp => "timestamp",
        }
    }

    /// The file the role's current metadata is published as.
    pub fn file(self) -> &'static str {
        match self {
            Role::Root => "root.json",
            Role::Targets => "targets.json",
            Role::Snapshot => "snapshot.json",
            Role::Timestamp => "timestamp.json",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Canonical JSON (OLPC) of a value.
pub fn canonical<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut buf, olpc_cjson::CanonicalFormatter::new());
    v.serialize(&mut ser).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// A public key as TUF writes it: `{"keytype":"ed25519","scheme":"ed25519","keyval":{"public":HEX}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// The key type; only `ed25519` keys are checked, others' signatures count for nothing.
    pub keytype: String,
    /// The signature scheme; only `ed25519` is checked.
    pub scheme: String,
    /// The public key material.
    pub keyval: KeyVal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
/// A key's `keyval` object: the public half of the key.
pub struct KeyVal {
    /// The public key, lower-case hex (32 bytes for ed25519).
    pub public: String,
}

impl Key {
    /// The TUF form of an ed25519 public key (`keytype` and `scheme` `ed25519`, hex `public`).
    pub fn ed25519(vk: &VerifyingKey) -> Key {
        Key {
            keytype: "ed25519".into(),
            scheme: "ed25519".into(),
            keyval: KeyVal {
                public: hex::encode(vk.as_bytes()),
            },
        }
    }

    /// The key id: hex sha256 of the key's canonical JSON (TUF 1.0, 4.2).
    pub fn id(&self) -> String {
        let bytes = canonical(self).expect("a key serialises");
        hex::encode(Sha256::digest(bytes))
    }

    /// The ed25519 key, if this is one this build can check.
    fn verifying_key(&self) -> Option<VerifyingKey> {
        if self.keytype != "ed25519" || self.scheme != "ed25519" {
            return None;
        }
        let raw: [u8; 32] = hex::decode(&self.keyval.public).ok()?.try_into().ok()?;
        VerifyingKey::from_bytes(&raw).ok()
    }
}

/// Which keys sign for a role and how many must.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleKeys {
    /// The ids ([`Key::id`]) of the keys whose signatures count for the role.
    pub keyids: Vec<String>,
    /// How many distinct keys of `keyids` must sign a document of the role (0 is taken as 1).
    pub threshold: u32,
}

/// `root.json`'s `signed` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Root {
    /// The document's `_type`: `root`.
    #[serde(rename = "_type")]
    pub type_: String,
    /// The TUF specification version the publisher wrote it for (any 1.x is read).
    pub spec_version: String,
    /// Whether the channel publishes consistent snapshots (`N.targets.json`, …); this project
    /// writes false and reads the plain file names either way.
    #[serde(default)]
    pub consistent_snapshot: bool,
    /// The root's version: 1 for the first, each rotation publishes exactly the next.
    pub version: u64,
    /// When this root stops being trusted (UTC).
    pub expires: DateTime<Utc>,
    /// Every key any role uses, by key id ([`Key::id`]).
    pub keys: BTreeMap<String, Key>,
    /// The keys and threshold of each top-level role.
    pub roles: BTreeMap<Role, RoleKeys>,
}

/// A file's length and hashes (`targets` entries, `meta` entries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// The file's length in bytes.
    pub length: u64,
    /// The file's lower-case hex digests by TUF algorithm name (`sha256`, `sha512`); every one
    /// must match.
    pub hashes: BTreeMap<String, String>,
    /// What the target says about its release; `None` for a target that is not a release
    /// manifest (such a target is never picked nor listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<TargetCustom>,
}

impl FileMeta {
    /// The hex sha256 the entry lists, if it lists one.
    pub fn sha256(&self) -> Option<&str> {
        self.hashes.get("sha256").map(String::as_str)
    }
}

/// What a target (a release's `manifest.json`) says about its release, for picking one
/// without fetching every manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetCustom {
    /// The release's version string, as its manifest names it.
    pub version: String,
    /// The release's generation, as its manifest names it (the newest is picked by it).
    pub generation: u64,
    /// The CPU architecture the release is built for.
    pub arch: crate::manifest::Arch,
    /// How the release is rolled out across the fleet ([`crate::rollout`]); absent: to every
    /// node at once. Skipped when absent, so targets without rollouts read and sign as before;
    /// a node from before this field ignores it (and takes the release at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::Rollout>,
}

/// `targets.json`'s `signed` object: target path → length, hashes, custom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Targets {
    /// The document's `_type`: `targets`.
    #[serde(rename = "_type")]
    pub type_: String,
    /// The TUF specification version the publisher wrote it for (any 1.x is read).
    pub spec_version: String,
    /// The targets version; a node refuses one lower than its trusted snapshot names.
    pub version: u64,
    /// When this targets document stops being trusted (UTC).
    pub expires: DateTime<Utc>,
    /// Every target by its path in the channel (`DIR/manifest.json`).
    pub targets: BTreeMap<String, FileMeta>,
    /// The roles this targets role delegates to (TUF 1.0, 4.5). A node honours exactly one,
    /// the stop-only `halt` role ([`super::halt`]), and ignores every other. Skipped when
    /// absent, so targets without a guard read and sign as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegations: Option<Delegations>,
}

/// `targets.json`'s `delegations` object: the delegated roles' keys and the roles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegations {
    /// Every key a delegated role uses, by key id ([`Key::id`]).
    pub keys: BTreeMap<String, Key>,
    /// The delegated roles, in the order a TUF client searches them.
    pub roles: Vec<DelegatedRole>,
}

/// One delegated role as TUF writes it (`paths` form; `path_hash_prefixes` is not written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegatedRole {
    /// The role's name; its metadata is published as `NAME.json`.
    pub name: String,
    /// The ids of the keys whose signatures count for the role.
    pub keyids: Vec<String>,
    /// How many distinct keys of `keyids` must sign (0 is taken as 1).
    pub threshold: u32,
    /// Whether a TUF client stops searching at this role for the paths it matches.
    pub terminating: bool,
    /// The target path patterns the role may sign for (`halt/*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
}

impl Delegations {
    /// The role named `name`, with the keys it names (`RoleKeys` form, for [`Envelope::count_valid`]).
    pub fn role(&self, name: &str) -> Option<(&DelegatedRole, RoleKeys)> {
        self.roles.iter().find(|r| r.name == name).map(|r| {
            (
                r,
                RoleKeys {
                    keyids: r.keyids.clone(),
                    threshold: r.threshold,
                },
            )
        })
    }
}

/// A `meta` entry of snapshot and timestamp: the version of a metadata file, optionally its
/// length and hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRef {
    /// The version the referenced metadata file must carry.
    pub version: u64,
    /// The referenced file's length in bytes; `None`: not pinned (the role's size limit applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// The referenced file's hex digests by TUF algorithm name; `None`: not pinned by hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashes: Option<BTreeMap<String, String>>,
}

/// `snapshot.json` and `timestamp.json`'s `signed` objects (same shape, different `meta`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    /// The document's `_type`: `snapshot` or `timestamp`.
    #[serde(rename = "_type")]
    pub type_: String,
    /// The TUF specification version the publisher wrote it for (any 1.x is read).
    pub spec_version: String,
    /// The document's version; a node refuses one lower than it trusted before (rollback).
    pub version: u64,
    /// When this document stops being trusted (UTC).
    pub expires: DateTime<Utc>,
    /// The metadata files it pins, by file name (`targets.json` in a snapshot,
    /// `snapshot.json` in a timestamp).
    pub meta: BTreeMap<String, MetaRef>,
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sig {
    /// The id ([`Key::id`]) of the key that made the signature.
    pub keyid: String,
    /// The signature over the canonical JSON of `signed`, lower-case hex.
    pub sig: String,
}

/// A metadata file as published: `{"signed": …, "signatures": […]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The role's document exactly as received (see [`Envelope::body`] to read it as one role's).
    pub signed: serde_json::Value,
    /// The signatures over `signed`, in the order published.
    pub signatures: Vec<Sig>,
}

/// The header every role's `signed` object has.
#[derive(Deserialize)]
struct Header {
    #[serde(rename = "_type")]
    type_: String,
    spec_version: String,
}

impl Envelope {
    /// Parse a published file; `what` names it in errors.
    pub fn parse(bytes: &[u8], what: &str) -> Result<Envelope, TrustError> {
        serde_json::from_slice(bytes).map_err(|e| TrustError::Malformed {
            what: what.to_string(),
            why: e.to_string(),
        })
    }

    /// Sign `signed` with each key.
    pub fn sign<T: Serialize>(signed: &T, keys: &[SigningKey]) -> Envelope {
        let value = serde_json::to_value(signed).expect("metadata serialises");
        let bytes = canonical(&value).expect("metadata is canonical JSON");
        let signatures = keys
            .iter()
            .map(|k| Sig {
                keyid: Key::ed25519(&k.verifying_key()).id(),
                sig: hex::encode(k.sign(&bytes).to_bytes()),
            })
            .collect();
        Envelope {
            signed: value,
            signatures,
        }
    }

    /// The file to publish: pretty-printed JSON with a trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("envelope serialises");
        v.push(b'\n');
        v
    }

    /// The `signed` object as role `role`'s document (its `_type` and spec version checked).
    pub fn body<T: DeserializeOwned>(&self, role: Role, what: &str) -> Result<T, TrustError> {
        let malformed = |why: String| TrustError::Malformed {
            what: what.to_string(),
            why,
        };
        let h: Header =
            serde_json::from_value(self.signed.clone()).map_err(|e| malformed(e.to_string()))?;
        if h.type_ != role.as_str() {
            return Err(malformed(format!(
                "_type is '{}', expected '{role}'",
                h.type_
            )));
        }
        if h.spec_version.split('.').next() != Some("1") {
            return Err(malformed(format!(
                "spec_version {} is not TUF 1.x",
                h.spec_version
            )));
        }
        serde_json::from_value(self.signed.clone()).map_err(|e| malformed(e.to_string()))
    }

    /// Check that at least `threshold` distinct keys of `role` in `root` signed this document.
    /// Signatures by keys outside the role, unknown key types and repeated key ids count for
    /// nothing.
    pub fn check_role(&self, root: &Root, role: Role, what: &str) -> Result<(), TrustError> {
        let Some(rk) = root.roles.get(&role) else {
            return Err(TrustError::Malformed {
                what: format!("root version {}", root.version),
                why: format!("it names no keys for the {role} role"),
            });
        };
        let found = self.count_valid(&root.keys, rk, what)?;
        let need = rk.threshold.max(1) as usize;
        if found < need {
            return Err(TrustError::Threshold {
                what: what.to_string(),
                role,
                root_version: root.version,
                found,
                need,
            });
        }
        Ok(())
    }

    /// How many distinct keys of `rk` (looked up in `keys`) made a valid signature over this
    /// document. Signatures by keys outside `rk`, unknown key types and repeated key ids count
    /// for nothing; a `signed` object that is not canonical JSON is an error.
    pub fn count_valid(
        &self,
        keys: &BTreeMap<String, Key>,
        rk: &RoleKeys,
        what: &str,
    ) -> Result<usize, TrustError> {
        let bytes = canonical(&self.signed).map_err(|why| TrustError::Malformed {
            what: what.to_string(),
            why: format!("not canonical JSON: {why}"),
        })?;
        let mut good: Vec<&str> = Vec::new();
        for s in &self.signatures {
            if good.contains(&s.keyid.as_str()) || !rk.keyids.contains(&s.keyid) {
                continue;
            }
            let Some(vk) = keys.get(&s.keyid).and_then(Key::verifying_key) else {
                continue;
            };
            let Some(sig) = hex::decode(&s.sig)
                .ok()
                .and_then(|b| Signature::from_slice(&b).ok())
            else {
                continue;
            };
            if vk.verify_strict(&bytes, &sig).is_ok() {
                good.push(&s.keyid);
            }
        }
        Ok(good.len())
    }
}

/// An RFC 3339 time as TUF writes it (`2030-01-01T00:00:00Z`).
pub fn time_str(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// sha256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The lower-case hex digest of `bytes` under the TUF hash `algorithm` (`sha256`, `sha512`);
/// `None` for an algorithm this build cannot compute (a reference listing one is refused: a
/// hash that is not checked must not count as a pass).
pub fn digest_hex(algorithm: &str, bytes: &[u8]) -> Option<String> {
    match algorithm {
        "sha256" => Some(sha256_hex(bytes)),
        "sha512" => Some(hex::encode(Sha512::digest(bytes))),
        _ => None,
    }
}

/// `length` and `sha256` of a file's bytes.
pub fn file_meta(bytes: &[u8], custom: Option<TargetCustom>) -> FileMeta {
    FileMeta {
        length: bytes.len() as u64,
        hashes: BTreeMap::from([("sha256".to_string(), sha256_hex(bytes))]),
        custom,
    }
}
