//! The JSON documents of an OCI image layout (image-spec v1.1: `index.json` and image indexes,
//! image manifests, the descriptors they list), as one set of types: the archive check reads
//! them ([`super::archive_images`]), and the workspace's image writers (the test releases'
//! archives, the agent's image, the test fixtures) write them with these and
//! [`LayoutBlobs`].
//!
//! Our own types rather than the `oci-spec` crate: the workspace uses three documents of a
//! few fields each, and that crate's builders and validation would add derive_builder,
//! getset and strum to every build of the node binary for them. Only the fields the workspace
//! reads or writes are here; others in a document read are ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Media type of an OCI image index (`index.json`, a multi-platform image).
pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Media type of an OCI image manifest.
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of an OCI image config.
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of a plain (uncompressed) tar layer.
pub const MEDIA_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Media type of a gzip-compressed tar layer.
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Media type of a Docker manifest list (an image index as Docker writes it).
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Annotation naming an image in an index (what `skopeo` reads).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Annotation naming an image in an index (what containerd's import reads).
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The `oci-layout` file of an image layout.
pub const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// A content descriptor: what a blob is, its digest and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The blob's media type (empty when a document read omits it).
    #[serde(default)]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// The blob's length in bytes.
    pub size: u64,
    /// Annotations (an index entry's image names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The platform of a manifest in a multi-platform index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

impl Descriptor {
    /// The descriptor of `data` as a blob of `media_type`.
    pub fn of(media_type: &str, data: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: sha256_digest(data),
            size: data.len() as u64,
            annotations: BTreeMap::new(),
            platform: None,
        }
    }

    /// This descriptor naming its image `name` for both skopeo and containerd.
    pub fn named(mut self, name: &str) -> Descriptor {
        for key in [ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME] {
            self.annotations.insert(key.to_string(), name.to_string());
        }
        self
    }
}

/// The platform an image of a multi-platform index runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// `amd64`, `arm64`, …
    #[serde(default)]
    pub architecture: String,
    /// `linux`.
    #[serde(default)]
    pub os: String,
}

/// An image index: `index.json`, or a multi-platform image's list of manifests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    /// 2.
    #[serde(default)]
    pub schema_version: u32,
    /// [`MEDIA_INDEX`], where the writer says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests (or nested indexes) it lists.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

impl ImageIndex {
    /// An index of `manifests`, its media type said when `media_type` is set.
    pub fn new(manifests: Vec<Descriptor>, media_type: Option<&str>) -> ImageIndex {
        ImageIndex {
            schema_version: 2,
            media_type: media_type.map(str::to_string),
            manifests,
        }
    }
}

/// An image manifest: one image's config and layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// 2.
    #[serde(default)]
    pub schema_version: u32,
    /// [`MEDIA_MANIFEST`], where the writer says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config.
    pub config: Descriptor,
    /// The layers, bottom first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

impl ImageManifest {
    /// The manifest of an image of `config` and `layers`.
    pub fn new(config: Descriptor, layers: Vec<Descriptor>) -> ImageManifest {
        ImageManifest {
            schema_version: 2,
            media_type: Some(MEDIA_MANIFEST.to_string()),
            config,
            layers,
        }
    }
}

/// `sha256:<hex>` of `data`: a blob's digest.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// The blobs of an image layout being written: content-addressed, each stored once, in the
/// order first added.
#[derive(Debug, Default)]
pub struct LayoutBlobs(Vec<(String, Vec<u8>)>);

impl LayoutBlobs {
    /// Store `data` as a blob of `media_type`; returns its descriptor.
    pub fn add(&mut self, media_type: &str, data: Vec<u8>) -> Descriptor {
        let d = Descriptor::of(media_type, &data);
        if !self.0.iter().any(|(k, _)| *k == d.digest) {
            self.0.push((d.digest.clone(), data));
        }
        d
    }

    /// Store the JSON document `doc` as a blob of `media_type`; returns its descriptor.
    pub fn add_json(&mut self, media_type: &str, doc: &impl Serialize) -> Descriptor {
        self.add(
            media_type,
            serde_json::to_vec(doc).expect("a layout document serializes"),
        )
    }

    /// Each blob's path in the layout (`blobs/sha256/<hex>`) and its bytes.
    pub fn files(&self) -> impl Iterator<Item = (String, &[u8])> {
        self.0.iter().map(|(digest, data)| {
            let path = format!("blobs/{}", digest.replacen(':', "/", 1));
            (path, data.as_slice())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the writers write is what the reader reads, and fields the workspace does not
    /// use are ignored on reading.
    #[test]
    fn documents_round_trip_and_extra_fields_are_ignored() {
        let mut blobs = LayoutBlobs::default();
        let layer = blobs.add(MEDIA_LAYER_TAR, b"layer".to_vec());
        let again = blobs.add(MEDIA_LAYER_TAR, b"layer".to_vec());
        assert_eq!(layer, again);
        let config = blobs.add_json(MEDIA_CONFIG, &serde_json::json!({"os": "linux"}));
        let manifest = ImageManifest::new(config, vec![layer]);
        let d = blobs.add_json(MEDIA_MANIFEST, &manifest).named("x/app:1");
        let index = ImageIndex::new(vec![d.clone()], None);
        let text = serde_json::to_string(&index).unwrap();
        assert!(!text.contains("platform") && !text.contains("\"mediaType\":null"));
        assert_eq!(serde_json::from_str::<ImageIndex>(&text).unwrap(), index);
        let files: Vec<_> = blobs.files().map(|(p, _)| p).collect();
        assert_eq!(files.len(), 3, "the same layer is stored once");
        assert!(files[0].starts_with("blobs/sha256/"), "{files:?}");
        let read: ImageManifest = serde_json::from_str(
            r#"{"schemaVersion":2,"config":{"digest":"sha256:a","size":1,"urls":[]},"extra":1}"#,
        )
        .unwrap();
        assert_eq!(read.config.media_type, "");
        assert!(read.layers.is_empty());
        assert_eq!(d.annotations[ANNOTATION_REF_NAME], "x/app:1");
    }
}
