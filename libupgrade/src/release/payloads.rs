//! The payloads of a release being created (`release create --image NAME=FILE`): each input
//! checked before anything is copied (a regular non-empty file, a kind this build knows that
//! lives in the payload store, a plain name, the kind's own check: an image archive must be a
//! plain tar), then copied, hashed and chunk-indexed like a slot file, and, for an image
//! archive, the image references it holds read into the manifest
//! ([`crate::payload::archive_images`]).

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::manifest::{FileEntry, Payload};
use crate::payload::kinds::{self, Place};

use super::{io_err, ReleaseError};

/// A payload for [`super::CreateOptions::payloads`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadInput {
    /// Its kind (`image-archive`, [`kinds::KINDS`]).
    pub kind: String,
    /// Its name in the release (a plain name, unique among the payloads).
    pub name: String,
    /// The file to publish.
    pub path: PathBuf,
}

impl PayloadInput {
    /// An image archive named by `spec`: `NAME=FILE`, or `FILE` (named by its file name
    /// without the extension: `k3s-airgap-images-amd64.tar` → `k3s-airgap-images-amd64`).
    pub fn image(spec: &str) -> PayloadInput {
        let (name, path) = match spec.split_once('=') {
            Some((n, p)) if !n.is_empty() && !n.contains('/') => (n.to_string(), PathBuf::from(p)),
            _ => {
                let p = PathBuf::from(spec);
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (stem, p)
            }
        };
        PayloadInput {
            kind: "image-archive".into(),
            name,
            path,
        }
    }

    /// The file name it is published under: its name and the input's extension.
    pub(super) fn file_name(&self) -> String {
        match self.path.extension() {
            Some(ext) => format!("{}.{}", self.name, ext.to_string_lossy()),
            None => self.name.clone(),
        }
    }
}

/// Every input is a non-empty regular file of a payload kind this build knows, passing the
/// kind's check.
pub(super) fn check(inputs: &[PayloadInput]) -> Result<(), ReleaseError> {
    for p in inputs {
        let bad = |what: String| ReleaseError::Payload {
            path: p.path.clone(),
            what,
        };
        let kind = kinds::kind(&p.kind)
            .filter(|k| k.place == Place::Store)
            .ok_or_else(|| {
                bad(format!(
                    "'{}' is not a payload kind this build knows ({})",
                    p.kind.escape_debug(),
                    kinds::payload_kinds()
                        .map(|k| k.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        let f = fs::File::open(&p.path).map_err(io_err(&p.path))?;
        let md = f.metadata().map_err(io_err(&p.path))?;
        if !md.is_file() || md.len() == 0 {
            return Err(bad("not a non-empty regular file".into()));
        }
        if let Some(check) = kind.check {
            check(&|pos, buf| f.read_exact_at(buf, pos), md.len())
                .map_err(|what| bad(format!("{} {}: {what}", kind.name, p.name.escape_debug())))?;
        }
    }
    Ok(())
}

/// Placeholder entries for the draft manifest (its names and paths checked before copying).
pub(super) fn placeholders(inputs: &[PayloadInput]) -> Vec<Payload> {
    inputs
        .iter()
        .map(|p| Payload {
            kind: p.kind.clone(),
            name: p.name.clone(),
            file: FileEntry {
                path: p.file_name(),
                size: 1,
                sha256: "0".repeat(64),
                chunks: None,
                patches: Vec::new(),
            },
            images: Vec::new(),
        })
        .collect()
}

/// The image references an image archive input holds (none for other kinds).
pub(super) fn images(p: &PayloadInput) -> Result<Vec<String>, ReleaseError> {
    if p.kind != "image-archive" {
        return Ok(Vec::new());
    }
    Ok(crate::payload::archive_images(&p.path)?)
}

/// `p` copied into the release directory (`copy`: the slot files' copy-hash-chunk pass).
pub(super) fn publish(
    p: &PayloadInput,
    copy: &dyn Fn(&Path, &str) -> Result<FileEntry, ReleaseError>,
) -> Result<Payload, ReleaseError> {
    Ok(Payload {
        kind: p.kind.clone(),
        name: p.name.clone(),
        file: copy(&p.path, &p.file_name())?,
        images: images(p)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_named_by_its_file_stem_unless_named() {
        let p = PayloadInput::image("/tmp/k3s-airgap-images-amd64.tar");
        assert_eq!(p.name, "k3s-airgap-images-amd64");
        assert_eq!(p.file_name(), "k3s-airgap-images-amd64.tar");
        let p = PayloadInput::image("site=/srv/img/site-apps.tar");
        assert_eq!(
            (p.name.as_str(), p.path.as_path()),
            ("site", Path::new("/srv/img/site-apps.tar"))
        );
        assert_eq!(p.file_name(), "site.tar");
    }

    #[test]
    fn inputs_that_are_not_a_tar_or_of_an_unknown_kind_are_refused_naming_the_file() {
        let t = tempfile::tempdir().unwrap();
        let gz = t.path().join("images.tar.gz");
        fs::write(&gz, [0x1f, 0x8b, 8, 0].repeat(300)).unwrap();
        let e = check(&[PayloadInput::image(gz.to_str().unwrap())])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("images.tar.gz") && e.contains("not a tar archive"),
            "{e}"
        );
        let mut tar = vec![0u8; 1024];
        tar[257..262].copy_from_slice(b"ustar");
        let ok = t.path().join("ok.tar");
        fs::write(&ok, &tar).unwrap();
        assert!(check(&[PayloadInput::image(ok.to_str().unwrap())]).is_ok());
        let mut other = PayloadInput::image(ok.to_str().unwrap());
        other.kind = "helm-chart".into();
        let e = check(&[other]).unwrap_err().to_string();
        assert!(
            e.contains("helm-chart") && e.contains("image-archive"),
            "{e}"
        );
    }
}
