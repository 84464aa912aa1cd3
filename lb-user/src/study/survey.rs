//! A whole cluster studied (`tierlb study --manifests DIR | --kube`): every Service's scenario run under every
//! model, where each model serves it differently from kube-proxy and why, the skew PreferSameNode gives it
//! with its clients where they are, the time-weighted losses of the what-if phases, and the cluster-wide
//! summary.
//!
//! "Why" is found by taking away what a model may ignore and running it again: when removing every
//! endpoint's `forNodes` (or `forZones`) leaves a model's figures as they were while kube-proxy's change, the
//! model ignores those hints, and the line says so; otherwise it says where the figures part.
use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    ModelResult, ProxyModel, ScEndpoint, Scenario, StudyResult,
    clients::Clients,
    cluster::{self, Timings, WhatIf},
    table::{count, pct, table},
};
use crate::model::{Model, ObjKey, Service};

/// Two figures closer than this are the same (half a percent of requests).
const SAME: f64 = 0.005;

/// How to study a cluster.
#[derive(Clone, Debug)]
pub struct SurveyOptions {
    /// The what-ifs, each applied to every Service it touches.
    pub what_ifs: Vec<WhatIf>,
    /// How long the what-if phases last.
    pub timings: Timings,
    /// Requests per second from all clients of a Service.
    pub requests_per_second: f64,
    /// The skew (largest endpoint share over the even share) above which the summary names a Service.
    pub max_skew: f64,
    /// The pods endpoints belong to, by address (their slices' `targetRef`), to name them.
    pub pods: BTreeMap<std::net::IpAddr, ObjKey>,
}

/// An endpoint as the study names it: its address, its node and, where its slice names it, its pod.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointName {
    /// The pod IP, the column the tables show.
    pub ip: std::net::IpAddr,
    /// Its node.
    pub node: String,
    /// `NAMESPACE/NAME` of its pod, when its slice's `targetRef` names it.
    pub pod: Option<String>,
}

/// One model that serves a Service differently from kube-proxy (models with the same line are grouped).
#[derive(Clone, Debug, Serialize)]
pub struct Difference {
    /// The models (in the order of `MODELS`).
    pub models: Vec<String>,
    /// The first phase where their figures part from kube-proxy's.
    pub phase: String,
    /// What they do and what it costs, e.g. "ignore forNodes: 65% of requests cross nodes instead of 30%".
    pub why: String,
}

/// How unevenly a Service's endpoints are loaded under kube-proxy's rule.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Skew {
    /// Ready endpoints.
    pub endpoints: usize,
    /// As the Service is: the largest endpoint share over the even share (1.0: even); none below 2 endpoints.
    pub now: Option<f64>,
    /// Were it `trafficDistribution: PreferSameNode` with the controller's hints.
    pub prefer_same_node: Option<f64>,
}

/// One model's losses over one what-if's phases, weighted by the phases' durations.
#[derive(Clone, Debug, Serialize)]
pub struct Weighted {
    /// The what-if (`--drain node-1`).
    pub what_if: String,
    /// The model.
    pub model: ProxyModel,
    /// The what-if's phases' total duration.
    pub seconds: f64,
    /// Share of the requests over that time that failed at once.
    pub failed: f64,
    /// Share that hung until the client's timeout.
    pub hang: f64,
    /// Those as requests (at the study's request rate).
    pub failed_requests: f64,
    /// Hung requests.
    pub hung_requests: f64,
}

/// One Service studied.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceStudy {
    /// `NAMESPACE/NAME`.
    pub service: String,
    /// Where its client shares came from.
    pub clients: String,
    /// Set when its slices carried no hints at all and the study assumed the controller's (as the agent
    /// does): what a cluster whose controller writes none would see differs.
    pub hints: Option<String>,
    /// Its endpoints, named: the tables' columns are their addresses.
    pub endpoints: Vec<EndpointName>,
    /// Its client share per node.
    pub client_shares: BTreeMap<String, f64>,
    /// The per-model tables, initial state then each what-if phase.
    pub study: StudyResult,
    /// The models that serve it differently from kube-proxy.
    pub differences: Vec<Difference>,
    /// Its skew.
    pub skew: Skew,
    /// Each what-if's time-weighted losses per model (empty without what-ifs).
    pub what_if: Vec<Weighted>,
}

