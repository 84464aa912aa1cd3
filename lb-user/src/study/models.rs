//! The proxies `tierlb study` compares, one model per behaviour a released proxy has (not per marketing
//! version): each stands for an exact release range, split wherever the behaviour changes inside it, and is
//! written from that proxy's code. What each model stands for, its rule, the errno a client meets when its
//! set is empty and the code it was read from (repository, path, tag or commit, lines; or "unverified" where
//! the code was not read at a tag) are in `catalog` and printed by `tierlb study --models`. A model routes one
//! client node: the endpoints it sends new connections to, and what the client meets when that set is empty
//! (refused at once, or a hang until its timeout).
//!
//! What the models do not cover: Calico's eBPF data plane 3.26-3.30 (zone hints only under the hints
//! annotation, which `felix/bpf/proxy/syncer.go` takes from kube-proxy's `HintsAnnotation()`: the deprecated
//! `topology-aware-hints`, and in the kube-proxy versions that fall back to it `topology-mode`; the kube-proxy
//! code at the tags Calico pins was not read); Cilium's 1.20 development code before #45947, #46339 and
//! #47054; Calico's iptables and nftables data planes, which leave Services to kube-proxy (the kube-proxy
//! model).
mod cilium;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{
    model::{Family, Model, NodeInfo, Policy, Service},
    plan::{self, PortEndpoint},
};

/// Cilium's agent settings the Cilium models depend on (a scenario's `cilium:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct CiliumSettings {
    /// `loadBalancer.serviceTopology` (`--enable-service-topology`): without it Cilium applies no topology
    /// at all. Cilium's default is off; the study assumes it on unless the scenario says otherwise, since
    /// the comparison is about what each version does with topology.
    pub service_topology: bool,
}

impl Default for CiliumSettings {
    fn default() -> Self {
        Self { service_topology: true }
    }
}

/// The proxies compared, in the order results list them. Each variant's rule, range and sources are in
/// `ProxyModel::info` (`catalog.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ProxyModel {
    /// kube-proxy 1.34-1.37 (`CategorizeEndpoints`; checked against each release in `kube_proxy_releases.rs`).
    #[serde(rename = "kube-proxy-1.34-1.37")]
    KubeProxy,
    /// tierlb: kube-proxy's rule as tiers, with passive health.
    #[serde(rename = "tierlb")]
    Tierlb,
    /// Cilium 1.11-1.15: zone hints only for a Service with the topology annotation.
    #[serde(rename = "cilium-1.11-1.15")]
    Cilium111,
    /// Cilium 1.16-1.17: zone hints for every Service whose backends all carry them (cilium#32678).
    #[serde(rename = "cilium-1.16-1.17")]
    Cilium116,
    /// Cilium 1.18.0: PreferClose filters each backend by its zone hints, without the safeguards.
    #[serde(rename = "cilium-1.18.0")]
    Cilium1180,
    /// Cilium 1.18 patch releases with the safeguards (#41116) but before #42708: not-serving endpoints
    /// are still dropped by the parser.
    #[serde(rename = "cilium-1.18.1")]
    Cilium1181,
    /// Cilium 1.18 patch releases with #42708, and 1.19: not-ready backends kept, and seen by the safeguards.
    #[serde(rename = "cilium-1.18.x-1.19")]
    Cilium118x,
    /// Cilium 1.20 as released: PreferSameNode by `nodeName`; the safeguards skip terminating backends only.
    #[serde(rename = "cilium-1.20")]
    Cilium120,
    /// Cilium 1.20 with the open fix #47961: the safeguards also skip a not-ready backend without hints.
    #[serde(rename = "cilium-1.20+47961")]
    Cilium120Fix,
    /// Calico's eBPF data plane 3.31.0-3.31.4: hints ignored.
    #[serde(rename = "calico-ebpf-3.31.0-3.31.4")]
    CalicoEbpf3310,
    /// Calico's eBPF data plane 3.31.5-3.31.7: projectcalico#11859 on kube-proxy 1.33, whose
    /// `PreferSameTrafficDistribution` gate is off: zone hints only.
    #[serde(rename = "calico-ebpf-3.31.5-3.31.7")]
    CalicoEbpf3315,
    /// Calico's eBPF data plane 3.32: node hints, then zone hints, then all, each endpoint judged alone.
    #[serde(rename = "calico-ebpf-3.32")]
    CalicoEbpf332,
}

/// Every model, in the order results list them (kube-proxy first: the reference; then by proxy and release,
/// so that adjacent models differ in one change of behaviour).
pub const MODELS: [ProxyModel; 12] = [
    ProxyModel::KubeProxy,
    ProxyModel::Tierlb,
    ProxyModel::Cilium111,
    ProxyModel::Cilium116,
    ProxyModel::Cilium1180,
    ProxyModel::Cilium1181,
    ProxyModel::Cilium118x,
    ProxyModel::Cilium120,
    ProxyModel::Cilium120Fix,
    ProxyModel::CalicoEbpf3310,
    ProxyModel::CalicoEbpf3315,
    ProxyModel::CalicoEbpf332,
];

impl ProxyModel {
    /// Its name in tables and charts (as its JSON value).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Whether this is one of the Cilium models (their labels name `serviceTopology`).
    pub fn is_cilium(self) -> bool {
        cilium::Rule::of(self).is_some()
    }
}

/// What a client meets when its model's set is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Empty {
    /// connect() fails at once.
    Refused,
    /// The SYN is dropped: the client waits for its timeout.
    Hang,
}

