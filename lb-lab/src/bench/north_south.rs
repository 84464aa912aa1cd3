//! The north-south rows: an external client in a namespace of its own reaches a pod behind a node (its own
//! namespace, the pod behind a veth) four ways at each Service count: the pod's IP routed by the node
//! (`direct`, the floor), a node port that tierlb's tc programs on the node's uplink translate (the Service
//! maps filled through the reconciler, the pod a local endpoint: DNAT, the client's address kept), and node
//! ports of kube-proxy-style iptables and nftables rule sets (DNAT plus masquerade, as kube-proxy writes them
//! for `externalTrafficPolicy: Cluster`). All four are in place at once, each on its own node ports, so the
//! rows interleave: every round runs each path once per load mode, and a path's figure is the median over the
//! rounds of its ratio to `direct` in the same round (with the rounds' spread), which holds on a machine whose
//! speed drifts. The node's namespace has netfilter's nat hooks loaded for every row (the rule sets), as a
//! node with kube-proxy's rules has. The client and the node share a bridge with a second node, whose pod is
//! the remote endpoint of the SNAT section (`north_south_snat`); these rows do not reach it.
use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::Command,
};

use anyhow::Context as _;
use lb_common::FLAG_SNAT_TO_FRONTEND;
use lb_testkit::{deployed::Node, sandbox::NetNs};
use tierlb::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, ebpf::Loaded},
    model::{ObjKey, ServicePortName},
};

use super::{
    figures::{DataPath, KubeProxySync, NsRow},
    load::{LoadMode, LoadResult, Placement, Sink},
    run::{BpfStats, Loader, prog_stats},
    workloads::{endpoints_to, svc_chains, target},
};

pub(super) const NODE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub(super) const CLIENT: &str = "192.0.2.100";
pub(super) const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
/// Node-2 and its pod, the remote backend of the SNAT rows.
pub(super) const NODE_2: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub(super) const POD_2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
pub(super) const POD_PORT: u16 = 8080;

/// The first node port of each path's Service set (Service `i` has `base + i`): apart, so that the three
/// sets are in place at once; below the SNAT ports (61000 and up).
fn base(path: DataPath) -> u16 {
    match path {
        DataPath::Direct => 0,
        DataPath::Tierlb | DataPath::TierlbXdp | DataPath::TierlbDsr | DataPath::TierlbXdpDsr => 10_000,
        DataPath::Iptables => 20_000,
        DataPath::Nftables => 30_000,
        // Real kube-proxy's Services have node ports from 40000 (`north_south_kube_proxy`), one set for
        // both of its modes, measured in rounds of their own.
        DataPath::KubeProxyIptables | DataPath::KubeProxyNftables => super::north_south_kube_proxy::BASE,
    }
}

/// Service `i`'s endpoints in a set of `n`: the measured one (in the middle) has the pod.
fn endpoints(i: usize, per: usize, n: usize) -> Vec<SocketAddr> {
    endpoints_to(SocketAddr::new(POD.into(), POD_PORT), i, per, n)
}

/// The node ports of `n` Services as the agent would program them: outside-scope frontends.
fn desired(n: usize, per: usize) -> Desired {
    (0..n)
        .map(|i| {
            let port = base(DataPath::Tierlb) + i as u16;
            let b = endpoints(i, per, n).into_iter().map(|a| addr::backend(a, 6)).collect();
            (
                addr::outside_frontend_key(IpAddr::V4(NODE), port, 6),
                DesiredFrontend {
                    name: ServicePortName::new(ObjKey::new("bench", format!("np-{i}")), "").into(),
                    tiers: [Vec::new(), Vec::new(), b],
                    flags: FLAG_SNAT_TO_FRONTEND,
                    affinity_timeout_s: 0,
                },
            )
        })
        .collect()
}

