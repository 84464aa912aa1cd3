//! `cargo xtask fuzz [--time S | --runs N | --long] [--dev] [TARGET]`: the cargo-fuzz targets of `fuzz/`
//! (libFuzzer, AddressSanitizer, release with debug assertions so that an integer overflow is a crash), each for
//! S seconds or N executions. `--long` is the real search: 1,000,000 executions per target (20 to 45 minutes
//! each on this 2-core machine, optimised), what a finding is reported from; `cargo xtask test`'s 15 s runs
//! only check that the targets hold on their seeds. A crash leaves its input in `fuzz/artifacts/TARGET/`;
//! each becomes a named test in lb-user/tests/fuzz_regressions.rs (or, for an oracle's own mistake, a fix of
//! the oracle with the input's story in its comment).
//!
//! Why cargo-fuzz: it builds here on the stable toolchain with `RUSTC_BOOTSTRAP=1` (for `-Z sanitizer`),
//! libFuzzer's coverage guidance finds the branchy parsers' corners quickly, and `arbitrary` turns its bytes
//! into structured clusters and apply sequences. `AYA_BUILD_SKIP=1`: no target loads BPF, so the fuzz build
//! skips the BPF object (lb-user/build.rs).
use std::path::PathBuf;

use crate::util;

/// Executions per target of `--long`.
const LONG_RUNS: u64 = 1_000_000;

/// The targets, in the order they run: manifest bytes -> objects; objects -> plan -> maps; apply sequences.
pub(crate) const TARGETS: [&str; 4] = ["manifests", "plan_maps", "reconcile", "kube_wire"];

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub time: u64,
    /// Executions per target instead (libFuzzer's `-runs`), with no time limit.
    #[arg(long, conflicts_with = "time")]
    pub runs: Option<u64>,
    /// The long search: `--runs 1000000`.
    #[arg(long, conflicts_with_all = ["time", "runs"])]
    pub long: bool,
    /// One target (default: all).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub target: Option<String>,
    /// An unoptimised build (debug assertions on, as in release here): from clean it compiles in about 2.7
    /// minutes instead of about 7 on this 2-core machine, and runs 5-10 times fewer inputs a second. What
    /// `cargo xtask test` uses for its short runs; long runs want the default.
    #[arg(long)]
    pub dev: bool,
}

/// Where the fuzz build goes: beside the workspace's own target directory, never inside its profiles.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| util::root().join("target"), PathBuf::from)
        .join("fuzz")
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    let fuzz = util::root().join("fuzz");
    let targets: Vec<&str> = match &o.target {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    for target in targets {
        // New inputs go to corpus/ (not committed); seeds/ holds the committed starting points.
        let corpus = fuzz.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        let mut cmd = util::cargo();
        cmd.current_dir(&fuzz)
            .env("AYA_BUILD_SKIP", "1")
            .args(["fuzz", "run"])
            .args(if o.dev { &["--dev"][..] } else { &["--release", "--debug-assertions"][..] })
            .arg("--target-dir")
            .arg(target_dir())
            .arg(target)
            .arg(&corpus);
        let seeds = fuzz.join("seeds").join(target);
        if seeds.is_dir() {
            cmd.arg(&seeds);
        }
        cmd.arg("--").arg("-print_final_stats=1");
        match o.runs.or(o.long.then_some(LONG_RUNS)) {
            Some(runs) => cmd.arg(format!("-runs={runs}")),
            None => cmd.arg(format!("-max_total_time={}", o.time)),
        };
        let dict = fuzz.join(format!("{target}.dict"));
        if dict.is_file() {
            cmd.arg(format!("-dict={}", dict.display()));
        }
        util::run(&mut cmd)?;
    }
    Ok(())
}
