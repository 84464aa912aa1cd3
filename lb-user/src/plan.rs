//! Pure semantics: which endpoints each Service port uses on one node, tier by tier.
//!
//! Mirrors kube-proxy's `CategorizeEndpoints` and `topologyModeFromHints` (pkg/proxy/topology.go, Kubernetes
//! 1.35). kube-proxy computes one set; tierlb computes the same set as the first non-empty tier and adds the
//! tiers behind it (zone, then cluster) so the data path can fall back at once when a backend is marked down,
//! before the control plane has caught up. With every backend up, the data path uses exactly kube-proxy's set.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;

use crate::model::{
    AddressType, Endpoint, EndpointSlice, Family, Model, NodeInfo, ObjKey, Policy, Protocol, Service,
    ServicePort,
};

/// Which topology filter kube-proxy applies to a Service port on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    Node,
    Zone,
    None,
}

/// The tier the data path uses while every backend is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectedTier {
    Node,
    Zone,
    Cluster,
    /// A Local traffic policy's local set.
    Local,
    None,
}

/// What kube-proxy does with traffic that has no endpoint to go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenEmpty {
    /// No usable endpoint anywhere: ICMP reject, the client gets ECONNREFUSED.
    Reject,
    /// Endpoints exist but none is local under a Local policy: packets dropped, the client hangs.
    Drop,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tiers {
    pub node: Vec<SocketAddr>,
    pub zone: Vec<SocketAddr>,
    pub cluster: Vec<SocketAddr>,
}

impl Tiers {
    pub fn as_array(&self) -> [&[SocketAddr]; 3] {
        [&self.node, &self.zone, &self.cluster]
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrafficPlan {
    pub policy: Policy,
    pub tiers: Tiers,
    pub selected_tier: SelectedTier,
    /// What the data path uses now (kube-proxy's cluster set, or its local set under a Local policy).
    pub endpoints: Vec<SocketAddr>,
    pub when_empty: Option<WhenEmpty>,
}

/// One Service port in one IP family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortPlan {
    pub service: String,
    #[serde(skip)]
    pub key: ObjKey,
    pub port_name: String,
    pub port: u16,
    pub protocol: Protocol,
    pub family: Family,
    pub cluster_ips: Vec<IpAddr>,
    pub has_any_endpoints: bool,
    pub topology_mode: TopologyMode,
    pub internal: TrafficPlan,
    pub external: Option<TrafficPlan>,
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub node: String,
    pub zone: Option<String>,
    pub services: Vec<PortPlan>,
}

/// One endpoint of a Service port after merging slices: its address and what kube-proxy knows of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortEndpoint {
    pub addr: SocketAddr,
    pub endpoint: Endpoint,
    pub local: bool,
}

/// The endpoints of one Service port in one family, merged across slices the way kube-proxy's
/// EndpointSliceCache does: the slice port is found by name and protocol (so named target ports resolve per
/// slice), only `addresses[0]` counts, and a duplicate `ip:port` keeps its local copy.
pub fn port_endpoints(
    model: &Model,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    node: &str,
) -> Vec<PortEndpoint> {
    port_endpoints_in(model.slices_of(&svc.key), port, family, node)
}

/// `port_endpoints` over given slices (the Service's, possibly with the controller's hints filled in).
pub fn port_endpoints_in<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port: &ServicePort,
    family: Family,
    node: &str,
) -> Vec<PortEndpoint> {
    let mut merged: BTreeMap<SocketAddr, PortEndpoint> = BTreeMap::new();
    for slice in slices {
        let slice_family = match slice.address_type {
            AddressType::IPv4 => Family::V4,
            AddressType::IPv6 => Family::V6,
            AddressType::Fqdn => continue,
        };
        if slice_family != family {
            continue;
        }
        let Some(sp) = slice.ports.iter().find(|p| p.name == port.name && p.protocol == port.protocol) else {
            continue;
        };
        for ep in &slice.endpoints {
            let Some(ip) = ep.address else { continue };
            let addr = SocketAddr::new(ip, sp.port);
            let local = ep.node_name.as_deref() == Some(node);
            let candidate = PortEndpoint { addr, endpoint: ep.clone(), local };
            match merged.get(&addr) {
                Some(existing) if existing.local || !local => {}
                _ => {
                    merged.insert(addr, candidate);
                }
            }
        }
    }
    merged.into_values().collect()
}

