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

mod claims;
mod external_frontends;
mod summary;
pub use claims::{Claimant, VIP_RULE, claim_table, claims_of, vip_conflict_text, vip_winner};
pub use external_frontends::{
    ExternalFrontend, ExternalKind, ExternalPlan, NotTranslated, NotTranslatedReason, SpecialAddress,
    source_ranges,
};
pub use summary::{Requested, TopologyReason, TopologySummary, requested, summarize};

use crate::model::{
    AddressType, Endpoint, EndpointSlice, Family, Model, NodeInfo, Policy, Protocol, Service, ServicePort,
    ServicePortName,
};

/// Which topology filter kube-proxy applies to a Service port on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    /// Only the ready endpoints whose `forNodes` names this node.
    Node,
    /// Only the ready endpoints whose `forZones` names this node's zone.
    Zone,
    /// Every ready endpoint.
    None,
}

/// Why one kind of hint (node or zone) is or is not used: kube-proxy's all-or-nothing rule, judged on ready
/// endpoints only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum HintReason {
    /// Not used: no endpoint is ready.
    NoReadyEndpoint,
    /// Not used: no ready endpoint carries this kind of hint.
    NoEndpointHinted,
    /// Not used: this ready endpoint carries none, which turns the filter off for the whole Service.
    EndpointWithoutHint {
        /// The endpoint without the hint.
        endpoint: IpAddr,
    },
    /// Zone hints not used: this node has no zone (no `--zone`, no `topology.kubernetes.io/zone` label).
    NodeHasNoZone,
    /// Not used: every ready endpoint carries the hint, but none names this node (or its zone).
    NoneNamesThis {
        /// Ready endpoints.
        ready: usize,
    },
    /// Used: every ready endpoint carries the hint and `endpoint` names this node (or its zone).
    Named {
        /// Ready endpoints.
        ready: usize,
        /// The first ready endpoint whose hint names this node (or zone).
        endpoint: IpAddr,
    },
}

impl HintReason {
    /// Whether the filter applies.
    pub fn used(&self) -> bool {
        matches!(self, Self::Named { .. })
    }
}

/// kube-proxy's topology decision for one Service port on one node, with the reason for each kind of hint:
/// computed once (`decide_topology`) and used by the tiers, `explain` and the plan's JSON alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopologyDecision {
    /// The filter kube-proxy applies (`topologyModeFromHints`).
    pub mode: TopologyMode,
    /// Node hints: used when every ready endpoint has `forNodes` and one names this node.
    pub node: HintReason,
    /// Zone hints: used when every ready endpoint has `forZones` and one names this node's zone. tierlb's
    /// zone tier exists exactly when they are (also behind a node tier, as its first fallback).
    pub zone: HintReason,
}

/// The tier the data path uses while every backend is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectedTier {
    /// Endpoints whose node hint names this node.
    Node,
    /// Endpoints whose zone hint names this node's zone.
    Zone,
    /// Every ready endpoint (or, with none ready, the serving and terminating ones).
    Cluster,
    /// A Local traffic policy's local set.
    Local,
    /// Nothing: connects fail (see `WhenEmpty`).
    None,
}

impl SelectedTier {
    /// The name, as in the JSON (and the `applied` label of `tierlb_service_topology`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Zone => "zone",
            Self::Cluster => "cluster",
            Self::Local => "local",
            Self::None => "none",
        }
    }
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

/// The backends of each tier, in the order the data path tries them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tiers {
    /// Ready endpoints whose node hint names this node (node mode only); under a Local policy, the local
    /// set.
    pub node: Vec<SocketAddr>,
    /// Ready endpoints whose zone hint names this node's zone (when zone hints are usable).
    pub zone: Vec<SocketAddr>,
    /// Every ready endpoint (or, with none ready, the serving and terminating ones).
    pub cluster: Vec<SocketAddr>,
}

impl Tiers {
    /// The tiers as an array indexed like `lb_common::TIER_*`.
    pub fn as_array(&self) -> [&[SocketAddr]; 3] {
        [&self.node, &self.zone, &self.cluster]
    }
}

