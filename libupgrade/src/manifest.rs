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

/// File name of the manifest inside a release directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the manifest's detached signature inside a release directory.
pub const SIGNATURE_FILE: &str = "manifest.json.sig";
/// The manifest format this library writes and understands.
///
/// Format 1 grows only by optional fields that older readers ignore (serde skips unknown
/// fields; v0.1.0 reads every manifest written since): `files.*.chunks`, `boot` and
/// `files.*.patches` (v0.2.0). A patch of a kind a reader does not know is skipped by its
/// planner, never refused: the kind is free text here.
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

    fn check(&self) -> Result<(), ManifestError> {
        if self.format > FORMAT || self.format == 0 {
            return Err(ManifestError::Format { found: self.format });
        }
        let field = |f: &str, what: &str| ManifestError::Field {
            field: f.to_string(),
            what: what.to_string(),
        };
        if !printable_word(&self.version) {
            return Err(field(
                "version",
                "must be 1-128 printable ASCII characters without spaces",
            ));
        }
        for a in Artifact::ALL {
            let e = self.files.get(a);
            let name = format!("files.{a}");
            if !plain_name(&e.path) {
                return Err(field(
                    &format!("{name}.path"),
                    &format!("'{}' is not a plain file name", e.path.escape_debug()),
                ));
            }
            if !hex64(&e.sha256) {
                return Err(field(
                    &format!("{name}.sha256"),
                    &format!(
                        "'{}' is not 64 lower-case hex digits",
                        e.sha256.escape_debug()
                    ),
                ));
            }
            if e.size == 0 {
                return Err(field(
                    &format!("{name}.size"),
                    "is 0: an empty artifact cannot boot",
                ));
            }
            if let Some(c) = &e.chunks {
                let name = format!("{name}.chunks");
                if !plain_name(&c.path)
                    || Artifact::ALL
                        .iter()
                        .any(|o| self.files.get(*o).path == c.path)
                {
                    return Err(field(
                        &format!("{name}.path"),
                        &format!(
                            "'{}' is not a plain file name of its own",
                            c.path.escape_debug()
                        ),
                    ));
                }
                if !hex64(&c.sha256) {
                    return Err(field(
                        &format!("{name}.sha256"),
                        &format!(
                            "'{}' is not 64 lower-case hex digits",
                            c.sha256.escape_debug()
                        ),
                    ));
                }
                if c.size == 0 || c.size > MAX_INDEX_SIZE {
                    return Err(field(
                        &format!("{name}.size"),
                        &format!("{} is not within 1..={MAX_INDEX_SIZE}", c.size),
                    ));
                }
            }
        }
        self.check_patches()?;
        self.check_boot()
    }

    /// Every file name the release's artifacts and chunk indexes use, then (with
    /// `patches`) its patches.
    fn file_names(&self, patches: bool) -> Vec<&str> {
        Artifact::ALL
            .iter()
            .flat_map(|a| {
                let e = self.files.get(*a);
                std::iter::once(e.path.as_str())
                    .chain(e.chunks.as_ref().map(|c| c.path.as_str()))
                    .chain(
                        e.patches
                            .iter()
                            .filter(move |_| patches)
                            .map(|p| p.path.as_str()),
                    )
            })
            .collect()
    }

    /// Each patch: a file name of its own, digests, non-zero sizes, a version and a kind that
    /// are plain words (any kind: a reader skips the ones it does not know).
    fn check_patches(&self) -> Result<(), ManifestError> {
        let field = |f: String, what: String| ManifestError::Field { field: f, what };
        let mut names = self.file_names(false);
        for a in Artifact::ALL {
            for (i, p) in self.files.get(a).patches.iter().enumerate() {
                let name = format!("files.{a}.patches[{i}]");
                if !plain_name(&p.path) || names.contains(&p.path.as_str()) {
                    return Err(field(
                        format!("{name}.path"),
                        format!(
                            "'{}' is not a plain file name of its own",
                            p.path.escape_debug()
                        ),
                    ));
                }
                names.push(&p.path);
                for (f, v) in [("sha256", &p.sha256), ("base.sha256", &p.base.sha256)] {
                    if !hex64(v) {
                        return Err(field(
                            format!("{name}.{f}"),
                            format!("'{}' is not 64 lower-case hex digits", v.escape_debug()),
                        ));
                    }
                }
                for (f, v) in [("size", p.size), ("base.size", p.base.size)] {
                    if v == 0 {
                        return Err(field(format!("{name}.{f}"), "is 0".into()));
                    }
                }
                if !printable_word(&p.base.version) {
                    return Err(field(
                        format!("{name}.base.version"),
                        "must be 1-128 printable ASCII characters without spaces".into(),
                    ));
                }
                let kind_ok = !p.kind.is_empty()
                    && p.kind.len() <= 32
                    && p.kind
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
                if !kind_ok {
                    return Err(field(
                        format!("{name}.kind"),
                        format!(
                            "'{}' is not 1-32 of a-z, 0-9 and '-'",
                            p.kind.escape_debug()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_boot(&self) -> Result<(), ManifestError> {
        let Some(b) = &self.boot else {
            return Ok(());
        };
        let field = |f: String, what: String| ManifestError::Field { field: f, what };
        if b.grub_script == 0 || b.extlinux_conf == 0 {
            return Err(field("boot".into(), "script versions start at 1".into()));
        }
        let mut names = self.file_names(true);
        for (i, sc) in b.scripts.iter().enumerate() {
            let name = format!("boot.scripts[{i}]");
            if b.scripts[..i].iter().any(|o| o.kind == sc.kind) {
                return Err(field(name, format!("a second {} script", sc.kind)));
            }
            if !plain_name(&sc.path) || names.contains(&sc.path.as_str()) {
                return Err(field(
                    format!("{name}.path"),
                    format!(
                        "'{}' is not a plain file name of its own",
                        sc.path.escape_debug()
                    ),
                ));
            }
            names.push(&sc.path);
            if !hex64(&sc.sha256) {
                return Err(field(
                    format!("{name}.sha256"),
                    format!(
                        "'{}' is not 64 lower-case hex digits",
                        sc.sha256.escape_debug()
                    ),
                ));
            }
            if sc.size == 0 || sc.size > MAX_SCRIPT_SIZE {
                return Err(field(
                    format!("{name}.size"),
                    format!("{} is not within 1..={MAX_SCRIPT_SIZE}", sc.size),
                ));
            }
            let reads = self.reads(sc.kind);
            if sc.version == 0 || sc.version > reads {
                return Err(field(
                    format!("{name}.version"),
                    format!(
                        "{}: the release's k3os-ops reads {} versions 1..={reads}",
                        sc.version, sc.kind
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let e = |p: &str| FileEntry {
            path: p.into(),
            size: 10,
            sha256: "ab".repeat(32),
            chunks: None,
            patches: Vec::new(),
        };
        Manifest {
            format: FORMAT,
            version: "v2".into(),
            arch: Arch::X86_64,
            generation: 2,
            files: Files {
                rootfs: e("rootfs.squashfs"),
                kernel: e("vmlinuz"),
                initrd: e("initrd"),
            },
            boot: None,
        }
    }

    /// A manifest v0.1.0 accepted (printable, no spaces) is still read, so a node reads what
    /// it runs or keeps; only a release created or staged must have a plain name.
    #[test]
    fn a_version_that_is_no_plain_name_is_read_but_refused_for_a_new_release() {
        for v in ["v1:beta", "../../../../x", "v2/rc"] {
            let m = Manifest {
                version: v.into(),
                ..sample()
            };
            let read = Manifest::parse(&m.to_bytes()).unwrap();
            let e = read.check_version_name().unwrap_err().to_string();
            assert!(
                e.starts_with("manifest field version: version \"")
                    && e.contains("not a plain name"),
                "{e}"
            );
        }
        assert!(sample().check_version_name().is_ok());
    }

    #[test]
    fn file_names_with_control_characters_are_refused() {
        for bad in ["root\0fs", "a\nb", &"x".repeat(256)] {
            let mut m = sample();
            m.files.kernel.path = bad.to_string();
            let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
            assert!(e.contains("files.kernel.path"), "{bad:?}: {e}");
            // The refusal names the bad text escaped: no control character reaches a terminal.
            assert!(!e.chars().any(char::is_control), "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn boot_section_is_optional_and_checked() {
        let m = sample();
        assert_eq!(
            m.reads(ScriptKind::GrubCfg),
            1,
            "a release made before v0.2.0"
        );
        let text = String::from_utf8(m.to_bytes()).unwrap();
        assert!(!text.contains("boot"), "{text}");
        let mut b = sample();
        b.boot = Some(BootSupport {
            grub_script: 2,
            extlinux_conf: 1,
            scripts: vec![ScriptFile {
                kind: ScriptKind::GrubCfg,
                version: 2,
                path: "grub.cfg".into(),
                size: 10,
                sha256: "cd".repeat(32),
            }],
        });
        assert_eq!(Manifest::parse(&b.to_bytes()).unwrap(), b);
        assert_eq!(b.reads(ScriptKind::GrubCfg), 2);
        assert_eq!(b.script(ScriptKind::GrubCfg).unwrap().version, 2);
        let text = String::from_utf8(b.to_bytes()).unwrap();
        assert!(
            text.contains("\"grub-script\": 2") && text.contains("\"kind\": \"grub-cfg\""),
            "{text}"
        );
        let mut bad = b.clone();
        bad.boot.as_mut().unwrap().scripts[0].version = 3;
        let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("boot.scripts[0].version") && e.contains("1..=2"),
            "{e}"
        );
        let mut bad = b.clone();
        bad.boot.as_mut().unwrap().scripts[0].path = "vmlinuz".into();
        let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("boot.scripts[0].path"), "{e}");
        let mut bad = b.clone();
        let dup = bad.boot.as_ref().unwrap().scripts[0].clone();
        bad.boot.as_mut().unwrap().scripts.push(ScriptFile {
            path: "other".into(),
            ..dup
        });
        let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("a second GRUB script"), "{e}");
        // A newer manifest format is refused naming both.
        let newer = String::from_utf8(m.to_bytes())
            .unwrap()
            .replace("\"format\": 1", "\"format\": 2");
        let e = Manifest::parse(newer.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("format 2") && e.contains("format 1"), "{e}");
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
    }

    #[test]
    fn chunk_index_refs_are_optional_and_checked() {
        let m = sample();
        let text = String::from_utf8(m.to_bytes()).unwrap();
        assert!(!text.contains("chunks"), "no index, no field: {text}");
        let mut c = sample();
        c.files.rootfs.chunks = Some(IndexRef {
            path: "rootfs.squashfs.chunks".into(),
            size: 76,
            sha256: "cd".repeat(32),
        });
        assert_eq!(Manifest::parse(&c.to_bytes()).unwrap(), c);
        let mut bad = c.clone();
        bad.files.rootfs.chunks.as_mut().unwrap().path = "vmlinuz".into();
        let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("files.rootfs.chunks.path"), "{e}");
        let mut bad = c;
        bad.files.rootfs.chunks.as_mut().unwrap().size = MAX_INDEX_SIZE + 1;
        let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("files.rootfs.chunks.size"), "{e}");
    }

    pub(crate) fn patch(base_version: &str, path: &str) -> PatchRef {
        PatchRef {
            base: PatchBase {
                version: base_version.into(),
                size: 9,
                sha256: "12".repeat(32),
            },
            kind: "squashfs".into(),
            path: path.into(),
            size: 3,
            sha256: "34".repeat(32),
        }
    }

    #[test]
    fn patches_are_optional_and_checked() {
        let text = String::from_utf8(sample().to_bytes()).unwrap();
        assert!(!text.contains("patches"), "no patch, no field: {text}");
        let mut m = sample();
        m.files.rootfs.patches = vec![patch("v1", "rootfs.from-v1.patch")];
        m.files.kernel.patches = vec![PatchRef {
            kind: "a-kind-from-the-future".into(),
            ..patch("v0", "vmlinuz.from-v0.patch")
        }];
        assert_eq!(
            Manifest::parse(&m.to_bytes()).unwrap(),
            m,
            "an unknown kind is kept"
        );
        let bad = |f: &dyn Fn(&mut Manifest), want: &str| {
            let mut b = m.clone();
            f(&mut b);
            let e = Manifest::parse(&b.to_bytes()).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
            assert!(!e.chars().any(char::is_control), "{e:?}");
        };
        bad(
            &|b| b.files.rootfs.patches[0].path = "vmlinuz".into(),
            "files.rootfs.patches[0].path",
        );
        bad(
            &|b| b.files.kernel.patches[0].path = "rootfs.from-v1.patch".into(),
            "files.kernel.patches[0].path",
        );
        bad(
            &|b| b.files.rootfs.patches[0].path = "../x\n".into(),
            "files.rootfs.patches[0].path",
        );
        bad(
            &|b| b.files.rootfs.patches[0].base.sha256 = "AB".repeat(32),
            "files.rootfs.patches[0].base.sha256",
        );
        bad(
            &|b| b.files.rootfs.patches[0].size = 0,
            "files.rootfs.patches[0].size",
        );
        bad(
            &|b| b.files.rootfs.patches[0].base.version = "v 1".into(),
            "files.rootfs.patches[0].base.version",
        );
        bad(
            &|b| b.files.rootfs.patches[0].kind = "Squash\u{1b}fs".into(),
            "files.rootfs.patches[0].kind",
        );
        // A boot script may not take a patch's name either.
        bad(
            &|b| {
                b.boot = Some(BootSupport {
                    grub_script: 2,
                    extlinux_conf: 1,
                    scripts: vec![ScriptFile {
                        kind: ScriptKind::GrubCfg,
                        version: 2,
                        path: "rootfs.from-v1.patch".into(),
                        size: 1,
                        sha256: "cd".repeat(32),
                    }],
                })
            },
            "boot.scripts[0].path",
        );
    }

    /// v0.1.0's manifest types (commit c063939, named by CHANGELOG.md), as they were: no
    /// `deny_unknown_fields`, three entries of path/size/sha256. A manifest of this release with
    /// patches (and chunk indexes and a boot section) must read there as the same release.
    mod v010 {
        use serde::Deserialize;

        #[derive(Deserialize)]
        pub struct FileEntry {
            pub path: String,
            pub size: u64,
            pub sha256: String,
        }
        #[derive(Deserialize)]
        pub struct Files {
            pub rootfs: FileEntry,
            pub kernel: FileEntry,
            pub initrd: FileEntry,
        }
        #[derive(Deserialize)]
        pub struct Manifest {
            pub format: u32,
            pub version: String,
            pub arch: super::Arch,
            pub generation: u64,
            pub files: Files,
        }
    }

    #[test]
    fn v010_reads_a_manifest_with_patches_as_the_same_release() {
        let mut m = sample();
        m.files.rootfs.patches = vec![patch("v1", "rootfs.from-v1.patch")];
        m.files.initrd.patches = vec![patch("v1", "initrd.from-v1.patch")];
        m.files.rootfs.chunks = Some(IndexRef {
            path: "rootfs.squashfs.chunks".into(),
            size: 76,
            sha256: "cd".repeat(32),
        });
        let old: v010::Manifest = serde_json::from_slice(&m.to_bytes()).unwrap();
        assert_eq!(
            (old.format, old.version.as_str(), old.arch, old.generation),
            (FORMAT, "v2", Arch::X86_64, 2)
        );
        for (o, n) in [
            (&old.files.rootfs, &m.files.rootfs),
            (&old.files.kernel, &m.files.kernel),
            (&old.files.initrd, &m.files.initrd),
        ] {
            assert_eq!((&o.path, o.size, &o.sha256), (&n.path, n.size, &n.sha256));
        }
    }

    #[test]
    fn rejects_other_arch_and_bad_fields() {
        let m = sample();
        let e = m.check_arch(Arch::Aarch64).unwrap_err().to_string();
        assert!(e.contains("x86_64") && e.contains("aarch64"), "{e}");

        let mut bad = sample();
        bad.files.kernel.path = "../etc/passwd".into();
        let e = Manifest::parse(&bad.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("files.kernel.path"), "{e}");

        let mut bad = sample();
        bad.files.rootfs.sha256 = "xyz".into();
        assert!(Manifest::parse(&bad.to_bytes())
            .unwrap_err()
            .to_string()
            .contains("files.rootfs.sha256"));

        let json = String::from_utf8(sample().to_bytes()).unwrap();
        let missing = json.replace("\"initrd\": {", "\"initrd_gone\": {");
        let e = Manifest::parse(missing.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("initrd"), "{e}");
    }
}
