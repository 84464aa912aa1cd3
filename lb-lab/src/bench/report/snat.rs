//! The SNAT section of BENCHMARKS.md: connects to node-2's pod through node-1's node ports, the packet-rate
//! row, and issue 63's three loads, tierlb beside real kube-proxy.
use std::fmt::Write as _;

use super::{
    super::{
        figures::DataPath,
        north_south_snat::{LoadsRow, Snat},
    },
    thousands,
};

/// The section, from what `north_south_snat::measure` returned.
pub(in crate::bench) fn section(x: &Snat) -> String {
    let mut s = format!(
        "\n## From outside, through SNAT\n\nThe lab above with a second node: the client, node-1 and node-2 on one bridge, node-2's pod (a sink, and a server that answers every line with its name) routed by node-1 (10.244.2.0/24 via node-2) and back by the same way. A node port of node-1 whose only endpoint is node-2's pod is DNAT and SNAT (to node-1's address), the replies translated back on node-1: tierlb's tc programs on node-1's uplink, and real kube-proxy v1.36.3 in nftables mode, then in iptables mode (one at a time, as a node has; NodePort Services `externalTrafficPolicy: Cluster` read from kube-apiserver v1.36.3), both in place at once on node ports of their own, so their runs interleave. `direct` connects to node-2's pod's address, routed by node-1, the same hops. Connects: per kube-proxy mode {} rounds of {:.2} s of connect() + close to each of direct, tierlb and kube-proxy (A B C, then C B A), a ratio per round against that round's direct run; tierlb's row takes the rounds of both modes. The section alone: `cargo xtask bench --snat` (as root; `--quick` for fewer rounds and shorter loads).",
        x.rounds, x.seconds
    );
    s.push_str(&connect_rows(&x.rows));
    let step = x.rates.first().map_or(0.0, |r| r.step_secs);
    let _ = write!(
        s,
        "\nPacket rate: new TCP flows a second to node-2's pod's server through the node port, each a connect, a line, its answer and a reset (with close(2) the client's own TIME_WAIT sockets would bound the rate by its ports); per path the offered rate steps up from 250 a second, doubling until a step fails, then bisecting, {step} s a step, a second's pause between steps; tierlb's steps and kube-proxy's alternate (A B, B A). A step fails on one failed connect (a connect or an answer not within 1.5 s) or when the pace did not hold (a connect started over half a second past the step's end). The client, the pods' servers (a thread per connection) and the nodes share this machine's CPUs, so the ceiling is the machine's as much as the path's: compare the paths, not the figures with another machine's.\n\n| path | steps alternating with | sustained with no failed connect (flows/s) | lowest rate that failed (flows/s) | steps (rate: failed) |\n|---|---|---|---|---|\n"
    );
    for r in &x.rates {
        let steps: Vec<String> = r
            .steps
            .iter()
            .map(|t| format!("{}: {}{}", t.rate, t.failed, if t.pace_held { "" } else { " (late)" }))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            r.path.as_str(),
            if r.path == DataPath::Tierlb { r.beside.as_str() } else { "-" },
            r.sustained.map_or_else(|| "none".into(), thousands),
            r.failed_at.map_or_else(|| "none within the steps".into(), thousands),
            steps.join(", ")
        );
    }
    s.push_str(&loads(x));
    s
}

/// The connect rows of a section from outside against direct: a table, its head included.
pub(super) fn connect_rows(rows: &[super::super::figures::NsRow]) -> String {
    let mut s = String::from(
        "\n\n| path | p50 (us) | p99 (us) | ops/s | p50 / direct (middle half) | ops/s / direct (middle half) | errors |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.0} | {:.2}x ({:.2}-{:.2}) | {:.2}x ({:.2}-{:.2}) | {} |",
            r.path.as_str(),
            r.p50_us,
            r.p99_us,
            r.per_sec,
            r.p50_ratio.median,
            r.p50_ratio.q1,
            r.p50_ratio.q3,
            r.per_sec_ratio.median,
            r.per_sec_ratio.q1,
            r.per_sec_ratio.q3,
            r.errors
        );
    }
    s
}

