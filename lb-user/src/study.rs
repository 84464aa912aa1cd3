//! `tierlb study`: how different service proxies route the same cluster. A scenario describes nodes (zone,
//! share of clients), one Service and its endpoints (readiness, hints, or "what the controller writes"), and
//! optional phases (a rollout step, a crashed pod the control plane has not noticed yet). For each proxy
//! model the simulator computes each endpoint's share of requests, cross-node and cross-zone fractions, and
//! the requests that fail fast or hang. tierlb's model includes its passive health (`health`), decided by the
//! kernel's own rule (`lb_common::Health`) per client node and client pod: a crashed endpoint costs each client
//! node that sends to it K failed connects before the node falls back (from one pod, held for that pod, or
//! from the quorum of its pods, held for all), and a failed trial each time a hold ends (with the quorum 2 and
//! two pods or more, another pod's connect too); with a phase's `duration` those are counted against the
//! requests the phase sends, without one the shares are the steady state after detection.
mod catalog;
pub mod clients;
pub mod cluster;
pub mod health;
pub mod models;
pub mod survey;
mod table;

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::{
    hints,
    model::{
        AddressType, Conditions, Endpoint, EndpointSlice, Hints, Model, Node, NodeInfo, ObjKey, Policy,
        Protocol, Service, ServicePort, SlicePort, intern, intern_list,
    },
};
pub use catalog::{CILIUM_SETTING, ModelInfo, models_text};
pub use health::{Crash, Detection, HealthParams};
pub use models::{CiliumSettings, MODELS, ProxyModel};
use models::{Empty, Route};
pub use survey::cluster_table;
pub use table::{markdown_table, table};

/// A study scenario, as its YAML file reads (examples/study/).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Names the scenario in the table and chart.
    pub name: String,
    /// One line on what the scenario shows.
    #[serde(default)]
    pub description: String,
    /// The cluster's nodes, where the clients are.
    pub nodes: Vec<ScNode>,
    /// The one Service's routing fields.
    pub service: ScService,
    /// The Service's endpoints at the start.
    pub endpoints: Vec<ScEndpoint>,
    /// Variations applied one after the other (each replaces the endpoints' listed fields); each is studied
    /// on its own. Without phases, the scenario is one phase.
    #[serde(default)]
    pub phases: Vec<ScPhase>,
    /// Requests per second from all clients together (split by the nodes' `clients`): what a phase's
    /// `duration` turns into a number of requests, and how fast a node's connects reach a crashed endpoint.
    #[serde(default = "default_rate", rename = "requestsPerSecond")]
    pub requests_per_second: f64,
    /// tierlb's passive health settings (the agent's defaults unless given).
    #[serde(default)]
    pub health: HealthParams,
    /// Cilium's settings the Cilium models depend on (`serviceTopology` on unless given).
    #[serde(default)]
    pub cilium: CiliumSettings,
}

fn default_rate() -> f64 {
    100.0
}

/// A node of a scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScNode {
    /// The node name endpoints refer to.
    pub name: String,
    /// Its `topology.kubernetes.io/zone` (none: unlabelled).
    #[serde(default)]
    pub zone: Option<String>,
    /// Share of the clients on this node (any unit; normalised).
    pub clients: f64,
    /// Allocatable CPU in millicores, which weighs the zone in Auto mode's allocation (default 4000).
    #[serde(default = "default_cpu")]
    pub cpu: u64,
    /// The client pods (network namespaces) this node's requests come from, in equal parts (YAML `clientPods`,
    /// default 1): passive health's quorum counts them (`health.clients`).
    #[serde(default = "one_pod", rename = "clientPods", deserialize_with = "client_pods")]
    pub client_pods: u32,
}

fn default_cpu() -> u64 {
    4000
}

fn one_pod() -> u32 {
    1
}

