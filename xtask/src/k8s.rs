//! Kubernetes' control plane for the tests and the demo, built here from its own code: the Go module in
//! `controlplane/` (kube-apiserver, kube-controller-manager, kube-proxy and kubectl v1.36.3, etcd 3.6 embedded)
//! compiled once into a cache keyed by what goes into it, and linked from `target/k8s`, where the tests look.
//! Beside it, kube-proxy alone at other releases ([`PROXY_RELEASES`]), each from a small module of its own in
//! `controlplane/kube-proxy-releases/<release>/` that requires that release of k8s.io/kubernetes, cached the
//! same way and linked as `target/k8s/kube-proxy-<release>`; and Helm v4 from `controlplane/helm/`, linked as
//! `target/k8s/helm` (the chart's tests).
//!
//! The key is a hash of the module's go.mod, go.sum and Go sources, the Go toolchain's version and the link
//! flags: a second setup with nothing changed only checks the keys (the first build of the control plane takes
//! about five minutes on two CPUs, most of it compiling Kubernetes, and each kube-proxy release three to four
//! more, since little of another release's code is shared; Go's own build cache makes a rebuild after a small
//! change take seconds).
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

/// The releases of kube-proxy built alone, each from `controlplane/kube-proxy-releases/<release>/` (v1.36.3 is
/// in [`BINARY`]), so the tests can compare tierlb with older and newer kube-proxies:
/// `target/k8s/kube-proxy-<release>`.
pub(crate) const PROXY_RELEASES: &[&str] = &["v1.34.4", "v1.35.4", "v1.37.2"];

/// The name of a kube-proxy release's binary in its cache directory.
const PROXY_BINARY: &str = "kube-proxy";

/// Helm, built from its own module in `controlplane/helm/` the same way and linked as `target/k8s/helm`: the
/// chart's tests (deploy/helm/tierlb) lint and render it as users do.
const HELM_VERSION: &str = "v4.3.2";

/// Helm's link flags: its version where `helm version` reads it (else it says v4.3).
fn helm_ldflags() -> String {
    format!("-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION}")
}

/// `-ldflags` stamping the version where `kubectl version` and the components' `--version` read it (without it
/// they report v0.0.0-master, which fails version-skew checks).
fn ldflags(version: &str) -> String {
    let (major, minor) = {
        let mut parts = version.trim_start_matches('v').split('.');
        (parts.next().unwrap_or("1").to_owned(), parts.next().unwrap_or("0").to_owned())
    };
    let mut flags = String::from("-s -w");
    for pkg in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
        let _ = write!(
            flags,
            " -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} \
             -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
        );
    }
    flags
}

fn module_dir() -> PathBuf {
    util::root().join("controlplane")
}

/// The module that builds kube-proxy `release` alone.
fn proxy_module_dir(release: &str) -> PathBuf {
    module_dir().join("kube-proxy-releases").join(release)
}

/// The module that builds Helm.
fn helm_module_dir() -> PathBuf {
    module_dir().join("helm")
}

/// Every Go module here: the control plane's, each kube-proxy release's, then Helm's.
fn module_dirs() -> Vec<PathBuf> {
    std::iter::once(module_dir())
        .chain(PROXY_RELEASES.iter().map(|r| proxy_module_dir(r)))
        .chain([helm_module_dir()])
        .collect()
}

/// Where built binaries are kept: `$XDG_CACHE_HOME/tierlb/k8s` (default `~/.cache/tierlb/k8s`).
fn cache_root() -> PathBuf {
    util::cache_dir().join("k8s")
}

/// The cache key of the module in `dir` stamped as `version`: everything its binary is built from.
fn key(dir: &Path, version: &str, go_version: &str) -> anyhow::Result<String> {
    key_with(dir, &ldflags(version), go_version)
}

/// The cache key of the module in `dir` built with `ldflags`.
fn key_with(dir: &Path, ldflags: &str, go_version: &str) -> anyhow::Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
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
    hash.update(ldflags.as_bytes());
    let digest = hash.finalize();
    Ok(util::hex(&digest[..8]))
}

/// `go build` of the module in `dir`, stamped as `version`, into `binary` (through a `.partial` file, so an
/// interrupted build leaves no binary that looks finished).
fn go_build(dir: &Path, version: &str, binary: &Path) -> anyhow::Result<()> {
    go_build_with(dir, &ldflags(version), binary)
}

