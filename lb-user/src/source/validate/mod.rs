//! The API server's validation of every field tierlb reads, so that a manifest the API server would refuse
//! is refused here too, naming the field and the fix, instead of being planned in some way kube-proxy never
//! sees. Mirrors Kubernetes 1.35: `ValidateService`, `validateServicePort`,
//! `ValidateServiceClusterIPsRelatedFields`, `validateServiceExternalTrafficPolicy` and
//! `ValidateEndpointIP` (pkg/apis/core/validation/validation.go), `ValidateEndpointSlice` (pkg/apis/discovery/
//! validation/validation.go), `ValidateNode` with `ValidateResourceQuantityValue`, and the strict IP parsing
//! of new objects (`IsValidIPForLegacyField` with `StrictIPCIDRValidation`).
//!
//! The API server defaults some fields before it validates (port protocols to TCP, `clusterIP` from
//! `clusterIPs[0]` and back, EndpointSlice port names to ""); a manifest is read with the same defaults.
//! Deliberately not refused: `trafficDistribution` values tierlb does not know (the API server of a newer
//! release may know them, and kube-proxy never reads the field; `plan` lints them instead).
mod names;
pub(crate) mod quantity;

use std::{collections::BTreeSet, net::IpAddr};

use k8s_openapi::{
    api::{core::v1 as core, discovery::v1 as discovery},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use self::names::{dns1035_label, dns1123_label, dns1123_subdomain, label_value, non_special_ip, strict_ip};
use super::fields::{self, FieldError, LABEL_SERVICE_NAME, LABEL_ZONE, Lazy, Path};

/// EndpointSlice limits of the API server (`maxEndpoints`, `maxAddresses`, `maxPorts`, `maxZoneHints`,
/// `maxNodeHints`).
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_SLICE_PORTS: usize = 20_000;
const MAX_HINTS: usize = 8;

/// Collects the problems of one object.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl Path, message: impl Into<String>) {
        self.0.push(fields::err(field, message));
    }
    fn check(&mut self, field: impl Path, r: Result<(), String>) {
        if let Err(m) = r {
            self.push(field, m);
        }
    }
}

/// `ValidateObjectMeta`: the name (by the kind's rule) and the namespace (a DNS-1123 label).
fn meta(e: &mut Errors, meta: &ObjectMeta, name_rule: fn(&str) -> Result<(), String>, namespaced: bool) {
    match meta.name.as_deref() {
        None | Some("") => e.push("metadata.name", "missing: every object needs a name"),
        Some(n) => e.check("metadata.name", name_rule(n)),
    }
    if namespaced && let Some(ns) = meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        e.check("metadata.namespace", dns1123_label(ns));
    }
}

fn port_number(e: &mut Errors, field: impl Path, value: i32) {
    if !(1..=65535).contains(&value) {
        e.push(field, format!("port {value} is out of range (1-65535)"));
    }
}

/// Port protocols: the API server defaults a missing one to TCP, and supports TCP, UDP and SCTP.
fn protocol(e: &mut Errors, field: impl Path, value: Option<&str>) -> &'static str {
    match value.unwrap_or("TCP") {
        "TCP" => "TCP",
        "UDP" => "UDP",
        "SCTP" => "SCTP",
        other => {
            e.push(field, format!("unknown protocol {other:?}: use TCP, UDP or SCTP (upper case)"));
            "?"
        }
    }
}

/// An address a connect is rewritten to, or accepted on from outside: strict syntax, and not special.
fn routable_ip(e: &mut Errors, field: impl Path, raw: &str, fix: &str) -> Option<IpAddr> {
    match strict_ip(raw).and_then(|ip| non_special_ip(ip, fix).map(|()| ip)) {
        Ok(ip) => Some(ip),
        Err(m) => {
            e.push(field, m);
            None
        }
    }
}

/// A Service's spec, borrowed (an empty one when it has none), not cloned per Service.
pub(super) fn spec_of(svc: &core::Service) -> &core::ServiceSpec {
    static NO_SPEC: std::sync::LazyLock<core::ServiceSpec> = std::sync::LazyLock::new(Default::default);
    svc.spec.as_ref().unwrap_or(&NO_SPEC)
}