/// A node's client pods: one or more (a node without clients has a `clients` share of 0).
fn client_pods<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("0: a node's requests come from one client pod or more"));
    }
    Ok(n)
}

/// A scenario's Service: only what changes routing (one port, one ClusterIP, made up).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScService {
    /// `spec.trafficDistribution`.
    #[serde(default)]
    pub traffic_distribution: Option<String>,
    /// `spec.internalTrafficPolicy` ("Local", else Cluster).
    #[serde(default)]
    pub internal_traffic_policy: Option<String>,
    /// The `service.kubernetes.io/topology-mode` annotation.
    #[serde(default)]
    pub topology_mode: Option<String>,
    /// The deprecated `service.kubernetes.io/topology-aware-hints` annotation (wins over `topology-mode`).
    #[serde(default)]
    pub topology_aware_hints: Option<String>,
}

/// An endpoint of a scenario's Service.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScEndpoint {
    /// The pod IP, which names the endpoint in the results.
    pub ip: IpAddr,
    /// The node it runs on (its zone is the node's).
    pub node: String,
    /// `conditions.ready` (default true); serving is ready or terminating.
    #[serde(default = "yes")]
    pub ready: bool,
    /// `conditions.terminating`.
    #[serde(default)]
    pub terminating: bool,
    /// `conditions.serving`; absent: ready or terminating (a terminating pod still passing its probe).
    #[serde(default)]
    pub serving: Option<bool>,
    /// The pod crashed but the EndpointSlice does not say so yet: `process` (connects refused) or `node`
    /// (connects hang); `none` by default. A proxy that sends to it loses those requests; tierlb's passive
    /// health learns it per node after K failed connects.
    #[serde(default)]
    pub crash: Crash,
    /// Hints as written; absent: what the EndpointSlice controller writes for the Service.
    #[serde(default)]
    pub for_nodes: Option<Vec<String>>,
    /// Zone hints as written; absent as for `for_nodes`.
    #[serde(default)]
    pub for_zones: Option<Vec<String>>,
    /// `true`: no hints at all (an old controller, or the gate off).
    #[serde(default)]
    pub no_hints: bool,
}

fn yes() -> bool {
    true
}

impl ScEndpoint {
    /// A ready endpoint on `node`, running, with the controller's hints.
    pub fn new(ip: IpAddr, node: &str) -> Self {
        Self {
            ip,
            node: node.to_owned(),
            ready: true,
            terminating: false,
            serving: None,
            crash: Crash::Running,
            for_nodes: None,
            for_zones: None,
            no_hints: false,
        }
    }
}

/// A step after the initial state, studied on its own.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScPhase {
    /// Names the phase in the table and chart.
    pub name: String,
    /// How long the phase lasts (a duration: `30s`, `2m`), e.g. until a crashed pod's readiness probe fails
    /// and the EndpointSlice says so. With it, tierlb's failed connects before detection and its failed trials
    /// are counted against the phase's requests; without it the shares are the steady state after detection.
    #[serde(default, deserialize_with = "opt_duration_s")]
    pub duration: Option<f64>,
    /// Start again from the scenario's `endpoints` before this phase's changes (a what-if of its own, not a
    /// step after the previous phases).
    #[serde(default)]
    pub reset: bool,
    /// Endpoint changes by IP.
    #[serde(default)]
    pub set: Vec<ScChange>,
}

impl ScChange {
    /// A change to `ip` that changes nothing yet.
    pub fn new(ip: IpAddr) -> Self {
        Self {
            ip,
            ready: None,
            terminating: None,
            serving: None,
            gone: false,
            crash: None,
            for_nodes: None,
            for_zones: None,
        }
    }
}

fn opt_duration_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    health::duration_s(d).map(Some)
}

