//! The release manifest: what a release contains and how to check each byte of it.
//!
//! A release is a directory (local or served over http) holding `manifest.json`, its detached
//! signature `manifest.json.sig`, and the three artifacts the manifest names. The manifest is
//! checked *before* anything is written: wrong architecture, a missing artifact, a malformed
//! digest or an impossible size are refused here, so a bad release never touches a slot.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use bootconfig::ScriptKind;
pub use part::Part;

mod check;
mod part;
pub use verity::{Verity, MAX_ROOTFS, MAX_SALT, VERITY_HASH, VERITY_HASH_TYPE};

mod verity;

/// File name of the manifest inside a release directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the manifest's detached signature inside a release directory.
pub const SIGNATURE_FILE: &str = "manifest.json.sig";
/// The manifest format this library writes and understands.
///
/// Format 1 grows only by optional fields that older readers ignore (serde skips unknown
/// fields; v0.1.0 reads every manifest written since): `files.*.chunks`, `boot` and
/// `files.*.patches` (v0.2.0), `payloads` (v0.2.0, issue 33). A patch or a payload of a kind
/// a reader does not know is skipped, never refused: the kind is free text here.
/// A change an older reader would misread bumps the number; a reader refuses a newer number,
/// naming both.
pub const FORMAT: u32 = 1;
/// Largest boot script a release may carry.
pub const MAX_SCRIPT_SIZE: u64 = 1 << 20;

/// CPU architecture a release is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// 64-bit x86 (`x86_64`; `amd64` is accepted when parsing).
    X86_64,
    /// 64-bit ARM (`aarch64`; `arm64` is accepted when parsing).
    Aarch64,
}

impl Arch {
    /// The architecture this binary was built for.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// The name used in manifests, indexes and asset names (`x86_64`, `aarch64`).
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "x86_64" | "amd64" => Ok(Arch::X86_64),
            "aarch64" | "arm64" => Ok(Arch::Aarch64),
            other => Err(format!(
                "unknown architecture '{}': expected x86_64 or aarch64",
                other.escape_debug()
            )),
        }
    }
}

/// The three artifacts that make up a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Artifact {
    /// The squashfs root filesystem.
    Rootfs,
    /// The kernel image.
    Kernel,
    /// The initramfs.
    Initrd,
}

impl Artifact {
    /// Every artifact: rootfs, kernel, initrd.
    pub const ALL: [Artifact; 3] = [Artifact::Rootfs, Artifact::Kernel, Artifact::Initrd];

    /// The artifact's name in messages and manifests (`rootfs`, `kernel`, `initrd`).
    pub fn as_str(self) -> &'static str {
        match self {
            Artifact::Rootfs => "rootfs",
            Artifact::Kernel => "kernel",
            Artifact::Initrd => "initrd",
        }
    }
}

impl fmt::Display for Artifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One file of a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the release directory (a plain file name; no `/`, no `..`).
    pub path: String,
    /// Exact size in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the whole file.
    pub sha256: String,
    /// The file's chunk index (see [`crate::chunk::ChunkIndex`]), if the release has one. Covered
    /// by the manifest's signature through its sha256; a release without one installs by
    /// full download, and nodes that predate chunking ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<IndexRef>,
    /// Patches that turn an earlier release's copy of this artifact into this one (see
    /// [`PatchRef`]). Optional: absent (and never written) when empty, so a release without
    /// patches is byte for byte what it was before they existed; v0.1.0 ignores the field and
    /// streams the artifact, a node whose running slot is no listed base stages by chunks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<PatchRef>,
}

/// A part of a release beside the slot's three files (issue 33): kept in the payload store on
/// the state partition ([`crate::payload`]) and referenced by each slot whose kept manifest
/// names it. Staged, verified, chunked, patched, budgeted and previewed exactly like the slot
/// files; what a node does with it depends on its kind ([`crate::payload::kinds`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// The payload's kind (`image-archive`; [`crate::payload::kinds::KINDS`]). A reader skips
    /// a kind it does not know, never refuses it.
    pub kind: String,
    /// A plain name, unique among the release's payloads (`k3s-airgap-images`): what binds a
    /// payload to the running release's payload of the same name (chunks, patch base).
    pub name: String,
    /// The file: path, size, sha256, chunk index and patches, as for a slot file.
    #[serde(flatten)]
    pub file: FileEntry,
    /// The image references an image archive holds (`docker.io/rancher/mirrored-pause:3.6`),
    /// as the publisher read them from the archive; what the boot's health check looks for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
}

