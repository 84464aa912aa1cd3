//! `cargo xtask image`: the agent's container image from deploy/image/Containerfile, `FROM scratch` plus
//! exactly what the release `tierlb` needs to run: the binary, the dynamic loader and the shared libraries it
//! links (read from the binary with ldd), and an nsswitch.conf. xtask stages the build context (`stage`),
//! buildah builds and writes the OCI archive under `target/image/` (`store`: a private store, no daemon, no
//! base image, no registry; the same commit gives the same manifest digest), and `check` loads it with podman
//! and runs its entrypoint in a chroot of it. See deploy/README.md, "The image".
mod check;
mod store;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{
    setup,
    util::{self, output},
};

/// Where the binary is in the image; the DaemonSet gives only `args`, so this is what runs.
const ENTRYPOINT: &str = "/usr/bin/tierlb";

/// The Containerfile, and the nsswitch.conf it copies (glibc reads it to resolve a name, the API server's when
/// api-server.env gives one: the node's /etc/hosts first, then DNS).
const CONTAINERFILE: &str = "deploy/image/Containerfile";
const NSSWITCH: &str = "deploy/image/nsswitch.conf";

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

/// What the image is of: its version, the commit, and the time stamp every file and the config carry.
pub(crate) struct Meta {
    pub version: String,
    /// The full commit id, or "unknown" outside git.
    pub commit: String,
    /// Uncommitted changes to tracked files: the commit tag says so (`-dirty`), since the binary is not that
    /// commit's.
    pub dirty: bool,
    /// The commit's time (seconds since 1970): every file and the config carry it, so that the same commit
    /// gives the same manifest digest.
    pub epoch: u64,
}

impl Meta {
    pub(crate) fn from_git() -> Self {
        let git =
            |args: &[&str]| output(Command::new("git").current_dir(util::root()).env("TZ", "UTC").args(args));
        let commit = git(&["rev-parse", "--verify", "-q", "HEAD"]);
        let dirty = commit.is_some()
            && git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let epoch = git(&["show", "-s", "--format=%ct", "HEAD"]).and_then(|s| s.parse().ok()).unwrap_or(0);
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            commit: commit.unwrap_or_else(|| "unknown".to_owned()),
            dirty,
            epoch,
        }
    }

    /// The name the archive gives its one image: `tierlb:VERSION`, which deploy/ references (podman and
    /// docker prefix a name without a registry with `localhost/`).
    pub(crate) fn image_name(&self) -> String {
        format!("tierlb:{}", self.version)
    }

    /// The image's tags: the version, which deploy/ references, and the version with the commit, which names
    /// one build (`0.1.0-0123456789ab`, `-dirty` when the tree had changes).
    pub(crate) fn tags(&self) -> Vec<String> {
        let mut tags = vec![self.version.clone()];
        if self.commit != "unknown" {
            let short = &self.commit[..self.commit.len().min(12)];
            tags.push(format!("{}-{short}{}", self.version, if self.dirty { "-dirty" } else { "" }));
        }
        tags
    }

    /// How `tierlb --version` of a binary built from this tree starts (build.rs embeds the commit; the map
    /// layout's number follows).
    pub(crate) fn version_prefix(&self) -> String {
        format!("tierlb {} (commit {}, map layout ", self.version, self.commit)
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
    let level = if o.debug { 1 } else { 9 };
    let built = build(&binary, &meta, &dir, &archive, level)?;
    print_summary(&built, &meta);
    if o.no_check {
        return Ok(());
    }
    if !util::is_root() {
        eprintln!("image: check skipped: it runs the image's entrypoint in a chroot, which needs root");
        return Ok(());
    }
    check::run(&built, &meta, &binary, &dir.join("check"), o.podman)
}

/// The check `cargo xtask test` runs: the image of the debug binary it has just built (compressing the
/// release build's image would add minutes to CI for the same Containerfile), built twice (the same manifest
/// digest both times), loaded by podman and run in a chroot. Leaves nothing under `target/image/test/`.
pub(crate) fn check_debug() -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let binary = util::target_dir().join("debug/tierlb");
    let meta = Meta::from_git();
    let dir = util::target_dir().join("image/test");
    let result = (|| {
        let first = build(&binary, &meta, &dir.join("a"), &dir.join("a.oci.tar"), 1)?;
        let again = build(&binary, &meta, &dir.join("b"), &dir.join("b.oci.tar"), 1)?;
        anyhow::ensure!(
            first.manifest_digest == again.manifest_digest,
            "two builds of the same tree gave manifests {} and {}: the image is not reproducible",
            first.manifest_digest,
            again.manifest_digest
        );
        print_summary(&first, &meta);
        eprintln!("check: built twice, the same manifest digest both times");
        check::run(&first, &meta, &binary, &dir.join("check"), false)
    })();
    let _ = std::fs::remove_dir_all(&dir);
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

