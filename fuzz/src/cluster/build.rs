//! What a `Cluster` stands for: the model, the agent's external-address flags, the map capacities, and the
//! node as the oracle sees it.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tierlb::model::{
    AddressType, Conditions, Endpoint, EndpointSlice, Hints, Model, Name, NameList, Node, NodeAddress,
    NodeAddressKind, ObjKey, Policy, Protocol, Service, ServicePort, ServiceType, SlicePort, intern,
    intern_list,
    node_addresses::{Cidr, ExternalConfig, NodePortAddresses},
};

use super::{Cluster, GenAddr, NODES, NodeView, PORT_NAMES, ZONES, pick};

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

const fn v6(group: u16, last: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, group, 0, 0, 0, 0, last))
}

/// Node n1's candidate addresses: documentation ranges, and a loopback address (which never carries node
/// ports).
const NODE_ADDRESSES: [IpAddr; 6] =
    [v4(192, 0, 2, 1), v6(1, 1), v4(192, 0, 2, 2), v6(1, 2), v4(192, 0, 2, 3), v4(127, 0, 0, 1)];

/// `--external-ip-cidrs` candidates. Service `i`'s externalIPs are 198.51.100.(40 i + n) and
/// 2001:db8:3::(256 i + n), n < 12: some of these hold all of them, some part of one Service's, some none.
const EXTERNAL_IP_CIDRS: [(IpAddr, u8); 6] = [
    (v4(198, 51, 100, 0), 24),
    (v4(198, 51, 100, 0), 25),
    (v6(3, 0), 120),
    (v6(3, 0x100), 120),
    (v4(10, 0, 0, 0), 8),
    (v4(0, 0, 0, 0), 0),
];

/// `loadBalancerSourceRanges` candidates (what the maps show of them is their family).
const SOURCE_RANGES: [(IpAddr, u8); 3] = [(v4(192, 0, 2, 0), 24), (v6(0, 0), 32), (v4(0, 0, 0, 0), 0)];

/// Node ports: Service `i`'s port `j` has 30000 + 3 i + j, so no two Services share one.
const NODE_PORT_BASE: u16 = 30_000;

fn proto(udp: bool) -> Protocol {
    if udp { Protocol::Udp } else { Protocol::Tcp }
}

fn names(pool: &[&str], v: Option<&Vec<u8>>) -> Option<NameList> {
    v.map(|v| {
        let mut out: Vec<Name> = Vec::new();
        for i in v.iter().take(8) {
            let n = intern(pick(pool, *i));
            if !out.contains(&n) {
                out.push(n);
            }
        }
        intern_list(out)
    })
}

/// The address `a` stands for as Service `i`'s ingress IP (`group` 2) or externalIP (`group` 3): its own
/// (203.0.113.x or 198.51.100.x, 2001:db8:2:: or 2001:db8:3::), or one of `node`'s addresses (`None` when
/// the node has none of the family), or one no Service may take.
fn service_addr(a: &GenAddr, i: u8, group: u16, node: &[IpAddr]) -> Option<IpAddr> {
    let n = a.pick % 16;
    Some(match (n, a.v6) {
        (0..12, false) if group == 2 => v4(203, 0, 113, 40 * i + n),
        (0..12, false) => v4(198, 51, 100, 40 * i + n),
        (0..12, true) => v6(group, u16::from(i) << 8 | u16::from(n)),
        (12, _) => {
            let own: Vec<&IpAddr> = node.iter().filter(|ip| ip.is_ipv6() == a.v6).collect();
            **own.get(usize::from(a.pick / 16) % own.len().max(1))?
        }
        (13, false) => v4(127, 0, 0, 1),
        (13, true) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        (14, false) => v4(169, 254, 169, 254),
        (14, true) => IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        (_, false) => v4(0, 0, 0, 0),
        (_, true) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    })
}

impl Cluster {
    /// The zone of the planned node as the agent resolves it.
    pub fn zone(&self) -> Option<String> {
        self.zone_flag.or(self.node_zone).map(|z| pick(&ZONES, z).to_owned())
    }

    /// Node n1's addresses, in order, each once: (is an `ExternalIP`, address).
    fn node_addresses(&self) -> Vec<(bool, IpAddr)> {
        let mut out: Vec<(bool, IpAddr)> = Vec::new();
        for (external, i) in self.node_addresses.iter().take(4) {
            let ip = NODE_ADDRESSES[usize::from(*i) % NODE_ADDRESSES.len()];
            if out.iter().all(|(_, o)| *o != ip) {
                out.push((*external, ip));
            }
        }
        out
    }

