//! Warnings about Service configurations that do not do what they seem to, read from a plan and the model it
//! was computed from (the plan decides; the lints only say what its decisions mean).
use std::{collections::BTreeMap, net::SocketAddr};

use serde::Serialize;

mod cluster;
mod rule;
pub use cluster::{ClusterFinding, cluster_lint, cluster_nodes};
pub use rule::{Rule, Warning};

use crate::{
    hints::{self, HintMode},
    model::{Family, Model, NodeInfo, Policy, Service, ServicePort},
    plan::{self, Claimant, Plan, PortEndpoint, PortPlan},
};

/// The warnings of every port plan of a `Plan`: `ports[i]` are those of `plan.services[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lints {
    /// One list per port plan, in the plan's order.
    pub ports: Vec<Vec<Warning>>,
    /// About the node itself (`unknown_node`).
    pub node: Vec<Warning>,
}

/// The pods endpoints belong to, by address (their `targetRef`), to name them in warnings.
pub type Pods = BTreeMap<std::net::IpAddr, crate::model::ObjKey>;

/// The warnings of each port plan of `plan`, computed on `node` from `model`: the Service's own settings
/// (`port_warnings`), PreferSameNode's skew (`skew_warning`), then every VIP:port another Service claims
/// too (`plan::vip_conflict_text`).
pub fn lint(model: &Model, node: &NodeInfo, plan: &Plan) -> Lints {
    lint_naming(model, node, plan, &Pods::new())
}

/// `lint`, naming endpoints with their pods from `pods` where it has them.
pub fn lint_naming(model: &Model, node: &NodeInfo, plan: &Plan, pods: &Pods) -> Lints {
    let mut ports: Vec<Vec<Warning>> = plan
        .services
        .iter()
        .map(|p| {
            let Some((svc, port)) = service_port(model, p) else { return Vec::new() };
            let eps = plan::port_endpoints(model.slices_of(&svc.key), port, p.family, &node.name);
            let mut w = port_warnings(svc, &eps, pods);
            w.extend(
                skew_warning(model, svc, port, p.family).map(|t| Warning::new(Rule::PreferSameNodeSkew, t)),
            );
            w
        })
        .collect();
    for (w, conflicts) in ports.iter_mut().zip(vip_conflicts(&plan.services)) {
        w.extend(conflicts);
    }
    Lints { ports, node: unknown_node(&node.name, model).into_iter().collect() }
}

/// `unknown-node` when `node` is in no Node object and no endpoint (by `nodeName` or a `forNodes` hint) of
/// the source: what it is planned as, and the name it is likely a misspelling of.
pub fn unknown_node(node: &str, model: &Model) -> Option<Warning> {
    use crate::model::Name;
    if model.nodes.contains_key(node) {
        // The common case, and every node `lint` and `--all-nodes` take (from the Node objects): no walk of
        // the endpoints.
        return None;
    }
    let endpoints = || model.slices.values().flat_map(|s| &s.endpoints);
    let mut known: std::collections::BTreeSet<&str> = model.nodes.keys().map(String::as_str).collect();
    known.extend(endpoints().filter_map(|e| e.node_name.as_deref()));
    known.extend(
        endpoints().flat_map(|e| e.hints.for_nodes().into_iter().flat_map(|l| l.iter().map(Name::as_str))),
    );
    if known.contains(node) {
        return None;
    }
    let hint = match crate::spelling::closest(node, known.iter().copied()) {
        Some(k) => format!("; did you mean {k}?"),
        None if known.is_empty() => String::new(),
        None => format!(" (nodes there: {})", known.iter().copied().collect::<Vec<_>>().join(", ")),
    };
    let text = format!(
        "node {node} is in no Node object and no endpoint of the source: planned as a node with no local \
         endpoint{hint}"
    );
    Some(Warning::new(Rule::UnknownNode, text))
}

/// The Service and port of `model` a port plan was computed for.
fn service_port<'a>(model: &'a Model, p: &PortPlan) -> Option<(&'a Service, &'a ServicePort)> {
    let svc = model.services.get(&p.name.service)?;
    let port = svc
        .ports
        .iter()
        .find(|sp| sp.name == p.name.port && sp.port == p.port && sp.protocol == p.protocol)?;
    Some((svc, port))
}