/// kube-proxy's `topologyModeFromHints`, judged on ready endpoints only.
pub fn topology_mode(endpoints: &[PortEndpoint], node: &NodeInfo) -> TopologyMode {
    let ready: Vec<&Endpoint> =
        endpoints.iter().filter(|e| e.endpoint.is_ready()).map(|e| &e.endpoint).collect();
    let all_node_hints = ready.iter().all(|e| !e.node_hints().is_empty());
    let for_node = ready.iter().any(|e| e.node_hints().contains(&node.name));
    if all_node_hints && for_node {
        return TopologyMode::Node;
    }
    let zone = node.zone.as_deref().filter(|z| !z.is_empty());
    let all_zone_hints = ready.iter().all(|e| !e.zone_hints().is_empty());
    let for_zone = zone.is_some_and(|z| ready.iter().any(|e| e.zone_hints().iter().any(|h| h == z)));
    if all_zone_hints && for_zone {
        return TopologyMode::Zone;
    }
    TopologyMode::None
}

fn addrs<'a>(eps: impl Iterator<Item = &'a PortEndpoint>) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = eps.map(|e| e.addr).collect();
    v.sort();
    v
}

/// Tiers for a Cluster traffic policy. The first non-empty tier is kube-proxy's cluster set.
pub fn cluster_tiers(endpoints: &[PortEndpoint], node: &NodeInfo) -> Tiers {
    let zone = node.zone.as_deref().filter(|z| !z.is_empty());
    let ready = || endpoints.iter().filter(|e| e.endpoint.is_ready());
    let node_tier = if topology_mode(endpoints, node) == TopologyMode::Node {
        addrs(ready().filter(|e| e.endpoint.node_hints().contains(&node.name)))
    } else {
        Vec::new()
    };
    // The zone tier exists whenever zone filtering would be allowed on this node, also when node filtering is
    // what kube-proxy uses: it is the data path's first fallback.
    let zone_mode_allowed = {
        let all = ready().all(|e| !e.endpoint.zone_hints().is_empty());
        let any = zone.is_some_and(|z| ready().any(|e| e.endpoint.zone_hints().iter().any(|h| h == z)));
        all && any
    };
    let zone_tier = match zone {
        Some(z) if zone_mode_allowed => {
            addrs(ready().filter(|e| e.endpoint.zone_hints().iter().any(|h| h == z)))
        }
        _ => Vec::new(),
    };
    let mut cluster = addrs(ready());
    if cluster.is_empty() {
        // No ready endpoint anywhere: serving and terminating ones, topology ignored.
        cluster = addrs(endpoints.iter().filter(|e| e.endpoint.is_serving() && e.endpoint.is_terminating()));
    }
    Tiers { node: node_tier, zone: zone_tier, cluster }
}

/// kube-proxy's local set: local ready endpoints, else local serving+terminating ones. No topology.
pub fn local_set(endpoints: &[PortEndpoint]) -> Vec<SocketAddr> {
    let ready = addrs(endpoints.iter().filter(|e| e.local && e.endpoint.is_ready()));
    if !ready.is_empty() {
        return ready;
    }
    addrs(endpoints.iter().filter(|e| e.local && e.endpoint.is_serving() && e.endpoint.is_terminating()))
}

/// Any endpoint kube-proxy could use at all (`hasAnyEndpoints`).
pub fn has_any_endpoints(endpoints: &[PortEndpoint]) -> bool {
    endpoints
        .iter()
        .any(|e| e.endpoint.is_ready() || (e.endpoint.is_serving() && e.endpoint.is_terminating()))
}

