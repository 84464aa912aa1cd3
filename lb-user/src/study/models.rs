//! The proxies `tierlb study` compares, one model per behaviour a released proxy has, each written from that
//! proxy's own code (the repository path and the pull request or issue are in each model's doc comment and
//! in `tierlb study --models`). A model routes one client node: the endpoints it sends new connections to,
//! and what the client meets when that set is empty (refused at once, or a hang until its timeout).
//!
//! What the models do not cover: Cilium 1.18.0 lost the zone safeguards (a PreferClose Service with no
//! endpoint for the zone refused connects, cilium#41022; restored by #41024 and the 1.18 backport #41116);
//! Cilium's 1.20 development code before #45947, #46339 and #47054 pinned PreferSameNode clients to a
//! terminating or not-ready local pod (its connects failed); Calico's eBPF data plane 3.26-3.30 read zone
//! hints only with the deprecated `topology-aware-hints` annotation and 3.31.0-3.31.4 ignored hints
//! (`felix/bpf/proxy/syncer.go` passed no annotation); Calico's iptables and nftables data planes leave
//! Services to kube-proxy (the kube-proxy model).
use std::{fmt::Write as _, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::{
    hints,
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

/// The proxies compared, in the order results list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ProxyModel {
    /// kube-proxy 1.35 (`CategorizeEndpoints`, kubernetes/kubernetes `pkg/proxy/topology.go`; PreferSameNode
    /// from KEP-3015, kubernetes#130844): node hints if every ready endpoint has some and one names this
    /// node, else zone hints under the same rule, else all ready (then serving and terminating) endpoints; a
    /// Local policy uses the local ready (else serving and terminating) endpoints. Empty: no endpoint anywhere
    /// is REJECTed (refused); a Local policy with endpoints elsewhere DROPs (hang).
    #[serde(rename = "kube-proxy-1.35")]
    KubeProxy,
    /// tierlb: kube-proxy's rule as tiers (node, zone, cluster) the data path falls through when passive
    /// health holds a backend down (`lb_common::first_live_tier`, `study::health`). Empty: connect() fails at
    /// once (this repository's `lb-ebpf`, `bpf_set_retval`).
    #[serde(rename = "tierlb")]
    Tierlb,
    /// Cilium 1.11-1.17 (`pkg/k8s/service_cache.go` `filterEndpoints`, cilium#17929; PreferClose read since
    /// cilium#32678): with `serviceTopology`, zone hints only for a Service with a topology annotation (not
    /// "" or "disabled") or `trafficDistribution: PreferClose`, no Local policy and a zoned node; if any
    /// ready or terminating endpoint lacks zone hints, or none names the zone, all of them. PreferSameZone and
    /// PreferSameNode are routed cluster-wide; `forNodes` is never read. Active (ready) backends first, the
    /// terminating ones only when none is active. Empty: connect() fails with EHOSTUNREACH (`bpf/bpf_sock.c`
    /// `__sock4_xlate_fwd`: `svc->count == 0`), so refused, never a hang.
    #[serde(rename = "cilium-1.17")]
    Cilium117,
    /// Cilium 1.18-1.19 (`pkg/loadbalancer/writer/writer.go` `DefaultSelectBackends`, cilium#38277, safeguards
    /// from #41024 and #41116; `pkg/loadbalancer/reflectors/conversions.go` `isTopologyAware`): 1.17's rule,
    /// but the missing-hints safeguard looks at every backend the agent keeps, not-ready ones included
    /// (kept in maintenance since #42170, in 1.18 by #42708), so a starting pod turns zone routing off.
    /// PreferSameNode is routed cluster-wide (cilium#44060). Empty: EHOSTUNREACH (refused).
    #[serde(rename = "cilium-1.18")]
    Cilium118,
    /// Cilium 1.20 (`DefaultSelectBackends` with cilium#44771, fixed by #45215, #45947, #46339, #47054):
    /// PreferSameNode prefers the ready backends whose `nodeName` is this node (no hints read), else all
    /// backends cluster-wide (zone hints are used only for PreferClose and PreferSameZone); PreferClose and
    /// PreferSameZone use zone hints with the safeguards judged on ready backends only. Empty: EHOSTUNREACH.
    #[serde(rename = "cilium-1.20")]
    Cilium120,
    /// Calico's eBPF data plane 3.31.5 and 3.32 (`felix/bpf/proxy/topology.go`, projectcalico#11751, backport
    /// #11859): `topology-mode: Auto` uses zone hints with the safeguards; otherwise, for every Service, the
    /// ready or terminating endpoints whose node hints name this node, else those whose zone hints name its
    /// zone, else all, each endpoint judged alone (no all-or-nothing rule). Only ready endpoints are written
    /// (`syncer.go` `updateService`); a Local policy keeps the local ones. Empty: `NAT_NO_BACKEND`, connect()
    /// fails (`bpf-gpl/connect.h`), refused.
    #[serde(rename = "calico-ebpf-3.32")]
    CalicoEbpf332,
}

/// Every model, in the order results list them (kube-proxy first: the reference).
pub const MODELS: [ProxyModel; 6] = [
    ProxyModel::KubeProxy,
    ProxyModel::Tierlb,
    ProxyModel::Cilium117,
    ProxyModel::Cilium118,
    ProxyModel::Cilium120,
    ProxyModel::CalicoEbpf332,
];

/// What `tierlb study --models` says about a model (the same facts as its doc comment).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModelInfo {
    /// Its name in tables, charts and JSON.
    pub name: &'static str,
    /// The proxy and the versions it stands for.
    pub stands_for: &'static str,
    /// How it picks a client's endpoints.
    pub rule: &'static str,
    /// What a client meets when that set is empty.
    pub when_empty: &'static str,
    /// Where the rule was read.
    pub source: &'static str,
}

