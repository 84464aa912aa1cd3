//! `cargo xtask chaos`: the long chaos run (lb-user/tests/chaos.rs): the agent SIGKILLed at random moments
//! during 1,000 manifest edits (`cargo xtask test` runs the same test with 100), its figures printed.
use crate::util;

#[derive(clap::Args)]
pub(crate) struct Options {
    /// How many manifest edits.
    #[arg(long, default_value_t = 1000)]
    pub edits: u64,
    /// Replay a run: the seed a run printed (`chaos seed N`).
    #[arg(long)]
    pub seed: Option<u64>,
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    if !util::is_root() {
        anyhow::bail!(
            "the chaos test loads BPF programs and creates network namespaces and cgroups: run as root"
        );
    }
    // The test runs the lab's client binary, which cargo builds only for lb-lab's own tests.
    util::run(util::cargo().args(["build", "--bins"]))?;
    let mut cmd = util::cargo();
    cmd.args([
        "nextest",
        "run",
        "-p",
        "lb-user",
        "--test",
        "chaos",
        "--no-capture",
        "-E",
        "test(killed_at_random)",
    ])
    .env("TIERLB_CHAOS_EDITS", o.edits.to_string());
    if let Some(seed) = o.seed {
        cmd.env("TIERLB_CHAOS_SEED", seed.to_string());
    }
    util::run(&mut cmd)
}
