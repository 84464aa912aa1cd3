//! `tierlb explain`: for each port of one Service, in plain words, which tier this node uses and why. It
//! renders the plan's own decision (`plan::TopologyDecision` and the traffic plans); it decides nothing.
use std::{fmt::Write as _, net::SocketAddr};

use crate::{
    hints::{self, HintMode},
    lint,
    model::{Model, NodeInfo, ObjKey, Policy},
    plan::ExternalPlan,
    plan::{self, HintReason, PortPlan, SelectedTier, TrafficPlan, WhenEmpty},
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

/// How a Service's hints came to be what `explain` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hinted {
    /// As the slices hold them (with hints, or without hints and not asking for any).
    AsWritten,
    /// The slices carry none although the Service asks for them, and they are shown as they are.
    Missing,
    /// The slices carry none and were given the controller's (`--emulate-hints`).
    Emulated,
}

impl Hinted {
    /// `forNodes` / `forZones` as said in a decision line: labelled when emulated.
    fn field(self, field: &str) -> String {
        if self == Self::Emulated { format!("emulated {field}") } else { field.to_owned() }
    }
}

/// The node-hint line of the topology decision.
fn node_text(r: &HintReason, node: &NodeInfo, hinted: Hinted) -> String {
    let for_nodes = hinted.field("forNodes");
    match r {
        HintReason::NoReadyEndpoint => "node hints not used: no endpoint is ready".into(),
        HintReason::NoEndpointHinted => {
            "node hints not used: no ready endpoint carries a forNodes hint".into()
        }
        HintReason::EndpointWithoutHint { endpoint } => format!(
            "node hints not used: endpoint {endpoint} has no forNodes hint, so node filtering is off for the whole \
             Service"
        ),
        HintReason::Named { ready, endpoint } => format!(
            "node tier: all {} carry {for_nodes} and {endpoint} names {}",
            plural(*ready, "ready endpoint"),
            node.name
        ),
        HintReason::NoneNamesThis { ready } => format!(
            "node hints not used: all {} carry {for_nodes} but none names {}",
            plural(*ready, "ready endpoint"),
            node.name
        ),
        HintReason::NodeHasNoZone => "node hints not used".into(),
    }
}