/// How one kind of traffic (internal or external) to a Service port is routed on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrafficPlan {
    /// The traffic policy that applies.
    pub policy: Policy,
    /// What the data path holds, tier by tier.
    pub tiers: Tiers,
    /// The tier used while every backend is up.
    pub selected_tier: SelectedTier,
    /// What the data path uses now (kube-proxy's cluster set, or its local set under a Local policy).
    pub endpoints: Vec<SocketAddr>,
    /// What kube-proxy does now because there is no endpoint to use (`None`: there is one).
    pub when_empty: Option<WhenEmpty>,
    /// What happens once every backend in the tiers is marked down: kube-proxy's DROP for a Local policy
    /// whose Service has endpoints elsewhere, else REJECT.
    pub when_all_down: WhenEmpty,
}

/// How many endpoints a Service port has on this node's view, by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EndpointCounts {
    /// All endpoints (merged across slices).
    pub total: usize,
    /// Ready ones.
    pub ready: usize,
    /// Not ready but serving and terminating.
    pub serving_terminating: usize,
    /// On this node.
    pub local: usize,
    /// Ready ones on this node: what kube-proxy's health check node port counts (`LocalReadyEndpoints`), so a
    /// node whose local endpoints all terminate answers 503 while they still serve (KEP-1669: the balancer
    /// drains the node, the connections it still sends are served).
    pub local_ready: usize,
    /// Ready ones with a `forNodes` hint (the rest of `ready` have none).
    pub ready_node_hinted: usize,
    /// Ready ones with a `forZones` hint.
    pub ready_zone_hinted: usize,
}

/// One Service port in one IP family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortPlan {
    /// The Service port (JSON: `service` and `port_name`).
    #[serde(flatten)]
    pub name: ServicePortName,
    /// The Service's `metadata.creationTimestamp` (seconds since the epoch), for `claims::vip_winner`.
    #[serde(skip)]
    pub created: Option<i64>,
    /// The port number clients connect to.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
    /// The IP family of this plan.
    pub family: Family,
    /// The Service's cluster IPs in this family.
    pub cluster_ips: Vec<IpAddr>,
    /// kube-proxy's `hasAnyEndpoints`: a ready, or serving and terminating, endpoint exists anywhere.
    pub has_any_endpoints: bool,
    /// Endpoint counts by state.
    pub counts: EndpointCounts,
    /// Which hints apply, and why.
    pub topology: TopologyDecision,
    /// ClusterIP traffic.
    pub internal: TrafficPlan,
    /// Node port, load-balancer and external IP traffic (when the port is externally reachable): its
    /// frontends on this node and the sets of connects made on the node and of traffic from outside it.
    pub external: Option<ExternalPlan>,
    /// `sessionAffinity: ClientIP`: a client keeps its backend within the tier the rules select.
    pub session_affinity: Option<SessionAffinity>,
}

/// `sessionAffinity: ClientIP` as the data path applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SessionAffinity {
    /// Seconds from a client's last connect until it may get another backend
    /// (`sessionAffinityConfig.clientIP.timeoutSeconds`).
    pub timeout_seconds: u32,
    /// What identifies a client: its network namespace (one per pod; the node's own processes share one).
    pub client: &'static str,
}

/// What identifies a client for sessionAffinity at the socket level (`SessionAffinity::client`).
pub const AFFINITY_CLIENT: &str = "network namespace";

/// Every Service port's plan for one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The node's name.
    pub node: String,
    /// The node's zone, if any.
    pub zone: Option<String>,
    /// One entry per Service port and family.
    pub services: Vec<PortPlan>,
    /// What is not programmed, and why (labelled Services, SCTP ports): `skipped::skipped`.
    pub skipped: Vec<crate::skipped::Skipped>,
}

/// One endpoint of a Service port after merging slices: its address and what kube-proxy knows of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortEndpoint {
    /// `addresses[0]` and the slice port's number.
    pub addr: SocketAddr,
    /// The endpoint as written.
    pub endpoint: Endpoint,
    /// Its `nodeName` is this node.
    pub local: bool,
}

/// The endpoints of one Service port in one family, merged across `slices` (the Service's, possibly with the
/// controller's hints filled in) the way kube-proxy's EndpointSliceCache does: the slice port is found by
/// name and protocol (so named target ports resolve per slice), only `addresses[0]` counts, and a duplicate
/// `ip:port` keeps its local copy.
pub fn port_endpoints<'a>(
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

