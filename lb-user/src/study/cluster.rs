//! A cluster's Services as study scenarios (`tierlb study --manifests DIR | --kube`): one scenario per Service,
//! built from the objects as they are, and the what-if phases (`--drain`, `--crash`, `--roll`) written as the
//! phases a hand-made scenario would have.
//!
//! What a scenario takes from the cluster: every node with its zone and allocatable CPU (nodes that only
//! endpoints or client counts name are added, zoned as their endpoints say), the Service's policies,
//! `trafficDistribution` and topology annotations, and its endpoints of the Service's first port in the family
//! of its first ClusterIP: readiness, serving, terminating and the hints the slices carry (a slice set with no
//! hints at all has already been given the controller's, as `plan` and the agent do). The what-if phases keep
//! each remaining endpoint's hints as written: under `trafficDistribution` the controller writes each endpoint
//! its own node and zone, which do not depend on the others; under `topology-mode: Auto` it may reallocate
//! zones as endpoints go, which the phases do not redo.
use std::{collections::BTreeMap, net::IpAddr};

use super::{
    CiliumSettings, Crash, HealthParams, ScChange, ScEndpoint, ScNode, ScPhase, ScService, Scenario,
};
use crate::{
    model::{Family, Model, ObjKey, Policy, Service, ServiceType},
    plan,
};

/// Why a Service has no scenario: no proxy routes its clients.
pub fn unstudied(svc: &Service) -> Option<&'static str> {
    if svc.type_ == ServiceType::ExternalName {
        Some("ExternalName: a DNS alias, no proxy routes it")
    } else if svc.cluster_ips.is_empty() {
        Some("headless: clients resolve the endpoints by DNS, no proxy routes them")
    } else if svc.ports.is_empty() {
        Some("no ports")
    } else if svc.not_proxied.is_some() {
        Some("labelled for another proxy (service.kubernetes.io/service-proxy-name or headless label)")
    } else {
        None
    }
}

/// How long each what-if phase lasts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timings {
    /// A terminating endpoint's grace period (`terminationGracePeriodSeconds`, 30 s by default).
    pub grace_s: f64,
    /// From an endpoint gone (or its replacement created) until the replacement is ready.
    pub startup_s: f64,
    /// From a crash until the readiness probe fails and the EndpointSlice says so (period x threshold).
    pub unseen_s: f64,
}

impl Default for Timings {
    fn default() -> Self {
        Self { grace_s: 30.0, startup_s: 10.0, unseen_s: 30.0 }
    }
}

/// A what-if asked on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WhatIf {
    /// `--drain NODE`: its endpoints terminating, then gone.
    Drain(String),
    /// `--crash POD`: the pod's process crashed, unseen by the control plane, then seen (not ready); `ips`
    /// are its addresses (a dual-stack pod has one per family).
    Crash {
        /// The pod as given (`NS/POD`, `POD` or an IP).
        pod: String,
        /// Its endpoints' addresses.
        ips: Vec<IpAddr>,
    },
    /// `--roll`: the Service's pods replaced one node at a time (a DaemonSet's rolling update).
    Roll,
}

impl WhatIf {
    /// How the study names it: `--drain node-1`.
    pub fn label(&self) -> String {
        match self {
            Self::Drain(node) => format!("--drain {node}"),
            Self::Crash { pod, .. } => format!("--crash {pod}"),
            Self::Roll => "--roll".to_owned(),
        }
    }
}

/// The endpoints of `svc` as a scenario holds them, in the family of its first ClusterIP and for its first
/// port (deduplicated by address, as the proxies do).
fn endpoints(m: &Model, svc: &Service) -> Vec<ScEndpoint> {
    let family = Family::of(&svc.cluster_ips[0]);
    let port = &svc.ports[0];
    plan::port_endpoints(m.slices_of(&svc.key), port, family, "")
        .into_iter()
        .map(|pe| {
            let e = &pe.endpoint;
            let hinted = !e.hints.is_empty();
            ScEndpoint {
                ip: pe.addr.ip(),
                node: e.node_name.as_deref().unwrap_or_default().to_owned(),
                ready: e.is_ready(),
                terminating: e.is_terminating(),
                serving: Some(e.is_serving()),
                crash: Crash::Running,
                // Hints exactly as written (`no_hints`: none at all, so the scenario does not fill them).
                for_nodes: e.hints.for_nodes().map(|v| v.iter().map(ToString::to_string).collect()),
                for_zones: e.hints.for_zones().map(|v| v.iter().map(ToString::to_string).collect()),
                no_hints: !hinted,
            }
        })
        .collect()
}

