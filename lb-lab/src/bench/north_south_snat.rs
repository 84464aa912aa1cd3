//! The SNAT path from outside, tierlb against real kube-proxy v1.36.3 on the same node: the north-south lab's
//! client reaches node-2's pod through node-1's node ports (DNAT to a remote endpoint, SNAT to node-1's
//! address, the replies translated back on node-1), with tierlb's tc programs and kube-proxy's rules in place
//! at once, each on node ports of its own, so that their runs interleave. Per kube-proxy mode (nftables, then
//! iptables; one kube-proxy at a time, as a node has): the connect rows (direct to node-2's pod, routed by
//! node-1; tierlb; kube-proxy, in turn, the order reversed every other round, a ratio per round against that
//! round's direct run), then the packet-rate row of each of tierlb and kube-proxy, their steps alternating.
//! Before kube-proxy starts, and again with kube-proxy in iptables mode last of all (its floods fill
//! nf_conntrack, which the other rows must not meet), issue 63's three loads (`lb_testkit::ns_loads`): the
//! same traffic the in-kernel tests assert on tierlb, here set beside kube-proxy's figures.
use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use lb_common::FLAG_SNAT_TO_FRONTEND;
use lb_testkit::{
    kube_proxy::Mode,
    manifests::{Ep, Svc},
    ns_loads::{NewFlows, SynFlood, UdpFlood, add_address, pod::PodServer},
};
use serde_json::Value;
use tierlb::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, ebpf::Loaded},
    model::{ObjKey, ServicePortName},
};

use super::{
    figures::{DataPath, NsRow},
    kube_proxy::{FIRST_SYNC_LIMIT, cleanup},
    load::{LoadMode, LoadResult, Sink},
    north_south::{Lab, NODE, POD, POD_2, POD_PORT, attach_in},
    north_south_rate::{RateRow, max_rates},
    real_apiserver::RealApiServer,
    run::Loader,
};

/// The pods' echo servers (`lb_testkit::ns_loads::pod::PodServer`), beside the bench's sink on `POD_PORT`:
/// tierlb's endpoints on the first port, kube-proxy's on the second. Both translate to node-1's address with
/// ports of their own choosing, so with one endpoint between them a flow of one could take a tuple the
/// other still remembers (tierlb's reply translation would then take kube-proxy's replies for its own):
/// a node runs one of them for a Service, so here each has endpoints of its own.
const ECHO_PORTS: [u16; 2] = [8081, 8082];
/// kube-proxy's sink on node-2's pod (tierlb's, and direct's, is the lab's, on `POD_PORT`).
const KUBE_PROXY_SINK_PORT: u16 = 8090;

/// A node port of the section: what it leads to. tierlb's are 31000 + the index, kube-proxy's 32000 + it.
#[derive(Clone, Copy)]
enum Port {
    /// Node-2's sink (the connect rows).
    RemoteSink,
    /// Node-2's echo server (the SNAT load, the SYN flood, the packet rate).
    RemoteEcho,
    /// Node-1's echo server over TCP (the idle connections beside the UDP flood).
    LocalEcho,
    /// Node-1's echo server over UDP (the UDP flood; no SNAT).
    LocalEchoUdp,
}

impl Port {
    const ALL: [Self; 4] = [Self::RemoteSink, Self::RemoteEcho, Self::LocalEcho, Self::LocalEchoUdp];

    /// The node port of `path` (tierlb or either kube-proxy mode).
    fn of(self, path: DataPath) -> u16 {
        let base = if path == DataPath::Tierlb { 31_000 } else { 32_000 };
        base + self as u16
    }

    /// Node-1's address at the node port of `path`.
    fn at(self, path: DataPath) -> SocketAddr {
        SocketAddr::new(NODE.into(), self.of(path))
    }

    /// The endpoint.
    /// The endpoint of `path`'s node port (tierlb's, or kube-proxy's: see `ECHO_PORTS`).
    fn endpoint(self, path: DataPath) -> SocketAddr {
        let tierlb = path == DataPath::Tierlb;
        let echo = ECHO_PORTS[usize::from(!tierlb)];
        match self {
            Self::RemoteSink if tierlb => SocketAddr::new(POD_2.into(), POD_PORT),
            Self::RemoteSink => SocketAddr::new(POD_2.into(), KUBE_PROXY_SINK_PORT),
            Self::RemoteEcho => SocketAddr::new(POD_2.into(), echo),
            Self::LocalEcho | Self::LocalEchoUdp => SocketAddr::new(POD.into(), echo),
        }
    }

    fn proto(self) -> (u8, &'static str) {
        if matches!(self, Self::LocalEchoUdp) { (17, "UDP") } else { (6, "TCP") }
    }