/// For each port plan, `plan::vip_conflict_text` of every VIP:port another Service claims too.
fn vip_conflicts(services: &[PortPlan]) -> Vec<Vec<Warning>> {
    let claims = plan::claim_table(services);
    services
        .iter()
        .map(|p| {
            let mut out = Vec::new();
            for (addr, _) in plan::claims_of(p) {
                let Some(who) = claims.get(&(addr, p.protocol)) else { continue };
                if who.iter().all(|c| c.service == p.name.service) {
                    continue;
                }
                let who: Vec<&Claimant> = who.iter().collect();
                let text = plan::vip_conflict_text(addr, p.protocol.as_str(), &who, &p.name.service);
                out.push(Warning::new(Rule::VipConflict, text));
            }
            out
        })
        .collect()
}

/// A plan with its warnings, as `tierlb plan -o json` prints it: each port plan's fields, then `warnings`.
#[derive(Serialize)]
pub struct LintedPlan<'a> {
    node: &'a str,
    zone: &'a Option<String>,
    /// About the node itself (`unknown-node`).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    node_warnings: &'a [Warning],
    services: Vec<LintedPort<'a>>,
    skipped: Vec<&'a crate::skipped::Skipped>,
    /// Services planned on the hints the EndpointSlice controller would write (`--emulate-hints`).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    hints_emulated: &'a [crate::model::ObjKey],
}

#[derive(Serialize)]
struct LintedPort<'a> {
    #[serde(flatten)]
    plan: &'a PortPlan,
    warnings: &'a [Warning],
}

impl<'a> LintedPlan<'a> {
    /// `plan` with `lints` (`lint(model, node, plan)`).
    pub fn new(plan: &'a Plan, lints: &'a Lints) -> Self {
        let services = plan
            .services
            .iter()
            .enumerate()
            .map(|(i, p)| LintedPort { plan: p, warnings: lints.ports.get(i).map_or(&[], Vec::as_slice) })
            .collect();
        Self {
            node: &plan.node,
            zone: &plan.zone,
            node_warnings: &lints.node,
            services,
            skipped: plan.skipped.iter().collect(),
            hints_emulated: &[],
        }
    }

    /// Only Service `key`'s ports and what of it is not programmed (`tierlb explain -o json`).
    #[must_use]
    pub fn only(mut self, key: &crate::model::ObjKey) -> Self {
        self.services.retain(|p| p.plan.name.service == *key);
        self.skipped.retain(|s| s.service == *key);
        self
    }

    /// Name the Services planned on emulated hints (`hints_emulated`).
    #[must_use]
    pub fn emulated(self, services: &'a [crate::model::ObjKey]) -> Self {
        Self { hints_emulated: services, ..self }
    }
}

/// An endpoint as a warning names it: its address, node and pod (where `pods` knows it).
fn endpoint_name(e: &PortEndpoint, pods: &Pods) -> String {
    let mut parts = Vec::new();
    if let Some(n) = &e.endpoint.node_name {
        parts.push(format!("node {}", n.as_str()));
    }
    if let Some(p) = pods.get(&e.addr.ip()) {
        parts.push(format!("pod {p}"));
    }
    if parts.is_empty() { e.addr.ip().to_string() } else { format!("{} ({})", e.addr.ip(), parts.join(", ")) }
}