/// One per-pair patch of an artifact, published beside the release: applied to the base (the
/// node's running copy, bound by its sha256 and size) it yields the artifact's bytes, which the
/// node still checks chunk by chunk against the signed chunk index before writing them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchRef {
    /// The artifact the patch applies to.
    pub base: PatchBase,
    /// The patch's kind (`plain`, `squashfs`; [`PATCH_KINDS`]). A reader skips a kind it does
    /// not know, so a newer kind never makes a release unreadable.
    pub kind: String,
    /// Plain file name in the release directory (`rootfs.squashfs.from-v1.patch`).
    pub path: String,
    /// Exact size of the patch file in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the patch file.
    pub sha256: String,
    /// squashfs blocks a node recompresses applying it (0 for a plain patch): what the planner
    /// weighs the apply's time by against the link's (`stage::weigh`). Absent in patches
    /// listed before it was written (the planner then goes by bytes alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
}

/// The base a patch applies to: the same artifact of an earlier release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchBase {
    /// The earlier release's version (for messages only: the digest binds the base).
    pub version: String,
    /// Exact size of the base artifact in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the base artifact.
    pub sha256: String,
}

/// The patch kinds this build writes and reads (`PatchRef::kind`).
pub const PATCH_KINDS: [&str; 2] = ["plain", "squashfs"];

/// Where an artifact's chunk index is and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRef {
    /// Plain file name in the release directory (`rootfs.squashfs.chunks`).
    pub path: String,
    /// Exact size of the chunk index file in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the chunk index file.
    pub sha256: String,
}

/// The files of a release, one per [`Artifact`]; all three are required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Files {
    /// The squashfs root filesystem.
    pub rootfs: FileEntry,
    /// The kernel image.
    pub kernel: FileEntry,
    /// The initramfs.
    pub initrd: FileEntry,
}

impl Files {
    /// The entry of artifact `a`.
    pub fn get(&self, a: Artifact) -> &FileEntry {
        match a {
            Artifact::Rootfs => &self.rootfs,
            Artifact::Kernel => &self.kernel,
            Artifact::Initrd => &self.initrd,
        }
    }

    /// The entry of artifact `a`, to change (a release being made).
    pub fn get_mut(&mut self, a: Artifact) -> &mut FileEntry {
        match a {
            Artifact::Rootfs => &mut self.rootfs,
            Artifact::Kernel => &mut self.kernel,
            Artifact::Initrd => &mut self.initrd,
        }
    }
}

/// What a release's `k3os-ops` reads of the loader's files, and the boot scripts the release
/// carries (see `bootconfig::GrubScript`). Absent from releases made before v0.2.0:
/// [`Manifest::reads`] then says 1 for every loader, and they carry no script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BootSupport {
    /// Newest GRUB script version the release's `k3os-ops` reads (it reads every older one).
    pub grub_script: u32,
    /// Newest `extlinux.conf` version it reads.
    pub extlinux_conf: u32,
    /// Scripts the release carries, at most one per kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scripts: Vec<ScriptFile>,
}

/// A boot script carried by a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptFile {
    /// Which loader's script it is.
    pub kind: ScriptKind,
    /// The script's version (its marker line says the same; checked when installed).
    pub version: u32,
    /// Plain file name in the release directory.
    pub path: String,
    /// Exact size in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the script file.
    pub sha256: String,
}

/// A release manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format; [`FORMAT`].
    pub format: u32,
    /// Human version string (`v1.2.0`); a plain name ([`crate::version`]) for every release
    /// created or staged since issue 34.
    pub version: String,
    /// The architecture the release is built for.
    pub arch: Arch,
    /// Monotonic generation id: a node refuses a release older than what it runs unless told
    /// to allow a downgrade.
    pub generation: u64,
    /// The release's three artifacts.
    pub files: Files,
    /// What the release reads of the loader's files and the scripts it carries (v0.2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootSupport>,
    /// The release's payloads beside the slot files (issue 33); absent (and never written)
    /// when there are none, so a release without them is byte for byte what it was before.
    /// Older nodes ignore the field and stage the slot files as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub payloads: Vec<Payload>,
    /// dm-verity parameters of the rootfs ([`Verity`], issue 34); absent in releases made
    /// without it, which stage and boot as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verity: Option<Verity>,
}

/// A plain file name: no `/`, no `\\`, no control characters (NUL included), not `.` or
/// `..`, not empty, at most 255 bytes.
fn plain_name(p: &str) -> bool {
    !(p.is_empty()
        || p.len() > 255
        || p.contains('/')
        || p.contains('\\')
        || p.chars().any(char::is_control)
        || p == "."
        || p == "..")
}

