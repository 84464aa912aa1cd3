//! The image checked as a runtime takes it: loaded from the archive by podman (which verifies every blob
//! against its digest) under the name deploy/ references, its config and labels read back, its filesystem
//! compared with what was staged, and its entrypoint run in a chroot of it with only the config's
//! environment: `--version`, and `plan` on examples/ with the same output as the binary on the host. With
//! `--podman`, the image also runs under podman as the DaemonSet runs it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use super::{Built, ENTRYPOINT, Meta, store::Store};
use crate::util;

/// The example `plan` runs on inside the image, and the node it plans for.
const EXAMPLE: &str = "examples/multizone";
const NODE: &str = "a-1";

/// Files a shell or package manager would bring; none may be in the image.
const FORBIDDEN: &[&str] =
    &["bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/bash", "bin/busybox", "usr/bin/apt", "usr/bin/dpkg"];

/// Checks `built` in `work` (removed afterwards, pass or fail).
pub(crate) fn run(
    built: &Built,
    meta: &Meta,
    host_binary: &Path,
    work: &Path,
    podman: bool,
) -> anyhow::Result<()> {
    let _ = fs::remove_dir_all(work);
    let result = check(built, meta, host_binary, work, podman);
    let _ = fs::remove_dir_all(work);
    result
}

fn check(built: &Built, meta: &Meta, host_binary: &Path, work: &Path, podman: bool) -> anyhow::Result<()> {
    let store = Store::new(&work.join("store"))?;
    let name = format!("localhost/{}", meta.image_name());
    let loaded = Store::run(store.cmd("podman").arg("load").arg("--input").arg(&built.archive))?;
    ensure!(
        loaded_names(&loaded) == [name.as_str()],
        "podman load named the archive's images {:?}, not [{name:?}]",
        loaded_names(&loaded)
    );
    let inspect: Value =
        serde_json::from_str(&Store::run(store.cmd("podman").args(["image", "inspect", &name]))?)?;
    let image = &inspect[0];
    let (entrypoint, env) = config_of(image, built, meta)?;
    eprintln!(
        "check: podman load {}: {name}, manifest {}, labels and config as built",
        built.archive.display(),
        built.manifest_digest
    );

    let root = work.join("root");
    let mounted = Store::run(store.cmd("podman").args(["image", "mount", &name]))?;
    fs::create_dir_all(&root)?;
    let copied = Store::run(Command::new("cp").arg("-a").arg(format!("{}/.", mounted.trim())).arg(&root));
    Store::run(store.cmd("podman").args(["image", "unmount", &name]))?;
    copied?;
    let mut files = Vec::new();
    list_files(&root, &root, &mut files)?;
    files.sort();
    ensure!(files == built.files, "the image holds {files:?}, not the staged {:?}", built.files);
    for f in FORBIDDEN {
        ensure!(!root.join(f).exists(), "the image holds /{f}: no shell or package manager belongs in it");
    }

    let version = in_root(&root, &entrypoint, &env, &["--version"])?;
    ensure!(version.status.success(), "--version in the image failed: {}", version.stderr);
    ensure!(
        version.stdout.trim().starts_with(&meta.version_prefix()),
        "--version in the image says {:?}, not {:?}...",
        version.stdout.trim(),
        meta.version_prefix()
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
        run_podman(&store, &name, &root.join(EXAMPLE), &args, &inside.stdout)?;
    }
    Ok(())
}

/// The names `podman load` prints (`Loaded image: localhost/tierlb:0.1.0`, several comma-separated).
fn loaded_names(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter_map(|l| l.split_once("Loaded image").and_then(|(_, rest)| rest.split_once(':')))
        .flat_map(|(_, names)| names.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// Checks what `podman image inspect` says of the loaded image against the build; returns its entrypoint and
/// environment.
fn config_of(image: &Value, built: &Built, meta: &Meta) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    ensure!(
        image["Digest"] == built.manifest_digest.as_str(),
        "loaded manifest {} is not the built {}",
        image["Digest"],
        built.manifest_digest
    );
    ensure!(
        image["Os"] == "linux" && image["Architecture"] == architecture(),
        "platform {}/{}",
        image["Os"],
        image["Architecture"]
    );
    let labels = &image["Labels"];
    ensure!(
        labels["org.opencontainers.image.revision"] == meta.commit.as_str(),
        "revision label {}",
        labels["org.opencontainers.image.revision"]
    );
    ensure!(
        labels["org.opencontainers.image.version"] == meta.version.as_str(),
        "version label {}",
        labels["org.opencontainers.image.version"]
    );
    let entrypoint: Vec<String> = serde_json::from_value(image["Config"]["Entrypoint"].clone())?;
    let env: Vec<String> = serde_json::from_value(image["Config"]["Env"].clone())?;
    ensure!(entrypoint == [ENTRYPOINT], "the image's Entrypoint is {entrypoint:?}, not [{ENTRYPOINT:?}]");
    Ok((entrypoint, env))
}

/// The platform the image is for: the host's, the binary's (built here, for here), in OCI's names.
fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The regular files under `dir`: path relative to `root`, mode, size. Anything else but a directory is an
/// error (the image holds no links or devices).
fn list_files(root: &Path, dir: &Path, out: &mut Vec<(String, u32, u64)>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = fs::symlink_metadata(entry.path())?;
        if meta.is_dir() {
            list_files(root, &entry.path(), out)?;
            continue;
        }
        let path =
            entry.path().strip_prefix(root).expect("under root").to_str().context("not UTF-8")?.to_owned();
        ensure!(meta.is_file(), "/{path} in the image is not a regular file");
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        out.push((path, mode, meta.len()));
    }
    Ok(())
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
/// (`--podman`): it needs a host podman can run containers on (see deploy/README.md); the chroot runs the
/// same files everywhere.
fn run_podman(
    store: &Store,
    image: &str,
    example: &Path,
    args: &[&str],
    expected: &str,
) -> anyhow::Result<()> {
    let mut cmd = store.cmd("podman");
    // The limits are lowered, which needs no privilege: podman's defaults raise them, which fails where podman
    // itself runs in a container without CAP_SYS_RESOURCE; the agent opens few files.
    cmd.args(["run", "--rm", "--network=host", "--cap-drop=all", "--cap-add=BPF,NET_ADMIN,SYS_ADMIN"])
        .args(["--read-only", "--security-opt=no-new-privileges", "--user=0"])
        .args(["--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"])
        .arg(format!("--volume={}:/{EXAMPLE}:ro", example.display()))
        .arg(image)
        .args(args);
    eprintln!("+ {}", util::show(&cmd));
    let out = Store::run(&mut cmd)?;
    ensure!(out == expected, "podman run printed other output than the host binary");
    eprintln!("check: podman run {image} {}: output identical to the host binary's", args.join(" "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_loads_name_their_images() {
        assert_eq!(loaded_names("Loaded image: localhost/tierlb:0.1.0\n"), ["localhost/tierlb:0.1.0"]);
        assert_eq!(loaded_names("Loaded image(s): a:1,b:2\n"), ["a:1", "b:2"]);
        assert!(loaded_names("Getting image source signatures\n").is_empty());
    }
}
