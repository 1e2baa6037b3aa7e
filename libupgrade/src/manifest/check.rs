//! A manifest's own consistency: every field a node reads is checked before anything is
//! written (paths are plain names of their own, digests are hex, sizes are possible, kinds
//! are words, payload names are unique).

use super::{
    hex64, kind_word, plain_name, printable_word, Artifact, FileEntry, Manifest, ManifestError,
    FORMAT, MAX_INDEX_SIZE, MAX_SCRIPT_SIZE,
};

impl Manifest {
    /// Every file entry with its path in the manifest (`files.rootfs`, `payloads[0]`),
    /// payloads of every kind included (their fields are format 1's, checked alike).
    fn named_entries(&self) -> Vec<(String, &FileEntry)> {
        Artifact::ALL
            .into_iter()
            .map(|a| (format!("files.{a}"), self.files.get(a)))
            .chain(
                self.payloads
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (format!("payloads[{i}]"), &p.file)),
            )
            .collect()
    }

    /// Each payload: a kind word, a plain name of its own, image references that are
    /// printable text; its file was checked with the slot files'.
    fn check_payloads(&self) -> Result<(), ManifestError> {
        let field = |f: String, what: String| ManifestError::Field { field: f, what };
        for (i, p) in self.payloads.iter().enumerate() {
            let name = format!("payloads[{i}]");
            if !kind_word(&p.kind) {
                return Err(field(
                    format!("{name}.kind"),
                    format!(
                        "'{}' is not 1-32 of a-z, 0-9 and '-'",
                        p.kind.escape_debug()
                    ),
                ));
            }
            if !plain_name(&p.name) || p.name.len() > 128 {
                return Err(field(
                    format!("{name}.name"),
                    format!(
                        "'{}' is not a plain name of at most 128 bytes",
                        p.name.escape_debug()
                    ),
                ));
            }
            if self.payloads[..i].iter().any(|o| o.name == p.name) {
                return Err(field(
                    format!("{name}.name"),
                    format!("'{}' names a second payload", p.name.escape_debug()),
                ));
            }
            for (j, r) in p.images.iter().enumerate() {
                if r.is_empty() || r.len() > 512 || !r.chars().all(|c| c.is_ascii_graphic()) {
                    return Err(field(
                        format!("{name}.images[{j}]"),
                        format!(
                            "'{}' is not 1-512 printable ASCII characters without spaces",
                            r.escape_debug()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn check(&self) -> Result<(), ManifestError> {
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
        let entries = self.named_entries();
        for (k, (name, e)) in entries.iter().enumerate() {
            self.check_entry(name, e)?;
            // A payload's file is its own (the slot files' rule predates payloads: kept).
            if k >= 3 && entries[..k].iter().any(|(_, o)| o.path == e.path) {
                return Err(field(
                    &format!("{name}.path"),
                    &format!(
                        "'{}' is not a plain file name of its own",
                        e.path.escape_debug()
                    ),
                ));
            }
        }
        self.check_payloads()?;
        self.check_patches()?;
        if let Some(v) = &self.verity {
            v.check(self.files.rootfs.size)?;
        }
        self.check_boot()
    }

    /// One file entry's own fields (`name`: its path in the manifest, `files.rootfs`).
    fn check_entry(&self, name: &str, e: &FileEntry) -> Result<(), ManifestError> {
        let field = |f: &str, what: &str| ManifestError::Field {
            field: f.to_string(),
            what: what.to_string(),
        };
        if !plain_name(&e.path) {
            return Err(field(
                &format!("{name}.path"),
                &format!("'{}' is not a plain file name", e.path.escape_debug()),
            ));
        }
        check_digest(format!("{name}.sha256"), &e.sha256)?;
        if e.size == 0 {
            return Err(field(
                &format!("{name}.size"),
                "is 0: an empty file cannot be a release's part",
            ));
        }
        if let Some(c) = &e.chunks {
            let name = format!("{name}.chunks");
            check_own_name(
                format!("{name}.path"),
                &c.path,
                self.named_entries().iter().any(|(_, o)| o.path == c.path),
            )?;
            check_digest(format!("{name}.sha256"), &c.sha256)?;
            if c.size == 0 || c.size > MAX_INDEX_SIZE {
                return Err(field(
                    &format!("{name}.size"),
                    &format!("{} is not within 1..={MAX_INDEX_SIZE}", c.size),
                ));
            }
        }
        Ok(())
    }

    /// Every file name the release's artifacts and chunk indexes use, then (with
    /// `patches`) its patches.
    fn file_names(&self, patches: bool) -> Vec<&str> {
        self.named_entries()
            .into_iter()
            .flat_map(|(_, e)| {
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
        for (entry, e) in self.named_entries() {
            for (i, p) in e.patches.iter().enumerate() {
                let name = format!("{entry}.patches[{i}]");
                check_own_name(
                    format!("{name}.path"),
                    &p.path,
                    names.contains(&p.path.as_str()),
                )?;
                names.push(&p.path);
                for (f, v) in [("sha256", &p.sha256), ("base.sha256", &p.base.sha256)] {
                    check_digest(format!("{name}.{f}"), v)?;
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
                if !kind_word(&p.kind) {
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
            check_own_name(
                format!("{name}.path"),
                &sc.path,
                names.contains(&sc.path.as_str()),
            )?;
            names.push(&sc.path);
            check_digest(format!("{name}.sha256"), &sc.sha256)?;
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

/// `Err` naming `field` unless `v` is 64 lower-case hex digits (a sha256).
fn check_digest(field: String, v: &str) -> Result<(), ManifestError> {
    if hex64(v) {
        return Ok(());
    }
    Err(ManifestError::Field {
        field,
        what: format!("'{}' is not 64 lower-case hex digits", v.escape_debug()),
    })
}

/// `Err` naming `field` unless `path` is a plain file name that no other file of the release
/// has (`taken`).
fn check_own_name(field: String, path: &str, taken: bool) -> Result<(), ManifestError> {
    if plain_name(path) && !taken {
        return Ok(());
    }
    Err(ManifestError::Field {
        field,
        what: format!(
            "'{}' is not a plain file name of its own",
            path.escape_debug()
        ),
    })
}
