//! Running commands with their output shown, and the environment the BPF build needs.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// The workspace root (xtask lives one level below it).
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_owned()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace root) or `target/`.
pub(crate) fn target_dir() -> PathBuf {
    root().join(std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into()))
}

/// The project's cache outside the workspace (kept across clones): `$XDG_CACHE_HOME/tierlb`, default
/// `~/.cache/tierlb`.
pub(crate) fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"),
        PathBuf::from,
    );
    base.join("tierlb")
}

/// A cargo command at the workspace root with what the BPF build needs: `RUSTC_BOOTSTRAP=1` lets the stable
/// toolchain use `-Z build-std=core` (no nightly can be installed here).
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root()).env("RUSTC_BOOTSTRAP", "1");
    c
}

/// Run, streaming output; fail with the command line if it fails.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("+ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("starting {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok(())
}

/// Run quietly and return stdout (trimmed); `None` if it fails to start or exits non-zero.
pub(crate) fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub(crate) fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Bytes as lowercase hex (cache keys).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut hex, b| {
        let _ = std::fmt::Write::write_fmt(&mut hex, format_args!("{b:02x}"));
        hex
    })
}

pub(crate) fn is_root() -> bool {
    output(Command::new("id").arg("-u")).as_deref() == Some("0")
}

/// apt with a private state directory and sources list, so the system's apt configuration is not touched:
/// the downloads of `setup` (rust-src) and of the test VMs' kernels.
pub(crate) struct PrivateApt {
    work: PathBuf,
}

impl PrivateApt {
    /// A state directory `name` under the temporary directory, with `sources` as its only sources list
    /// (one-line style), updated.
    pub(crate) fn new(name: &str, sources: &str) -> anyhow::Result<Self> {
        let work = std::env::temp_dir().join(name);
        for d in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(work.join(d))?;
        }
        std::fs::write(work.join("sources.list"), sources)?;
        let apt = Self { work };
        run(apt.cmd("apt-get").args(["update", "-q"]))?;
        Ok(apt)
    }

    /// `program` (apt-get, apt-cache) with this state directory.
    pub(crate) fn cmd(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.arg("-o")
            .arg(format!("Dir::Etc::SourceList={}", self.work.join("sources.list").display()))
            .args(["-o", "Dir::Etc::SourceParts=/nonexistent"])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", self.work.join("lists").display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", self.work.join("cache").display()))
            .args(["-o", "APT::Sandbox::User=root"]);
        cmd
    }

    /// Download `package` (`name` or `name=version`) into the empty directory `dir`; its path.
    pub(crate) fn download(&self, package: &str, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        run(self.cmd("apt-get").current_dir(dir).args(["download", package]))?;
        Ok(std::fs::read_dir(dir)?.next().context("apt-get download left no .deb")??.path())
    }
}
