//! The image checked without a registry or a runtime: the archive read back as a runtime reads it (every blob
//! matches its digest, the index names the tags, the layer matches the config's diff_id), its filesystem
//! unpacked, and its entrypoint run in a chroot of it with only the config's environment: `--version`, and
//! `plan` on examples/ with the same output as the binary on the host. With `--podman`, the image also runs
//! under podman as the DaemonSet runs it.
use std::{
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, ensure};
use flate2::read::GzDecoder;
use serde_json::{Value, json};

use super::{
    Meta,
    oci::{self, Digested, Hashing},
};
use crate::util;

/// The example `plan` runs on inside the image, and the node it plans for.
const EXAMPLE: &str = "examples/multizone";
const NODE: &str = "a-1";

/// Files a shell or package manager would bring; none may be in the image.
const FORBIDDEN: &[&str] =
    &["bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/bash", "bin/busybox", "usr/bin/apt", "usr/bin/dpkg"];

/// Checks `archive` in `work` (removed afterwards, pass or fail).
pub(crate) fn run(
    archive: &Path,
    meta: &Meta,
    host_binary: &Path,
    work: &Path,
    podman: bool,
) -> anyhow::Result<()> {
    let _ = fs::remove_dir_all(work);
    let result = check(archive, meta, host_binary, work, podman);
    let _ = fs::remove_dir_all(work);
    result
}

fn check(archive: &Path, meta: &Meta, host_binary: &Path, work: &Path, podman: bool) -> anyhow::Result<()> {
    let layout = work.join("layout");
    let root = work.join("root");
    let config = read_layout(archive, &layout, &meta.image_name(), &root)?;
    let entrypoint: Vec<String> = serde_json::from_value(config["config"]["Entrypoint"].clone())?;
    let env: Vec<String> = serde_json::from_value(config["config"]["Env"].clone())?;
    ensure!(!entrypoint.is_empty(), "the image config has no Entrypoint");
    for f in FORBIDDEN {
        ensure!(!root.join(f).exists(), "the image holds /{f}: no shell or package manager belongs in it");
    }
    eprintln!(
        "check: {} read back: digests, one image named {}, diff_id match",
        archive.display(),
        meta.image_name()
    );

    let version = in_root(&root, &entrypoint, &env, &["--version"])?;
    ensure!(version.status.success(), "--version in the image failed: {}", version.stderr);
    ensure!(
        version.stdout.trim() == meta.version_line(),
        "--version in the image says {:?}, not {:?}",
        version.stdout.trim(),
        meta.version_line()
    );
    eprintln!(
        "check: chroot {} {} --version: {}",
        root.display(),
        entrypoint.join(" "),
        version.stdout.trim()
    );

    // The example inside the root, at the same relative path as on the host: the outputs must be identical.
    copy_dir(&util::root().join(EXAMPLE), &root.join(EXAMPLE))?;
    let args = ["plan", "--node", NODE, "--manifests", EXAMPLE, "-o", "json"];
    let inside = in_root(&root, &entrypoint, &env, &args)?;
    let host = Command::new(host_binary).args(args).current_dir(&root).output()?;
    ensure!(inside.status.success(), "plan in the image failed ({}): {}", inside.status, inside.stderr);
    ensure!(
        inside.stdout == String::from_utf8_lossy(&host.stdout),
        "plan in the image printed other output than on the host:\n{}",
        inside.stdout
    );
    let services = serde_json::from_str::<Value>(&inside.stdout)?["services"].as_array().map_or(0, Vec::len);
    eprintln!(
        "check: chroot ... {}: {services} Service ports planned, output identical to the host binary's",
        args.join(" ")
    );
    if podman {
        run_podman(archive, meta, &root.join(EXAMPLE), &args, &inside.stdout)?;
    }
    Ok(())
}

