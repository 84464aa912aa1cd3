//! The plan for the external frontends of a Service port: its external destinations (kube-proxy's word: NodePorts, load-balancer ingress IPs and
//! externalIPs) for the connects made on this node, which are the only ones a socket-level balancer sees.
//!
//! kube-proxy 1.35 sends every external destination to the Service's EXT chain (`syncProxyRules` in
//! pkg/proxy/iptables/proxier.go and pkg/proxy/nftables/proxier.go). Under externalTrafficPolicy Cluster that
//! chain goes to the cluster-policy chain for everyone. Under Local it first short-circuits two kinds of
//! traffic to the cluster-policy chain ("pod traffic for ... external destinations" /
//! "short-circuit pod traffic", matched by the local-traffic detector; "route LOCAL traffic for ... external
//! destinations" / "short-circuit local traffic", `--src-type LOCAL` / `fib saddr type local`: the node's own
//! processes), and only what is left, traffic from outside the node, goes to the Local-policy chain. The
//! comment there: pod traffic "is subject to neither form of traffic policy, which simulates going up-and-out
//! to an external load-balancer and coming back in". So connects made on the node, from pods and from the
//! host alike, get kube-proxy's cluster set (`clusterEndpoints` of `CategorizeEndpoints`, topology applied)
//! whatever the two policies say; the internal policy does not apply to external destinations.
//!
//! One kube-proxy configuration differs: with no local-traffic detector (`--detect-local-mode ClusterCIDR`
//! without `--cluster-cidr`), pod traffic is not short-circuited and falls through to the external policy's
//! set. tierlb follows the configured cluster (a detector is what every installer sets up) and documents it.
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use super::{PortEndpoint, TopologyDecision, TrafficPlan, traffic};
use crate::model::{Family, NodeInfo, Policy, Service, ServicePort, node_addresses::Cidr};

/// Which kind of external destination a frontend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExternalKind {
    /// A node address and the port's `nodePort`.
    NodePort,
    /// A `status.loadBalancer.ingress[].ip` and the port.
    LoadBalancer,
    /// A `spec.externalIPs` entry and the port.
    ExternalIp,
}

impl ExternalKind {
    /// How `explain` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodePort => "node port",
            Self::LoadBalancer => "load-balancer IP",
            Self::ExternalIp => "external IP",
        }
    }
}

/// One external destination tierlb translates on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExternalFrontend {
    /// Its kind.
    pub kind: ExternalKind,
    /// The address and port a client connects to.
    pub addr: SocketAddr,
    /// A load-balancer IP's `loadBalancerSourceRanges` of this family (`source_ranges`): the clients from
    /// outside the node it accepts; empty: every client.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<Cidr>,
}

/// The source ranges a load-balancer IP of `family` accepts: the Service's of that family (kube-proxy
/// filters them by family; none of the family means no limit for it). Node ports and externalIPs are not
/// limited, as kube-proxy's KUBE-FW chain applies to load-balancer IPs only.
pub fn source_ranges(svc: &Service, family: Family) -> Vec<Cidr> {
    svc.load_balancer_source_ranges.iter().filter(|c| Family::of(&c.ip) == family).copied().collect()
}

/// Why an address of the Service is not translated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum NotTranslatedReason {
    /// `ipMode: Proxy`: the load balancer proxies to the nodes, so traffic to the address must reach it
    /// (kube-proxy's `IsVIPMode` skips it too).
    IpModeProxy,
    /// The externalIP is outside `--external-ip-cidrs`.
    OutsideExternalIpCidrs {
        /// The allowed CIDRs.
        cidrs: Vec<Cidr>,
    },
    /// An address no Service may take: a socket-level frontend there would capture every pod's connects to
    /// its own loopback (sidecars), the metadata service, or a wildcard.
    Special {
        /// Which kind of address.
        class: SpecialAddress,
    },
    /// One of this node's own addresses: connects to the node's own services (kubelet, sshd) would be
    /// captured.
    NodeAddress,
    /// The API server's address, which the agent itself connects to: a frontend there would cut the agent
    /// off the fix.
    ApiServer {
        /// The API server's address.
        addr: SocketAddr,
    },
}

/// Addresses that are never a Service's (the API server refuses them as externalIPs; ingress IPs are only
/// checked for syntax, so a Service's status could say any of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialAddress {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 0.0.0.0, ::.
    Unspecified,
    /// 169.254.0.0/16 (the metadata service), fe80::/10.
    LinkLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
}

impl SpecialAddress {
    /// What `ip` is, if it is one of these (an IPv4-mapped IPv6 address as its IPv4 address).
    pub fn of(ip: IpAddr) -> Option<Self> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        match ip {
            _ if ip.is_loopback() => Some(Self::Loopback),
            _ if ip.is_unspecified() => Some(Self::Unspecified),
            _ if ip.is_multicast() => Some(Self::Multicast),
            IpAddr::V4(v4) if v4.is_link_local() => Some(Self::LinkLocal),
            IpAddr::V4(v4) if v4.is_broadcast() => Some(Self::Broadcast),
            IpAddr::V6(v6) if v6.is_unicast_link_local() => Some(Self::LinkLocal),
            _ => None,
        }
    }

    /// In words.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loopback => "a loopback address (every pod's own loopback would be captured)",
            Self::Unspecified => "the unspecified address",
            Self::LinkLocal => "a link-local address (the metadata service lives there)",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
        }
    }
}

