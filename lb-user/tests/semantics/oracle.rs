//! A second, independent implementation of kube-proxy's endpoint selection, for the property tests
//! (`props.rs`): written from kube-proxy 1.35's source, not from tierlb's, and it never calls tierlb's plan
//! code; it reads only the model's plain data types.
//!
//! - merging slices: pkg/proxy/endpointslicecache.go (`endpointInfoByServicePort`, `addEndpoints`): a slice
//!   port is matched by name and protocol, only `addresses[0]` counts, an `ip:port` already seen is replaced
//!   only by a local copy (`!exists || isLocal`);
//! - which addresses a family's proxier sees: pkg/proxy/servicechangetracker / servicePort.go
//!   (`newBaseServiceInfo` keeps the externalIPs and VIP-mode ingress IPs of its own family;
//!   `ExternallyAccessible` is then per family);
//! - the selection: pkg/proxy/topology.go (`CategorizeEndpoints`, `topologyModeFromHints`,
//!   `availableForTopology`), transcribed branch by branch.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use tierlb::model::{
    AddressType, EndpointSlice, Family, Policy, Protocol, Service, ServicePort, ServiceType,
};

/// kube-proxy's `Endpoint` as `CategorizeEndpoints` reads it (`BaseEndpointInfo`).
#[derive(Clone, Debug)]
pub(crate) struct KpEndpoint {
    pub(crate) addr: SocketAddr,
    pub(crate) is_local: bool,
    pub(crate) ready: bool,
    pub(crate) serving: bool,
    pub(crate) terminating: bool,
    /// `ZoneHints()`: a set, empty when `hints.forZones` is absent or empty.
    pub(crate) zone_hints: BTreeSet<String>,
    /// `NodeHints()`.
    pub(crate) node_hints: BTreeSet<String>,
}

/// endpointslicecache.go: the endpoints of one Service port (name, protocol) from the slices a proxier of
/// `family` receives (the dual-stack meta-proxier hands each proxier the slices of its `addressType`; FQDN
/// slices go to none).
pub(crate) fn endpoints(
    slices: &[&EndpointSlice],
    port: &ServicePort,
    family: Family,
    node: &str,
) -> Vec<KpEndpoint> {
    let mut set: BTreeMap<SocketAddr, KpEndpoint> = BTreeMap::new();
    let wanted = if family == Family::V4 { AddressType::IPv4 } else { AddressType::IPv6 };
    for slice in slices.iter().filter(|s| s.address_type == wanted) {
        for sp in slice.ports.iter().filter(|sp| sp.name == port.name && sp.protocol == port.protocol) {
            for ep in &slice.endpoints {
                // `len(endpoint.Addresses) == 0`: skipped.
                let Some(ip) = ep.address else { continue };
                let is_local = ep.node_name.as_deref() == Some(node);
                let set_of = |v: Option<&tierlb::model::NameList>| {
                    v.iter().flat_map(|l| l.iter()).map(ToString::to_string).collect::<BTreeSet<_>>()
                };
                let info = KpEndpoint {
                    addr: SocketAddr::new(ip, sp.port),
                    is_local,
                    ready: ep.conditions.ready.is_none_or(|r| r),
                    serving: ep.conditions.serving.is_none_or(|s| s),
                    terminating: ep.conditions.terminating == Some(true),
                    zone_hints: set_of(ep.hints.for_zones()),
                    node_hints: set_of(ep.hints.for_nodes()),
                };
                if !set.contains_key(&info.addr) || is_local {
                    set.insert(info.addr, info);
                }
            }
        }
    }
    set.into_values().collect()
}

/// `newBaseServiceInfo` + `ExternallyAccessible` for the proxier of `family`.
pub(crate) fn externally_accessible(svc: &Service, port: &ServicePort, family: Family) -> bool {
    let of_family = |ips: &[IpAddr]| ips.iter().any(|ip| Family::of(ip) == family);
    port.node_port.is_some_and(|p| p != 0)
        || of_family(&svc.load_balancer_ips)
        || of_family(&svc.external_ips)
}

/// `topologyModeFromHints`' result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// "".
    None,
    /// "PreferSameZone".
    SameZone,
    /// "PreferSameNode" (the PreferSameTrafficDistribution gate is on in 1.35).
    SameNode,
}

/// What `CategorizeEndpoints` returns (`allReachableEndpoints` is not needed), and the mode it used.
#[derive(Clone, Debug)]
pub(crate) struct Categorized {
    pub(crate) cluster: Option<Vec<SocketAddr>>,
    pub(crate) local: Option<Vec<SocketAddr>>,
    pub(crate) has_any: bool,
    pub(crate) mode: Mode,
}