/// The zone-hint line of the topology decision.
fn zone_text(r: &HintReason, node: &NodeInfo, hinted: Hinted) -> String {
    let for_zones = hinted.field("forZones");
    let zone = node.zone.as_deref().unwrap_or_default();
    match r {
        HintReason::NoReadyEndpoint => "zone hints not used: no endpoint is ready".into(),
        HintReason::NoEndpointHinted => {
            "zone tier not used: no ready endpoint carries a forZones hint".into()
        }
        HintReason::EndpointWithoutHint { endpoint } => format!(
            "zone tier not used: endpoint {endpoint} has no forZones hint, so zone filtering is off for the whole \
             Service"
        ),
        HintReason::NodeHasNoZone => format!(
            "zone tier not used: node {} has no zone (no --zone and no topology.kubernetes.io/zone label)",
            node.name
        ),
        HintReason::Named { ready, endpoint } => {
            format!(
                "zone tier: all {} carry {for_zones} and {endpoint} names {zone}",
                plural(*ready, "ready endpoint")
            )
        }
        HintReason::NoneNamesThis { ready } => format!(
            "zone tier not used: all {} carry {for_zones} but none names {zone}",
            plural(*ready, "ready endpoint")
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

fn traffic_text(out: &mut String, t: &TrafficPlan, pp: &PortPlan, node: &NodeInfo, hinted: Hinted) {
    let _ = match t.policy {
        Policy::Local => writeln!(
            out,
            "    Local policy: only this node's endpoints, topology hints ignored; local set: {}",
            list(&t.endpoints)
        ),
        Policy::Cluster => {
            let _ = writeln!(out, "    {}", node_text(&pp.topology.node, node, hinted));
            let _ = writeln!(out, "    {}", zone_text(&pp.topology.zone, node, hinted));
            if t.selected_tier == SelectedTier::Cluster && pp.counts.ready == 0 {
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
        SelectedTier::None => "",
    };
    if tier.is_empty() {
        let _ = writeln!(out, "    => uses no endpoint");
    } else {
        let _ = writeln!(out, "    => uses the {tier}: {}", list(&t.endpoints));
    }
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
            let _ = writeln!(out, "    if every one is marked down: {}", when_empty_text(t.when_all_down));
        }
    }
}

/// The explanation for one Service on one node, or `None` if the model has no such Service (hints as the
/// slices hold them, endpoints named by address).
pub fn explain(model: &Model, node: &NodeInfo, key: &ObjKey) -> Option<String> {
    explain_with(model, node, key, Hinted::AsWritten, &lint::Pods::new())
}

/// The explanation's first line, and a warning when the source does not know the node (`unknown-node`).
fn heading(model: &Model, node: &NodeInfo, key: &ObjKey) -> String {
    let zone = node.zone.as_deref().unwrap_or("<none>");
    let mut out = format!("Service {key} on node {} (zone {zone})\n", node.name);
    if let Some(w) = lint::unknown_node(&node.name, model) {
        let _ = writeln!(out, "  warning: {}: {w}", w.rule);
    }
    out
}

/// `explain`, where `hinted` says where the Service's hints come from and `pods` names endpoints in warnings.
pub fn explain_with(
    model: &Model,
    node: &NodeInfo,
    key: &ObjKey,
    hinted: Hinted,
    pods: &lint::Pods,
) -> Option<String> {
    let svc = model.services.get(key).or_else(|| model.skipped.get(key))?;
    let mut out = heading(model, node, key);
    if let Some(label) = &svc.not_proxied {
        let _ = writeln!(out, "  not programmed: {label}");
        return Some(out);
    }
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
    match hinted {
        Hinted::AsWritten => {}
        Hinted::Missing => {
            let _ = writeln!(
                out,
                "  its EndpointSlices carry no hints: shown as they are, as kube-proxy reads them (every endpoint); \
                 the agent plans with the hints the controller would write (metric reason hints_emulated): \
                 --emulate-hints shows that"
            );
        }
        Hinted::Emulated => {
            let _ = writeln!(
                out,
                "  its EndpointSlices carry no hints: EMULATED below (--emulate-hints), the hints the controller \
                 would write, as the agent plans them (metric reason hints_emulated); kube-proxy would use every \
                 endpoint"
            );
        }
    }
    if svc.cluster_ips.is_empty() {
        let _ = writeln!(out, "  headless or ExternalName Service: no VIP, nothing to translate");
    }
    let p = plan::plan(model, node);
    let lints = lint::lint_naming(model, node, &p, pods);
    for (pp, warnings) in p.services.iter().zip(&lints.ports).filter(|(s, _)| &s.name.service == key) {
        let name = if pp.name.port.is_empty() { String::new() } else { format!(" {}", pp.name.port) };
        let c = &pp.counts;
        let _ = writeln!(
            out,
            "\n  port{name} {}/{} ({}), VIP {}: {} ({} ready, {} serving+terminating, {} local)",
            pp.port,
            pp.protocol.as_str(),
            pp.family.as_str(),
            pp.cluster_ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            plural(c.total, "endpoint"),
            c.ready,
            c.serving_terminating,
            c.local,
        );
        if let Some(a) = pp.session_affinity {
            let _ = writeln!(
                out,
                "  sessionAffinity ClientIP: a client ({}) keeps its backend for {} s after its last connect, \
                 within the tier below; a backend that leaves or is marked down is replaced at once",
                a.client, a.timeout_seconds
            );
        }
        let _ = writeln!(out, "  internal traffic (ClusterIP):");
        let sum = plan::summarize(svc, pp).emulated(hinted == Hinted::Emulated);
        let _ = writeln!(
            out,
            "    topology: requested {}, applied {}, reason {} (tierlb_service_topology)",
            sum.requested.as_str(),
            sum.applied.as_str(),
            sum.reason.as_str()
        );
        traffic_text(&mut out, &pp.internal, pp, node, hinted);
        if let Some(ext) = &pp.external {
            external_text(&mut out, ext, pp, node, hinted);
        }
        for w in warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
    }
    for s in p.skipped.iter().filter(|s| &s.service == key) {
        let Some(port) = &s.port else { continue };
        let name = if port.port_name.is_empty() { String::new() } else { format!(" {}", port.port_name) };
        let _ = writeln!(
            out,
            "\n  port{name} {}/{}: not programmed: {}",
            port.port,
            port.protocol.as_str(),
            s.message
        );
    }
    Some(out)
}

/// External destinations: which are translated here and which not (why), the set of connects made on the
/// node (pods and host alike, kube-proxy's short-circuit), and the set traffic from outside the node gets
/// (externalTrafficPolicy applied), which the tc programs translate per packet.
fn external_text(out: &mut String, ext: &ExternalPlan, pp: &PortPlan, node: &NodeInfo, hinted: Hinted) {
    let _ = writeln!(out, "  external destinations (node ports, load-balancer IPs, external IPs):");
    if ext.frontends.is_empty() {
        let _ = writeln!(out, "    none translated on this node");
    }
    for f in &ext.frontends {
        let _ = write!(
            out,
            "    {} {}: translated for connects made on this node and for traffic from outside",
            f.kind.as_str(),
            f.addr
        );
        if !f.source_ranges.is_empty() {
            let ranges: Vec<String> = f.source_ranges.iter().map(ToString::to_string).collect();
            let _ = write!(
                out,
                " (from outside only for clients in {}: loadBalancerSourceRanges)",
                ranges.join(", ")
            );
        }
        out.push('\n');
    }
    for n in &ext.not_translated {
        let _ = writeln!(out, "    {} {}: NOT translated, {}", n.kind.as_str(), n.ip, n.text());
    }
    let _ = writeln!(
        out,
        "  connects to them from pods and from the node's own processes (kube-proxy short-circuits both to the \
         cluster-policy endpoints, whatever the traffic policies):"
    );
    traffic_text(out, &ext.from_node, pp, node, hinted);
    let outside = &ext.from_outside;
    let how = if outside.policy == Policy::Local {
        "this node's endpoints only, no source translation: the backend sees the client's address"
    } else {
        "a backend on another node gets the node's address as the source (SNAT; under the agent's --dsr an IPv4 \
         flow keeps the client's address and the reply leaves the backend's node: `tierlb status` says `dsr` \
         per frontend), one on this node the client's"
    };
    let _ = writeln!(
        out,
        "  traffic arriving from outside the node (externalTrafficPolicy {}; translated per packet by the tc \
         programs on the devices holding the node's NodePort addresses: {how}):",
        outside.policy.as_str()
    );
    let empty = match outside.when_empty {
        Some(WhenEmpty::Drop) => {
            " (none local: dropped, as kube-proxy drops it; the health check node port says 503)"
        }
        Some(WhenEmpty::Reject) => " (no endpoint: dropped; kube-proxy rejects it)",
        None => "",
    };
    let _ = writeln!(out, "    endpoints: {}{empty}", list(&outside.endpoints));
}

/// For `explain --bpffs`: the Service's backends that instance `inst`'s passive health follows now (held
/// down and skipped, half-open, or failing but still used) and those marked down by `tierlb backend down`.
pub fn skipped_now(inst: &crate::status::Instance, key: &ObjKey) -> String {
    let mut backends: Vec<&str> = inst
        .frontends
        .iter()
        .filter(|f| &f.name.service == key)
        .flat_map(|f| f.tiers.iter().flatten().map(|b| b.addr.as_str()))
        .collect();
    backends.sort_unstable();
    backends.dedup();
    let mut out = format!("\n  on instance {} now (its maps):\n", inst.instance);
    let mut any = false;
    for h in inst.health.iter().filter(|h| backends.contains(&h.backend.as_str())) {
        any = true;
        let _ = write!(
            out,
            "    {} {} by passive health (last failure: {}",
            h.backend,
            h.state.as_str(),
            h.reason
        );
        match h.left_seconds {
            Some(left) => {
                let _ = write!(out, ", {:.1} s left of hold {}", left, h.holds);
            }
            None => {
                let _ = write!(out, ", {} failed connects in a row", h.failures);
            }
        }
        out.push_str(")\n");
    }
    for m in inst.marks.iter().filter(|m| backends.contains(&m.backend.as_str())) {
        any = true;
        let _ = writeln!(
            out,
            "    {} marked down (tierlb backend down), {:.0} s left",
            m.backend, m.left_seconds
        );
    }
    if !any {
        out.push_str("    every backend is used (none held down by passive health or marked down)\n");
    }
    out
}