/// kube-proxy's `topologyModeFromHints` with its reasons, judged on ready endpoints only: node hints if
/// every ready endpoint has `forNodes` and one names this node, else zone hints under the same all-or-nothing
/// rule, else none. The one place this rule is written.
fn decide_topology(endpoints: &[PortEndpoint], node: &NodeInfo) -> TopologyDecision {
    let ready: Vec<&PortEndpoint> = endpoints.iter().filter(|e| e.endpoint.is_ready()).collect();
    let zone = node.zone.as_deref().filter(|z| !z.is_empty());
    let node_reason = hint_reason(&ready, |e| e.node_hints(), &node.name);
    let zone_reason = match zone {
        // The missing zone is only the reason once the endpoints themselves would allow zone hints. kube-proxy
        // reads a missing zone label as "" (`nodeLabels[LabelTopologyZone]`), which a `forZones: [""]` hint
        // (a valid label value) names.
        None => match hint_reason(&ready, |e| e.zone_hints(), "") {
            HintReason::NoneNamesThis { .. } => HintReason::NodeHasNoZone,
            other => other,
        },
        Some(z) => hint_reason(&ready, |e| e.zone_hints(), z),
    };
    let mode = if node_reason.used() {
        TopologyMode::Node
    } else if zone_reason.used() {
        TopologyMode::Zone
    } else {
        TopologyMode::None
    };
    TopologyDecision { mode, node: node_reason, zone: zone_reason }
}

/// The all-or-nothing rule for one kind of hint: `wanted` is the node name or zone to look for.
fn hint_reason(
    ready: &[&PortEndpoint],
    hints: impl Fn(&Endpoint) -> &[crate::model::Name],
    wanted: &str,
) -> HintReason {
    if ready.is_empty() {
        return HintReason::NoReadyEndpoint;
    }
    if ready.iter().all(|e| hints(&e.endpoint).is_empty()) {
        return HintReason::NoEndpointHinted;
    }
    if let Some(bare) = ready.iter().find(|e| hints(&e.endpoint).is_empty()) {
        return HintReason::EndpointWithoutHint { endpoint: bare.addr.ip() };
    }
    let named = ready.iter().find(|e| hints(&e.endpoint).iter().any(|h| **h == *wanted));
    match named {
        Some(e) => HintReason::Named { ready: ready.len(), endpoint: e.addr.ip() },
        None => HintReason::NoneNamesThis { ready: ready.len() },
    }
}

fn addrs<'a>(eps: impl Iterator<Item = &'a PortEndpoint>) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = eps.map(|e| e.addr).collect();
    v.sort();
    v
}

/// Tiers for a Cluster traffic policy. The first non-empty tier is kube-proxy's cluster set.
fn cluster_tiers(endpoints: &[PortEndpoint], node: &NodeInfo, topology: &TopologyDecision) -> Tiers {
    let ready = || endpoints.iter().filter(|e| e.endpoint.is_ready());
    let node_tier = if topology.node.used() {
        addrs(ready().filter(|e| e.endpoint.node_hints().iter().any(|h| **h == *node.name)))
    } else {
        Vec::new()
    };
    // The zone tier exists whenever zone filtering would be allowed on this node, also when node filtering is
    // what kube-proxy uses: it is the data path's first fallback.
    let zone_tier = if topology.zone.used() {
        let z = node.zone.as_deref().unwrap_or_default();
        addrs(ready().filter(|e| e.endpoint.zone_hints().iter().any(|h| **h == *z)))
    } else {
        Vec::new()
    };
    let mut cluster = addrs(ready());
    if cluster.is_empty() {
        // No ready endpoint anywhere: serving and terminating ones, topology ignored.
        cluster = addrs(endpoints.iter().filter(|e| e.endpoint.is_serving() && e.endpoint.is_terminating()));
    }
    Tiers { node: node_tier, zone: zone_tier, cluster }
}

/// kube-proxy's local set: local ready endpoints, else local serving+terminating ones. No topology.
fn local_set(endpoints: &[PortEndpoint]) -> Vec<SocketAddr> {
    let ready = addrs(endpoints.iter().filter(|e| e.local && e.endpoint.is_ready()));
    if !ready.is_empty() {
        return ready;
    }
    addrs(endpoints.iter().filter(|e| e.local && e.endpoint.is_serving() && e.endpoint.is_terminating()))
}