/// Warnings for one Service port (they do not depend on the node, so each plan entry is self-contained);
/// endpoints are named with their pods from `pods`.
pub fn port_warnings(svc: &Service, endpoints: &[PortEndpoint], pods: &Pods) -> Vec<Warning> {
    let mut w = Vec::new();
    let mode = hints::mode(svc);
    // An unknown value asks for nothing (the controller removes every hint): it is reported as such below,
    // not as a fallback the Local policy hides.
    if svc.internal_policy == Policy::Local
        && let Some(td) = &svc.traffic_distribution
        && !matches!(mode, HintMode::None { .. })
    {
        w.push(Warning::new(Rule::DeadLocalLine, format!(
            "internalTrafficPolicy: Local overrides trafficDistribution: {td} (dead line): traffic stays on \
             this node and is dropped when it has no ready endpoint; remove internalTrafficPolicy to get the \
             {td} fallback"
        )));
    }
    if mode == HintMode::AutoAnnotation
        && let Some(td) = &svc.traffic_distribution
    {
        let which = if svc.topology_aware_hints_annotation.is_some() {
            "service.kubernetes.io/topology-aware-hints"
        } else {
            "service.kubernetes.io/topology-mode"
        };
        w.push(Warning::new(Rule::AnnotationOverridesField, format!(
            "annotation {which}: Auto overrides trafficDistribution: {td}: the controller writes zone hints by \
             CPU share (never node hints); remove the annotation to get {td}"
        )));
    }
    match &mode {
        HintMode::None { unknown_value: Some(v) } => {
            let known = [hints::PREFER_SAME_ZONE, hints::PREFER_SAME_NODE, hints::PREFER_CLOSE];
            let guess = crate::spelling::closest(v, known.iter().copied())
                .map(|k| format!("did you mean {k}? "))
                .unwrap_or_default();
            w.push(Warning::new(Rule::UnknownDistribution, format!(
                "unknown trafficDistribution value {v:?}: {guess}the controller ignores it and removes all hints \
                 (known: PreferSameZone, PreferSameNode, and the deprecated PreferClose)"
            )));
        }
        HintMode::PreferSameZone { deprecated_alias: true } => w.push(Warning::new(
            Rule::DeprecatedPreferClose,
            "trafficDistribution: PreferClose is the deprecated alias of PreferSameZone; write PreferSameZone",
        )),
        _ => {}
    }
    let ready: Vec<&PortEndpoint> = endpoints.iter().filter(|e| e.endpoint.is_ready()).collect();
    let hinted = |e: &PortEndpoint| !e.endpoint.hints.is_empty();
    let with_hints = ready.iter().filter(|e| hinted(e)).count();
    let expects_hints = matches!(mode, HintMode::PreferSameZone { .. } | HintMode::PreferSameNode);
    if !ready.is_empty() && with_hints == 0 && expects_hints && svc.internal_policy == Policy::Cluster {
        w.push(Warning::new(Rule::NoHints, format!(
            "trafficDistribution: {} is set but no endpoint carries hints: the EndpointSlice controller is too old \
             or its feature gate is off, so every node uses all endpoints",
            svc.traffic_distribution.as_deref().unwrap_or_default()
        )));
    }
    let unhinted_all = with_hints == 0;
    let cluster = svc.internal_policy == Policy::Cluster;
    // Node hints: kube-proxy (and tierlb) use them only when every ready endpoint has one; zone hints
    // likewise. An endpoint missing both is named once.
    let no_node: Vec<&&PortEndpoint> = ready.iter().filter(|e| e.endpoint.node_hints().is_empty()).collect();
    let no_zone: Vec<&&PortEndpoint> = ready.iter().filter(|e| e.endpoint.zone_hints().is_empty()).collect();
    let node_expected = mode == HintMode::PreferSameNode && cluster && !unhinted_all;
    let node_finding = !no_node.is_empty() && (node_expected || no_node.len() < ready.len());
    let zone_finding = !unhinted_all && !no_zone.is_empty() && no_zone.len() < ready.len();
    let same = node_finding && zone_finding && no_node == no_zone;
    let names =
        |v: &[&&PortEndpoint]| v.iter().map(|e| endpoint_name(e, pods)).collect::<Vec<_>>().join(", ");
    if node_finding {
        let only_zones = no_node.iter().all(|e| !e.endpoint.zone_hints().is_empty());
        w.push(Warning::new(Rule::NodeHintsMissing, format!(
            "{} of {} ready endpoints carry no forNodes hint{}: {}: {} apply only when every ready endpoint \
             has one, so no node prefers its own endpoint{}",
            no_node.len(),
            ready.len(),
            if same { " and no forZones hint" } else if only_zones { " (forZones only)" } else { "" },
            names(&no_node),
            if same { "node and zone hints" } else { "node hints" },
            if no_node.len() == ready.len() {
                " (a control plane that writes only zone hints does not know PreferSameNode: older than 1.33, or \
                 its PreferSameTrafficDistribution gate off)"
            } else {
                ""
            }
        )));
    }
    if zone_finding && !same {
        w.push(Warning::new(
            Rule::HintsMissing,
            format!(
                "{} of {} ready endpoints carry no forZones hint: {}: zone hints apply only when every ready \
             endpoint has one, so topology filtering by zone is off for the whole Service",
                no_zone.len(),
                ready.len(),
                names(&no_zone)
            ),
        ));
    }
    w
}