/// `topologyModeFromHints`.
pub(crate) fn topology_mode(endpoints: &[KpEndpoint], node: &str, zone: &str) -> Mode {
    let mut has_endpoint_for_node = false;
    let mut all_have_node_hints = true;
    let mut has_endpoint_for_zone = false;
    let mut all_have_zone_hints = true;
    for ep in endpoints {
        if !ep.ready {
            continue;
        }
        if ep.node_hints.is_empty() {
            all_have_node_hints = false;
        } else if ep.node_hints.contains(node) {
            has_endpoint_for_node = true;
        }
        if ep.zone_hints.is_empty() {
            all_have_zone_hints = false;
        } else if ep.zone_hints.contains(zone) {
            has_endpoint_for_zone = true;
        }
    }
    if all_have_node_hints && has_endpoint_for_node {
        return Mode::SameNode;
    }
    if all_have_zone_hints && has_endpoint_for_zone {
        return Mode::SameZone;
    }
    Mode::None
}

/// `availableForTopology`.
pub(crate) fn available_for_topology(ep: &KpEndpoint, mode: Mode, node: &str, zone: &str) -> bool {
    match mode {
        Mode::None => true,
        Mode::SameNode => ep.node_hints.contains(node),
        Mode::SameZone => ep.zone_hints.contains(zone),
    }
}

fn filter(endpoints: &[KpEndpoint], pred: impl Fn(&KpEndpoint) -> bool) -> Vec<SocketAddr> {
    endpoints.iter().filter(|e| pred(e)).map(|e| e.addr).collect()
}

/// `CategorizeEndpoints`. `zone` is `nodeLabels["topology.kubernetes.io/zone"]`: "" when the label is absent.
pub(crate) fn categorize(
    endpoints: &[KpEndpoint],
    uses_cluster: bool,
    uses_local: bool,
    node: &str,
    zone: &str,
) -> Categorized {
    let mut mode = Mode::None;
    let mut cluster = None;
    let mut has_any = false;
    if uses_cluster {
        mode = topology_mode(endpoints, node, zone);
        let mut c = filter(endpoints, |ep| ep.ready && available_for_topology(ep, mode, node, zone));
        if c.is_empty() {
            c = filter(endpoints, |ep| ep.serving && ep.terminating);
        }
        if !c.is_empty() {
            has_any = true;
        }
        cluster = Some(c);
    }
    if !uses_local {
        return Categorized { cluster, local: None, has_any, mode };
    }
    let (mut local_ready, mut local_serving_terminating) = (false, false);
    for ep in endpoints {
        if ep.ready {
            has_any = true;
            local_ready |= ep.is_local;
        } else if ep.serving && ep.terminating {
            has_any = true;
            local_serving_terminating |= ep.is_local;
        }
    }
    let local = if local_ready {
        filter(endpoints, |ep| ep.is_local && ep.ready)
    } else if local_serving_terminating {
        filter(endpoints, |ep| ep.is_local && ep.serving && ep.terminating)
    } else {
        Vec::new()
    };
    Categorized { cluster, local: Some(local), has_any, mode }
}

/// One port in one family, as kube-proxy's proxier of that family sees it on `node`.
pub(crate) struct Expected {
    pub(crate) categorized: Categorized,
    pub(crate) itp_local: bool,
    pub(crate) etp_local: bool,
    pub(crate) externally_accessible: bool,
    pub(crate) endpoints: Vec<KpEndpoint>,
}

/// `newBaseServiceInfo`'s policies, `UsesClusterEndpoints`/`UsesLocalEndpoints`, then `CategorizeEndpoints`.
pub(crate) fn expected(
    svc: &Service,
    port: &ServicePort,
    family: Family,
    slices: &[&EndpointSlice],
    node: &str,
    zone_label: Option<&str>,
) -> Expected {
    let endpoints = endpoints(slices, port, family, node);
    let accessible = externally_accessible(svc, port, family);
    let itp_local = svc.internal_policy == Policy::Local;
    // apiservice.ExternalPolicyLocal: the policy of a Service that is externally accessible at all, by its
    // type (pkg/api/v1/service/util.go `ExternallyAccessible`), whatever the family.
    let service_accessible = match svc.type_ {
        ServiceType::LoadBalancer | ServiceType::NodePort => true,
        ServiceType::ClusterIP => !svc.external_ips.is_empty(),
        ServiceType::ExternalName => false,
    };
    let etp_local = svc.external_policy == Policy::Local && service_accessible;
    let uses_cluster = !itp_local || accessible;
    let uses_local = itp_local || (etp_local && accessible);
    let categorized = categorize(&endpoints, uses_cluster, uses_local, node, zone_label.unwrap_or(""));
    Expected { categorized, itp_local, etp_local, externally_accessible: accessible, endpoints }
}

/// tierlb translates TCP and UDP ports only (a documented choice of tierlb's, not kube-proxy's).
pub(crate) fn translated(protocol: Protocol) -> bool {
    protocol != Protocol::Sctp
}
