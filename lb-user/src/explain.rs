//! `tierlb explain`: for each port of one Service, in plain words, which tier this node uses and why.
use std::{fmt::Write as _, net::SocketAddr};

use crate::{
    hints::{self, HintMode},
    model::{Model, NodeInfo, ObjKey, Policy},
    plan::{self, PortEndpoint, SelectedTier, TrafficPlan, WhenEmpty},
};

fn list(v: &[SocketAddr]) -> String {
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 { format!("1 {word}") } else { format!("{n} {word}s") }
}

/// Why node hints are or are not used (kube-proxy's `topologyModeFromHints`, node part).
pub fn node_reason(eps: &[PortEndpoint], node: &NodeInfo) -> (bool, String) {
    let ready: Vec<&PortEndpoint> = eps.iter().filter(|e| e.endpoint.is_ready()).collect();
    if ready.is_empty() {
        return (false, "node hints not used: no endpoint is ready".into());
    }
    if ready.iter().all(|e| e.endpoint.node_hints().is_empty()) {
        return (false, "node hints not used: no ready endpoint carries a forNodes hint".into());
    }
    if let Some(bare) = ready.iter().find(|e| e.endpoint.node_hints().is_empty()) {
        return (
            false,
            format!(
                "node hints not used: endpoint {} has no forNodes hint, so node filtering is off for the whole Service",
                bare.addr.ip()
            ),
        );
    }
    match ready.iter().find(|e| e.endpoint.node_hints().contains(&node.name)) {
        Some(e) => (
            true,
            format!(
                "node tier: all {} carry forNodes and {} names {}",
                plural(ready.len(), "ready endpoint"),
                e.addr.ip(),
                node.name
            ),
        ),
        None => (
            false,
            format!(
                "node hints not used: all {} carry forNodes but none names {}",
                plural(ready.len(), "ready endpoint"),
                node.name
            ),
        ),
    }
}

/// Why zone hints are or are not used (the zone part).
pub fn zone_reason(eps: &[PortEndpoint], node: &NodeInfo) -> (bool, String) {
    let ready: Vec<&PortEndpoint> = eps.iter().filter(|e| e.endpoint.is_ready()).collect();
    if ready.is_empty() {
        return (false, "zone hints not used: no endpoint is ready".into());
    }
    if ready.iter().all(|e| e.endpoint.zone_hints().is_empty()) {
        return (false, "zone tier not used: no ready endpoint carries a forZones hint".into());
    }
    if let Some(bare) = ready.iter().find(|e| e.endpoint.zone_hints().is_empty()) {
        return (
            false,
            format!(
                "zone tier not used: endpoint {} has no forZones hint, so zone filtering is off for the whole Service",
                bare.addr.ip()
            ),
        );
    }
    let Some(zone) = node.zone.as_deref().filter(|z| !z.is_empty()) else {
        return (
            false,
            format!(
                "zone tier not used: node {} has no zone (no --zone and no topology.kubernetes.io/zone label)",
                node.name
            ),
        );
    };
    match ready.iter().find(|e| e.endpoint.zone_hints().iter().any(|z| z == zone)) {
        Some(e) => (
            true,
            format!(
                "zone tier: all {} carry forZones and {} names {zone}",
                plural(ready.len(), "ready endpoint"),
                e.addr.ip()
            ),
        ),
        None => (
            false,
            format!(
                "zone tier not used: all {} carry forZones but none names {zone}",
                plural(ready.len(), "ready endpoint")
            ),
        ),
    }
}

fn when_empty_text(w: WhenEmpty) -> &'static str {
    match w {
        WhenEmpty::Reject => "connect() fails at once with ECONNREFUSED (kube-proxy: REJECT)",
        WhenEmpty::Drop => {
            "connect() fails at once with EHOSTUNREACH (kube-proxy: DROP, the client would hang until its timeout)"
        }
    }
}

