//! The OCI image layout (image-spec v1.1), written here rather than by podman or buildah: one layer tar, its
//! gzip, the config and manifest JSON and an index naming the tags, each blob under its sha256, packed as an
//! `oci-archive` (the layout directory as a tar, what `skopeo copy oci-archive:` and `podman load` read).
//! No daemon, no root, nothing to install, and deterministic: entries sorted, owned by root, time-stamped
//! with the commit's time, so the same commit and toolchain give the same digest.
use std::{
    collections::BTreeMap,
    fs,
    io::{self, Read, Write},
    path::Path,
};

use anyhow::Context as _;
use flate2::{Compression, write::GzEncoder};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::{File, Meta, Source};

pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub(crate) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// The annotation an OCI layout's index names a tag with (`oci-archive:FILE:TAG` selects by it).
pub(crate) const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// What the image runs.
pub(crate) struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    /// The image's name and tag (`tierlb:0.1.0`): the index's one entry carries it, and so does
    /// docker-archive's `manifest.json`, so that `podman load` and `docker load` name the image so.
    pub name: String,
}

/// What was written.
pub(crate) struct Written {
    pub archive: std::path::PathBuf,
    pub archive_size: u64,
    pub manifest_digest: String,
    pub layer_size: u64,
    pub unpacked_size: u64,
    /// The layer's regular files: path, mode, size.
    pub files: Vec<(String, u32, u64)>,
}

/// The platform the image is for: the host's, the binary's (built here, for here), in OCI's names.
pub(crate) fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

pub(crate) fn write(
    files: &[File],
    config: &ImageConfig,
    meta: &Meta,
    archive: &Path,
    level: Compression,
) -> anyhow::Result<Written> {
    let layer_path = archive.with_extension("layer.tmp");
    let layer = write_layer(files, meta.epoch, &layer_path, level);
    let result = layer.and_then(|layer| {
        let blobs = Blobs::new(&layer, config, meta)?;
        let tmp = archive.with_extension("tmp");
        let size = write_archive(&blobs, &layer_path, meta.epoch, &tmp)?;
        fs::rename(&tmp, archive).with_context(|| format!("renaming to {}", archive.display()))?;
        Ok(Written {
            archive: archive.to_owned(),
            archive_size: size,
            manifest_digest: blobs.manifest_digest(),
            layer_size: layer.compressed.len,
            unpacked_size: layer.tar.len,
            files: layer.files,
        })
    });
    let _ = fs::remove_file(&layer_path);
    result
}

/// A blob's digest ("sha256:...") and size.
#[derive(Clone)]
pub(crate) struct Digested {
    pub digest: String,
    pub len: u64,
}

impl Digested {
    pub(crate) fn of(bytes: &[u8]) -> Self {
        Self { digest: format!("sha256:{:x}", Sha256::digest(bytes)), len: bytes.len() as u64 }
    }

    fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }

    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({"mediaType": media_type, "digest": self.digest, "size": self.len})
    }
}

/// A writer that hashes and counts what passes through it.
pub(crate) struct Hashing<W> {
    pub inner: W,
    hash: Sha256,
    len: u64,
}

