//! `cargo xtask test`: what CI runs. Setup, formatting, lints (host crates and the BPF crate on its target;
//! gofmt and go vet on the control plane's Go module),
//! promtool's check and unit tests of deploy/monitoring's rules,
//! a short run of each fuzz target, the container image's check, then every test (unit, semantics, in-kernel) under nextest, whose summary
//! line ends the output.
use crate::{fuzz, image, setup, util};

/// Seconds per fuzz target in `cargo xtask test` (`cargo xtask fuzz` runs them longer).
const FUZZ_SECONDS: u64 = 15;

#[derive(clap::Args, Default)]
pub(crate) struct Options {
    /// Skip fmt and clippy (tests only).
    #[arg(long)]
    pub no_lint: bool,
    /// Skip the short fuzz runs.
    #[arg(long)]
    pub no_fuzz: bool,
    /// Skip the container image's check.
    #[arg(long)]
    pub no_image: bool,
    /// Extra arguments for `cargo nextest run` (e.g. a test name filter).
    #[arg(last = true)]
    pub nextest_args: Vec<String>,
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    setup::run(&setup::Options::default())?;
    if !util::is_root() {
        anyhow::bail!(
            "the in-kernel tests load BPF programs and create network namespaces and cgroups: run as root"
        );
    }
    if !o.no_lint {
        util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
        util::run(util::cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
        util::run(util::cargo().args([
            "clippy",
            "-p",
            "lb-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--",
            "-D",
            "warnings",
        ]))?;
        crate::k8s::lint()?;
    }
    // The alerting rules: syntax, then their unit tests (each alert fed series that must fire and must not).
    if !o.no_lint {
        let dir = util::root().join("deploy/monitoring");
        util::run(std::process::Command::new("promtool").current_dir(&dir).args([
            "check",
            "rules",
            "tierlb.rules.yaml",
        ]))?;
        util::run(std::process::Command::new("promtool").current_dir(&dir).args([
            "test",
            "rules",
            "tierlb.rules.test.yaml",
        ]))?;
    }
    // Before nextest, so that its summary line still ends the output.
    if !o.no_fuzz {
        // An unoptimised fuzz build: it compiles in a third of the release build's time, and these runs only
        // check that the targets hold on the seeds and what 15 s find; `cargo xtask fuzz` is the real search.
        fuzz::run(&fuzz::Options { time: FUZZ_SECONDS, runs: None, long: false, target: None, dev: true })?;
    }
    // The in-kernel tests of lb-user run the lab's client binary, which cargo builds only for lb-lab's own
    // tests: build every binary first (debug, as nextest does).
    util::run(util::cargo().args(["build", "--bins"]))?;
    // The container image's check on the debug binary just built (a few seconds; the release image's layout
    // is the same code): unpacked, its entrypoint run in a chroot.
    if !o.no_image {
        image::check_debug()?;
    }
    util::run(util::cargo().args(["nextest", "run", "--no-fail-fast"]).args(&o.nextest_args))
}
