//! `cargo xtask test`: what CI runs. Setup, formatting, lints (host crates and the BPF crate on its target;
//! gofmt and go vet on the control plane's Go module),
//! promtool's check and unit tests of deploy/monitoring's rules,
//! the fuzz targets built optimised, the container image's check, then every test (unit, semantics, in-kernel,
//! and each fuzz target's search of `fuzz::CI_RUNS` executions) under nextest, whose summary line ends the output.
use crate::{fuzz, image, setup, util};

#[derive(clap::Args, Default)]
pub(crate) struct Options {
    /// Skip fmt and clippy (tests only).
    #[arg(long)]
    pub no_lint: bool,
    /// Skip the fuzz targets' build and their search (lb-user/tests/fuzz_search.rs).
    #[arg(long)]
    pub no_fuzz: bool,
    /// Skip the container image's check.
    #[arg(long)]
    pub no_image: bool,
    /// Instead of this machine's kernel, boot Debian's (6.1, 6.12 or all) in qemu and run the in-kernel
    /// subset there (`vm::SUBSET`, or the extra arguments' filter).
    #[arg(long, value_name = "6.1|6.12|all")]
    pub kernel: Option<String>,
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
    if let Some(which) = &o.kernel {
        return crate::vm::run(which, &o.nextest_args);
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
    // The previous release's agent, for the upgrade test (built once from its commit, cached).
    crate::release::build()?;
    // The in-kernel tests of lb-user run the lab's client binary, which cargo builds only for lb-lab's own
    // tests: build every binary first (debug, as nextest does).
    util::run(util::cargo().args(["build", "--bins"]))?;
    // The container image's check on the debug binary just built (a few seconds; the release image's layout
    // is the same code): unpacked, its entrypoint run in a chroot.
    if !o.no_image {
        image::check_debug()?;
    }
    // The fuzz targets, optimised, and the BPF object the tc target loads: nextest runs each target's search
    // (lb-user/tests/fuzz_search.rs, `fuzz::CI_RUNS` executions), so a finding fails with the other tests.
    let mut nextest = util::cargo();
    nextest.args(["nextest", "run", "--no-fail-fast"]);
    if o.no_fuzz {
        nextest.args(["-E", "not binary(fuzz_search)"]);
    } else {
        fuzz::build_for_tests()?;
        nextest.env("TIERLB_FUZZ_RUNS", fuzz::CI_RUNS.to_string());
    }
    util::run(nextest.args(&o.nextest_args))
}
