//! The XDP section of BENCHMARKS.md: the SNAT path with tc alone and with `xdp_ingress` in front of it.
use std::fmt::Write as _;

use super::super::{figures::DataPath, xdp::XdpFigures};

/// The section, from what `xdp::measure` returned.
pub(in crate::bench) fn section(x: &XdpFigures) -> String {
    let mut s = format!(
        "\n## From outside, XDP in front of tc\n\nThe SNAT lab above (the client, node-1 and node-2 on one bridge; a node port of node-1 whose only endpoint is node-2's pod: DNAT and SNAT) with tierlb's tc programs alone (`tierlb`) and with `xdp_ingress` attached in front of them in native mode on node-1's veth uplink (`tierlb xdp`, `--xdp=native`), attached before each of its runs and detached after, so the two paths interleave. The LAN is made a wire for XDP for both paths: the client and node-2 send with complete checksums (transmit checksumming off on their uplinks), and the bridge's ports of both nodes carry an XDP program that passes everything (a veth needs one on its peer for `XDP_TX`). Node-2 answers the client straight over the LAN (no route back by node-1, as the other sections have for netfilter's sake): a direct connect's replies skip node-1, as DSR's do. Connects: {} rounds of {:.2} s of connect() + close to node-2's pod directly (routed by node-1), through tc, through XDP, through tc with DSR, through XDP with DSR (A B C D E, then E D C B A), a ratio per round against that round's direct run. The section alone: `cargo xtask bench --xdp` (as root; `--quick` for fewer rounds and steps).\n\n",
        x.rounds, x.seconds
    );
    s.push_str(&super::snat::connect_rows(&x.rows));
    s.push_str("\nWith DSR (`tierlb dsr`, `tierlb xdp dsr`: `--dsr` on both nodes; node-2 runs tierlb's tc programs in every row, as every node of a cluster does), the client's packets reach node-2's pod with the client's address and the node port in an IPv4 option, and node-2's tc_egress sends the pod's reply to the client with the node port's address: the reply never passes node-1. What each node's programs ran per connection (`bpf_stats` over one connect run of each, tc alone on node-1; the runs are tc_ingress and tc_egress on each node's uplink):\n\n| path | connections | node-1: runs per connection | node-1: ns per connection | node-2: runs per connection | node-2: ns per connection |\n|---|---|---|---|---|---|\n");
    for c in &x.per_connection {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.0} | {:.2} | {:.0} |",
            c.path.as_str(),
            c.connections,
            c.node_1.0,
            c.node_1.1,
            c.node_2.0,
            c.node_2.1
        );
    }
    s.push_str(
        "\nPacket rate: UDP datagrams a second (64 flows, 64-byte payloads, paced per millisecond from one client thread) to node-2's pod through the node port (SNAT), counted by a thread on the pod's socket (32 MiB receive buffer); per path the offered rate steps up from 25,000 a second, doubling until a step fails, then bisecting, 2 s a step; tc's and XDP's steps alternate. A step fails when more than 0.1% of its datagrams are lost, or when the client could not offer 95% of the rate (then the client, not the path, is the bound). The client, the pod's counter and both nodes share this machine's two CPUs: compare the paths, not the figures with another machine's.\n\n| path | sustained, at most 0.1% lost (datagrams/s) | lowest rate that failed | steps (offered: sent / received) |\n|---|---|---|---|\n",
    );
    for r in &x.rates {
        let steps: Vec<String> =
            r.steps.iter().map(|t| format!("{}: {} / {}", t.rate, t.sent, t.received)).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            r.path.as_str(),
            r.sustained.map_or_else(|| "none".into(), |v| v.to_string()),
            r.failed_at.map_or_else(|| "none within the steps".into(), |v| v.to_string()),
            steps.join(", ")
        );
    }
    s.push_str("\nThe programs' run time per run (`bpf_stats`, node-1's programs by kernel id, over one step of each path at the rate both sustained; with XDP, tc's programs do not run for these packets):\n\n| path | offered (datagrams/s) | program: ns per run (runs) |\n|---|---|---|\n");
    for c in &x.cost {
        let progs: Vec<String> =
            c.programs.iter().map(|(n, ns, runs)| format!("{n}: {ns:.0} ({runs})")).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            if c.path == DataPath::TierlbXdp { "tierlb xdp" } else { "tierlb" },
            c.rate,
            progs.join(", ")
        );
    }
    s
}