/// A Service not studied, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Unstudied {
    /// `NAMESPACE/NAME`.
    pub service: String,
    /// Why no proxy routes it.
    pub why: &'static str,
}

/// The cluster-wide summary.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The skew threshold.
    pub max_skew: f64,
    /// Services whose skew under PreferSameNode is above it, most skewed first: (Service, skew, uses it now).
    pub skewed: Vec<(String, f64, bool)>,
    /// Per model (in the order of `MODELS`, kube-proxy left out), the Services it serves differently.
    pub differs: Vec<(String, Vec<String>)>,
}

/// What `tierlb study` prints for a cluster.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterStudy {
    /// Where the objects were read.
    pub origin: String,
    /// What the input may have wrong (client shares naming nodes or Services the cluster does not have).
    pub warnings: Vec<String>,
    /// The Services, those some model serves differently first, then by name.
    pub services: Vec<ServiceStudy>,
    /// The Services not studied.
    pub unstudied: Vec<Unstudied>,
    /// The summary.
    pub summary: Summary,
}

fn differs(a: &ModelResult, b: &ModelResult) -> bool {
    let share = |m: &ModelResult, ip: &String| m.shares.get(ip).copied().unwrap_or(0.0);
    a.shares.keys().chain(b.shares.keys()).any(|ip| (share(a, ip) - share(b, ip)).abs() > SAME)
        || (a.failed - b.failed).abs() > SAME
        || (a.hang - b.hang).abs() > SAME
}

/// What differs, as a phrase: the cross-node and cross-zone shares, the losses, else the endpoint whose share
/// moved most.
fn cost(kp: &ModelResult, r: &ModelResult) -> String {
    let mut parts = Vec::new();
    if (r.cross_node - kp.cross_node).abs() > SAME {
        parts.push(format!(
            "{} of requests cross nodes instead of {}",
            pct(r.cross_node),
            pct(kp.cross_node)
        ));
    }
    if (r.cross_zone - kp.cross_zone).abs() > SAME {
        parts.push(format!("{} cross zones instead of {}", pct(r.cross_zone), pct(kp.cross_zone)));
    }
    if (r.failed - kp.failed).abs() > SAME {
        parts.push(format!("{} fail instead of {}", pct(r.failed), pct(kp.failed)));
    }
    if (r.hang - kp.hang).abs() > SAME {
        parts.push(format!("{} hang instead of {}", pct(r.hang), pct(kp.hang)));
    }
    if parts.is_empty() {
        let share = |m: &ModelResult, ip: &str| m.shares.get(ip).copied().unwrap_or(0.0);
        if let Some(ip) = kp
            .shares
            .keys()
            .max_by(|a, b| (share(r, a) - share(kp, a)).abs().total_cmp(&(share(r, b) - share(kp, b)).abs()))
        {
            parts.push(format!("{ip} gets {} instead of {}", pct(share(r, ip)), pct(share(kp, ip))));
        }
    }
    parts.join(", ")
}

/// `eps` without `forNodes` (`nodes`) or without `forZones`; an endpoint left with no hint has none.
fn without(eps: &[ScEndpoint], nodes: bool) -> Vec<ScEndpoint> {
    let mut out = eps.to_vec();
    for e in &mut out {
        if nodes {
            e.for_nodes = None;
        } else {
            e.for_zones = None;
        }
        if e.for_nodes.is_none() && e.for_zones.is_none() {
            e.no_hints = true;
        }
    }
    out
}

