//! The fuzz targets' search in CI: `cargo xtask test` builds every target of fuzz/ optimised (libFuzzer, debug
//! assertions on, no sanitizer: xtask's `fuzz::build_for_tests`) and writes the BPF object the `tc_packets`
//! target loads; each test here runs one target for `TIERLB_FUZZ_RUNS` executions (100,000 unless set),
//! starting from the committed corpus of the last long run and the seeds, with new inputs going to a
//! temporary directory, and fails on any finding: the crash input is printed (base64) with the target's own
//! report, for lb-user/tests/fuzz_regressions.rs. Run alone, without that build, each says how to make it.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

/// Executions per target unless `TIERLB_FUZZ_RUNS` says otherwise.
const RUNS: u64 = 100_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), |d| root().join(d))
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Run `target` for the CI's executions; panic with its report and the crash input on a finding.
fn search(target: &str) {
    let fuzz = root().join("fuzz");
    let bin = target_dir().join("fuzz/x86_64-unknown-linux-gnu/release").join(target);
    assert!(
        bin.is_file(),
        "{} is not built: `cargo xtask test` builds the fuzz targets (or `cargo xtask fuzz --runs 1` once)",
        bin.display()
    );
    let runs: u64 = std::env::var("TIERLB_FUZZ_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(RUNS);
    let work = lb_testkit::sandbox::TempDir::new(&format!("fuzz-{target}")).unwrap();
    let artifacts = lb_testkit::sandbox::TempDir::new(&format!("fuzz-{target}-crash")).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.arg(format!("-runs={runs}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.path().display()))
        .arg(work.path());
    for dir in ["corpus", "seeds"] {
        let d = fuzz.join(dir).join(target);
        if d.is_dir() {
            cmd.arg(d);
        }
    }
    let dict = fuzz.join(format!("{target}.dict"));
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    if target == "tc_packets" {
        let object = target_dir().join("fuzz/lb-ebpf.o");
        assert!(object.is_file(), "{} is not written: `cargo xtask test` writes it", object.display());
        cmd.env("TIERLB_BPF_OBJECT", object);
    }
    let out = cmd.output().unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    let stat = |name: &str| {
        report.lines().find_map(|l| l.strip_prefix(&format!("stat::{name}:")).map(str::trim)).unwrap_or("?")
    };
    let last = report.lines().rev().find(|l| l.starts_with('#') && l.contains("cov:")).unwrap_or("");
    if !out.status.success() {
        let mut crashes = String::new();
        for e in std::fs::read_dir(artifacts.path()).unwrap() {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let _ = write!(crashes, "\n{} (base64): {}", path.display(), base64(&bytes));
        }
        let tail: Vec<&str> = report.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("fuzz target {target} found a crash ({}):\n{}{crashes}", out.status, tail.join("\n"));
    }
    eprintln!(
        "{target}: {} executions, {} a second, {last}",
        stat("number_of_executed_units"),
        stat("average_exec_per_sec")
    );
    let executed: u64 = stat("number_of_executed_units").parse().unwrap_or(0);
    assert!(executed >= runs, "{target} ran {executed} executions of {runs}: {last}");
}

#[test]
fn fuzz_search_manifests() {
    search("manifests");
}

#[test]
fn fuzz_search_plan_maps() {
    search("plan_maps");
}

#[test]
fn fuzz_search_reconcile() {
    search("reconcile");
}

#[test]
fn fuzz_search_kube_wire() {
    search("kube_wire");
}

#[test]
fn fuzz_search_tc_packets() {
    search("tc_packets");
}