/// 1-128 printable ASCII characters without spaces: what every manifest's version must be to
/// be read at all (v0.1.0's rule, kept so a node still reads the manifests of what it already
/// runs or keeps). A release entering a node or a channel must also be a plain name:
/// [`Manifest::check_version_name`].
fn printable_word(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_graphic())
}

/// A kind (of a patch or a payload): 1-32 of a-z, 0-9 and '-'.
fn kind_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Largest chunk index accepted (a 16 GiB image at 32 KiB chunks needs ~18 MiB).
pub const MAX_INDEX_SIZE: u64 = 64 << 20;

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The bytes are not JSON of the manifest's shape.
    #[error("manifest is not valid JSON for format {FORMAT}: {0}")]
    Parse(#[from] serde_json::Error),
    /// The manifest is of a newer format than this build reads.
    #[error("manifest format {found} is newer than this build of k3os-ops reads (format {FORMAT}); upgrade k3os-ops first")]
    Format {
        /// The `format` it declares.
        found: u32,
    },
    /// The release is built for another architecture than the node's.
    #[error("release {version} is built for {found}, this node is {expected}")]
    Arch {
        /// The release's version string.
        version: String,
        /// The node's architecture.
        expected: Arch,
        /// The architecture the manifest names.
        found: Arch,
    },
    /// A field's value is invalid (a path that is not a plain name, a bad sha256, …).
    #[error("manifest field {field}: {what}")]
    Field {
        /// The field's path in the manifest (`files.rootfs.sha256`).
        field: String,
        /// What is wrong with its value.
        what: String,
    },
}

impl Manifest {
    /// Parse and check a manifest's own consistency (not yet its signature or architecture).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes)?;
        m.check()?;
        Ok(m)
    }

    /// Serialize as pretty JSON (the exact bytes that get signed).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("manifest serializes");
        v.push(b'\n');
        v
    }

    /// The newest version of `kind` this release's `k3os-ops` reads (1 for releases made
    /// before v0.2.0, which predate versioned scripts).
    pub fn reads(&self, kind: ScriptKind) -> u32 {
        self.boot.as_ref().map_or(1, |b| match kind {
            ScriptKind::GrubCfg => b.grub_script,
            ScriptKind::ExtlinuxConf => b.extlinux_conf,
        })
    }

    /// The script of `kind` this release carries.
    pub fn script(&self, kind: ScriptKind) -> Option<&ScriptFile> {
        self.boot
            .as_ref()
            .and_then(|b| b.scripts.iter().find(|s| s.kind == kind))
    }

    /// Refuse a manifest for another architecture.
    pub fn check_arch(&self, expected: Arch) -> Result<(), ManifestError> {
        if self.arch != expected {
            return Err(ManifestError::Arch {
                version: self.version.clone(),
                expected,
                found: self.arch,
            });
        }
        Ok(())
    }

    /// The release's version is a plain name ([`crate::version`]): required of a release that
    /// is created or staged (a manifest a node already keeps is read with the older rule).
    pub fn check_version_name(&self) -> Result<(), ManifestError> {
        crate::version::check_version(&self.version).map_err(|e| ManifestError::Field {
            field: "version".into(),
            what: e.to_string(),
        })
    }

    /// The signed entry of `part`, if the manifest has it.
    pub fn entry(&self, part: &Part) -> Option<&FileEntry> {
        match part {
            Part::Slot(a) => Some(self.files.get(*a)),
            Part::Payload(n) => self.payload(n).map(|p| &p.file),
        }
    }

    /// The signed entry of `part`, to change (a release being made).
    pub fn entry_mut(&mut self, part: &Part) -> Option<&mut FileEntry> {
        match part {
            Part::Slot(a) => Some(self.files.get_mut(*a)),
            Part::Payload(n) => self
                .payloads
                .iter_mut()
                .find(|p| p.name == *n)
                .map(|p| &mut p.file),
        }
    }

    /// Every file the release carries, in order: the three slot files, then each payload's,
    /// of every kind (one this build does not stage included: a release is verified and
    /// bundled whole).
    pub fn file_entries(&self) -> impl Iterator<Item = &FileEntry> {
        Artifact::ALL
            .into_iter()
            .map(|a| self.files.get(a))
            .chain(self.payloads.iter().map(|p| &p.file))
    }

    /// The payload named `name`.
    pub fn payload(&self, name: &str) -> Option<&Payload> {
        self.payloads.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
pub(crate) mod tests;