/// Why model `i` of a phase differs from kube-proxy (model 0), found by taking hints away.
fn why(
    sc: &Scenario,
    eps: &[ScEndpoint],
    duration: Option<f64>,
    results: &[ModelResult],
    i: usize,
) -> String {
    let (kp, r) = (&results[0], &results[i]);
    for (nodes, what) in [(true, "forNodes"), (false, "forZones")] {
        let hinted = eps.iter().any(|e| if nodes { e.for_nodes.is_some() } else { e.for_zones.is_some() });
        if !hinted {
            continue;
        }
        let other = super::study_phase(sc, &without(eps, nodes), duration);
        if !differs(&other[i], r) && differs(&other[0], kp) {
            // Without those hints kube-proxy would serve it as this model does: the hints are the whole story.
            if !differs(&other[0], r) {
                return format!("ignores {what}: {}", cost(kp, r));
            }
            return format!("ignores {what}: {}; also, without them: {}", cost(kp, r), cost(&other[0], r));
        }
    }
    cost(kp, r)
}

/// The skew of a phase's model result over the ready endpoints `eps`.
fn skew_of(r: &ModelResult, eps: &[ScEndpoint]) -> Option<f64> {
    let ready: Vec<String> = eps.iter().filter(|e| e.ready).map(|e| e.ip.to_string()).collect();
    crate::lint::skew_factor(ready.iter().map(|ip| r.shares.get(ip).copied().unwrap_or(0.0)), ready.len())
}

/// Study one Service's scenario (its what-ifs' phases grouped as `groups` says): its tables, the differences
/// from kube-proxy in every phase, its skew, each what-if's totals.
pub fn study_service(
    sc: &Scenario,
    groups: &[(String, usize)],
    clients: String,
    shares: BTreeMap<String, f64>,
) -> ServiceStudy {
    let study = super::run(sc);
    let mut eps = sc.endpoints.clone();
    let mut differences: Vec<Difference> = Vec::new();
    for (k, p) in study.phases.iter().enumerate() {
        if k > 0 {
            super::apply_phase(&mut eps, &sc.endpoints, &sc.phases[k - 1]);
        }
        for i in (1..p.models.len()).filter(|&i| differs(&p.models[0], &p.models[i])) {
            let line = why(sc, &eps, p.duration_s, &p.models, i);
            let name = p.models[i].model.name().to_owned();
            match differences.iter_mut().find(|d| d.phase == p.phase && d.why == line) {
                Some(d) => d.models.push(name),
                None => {
                    differences.push(Difference { models: vec![name], phase: p.phase.clone(), why: line });
                }
            }
        }
    }
    let mut what_if = Vec::new();
    let mut next = 1; // phase 0 is the cluster as it is
    for (label, len) in groups {
        let timed: Vec<_> =
            study.phases[next..next + len].iter().filter_map(|p| p.duration_s.map(|d| (p, d))).collect();
        next += len;
        let seconds: f64 = timed.iter().map(|(_, d)| d).sum();
        if seconds <= 0.0 {
            continue;
        }
        for (i, &model) in super::MODELS.iter().enumerate() {
            let sum =
                |f: fn(&ModelResult) -> f64| timed.iter().map(|(p, d)| d * f(&p.models[i])).sum::<f64>();
            let (failed, hang) = (sum(|m| m.failed), sum(|m| m.hang));
            what_if.push(Weighted {
                what_if: label.clone(),
                model,
                seconds,
                failed: failed / seconds,
                hang: hang / seconds,
                failed_requests: failed * sc.requests_per_second,
                hung_requests: hang * sc.requests_per_second,
            });
        }
    }
    let psn = prefer_same_node(sc);
    let skew = Skew {
        endpoints: sc.endpoints.iter().filter(|e| e.ready).count(),
        now: skew_of(&study.phases[0].models[0], &sc.endpoints),
        prefer_same_node: skew_of(&super::study_phase(&psn, &psn.endpoints, None)[0], &psn.endpoints),
    };
    ServiceStudy {
        service: sc.name.clone(),
        clients,
        hints: None,
        endpoints: Vec::new(),
        client_shares: shares,
        study,
        differences,
        skew,
        what_if,
    }
}