/// How a proxy model routes a client on a node.
pub enum Route {
    /// Uniformly to these endpoints, whatever their health (empty: `empty` says what the client meets).
    Set {
        /// The endpoints new connections go to.
        ips: Vec<IpAddr>,
        /// The outcome when `ips` is empty.
        empty: Empty,
    },
    /// tierlb: through the data path's tiers (node, zone, cluster), with passive health (`health::simulate`).
    Tiers([Vec<IpAddr>; 3]),
}

/// One client node's view of the scenario's one Service port.
pub(super) struct View<'a> {
    pub(super) svc: &'a Service,
    pub(super) eps: Vec<PortEndpoint>,
    pub(super) node: &'a NodeInfo,
}

impl View<'_> {
    /// The node's zone; an absent or empty label is no zone.
    pub(super) fn zone(&self) -> Option<&str> {
        self.node.zone.as_deref().filter(|z| !z.is_empty())
    }

    /// Whether `e`'s zone hints name this node's zone.
    pub(super) fn has_zone_hint(&self, e: &PortEndpoint) -> bool {
        self.zone().is_some_and(|z| e.endpoint.zone_hints().iter().any(|h| **h == *z))
    }

    /// `spec.trafficDistribution`.
    pub(super) fn td(&self) -> Option<&str> {
        self.svc.traffic_distribution.as_deref()
    }
}

pub(super) fn ips(v: &[&PortEndpoint]) -> Vec<IpAddr> {
    v.iter().map(|e| e.addr.ip()).collect()
}

/// How `model` routes a client on `node` in `m` (one Service, one port).
pub fn route(model: ProxyModel, m: &Model, node: &NodeInfo, settings: CiliumSettings) -> Route {
    let svc = m.services.values().next().expect("one Service");
    let port = &svc.ports[0];
    let family = svc.cluster_ips.first().map_or(Family::V4, Family::of);
    let view = View { svc, eps: plan::port_endpoints(m.slices_of(&svc.key), port, family, &node.name), node };
    if let Some(rule) = cilium::Rule::of(model) {
        return cilium::route(rule, &view, settings);
    }
    match model {
        ProxyModel::CalicoEbpf3310 => calico(&view, CalicoRule::HintsIgnored),
        ProxyModel::CalicoEbpf3315 => calico(&view, CalicoRule::ZoneHintsOnly),
        ProxyModel::CalicoEbpf332 => calico(&view, CalicoRule::NodeThenZone),
        _ => {
            let p = plan::port_plan(m, svc, port, family, node);
            let addrs =
                |v: &[std::net::SocketAddr]| v.iter().map(std::net::SocketAddr::ip).collect::<Vec<_>>();
            if model == ProxyModel::Tierlb {
                let [node_tier, zone_tier, cluster_tier] = p.internal.tiers.as_array();
                return Route::Tiers([addrs(node_tier), addrs(zone_tier), addrs(cluster_tier)]);
            }
            let empty = if p.internal.when_empty == Some(plan::WhenEmpty::Drop) {
                Empty::Hang
            } else {
                Empty::Refused
            };
            Route::Set { ips: addrs(&p.internal.endpoints), empty }
        }
    }
}

/// What a Calico release does with hints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CalicoRule {
    /// 3.31.0-3.31.4: `ShouldAppendTopologyAwareEndpoint(nodeZone, "", zoneHints)` is true for every
    /// endpoint (an empty annotation turns hints off).
    HintsIgnored,
    /// 3.31.5-3.31.7: `FilterEpsByTrafficDistribution` on kube-proxy 1.33's endpoints, whose `NodeHints()`
    /// stay empty (the `PreferSameTrafficDistribution` gate is alpha, off): the node step never matches.
    ZoneHintsOnly,
    /// 3.32: node hints, then zone hints, then all.
    NodeThenZone,
}

/// Calico's eBPF data plane: `FilterEpsByTopologyAwareRouting` for `topology-mode: Auto`, else
/// `FilterEpsByTrafficDistribution` (3.31.5+); then `applySvc` writes the ready endpoints (a Local policy:
/// the local ones), and a frontend with no backend fails the connect (EPERM: the hook returns 0).
fn calico(v: &View<'_>, rule: CalicoRule) -> Route {
    let all: Vec<&PortEndpoint> = v.eps.iter().collect();
    let eligible = |e: &&PortEndpoint| e.endpoint.is_ready() || e.endpoint.is_terminating();
    let auto = v.svc.topology_mode_annotation.as_deref().is_some_and(|a| a.eq_ignore_ascii_case("auto"));
    let selected: Vec<&PortEndpoint> = if rule == CalicoRule::HintsIgnored {
        all.iter().copied().filter(eligible).collect()
    } else if auto {
        let judged: Vec<&PortEndpoint> = all.iter().copied().filter(eligible).collect();
        let mine: Vec<&PortEndpoint> = judged.iter().copied().filter(|e| v.has_zone_hint(e)).collect();
        if judged.iter().any(|e| e.endpoint.zone_hints().is_empty()) || mine.is_empty() { all } else { mine }
    } else {
        let node_hints_seen = rule == CalicoRule::NodeThenZone;
        let for_node: Vec<&PortEndpoint> = all
            .iter()
            .copied()
            .filter(eligible)
            .filter(|e| node_hints_seen && e.endpoint.node_hints().iter().any(|h| **h == *v.node.name))
            .collect();
        let for_zone: Vec<&PortEndpoint> =
            all.iter().copied().filter(eligible).filter(|e| v.has_zone_hint(e)).collect();
        if !for_node.is_empty() {
            for_node
        } else if !for_zone.is_empty() {
            for_zone
        } else {
            all
        }
    };
    let local_only = v.svc.internal_policy == Policy::Local;
    let written: Vec<&PortEndpoint> =
        selected.into_iter().filter(|e| e.endpoint.is_ready() && (!local_only || e.local)).collect();
    Route::Set { ips: ips(&written), empty: Empty::Refused }
}
