//! `cargo xtask fuzz [--time S | --runs N | --long] [--dev] [TARGET]`: the cargo-fuzz targets of `fuzz/`
//! (libFuzzer; release with debug assertions, so that an integer overflow is a crash), each for S seconds or N
//! executions. Where the inputs live:
//!
//! - `fuzz/seeds/TARGET/`: hand-made starting points (committed);
//! - `fuzz/corpus/TARGET/`: the minimised corpus of the last long run (committed): what the CI search starts
//!   from, so each run searches past what the last long run covered;
//! - `target/fuzz/work/TARGET/`: the inputs a run adds (not committed).
//!
//! A crash leaves its input in `fuzz/artifacts/TARGET/`; each becomes a named test in
//! lb-user/tests/fuzz_regressions.rs (or, for an oracle's own mistake, a fix of the oracle with the input's
//! story in its comment).
//!
//! `--long` is the real search: 1,000,000 executions per target, then the corpus minimised into
//! `fuzz/corpus/TARGET/` (libFuzzer's `-merge=1`) and a log of the run written to `fuzz/logs/TARGET.txt`
//! (command, commit, executions, seconds, coverage, features, corpus, findings) that FUZZING.md reports.
//! `cargo xtask test` builds the targets (`build_for_tests`) and runs each for `CI_RUNS` executions as
//! nextest tests (lb-user/tests/fuzz_search.rs), so a finding fails CI with the rest.
//!
//! No sanitizer: every target is safe Rust over safe Rust (the unsafe code they reach is aya's and libc's
//! calls), whose memory errors AddressSanitizer exists to find, so its shadow memory would only slow each
//! input. Coverage guidance stays (SanitizerCoverage).
//!
//! The `tc_packets` target runs the product's BPF object through `BPF_PROG_TEST_RUN` (root): the object is the
//! one `tierlb-lab bpf-object` writes from its own embedded copy, named by `TIERLB_BPF_OBJECT`.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::util;

/// The environment variable the tc target reads the BPF object's path from.
const OBJECT_ENV: &str = "TIERLB_BPF_OBJECT";

/// Executions per target of `--long`.
const LONG_RUNS: u64 = 1_000_000;
/// Executions per target of the search `cargo xtask test` runs (lb-user/tests/fuzz_search.rs reads it from
/// the environment the tests get).
pub(crate) const CI_RUNS: u64 = 100_000;

/// The targets, in the order they run: manifest bytes -> objects; objects -> plan -> maps; apply sequences;
/// the kube wire readers; packets through the tc programs.
pub(crate) const TARGETS: [&str; 5] = ["manifests", "plan_maps", "reconcile", "kube_wire", "tc_packets"];

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub time: u64,
    /// Executions per target instead (libFuzzer's `-runs`), with no time limit.
    #[arg(long, conflicts_with = "time")]
    pub runs: Option<u64>,
    /// The long search: `--runs 1000000`, then the corpus minimised into fuzz/corpus/ and a log in fuzz/logs/.
    #[arg(long, conflicts_with_all = ["time", "runs"])]
    pub long: bool,
    /// One target (default: all).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub target: Option<String>,
    /// An unoptimised build: quicker to compile, 5-10 times fewer inputs a second.
    #[arg(long)]
    pub dev: bool,
}

/// Where the fuzz build goes: beside the workspace's own target directory, never inside its profiles.
pub(crate) fn target_dir() -> PathBuf {
    util::target_dir().join("fuzz")
}

/// The BPF object the tc target loads: written by the debug `tierlb-lab` from its embedded copy.
pub(crate) fn bpf_object() -> anyhow::Result<PathBuf> {
    util::run(util::cargo().args(["build", "-p", "lb-lab", "--bin", "tierlb-lab"]))?;
    let out = target_dir().join("lb-ebpf.o");
    std::fs::create_dir_all(target_dir())?;
    let lab = util::target_dir().join("debug/tierlb-lab");
    util::run(std::process::Command::new(lab).arg("bpf-object").arg(&out))?;
    Ok(out)
}

fn fuzz_cmd(fuzz: &Path, sub: &str, dev: bool) -> std::process::Command {
    let mut cmd = util::cargo();
    cmd.current_dir(fuzz)
        .env("AYA_BUILD_SKIP", "1")
        .args(["fuzz", sub, "--sanitizer", "none"])
        .args(if dev { &["--dev"][..] } else { &["--release", "--debug-assertions"][..] })
        .arg("--target-dir")
        .arg(target_dir());
    cmd
}

