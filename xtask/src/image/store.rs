//! buildah and podman on a private containers-storage under `target/image/` (the vfs driver: plain
//! directories, no mounts, nothing in the machine's own store), removed when dropped.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, ensure};

use super::{CONTAINERFILE, Meta};
use crate::util;

pub(crate) struct Store {
    dir: PathBuf,
}

impl Store {
    /// A fresh store in `dir` (emptied first).
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir.join("tmp")).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { dir: dir.to_owned() })
    }

    /// `tool` (buildah or podman) on this store.
    pub(crate) fn cmd(&self, tool: &str) -> Command {
        let mut cmd = Command::new(tool);
        cmd.arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .arg("--storage-driver=vfs")
            // Layers are staged under TMPDIR (default /var/tmp).
            .env("TMPDIR", self.dir.join("tmp"));
        cmd
    }

    /// Runs `cmd`; its stdout, or an error with its stderr.
    pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<String> {
        let tool = cmd.get_program().to_string_lossy().into_owned();
        let out = cmd
            .output()
            .with_context(|| format!("{} (cargo xtask setup installs {tool})", util::show(cmd)))?;
        ensure!(
            out.status.success(),
            "{} failed ({}): {}",
            util::show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Builds deploy/image/Containerfile on `context`, tagged with `meta`'s tags, and writes the version's tag
    /// to `archive` as an OCI archive naming it `tierlb:VERSION`, layers gzipped at `level`. Returns the
    /// manifest's digest.
    pub(crate) fn build(
        &self,
        context: &Path,
        meta: &Meta,
        archive: &Path,
        level: u32,
    ) -> anyhow::Result<String> {
        let mut build = self.cmd("buildah");
        // chroot isolation: the Containerfile runs nothing, and no runtime is needed to copy files.
        build.args(["build", "--quiet", "--isolation=chroot", "--format=oci", "--layers=false"]);
        build
            .arg(format!("--timestamp={}", meta.epoch))
            .arg(format!("--build-arg=VERSION={}", meta.version))
            .arg(format!("--build-arg=REVISION={}", meta.commit))
            .arg("--file")
            .arg(util::root().join(CONTAINERFILE));
        for tag in meta.tags() {
            build.arg(format!("--tag=tierlb:{tag}"));
        }
        build.arg(context);
        Self::run(&mut build)?;
        let _ = std::fs::remove_file(archive);
        std::fs::create_dir_all(archive.parent().expect("under target/image"))?;
        let digestfile = self.dir.join("digest");
        let mut push = self.cmd("buildah");
        push.args(["push", "--quiet", "--compression-format=gzip"])
            .arg(format!("--compression-level={level}"))
            .arg("--digestfile")
            .arg(&digestfile)
            .arg(meta.image_name())
            .arg(format!("oci-archive:{}:{}", archive.display(), meta.image_name()));
        Self::run(&mut push)?;
        let digest = std::fs::read_to_string(&digestfile).context("buildah push --digestfile")?;
        Ok(digest.trim().to_owned())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
