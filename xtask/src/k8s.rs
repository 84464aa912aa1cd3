//! Kubernetes' control plane for the tests and the demo, built here from its own code: the Go module in
//! `controlplane/` (kube-apiserver, kube-controller-manager, kube-proxy and kubectl v1.36.3, etcd 3.6 embedded)
//! compiled once into a cache keyed by what goes into it, and linked from `target/k8s`, where the tests look.
//!
//! The key is a hash of the module's go.mod, go.sum and Go sources, the Go toolchain's version and the link
//! flags: a second setup with nothing changed only checks the key (the first build takes about five minutes on
//! two CPUs, most of it compiling Kubernetes; Go's own build cache makes a rebuild after a small change take
//! seconds).
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;
use sha2::Digest as _;

use crate::util;

/// The release built: the story's cluster ran it.
pub(crate) const VERSION: &str = "v1.36.3";

/// The names the binary answers to (each a link to it in `target/k8s`).
pub(crate) const PROGRAMS: &[&str] =
    &["kube-apiserver", "kube-controller-manager", "kube-proxy", "kubectl", "etcd", "etcd-compact", "pki"];

/// The binary's name.
const BINARY: &str = "tierlb-k8s";

/// `-ldflags` stamping the version where `kubectl version` and the components' `--version` read it (without it
/// they report v0.0.0-master, which fails version-skew checks).
fn ldflags() -> String {
    let (major, minor) = {
        let mut parts = VERSION.trim_start_matches('v').split('.');
        (parts.next().unwrap_or("1").to_owned(), parts.next().unwrap_or("0").to_owned())
    };
    let mut flags = String::from("-s -w");
    for pkg in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
        let _ = write!(
            flags,
            " -X {pkg}.gitVersion={VERSION} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} \
             -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
        );
    }
    flags
}

fn module_dir() -> PathBuf {
    util::root().join("controlplane")
}

/// Where built binaries are kept: `$XDG_CACHE_HOME/tierlb/k8s` (default `~/.cache/tierlb/k8s`).
fn cache_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"),
        PathBuf::from,
    );
    base.join("tierlb/k8s")
}

/// The cache key: everything the binary is built from.
fn key(go_version: &str) -> anyhow::Result<String> {
    let dir = module_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let go_source = p.extension().is_some_and(|e| e == "go") && !name.ends_with("_test.go");
            name == "go.mod" || name == "go.sum" || go_source
        })
        .collect();
    files.sort();
    let mut hash = sha2::Sha256::new();
    for f in &files {
        hash.update(f.file_name().unwrap_or_default().as_encoded_bytes());
        hash.update(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?);
    }
    hash.update(go_version.as_bytes());
    hash.update(ldflags().as_bytes());
    let digest = hash.finalize();
    Ok(digest.iter().take(8).fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    }))
}

/// Build the control plane unless the cache has it, then point `target/k8s` at it. Returns that directory.
pub(crate) fn build() -> anyhow::Result<PathBuf> {
    let go_version = util::output(Command::new("go").arg("version"))
        .context("Go is missing: this machine kind has Go 1.26 (the control plane is built with it)")?;
    let key = key(&go_version)?;
    let dir = cache_root().join(&key);
    let binary = dir.join(BINARY);
    if binary.exists() {
        eprintln!("setup: Kubernetes {VERSION} control plane present ({})", dir.display());
    } else {
        eprintln!(
            "setup: building Kubernetes {VERSION} (kube-apiserver, kube-controller-manager, kube-proxy, kubectl) \
             and etcd from controlplane/ with {go_version}: about five minutes the first time"
        );
        let started = std::time::Instant::now();
        std::fs::create_dir_all(&dir)?;
        let partial = dir.join(format!("{BINARY}.partial"));
        util::run(
            Command::new("go")
                .current_dir(module_dir())
                .args(["build", "-trimpath", "-mod=readonly", "-ldflags", &ldflags(), "-o"])
                .arg(&partial)
                .arg("."),
        )?;
        std::fs::rename(&partial, &binary)?;
        eprintln!("setup: control plane built in {:.0} s", started.elapsed().as_secs_f64());
    }
    for program in PROGRAMS {
        let link = dir.join(program);
        if std::fs::read_link(&link).ok().as_deref() != Some(Path::new(BINARY)) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(BINARY, &link)?;
        }
    }
    let target = util::target_dir();
    std::fs::create_dir_all(&target)?;
    let link = target.join("k8s");
    if std::fs::read_link(&link).ok().as_deref() != Some(dir.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link)?;
    }
    prune(&key);
    Ok(dir)
}

/// Remove builds of other keys (each is 170 MB).
fn prune(keep: &str) {
    let Ok(entries) = std::fs::read_dir(cache_root()) else { return };
    for e in entries.flatten() {
        if e.file_name().to_str() != Some(keep) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// gofmt and go vet on the module (part of the lints of `cargo xtask test`).
pub(crate) fn lint() -> anyhow::Result<()> {
    let unformatted = util::output(Command::new("gofmt").arg("-l").arg(module_dir())).unwrap_or_default();
    anyhow::ensure!(unformatted.is_empty(), "gofmt: these files need formatting (gofmt -w):\n{unformatted}");
    util::run(Command::new("go").current_dir(module_dir()).args(["vet", "-mod=readonly", "."]))
}
