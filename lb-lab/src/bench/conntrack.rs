//! Conntrack memory at N tracked flows from outside the node: tierlb's table (an LRU hash the kernel
//! preallocates when the programs load, two entries a flow) against nf_conntrack, the table kube-proxy's
//! iptables and nftables modes both rely on (an object a flow, allocated as the flow starts).
//!
//! The flows are real: an external client sends one UDP datagram from each of N (address, port) pairs to a
//! node port, on the north-south bench's namespaces. First tierlb's tc programs translate them (no netfilter
//! rule in the node's namespace, so nf_conntrack is not in the path); then, the programs detached,
//! kube-proxy-style iptables rules for the same node port (`externalTrafficPolicy: Local`: DNAT, the
//! client's address kept, as tierlb's local endpoint). Each table is counted after its flows, and its
//! memory taken as the kernel accounts it: tierlb's from the map's fdinfo (`memlock`, the map's
//! `map_mem_usage`), nf_conntrack's as the growth of the kernel's unreclaimable slab (`SUnreclaim` in
//! /proc/meminfo) over its flows, which holds the conntrack objects and their extensions (the NAT one).
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::{FLAG_SNAT_TO_FRONTEND, PROTO_UDP};
use tierlb::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, ebpf::Loaded, marks::boottime_ns},
    model::{ObjKey, ServicePortName},
};

use super::{
    figures::CtMemory,
    north_south::{Lab, NODE, POD, POD_PORT, attach_in},
};

/// The node port the flows are sent to (one Service, UDP, the pod its local endpoint).
const NODE_PORT: u16 = 40_000;
/// The client's source ports: each source address sends from every one of them.
const PORTS: std::ops::Range<u16> = 10_000..60_000;
/// Datagrams sent before a pause, so that the node's backlog never overflows.
const BURST: usize = 256;
/// Passes over the flows: a datagram the veth's backlog dropped is sent again (an existing flow's entry is
/// only refreshed by it).
const PASSES: usize = 3;

/// The tables' sizes for the measurement: the UDP table, which the flows go through, as large as the single
/// table before the tables were split (262,144 entries, 131,072 flows: `--max-conntrack-udp 262144`), so the
/// row's flows fit; the others at their defaults.
fn capacities() -> tierlb::datapath::ebpf::Capacities {
    tierlb::datapath::ebpf::Capacities { conntrack_udp: 262_144, ..Default::default() }
}

/// tierlb's UDP conntrack table and nf_conntrack at `flows` tracked UDP flows.
pub(super) fn memory(flows: usize) -> anyhow::Result<Vec<CtMemory>> {
    let lab = Lab::new()?;
    let sources = client_sources(&lab, flows)?;
    let to = SocketAddr::new(NODE.into(), NODE_PORT);
    let mut out = Vec::new();
    {
        let caps = capacities();
        let Loaded { mut programs, maps, ns: mut ns_maps, .. } = Loaded::load(caps, None)?;
        ns_maps.set_local(&std::collections::BTreeSet::from([IpAddr::V4(POD)]))?;
        // The ingress pre-filter, as the agent writes it: the node's address.
        ns_maps.set_addrs(&std::collections::BTreeMap::from([(IpAddr::V4(NODE), lb_common::ADDR_NODE)]))?;
        attach_in(&lab.node.netns, &mut programs)?;
        let mut rec = Reconciler::new(maps);
        let rep = rec.apply(&desired(), Instant::now());
        anyhow::ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));
        let slab0 = unreclaimable_slab()?;
        let tracked =
            send_until(&lab, &sources, flows, to, || Ok(ns_maps.conntrack_stats(boottime_ns()).flows))?;
        let slab1 = unreclaimable_slab()?;
        let stats = ns_maps.conntrack_stats(boottime_ns());
        let bytes = ns_maps.udp_conntrack_memory().context("the conntrack map's fdinfo has no memlock")?;
        out.push(CtMemory {
            table: "tierlb".into(),
            flows: tracked,
            entries: stats.tables[2].entries,
            bytes,
            slab_growth: slab1.saturating_sub(slab0),
            capacity_flows: Some(u64::from(caps.conntrack_udp / 2)),
            nf_conntrack_alongside: nf_conntrack_count(&lab)?,
        });
        drop(programs);
    }
    lab.node_cmd(&["iptables-restore", "-w"], &iptables_udp_local_node_port()).context("iptables-restore")?;
    let slab0 = unreclaimable_slab()?;
    let tracked = send_until(&lab, &sources, flows, to, || nf_conntrack_count(&lab))?;
    let slab1 = unreclaimable_slab()?;
    let growth = slab1.saturating_sub(slab0);
    out.push(CtMemory {
        table: "nf_conntrack".into(),
        flows: tracked,
        entries: tracked,
        bytes: growth,
        slab_growth: growth,
        capacity_flows: None,
        nf_conntrack_alongside: tracked,
    });
    let _ = lab.node_cmd(&["nft", "flush", "ruleset"], "");
    for r in &out {
        eprintln!(
            "bench: conntrack {:<12} {:>7} flows  {:>7} entries  {:>6.1} MiB  {:>4.0} B/flow  slab +{:.1} MiB",
            r.table,
            r.flows,
            r.entries,
            r.bytes as f64 / f64::from(1 << 20),
            r.bytes as f64 / r.flows.max(1) as f64,
            r.slab_growth as f64 / f64::from(1 << 20)
        );
    }
    Ok(out)
}

