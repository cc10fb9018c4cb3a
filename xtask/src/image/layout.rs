//! The OCI image layout (image-spec v1.1): `oci-layout`, `index.json`, and the blobs (the
//! gzipped layers, the config, the manifest) under `blobs/sha256/`, every JSON document
//! with sorted keys and no insignificant whitespace; and the oci-archive, the same layout
//! as one reproducible tar.

use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

use super::tar::{Entry, Tree, gzip};
use crate::artefacts::sha256_hex;

pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One content-addressed blob.
#[derive(Clone, Debug)]
pub(crate) struct Blob {
    pub(crate) media_type: &'static str,
    pub(crate) bytes: Vec<u8>,
}

impl Blob {
    pub(crate) fn json(media_type: &'static str, value: &Value) -> anyhow::Result<Self> {
        Ok(Self {
            media_type,
            bytes: canonical_json(value)?,
        })
    }

    pub(crate) fn digest(&self) -> String {
        format!("sha256:{}", sha256_hex(&self.bytes))
    }

    pub(crate) fn descriptor(&self) -> Value {
        json!({
            "mediaType": self.media_type,
            "digest": self.digest(),
            "size": self.bytes.len(),
        })
    }
}

/// A layer: the gzipped tar and the digest of the tar itself (the config's `diff_id`).
#[derive(Debug)]
pub(crate) struct Layer {
    pub(crate) blob: Blob,
    pub(crate) diff_id: String,
    pub(crate) unpacked_bytes: u64,
}

impl Layer {
    pub(crate) fn new(tree: Tree, mtime: u64) -> anyhow::Result<Self> {
        let unpacked_bytes = tree.content_bytes();
        let tar = tree.write(mtime)?;
        Ok(Self {
            diff_id: format!("sha256:{}", sha256_hex(&tar)),
            blob: Blob {
                media_type: LAYER,
                bytes: gzip(&tar)?,
            },
            unpacked_bytes,
        })
    }
}

/// Serialized with sorted keys (serde_json's map is ordered unless its `preserve_order`
/// feature is on; the test below would catch that).
pub(crate) fn canonical_json(value: &Value) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(value)?)
}

/// What the image is: its layers, config and manifest, and its place in an index.
#[derive(Debug)]
pub(crate) struct Image {
    pub(crate) layers: Vec<Layer>,
    pub(crate) config: Blob,
    pub(crate) manifest: Blob,
    pub(crate) index: Value,
}

impl Image {
    /// `config` gets `rootfs` from the layers; the manifest carries `annotations`; the
    /// index names the manifest `ref_name` for `platform`.
    pub(crate) fn new(
        layers: Vec<Layer>,
        mut config: Value,
        annotations: &Value,
        ref_name: &str,
        platform: &Value,
    ) -> anyhow::Result<Self> {
        config["rootfs"] = json!({
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        });
        let config = Blob::json(CONFIG, &config)?;
        let manifest = Blob::json(
            MANIFEST,
            &json!({
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": config.descriptor(),
                "layers": layers.iter().map(|l| l.blob.descriptor()).collect::<Vec<_>>(),
                "annotations": annotations,
            }),
        )?;
        let mut descriptor = manifest.descriptor();
        descriptor["platform"] = platform.clone();
        let mut annotations = annotations.clone();
        annotations["org.opencontainers.image.ref.name"] = Value::from(ref_name);
        descriptor["annotations"] = annotations;
        let index = json!({
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [descriptor],
        });
        Ok(Self {
            layers,
            config,
            manifest,
            index,
        })
    }

    /// The manifest's digest: what a registry and `skopeo inspect` call the image's.
    pub(crate) fn digest(&self) -> String {
        self.manifest.digest()
    }

    /// Bytes a registry stores and a node pulls: the gzipped layers and the config.
    pub(crate) fn compressed_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.blob.bytes.len() as u64)
            .sum::<u64>()
            + self.config.bytes.len() as u64
    }

    pub(crate) fn unpacked_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.unpacked_bytes).sum()
    }

    fn files(&self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut files = vec![
            (
                "oci-layout".to_owned(),
                canonical_json(&json!({ "imageLayoutVersion": "1.0.0" }))?,
            ),
            ("index.json".to_owned(), canonical_json(&self.index)?),
        ];
        let blobs = self
            .layers
            .iter()
            .map(|l| &l.blob)
            .chain([&self.config, &self.manifest]);
        for blob in blobs {
            let hex = blob.digest().trim_start_matches("sha256:").to_owned();
            files.push((format!("blobs/sha256/{hex}"), blob.bytes.clone()));
        }
        Ok(files)
    }

    /// Writes the layout into `dir` (emptied first).
    pub(crate) fn write_layout(&self, dir: &Path) -> anyhow::Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot empty {}", dir.display()))?;
        }
        for (path, bytes) in self.files()? {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, bytes)?;
        }
        Ok(())
    }

    /// The layout as one tar (`oci-archive:` in skopeo's words), every entry at `mtime`.
    pub(crate) fn archive(&self, mtime: u64) -> anyhow::Result<Vec<u8>> {
        let mut tree = Tree::default();
        for (path, bytes) in self.files()? {
            tree.add(Entry::file(&path, 0o644, bytes))?;
        }
        tree.write(mtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_written_with_sorted_keys_and_no_spaces() {
        let value = json!({"b": 1, "a": {"d": [1, 2], "c": "x"}});
        assert_eq!(
            String::from_utf8(canonical_json(&value).unwrap()).unwrap(),
            r#"{"a":{"c":"x","d":[1,2]},"b":1}"#
        );
    }

    #[test]
    fn the_index_names_the_manifest_which_names_the_config_and_layers() {
        let mut tree = Tree::default();
        tree.add(Entry::file("hello", 0o644, b"hi\n".to_vec()))
            .unwrap();
        let layer = Layer::new(tree, 1).unwrap();
        let diff_id = layer.diff_id.clone();
        let layer_digest = layer.blob.digest();
        let image = Image::new(
            vec![layer],
            json!({"architecture": "amd64", "os": "linux"}),
            &json!({"org.opencontainers.image.version": "1.0.0"}),
            "1.0.0",
            &json!({"architecture": "amd64", "os": "linux"}),
        )
        .unwrap();
        let manifest: Value = serde_json::from_slice(&image.manifest.bytes).unwrap();
        assert_eq!(manifest["config"]["digest"], image.config.digest());
        assert_eq!(manifest["layers"][0]["digest"], layer_digest);
        let config: Value = serde_json::from_slice(&image.config.bytes).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], diff_id);
        let entry = &image.index["manifests"][0];
        assert_eq!(entry["digest"], image.digest());
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"],
            "1.0.0"
        );
        assert_eq!(entry["size"], image.manifest.bytes.len());
        let dir = tempfile::tempdir().unwrap();
        image.write_layout(dir.path()).unwrap();
        let blob = dir
            .path()
            .join("blobs/sha256")
            .join(image.digest().trim_start_matches("sha256:"));
        assert_eq!(std::fs::read(blob).unwrap(), image.manifest.bytes);
        assert_eq!(image.archive(1).unwrap(), image.archive(1).unwrap());
    }
}