/// kube-proxy's iptables node ports: KUBE-NODEPORTS (from PREROUTING for the node's own addresses) ->
/// KUBE-EXT-* (mark for masquerade) -> KUBE-SVC-* (statistic random) -> KUBE-SEP-* DNAT; KUBE-POSTROUTING
/// masquerades what is marked.
pub(super) fn iptables_node_ports(n: usize, per: usize) -> String {
    let mut chains = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n",
    );
    let mut rules = String::from(
        "-A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n-A POSTROUTING -j KUBE-POSTROUTING\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n-A KUBE-POSTROUTING -j MASQUERADE --random-fully\n",
    );
    for i in 0..n {
        let (ext, svc) = (format!("KUBE-EXT-{i:012X}"), format!("KUBE-SVC-{i:012X}"));
        let _ = writeln!(chains, ":{ext} - [0:0]\n:{svc} - [0:0]");
        let port = base(DataPath::Iptables) + i as u16;
        let _ = writeln!(rules, "-A KUBE-NODEPORTS -p tcp -m tcp --dport {port} -j {ext}");
        let _ = writeln!(rules, "-A {ext} -j KUBE-MARK-MASQ\n-A {ext} -j {svc}");
        svc_chains(&mut chains, &mut rules, &svc, i, &endpoints(i, per, n));
    }
    chains + &rules + "COMMIT\n"
}

/// kube-proxy's nftables node ports: a protocol . port verdict map (for the node's own addresses) to a
/// per-Service chain that marks for masquerade and picks an endpoint with `numgen random`.
pub(super) fn nft_node_ports(n: usize, per: usize) -> String {
    let mut s = String::from("table ip kube-proxy-np {\n");
    let mut elems = Vec::new();
    for i in 0..n {
        let eps = endpoints(i, per, n);
        let map: Vec<String> =
            eps.iter().enumerate().map(|(e, a)| format!("{e} : {} . {}", a.ip(), a.port())).collect();
        let _ = writeln!(
            s,
            "  chain ext-{i} {{\n    mark set mark or 0x4000\n    meta l4proto tcp dnat ip addr . port to numgen random mod {} map {{ {} }}\n  }}",
            eps.len(),
            map.join(", ")
        );
        elems.push(format!("tcp . {} : goto ext-{i}", base(DataPath::Nftables) + i as u16));
    }
    let _ = writeln!(
        s,
        "  map service-nodeports {{\n    type inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}",
        elems.join(", ")
    );
    s.push_str("  chain prerouting {\n    type nat hook prerouting priority -100; policy accept;\n    fib daddr type local meta l4proto . th dport vmap @service-nodeports\n  }\n");
    s.push_str("  chain postrouting {\n    type nat hook postrouting priority 100; policy accept;\n    mark and 0x4000 == 0x4000 masquerade fully-random\n  }\n}\n");
    s
}

/// The client's namespace, the LAN (a bridge), node-1 (with its pod), node-2 (with its own, the remote
/// backend of the SNAT rows), and the backend in each pod.
pub(super) struct Lab {
    pub(super) ext: NetNs,
    pub(super) node: Node,
    /// Node-2: its pod is reached from outside through node-1's node ports (DNAT and SNAT), or routed by
    /// node-1 to node-2 (`direct`). Nothing runs in it but its routes.
    pub(super) node_2: Node,
    /// Where the client and the backend run.
    pub(super) cpus: Placement,
    /// Node-1's pod and node-2's.
    pub(super) pods: [NetNs; 2],
    pub(super) lan: NetNs,
    _sinks: [Sink; 2],
}

/// A veth from `ns`'s `dev` to the LAN's bridge (`port` on the bridge's side), `addr`/24 on it.
fn uplink(lan: &NetNs, ns: &NetNs, port: &str, dev: &str, addr: &str) -> anyhow::Result<()> {
    lan.ip(&["link", "add", port, "type", "veth", "peer", "name", dev, "netns", ns.name()])?;
    lan.ip(&["link", "set", port, "master", "br0", "up"])?;
    ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev])?;
    ns.ip(&["link", "set", dev, "up"])?;
    Ok(())
}