/// Reads the OCI archive into `layout` (verifying every blob's digest), follows the index for every tag to
/// the one manifest, and unpacks its layers into `root`. Returns the image config.
fn read_layout(archive: &Path, layout: &Path, name: &str, root: &Path) -> anyhow::Result<Value> {
    let file = fs::File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let dest = layout.join(&path);
        ensure!(
            path.is_relative() && !path.components().any(|c| c.as_os_str() == ".."),
            "bad path {}",
            path.display()
        );
        if entry.header().entry_type().is_dir() {
            fs::create_dir_all(&dest)?;
            continue;
        }
        fs::create_dir_all(dest.parent().expect("relative path"))?;
        let mut out = Hashing::new(fs::File::create(&dest)?);
        io::copy(&mut entry, &mut out)?;
        let (_, got) = out.finish();
        if let Ok(hex) = path.strip_prefix("blobs/sha256") {
            ensure!(
                got.digest == format!("sha256:{}", hex.display()),
                "blob {} has digest {}",
                path.display(),
                got.digest
            );
        }
    }
    let layout_version: Value = serde_json::from_slice(&fs::read(layout.join("oci-layout"))?)?;
    ensure!(layout_version["imageLayoutVersion"] == "1.0.0", "oci-layout: {layout_version}");
    let index: Value = serde_json::from_slice(&fs::read(layout.join("index.json"))?)?;
    ensure!(index["mediaType"] == oci::INDEX, "index.json mediaType {}", index["mediaType"]);
    let manifests = index["manifests"].as_array().context("index.json has no manifests")?;
    ensure!(manifests.len() == 1, "index.json has {} entries: loaders want one image", manifests.len());
    let named = manifests[0]["annotations"][oci::REF_NAME].as_str();
    ensure!(named == Some(name), "the index names its image {named:?}, not {name:?}");
    let manifest = blob(layout, &manifests[0], oci::MANIFEST)?;
    // docker-archive's manifest.json names the same image, config and layers.
    let docker: Value = serde_json::from_slice(&fs::read(layout.join("manifest.json"))?)?;
    let path = |d: &Value| d["digest"].as_str().map(|x| format!("blobs/{}", x.replace(':', "/")));
    let layers: Vec<_> = manifest["layers"].as_array().into_iter().flatten().map(path).collect();
    let want = json!([{"Config": path(&manifest["config"]), "RepoTags": [name], "Layers": layers}]);
    ensure!(docker == want, "manifest.json is {docker}, not {want}");
    let config = blob(layout, &manifest["config"], oci::CONFIG)?;
    let diff_ids = config["rootfs"]["diff_ids"].as_array().context("config has no rootfs.diff_ids")?;
    let layers = manifest["layers"].as_array().context("manifest has no layers")?;
    ensure!(layers.len() == diff_ids.len(), "{} layers, {} diff_ids", layers.len(), diff_ids.len());
    ensure!(config["architecture"] == oci::architecture() && config["os"] == "linux", "platform of {config}");
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        ensure!(layer["mediaType"] == oci::LAYER, "layer mediaType {}", layer["mediaType"]);
        let got = unpack_layer(&blob_path(layout, layer)?, root)?;
        ensure!(
            diff_id == got.digest.as_str(),
            "layer's uncompressed digest {} is not diff_id {diff_id}",
            got.digest
        );
    }
    Ok(config)
}

/// The blob a descriptor names, checked against its media type and size, parsed as JSON.
fn blob(layout: &Path, descriptor: &Value, media_type: &str) -> anyhow::Result<Value> {
    ensure!(descriptor["mediaType"] == media_type, "{descriptor} is not a {media_type}");
    let bytes = fs::read(blob_path(layout, descriptor)?)?;
    let got = Digested::of(&bytes);
    ensure!(
        descriptor["digest"] == got.digest.as_str() && descriptor["size"] == got.len,
        "{descriptor}: blob differs"
    );
    let value: Value = serde_json::from_slice(&bytes)?;
    // A blob's own mediaType, where it has one, must agree with the descriptor's.
    ensure!(
        value.get("mediaType").is_none_or(|m| m == media_type),
        "{media_type} blob says {}",
        value["mediaType"]
    );
    Ok(value)
}

fn blob_path(layout: &Path, descriptor: &Value) -> anyhow::Result<PathBuf> {
    let digest = descriptor["digest"].as_str().context("descriptor without digest")?;
    let hex = digest.strip_prefix("sha256:").context("not a sha256 digest")?;
    let path = layout.join("blobs/sha256").join(hex);
    ensure!(path.exists(), "the archive lacks blob {digest}");
    let size = descriptor["size"].as_u64().context("descriptor without size")?;
    ensure!(fs::metadata(&path)?.len() == size, "blob {digest} is not {size} bytes");
    Ok(path)
}

/// Unpacks a gzipped layer tar into `root` (refusing paths that leave it); returns the uncompressed digest.
fn unpack_layer(path: &Path, root: &Path) -> anyhow::Result<Digested> {
    fs::create_dir_all(root)?;
    let mut tar = tar::Archive::new(Hashing::new(GzDecoder::new(fs::File::open(path)?)));
    tar.set_preserve_permissions(true);
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        ensure!(entry.unpack_in(root)?, "layer entry {} leaves the root", path.display());
    }
    // The tar's end (zero blocks, padding) counts in the diff_id too.
    let mut rest = tar.into_inner();
    io::copy(&mut rest, &mut io::sink())?;
    Ok(rest.finish().1)
}