/// An address of the Service that tierlb leaves alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotTranslated {
    /// Its kind.
    pub kind: ExternalKind,
    /// The address.
    pub ip: IpAddr,
    /// Why.
    #[serde(flatten)]
    pub reason: NotTranslatedReason,
}

impl NotTranslated {
    /// The reason in words, for `explain`.
    pub fn text(&self) -> String {
        match &self.reason {
            NotTranslatedReason::IpModeProxy => {
                "ipMode Proxy: the load balancer proxies to the nodes, so connects must reach it (kube-proxy skips it too)"
                    .to_owned()
            }
            NotTranslatedReason::OutsideExternalIpCidrs { cidrs } => {
                let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
                format!("outside --external-ip-cidrs ({})", list.join(", "))
            }
            NotTranslatedReason::Special { class } => format!("{}: never a Service's", class.as_str()),
            NotTranslatedReason::NodeAddress => {
                "one of this node's own addresses: connects to the node's own services would be captured".to_owned()
            }
            NotTranslatedReason::ApiServer { addr } => {
                format!("{addr} is the API server's address, which the agent connects to: never captured")
            }
        }
    }
}

/// Node port, load-balancer and external-IP traffic of one port in one family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExternalPlan {
    /// The destinations translated on this node.
    pub frontends: Vec<ExternalFrontend>,
    /// The Service's addresses in this family that are not, and why.
    pub not_translated: Vec<NotTranslated>,
    /// Connects from pods on this node: kube-proxy's "short-circuit pod traffic", the cluster set.
    pub from_pods: TrafficPlan,
    /// Connects from the node's own processes (host network namespace): kube-proxy's "short-circuit local
    /// traffic", the cluster set. The same as `from_pods`, so the data path needs no way to tell them apart.
    pub from_node: TrafficPlan,
    /// Traffic arriving from outside the node, under externalTrafficPolicy: what the tc programs translate it
    /// to (the outside-scope frontends, see `lb_common::nat`), and the health check node port's count.
    pub from_outside: TrafficPlan,
}

/// The external plan of `port` in `family`, `None` when kube-proxy's `ExternallyAccessible` is false.
pub(super) fn plan(
    svc: &Service,
    port: &ServicePort,
    family: Family,
    node: &NodeInfo,
    endpoints: &[PortEndpoint],
    topology: &TopologyDecision,
    has_any: bool,
) -> Option<ExternalPlan> {
    if !svc.externally_reachable(port, family) {
        return None;
    }
    let of_family = |ip: &&IpAddr| Family::of(ip) == family;
    let mut frontends: Vec<ExternalFrontend> = Vec::new();
    let mut not_translated = Vec::new();
    let ranges = source_ranges(svc, family);
    let mut add = |kind, ip: IpAddr, number: u16| {
        let addr = SocketAddr::new(ip, number);
        // Node ports are on the node's addresses by design (loopback already left out); the other kinds
        // are whatever a Service's author or its load balancer wrote.
        let refused = match SpecialAddress::of(ip) {
            _ if node.protected.contains(&addr) => Some(NotTranslatedReason::ApiServer { addr }),
            _ if kind == ExternalKind::NodePort => None,
            Some(class) => Some(NotTranslatedReason::Special { class }),
            None if node.own_addresses.contains(&ip) => Some(NotTranslatedReason::NodeAddress),
            None => None,
        };
        if let Some(reason) = refused {
            if !not_translated.iter().any(|t: &NotTranslated| t.ip == ip && t.reason == reason) {
                not_translated.push(NotTranslated { kind, ip, reason });
            }
        } else if !frontends.iter().any(|f| f.addr == addr) {
            // One address may be listed twice (an externalIP that is also the ingress IP): the first kind wins.
            let source_ranges = if kind == ExternalKind::LoadBalancer { ranges.clone() } else { Vec::new() };
            frontends.push(ExternalFrontend { kind, addr, source_ranges });
        }
    };
    if let Some(np) = port.node_port {
        for ip in node.node_port_addresses.iter().filter(of_family) {
            add(ExternalKind::NodePort, *ip, np);
        }
    }
    for ip in svc.load_balancer_ips.iter().filter(of_family) {
        add(ExternalKind::LoadBalancer, *ip, port.port);
    }
    let mut outside = Vec::new();
    for ip in svc.external_ips.iter().filter(of_family) {
        match &node.external_ip_cidrs {
            Some(cidrs) if !cidrs.iter().any(|c| c.contains(ip)) => outside.push(NotTranslated {
                kind: ExternalKind::ExternalIp,
                ip: *ip,
                reason: NotTranslatedReason::OutsideExternalIpCidrs { cidrs: cidrs.clone() },
            }),
            _ => add(ExternalKind::ExternalIp, *ip, port.port),
        }
    }
    not_translated.extend(outside);
    for ip in svc.load_balancer_proxy_ips.iter().filter(of_family) {
        not_translated.push(NotTranslated {
            kind: ExternalKind::LoadBalancer,
            ip: *ip,
            reason: NotTranslatedReason::IpModeProxy,
        });
    }
    let on_node = traffic(Policy::Cluster, endpoints, node, topology, has_any);
    Some(ExternalPlan {
        frontends,
        not_translated,
        from_pods: on_node.clone(),
        from_node: on_node,
        from_outside: traffic(svc.external_policy, endpoints, node, topology, has_any),
    })
}
