//! The previous release's agent, which the upgrade test (lb-user/tests/north_south/upgrade.rs) rolls to this
//! tree's and back: built from its commit in this repository's history, once, into the cache
//! (`~/.cache/tierlb/release/<commit>/`: the `tierlb` binary and the release's `deploy/`), and linked from
//! `target/previous-release`, where the test looks. Moved forward at each release (CHANGELOG.md).
use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

use crate::util;

/// The release before this tree's: its version and commit.
pub(crate) const PREVIOUS: (&str, &str) = ("0.1.0", "5e800e212b317a9de0376f12fea37f138f9aa6c9");

/// Build the previous release unless the cache has it; link `target/previous-release` to it. Returns its
/// directory.
pub(crate) fn build() -> anyhow::Result<PathBuf> {
    let (version, commit) = PREVIOUS;
    let root = util::cache_dir().join("release");
    let dir = root.join(commit);
    let binary = dir.join("tierlb");
    if binary.exists() {
        eprintln!("setup: tierlb {version} (the previous release) present ({})", dir.display());
    } else {
        eprintln!("setup: building tierlb {version} from commit {commit} for the upgrade test");
        let started = std::time::Instant::now();
        let src = dir.join("src");
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(&src)?;
        // The commit's tree, from this repository's history; a shallow clone lacks it: fetched from its origin
        // (the commit alone), else say so.
        let git_archive = || {
            Command::new("git")
                .current_dir(util::root())
                .args(["archive", "--format=tar", commit])
                .output()
                .context("running git archive")
        };
        let mut archive = git_archive()?;
        if !archive.status.success() {
            let fetched = Command::new("git")
                .current_dir(util::root())
                .args(["fetch", "--quiet", "--depth", "1", "origin", commit])
                .status()
                .is_ok_and(|s| s.success());
            if fetched {
                archive = git_archive()?;
            }
        }
        anyhow::ensure!(
            archive.status.success(),
            "commit {commit} (tierlb {version}) is not in this clone's history (a shallow clone?): fetch it \
             (`git fetch --unshallow`) for the upgrade test: {}",
            String::from_utf8_lossy(&archive.stderr).trim()
        );
        let mut tar = Command::new("tar")
            .args(["-x", "-C"])
            .arg(&src)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .context("running tar")?;
        std::io::Write::write_all(&mut tar.stdin.take().context("tar's stdin")?, &archive.stdout)?;
        anyhow::ensure!(tar.wait()?.success(), "unpacking commit {commit}");
        // Its own lock file and toolchain, a target directory of its own (whatever this tree does to
        // target/), built once per pinned commit: only the binary is kept, the target directory (about
        // 1.8 GiB) is removed, as a CI run once failed for a full disk.
        let build_dir = root.join("target");
        util::run(
            util::cargo()
                .current_dir(&src)
                .env("CARGO_TARGET_DIR", &build_dir)
                .env("CARGO_INCREMENTAL", "0")
                .env("TIERLB_GIT_COMMIT", commit)
                .args(["build", "--locked", "-p", "lb-user", "--bin", "tierlb"]),
        )?;
        std::fs::copy(build_dir.join("debug/tierlb"), &binary).context("keeping the release's binary")?;
        std::fs::remove_dir_all(&build_dir).with_context(|| format!("removing {}", build_dir.display()))?;
        eprintln!("setup: tierlb {version} built in {:.0} s", started.elapsed().as_secs_f64());
    }
    let target = util::target_dir();
    std::fs::create_dir_all(&target)?;
    let link = target.join("previous-release");
    if std::fs::read_link(&link).ok().as_deref() != Some(dir.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(dir)
}