struct Ran {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs the entrypoint with `args` in a chroot of `root` with only the image's environment, as a runtime
/// would start it (minus the namespaces; podman below adds them where it exists).
fn in_root(root: &Path, entrypoint: &[String], env: &[String], args: &[&str]) -> anyhow::Result<Ran> {
    // Found before the environment is replaced: the image's PATH is not the host's.
    let chroot = find_program("chroot")?;
    let mut cmd = Command::new(chroot);
    cmd.arg(root).args(entrypoint).args(args).env_clear();
    for kv in env {
        let (k, v) = kv.split_once('=').with_context(|| format!("Env entry {kv:?}"))?;
        cmd.env(k, v);
    }
    let out = cmd.output().with_context(|| util::show(&cmd))?;
    Ok(Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn find_program(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not on PATH (coreutils)"))
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()))?;
        } else {
            fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// The image run as the DaemonSet runs it (host network, all capabilities dropped but the three it adds,
/// read-only root, no new privileges), on the example mounted read-only, with the same `plan` output. Opt-in
/// (`--podman`): `cargo xtask setup` does not install podman (the chroot checks the image's contents, CI
/// needs no container runtime), and podman needs a host it can run containers on (see deploy/README.md).
fn run_podman(
    archive: &Path,
    meta: &Meta,
    example: &Path,
    args: &[&str],
    expected: &str,
) -> anyhow::Result<()> {
    let image = format!("oci-archive:{}:{}", archive.display(), meta.version);
    let mut cmd = Command::new("podman");
    // --rmi: the image podman pulled from the archive goes with the container. The limits are lowered, which
    // needs no privilege: podman's defaults raise them, which fails where podman itself runs in a container
    // without CAP_SYS_RESOURCE; the agent opens few files.
    cmd.args([
        "run",
        "--rm",
        "--rmi",
        "--network=host",
        "--cap-drop=all",
        "--cap-add=BPF,NET_ADMIN,SYS_ADMIN",
    ])
    .args(["--read-only", "--security-opt=no-new-privileges", "--user=0"])
    .args(["--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"])
    .arg(format!("--volume={}:/{EXAMPLE}:ro", example.display()))
    .arg(&image)
    .args(args);
    eprintln!("+ {}", util::show(&cmd));
    let out = cmd.output().with_context(|| format!("{} (is podman installed?)", util::show(&cmd)))?;
    ensure!(out.status.success(), "podman failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    ensure!(out.stdout == expected.as_bytes(), "podman run printed other output than the host binary");
    eprintln!("check: podman run {image} {}: output identical to the host binary's", args.join(" "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{File, Source, oci::ImageConfig};

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("xtask-image-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn meta() -> Meta {
        Meta {
            version: "9.8.7".into(),
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            dirty: false,
            epoch: 1_700_000_000,
            created: "2023-11-14T22:13:20Z".into(),
        }
    }

    fn write(archive: &Path) -> oci::Written {
        let files = [
            File { path: "usr/bin/tool".into(), mode: 0o755, source: Source::Text("#!not a shell\n") },
            File {
                path: "etc/nsswitch.conf".into(),
                mode: 0o644,
                source: Source::Text("hosts: files dns\n"),
            },
        ];
        let config = ImageConfig {
            entrypoint: vec!["/usr/bin/tool".into()],
            env: vec!["PATH=/usr/bin".into()],
            name: meta().image_name(),
        };
        oci::write(&files, &config, &meta(), archive, flate2::Compression::fast()).unwrap()
    }

    #[test]
    fn the_same_input_gives_the_same_archive() {
        let dir = Scratch::new("same");
        let (a, b) = (dir.0.join("a.tar"), dir.0.join("b.tar"));
        assert_eq!(write(&a).manifest_digest, write(&b).manifest_digest);
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
    }

    #[test]
    fn an_archive_reads_back_with_one_named_image_its_config_and_files() {
        let dir = Scratch::new("read");
        let archive = dir.0.join("image.tar");
        let written = write(&archive);
        assert_eq!(
            written.files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
            ["etc/nsswitch.conf", "usr/bin/tool"]
        );
        let root = dir.0.join("root");
        let config = read_layout(&archive, &dir.0.join("layout"), &meta().image_name(), &root).unwrap();
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/usr/bin/tool"]));
        assert_eq!(config["config"]["Labels"]["org.opencontainers.image.revision"], meta().commit.as_str());
        assert_eq!(fs::read_to_string(root.join("usr/bin/tool")).unwrap(), "#!not a shell\n");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &fs::metadata(root.join("usr/bin/tool")).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o755);
        // One image, named as podman and docker name it on load; another name is refused.
        let index: Value =
            serde_json::from_slice(&fs::read(dir.0.join("layout/index.json")).unwrap()).unwrap();
        assert_eq!(index["manifests"].as_array().unwrap().len(), 1, "{index}");
        assert_eq!(index["manifests"][0]["annotations"][oci::REF_NAME], "tierlb:9.8.7");
        let err = read_layout(&archive, &dir.0.join("layout2"), "tierlb:9.8.7-x", &dir.0.join("root2"))
            .unwrap_err();
        assert!(format!("{err:#}").contains("names its image"), "{err:#}");
    }

    #[test]
    fn a_changed_blob_is_refused() {
        let dir = Scratch::new("tamper");
        let archive = dir.0.join("image.tar");
        write(&archive);
        // Flip one byte inside the last blob's data (the layer, written last), keeping the tar valid.
        let mut bytes = fs::read(&archive).unwrap();
        let end = bytes.len() - 1024; // two zero blocks end a tar
        let last_data = (0..end).rev().find(|&i| bytes[i] != 0).unwrap();
        bytes[last_data] ^= 0xff;
        fs::write(&archive, &bytes).unwrap();
        let err = read_layout(&archive, &dir.0.join("layout"), &meta().image_name(), &dir.0.join("root"))
            .unwrap_err();
        assert!(format!("{err:#}").contains("digest"), "{err:#}");
    }
}