/// A phase's change to one endpoint: each field given replaces the endpoint's.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScChange {
    /// The endpoint changed.
    pub ip: IpAddr,
    /// New [`ScEndpoint::ready`].
    #[serde(default)]
    pub ready: Option<bool>,
    /// New [`ScEndpoint::terminating`].
    #[serde(default)]
    pub terminating: Option<bool>,
    /// New [`ScEndpoint::serving`].
    #[serde(default)]
    pub serving: Option<bool>,
    /// The endpoint leaves the EndpointSlice (the other fields are ignored).
    #[serde(default)]
    pub gone: bool,
    /// New [`ScEndpoint::crash`].
    #[serde(default)]
    pub crash: Option<Crash>,
    /// New node hints.
    #[serde(default)]
    pub for_nodes: Option<Vec<String>>,
    /// New zone hints.
    #[serde(default)]
    pub for_zones: Option<Vec<String>>,
}

/// How one proxy model routes one phase; the shares, failed and hang add up to 1.
#[derive(Clone, Debug, Serialize)]
pub struct ModelResult {
    /// The proxy model.
    pub model: ProxyModel,
    /// Its name with what the claim depends on (tierlb: K and the quorum).
    pub label: String,
    /// Share of all requests per endpoint IP.
    pub shares: BTreeMap<String, f64>,
    /// Share of all requests that reach an endpoint on another node than the client's.
    pub cross_node: f64,
    /// Share of all requests that reach an endpoint in another zone than the client's.
    pub cross_zone: f64,
    /// Requests that fail at once (refused).
    pub failed: f64,
    /// Requests that hang until the client's timeout (dropped, or sent to a dead node).
    pub hang: f64,
    /// tierlb: what passive health cost on each client node, per crashed endpoint it sent to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub detections: Vec<Detection>,
}

/// Every model's result for one phase.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// "initial", or the phase's name.
    pub phase: String,
    /// The phase's duration in seconds, if it has one.
    pub duration_s: Option<f64>,
    /// The requests the phase sends (`requestsPerSecond` times the duration), if it has a duration.
    pub requests: Option<f64>,
    /// One result per model, in the order of `MODELS`.
    pub models: Vec<ModelResult>,
}

/// A whole study: what `tierlb study` prints (as a table or JSON) and charts.
#[derive(Clone, Debug, Serialize)]
pub struct StudyResult {
    /// The scenario's name.
    pub scenario: String,
    /// The scenario's description.
    pub description: String,
    /// Requests per second from all clients.
    pub requests_per_second: f64,
    /// tierlb's passive health settings the study assumed.
    pub health: HealthParams,
    /// The initial state, then each phase in order.
    pub phases: Vec<PhaseResult>,
}

const VIP: &str = "10.96.0.99";
const VIP6: &str = "fd00:96::99";