impl ProxyModel {
    /// Its name in tables and charts (as its JSON value).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The model's rule, empty-set outcome and source.
    pub fn info(self) -> ModelInfo {
        match self {
            Self::KubeProxy => ModelInfo {
                name: "kube-proxy-1.35",
                stands_for: "kube-proxy 1.35 (iptables, nftables, ipvs)",
                rule: "node hints if every ready endpoint has forNodes and one names this node, else zone hints \
                       under the same rule, else all ready endpoints (then serving+terminating ones); a Local \
                       policy uses the local ready (else serving+terminating) endpoints",
                when_empty: "refused (REJECT) when the Service has no usable endpoint; hang (DROP) under a Local \
                             policy with endpoints elsewhere",
                source: "kubernetes/kubernetes pkg/proxy/topology.go CategorizeEndpoints; KEP-3015, \
                         kubernetes#130844",
            },
            Self::Tierlb => ModelInfo {
                name: "tierlb",
                stands_for: "tierlb (this repository), with passive health",
                rule: "kube-proxy's rule as tiers node, zone, cluster; a backend held down by passive health \
                       (K failed connects from the node) moves the node's connects to the next live backend or \
                       tier",
                when_empty: "refused: connect() fails at once in both of kube-proxy's cases",
                source: "lb-user/src/plan.rs, lb-common first_live_tier, lb-ebpf/src/health.rs",
            },
            Self::Cilium117 => ModelInfo {
                name: "cilium-1.17",
                stands_for: "Cilium 1.11-1.17 kube-proxy replacement (socket LB)",
                rule: "with serviceTopology: zone hints only for a topology annotation or trafficDistribution \
                       PreferClose, no Local policy, a zoned node; all ready and terminating endpoints if one \
                       lacks zone hints or none names the zone; PreferSameZone/PreferSameNode cluster-wide; \
                       forNodes never read; ready backends first, terminating ones if none is ready",
                when_empty: "refused: connect() fails with EHOSTUNREACH (svc->count == 0), never a hang",
                source: "cilium/cilium pkg/k8s/service_cache.go filterEndpoints (cilium#17929, PreferClose \
                         cilium#32678); bpf/bpf_sock.c __sock4_xlate_fwd",
            },
            Self::Cilium118 => ModelInfo {
                name: "cilium-1.18",
                stands_for: "Cilium 1.18.1-1.19 kube-proxy replacement (socket LB)",
                rule: "as cilium-1.17, but the missing-hints safeguard sees every backend kept, not-ready ones \
                       included (a starting pod turns zone routing off); PreferSameNode cluster-wide \
                       (cilium#44060)",
                when_empty: "refused: EHOSTUNREACH",
                source: "cilium/cilium pkg/loadbalancer/writer/writer.go DefaultSelectBackends (cilium#38277, \
                         safeguards #41024/#41116, lost in 1.18.0: cilium#41022), \
                         pkg/loadbalancer/reflectors/conversions.go isTopologyAware; not-ready kept since \
                         #42170/#42708",
            },
            Self::Cilium120 => ModelInfo {
                name: "cilium-1.20",
                stands_for: "Cilium 1.20 kube-proxy replacement (socket LB)",
                rule: "with serviceTopology: PreferSameNode prefers ready backends whose nodeName is this node \
                       (no hints read), else all backends cluster-wide; PreferClose/PreferSameZone use zone \
                       hints with the safeguards judged on ready backends only",
                when_empty: "refused: EHOSTUNREACH",
                source: "cilium/cilium pkg/loadbalancer/writer/writer.go DefaultSelectBackends: cilium#44771, \
                         fixes #45215, #45947, #46339, #47054",
            },
            Self::CalicoEbpf332 => ModelInfo {
                name: "calico-ebpf-3.32",
                stands_for: "Calico eBPF data plane 3.31.5 and 3.32",
                rule: "topology-mode Auto: zone hints with the safeguards; else (any Service) the ready or \
                       terminating endpoints whose forNodes names this node, else whose forZones names its \
                       zone, else all, each endpoint judged alone; only ready endpoints are written; a Local \
                       policy keeps the local ones",
                when_empty: "refused: NAT_NO_BACKEND fails connect()",
                source: "projectcalico/calico felix/bpf/proxy/topology.go, syncer.go updateService \
                         (projectcalico#11751, backport #11859), felix/bpf-gpl/nat_lookup.h, connect.h",
            },
        }
    }
}