    /// The endpoint's node.
    fn node(self) -> &'static str {
        if matches!(self, Self::RemoteSink | Self::RemoteEcho) { "node-2" } else { "node-1" }
    }

    /// Who answers at the endpoint (the echo servers' names).
    fn pod(self) -> &'static str {
        if self.node() == "node-2" { "echo-node-2" } else { "echo-node-1" }
    }
}

/// tierlb's node ports, as the agent programs node ports (outside-scope frontends).
fn desired() -> Desired {
    Port::ALL
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let (proto, _) = p.proto();
            (
                addr::outside_frontend_key(IpAddr::V4(NODE), p.of(DataPath::Tierlb), proto),
                DesiredFrontend {
                    name: ServicePortName::new(ObjKey::new("bench", format!("snat-{i}")), "").into(),
                    tiers: [Vec::new(), Vec::new(), vec![addr::backend(p.endpoint(DataPath::Tierlb), proto)]],
                    flags: FLAG_SNAT_TO_FRONTEND,
                    affinity_timeout_s: 0,
                },
            )
        })
        .collect()
}

/// kube-proxy's Services: one NodePort Service (`externalTrafficPolicy: Cluster`) per node port.
fn docs() -> Vec<Value> {
    let mut out = Vec::new();
    for (i, p) in Port::ALL.into_iter().enumerate() {
        let ep = p.endpoint(DataPath::KubeProxyIptables);
        let mut svc = Svc::new(&format!("snat-{i}"), IpAddr::from([10, 96, 1, 10 + i as u8]), 80, ep.port());
        svc.protocol = p.proto().1;
        let mut service = svc.service();
        service["spec"]["type"] = "NodePort".into();
        service["spec"]["ports"][0]["nodePort"] = p.of(DataPath::KubeProxyIptables).into();
        out.push(service);
        out.extend(svc.slices(&[Ep::ready(ep.ip(), p.node())]));
    }
    out
}

/// Issue 63's three loads on one path, with the node's connection tracking when it was read.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadsRow {
    /// The path (tierlb, or kube-proxy in iptables mode).
    pub path: DataPath,
    /// New TCP flows through SNAT at a steady rate.
    pub new_flows: lb_testkit::ns_loads::NewFlowsFigures,
    /// The half-open flood, then a second client.
    pub syn_flood: lb_testkit::ns_loads::SynFloodFigures,
    /// The UDP flood beside idle TCP connections.
    pub udp_flood: lb_testkit::ns_loads::UdpFloodFigures,
    /// The node's connection tracking after the UDP flood (tierlb's tables, or nf_conntrack's count).
    pub tracking_after_udp: String,
}

/// What the section measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Snat {
    /// Interleaved rounds per kube-proxy mode.
    pub rounds: usize,
    /// Seconds of each connect run.
    pub seconds: f64,
    /// Connect rows to node-2's pod: direct, then tierlb and kube-proxy per mode (tierlb's rounds of both
    /// modes' runs in one row).
    pub rows: Vec<NsRow>,
    /// New flows a second sustained with no failed connect, per path (tierlb once beside each mode).
    pub rates: Vec<RateRow>,
    /// The three loads, tierlb then kube-proxy in iptables mode.
    pub loads: Vec<LoadsRow>,
}

/// How large the section's runs are: `quick` keeps `cargo xtask bench --quick` quick.
pub(super) struct Sizes {
    pub(super) rounds: usize,
    pub(super) secs: f64,
    pub(super) new_flows: NewFlows,
    pub(super) udp_flows: usize,
    pub(super) step_secs: f64,
    pub(super) max_steps: usize,
}

impl Sizes {
    pub(super) fn of(quick: bool) -> Self {
        if quick {
            Self {
                rounds: 3,
                secs: 0.75,
                new_flows: NewFlows { seconds: 10.0, ..NewFlows::ISSUE },
                udp_flows: 100_000,
                step_secs: 2.0,
                max_steps: 6,
            }
        } else {
            Self {
                rounds: 5,
                secs: 2.0,
                new_flows: NewFlows::ISSUE,
                udp_flows: UdpFlood::issue().flows,
                step_secs: 3.0,
                max_steps: 12,
            }
        }
    }
}