impl Lab {
    pub(super) fn new() -> anyhow::Result<Self> {
        let mut node = Node::new("bench-ns-node")?;
        let mut node_2 = Node::new("bench-ns-node-2")?;
        let lan = NetNs::new("bench-ns-lan")?;
        lan.ip(&["link", "add", "br0", "type", "bridge"])?;
        lan.ip(&["link", "set", "br0", "up"])?;
        let ext = NetNs::new("bench-ns-ext")?;
        uplink(&lan, &node.netns, "p1", "eth", &NODE.to_string())?;
        uplink(&lan, &node_2.netns, "p2", "eth", &NODE_2.to_string())?;
        uplink(&lan, &ext, "p3", "uplink", CLIENT)?;
        ext.ip(&["route", "add", "10.244.0.0/16", "via", &NODE.to_string()])?;
        node.netns.ip(&["route", "add", "10.244.2.0/24", "via", &NODE_2.to_string()])?;
        node_2.netns.ip(&["route", "add", "10.244.1.0/24", "via", &NODE.to_string()])?;
        // Replies of direct connects to node-2's pod go back by node-1, the way they came: a node whose
        // netfilter tracks connections (kube-proxy's rules) would otherwise see half of each flow and drop
        // the client's ACKs as invalid. Node-1 forwards them out of the port they came in by, which the
        // kernel answers with ICMP redirects unless told not to.
        node_2.netns.ip(&["route", "add", &format!("{CLIENT}/32"), "via", &NODE.to_string()])?;
        for key in ["all", "eth"] {
            let sysctl = format!("net.ipv4.conf.{key}.send_redirects=0");
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", node.netns.name(), "sysctl", "-q", "-w", &sysctl]);
            anyhow::ensure!(cmd.status()?.success(), "{sysctl} in node-1");
        }
        let pod = node.add_pod("bench-ns-pod", POD.into())?;
        let pod_2 = node_2.add_pod("bench-ns-pod-2", POD_2.into())?;
        let cpus = Placement::split();
        let sinks = [
            Sink::start(&pod, SocketAddr::new(POD.into(), POD_PORT), cpus.backend)?,
            Sink::start(&pod_2, SocketAddr::new(POD_2.into(), POD_PORT), cpus.backend)?,
        ];
        Ok(Self { ext, node, node_2, cpus, pods: [pod, pod_2], lan, _sinks: sinks })
    }

    /// `CMD ARGS` in the node's namespace, `input` on its stdin.
    pub(super) fn node_cmd(&self, args: &[&str], input: &str) -> anyhow::Result<()> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.node.netns.name()]).args(args);
        let took = super::run::timed(&mut cmd, input, super::run::LOAD_LIMIT)?;
        took.map(|_| ())
            .with_context(|| format!("{args:?} did not finish within {:?}", super::run::LOAD_LIMIT))
    }
}

/// The address each path's measured Service is reached at, with `n` Services.
fn target_of(path: DataPath, n: usize) -> SocketAddr {
    match path {
        DataPath::Direct => SocketAddr::new(POD.into(), POD_PORT),
        _ => SocketAddr::new(NODE.into(), base(path) + target(n) as u16),
    }
}

