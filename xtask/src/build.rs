//! `cargo xtask build`: release binaries with the BPF object embedded by lb-user's build script.
use std::path::PathBuf;

use crate::util;

#[derive(clap::Args, Default)]
pub(crate) struct Options {
    /// Debug profile instead of release.
    #[arg(long)]
    pub debug: bool,
}

/// Builds and returns the directory holding `tierlb` and `tierlb-lab`.
pub(crate) fn run(o: &Options) -> anyhow::Result<PathBuf> {
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "lb-user", "-p", "lb-lab", "--bins"]);
    if !o.debug {
        cmd.arg("--release");
    }
    util::run(&mut cmd)?;
    Ok(util::target_dir().join(if o.debug { "debug" } else { "release" }))
}