/// The zone each node's endpoints say it is in, over every slice of `m`: where no Node object can be read,
/// the zone a scenario gives the node (the first one named, by slice key).
pub fn endpoint_zones(m: &Model) -> BTreeMap<String, String> {
    let mut zones = BTreeMap::new();
    for e in m.slices.values().flat_map(|s| &s.endpoints) {
        if let (Some(node), Some(zone)) = (&e.node_name, e.zone.as_ref().filter(|z| !z.is_empty())) {
            zones.entry(node.to_string()).or_insert_with(|| zone.to_string());
        }
    }
    zones
}

/// The what-ifs' phases of one scenario: each what-if's label and how many phases it has, in order.
pub type WhatIfPhases = Vec<(String, usize)>;

/// The scenario of `svc` with `clients` per node (any unit; nodes not named have none; each node's from one
/// client pod, as nothing the cluster's objects say tells how many), the what-ifs' phases,
/// `rps` requests per second and the health and Cilium settings the study assumes; `zones` zones the nodes
/// without a Node object (`endpoint_zones`).
pub fn scenario(
    m: &Model,
    svc: &Service,
    clients: &BTreeMap<String, f64>,
    what_ifs: &[WhatIf],
    timings: Timings,
    rps: f64,
    zones: &BTreeMap<String, String>,
) -> (Scenario, WhatIfPhases) {
    let eps = endpoints(m, svc);
    let mut nodes: BTreeMap<String, ScNode> = m
        .nodes
        .values()
        .map(|n| {
            let cpu = n.allocatable_cpu_millis.unwrap_or(4000);
            let node =
                ScNode { name: n.name.clone(), zone: n.zone.clone(), clients: 0.0, cpu, client_pods: 1 };
            (n.name.clone(), node)
        })
        .collect();
    // Nodes only endpoints or clients name (Nodes not readable): zoned as the endpoints say.
    let names = eps.iter().map(|e| &e.node).filter(|n| !n.is_empty()).chain(clients.keys());
    for name in names {
        nodes.entry(name.clone()).or_insert_with(|| ScNode {
            name: name.clone(),
            zone: zones.get(name).cloned(),
            clients: 0.0,
            cpu: 4000,
            client_pods: 1,
        });
    }
    for (name, share) in clients {
        if let Some(n) = nodes.get_mut(name) {
            n.clients = *share;
        }
    }
    // Each what-if starts from the cluster as it is, not from where the previous one left it.
    let mut phases: Vec<ScPhase> = Vec::new();
    let mut groups = Vec::new();
    for w in what_ifs {
        let mut own = self::phases(w, &eps, timings);
        if let Some(first) = own.first_mut() {
            first.reset = true;
            groups.push((w.label(), own.len()));
        }
        phases.append(&mut own);
    }
    let sc = Scenario {
        name: svc.key.to_string(),
        description: description(svc),
        nodes: nodes.into_values().collect(),
        service: ScService {
            traffic_distribution: svc.traffic_distribution.as_deref().map(str::to_owned),
            internal_traffic_policy: (svc.internal_policy == Policy::Local).then(|| "Local".to_owned()),
            topology_mode: svc.topology_mode_annotation.as_deref().map(str::to_owned),
            topology_aware_hints: svc.topology_aware_hints_annotation.as_deref().map(str::to_owned),
        },
        endpoints: eps,
        phases,
        requests_per_second: rps,
        health: HealthParams::default(),
        cilium: CiliumSettings::default(),
    };
    (sc, groups)
}

/// What routes the Service: its policy and topology fields, as one line.
fn description(svc: &Service) -> String {
    let mut parts = vec![format!("internalTrafficPolicy {}", svc.internal_policy.as_str())];
    if let Some(td) = &svc.traffic_distribution {
        parts.push(format!("trafficDistribution {td}"));
    }
    if let Some(a) = &svc.topology_mode_annotation {
        parts.push(format!("topology-mode {a}"));
    }
    if let Some(a) = &svc.topology_aware_hints_annotation {
        parts.push(format!("topology-aware-hints {a}"));
    }
    let port = &svc.ports[0];
    let port_name = if port.name.is_empty() { String::new() } else { format!(" ({})", port.name) };
    parts.push(format!("port {}/{}{port_name}", port.port, port.protocol.as_str()));
    parts.join(", ")
}