/// Every north-south row at each count in `counts` (10 endpoints per Service), `rounds` interleaved rounds
/// each; `lab_bin` is `tierlb-lab`, `secs` the length of one load run. With `kube_proxy` (the on-node syncs of
/// real kube-proxy), real kube-proxy's rows from outside too, after the others at each count.
pub(super) fn rows(
    lab_bin: &std::path::Path,
    counts: &[usize],
    rounds: usize,
    secs: f64,
    kube_proxy: Option<&[KubeProxySync]>,
) -> anyhow::Result<Vec<NsRow>> {
    let per = 10;
    let lab = Lab::new()?;
    let loader = Loader { lab: lab_bin, ns: &lab.ext, threads: 1, cpu: lab.cpus.client, secs };
    let Loaded { mut programs, maps, ns: mut ns_maps, .. } =
        Loaded::load(tierlb::datapath::ebpf::Capacities::default(), None)?;
    ns_maps.set_local(&BTreeSet::from([IpAddr::V4(POD)]))?;
    // The ingress pre-filter, as the agent writes it: the node's address.
    ns_maps.set_addrs(&std::collections::BTreeMap::from([(IpAddr::V4(NODE), lb_common::ADDR_NODE)]))?;
    attach_in(&lab.node.netns, &mut programs)?;
    let mut rec = Reconciler::new(maps);
    let mut out = Vec::new();
    for &n in counts {
        let rep = rec.apply(&desired(n, per), std::time::Instant::now());
        anyhow::ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));
        lab.node_cmd(&["iptables-restore", "-w"], &iptables_node_ports(n, per))
            .context("iptables-restore")?;
        lab.node_cmd(&["nft", "-f", "-"], &nft_node_ports(n, per)).context("nft -f")?;
        for mode in LoadMode::ALL {
            let mut runs: Vec<Vec<LoadResult>> = vec![Vec::new(); DataPath::ALL.len()];
            for _ in 0..rounds {
                for (p, path) in DataPath::ALL.iter().enumerate() {
                    runs[p].push(loader.run(None, target_of(*path, n), mode)?);
                }
            }
            // The tc programs' cost per packet from one more tierlb run with the kernel's statistics on (they
            // add clock reads to every program run, on every path through the uplink: not in the rounds).
            let tc_ns = {
                let _stats = BpfStats::on();
                let before = (prog_stats("tc_ingress"), prog_stats("tc_egress"));
                loader.run(None, target_of(DataPath::Tierlb, n), mode)?;
                let after = (prog_stats("tc_ingress"), prog_stats("tc_egress"));
                match (before.0, before.1, after.0, after.1) {
                    (Some(i0), Some(e0), Some(i1), Some(e1)) if i1.1 + e1.1 > i0.1 + e0.1 => {
                        (i1.0 + e1.0 - i0.0 - e0.0) as f64 / (i1.1 + e1.1 - i0.1 - e0.1) as f64
                    }
                    // As the median of no reading was.
                    _ => f64::NAN,
                }
            };
            for (p, path) in DataPath::ALL.iter().enumerate() {
                let row = NsRow::of(
                    *path,
                    n,
                    mode,
                    &runs[p],
                    &runs[0],
                    (*path == DataPath::Tierlb).then_some(tc_ns),
                );
                progress(&row);
                out.push(row);
            }
        }
        // The rule sets gone (iptables writes through nf_tables here), before real kube-proxy writes its own.
        let _ = lab.node_cmd(&["nft", "flush", "ruleset"], "");
        if let Some(syncs) = kube_proxy {
            out.extend(super::north_south_kube_proxy::rows(&lab, &loader, n, per, rounds, syncs)?);
        }
    }
    drop(programs);
    Ok(out)
}

/// A north-south row's progress line.
pub(super) fn progress(row: &NsRow) {
    eprintln!(
        "bench: from outside {:<9} {:>6} services  {:<7}  p50 {:>6.1} us ({:.2}x direct, {:.2}-{:.2})  p99 {:>7.1} us  {:>8.0} ops/s  {} errors",
        row.path.as_str(),
        row.services,
        row.mode.as_str(),
        row.p50_us,
        row.p50_ratio.median,
        row.p50_ratio.min,
        row.p50_ratio.max,
        row.p99_us,
        row.per_sec,
        row.errors
    );
}

/// Attach the tc programs (and `xdp_ingress` as the process's `XdpSetting` says) to the node's uplink, from a
/// thread inside the node's namespace.
pub(super) fn attach_in(ns: &NetNs, programs: &mut tierlb::datapath::ebpf::Programs) -> anyhow::Result<()> {
    ns.run(|| {
        programs.attach_device("eth", None)??;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node-port rule sets load as written (checked by the tools in a namespace of the test's own, not
    /// committed), and their shape is kube-proxy's.
    #[test]
    fn the_node_port_rule_sets_are_valid_and_shaped_as_kube_proxys() {
        let ipt = iptables_node_ports(3, 2);
        for want in [
            "-A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
            "-A KUBE-NODEPORTS -p tcp -m tcp --dport 20001 -j KUBE-EXT-000000000001",
            "-A KUBE-EXT-000000000001 -j KUBE-MARK-MASQ",
            "-A KUBE-SEP-000000010000 -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:8080",
            "-A KUBE-POSTROUTING -j MASQUERADE --random-fully",
        ] {
            assert!(ipt.contains(want), "{want} in\n{ipt}");
        }
        let nft = nft_node_ports(3, 2);
        assert!(nft.contains("tcp . 30001 : goto ext-1"), "{nft}");
        let ns = NetNs::new("bench-ns-rules").unwrap();
        let check = |args: &[&str], input: &str| {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns.name()]).args(args);
            let took = super::super::run::timed(&mut cmd, input, std::time::Duration::from_secs(30));
            assert!(took.as_ref().is_ok_and(Option::is_some), "{args:?}: {took:?}\n{input}");
        };
        check(&["iptables-restore", "--test", "-w"], &ipt);
        check(&["nft", "-c", "-f", "-"], &nft);
    }
}