/// The scenario's cluster as a model (hints filled in as the controller would, where asked).
pub fn model_of(sc: &Scenario, eps: &[ScEndpoint]) -> Model {
    let mut m = Model::default();
    for n in &sc.nodes {
        m.nodes.insert(
            n.name.clone(),
            Node {
                name: n.name.clone(),
                zone: n.zone.clone(),
                allocatable_cpu_millis: Some(n.cpu),
                cpu_share_excluded: false,
                addresses: Vec::new(),
                not_eligible: None,
            },
        );
    }
    let key = ObjKey::new("study", "svc");
    // The endpoints' family (a cluster's IPv6 Service); an empty or IPv4 one is studied as IPv4.
    let v6 = eps.first().is_some_and(|e| e.ip.is_ipv6());
    let svc = Service {
        key: key.clone(),
        cluster_ips: [if v6 { VIP6 } else { VIP }.parse().expect("valid")].into(),
        ports: [ServicePort { name: String::new(), port: 80, protocol: Protocol::Tcp, node_port: None }]
            .into(),
        internal_policy: if sc.service.internal_traffic_policy.as_deref() == Some("Local") {
            Policy::Local
        } else {
            Policy::Cluster
        },
        traffic_distribution: sc.service.traffic_distribution.as_deref().map(intern),
        topology_mode_annotation: sc.service.topology_mode.as_deref().map(intern),
        topology_aware_hints_annotation: sc.service.topology_aware_hints.as_deref().map(intern),
        ..Service::default()
    };
    let zone_of = |node: &str| sc.nodes.iter().find(|n| n.name == node).and_then(|n| n.zone.clone());
    let endpoint = |e: &ScEndpoint| Endpoint {
        address: Some(e.ip),
        conditions: Conditions {
            ready: Some(e.ready),
            serving: Some(e.serving.unwrap_or(e.ready || e.terminating)),
            terminating: Some(e.terminating),
        },
        node_name: Some(intern(&e.node)),
        zone: zone_of(&e.node).as_deref().map(intern),
        hints: Hints::new(
            e.for_nodes.as_ref().map(|v| intern_list(v.iter().map(|n| intern(n)).collect())),
            e.for_zones.as_ref().map(|v| intern_list(v.iter().map(|z| intern(z)).collect())),
        ),
    };
    let mut slice = EndpointSlice {
        key: ObjKey::new("study", "svc-1"),
        service_name: Some("svc".into()),
        address_type: if v6 { AddressType::IPv6 } else { AddressType::IPv4 },
        ports: vec![SlicePort { name: String::new(), port: 8080, protocol: Protocol::Tcp }].into(),
        endpoints: eps.iter().map(endpoint).collect(),
        not_proxied: None,
        last_change_trigger_time: None,
    };
    // Endpoints without explicit hints get the controller's (then the explicit ones are put back).
    let mut controller = vec![slice.clone()];
    hints::apply(&m, &svc, &mut controller);
    for (i, e) in eps.iter().enumerate() {
        if e.no_hints {
            slice.endpoints[i].hints = Hints::default();
        } else if e.for_nodes.is_none() && e.for_zones.is_none() {
            slice.endpoints[i].hints.clone_from(&controller[0].endpoints[i].hints);
        }
    }
    m.slices.insert(slice.key.clone(), slice);
    m.services.insert(key, svc.into());
    m
}

fn apply_phase(eps: &mut Vec<ScEndpoint>, start: &[ScEndpoint], phase: &ScPhase) {
    if phase.reset {
        *eps = start.to_vec();
    }
    for c in &phase.set {
        if c.gone {
            eps.retain(|e| e.ip != c.ip);
            continue;
        }
        if let Some(e) = eps.iter_mut().find(|e| e.ip == c.ip) {
            if let Some(v) = c.ready {
                e.ready = v;
            }
            if let Some(v) = c.terminating {
                e.terminating = v;
            }
            if c.serving.is_some() {
                e.serving = c.serving;
            }
            if let Some(v) = c.crash {
                e.crash = v;
            }
            if c.for_nodes.is_some() {
                e.for_nodes.clone_from(&c.for_nodes);
            }
            if c.for_zones.is_some() {
                e.for_zones.clone_from(&c.for_zones);
            }
        }
    }
}

/// One node's flow under a model that sends uniformly to `ips` (crashed endpoints lose their requests).
fn set_flow(ips: &[IpAddr], empty: Empty, crashed: &BTreeMap<IpAddr, Crash>) -> health::Flow {
    let mut f = health::Flow::default();
    if ips.is_empty() {
        match empty {
            Empty::Hang => f.hang = 1.0,
            Empty::Refused => f.failed = 1.0,
        }
    }
    for ip in ips {
        f.send(*ip, crashed.get(ip).copied().unwrap_or_default(), 1.0 / ips.len() as f64);
    }
    f
}

/// A model's name in the table and chart, with what its figures depend on: tierlb's K and quorum, Cilium's
/// `serviceTopology`.
fn label(model: ProxyModel, sc: &Scenario) -> String {
    if model == ProxyModel::Tierlb {
        sc.health.label()
    } else if model.is_cilium() {
        // Words short enough to wrap under a chart's bar ("serviceTopology=true" would not).
        let on = if sc.cilium.service_topology { "on" } else { "off" };
        format!("{} (service topology {on})", model.name())
    } else {
        model.name().to_owned()
    }
}

