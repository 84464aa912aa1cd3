//! `cargo xtask image`: the agent's container image, `FROM scratch` plus exactly what the release `tierlb`
//! needs to run: the binary, the dynamic loader and the shared libraries it links (read from the binary with
//! ldd), and an nsswitch.conf. Written as an OCI archive under `target/image/` by `oci` (no daemon, no base
//! image, no registry; the same commit gives the same bytes), then checked by `check`: unpacked and run in a
//! chroot. See deploy/README.md, "The image".
mod check;
mod oci;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use flate2::Compression;

use crate::{
    setup,
    util::{self, output},
};

/// Where the binary is in the image; the DaemonSet gives only `args`, so this is what runs.
const ENTRYPOINT: &str = "/usr/bin/tierlb";

/// glibc reads /etc/nsswitch.conf to resolve a name (the API server's, when api-server.env gives one). Without
/// it glibc asks DNS first; with it the node's /etc/hosts (which the kubelet mounts into a hostNetwork pod)
/// comes first, as for the kubelet on the node. `files` and `dns` are built into libc.so.6 (glibc 2.34+): no
/// NSS module has to be in the image.
const NSSWITCH: &str = "hosts: files dns\n";

#[derive(clap::Args, Default)]
pub(crate) struct Options {
    /// Build the image of the debug binary (for a quick try; the shipped image is the release one).
    #[arg(long)]
    pub debug: bool,
    /// Do not unpack the image and run its entrypoint afterwards.
    #[arg(long)]
    pub no_check: bool,
    /// Also run the image under podman as the DaemonSet runs it (podman must be installed and work here).
    #[arg(long)]
    pub podman: bool,
}

/// A file of the image's filesystem.
pub(crate) struct File {
    /// Relative to the image's root ("usr/bin/tierlb").
    pub path: String,
    pub mode: u32,
    pub source: Source,
}

pub(crate) enum Source {
    Host(PathBuf),
    Text(&'static str),
}

/// What the image is of: its version, the commit, and the time stamp every file and the config carry.
pub(crate) struct Meta {
    pub version: String,
    /// The full commit id, or "unknown" outside git.
    pub commit: String,
    /// Uncommitted changes to tracked files: the commit tag says so (`-dirty`), since the binary is not that
    /// commit's.
    pub dirty: bool,
    /// The commit's time (seconds since 1970), so that the same commit gives the same image bytes.
    pub epoch: u64,
    /// The same, RFC 3339 in UTC, for the image config's `created`.
    pub created: String,
}

impl Meta {
    pub(crate) fn from_git() -> Self {
        let git =
            |args: &[&str]| output(Command::new("git").current_dir(util::root()).env("TZ", "UTC").args(args));
        let commit = git(&["rev-parse", "--verify", "-q", "HEAD"]);
        let dirty = commit.is_some()
            && git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let epoch = git(&["show", "-s", "--format=%ct", "HEAD"]).and_then(|s| s.parse().ok()).unwrap_or(0);
        let created = git(&["show", "-s", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", "HEAD"])
            .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned());
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            commit: commit.unwrap_or_else(|| "unknown".to_owned()),
            dirty,
            epoch,
            created,
        }
    }

    /// The name the archive gives its one image: `tierlb:VERSION`, which deploy/ references.
    pub(crate) fn image_name(&self) -> String {
        format!("tierlb:{}", self.version)
    }

    /// The tags to push the image under: the version, which deploy/ references, and the version with the commit, which names
    /// one build (`0.1.0-0123456789ab`, `-dirty` when the tree had changes).
    pub(crate) fn tags(&self) -> Vec<String> {
        let mut tags = vec![self.version.clone()];
        if self.commit != "unknown" {
            let short = &self.commit[..self.commit.len().min(12)];
            tags.push(format!("{}-{short}{}", self.version, if self.dirty { "-dirty" } else { "" }));
        }
        tags
    }

    /// What `tierlb --version` of a binary built from this tree prints (build.rs embeds the commit).
    pub(crate) fn version_line(&self) -> String {
        format!("tierlb {} (commit {})", self.version, self.commit)
    }
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    // The build needs bpf-linker, rust-src and LLVM (the BPF object is in the binary); nothing else is used.
    setup::run(&setup::Options::default())?;
    let binary = build_tierlb(o.debug)?;
    let meta = Meta::from_git();
    if meta.dirty {
        eprintln!("image: the tree has uncommitted changes: the commit tag says -dirty");
    }
    let dir = util::target_dir().join("image");
    let archive = dir.join(format!("tierlb-{}.oci.tar", meta.version));
    // The shipped image gets the best compression (pulled by every node); the debug one is for trying.
    let level = if o.debug { Compression::fast() } else { Compression::best() };
    let written = build(&binary, &meta, &archive, level)?;
    print_summary(&written, &meta);
    if o.no_check {
        return Ok(());
    }
    if !util::is_root() {
        eprintln!("image: check skipped: it runs the image's entrypoint in a chroot, which needs root");
        return Ok(());
    }
    check::run(&archive, &meta, &binary, &dir.join("check"), o.podman)
}

/// The check `cargo xtask test` runs: the image of the debug binary it has just built (compressing the
/// release build's image would add minutes to CI for the same layout code), unpacked and run in a chroot.
/// Leaves nothing under `target/image/test/`.
pub(crate) fn check_debug() -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let binary = util::target_dir().join("debug/tierlb");
    let meta = Meta::from_git();
    let dir = util::target_dir().join("image/test");
    let archive = dir.join(format!("tierlb-{}.oci.tar", meta.version));
    let written = build(&binary, &meta, &archive, Compression::fast())?;
    print_summary(&written, &meta);
    let result = check::run(&archive, &meta, &binary, &dir.join("check"), false);
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    eprintln!("check: the debug image built and checked in {:.1} s", start.elapsed().as_secs_f64());
    result
}