/// The whole section in a lab of its own; `lab_bin` is `tierlb-lab` (the connect rows' client).
pub(super) fn measure(lab_bin: &std::path::Path, quick: bool) -> anyhow::Result<Snat> {
    let size = Sizes::of(quick);
    let lab = Lab::new()?;
    let loader = Loader { lab: lab_bin, ns: &lab.ext, threads: 1, cpu: lab.cpus.client, secs: size.secs };
    let _echo = [
        PodServer::start(
            &lab.pods[0],
            Port::LocalEcho.pod(),
            &ECHO_PORTS.map(|p| SocketAddr::new(POD.into(), p)),
        ),
        PodServer::start(
            &lab.pods[1],
            Port::RemoteEcho.pod(),
            &ECHO_PORTS.map(|p| SocketAddr::new(POD_2.into(), p)),
        ),
    ];
    let _kube_proxy_sink =
        Sink::start(&lab.pods[1], Port::RemoteSink.endpoint(DataPath::KubeProxyIptables), lab.cpus.backend)?;
    let Loaded { mut programs, maps, ns: mut ns_maps, .. } =
        Loaded::load(tierlb::datapath::ebpf::Capacities::default(), None)?;
    ns_maps.set_local(&std::collections::BTreeSet::from([IpAddr::V4(POD)]))?;
    ns_maps.set_addrs(&std::collections::BTreeMap::from([(IpAddr::V4(NODE), lb_common::ADDR_NODE)]))?;
    // As the agent writes them: the node's ephemeral ports cut out of the SNAT ports, its address the SNAT
    // source.
    let mut config = lb_common::NatConfig { snat_v4: addr::words(IpAddr::V4(NODE))[0], ..Default::default() };
    if let Some((lo, hi)) = lab.node.netns.run(|| Ok(tierlb::datapath::tc::ephemeral_ports()))? {
        (config.ephemeral_min, config.ephemeral_max) = (lo, hi);
    }
    ns_maps.set_config(config)?;
    attach_in(&lab.node.netns, &mut programs)?;
    let mut rec = Reconciler::new(maps);
    let rep = rec.apply(&desired(), Instant::now());
    anyhow::ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));

    let loads = Loads::prepare(&lab, &size)?;
    let tierlb_tables = || {
        let s = ns_maps.conntrack_stats(tierlb::datapath::marks::boottime_ns());
        let names = ["established TCP", "half-open TCP", "UDP"];
        let tables: Vec<String> = s
            .tables
            .iter()
            .zip(names)
            .map(|(t, n)| format!("{n} {} of {} entries", t.entries, t.capacity))
            .collect();
        format!("tierlb's tables: {}", tables.join(", "))
    };
    let mut out = Snat {
        rounds: size.rounds,
        seconds: size.secs,
        rows: Vec::new(),
        rates: Vec::new(),
        loads: Vec::new(),
    };
    out.loads.push(loads.run(&lab, DataPath::Tierlb, &tierlb_tables)?);

    let mut api = RealApiServer::start_with(docs(), IpAddr::V4(NODE), None)?;
    api.link(&lab.node.netns)?;
    // Direct to tierlb's sink: its tuples are the client's, which neither translation takes.
    let direct_to = Port::RemoteSink.endpoint(DataPath::Tierlb);
    let (mut direct, mut tierlb) = (Vec::new(), Vec::new());
    let mut proxied = Vec::new();
    for (mode, path) in
        [(Mode::Nftables, DataPath::KubeProxyNftables), (Mode::Iptables, DataPath::KubeProxyIptables)]
    {
        let mut proxy = api.kube_proxy(&lab.node.netns, mode, FIRST_SYNC_LIMIT)?;
        let (d, t, k) = rounds(
            &loader,
            size.rounds,
            [direct_to, Port::RemoteSink.at(DataPath::Tierlb), Port::RemoteSink.at(path)],
        )?;
        direct.extend(d.iter().cloned());
        tierlb.extend(t);
        proxied.push((path, k, d));
        let paths = [DataPath::Tierlb, path].map(|p| (p, Port::RemoteEcho.at(p)));
        out.rates.extend(max_rates(&lab.ext, &paths, Port::RemoteEcho.pod(), &size, path));
        if mode == Mode::Iptables {
            let nf = || {
                format!("nf_conntrack {} entries", super::conntrack::nf_conntrack_count(&lab).unwrap_or(0))
            };
            out.loads.push(loads.run(&lab, path, &nf)?);
        }
        proxy.stop(Duration::from_secs(10));
        cleanup(&lab.node.netns)?;
    }
    let connect = LoadMode::Connect;
    out.rows.push(NsRow::of(DataPath::Direct, 1, connect, &direct, &direct, None));
    out.rows.push(NsRow::of(DataPath::Tierlb, 1, connect, &tierlb, &direct, None));
    for (path, k, d) in proxied {
        out.rows.push(NsRow::of(path, 1, connect, &k, &d, None));
    }
    for row in &out.rows {
        super::north_south::progress(row);
    }
    drop(programs);
    Ok(out)
}