/// What `build` made.
pub(crate) struct Built {
    pub archive: PathBuf,
    pub archive_size: u64,
    /// The manifest's digest (`sha256:...`), as buildah wrote it into the archive.
    pub manifest_digest: String,
    /// The staged files, as the image must hold them: path (relative to the root), mode, size.
    pub files: Vec<(String, u32, u64)>,
}

/// Stages the build context for `binary` in `dir/context`, builds deploy/image/Containerfile there with
/// buildah in a private store (removed afterwards) and writes the image to `archive`, gzip level `level`.
fn build(binary: &Path, meta: &Meta, dir: &Path, archive: &Path, level: u32) -> anyhow::Result<Built> {
    // A binary from before the last commit would be tagged with a commit it is not: build.rs reruns when HEAD
    // moves, so this only fails for a binary built elsewhere.
    let version = output(Command::new(binary).arg("--version")).unwrap_or_default();
    if !version.starts_with(&meta.version_prefix()) {
        bail!(
            "{} --version says {version:?}, not {:?}...: rebuild it",
            binary.display(),
            meta.version_prefix()
        );
    }
    let context = dir.join("context");
    let files = stage(binary, &context)?;
    let store = store::Store::new(&dir.join("store"))?;
    let manifest_digest = store.build(&context, meta, archive, level)?;
    std::fs::remove_dir_all(&context).with_context(|| format!("removing {}", context.display()))?;
    let archive_size = std::fs::metadata(archive).with_context(|| format!("{}", archive.display()))?.len();
    Ok(Built { archive: archive.to_owned(), archive_size, manifest_digest, files })
}

/// The build context the Containerfile expects: `nsswitch.conf`, and under `rootfs/` the binary at the
/// entrypoint and the loader and libraries at the paths ldd prints. Returns the image's files as they must
/// be in it, sorted by path.
fn stage(binary: &Path, context: &Path) -> anyhow::Result<Vec<(String, u32, u64)>> {
    let _ = std::fs::remove_dir_all(context);
    let rootfs = context.join("rootfs");
    let mut copies = vec![(binary.to_owned(), ENTRYPOINT.to_owned())];
    for lib in linked_files(binary)? {
        let path = lib.to_str().context("library path is not UTF-8")?.to_owned();
        copies.push((lib, path));
    }
    let mut files = Vec::new();
    for (from, path) in copies {
        let to = rootfs.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("an absolute path"))?;
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        files.push(file_entry(&to, &path)?);
    }
    let nsswitch = context.join("nsswitch.conf");
    std::fs::copy(util::root().join(NSSWITCH), &nsswitch).with_context(|| NSSWITCH.to_owned())?;
    files.push(file_entry(&nsswitch, "/etc/nsswitch.conf")?);
    files.sort();
    Ok(files)
}

/// `path` in the image (relative to its root), the mode and size of the staged file it comes from.
fn file_entry(staged: &Path, path: &str) -> anyhow::Result<(String, u32, u64)> {
    let meta = std::fs::metadata(staged).with_context(|| format!("{}", staged.display()))?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    Ok((path.trim_start_matches('/').to_owned(), mode, meta.len()))
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

fn print_summary(w: &Built, meta: &Meta) {
    let unpacked: u64 = w.files.iter().map(|f| f.2).sum();
    println!("image: {} ({})", w.archive.display(), mib(w.archive_size));
    println!("  name:     {} (revision {})", meta.image_name(), meta.commit);
    println!("  tags:     {}", meta.tags().join(", "));
    println!("  manifest: {}", w.manifest_digest);
    println!("  files:    {} unpacked", mib(unpacked));
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
        let meta =
            |commit: &str, dirty| Meta { version: "1.2.3".into(), commit: commit.into(), dirty, epoch: 0 };
        assert_eq!(meta("0123456789abcdef0123", false).tags(), ["1.2.3", "1.2.3-0123456789ab"]);
        assert_eq!(meta("0123456789abcdef0123", true).tags(), ["1.2.3", "1.2.3-0123456789ab-dirty"]);
        assert_eq!(meta("unknown", false).tags(), ["1.2.3"]);
    }
}
