//! `cargo xtask demo`: setup, release build, then the lab's demo (three simulated nodes in a private netns).
use std::process::Command;

use crate::{build, setup, util};

#[derive(clap::Args, Default)]
pub(crate) struct Options {
    /// Arguments for `tierlb-lab demo`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    setup::run(&setup::Options::default())?;
    if !util::is_root() {
        anyhow::bail!("the demo loads BPF programs and creates a network namespace and cgroups: run as root");
    }
    let bin = build::run(&build::Options::default())?;
    util::run(
        Command::new(bin.join("tierlb-lab"))
            .arg("demo")
            .arg("--tierlb")
            .arg(bin.join("tierlb"))
            .arg("--out-dir")
            .arg(util::root().join("target/demo"))
            .args(&o.args),
    )
}