/// The scenario as it would be with `trafficDistribution: PreferSameNode` and the hints the controller would
/// write for it (no phases).
fn prefer_same_node(sc: &Scenario) -> Scenario {
    let mut psn = sc.clone();
    psn.phases.clear();
    psn.service.traffic_distribution = Some("PreferSameNode".into());
    psn.service.topology_mode = None;
    psn.service.topology_aware_hints = None;
    for e in &mut psn.endpoints {
        e.for_nodes = None;
        e.for_zones = None;
        e.no_hints = false;
    }
    psn
}

/// What the clients' input names that the cluster does not have.
fn client_warnings(m: &Model, clients: &Clients, nodes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = clients
        .nodes()
        .into_iter()
        .filter(|n| !nodes.contains(n))
        .map(|n| {
            format!("clients: node {n} is no Node of the cluster and runs no endpoint (misspelt?): its clients are studied all the same, zoneless")
        })
        .collect();
    if let Clients::Given { origin, services, .. } = clients {
        for k in services.keys().filter(|k| !m.services.contains_key(*k)) {
            out.push(format!(
                "clients {origin}: Service {k} is not in the cluster (misspelt?): its shares are not used"
            ));
        }
    }
    out
}

/// Study every Service of `m` (or only `only`) with the clients `clients`; `filled` are the Services whose
/// slices carried no hints and got the controller's.
pub fn survey(
    m: &Model,
    origin: String,
    only: Option<&Service>,
    filled: &[ObjKey],
    clients: &Clients,
    opts: &SurveyOptions,
) -> ClusterStudy {
    let zones = cluster::endpoint_zones(m);
    let mut node_names: Vec<String> = m.nodes.keys().cloned().collect();
    node_names.extend(zones.keys().filter(|n| !m.nodes.contains_key(*n)).cloned());
    let warnings = client_warnings(m, clients, &node_names);
    for n in clients.nodes() {
        if !node_names.contains(&n) {
            node_names.push(n);
        }
    }
    let mut services = Vec::new();
    let mut unstudied = Vec::new();
    for svc in m.services.values().filter(|s| only.is_none_or(|o| o.key == s.key)) {
        if let Some(why) = cluster::unstudied(svc) {
            unstudied.push(Unstudied { service: svc.key.to_string(), why });
            continue;
        }
        let mut nodes = node_names.clone();
        for s in m.slices_of(&svc.key) {
            for e in &s.endpoints {
                if let Some(n) = e.node_name.as_deref().filter(|n| !nodes.iter().any(|m| m == n)) {
                    nodes.push(n.to_owned());
                }
            }
        }
        nodes.sort();
        let shares = clients.shares(&svc.key, &nodes);
        let (sc, groups) = cluster::scenario(
            m,
            svc,
            &shares.per_node,
            &opts.what_ifs,
            opts.timings,
            opts.requests_per_second,
            &zones,
        );
        let mut study = study_service(&sc, &groups, shares.source, shares.per_node);
        study.endpoints = sc
            .endpoints
            .iter()
            .map(|e| EndpointName {
                ip: e.ip,
                node: e.node.clone(),
                pod: opts.pods.get(&e.ip).map(ToString::to_string),
            })
            .collect();
        if filled.contains(&svc.key) {
            study.hints = Some(
                "its EndpointSlices carry no hints: studied with the controller's (as the agent, and plan with \
                 --emulate-hints, do); where no controller writes them, kube-proxy and the others would see none"
                    .to_owned(),
            );
        }
        services.push(study);
    }
    services.sort_by(|a, b| {
        a.differences.is_empty().cmp(&b.differences.is_empty()).then(a.service.cmp(&b.service))
    });
    let mut skewed: Vec<(String, f64, bool)> = services
        .iter()
        .filter_map(|s| {
            let k = s.skew.prefer_same_node.filter(|k| *k > opts.max_skew)?;
            let key = s.service.split_once('/').map(|(ns, name)| ObjKey::new(ns, name))?;
            let uses = m.services.get(&key)?.traffic_distribution.as_deref() == Some("PreferSameNode");
            Some((s.service.clone(), k, uses))
        })
        .collect();
    skewed.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let differs = super::MODELS[1..]
        .iter()
        .map(|model| {
            let name = model.name().to_owned();
            let svcs = services
                .iter()
                .filter(|s| s.differences.iter().any(|d| d.models.contains(&name)))
                .map(|s| s.service.clone())
                .collect();
            (name, svcs)
        })
        .collect();
    ClusterStudy {
        origin,
        warnings,
        services,
        unstudied,
        summary: Summary { max_skew: opts.max_skew, skewed, differs },
    }
}