/// Build every target optimised (for `cargo xtask test`, whose nextest run executes them) and write the BPF
/// object: the directory holding the binaries.
pub(crate) fn build_for_tests() -> anyhow::Result<PathBuf> {
    bpf_object()?;
    util::run(&mut fuzz_cmd(&util::root().join("fuzz"), "build", false))?;
    Ok(target_dir().join("x86_64-unknown-linux-gnu/release"))
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    let fuzz = util::root().join("fuzz");
    let targets: Vec<&str> = match &o.target {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    let object = if targets.contains(&"tc_packets") { Some(bpf_object()?) } else { None };
    for target in targets {
        let work = target_dir().join("work").join(target);
        std::fs::create_dir_all(&work)?;
        let mut cmd = fuzz_cmd(&fuzz, "run", o.dev);
        cmd.arg(target).arg(&work);
        for dir in ["corpus", "seeds"] {
            let d = fuzz.join(dir).join(target);
            if d.is_dir() {
                cmd.arg(d);
            }
        }
        if let Some(object) = &object {
            cmd.env(OBJECT_ENV, object);
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
        if o.long {
            long(&fuzz, target, &mut cmd, object.as_deref())?;
        } else {
            util::run(&mut cmd)?;
        }
    }
    Ok(())
}

/// A long run: its output kept, its final statistics logged, its corpus minimised into fuzz/corpus/TARGET.
fn long(
    fuzz: &Path,
    target: &str,
    cmd: &mut std::process::Command,
    object: Option<&Path>,
) -> anyhow::Result<()> {
    eprintln!("+ {}", util::show(cmd));
    let out = cmd.stderr(std::process::Stdio::piped()).output().with_context(|| util::show(cmd))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    // libFuzzer's own account of the search ("Done N runs in S second(s)"), the build before it left out.
    let seconds = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done ").and_then(|r| r.split(" in ").nth(1)))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("?")
        .to_owned();
    let stat = |name: &str| {
        text.lines()
            .rev()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| "?".into())
    };
    // The last status line (`#N DONE cov: X ft: Y corp: Z/..`) holds coverage and features.
    let last = text.lines().rev().find(|l| l.starts_with('#') && l.contains("cov:")).unwrap_or("").to_owned();
    let found = !out.status.success();
    let logs = fuzz.join("logs");
    std::fs::create_dir_all(&logs)?;
    let commit =
        util::output(std::process::Command::new("git").current_dir(util::root()).args(["rev-parse", "HEAD"]))
            .unwrap_or_else(|| "unknown".into());
    let finding = if found {
        let tail: Vec<&str> = text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        format!("FINDING (exit {}):\n{}", out.status, tail.join("\n"))
    } else {
        "findings: none".to_owned()
    };
    let log = format!(
        "target: {target}\ncommit: {commit}\ncommand: {}\nexecutions: {}\nseconds: {seconds}\nexecutions per second: {}\npeak RSS MiB: {}\nlast status: {last}\n{finding}\n",
        util::show(cmd),
        stat("number_of_executed_units"),
        stat("average_exec_per_sec"),
        stat("peak_rss_mb"),
    );
    std::fs::write(logs.join(format!("{target}.txt")), &log)?;
    eprint!("{log}");
    if found {
        bail!("fuzz target {target} found a crash: see fuzz/artifacts/{target}/ and fuzz/logs/{target}.txt");
    }
    // Minimise: what the run found and the committed corpus, merged into a fresh directory that replaces it.
    let corpus = fuzz.join("corpus").join(target);
    let merged = target_dir().join("merged").join(target);
    let _ = std::fs::remove_dir_all(&merged);
    std::fs::create_dir_all(&merged)?;
    let mut merge = fuzz_cmd(fuzz, "run", false);
    merge.arg(target).arg(&merged).arg(target_dir().join("work").join(target));
    if corpus.is_dir() {
        merge.arg(&corpus);
    }
    if let Some(object) = object {
        merge.env(OBJECT_ENV, object);
    }
    merge.args(["--", "-merge=1"]);
    util::run(&mut merge)?;
    let _ = std::fs::remove_dir_all(&corpus);
    std::fs::create_dir_all(corpus.parent().expect("fuzz/corpus"))?;
    std::fs::rename(&merged, &corpus).or_else(|_| copy_dir(&merged, &corpus))?;
    let n = std::fs::read_dir(&corpus)?.count();
    std::fs::write(logs.join(format!("{target}.txt")), format!("{log}minimised corpus: {n} inputs\n"))?;
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        std::fs::copy(e.path(), to.join(e.file_name()))?;
    }
    Ok(())
}