/// `tierlb study --models`: each model's name, what it stands for, rule, empty-set outcome and source.
pub fn models_text() -> String {
    let mut out = String::new();
    for m in MODELS {
        let i = m.info();
        let _ = writeln!(
            out,
            "{}: {}\n  rule: {}\n  empty set: {}\n  source: {}",
            i.name, i.stands_for, i.rule, i.when_empty, i.source
        );
    }
    out
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
struct View<'a> {
    svc: &'a Service,
    eps: Vec<PortEndpoint>,
    node: &'a NodeInfo,
}

impl View<'_> {
    fn zone(&self) -> Option<&str> {
        self.node.zone.as_deref().filter(|z| !z.is_empty())
    }

    fn has_zone_hint(&self, e: &PortEndpoint) -> bool {
        self.zone().is_some_and(|z| e.endpoint.zone_hints().iter().any(|h| h == z))
    }

    fn td(&self) -> Option<&str> {
        self.svc.traffic_distribution.as_deref()
    }
}

fn ips(v: &[&PortEndpoint]) -> Vec<IpAddr> {
    v.iter().map(|e| e.addr.ip()).collect()
}

/// How `model` routes a client on `node` in `m` (one Service, one port).
pub fn route(model: ProxyModel, m: &Model, node: &NodeInfo, cilium: CiliumSettings) -> Route {
    let svc = m.services.values().next().expect("one Service");
    let port = &svc.ports[0];
    let view =
        View { svc, eps: plan::port_endpoints(m.slices_of(&svc.key), port, Family::V4, &node.name), node };
    match model {
        ProxyModel::KubeProxy | ProxyModel::Tierlb => {
            let p = plan::port_plan(m, svc, port, Family::V4, node);
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
        ProxyModel::Cilium117 | ProxyModel::Cilium118 | ProxyModel::Cilium120 => {
            cilium_pick(&cilium_select(model, &view, cilium))
        }
        ProxyModel::CalicoEbpf332 => calico(&view),
    }
}

/// Cilium's socket LB on the frontend's selected backends: the active (ready) ones, else the terminating
/// ones (a terminating backend serves new connections only when no active one is left); none: `svc->count`
/// is 0 and connect() fails with EHOSTUNREACH.
fn cilium_pick(selected: &[&PortEndpoint]) -> Route {
    let active: Vec<&PortEndpoint> = selected.iter().copied().filter(|e| e.endpoint.is_ready()).collect();
    let chosen = if active.is_empty() {
        selected.iter().copied().filter(|e| e.endpoint.is_terminating() && e.endpoint.is_serving()).collect()
    } else {
        active
    };
    Route::Set { ips: ips(&chosen), empty: Empty::Refused }
}

/// The backends a Cilium version selects for the node's frontend, before the active/terminating choice.
fn cilium_select<'a>(model: ProxyModel, v: &'a View<'_>, cilium: CiliumSettings) -> Vec<&'a PortEndpoint> {
    // ≤1.17 never learns of a not-ready, not-terminating endpoint (the service cache skips it); 1.18+ keeps
    // it (maintenance) and the safeguards see it until 1.20 judges on active backends only.
    let kept: Vec<&PortEndpoint> = v
        .eps
        .iter()
        .filter(|e| model != ProxyModel::Cilium117 || e.endpoint.is_ready() || e.endpoint.is_terminating())
        .collect();
    if v.svc.internal_policy == Policy::Local {
        // The frontend holds the node's own backends only; topology is never applied on top (1.17
        // `filterEndpoints`, 1.18+ `isTopologyAware` is not set for ITP Local, and 1.20's same-node choice
        // picks the same local backends).
        return kept.into_iter().filter(|e| e.local).collect();
    }
    if !cilium.service_topology {
        return kept;
    }
    let annotated = {
        let a =
            v.svc.topology_aware_hints_annotation.as_deref().or(v.svc.topology_mode_annotation.as_deref());
        a.is_some_and(|a| !matches!(a, "" | "disabled" | "Disabled"))
    };
    let td = v.td();
    let zone_mode = annotated
        || td == Some(hints::PREFER_CLOSE)
        || (model == ProxyModel::Cilium120 && td == Some(hints::PREFER_SAME_ZONE));
    if model == ProxyModel::Cilium120 && !annotated && td == Some(hints::PREFER_SAME_NODE) {
        // `nodeName`, not `forNodes`; with no ready local backend, cluster-wide (no zone step).
        let local: Vec<&PortEndpoint> =
            kept.iter().copied().filter(|e| e.local && e.endpoint.is_ready()).collect();
        return if local.is_empty() { kept } else { local };
    }
    if !zone_mode || v.zone().is_none() {
        return kept;
    }
    // The safeguards: 1.20 judges on active backends only (#45947, #47054); before, every backend kept.
    let judged: Vec<&PortEndpoint> =
        kept.iter().copied().filter(|e| model != ProxyModel::Cilium120 || e.endpoint.is_ready()).collect();
    let missing = judged.iter().any(|e| e.endpoint.zone_hints().is_empty());
    let found = judged.iter().any(|e| v.has_zone_hint(e));
    if missing || !found {
        return kept;
    }
    kept.into_iter().filter(|e| v.has_zone_hint(e)).collect()
}

/// Calico's eBPF data plane: `FilterEpsByTopologyAwareRouting` for `topology-mode: Auto`, else
/// `FilterEpsByTrafficDistribution`; then `updateService` writes the ready endpoints (a Local policy: the
/// local ones), and a frontend with no backend fails the connect.
fn calico(v: &View<'_>) -> Route {
    let all: Vec<&PortEndpoint> = v.eps.iter().collect();
    let eligible = |e: &&PortEndpoint| e.endpoint.is_ready() || e.endpoint.is_terminating();
    let auto = v.svc.topology_mode_annotation.as_deref().is_some_and(|a| a.eq_ignore_ascii_case("auto"));
    let selected: Vec<&PortEndpoint> = if auto {
        let judged: Vec<&PortEndpoint> = all.iter().copied().filter(eligible).collect();
        let mine: Vec<&PortEndpoint> = judged.iter().copied().filter(|e| v.has_zone_hint(e)).collect();
        if judged.iter().any(|e| e.endpoint.zone_hints().is_empty()) || mine.is_empty() { all } else { mine }
    } else {
        let for_node: Vec<&PortEndpoint> = all
            .iter()
            .copied()
            .filter(eligible)
            .filter(|e| e.endpoint.node_hints().contains(&v.node.name))
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