/// A cluster study as text: the summary, then each Service (those some model serves differently first): where
/// its clients are, the models that differ and why, its per-model tables and the what-ifs' totals.
pub fn cluster_table(c: &ClusterStudy) -> String {
    let mut out = format!(
        "cluster study of {}: Services studied: {}, not studied: {}\n",
        c.origin,
        c.services.len(),
        c.unstudied.len()
    );
    for w in &c.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let differing = c.services.iter().filter(|s| !s.differences.is_empty()).count();
    let _ = writeln!(
        out,
        "\nsummary\n  Services some model serves differently from kube-proxy-1.34-1.37: {differing}"
    );
    for (model, svcs) in c.summary.differs.iter().filter(|(_, s)| !s.is_empty()) {
        let _ = writeln!(out, "    {model}: {}", svcs.join(", "));
    }
    let _ = writeln!(
        out,
        "  Services whose load under PreferSameNode is skewed above {:.2}x the even share: {}",
        c.summary.max_skew,
        c.summary.skewed.len()
    );
    for (svc, k, uses) in &c.summary.skewed {
        let now = if *uses { "uses PreferSameNode now" } else { "does not use it now" };
        let _ = writeln!(out, "    {svc}: {k:.2}x ({now})");
    }
    for u in &c.unstudied {
        let _ = writeln!(out, "  not studied: {}: {}", u.service, u.why);
    }
    for s in &c.services {
        let _ = writeln!(out, "\nservice {}", s.service);
        let shares: Vec<String> = s.client_shares.iter().map(|(n, v)| format!("{n} {}", pct(*v))).collect();
        let _ = writeln!(out, "  clients: {} ({})", shares.join(", "), s.clients);
        let named: Vec<String> = s
            .endpoints
            .iter()
            .map(|e| match &e.pod {
                Some(p) => format!("{} pod {p} on {}", e.ip, e.node),
                None => format!("{} on {}", e.ip, e.node),
            })
            .collect();
        if !named.is_empty() {
            let _ = writeln!(out, "  endpoints: {}", named.join(", "));
        }
        if let Some(h) = &s.hints {
            let _ = writeln!(out, "  hints: {h}");
        }
        let skew = |k: Option<f64>| k.map_or_else(|| "-".to_owned(), |k| format!("{k:.2}x"));
        let _ = writeln!(
            out,
            "  skew over {} ready endpoints (largest share / even share): {} as it is, {} under PreferSameNode",
            s.skew.endpoints,
            skew(s.skew.now),
            skew(s.skew.prefer_same_node)
        );
        if s.differences.is_empty() {
            let _ = writeln!(out, "  every model serves it as kube-proxy-1.34-1.37 does");
        }
        for d in &s.differences {
            let phase = if d.phase == "initial" { String::new() } else { format!(" (phase {})", d.phase) };
            let _ = writeln!(out, "  {}{phase}: {}", d.models.join(", "), d.why);
        }
        for line in table(&s.study).lines().skip(2) {
            let _ = writeln!(out, "{line}");
        }
        let mut last = "";
        for w in &s.what_if {
            if w.what_if != last {
                let _ =
                    writeln!(out, "\n  {} over its phases ({:.0} s), time-weighted", w.what_if, w.seconds);
                last = &w.what_if;
            }
            let _ = writeln!(
                out,
                "  {:<28} {:>6} failed ({} requests) {:>6} hung ({} requests)",
                w.model.name(),
                pct(w.failed),
                count(w.failed_requests),
                pct(w.hang),
                count(w.hung_requests)
            );
        }
    }
    out
}
