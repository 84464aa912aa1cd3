//! What tierlb's in-kernel tests, the demo and the benchmark share, kept out of the product (as aya keeps its
//! `test/integration-*` crates apart): RAII guards for network namespaces, child cgroups, bpffs mounts,
//! temporary directories and child processes; the simulated cluster (one agent per node on one kernel);
//! the probe and DNS clients the lab binary runs inside a node; manifest builders.
//!
//! It does not depend on the product crate: what it knows of tierlb is the command line it starts.
#![warn(missing_docs)]
pub mod abort;
pub mod capture;
pub mod chaos;
pub mod churn;
pub mod cluster;
pub mod deployed;
pub mod differential;
pub mod dns;
pub mod hold;
pub mod inet;
pub mod interrupt;
pub mod kube;
pub mod kube_proxy;
pub mod manifests;
pub mod ns_loads;
pub mod probe;
pub mod router;
pub mod sandbox;
pub mod story;
pub mod tenant;

use std::path::PathBuf;

/// How long a test waits for an agent to say it is ready before calling the start hung: 30 s, times
/// `TIERLB_TEST_PATIENCE` where set (`cargo xtask test --kernel` sets 5: under software emulation the
/// programs' verification alone takes about 6 s). A bound on a hang, never a verdict on speed.
#[must_use]
pub fn ready_wait() -> std::time::Duration {
    std::time::Duration::from_secs(30) * patience()
}

/// `TIERLB_TEST_PATIENCE` (at least 1, default 1): how many times longer than on real hardware a test lets
/// the things it waits for take (an agent's start, a client's stream that must outlast a sync).
#[must_use]
pub fn patience() -> u32 {
    std::env::var("TIERLB_TEST_PATIENCE").ok().and_then(|v| v.parse().ok()).unwrap_or(1u32).max(1)
}

/// The release before this tree's, as `cargo xtask test` builds it from its commit (xtask/src/release.rs) and
/// links it: its `tierlb` binary and its `deploy/` directory.
///
/// # Panics
/// When it is not built, saying how to build it.
#[must_use]
pub fn previous_release() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("the test binary's own path");
    // target/<profile>/deps/<test>-<hash>
    let target = exe.ancestors().nth(3).expect("target/").to_owned();
    let dir = target.join("previous-release");
    let (tierlb, deploy) = (dir.join("tierlb"), dir.join("src/deploy"));
    assert!(
        tierlb.exists() && deploy.exists(),
        "{} is not built: `cargo xtask test` builds the previous release from its commit",
        dir.display()
    );
    (tierlb, deploy)
}

/// A binary of this workspace built next to the running test (`target/<profile>/NAME`). Cargo gives a test
/// only its own package's binaries (`CARGO_BIN_EXE_*`); `cargo xtask test` runs nextest over the whole
/// workspace, which builds every binary first.
///
/// # Panics
/// When the binary is not there, naming the package that builds it.
#[must_use]
pub fn workspace_bin(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's own path");
    // target/<profile>/deps/<test>-<hash>
    let dir = exe.parent().and_then(std::path::Path::parent).expect("target/<profile>");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is not built: run `cargo build -p {package}` (or the whole suite with `cargo xtask test`)",
        bin.display()
    );
    bin
}
