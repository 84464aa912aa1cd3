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

pub(crate) fn is_root() -> bool {
    output(Command::new("id").arg("-u")).as_deref() == Some("0")
}