/// Study one set of endpoints under every model; `duration` is the phase's, in seconds.
pub fn study_phase(sc: &Scenario, eps: &[ScEndpoint], duration: Option<f64>) -> Vec<ModelResult> {
    let m = model_of(sc, eps);
    let total: f64 = sc.nodes.iter().map(|n| n.clients).sum();
    let crashed: BTreeMap<IpAddr, Crash> =
        eps.iter().filter(|e| e.crash.crashed()).map(|e| (e.ip, e.crash)).collect();
    let node_of = |ip: &IpAddr| eps.iter().find(|e| e.ip == *ip).map(|e| e.node.clone()).unwrap_or_default();
    let zone_of = |node: &str| sc.nodes.iter().find(|n| n.name == node).and_then(|n| n.zone.clone());
    MODELS
        .iter()
        .map(|&model| {
            let mut r = ModelResult {
                model,
                label: label(model, sc),
                shares: eps.iter().map(|e| (e.ip.to_string(), 0.0)).collect(),
                cross_node: 0.0,
                cross_zone: 0.0,
                failed: 0.0,
                hang: 0.0,
                detections: Vec::new(),
            };
            for n in &sc.nodes {
                let w = if total > 0.0 { n.clients / total } else { 0.0 };
                let info = NodeInfo::new(n.name.clone(), n.zone.clone());
                let flow = match models::route(model, &m, &info, sc.cilium) {
                    Route::Set { ips, empty } => set_flow(&ips, empty, &crashed),
                    Route::Tiers(tiers) => health::simulate(
                        &n.name,
                        &tiers,
                        &crashed,
                        &sc.health,
                        n.client_pods,
                        sc.requests_per_second * w,
                        duration,
                    ),
                };
                r.failed += w * flow.failed;
                r.hang += w * flow.hang;
                r.detections.extend(flow.detections);
                for (ip, f) in flow.ok {
                    let each = w * f;
                    *r.shares.entry(ip.to_string()).or_default() += each;
                    let en = node_of(&ip);
                    if en != n.name {
                        r.cross_node += each;
                    }
                    if let (Some(a), Some(b)) = (zone_of(&en), n.zone.as_ref())
                        && &a != b
                    {
                        r.cross_zone += each;
                    }
                }
            }
            r
        })
        .collect()
}

/// The scenario's states: `initial`, then each phase applied on top of the previous ones (its name, its
/// duration, the endpoints then).
pub fn states(sc: &Scenario) -> Vec<(String, Option<f64>, Vec<ScEndpoint>)> {
    let mut eps = sc.endpoints.clone();
    let mut out = vec![("initial".to_owned(), None, eps.clone())];
    for p in &sc.phases {
        apply_phase(&mut eps, &sc.endpoints, p);
        out.push((p.name.clone(), p.duration, eps.clone()));
    }
    out
}

/// Study the initial state, then each phase applied on top of the previous ones.
pub fn run(sc: &Scenario) -> StudyResult {
    let phases = states(sc)
        .into_iter()
        .map(|(phase, duration, eps)| PhaseResult {
            phase,
            duration_s: duration,
            requests: duration.map(|d| d * sc.requests_per_second),
            models: study_phase(sc, &eps, duration),
        })
        .collect();
    StudyResult {
        scenario: sc.name.clone(),
        description: sc.description.clone(),
        requests_per_second: sc.requests_per_second,
        health: sc.health,
        phases,
    }
}

/// Read a scenario file; an error names the file and the field.
pub fn load(path: &std::path::Path) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    crate::source::yaml::typed(&text)
        .map_err(|(field, e)| anyhow::anyhow!("{}: field {field}: {e}", path.display()))
}