/// `go build` of the module in `dir` with these link flags into `binary` (see `go_build`).
fn go_build_with(dir: &Path, ldflags: &str, binary: &Path) -> anyhow::Result<()> {
    use std::io::BufRead as _;
    let partial = binary.with_extension("partial");
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .args(["build", "-v", "-trimpath", "-mod=readonly", "-ldflags", ldflags, "-o"])
        .arg(&partial)
        .arg(".")
        .stderr(std::process::Stdio::piped());
    eprintln!("+ {}", util::show(&cmd));
    let mut child = cmd.spawn().context("go build")?;
    // `-v` names each package as it is compiled: counted, and shown as a line of progress every 20 s; any
    // other line (an error) is passed on.
    let started = std::time::Instant::now();
    let (mut packages, mut shown) = (0, started);
    let mut other = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().context("go build's stderr")?).lines() {
        let line = line?;
        if line.contains(' ') || line.starts_with('#') {
            eprintln!("{line}");
            other.push(line);
        } else {
            packages += 1;
        }
        if shown.elapsed() >= std::time::Duration::from_secs(20) {
            shown = std::time::Instant::now();
            eprintln!(
                "setup: go build {}: {packages} packages compiled ({:.0} s)",
                dir.display(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let status = child.wait()?;
    anyhow::ensure!(
        status.success(),
        "go build in {} failed ({status}): {}",
        dir.display(),
        other.join("\n")
    );
    eprintln!("setup: go build {}: {packages} packages", dir.display());
    std::fs::rename(&partial, binary)?;
    Ok(())
}

/// Make `link` a symbolic link to `to` unless it already is one.
fn symlink(to: &Path, link: &Path) -> anyhow::Result<()> {
    if std::fs::read_link(link).ok().as_deref() != Some(to) {
        let _ = std::fs::remove_file(link);
        std::os::unix::fs::symlink(to, link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

/// Build the control plane and each kube-proxy release unless the cache has them, then point `target/k8s` at
/// the control plane's directory, where each release is linked as `kube-proxy-<release>`. Returns that
/// directory.
pub(crate) fn build() -> anyhow::Result<PathBuf> {
    let go_version = util::output(Command::new("go").arg("version"))
        .context("Go is missing: this machine kind has Go 1.26 (the control plane is built with it)")?;
    let main_key = key(&module_dir(), VERSION, &go_version)?;
    let dir = cache_root().join(&main_key);
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
        go_build(&module_dir(), VERSION, &binary)?;
        eprintln!("setup: control plane built in {:.0} s", started.elapsed().as_secs_f64());
    }
    for program in PROGRAMS {
        symlink(Path::new(BINARY), &dir.join(program))?;
    }
    let mut keep = vec![main_key];
    for release in PROXY_RELEASES {
        let proxy_key = key(&proxy_module_dir(release), release, &go_version)?;
        let proxy_dir = cache_root().join(&proxy_key);
        let proxy = proxy_dir.join(PROXY_BINARY);
        if proxy.exists() {
            eprintln!("setup: kube-proxy {release} present ({})", proxy_dir.display());
        } else {
            let started = std::time::Instant::now();
            std::fs::create_dir_all(&proxy_dir)?;
            go_build(&proxy_module_dir(release), release, &proxy)?;
            eprintln!("setup: kube-proxy {release} built in {:.0} s", started.elapsed().as_secs_f64());
        }
        // Relative, like the programs' links, so `target/k8s/kube-proxy-<release>` resolves through the cache.
        symlink(
            &Path::new("..").join(&proxy_key).join(PROXY_BINARY),
            &dir.join(format!("kube-proxy-{release}")),
        )?;
        keep.push(proxy_key);
    }
    let helm_key = key_with(&helm_module_dir(), &helm_ldflags(), &go_version)?;
    let helm = cache_root().join(&helm_key).join("helm");
    if helm.exists() {
        eprintln!("setup: helm {HELM_VERSION} present ({})", helm.display());
    } else {
        let started = std::time::Instant::now();
        std::fs::create_dir_all(cache_root().join(&helm_key))?;
        go_build_with(&helm_module_dir(), &helm_ldflags(), &helm)?;
        eprintln!("setup: helm {HELM_VERSION} built in {:.0} s", started.elapsed().as_secs_f64());
    }
    symlink(&Path::new("..").join(&helm_key).join("helm"), &dir.join("helm"))?;
    keep.push(helm_key);
    let target = util::target_dir();
    std::fs::create_dir_all(&target)?;
    symlink(&dir, &target.join("k8s"))?;
    prune(&keep);
    Ok(dir)
}

/// Remove builds of other keys (the control plane's is 170 MB, each kube-proxy's 70 to 80 MB).
fn prune(keep: &[String]) {
    let Ok(entries) = std::fs::read_dir(cache_root()) else { return };
    for e in entries.flatten() {
        if !e.file_name().to_str().is_some_and(|name| keep.iter().any(|k| k == name)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// gofmt on `controlplane/` (the release modules are inside it) and go vet on each module (part of the lints
/// of `cargo xtask test`). go vet takes the build's `-trimpath`, so it finds the packages the build compiled in
/// Go's build cache instead of compiling them all again (without it, the first vet of a kube-proxy release
/// after setup takes about five minutes on two CPUs; with it, under a minute, then a second or two).
pub(crate) fn lint() -> anyhow::Result<()> {
    let unformatted = util::output(Command::new("gofmt").arg("-l").arg(module_dir())).unwrap_or_default();
    anyhow::ensure!(unformatted.is_empty(), "gofmt: these files need formatting (gofmt -w):\n{unformatted}");
    for dir in module_dirs() {
        util::run(Command::new("go").current_dir(dir).args(["vet", "-trimpath", "-mod=readonly", "."]))?;
    }
    Ok(())
}