/// Any endpoint kube-proxy could use at all (`hasAnyEndpoints`).
fn has_any_endpoints(endpoints: &[PortEndpoint]) -> bool {
    endpoints
        .iter()
        .any(|e| e.endpoint.is_ready() || (e.endpoint.is_serving() && e.endpoint.is_terminating()))
}

fn traffic(
    policy: Policy,
    endpoints: &[PortEndpoint],
    node: &NodeInfo,
    topology: &TopologyDecision,
    has_any: bool,
) -> TrafficPlan {
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
                when_all_down: if has_any { WhenEmpty::Drop } else { WhenEmpty::Reject },
            }
        }
        Policy::Cluster => {
            let tiers = cluster_tiers(endpoints, node, topology);
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
            TrafficPlan {
                policy,
                tiers,
                selected_tier,
                endpoints,
                when_empty,
                when_all_down: WhenEmpty::Reject,
            }
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

/// The data-path plan of every port and family of one Service, from its slices (what the agent replans when
/// only this Service or its slices changed).
pub fn plan_service(svc: &Service, slices: &[&EndpointSlice], node: &NodeInfo) -> Vec<PortPlan> {
    let mut out = Vec::new();
    for family in families(svc) {
        for port in svc.ports.iter().filter(|p| p.protocol.translated()) {
            out.push(plan_port(slices.iter().copied(), svc, port, family, node));
        }
    }
    out
}

/// The plan of one port of a Service in one family on one node: `plan_service` narrowed to one entry, for the
/// study and the lints that compare nodes.
pub fn port_plan(
    model: &Model,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    node: &NodeInfo,
) -> PortPlan {
    plan_port(model.slices_of(&svc.key), svc, port, family, node)
}

/// Ready endpoints with a non-empty hint of one kind.
fn ready_hinted(endpoints: &[PortEndpoint], hints: fn(&Endpoint) -> &[crate::model::Name]) -> usize {
    endpoints.iter().filter(|e| e.endpoint.is_ready() && !hints(&e.endpoint).is_empty()).count()
}

/// One port in one family.
fn plan_port<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    node: &NodeInfo,
) -> PortPlan {
    let endpoints = port_endpoints(slices, port, family, &node.name);
    let has_any = has_any_endpoints(&endpoints);
    let topology = decide_topology(&endpoints, node);
    let internal = traffic(svc.internal_policy, &endpoints, node, &topology, has_any);
    let external = external_frontends::plan(svc, port, family, node, &endpoints, &topology, has_any);
    let ready = endpoints.iter().filter(|e| e.endpoint.is_ready()).count();
    let counts = EndpointCounts {
        total: endpoints.len(),
        ready,
        serving_terminating: endpoints
            .iter()
            .filter(|e| !e.endpoint.is_ready() && e.endpoint.is_serving() && e.endpoint.is_terminating())
            .count(),
        local: endpoints.iter().filter(|e| e.local).count(),
        local_ready: endpoints.iter().filter(|e| e.local && e.endpoint.is_ready()).count(),
        ready_node_hinted: ready_hinted(&endpoints, Endpoint::node_hints),
        ready_zone_hinted: ready_hinted(&endpoints, Endpoint::zone_hints),
    };
    PortPlan {
        name: ServicePortName::new(svc.key.clone(), port.name.clone()),
        created: svc.created,
        port: port.port,
        protocol: port.protocol,
        family,
        cluster_ips: svc.cluster_ips.iter().copied().filter(|ip| Family::of(ip) == family).collect(),
        has_any_endpoints: has_any,
        counts,
        topology,
        internal,
        external,
        session_affinity: svc
            .session_affinity_timeout
            .map(|timeout_seconds| SessionAffinity { timeout_seconds, client: AFFINITY_CLIENT }),
    }
}

/// The plan for one node: every Service port with a VIP, in every family it has (its warnings are
/// `lint::lint`'s).
pub fn plan(model: &Model, node: &NodeInfo) -> Plan {
    let mut services = Vec::new();
    for svc in model.services.values() {
        for family in families(svc) {
            // Ports of a protocol tierlb does not translate are listed in `skipped` instead.
            for port in svc.ports.iter().filter(|p| p.protocol.translated()) {
                services.push(plan_port(model.slices_of(&svc.key), svc, port, family, node));
            }
        }
    }
    Plan {
        node: node.name.clone(),
        zone: node.zone.clone(),
        services,
        skipped: crate::skipped::skipped(model),
    }
}
