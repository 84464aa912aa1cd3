//! The lints judged across the cluster (`tierlb lint`): every node's plan and lints, each finding once with
//! the nodes it concerns, and the pitfalls only a view of every node shows (a Local policy with nodes that
//! have no local endpoint, PreferSameZone in one zone, slices without the hints their Service asks for).
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Rule, Warning};
use crate::{
    hints::{self, HintMode},
    model::{Model, NodeInfo, ObjKey, Policy},
    plan::{self, WhenEmpty},
};

/// One finding of the cluster-wide lint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterFinding {
    /// The Service.
    pub service: ObjKey,
    /// The port's name (empty for an unnamed port or a finding about the whole Service).
    pub port: String,
    /// The rule (`Rule::name`).
    pub rule: Rule,
    /// What is wrong.
    pub message: String,
    /// The rule's fix.
    pub fix: &'static str,
    /// The nodes it concerns, by name.
    pub nodes: Vec<String>,
    /// Those are all the nodes linted.
    pub all_nodes: bool,
}

/// The nodes a cluster-wide lint judges: the Node objects, and the nodes endpoints name that have none (read
/// without permission on Nodes, or a partial dump), each with its zone from the Node's label, else from its
/// endpoints' `zone`.
pub fn cluster_nodes(model: &Model) -> Vec<NodeInfo> {
    let mut zones: BTreeMap<String, Option<String>> = BTreeMap::new();
    for svc in model.services.values() {
        for ep in model.slices_of(&svc.key).flat_map(|s| &s.endpoints) {
            if let Some(n) = &ep.node_name {
                let z = zones.entry(n.to_string()).or_default();
                if z.is_none() {
                    *z = ep.zone.as_deref().map(str::to_owned);
                }
            }
        }
    }
    for name in model.nodes.keys() {
        zones.entry(name.clone()).or_default();
    }
    zones
        .into_iter()
        .map(|(name, zone)| {
            if model.nodes.contains_key(&name) {
                NodeInfo::resolve(&name, None, model)
            } else {
                NodeInfo::new(name, zone)
            }
        })
        .collect()
}

type Key = (ObjKey, String, Rule, String);

/// Every finding of `model` on `nodes` (`cluster_nodes`), in Service order. `filled` are the Services whose
/// slices carried no hints and were judged with the hints the EndpointSlice controller would write
/// (`hints::fill_missing`); `pods` names endpoints.
pub fn cluster_lint(
    model: &Model,
    nodes: &[NodeInfo],
    filled: &[ObjKey],
    pods: &super::Pods,
) -> Vec<ClusterFinding> {
    let mut found: BTreeMap<Key, BTreeSet<String>> = BTreeMap::new();
    let mut add = |svc: &ObjKey, port: &str, w: Warning, node: &str| {
        found.entry((svc.clone(), port.to_owned(), w.rule, w.text)).or_default().insert(node.to_owned());
    };
    for node in nodes {
        let p = plan::plan(model, node);
        let lints = super::lint_naming(model, node, &p, pods);
        for (pp, warnings) in p.services.iter().zip(&lints.ports) {
            for w in warnings {
                add(&pp.name.service, &pp.name.port, w.clone(), &node.name);
            }
            if pp.internal.policy == Policy::Local && pp.internal.when_empty == Some(WhenEmpty::Drop) {
                let text = "internalTrafficPolicy: Local and no ready endpoint on the node: connects from its pods \
                            fail (EHOSTUNREACH; kube-proxy drops them and clients hang until their timeout)";
                add(&pp.name.service, &pp.name.port, Warning::new(Rule::NoLocalEndpoint, text), &node.name);
            }
        }
    }
    let all: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let zones: BTreeSet<&str> = nodes.iter().filter_map(|n| n.zone.as_deref()).collect();
    for svc in model.services.values() {
        let same_zone = matches!(hints::mode(svc), HintMode::PreferSameZone { .. });
        if same_zone && svc.internal_policy == Policy::Cluster && zones.len() <= 1 && !nodes.is_empty() {
            let td = svc.traffic_distribution.as_deref().unwrap_or_default();
            let text = match zones.first() {
                Some(z) => format!(
                    "trafficDistribution: {td} in a cluster whose nodes are all in zone {z}: every endpoint is in \
                     the client's zone, so it prefers nothing"
                ),
                None => format!(
                    "trafficDistribution: {td} in a cluster whose nodes have no zone: no zone hints apply"
                ),
            };
            for n in &all {
                add(&svc.key, "", Warning::new(Rule::OneZone, text.clone()), n);
            }
        }
        let asks = matches!(hints::mode(svc), HintMode::PreferSameZone { .. } | HintMode::PreferSameNode);
        if filled.contains(&svc.key) && asks && svc.internal_policy == Policy::Cluster {
            let td = svc.traffic_distribution.as_deref().unwrap_or_default();
            let text = format!(
                "trafficDistribution: {td} is set but its EndpointSlices carry no hints: in a cluster that is the \
                 control plane not writing them (too old, feature gate off, a downgrade) and every node uses all \
                 endpoints; the other findings assume the hints the controller would write"
            );
            for n in &all {
                add(&svc.key, "", Warning::new(Rule::NoHints, text.clone()), n);
            }
        }
    }
    found
        .into_iter()
        .map(|((service, port, rule, message), on)| ClusterFinding {
            all_nodes: on.len() == all.len(),
            service,
            port,
            rule,
            message,
            fix: rule.fix(),
            nodes: on.into_iter().collect(),
        })
        .collect()
}