/// Each endpoint's share of the port's traffic when every node in `weights` sends that share of the clients,
/// and each node spreads its clients evenly over the endpoints its plan selects. Nodes whose plan selects
/// nothing contribute to `failed`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shares {
    /// Each selected endpoint's share, 0..=1.
    pub by_endpoint: BTreeMap<SocketAddr, f64>,
    /// The share of clients on nodes whose plan selects no endpoint.
    pub failed: f64,
}

/// The [`Shares`] of `port` over `family` when `weights` give each node's share of the clients (they need not
/// sum to 1).
pub fn shares(
    model: &Model,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    weights: &[(NodeInfo, f64)],
) -> Shares {
    let total: f64 = weights.iter().map(|(_, w)| *w).sum();
    let mut out = Shares::default();
    if total <= 0.0 {
        return out;
    }
    for (node, weight) in weights {
        let eps = &plan::port_plan(model, svc, port, family, node).internal.endpoints;
        if eps.is_empty() {
            out.failed += weight / total;
            continue;
        }
        for e in eps {
            *out.by_endpoint.entry(*e).or_default() += weight / total / eps.len() as f64;
        }
    }
    out
}

/// The skew above which `lint` reports PreferSameNode's load and `tierlb study` counts a Service as skewed
/// (its `--max-skew` default): the busiest endpoint's share over an even share.
pub const MAX_SKEW: f64 = 1.25;

/// The busiest endpoint's share over an even share among `ready` endpoints (1.0: even), as `tierlb study`
/// reports it (`Skew`); none below two endpoints.
pub fn skew_factor(by_endpoint: impl IntoIterator<Item = f64>, ready: usize) -> Option<f64> {
    let shares: Vec<f64> = by_endpoint.into_iter().collect();
    let total: f64 = shares.iter().sum();
    (ready >= 2 && total > 0.0).then(|| shares.iter().copied().fold(0.0, f64::max) / (total / ready as f64))
}

/// PreferSameNode with fewer ready endpoints than nodes: the nodes without one share the others, so with
/// equal clients per node the endpoints' loads differ; reported above `MAX_SKEW`, with `tierlb study`'s
/// figure (the same computation with equal clients). Needs the Node objects.
pub fn skew_warning(model: &Model, svc: &Service, port: &ServicePort, family: Family) -> Option<String> {
    if hints::mode(svc) != HintMode::PreferSameNode
        || svc.internal_policy == Policy::Local
        || model.nodes.len() < 2
    {
        return None;
    }
    let probe = NodeInfo::new(String::new(), None);
    let eps = plan::port_endpoints(model.slices_of(&svc.key), port, family, &probe.name);
    let ready = eps.iter().filter(|e| e.endpoint.is_ready()).count();
    if ready == 0 || ready >= model.nodes.len() {
        return None;
    }
    let weights: Vec<(NodeInfo, f64)> =
        model.nodes.values().map(|n| (NodeInfo::resolve(&n.name, None, model), 1.0)).collect();
    let s = shares(model, svc, port, family, &weights);
    let k = skew_factor(s.by_endpoint.values().copied(), ready).filter(|k| *k > MAX_SKEW)?;
    let parts: Vec<String> =
        s.by_endpoint.iter().map(|(e, v)| format!("{} {:.0}%", e.ip(), v * 100.0)).collect();
    Some(format!(
        "PreferSameNode with {ready} ready endpoints on {} nodes: with equal clients per node the endpoints \
         take {}, the busiest {k:.2}x an even share (over {MAX_SKEW}x; `tierlb study` gives the same figure, \
         and with --clients the figure for your clients per node): each endpoint takes every client on its own \
         node, and the nodes without one spread theirs over the others",
        model.nodes.len(),
        parts.join(", ")
    ))
}