/// `ValidateService`, for the fields tierlb reads.
pub(crate) fn service(svc: &core::Service) -> Vec<FieldError> {
    let mut e = Errors::default();
    meta(&mut e, &svc.metadata, dns1035_label, true);
    let spec = spec_of(svc);
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if !matches!(type_, "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName") {
        e.push(
            "spec.type",
            format!("unknown Service type {type_:?}: use ClusterIP, NodePort, LoadBalancer or ExternalName"),
        );
    }
    let ips = cluster_ips(&mut e, spec, type_);
    let headless = ips.as_slice() == ["None"];
    ports(&mut e, spec, type_, headless);
    for (i, raw) in spec.external_ips.iter().flatten().enumerate() {
        routable_ip(
            &mut e,
            Lazy(|| format!("spec.externalIPs[{i}]")),
            raw,
            "use the address clients reach the node by",
        );
    }
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        // `ValidateLoadBalancerStatus`: a valid IP (the load balancer's, so any range).
        if let Some(raw) = &ing.ip
            && let Err(m) = strict_ip(raw)
        {
            e.push(Lazy(|| format!("status.loadBalancer.ingress[{i}].ip")), m);
        }
    }
    traffic_policies(&mut e, spec, type_);
    e.0
}

/// `ValidateServiceClusterIPsRelatedFields`: at most two, one per family, "None" only alone, `clusterIP`
/// equal to `clusterIPs[0]`; none for ExternalName. Returns the IPs as written (after the API server's
/// defaulting of one from the other).
fn cluster_ips(e: &mut Errors, spec: &core::ServiceSpec, type_: &str) -> Vec<String> {
    let list = spec.cluster_ips.clone().unwrap_or_default();
    let single = spec.cluster_ip.clone().filter(|s| !s.is_empty());
    if let (Some(one), Some(first)) = (&single, list.first())
        && one != first
    {
        e.push(
            "spec.clusterIPs",
            format!("clusterIPs[0] ({first}) must equal clusterIP ({one}): write the same address in both, or only one of them"),
        );
    }
    let ips = if list.is_empty() { single.into_iter().collect() } else { list };
    if type_ == "ExternalName" {
        if !ips.is_empty() {
            e.push(
                "spec.clusterIPs",
                "may not be set for an ExternalName Service: remove clusterIP and clusterIPs",
            );
        }
        return ips;
    }
    if ips.len() > 2 {
        e.push(
            "spec.clusterIPs",
            format!("{} addresses; it may hold at most 2 (one IPv4 and one IPv6)", ips.len()),
        );
    }
    let mut families = BTreeSet::new();
    for (i, raw) in ips.iter().enumerate() {
        let field = Lazy(move || format!("spec.clusterIPs[{i}]"));
        if raw == "None" {
            if ips.len() > 1 {
                e.push(field, "\"None\" (headless) must be the only value");
            }
            continue;
        }
        // The API server's allocator only hands out addresses of the service CIDR; tierlb does not know it,
        // but a VIP in these ranges would capture the node's own loopback or link-local traffic.
        if let Some(ip) = routable_ip(e, field, raw, "use an address of the cluster's service CIDR")
            && !families.insert(ip.is_ipv4())
        {
            e.push(field, format!("{raw}: a second address of the same family; clusterIPs may hold one IPv4 and one IPv6 address"));
        }
    }
    ips
}