/// Issue 63's three loads: a row per load, tierlb's figure beside kube-proxy's.
fn loads(snat: &Snat) -> String {
    let (Some(tierlb), Some(proxy)) = (snat.loads.first(), snat.loads.get(1)) else { return String::new() };
    let mut out = format!(
        "\n### Issue 63's loads, tierlb and kube-proxy\n\nThe three loads of issue 63 (`lb_testkit::ns_loads`, the same traffic the in-kernel tests in `lb-user/tests/north_south/load.rs` assert on tierlb) from the client to node-1's node ports: tierlb's before kube-proxy first starts, kube-proxy's ({}) last of all, its floods filling nf_conntrack in node-1's namespace. The SYN flood's client drops its SYN-ACKs with an nftables rule in its own namespace; the UDP flood's Service has node-1's pod as its endpoint (no SNAT), the idle connections go to the same pod over TCP.\n\n| load | {} | {} |\n|---|---|---|\n",
        proxy.path.as_str(),
        tierlb.path.as_str(),
        proxy.path.as_str()
    );
    let (flows, udp) = (&tierlb.new_flows, &tierlb.udp_flood);
    let rows = [
        (
            format!(
                "{} new TCP flows/s for {:.0} s to a NodePort whose only endpoint is on the other node",
                flows.rate, flows.seconds
            ),
            failed(&tierlb.new_flows),
            failed(&proxy.new_flows),
        ),
        (
            format!(
                "{} SYNs whose SYN-ACKs the client drops, then {} connects from a second client address",
                thousands(tierlb.syn_flood.flood),
                tierlb.syn_flood.asks
            ),
            answered(&tierlb.syn_flood),
            answered(&proxy.syn_flood),
        ),
        (
            format!(
                "{} one-datagram UDP flows to a UDP NodePort (no SNAT) beside {} idle TCP connections",
                thousands(udp.flows),
                udp.idle
            ),
            alive(tierlb),
            alive(proxy),
        ),
    ];
    for (load, ours, theirs) in rows {
        let _ = writeln!(out, "| {load} | {ours} | {theirs} |");
    }
    out
}

/// "50 of 50 answered".
fn answered(f: &lb_testkit::ns_loads::SynFloodFigures) -> String {
    format!("{} of {} answered", f.answered, f.asks)
}

/// "20 of 20 alive (the node's connection tracking after the flood)".
fn alive(row: &LoadsRow) -> String {
    let u = &row.udp_flood;
    format!("{} of {} alive ({})", u.alive, u.idle, row.tracking_after_udp)
}

/// "0 of 6,000 failed", or "684 of 6,000 failed, the first at 16 s".
fn failed(f: &lb_testkit::ns_loads::NewFlowsFigures) -> String {
    let head = format!("{} of {} failed", thousands(f.failed), thousands(f.offered));
    match f.first_failure {
        None => head,
        Some(t) => format!("{head}, the first at {t:.0} s"),
    }
}

#[cfg(test)]
mod tests {
    use lb_testkit::ns_loads::{NewFlowsFigures, SynFloodFigures, UdpFloodFigures};

    use super::*;
    use crate::bench::north_south_rate::RateRow;

    fn loads(path: DataPath, failed: usize, alive: usize) -> LoadsRow {
        LoadsRow {
            path,
            new_flows: NewFlowsFigures {
                rate: 120,
                seconds: 50.0,
                offered: 6_000,
                failed,
                first_failure: (failed > 0).then_some(16.2),
                by_10s: vec![0; 5],
                errors: std::collections::BTreeMap::new(),
                took: 50.0,
                last_start: 50.0,
                most_late: 0.0,
            },
            syn_flood: SynFloodFigures {
                flood: 6_000,
                started: 6_000,
                flood_errors: std::collections::BTreeMap::new(),
                flood_took: 1.1,
                asks: 50,
                answered: 50,
                errors: std::collections::BTreeMap::new(),
                asked_took: 0.1,
                syn_acks_dropped: 22_000,
                connected: 0,
            },
            udp_flood: UdpFloodFigures {
                flows: 300_000,
                sent: 300_000,
                send_errors: std::collections::BTreeMap::new(),
                took: 30.0,
                idle: 20,
                answered_before: 20,
                alive,
                errors: std::collections::BTreeMap::new(),
            },
            tracking_after_udp: "nf_conntrack 76578 entries".into(),
        }
    }

    /// The loads' table sets each load's tierlb figure beside kube-proxy's, in the words; the rate
    /// table says which kube-proxy mode tierlb's steps alternated with, and only for tierlb.
    #[test]
    fn the_section_sets_tierlb_beside_kube_proxy() {
        let rate = |path| RateRow {
            path,
            beside: DataPath::KubeProxyIptables,
            step_secs: 3.0,
            sustained: Some(2_750),
            failed_at: Some(3_000),
            steps: Vec::new(),
        };
        let snat = Snat {
            rounds: 5,
            seconds: 2.0,
            rows: Vec::new(),
            rates: vec![rate(DataPath::Tierlb), rate(DataPath::KubeProxyIptables)],
            loads: vec![loads(DataPath::Tierlb, 684, 15), loads(DataPath::KubeProxyIptables, 0, 20)],
        };
        let md = section(&snat);
        for want in [
            "| load | tierlb | kube-proxy iptables |",
            "| 120 new TCP flows/s for 50 s to a NodePort whose only endpoint is on the other node | 684 of 6,000 failed, the first at 16 s | 0 of 6,000 failed |",
            "| 6,000 SYNs whose SYN-ACKs the client drops, then 50 connects from a second client address | 50 of 50 answered | 50 of 50 answered |",
            "| 300,000 one-datagram UDP flows to a UDP NodePort (no SNAT) beside 20 idle TCP connections | 15 of 20 alive (nf_conntrack 76578 entries) | 20 of 20 alive (nf_conntrack 76578 entries) |",
            "| tierlb | kube-proxy iptables | 2,750 | 3,000 |  |",
            "| kube-proxy iptables | - | 2,750 | 3,000 |  |",
        ] {
            assert!(md.contains(want), "{want}\nin\n{md}");
        }
    }
}
