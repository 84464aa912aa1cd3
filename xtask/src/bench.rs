//! `cargo xtask bench [--quick] [--report] [--trace] [--kube-proxy COUNTS] [--snat] [--xdp]`: setup, release build, then the
//! lab's benchmark.
use std::process::Command;

use crate::{build, setup, util};

#[derive(clap::Args, Default)]
pub(crate) struct Options {
    /// Two Service counts and short runs (about three minutes: the real API server is filled with 10,000
    /// Services and their EndpointSlices).
    #[arg(long)]
    pub quick: bool,
    /// Regenerate BENCHMARKS.md and the charts in bench/ at the repository root.
    #[arg(long)]
    pub report: bool,
    /// The tierlb rows with `tierlb trace` consuming every decision (connect4's cost with tracing on).
    #[arg(long)]
    pub trace: bool,
    /// Only real kube-proxy's rows (iptables and nftables mode) at these Service counts, comma-separated:
    /// its syncs from the real API server and its connects against direct, printed as measured.
    #[arg(long, value_name = "COUNTS", conflicts_with_all = ["quick", "report", "trace"])]
    pub kube_proxy: Option<String>,
    /// Only the section from outside through SNAT: connects and the packet rate against real kube-proxy,
    /// and issue 63's three loads on tierlb and kube-proxy (with `--quick`: fewer rounds, shorter loads).
    #[arg(long, conflicts_with_all = ["report", "trace", "kube_proxy"])]
    pub snat: bool,
    /// Only the XDP section from outside: tierlb's tc programs alone against XDP in front of them on the SNAT
    /// path (connects, the UDP packet rate, the programs' cost per packet), interleaved.
    #[arg(long, conflicts_with_all = ["report", "trace", "kube_proxy", "snat"])]
    pub xdp: bool,
}

pub(crate) fn run(o: &Options) -> anyhow::Result<()> {
    setup::run(&setup::Options::default())?;
    if !util::is_root() {
        anyhow::bail!("the benchmark loads BPF programs and creates a network namespace: run as root");
    }
    let bin = build::run(&build::Options::default())?;
    let mut cmd = Command::new(bin.join("tierlb-lab"));
    cmd.arg("bench").arg("--tierlb").arg(bin.join("tierlb"));
    if o.quick {
        cmd.arg("--quick");
    }
    if o.report {
        cmd.arg("--report").arg(util::root());
    }
    if o.trace {
        cmd.arg("--trace");
    }
    if let Some(counts) = &o.kube_proxy {
        cmd.arg("--kube-proxy").arg(counts);
    }
    if o.snat {
        cmd.arg("--snat");
    }
    if o.xdp {
        cmd.arg("--xdp");
    }
    util::run(&mut cmd)
}
