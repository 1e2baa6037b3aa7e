//! [`Part`]: one part of a release as the stage engine handles it, and how it is written in
//! files.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{plain_name, Artifact};

/// One part of a release as the stage engine handles it: a slot file or a payload (by its
/// name). In files (the download checkpoint, the stage preview) it is the artifact's name
/// (`rootfs`) or `payload:<name>`, so what earlier releases wrote reads unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// One of the slot's three files.
    Slot(Artifact),
    /// The payload of this name.
    Payload(String),
}

impl Part {
    /// The slot file this part is, if it is one.
    pub fn artifact(&self) -> Option<Artifact> {
        match self {
            Part::Slot(a) => Some(*a),
            Part::Payload(_) => None,
        }
    }

    /// The text this part is written as in files (`rootfs`, `payload:<name>`).
    pub fn key(&self) -> String {
        match self {
            Part::Slot(a) => a.as_str().to_string(),
            Part::Payload(n) => format!("{PAYLOAD_KEY}{n}"),
        }
    }

    /// The part a [`Part::key`] names.
    pub fn from_key(s: &str) -> Result<Part, String> {
        if let Some(n) = s.strip_prefix(PAYLOAD_KEY) {
            return if plain_name(n) {
                Ok(Part::Payload(n.to_string()))
            } else {
                Err(format!("'{}' is not a payload name", n.escape_debug()))
            };
        }
        Artifact::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .map(Part::Slot)
            .ok_or_else(|| {
                format!(
                    "unknown part '{}': expected rootfs, kernel, initrd or payload:<name>",
                    s.escape_debug()
                )
            })
    }
}

const PAYLOAD_KEY: &str = "payload:";

impl From<Artifact> for Part {
    fn from(a: Artifact) -> Part {
        Part::Slot(a)
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Slot(a) => f.write_str(a.as_str()),
            Part::Payload(n) => write!(f, "payload {}", n.escape_debug()),
        }
    }
}

impl Serialize for Part {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.key())
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Part, D::Error> {
        let s = String::deserialize(d)?;
        Part::from_key(&s).map_err(serde::de::Error::custom)
    }
}

impl PartialEq<Artifact> for Part {
    fn eq(&self, a: &Artifact) -> bool {
        *self == Part::Slot(*a)
    }
}