fn traffic(policy: Policy, endpoints: &[PortEndpoint], node: &NodeInfo, has_any: bool) -> TrafficPlan {
    match policy {
        Policy::Local => {
            let local = local_set(endpoints);
            let when_empty =
                local.is_empty().then_some(if has_any { WhenEmpty::Drop } else { WhenEmpty::Reject });
            TrafficPlan {
                policy,
                selected_tier: if local.is_empty() { SelectedTier::None } else { SelectedTier::Local },
                tiers: Tiers { node: local.clone(), ..Tiers::default() },
                endpoints: local,
                when_empty,
            }
        }
        Policy::Cluster => {
            let tiers = cluster_tiers(endpoints, node);
            let (selected_tier, endpoints) = if !tiers.node.is_empty() {
                (SelectedTier::Node, tiers.node.clone())
            } else if !tiers.zone.is_empty() {
                (SelectedTier::Zone, tiers.zone.clone())
            } else if !tiers.cluster.is_empty() {
                (SelectedTier::Cluster, tiers.cluster.clone())
            } else {
                (SelectedTier::None, Vec::new())
            };
            let when_empty = endpoints.is_empty().then_some(WhenEmpty::Reject);
            TrafficPlan { policy, tiers, selected_tier, endpoints, when_empty }
        }
    }
}

/// The families a Service has VIPs in, in the order of its cluster IPs.
fn families(svc: &Service) -> Vec<Family> {
    let mut fams: Vec<Family> = Vec::new();
    for ip in &svc.cluster_ips {
        let f = Family::of(ip);
        if !fams.contains(&f) {
            fams.push(f);
        }
    }
    fams
}

/// Plan one Service port in one family (without warnings; see `plan`).
pub fn plan_port(
    model: &Model,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    node: &NodeInfo,
) -> PortPlan {
    plan_port_in(model.slices_of(&svc.key), svc, port, family, node)
}

/// The data-path plan of every port and family of one Service, from its slices (what the agent replans when
/// only this Service or its slices changed).
pub fn plan_service(svc: &Service, slices: &[&EndpointSlice], node: &NodeInfo) -> Vec<PortPlan> {
    let mut out = Vec::new();
    for family in families(svc) {
        for port in &svc.ports {
            out.push(plan_port_in(slices.iter().copied(), svc, port, family, node));
        }
    }
    out
}

fn plan_port_in<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    node: &NodeInfo,
) -> PortPlan {
    let endpoints = port_endpoints_in(slices, port, family, &node.name);
    let has_any = has_any_endpoints(&endpoints);
    let internal = traffic(svc.internal_policy, &endpoints, node, has_any);
    let external =
        svc.externally_reachable(port).then(|| traffic(svc.external_policy, &endpoints, node, has_any));
    PortPlan {
        service: svc.key.to_string(),
        key: svc.key.clone(),
        port_name: port.name.clone(),
        port: port.port,
        protocol: port.protocol,
        family,
        cluster_ips: svc.cluster_ips.iter().copied().filter(|ip| Family::of(ip) == family).collect(),
        has_any_endpoints: has_any,
        topology_mode: topology_mode(&endpoints, node),
        internal,
        external,
        warnings: Vec::new(),
    }
}

/// The plan for one node: every Service port with a VIP, in every family it has, with lint warnings.
pub fn plan(model: &Model, node: &NodeInfo) -> Plan {
    plan_inner(model, node, true)
}

/// The plan without warnings: what the agent needs on every sync (the load-skew lint plans every node).
pub fn plan_for_datapath(model: &Model, node: &NodeInfo) -> Plan {
    plan_inner(model, node, false)
}

fn plan_inner(model: &Model, node: &NodeInfo, warnings: bool) -> Plan {
    let mut services = Vec::new();
    for svc in model.services.values() {
        for family in families(svc) {
            for port in &svc.ports {
                let mut p = plan_port(model, svc, port, family, node);
                if warnings {
                    let eps = port_endpoints(model, svc, port, family, &node.name);
                    p.warnings = crate::lint::port_warnings(svc, &eps, node);
                    p.warnings.extend(crate::lint::skew_warning(model, svc, port, family));
                }
                services.push(p);
            }
        }
    }
    Plan { node: node.name.clone(), zone: node.zone.clone(), services }
}