    fn external_ip_cidrs(&self) -> Option<Vec<(IpAddr, u8)>> {
        let pool = &EXTERNAL_IP_CIDRS;
        self.flags
            .external_ip_cidrs
            .as_ref()
            .map(|v| v.iter().take(3).map(|i| pool[usize::from(*i) % pool.len()]).collect())
    }

    /// The API server's address: one of the node's, on a port that may be a node port.
    fn api_server(&self) -> Option<SocketAddr> {
        let (a, port) = self.flags.api_server?;
        let addrs = self.node_addresses();
        let (_, ip) = addrs.get(usize::from(a) % addrs.len().max(1))?;
        Some(SocketAddr::new(*ip, NODE_PORT_BASE + u16::from(port % 20)))
    }

    /// The agent's `--nodeport-addresses` (unset or `primary`: interface CIDRs would read this host's
    /// interfaces), `--external-ip-cidrs` and API server address.
    pub fn external_config(&self) -> ExternalConfig {
        ExternalConfig {
            node_port_addresses: if self.flags.primary {
                NodePortAddresses::Primary
            } else {
                NodePortAddresses::NodeObject
            },
            external_ip_cidrs: self
                .external_ip_cidrs()
                .map(|v| v.into_iter().map(|(ip, len)| Cidr { ip, len }).collect()),
            protected: self.api_server().into_iter().collect(),
        }
    }

    /// The capacities of the frontend map and of the slot map when the input asks for small ones (at most
    /// 64 entries each: a few Services' worth), else `None`.
    pub fn capacity(&self) -> Option<(u32, u32)> {
        self.capacity.map(|(f, s)| (1 + u32::from(f) % 64, 1 + u32::from(s) % 64))
    }

    /// The planned node as the oracle reads it.
    pub fn node_view(&self) -> NodeView {
        NodeView::new(
            NODES[0],
            self.zone(),
            &self.node_addresses(),
            self.flags.primary,
            self.external_ip_cidrs(),
            self.api_server(),
        )
    }