fn traffic_text(out: &mut String, t: &TrafficPlan, eps: &[PortEndpoint], node: &NodeInfo) {
    let _ = match t.policy {
        Policy::Local => writeln!(
            out,
            "    Local policy: only this node's endpoints, topology hints ignored; local set: {}",
            list(&t.endpoints)
        ),
        Policy::Cluster => {
            let (_, nr) = node_reason(eps, node);
            let (_, zr) = zone_reason(eps, node);
            let _ = writeln!(out, "    {nr}");
            let _ = writeln!(out, "    {zr}");
            let ready = eps.iter().filter(|e| e.endpoint.is_ready()).count();
            if t.selected_tier == SelectedTier::Cluster && ready == 0 {
                let _ = writeln!(out, "    no endpoint is ready: serving and terminating endpoints are used");
            }
            Ok(())
        }
    };
    let tier = match t.selected_tier {
        SelectedTier::Node => "node tier",
        SelectedTier::Zone => "zone tier",
        SelectedTier::Cluster => "cluster tier (all endpoints)",
        SelectedTier::Local => "local set",
        SelectedTier::None => "nothing",
    };
    let _ = writeln!(out, "    => uses the {tier}: {}", list(&t.endpoints));
    if t.policy == Policy::Cluster {
        let behind: Vec<String> = [("zone", &t.tiers.zone), ("cluster", &t.tiers.cluster)]
            .iter()
            .filter(|(_, v)| !v.is_empty() && **v != t.endpoints)
            .map(|(n, v)| format!("{n} tier {}", list(v)))
            .collect();
        if !behind.is_empty() {
            let _ = writeln!(
                out,
                "    if those are marked down, the data path falls back to: {}",
                behind.join(", then ")
            );
        }
    }
    match t.when_empty {
        Some(w) => {
            let _ = writeln!(out, "    no endpoint to use: {}", when_empty_text(w));
        }
        None => {
            let w = if t.policy == Policy::Local { WhenEmpty::Drop } else { WhenEmpty::Reject };
            let _ = writeln!(out, "    if every one is marked down: {}", when_empty_text(w));
        }
    }
}

/// The explanation for one Service on one node, or `None` if the model has no such Service.
pub fn explain(model: &Model, node: &NodeInfo, key: &ObjKey) -> Option<String> {
    let svc = model.services.get(key)?;
    let mut out = String::new();
    let zone = node.zone.as_deref().unwrap_or("<none>");
    let _ = writeln!(out, "Service {key} on node {} (zone {zone})", node.name);
    let td = svc.traffic_distribution.as_deref().unwrap_or("<unset>");
    let _ = writeln!(
        out,
        "  internalTrafficPolicy {}, externalTrafficPolicy {}, trafficDistribution {td}",
        svc.internal_policy.as_str(),
        svc.external_policy.as_str()
    );
    let hint_mode = match hints::mode(svc) {
        HintMode::AutoAnnotation => "topology-mode Auto annotation: zone hints by CPU share".to_owned(),
        HintMode::PreferSameZone { .. } => "same-zone hints on every ready endpoint".to_owned(),
        HintMode::PreferSameNode => "same-node and same-zone hints on every ready endpoint".to_owned(),
        HintMode::None { .. } => "no hints (the controller removes them)".to_owned(),
    };
    let _ = writeln!(out, "  the EndpointSlice controller writes: {hint_mode}");
    if svc.cluster_ips.is_empty() {
        let _ = writeln!(out, "  headless or ExternalName Service: no VIP, nothing to translate");
    }
    let p = plan::plan(model, node);
    for pp in p.services.iter().filter(|s| &s.key == key) {
        let port =
            svc.ports.iter().find(|sp| sp.name == pp.port_name && sp.port == pp.port).expect("planned port");
        let eps = plan::port_endpoints(model, svc, port, pp.family, &node.name);
        let ready = eps.iter().filter(|e| e.endpoint.is_ready()).count();
        let st = eps
            .iter()
            .filter(|e| !e.endpoint.is_ready() && e.endpoint.is_serving() && e.endpoint.is_terminating())
            .count();
        let name = if pp.port_name.is_empty() { String::new() } else { format!(" {}", pp.port_name) };
        let _ = writeln!(
            out,
            "\n  port{name} {}/{} ({}), VIP {}: {} ({ready} ready, {st} serving+terminating, {} local)",
            pp.port,
            pp.protocol.as_str(),
            pp.family.as_str(),
            pp.cluster_ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            plural(eps.len(), "endpoint"),
            eps.iter().filter(|e| e.local).count(),
        );
        let _ = writeln!(out, "  internal traffic (ClusterIP):");
        traffic_text(&mut out, &pp.internal, &eps, node);
        if let Some(ext) = &pp.external {
            let _ = writeln!(out, "  external traffic (node port, load-balancer or external IPs):");
            traffic_text(&mut out, ext, &eps, node);
        }
        for w in &pp.warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
    }
    Some(out)
}