/// One UDP node port, its one endpoint the pod (local: DNAT, the client's address kept).
fn desired() -> Desired {
    let b = vec![addr::backend(SocketAddr::new(POD.into(), POD_PORT), PROTO_UDP)];
    [(
        addr::outside_frontend_key(IpAddr::V4(NODE), NODE_PORT, PROTO_UDP),
        DesiredFrontend {
            name: ServicePortName::new(ObjKey::new("bench", "conntrack"), "").into(),
            tiers: [Vec::new(), Vec::new(), b],
            flags: FLAG_SNAT_TO_FRONTEND,
            affinity_timeout_s: 0,
        },
    )]
    .into_iter()
    .collect()
}

/// kube-proxy's iptables rules for that node port under `externalTrafficPolicy: Local`: KUBE-NODEPORTS ->
/// KUBE-EXT-* -> KUBE-SVL-* (the local endpoints) -> KUBE-SEP-* DNAT, no masquerade.
fn iptables_udp_local_node_port() -> String {
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-EXT-CT - [0:0]\n:KUBE-SVL-CT - [0:0]\n:KUBE-SEP-CT - [0:0]\n\
         -A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         -A KUBE-NODEPORTS -p udp -m udp --dport {NODE_PORT} -j KUBE-EXT-CT\n\
         -A KUBE-EXT-CT -j KUBE-SVL-CT\n-A KUBE-SVL-CT -j KUBE-SEP-CT\n\
         -A KUBE-SEP-CT -p udp -m udp -j DNAT --to-destination {POD}:{POD_PORT}\nCOMMIT\n"
    )
}

/// Enough client addresses for `flows` (address, port) pairs, added to the client's uplink.
fn client_sources(lab: &Lab, flows: usize) -> anyhow::Result<Vec<Ipv4Addr>> {
    let per = PORTS.len();
    let sources: Vec<Ipv4Addr> =
        (0..flows.div_ceil(per)).map(|i| Ipv4Addr::new(192, 0, 2, 101 + i as u8)).collect();
    anyhow::ensure!(sources.len() < 100, "{flows} flows need more client addresses than the /24 has");
    for ip in &sources {
        lab.ext.ip(&["addr", "add", &format!("{ip}/24"), "dev", "uplink"])?;
    }
    Ok(sources)
}

/// Send one datagram from each of the first `flows` (source, port) pairs to `to`, pass after pass until
/// `tracked` counts them all (or `PASSES` are made); what it counts at the end.
fn send_until(
    lab: &Lab,
    sources: &[Ipv4Addr],
    flows: usize,
    to: SocketAddr,
    tracked: impl Fn() -> anyhow::Result<usize>,
) -> anyhow::Result<usize> {
    let mut n = 0;
    for _ in 0..PASSES {
        send_flows(lab, sources, flows, to)?;
        std::thread::sleep(Duration::from_millis(200));
        n = tracked()?;
        if n >= flows {
            break;
        }
    }
    Ok(n)
}

/// One datagram from each of the first `flows` (source, port) pairs, from a thread in the client's namespace.
fn send_flows(lab: &Lab, sources: &[Ipv4Addr], flows: usize, to: SocketAddr) -> anyhow::Result<()> {
    lab.ext.run(|| {
        let pairs = sources.iter().flat_map(|ip| PORTS.map(move |p| SocketAddr::new((*ip).into(), p)));
        for (i, from) in pairs.take(flows).enumerate() {
            let sock = UdpSocket::bind(from).with_context(|| format!("bind {from}"))?;
            sock.send_to(b"x", to).with_context(|| format!("send from {from}"))?;
            if i % BURST == BURST - 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    })
}

/// nf_conntrack's entries in the node's namespace (its sysctls are the reading thread's namespace's).
pub(super) fn nf_conntrack_count(lab: &Lab) -> anyhow::Result<usize> {
    lab.node.netns.run(|| match std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count") {
        Ok(n) => Ok(n.trim().parse()?),
        // Without the nf_conntrack module loaded the file is missing: no flow is tracked there.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(anyhow::Error::new(e).context("reading nf_conntrack_count")),
    })
}

/// The kernel's unreclaimable slab (`SUnreclaim`), bytes.
fn unreclaimable_slab() -> anyhow::Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo")?;
    let kb = info
        .lines()
        .find_map(|l| l.strip_prefix("SUnreclaim:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("SUnreclaim in /proc/meminfo")?;
    Ok(kb * 1024)
}

#[cfg(test)]
mod tests {
    /// Each table is read with the flows sent through it: tierlb's two entries a flow in its preallocated
    /// table, with nf_conntrack out of its path, then nf_conntrack's own count under the iptables rules.
    #[test]
    fn each_table_is_measured_with_the_flows_sent_through_it() {
        let r = super::memory(3_000).unwrap();
        let [tierlb, nf] = r.as_slice() else { panic!("two tables: {r:?}") };
        assert_eq!(
            (tierlb.table.as_str(), tierlb.flows, tierlb.nf_conntrack_alongside),
            ("tierlb", 3_000, 0)
        );
        assert_eq!(tierlb.entries, 6_000, "a forward and a reply entry a flow");
        let caps = super::capacities();
        assert_eq!(tierlb.capacity_flows, Some(u64::from(caps.conntrack_udp / 2)));
        let kv = size_of::<lb_common::CtKey>() + size_of::<lb_common::CtValue>();
        assert!(tierlb.bytes >= u64::from(caps.conntrack_udp) * kv as u64, "preallocated: {tierlb:?}");
        assert_eq!((nf.table.as_str(), nf.flows), ("nf_conntrack", 3_000));
    }
}