impl<W> Hashing<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self { inner, hash: Sha256::new(), len: 0 }
    }

    pub(crate) fn finish(self) -> (W, Digested) {
        (self.inner, Digested { digest: format!("sha256:{:x}", self.hash.finalize()), len: self.len })
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

struct Layer {
    /// The uncompressed tar: its digest is the config's diff_id.
    tar: Digested,
    /// The gzip: the blob.
    compressed: Digested,
    files: Vec<(String, u32, u64)>,
}

/// A tar header for an entry owned by root, with the commit's time.
fn header(kind: tar::EntryType, mode: u32, size: u64, epoch: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(epoch);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// The image's filesystem as one gzipped tar at `path`, streamed (the debug binary is 200 MiB): each parent
/// directory before what it holds, in path order.
fn write_layer(files: &[File], epoch: u64, path: &Path, level: Compression) -> anyhow::Result<Layer> {
    let mut entries: BTreeMap<&str, Option<&File>> = BTreeMap::new();
    for f in files {
        let mut dir = Path::new(&f.path);
        while let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            entries.insert(parent.to_str().expect("paths are UTF-8"), None);
            dir = parent;
        }
        entries.insert(&f.path, Some(f));
    }
    let out = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut tar = tar::Builder::new(Hashing::new(GzEncoder::new(Hashing::new(out), level)));
    let mut listed = Vec::new();
    for (name, file) in entries {
        let Some(file) = file else {
            let mut h = header(tar::EntryType::Directory, 0o755, 0, epoch);
            tar.append_data(&mut h, format!("{name}/"), io::empty())?;
            continue;
        };
        let size = match &file.source {
            Source::Host(p) => {
                let f = fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
                let size = f.metadata()?.len();
                tar.append_data(&mut header(tar::EntryType::Regular, file.mode, size, epoch), name, f)?;
                size
            }
            Source::Text(t) => {
                let size = t.len() as u64;
                tar.append_data(
                    &mut header(tar::EntryType::Regular, file.mode, size, epoch),
                    name,
                    t.as_bytes(),
                )?;
                size
            }
        };
        listed.push((name.to_owned(), file.mode, size));
    }
    let (gz, tar_digest) = tar.into_inner()?.finish();
    let (out, compressed) = gz.finish()?.finish();
    out.sync_all()?;
    Ok(Layer { tar: tar_digest, compressed, files: listed })
}

/// The small blobs (config, manifest) and the index, as bytes.
struct Blobs {
    layer: Digested,
    config: Vec<u8>,
    manifest: Vec<u8>,
    index: Vec<u8>,
    /// docker-archive's `manifest.json`.
    docker: Vec<u8>,
}

impl Blobs {
    fn new(layer: &Layer, image: &ImageConfig, meta: &Meta) -> anyhow::Result<Self> {
        let revision = if meta.dirty { format!("{}-dirty", meta.commit) } else { meta.commit.clone() };
        let annotations = json!({
            "org.opencontainers.image.title": "tierlb",
            "org.opencontainers.image.description":
                "Topology-aware eBPF socket load balancer for Kubernetes Services (agent and CLI)",
            "org.opencontainers.image.version": meta.version,
            "org.opencontainers.image.revision": revision,
            "org.opencontainers.image.licenses": env!("CARGO_PKG_LICENSE"),
            "org.opencontainers.image.created": meta.created,
        });
        // serde_json's maps are sorted (no preserve_order feature): the bytes depend only on the values.
        let config = serde_json::to_vec(&json!({
            "created": meta.created,
            "architecture": architecture(),
            "os": "linux",
            "config": {"Entrypoint": image.entrypoint, "Env": image.env, "Labels": annotations},
            "rootfs": {"type": "layers", "diff_ids": [layer.tar.digest]},
            "history": [{"created": meta.created, "created_by": "cargo xtask image"}],
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": Digested::of(&config).descriptor(CONFIG),
            "layers": [layer.compressed.descriptor(LAYER)],
            "annotations": annotations,
        }))?;
        // One entry: a loader that finds several asks which one to take (podman load: "more than one image
        // in oci"), even when they are one manifest under two tags. The commit is the `revision` annotation.
        let mut entry = Digested::of(&manifest).descriptor(MANIFEST);
        entry["annotations"] = json!({ REF_NAME: image.name });
        entry["platform"] = json!({"architecture": architecture(), "os": "linux"});
        let index =
            serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]}))?;
        // docker-archive's manifest, beside the OCI layout, as `docker save` writes it since Docker 25: the
        // classic image store loads by this file.
        let blob = |d: &Digested| format!("blobs/sha256/{}", d.hex());
        let docker = serde_json::to_vec(&json!([{
            "Config": blob(&Digested::of(&config)),
            "RepoTags": [image.name],
            "Layers": [blob(&layer.compressed)],
        }]))?;
        Ok(Self { layer: layer.compressed.clone(), config, manifest, index, docker })
    }

    fn manifest_digest(&self) -> String {
        Digested::of(&self.manifest).digest
    }
}

/// The layout directory as a tar: `oci-layout`, `index.json`, docker-archive's `manifest.json`,
/// `blobs/sha256/<hex>`.
fn write_archive(blobs: &Blobs, layer_path: &Path, epoch: u64, path: &Path) -> anyhow::Result<u64> {
    let out = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut tar = tar::Builder::new(io::BufWriter::new(out));
    let small = |tar: &mut tar::Builder<_>, name: &str, bytes: &[u8]| {
        let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, epoch);
        tar.append_data(&mut h, name, bytes)
    };
    small(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    small(&mut tar, "index.json", &blobs.index)?;
    small(&mut tar, "manifest.json", &blobs.docker)?;
    for dir in ["blobs/", "blobs/sha256/"] {
        tar.append_data(&mut header(tar::EntryType::Directory, 0o755, 0, epoch), dir, io::empty())?;
    }
    for bytes in [&blobs.config, &blobs.manifest] {
        small(&mut tar, &format!("blobs/sha256/{}", Digested::of(bytes).hex()), bytes)?;
    }
    let layer = fs::File::open(layer_path)?;
    let mut h = header(tar::EntryType::Regular, 0o644, blobs.layer.len, epoch);
    tar.append_data(&mut h, format!("blobs/sha256/{}", blobs.layer.hex()), layer)?;
    let out = tar.into_inner()?.into_inner().map_err(io::IntoInnerError::into_error)?;
    out.sync_all()?;
    Ok(out.metadata()?.len())
}