/// `validateServicePort` and the duplicate checks of `ValidateService`.
fn ports(e: &mut Errors, spec: &core::ServiceSpec, type_: &str, headless: bool) {
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ports.is_empty() && !headless && type_ != "ExternalName" {
        e.push("spec.ports", "missing: a Service with a cluster IP needs at least one port");
    }
    let require_name = ports.len() > 1;
    let mut names = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut node_ports = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = |f: &'static str| Lazy(move || format!("spec.ports[{i}].{f}"));
        match p.name.as_deref().unwrap_or_default() {
            "" if require_name => {
                e.push(at("name"), "missing: every port of a Service with several ports needs a name");
            }
            "" => {}
            name => {
                e.check(at("name"), dns1123_label(name));
                if !names.insert(name) {
                    e.push(at("name"), format!("duplicate port name {name:?}: give each port its own name"));
                }
            }
        }
        port_number(e, at("port"), p.port);
        let proto = protocol(e, at("protocol"), p.protocol.as_deref());
        if !seen.insert((p.port, proto)) {
            e.push(
                at("port"),
                format!("duplicate port {}/{proto}: each port and protocol may appear once", p.port),
            );
        }
        if let Some(n) = p.node_port.filter(|n| *n != 0) {
            port_number(e, at("nodePort"), n);
            if type_ == "ClusterIP" || type_ == "ExternalName" {
                e.push(
                    at("nodePort"),
                    format!(
                        "may not be set when type is {type_}: remove it, or use type NodePort or LoadBalancer"
                    ),
                );
            } else if !node_ports.insert((n, proto)) {
                e.push(at("nodePort"), format!("duplicate nodePort {n}/{proto}"));
            }
        }
    }
}

/// `validateServiceInternalTrafficFieldsValue` and `validateServiceExternalTrafficPolicy`.
fn traffic_policies(e: &mut Errors, spec: &core::ServiceSpec, type_: &str) {
    let policy = |e: &mut Errors, field: &str, v: Option<&str>| {
        if let Err(err) = fields::policy(field, v) {
            e.0.push(err);
        }
    };
    policy(e, "spec.internalTrafficPolicy", spec.internal_traffic_policy.as_deref());
    policy(e, "spec.externalTrafficPolicy", spec.external_traffic_policy.as_deref());
    // `apiservice.ExternallyAccessible`: NodePort, LoadBalancer, or a ClusterIP Service with external IPs.
    let external = matches!(type_, "NodePort" | "LoadBalancer")
        || (type_ == "ClusterIP" && spec.external_ips.as_ref().is_some_and(|v| !v.is_empty()));
    if spec.external_traffic_policy.as_deref().is_some_and(|v| !v.is_empty()) && !external {
        e.push(
            "spec.externalTrafficPolicy",
            "may only be set on an externally reachable Service (type NodePort or LoadBalancer, or with externalIPs): remove it",
        );
    }
    if let Some(n) = spec.health_check_node_port.filter(|n| *n != 0) {
        port_number(e, "spec.healthCheckNodePort", n);
        if type_ != "LoadBalancer" || spec.external_traffic_policy.as_deref() != Some("Local") {
            e.push(
                "spec.healthCheckNodePort",
                "may only be set when type is LoadBalancer and externalTrafficPolicy is Local",
            );
        }
    }
}

/// `ValidateEndpointSlice`, for the fields tierlb reads.
pub(crate) fn endpoint_slice(slice: &discovery::EndpointSlice) -> Vec<FieldError> {
    let mut e = Errors::default();
    meta(&mut e, &slice.metadata, dns1123_subdomain, true);
    if let Some(svc) = slice.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) {
        e.check(Lazy(|| format!("metadata.labels[{LABEL_SERVICE_NAME}]")), label_value(svc));
    }
    let family = match slice.address_type.as_str() {
        "IPv4" => Some(true),
        "IPv6" => Some(false),
        "FQDN" => None,
        "" => {
            e.push("addressType", "missing: use IPv4, IPv6 or FQDN");
            None
        }
        other => {
            e.push("addressType", format!("unknown address type {other:?}: use IPv4, IPv6 or FQDN"));
            None
        }
    };
    if slice.endpoints.len() > MAX_ENDPOINTS {
        e.push(
            "endpoints",
            format!("{} endpoints; at most {MAX_ENDPOINTS} per slice: split it", slice.endpoints.len()),
        );
        return e.0;
    }
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let at = |f: &'static str| Lazy(move || format!("endpoints[{i}].{f}"));
        if ep.addresses.is_empty() {
            e.push(at("addresses"), "missing: an endpoint needs at least one address");
        } else if ep.addresses.len() > MAX_ADDRESSES {
            e.push(at("addresses"), format!("{} addresses; at most {MAX_ADDRESSES}", ep.addresses.len()));
        }
        // FQDN addresses are never translated, so tierlb does not read them.
        if let Some(v4) = family {
            for (j, raw) in ep.addresses.iter().enumerate() {
                let field = Lazy(move || format!("endpoints[{i}].addresses[{j}]"));
                if let Some(ip) = routable_ip(&mut e, field, raw, "use the pod's address")
                    && ip.is_ipv4() != v4
                {
                    e.push(
                        field,
                        format!(
                            "{raw} does not match addressType {}: put it in an {} slice",
                            slice.address_type,
                            if v4 { "IPv6" } else { "IPv4" }
                        ),
                    );
                }
            }
        }
        if let Some(n) = &ep.node_name {
            e.check(at("nodeName"), dns1123_subdomain(n));
        }
        // The controller copies `zone` from the Node's topology.kubernetes.io/zone label.
        if let Some(z) = &ep.zone {
            e.check(at("zone"), label_value(z));
        }
        if let Some(h) = &ep.hints {
            hints(&mut e, at("hints"), h);
        }
    }
    slice_ports(&mut e, slice.ports.as_deref().unwrap_or_default());
    e.0
}

