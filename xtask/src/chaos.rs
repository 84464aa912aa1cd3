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
    // libtest rather than nextest: the long run takes minutes (about 100 s on an idle 2-core machine), past
    // the time after which nextest ends an in-kernel test as hung.
    let mut cmd = util::cargo();
    cmd.args(["test", "-p", "lb-user", "--test", "chaos", "--", "killed_at_random", "--nocapture"])
        .env("TIERLB_CHAOS_EDITS", o.edits.to_string());
    if let Some(seed) = o.seed {
        cmd.env("TIERLB_CHAOS_SEED", seed.to_string());
    }
    util::run(&mut cmd)
}