    /// The model: Node n1 and Services `s0..`, each with its own VIPs, node ports and external addresses, and
    /// their slices.
    pub fn model(&self) -> Model {
        let mut m = Model::default();
        let node_addresses = self.node_addresses();
        m.nodes.insert(
            NODES[0].into(),
            Node {
                name: NODES[0].into(),
                zone: self.node_zone.map(|z| pick(&ZONES, z).to_owned()),
                allocatable_cpu_millis: Some(4000),
                addresses: node_addresses
                    .iter()
                    .map(|(external, ip)| NodeAddress {
                        kind: if *external {
                            NodeAddressKind::ExternalIP
                        } else {
                            NodeAddressKind::InternalIP
                        },
                        ip: *ip,
                    })
                    .collect(),
                ..Node::default()
            },
        );
        let node_ips: Vec<IpAddr> = node_addresses.iter().map(|(_, ip)| *ip).collect();
        for (i, s) in self.services.iter().take(6).enumerate() {
            let key = ObjKey::new("ns", format!("s{i}"));
            let n = u8::try_from(i).expect("at most 6");
            let mut cluster_ips = Vec::new();
            if s.v4 || !s.v6 {
                cluster_ips.push(IpAddr::V4(Ipv4Addr::new(10, 96, 0, n + 1)));
            }
            if s.v6 {
                cluster_ips.push(IpAddr::V6(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, u16::from(n) + 1)));
            }
            let type_ = match s.kind % 3 {
                0 => ServiceType::ClusterIP,
                1 => ServiceType::NodePort,
                _ => ServiceType::LoadBalancer,
            };
            let load_balancer = type_ == ServiceType::LoadBalancer;
            // Distinct (port, protocol) and names, named when there are several: as validation requires.
            let mut ports: Vec<ServicePort> = Vec::new();
            for (j, p) in s.ports.iter().take(3).enumerate() {
                let j = u16::try_from(j).expect("at most 3");
                let p = ServicePort {
                    name: if s.ports.len() > 1 {
                        PORT_NAMES[usize::from(j)].to_owned() + "p"
                    } else {
                        String::new()
                    },
                    port: p.port.max(1),
                    protocol: proto(p.udp),
                    node_port: (type_ != ServiceType::ClusterIP && p.node_port)
                        .then_some(NODE_PORT_BASE + 3 * u16::from(n) + j),
                };
                if !ports.iter().any(|q| (q.port, q.protocol) == (p.port, p.protocol)) {
                    ports.push(p);
                }
            }
            let ingress: Vec<(IpAddr, bool)> = if load_balancer {
                s.ingress
                    .iter()
                    .take(3)
                    .filter_map(|(a, proxy)| Some((service_addr(a, n, 2, &node_ips)?, *proxy)))
                    .collect()
            } else {
                Vec::new()
            };
            let external_ips: Vec<IpAddr> =
                s.external_ips.iter().take(3).filter_map(|a| service_addr(a, n, 3, &node_ips)).collect();
            // `ExternallyAccessible`: externalTrafficPolicy may only be set then.
            let reachable = type_ != ServiceType::ClusterIP || !external_ips.is_empty();
            let external_policy = if s.external_local && reachable { Policy::Local } else { Policy::Cluster };
            let source_ranges: Vec<Cidr> = if load_balancer {
                s.source_ranges
                    .iter()
                    .take(3)
                    .map(|r| {
                        let (ip, len) = SOURCE_RANGES[usize::from(*r) % SOURCE_RANGES.len()];
                        Cidr { ip, len }
                    })
                    .collect()
            } else {
                Vec::new()
            };
            // Judged over the slices and endpoints kept below (the first 3, 8 each): judged over all of them, a
            // PreferSameNode Service whose hinted slices were dropped reached the agent without hints, the agent
            // filled the controller's and this oracle, which leaves hint filling out, expected none (found by an
            // optimised 240 s run: `tiers of [fd00:96::3]:1053/Tcp`).
            let hinted = s
                .slices
                .iter()
                .take(3)
                .flat_map(|x| x.endpoints.iter().take(8))
                .any(|e| e.for_nodes.is_some() || e.for_zones.is_some());
            // Without any hint the agent would write the controller's: kept out, that is `hints`' own test.
            let traffic_distribution = (hinted && s.distribution % 3 == 1).then(|| "PreferSameNode".into());
            m.services.insert(
                key.clone(),
                Service {
                    key: key.clone(),
                    type_,
                    cluster_ips: cluster_ips.into(),
                    ports: ports.clone().into(),
                    internal_policy: if s.local { Policy::Local } else { Policy::Cluster },
                    external_policy,
                    external_ips: external_ips.into(),
                    load_balancer_ips: ingress
                        .iter()
                        .filter(|(_, proxy)| !proxy)
                        .map(|(ip, _)| *ip)
                        .collect(),
                    load_balancer_proxy_ips: ingress
                        .iter()
                        .filter(|(_, proxy)| *proxy)
                        .map(|(ip, _)| *ip)
                        .collect(),
                    load_balancer_source_ranges: source_ranges.into(),
                    health_check_node_port: (load_balancer && external_policy == Policy::Local)
                        .then_some(32_000 + u16::from(n)),
                    traffic_distribution,
                    session_affinity_timeout: s.affinity.map(|t| 1 + t % 86_400),
                    ..Service::default()
                }
                .into(),
            );
            for (k, sl) in s.slices.iter().take(3).enumerate() {
                let mut sports: Vec<SlicePort> = Vec::new();
                for (name, port, udp) in sl.ports.iter().take(3) {
                    let name = match ports.len() {
                        0 | 1 => String::new(),
                        _ => PORT_NAMES[usize::from(*name) % 3].to_owned() + "p",
                    };
                    if !sports.iter().any(|p| p.name == name) {
                        sports.push(SlicePort { name, port: (*port).max(1), protocol: proto(*udp) });
                    }
                }
                let endpoints = sl
                    .endpoints
                    .iter()
                    .take(8)
                    .map(|e| Endpoint {
                        address: Some(if sl.v6 {
                            IpAddr::V6(Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(e.host % 6) + 1))
                        } else {
                            IpAddr::V4(Ipv4Addr::new(10, 244, 0, e.host % 6 + 1))
                        }),
                        conditions: Conditions {
                            ready: e.ready,
                            serving: e.serving,
                            terminating: e.terminating,
                        },
                        node_name: e.node.map(|x| intern(pick(&NODES, x))),
                        zone: e.zone.map(|x| intern(pick(&ZONES, x))),
                        hints: Hints::new(
                            names(&NODES, e.for_nodes.as_ref()),
                            names(&ZONES, e.for_zones.as_ref()),
                        ),
                    })
                    .collect();
                let skey = ObjKey::new("ns", format!("s{i}-{k}"));
                m.slices.insert(
                    skey.clone(),
                    EndpointSlice {
                        key: skey,
                        service_name: Some(key.name.clone()),
                        address_type: if sl.v6 { AddressType::IPv6 } else { AddressType::IPv4 },
                        ports: sports.into(),
                        endpoints,
                        not_proxied: None,
                        last_change_trigger_time: None,
                    },
                );
            }
        }
        m
    }
}