/// Only this section (`bench --snat`): its figures printed as measured, then as BENCHMARKS.md renders them.
pub fn snat_only(lab_bin: &std::path::Path, quick: bool) -> anyhow::Result<()> {
    let snat = measure(lab_bin, quick)?;
    print!("{}", super::report::snat_section(&snat));
    Ok(())
}

/// `rounds` rounds of one connect run to each of `to` (direct, tierlb, kube-proxy), the order reversed every
/// other round (A B C, C B A, ...), so a drift of the machine lands on every side of a ratio.
fn rounds(
    loader: &Loader,
    rounds: usize,
    to: [SocketAddr; 3],
) -> anyhow::Result<(Vec<LoadResult>, Vec<LoadResult>, Vec<LoadResult>)> {
    let mut runs: [Vec<LoadResult>; 3] = Default::default();
    for r in 0..rounds {
        let order: [usize; 3] = if r % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for i in order {
            runs[i].push(loader.run(None, to[i], LoadMode::Connect)?);
        }
    }
    let [d, t, k] = runs;
    Ok((d, t, k))
}

/// Issue 63's three loads, sized, with the client's addresses for them in place.
struct Loads {
    new_flows: NewFlows,
    syn_flood: SynFlood,
    udp_flood: UdpFlood,
}

impl Loads {
    fn prepare(lab: &Lab, size: &Sizes) -> anyhow::Result<Self> {
        // The flooder is an address of its own: the SYN-ACKs the client's rule drops are only its, not those
        // of the connect rows' client.
        let syn_flood = SynFlood {
            flood: 6_000,
            flooder: IpAddr::from([192, 0, 2, 120]),
            other: IpAddr::from([192, 0, 2, 101]),
            asks: 50,
        };
        add_address(&lab.ext, "uplink", syn_flood.flooder)?;
        syn_flood.prepare(&lab.ext, "uplink")?;
        let udp_flood = UdpFlood { flows: size.udp_flows, ..UdpFlood::issue() };
        udp_flood.prepare(&lab.ext, "uplink")?;
        Ok(Self { new_flows: size.new_flows, syn_flood, udp_flood })
    }

    /// The three loads against `path`'s node ports; `tracking` reads the node's connection tracking.
    fn run(&self, lab: &Lab, path: DataPath, tracking: &dyn Fn() -> String) -> anyhow::Result<LoadsRow> {
        let remote = Port::RemoteEcho;
        let new_flows = self.new_flows.run(&lab.ext, remote.at(path), remote.pod());
        eprintln!("bench: SNAT load {:<19} {new_flows}", path.as_str());
        let warm = self.syn_flood.warm(&lab.ext, remote.at(path));
        anyhow::ensure!(
            warm.as_deref() == Ok(remote.pod()),
            "{} before the SYN flood: {warm:?}",
            path.as_str()
        );
        let (syn_flood, ()) = self.syn_flood.run(&lab.ext, remote.at(path), remote.pod(), || ());
        eprintln!("bench: SYN flood {:<19} {syn_flood}", path.as_str());
        let to = (Port::LocalEcho.at(path), Port::LocalEchoUdp.at(path));
        let (udp_flood, [_, after]) = self
            .udp_flood
            .run(&lab.ext, to, Port::LocalEcho.pod(), tracking)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.as_str()))?;
        eprintln!("bench: UDP flood {:<19} {udp_flood}; {after}", path.as_str());
        Ok(LoadsRow { path, new_flows, syn_flood, udp_flood, tracking_after_udp: after })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each node port leads where the section says, tierlb's and kube-proxy's apart, and kube-proxy's
    /// Services carry them with the right protocol and node.
    #[test]
    fn the_node_ports_are_apart_and_the_services_match_them() {
        let ports: std::collections::BTreeSet<u16> = Port::ALL
            .into_iter()
            .flat_map(|p| [p.of(DataPath::Tierlb), p.of(DataPath::KubeProxyNftables)])
            .collect();
        assert_eq!(ports.len(), 8);
        let docs = docs();
        // A Service and its slice per port, in `Port::ALL`'s order.
        assert_eq!(docs[2]["spec"]["ports"][0]["nodePort"], 32_001);
        assert_eq!(docs[3]["endpoints"][0]["nodeName"], "node-2");
        assert_eq!(docs[5]["endpoints"][0]["addresses"][0], POD.to_string());
        assert_eq!(docs[6]["spec"]["ports"][0]["protocol"], "UDP");
        assert_eq!(desired().len(), 4);
        for p in Port::ALL {
            assert_ne!(p.endpoint(DataPath::Tierlb), p.endpoint(DataPath::KubeProxyNftables));
        }
    }
}