/// The same changes for each of `ips`.
fn set(ips: impl IntoIterator<Item = IpAddr>, change: impl Fn(IpAddr) -> ScChange) -> Vec<ScChange> {
    ips.into_iter().map(change).collect()
}

/// `e` terminating: not ready; serving as it was (a pod passing its probe keeps serving through its grace
/// period, one that was not serving stays so).
fn terminating(e: &ScEndpoint) -> ScChange {
    let serving = e.serving.unwrap_or(e.ready || e.terminating);
    ScChange { ready: Some(false), terminating: Some(true), serving: Some(serving), ..ScChange::new(e.ip) }
}

fn not_ready(ip: IpAddr) -> ScChange {
    ScChange { ready: Some(false), terminating: Some(false), serving: Some(false), ..ScChange::new(ip) }
}

/// Back to the endpoint as the cluster has it.
fn restored(e: &ScEndpoint) -> ScChange {
    ScChange {
        ready: Some(e.ready),
        terminating: Some(e.terminating),
        serving: e.serving,
        crash: Some(Crash::Running),
        ..ScChange::new(e.ip)
    }
}

/// The phases of one what-if on `eps` (none when it does not touch this Service).
pub fn phases(what_if: &WhatIf, eps: &[ScEndpoint], t: Timings) -> Vec<ScPhase> {
    let phase = |name: String, duration: f64, set: Vec<ScChange>| ScPhase {
        name,
        duration: Some(duration),
        reset: false,
        set,
    };
    match what_if {
        WhatIf::Drain(node) => {
            let on: Vec<&ScEndpoint> = eps.iter().filter(|e| e.node == *node).collect();
            if on.is_empty() {
                return Vec::new();
            }
            vec![
                phase(
                    format!("drain {node}: its endpoints terminating"),
                    t.grace_s,
                    on.iter().map(|e| terminating(e)).collect(),
                ),
                phase(
                    format!("drain {node}: its endpoints gone"),
                    t.startup_s,
                    set(on.iter().map(|e| e.ip), |ip| ScChange { gone: true, ..ScChange::new(ip) }),
                ),
            ]
        }
        WhatIf::Crash { pod, ips } => {
            let hit: Vec<IpAddr> = eps.iter().map(|e| e.ip).filter(|ip| ips.contains(ip)).collect();
            if hit.is_empty() {
                return Vec::new();
            }
            vec![
                phase(
                    format!("{pod} crashed, unseen by the control plane"),
                    t.unseen_s,
                    set(hit.clone(), |ip| ScChange { crash: Some(Crash::Process), ..ScChange::new(ip) }),
                ),
                phase(format!("{pod} not ready (seen), restarting"), t.startup_s, set(hit, not_ready)),
            ]
        }
        WhatIf::Roll => {
            let mut nodes: Vec<&str> =
                eps.iter().map(|e| e.node.as_str()).filter(|n| !n.is_empty()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            let mut out = Vec::new();
            let mut previous: Vec<&ScEndpoint> = Vec::new();
            for node in nodes {
                let on: Vec<&ScEndpoint> = eps.iter().filter(|e| e.node == node).collect();
                let mut first: Vec<ScChange> = previous.iter().map(|e| restored(e)).collect();
                first.extend(on.iter().map(|e| terminating(e)));
                out.push(phase(format!("roll {node}: old pod terminating"), t.grace_s, first));
                out.push(phase(
                    format!("roll {node}: old pod gone, replacement not ready"),
                    t.startup_s,
                    set(on.iter().map(|e| e.ip), not_ready),
                ));
                previous = on;
            }
            out
        }
    }
}

/// The Service `text` names (`NAMESPACE/NAME`) in `m` (read from `origin`), or why none.
pub fn find_service<'a>(m: &'a Model, text: &str, origin: &str) -> Result<&'a Service, String> {
    let (ns, name) =
        text.split_once('/').ok_or_else(|| format!("--service {text:?}: write it NAMESPACE/NAME"))?;
    m.services.get(&ObjKey::new(ns, name)).map(|s| &**s).ok_or_else(|| {
        format!(
            "--service {text}: no such Service in {origin} (check the name; --namespace reads one namespace)"
        )
    })
}