fn build_tierlb(debug: bool) -> anyhow::Result<PathBuf> {
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "lb-user", "--bin", "tierlb"]);
    if !debug {
        cmd.arg("--release");
    }
    util::run(&mut cmd)?;
    Ok(util::target_dir().join(if debug { "debug" } else { "release" }).join("tierlb"))
}

/// The image's files for `binary`, then the archive.
fn build(binary: &Path, meta: &Meta, archive: &Path, level: Compression) -> anyhow::Result<oci::Written> {
    // A binary from before the last commit would be tagged with a commit it is not: build.rs reruns when HEAD
    // moves, so this only fails for a binary built elsewhere.
    let version = output(Command::new(binary).arg("--version")).unwrap_or_default();
    if version != meta.version_line() {
        bail!("{} --version says {version:?}, not {:?}: rebuild it", binary.display(), meta.version_line());
    }
    let mut files = vec![File {
        path: ENTRYPOINT.trim_start_matches('/').to_owned(),
        mode: 0o755,
        source: Source::Host(binary.to_owned()),
    }];
    for lib in linked_files(binary)? {
        let mode = std::fs::metadata(&lib).with_context(|| format!("{}", lib.display()))?.permissions();
        files.push(File {
            path: lib.to_str().context("library path is not UTF-8")?.trim_start_matches('/').to_owned(),
            mode: std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            source: Source::Host(lib),
        });
    }
    files.push(File { path: "etc/nsswitch.conf".to_owned(), mode: 0o644, source: Source::Text(NSSWITCH) });
    let config = oci::ImageConfig {
        entrypoint: vec![ENTRYPOINT.to_owned()],
        env: vec![format!("PATH={}", Path::new(ENTRYPOINT).parent().expect("absolute").display())],
        name: meta.image_name(),
    };
    std::fs::create_dir_all(archive.parent().expect("under target/image"))?;
    oci::write(&files, &config, meta, archive, level)
}

/// The dynamic loader and every shared library `binary` loads (DT_NEEDED, transitively), as ldd resolves
/// them on this machine: the same files the binary runs with here. Paths as ldd prints them (the loader at
/// its PT_INTERP path), which is where the loader looks for them in the image too. None for a static binary.
fn linked_files(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output().context("ldd (Debian's libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!("ldd {}: {}", binary.display(), String::from_utf8_lossy(&out.stderr));
    }
    parse_ldd(&text)
}

fn parse_ldd(text: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)" for
        // the loader, "linux-vdso.so.1 (0x...)" for the kernel's vDSO (no file).
        let target = line.split_once(" => ").map_or(line, |(_, t)| t);
        if target.starts_with("not found") {
            bail!("ldd: {line}: the binary needs a library this machine lacks");
        }
        let path = target.split(" (").next().unwrap_or_default();
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        } else if !line.starts_with("linux-vdso") && !line.starts_with("linux-gate") {
            bail!("ldd printed a line this does not understand: {line:?}");
        }
    }
    Ok(files)
}

fn print_summary(w: &oci::Written, meta: &Meta) {
    println!("image: {} ({})", w.archive.display(), mib(w.archive_size));
    println!("  name:     {} (revision {})", meta.image_name(), meta.commit);
    println!("  push as:  {}", meta.tags().join(", "));
    println!("  manifest: {}", w.manifest_digest);
    println!("  layer:    {} compressed, {} unpacked", mib(w.layer_size), mib(w.unpacked_size));
    println!("  files:");
    for (path, mode, size) in &w.files {
        println!("    {mode:04o} {size:>10}  /{path}");
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_loader_and_libraries_but_not_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffc)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x7f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n";
        let files = parse_ldd(text).unwrap();
        assert_eq!(
            files,
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_missing_library_is_an_error() {
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn tags_name_the_version_and_the_commit() {
        let meta = |commit: &str, dirty| Meta {
            version: "1.2.3".into(),
            commit: commit.into(),
            dirty,
            epoch: 0,
            created: String::new(),
        };
        assert_eq!(meta("0123456789abcdef0123", false).tags(), ["1.2.3", "1.2.3-0123456789ab"]);
        assert_eq!(meta("0123456789abcdef0123", true).tags(), ["1.2.3", "1.2.3-0123456789ab-dirty"]);
        assert_eq!(meta("unknown", false).tags(), ["1.2.3"]);
    }
}