/// A name rule (`dns1123_label`, `label_value`, ...).
type Rule = fn(&str) -> Result<(), String>;

/// `validateHints`: at most 8 of each, no duplicates, zone names as label values, node names as Node names.
fn hints(e: &mut Errors, at: impl Path + Copy, h: &discovery::EndpointHints) {
    let zones = h.for_zones.as_deref().unwrap_or_default().iter().map(|z| z.name.as_str());
    let nodes = h.for_nodes.as_deref().unwrap_or_default().iter().map(|n| n.name.as_str());
    let kinds: [(&str, Vec<&str>, Rule); 2] =
        [("forZones", zones.collect(), label_value), ("forNodes", nodes.collect(), dns1123_subdomain)];
    for (kind, list, rule) in kinds {
        if list.len() > MAX_HINTS {
            e.push(
                Lazy(|| format!("{}.{kind}", at.path())),
                format!("{} hints; at most {MAX_HINTS}", list.len()),
            );
            continue;
        }
        let mut seen = BTreeSet::new();
        for (i, name) in list.into_iter().enumerate() {
            let field = Lazy(move || format!("{}.{kind}[{i}].name", at.path()));
            e.check(field, rule(name));
            if !seen.insert(name) {
                e.push(field, format!("duplicate hint {name:?}"));
            }
        }
    }
}

/// `validatePorts` of `ValidateEndpointSlice`: names (DNS-1123 labels, defaulted to "", unique), protocols,
/// numbers.
fn slice_ports(e: &mut Errors, ports: &[discovery::EndpointPort]) {
    if ports.len() > MAX_SLICE_PORTS {
        e.push("ports", format!("{} ports; at most {MAX_SLICE_PORTS}", ports.len()));
        return;
    }
    let mut names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = |f: &'static str| Lazy(move || format!("ports[{i}].{f}"));
        let name = p.name.as_deref().unwrap_or_default();
        if !name.is_empty() {
            e.check(at("name"), dns1123_label(name));
        }
        if !names.insert(name) {
            e.push(
                at("name"),
                format!("duplicate port name {name:?}: each port of a slice needs its own name"),
            );
        }
        protocol(e, at("protocol"), p.protocol.as_deref());
        if let Some(n) = p.port {
            port_number(e, at("port"), n);
        }
    }
}

/// `ValidateNode`, for the fields tierlb reads: the name, the zone label and allocatable CPU (a
/// non-negative quantity, `ValidateResourceQuantityValue`).
pub(crate) fn node(node: &core::Node) -> Vec<FieldError> {
    let mut e = Errors::default();
    meta(&mut e, &node.metadata, dns1123_subdomain, false);
    if let Some(z) = node.metadata.labels.as_ref().and_then(|l| l.get(LABEL_ZONE)) {
        e.check(Lazy(|| format!("metadata.labels[{LABEL_ZONE}]")), label_value(z));
    }
    let cpu = node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get("cpu"));
    if let Some(q) = cpu {
        e.check("status.allocatable.cpu", quantity::cpu_millis(&q.0).map(|_| ()));
    }
    e.0
}
