//! Lowering: from what the semantics decided (a plan per Service port) to what the maps hold (frontends,
//! tier lists, flags), and to what the servers report (health check node ports). The data path module never
//! sees a plan; this is the one place that turns kube-proxy's decisions into map contents.
use std::{net::SocketAddr, sync::Arc};

use lb_common::{
    FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL, FLAG_SNAT_TO_FRONTEND, FLAG_SOURCE_RANGES, FrontendKey,
};

use super::ServiceHealth;
use crate::{
    datapath::{Desired, DesiredFrontend, addr},
    model::{Policy, Service, ServicePortName},
    plan::{ExternalKind, PortPlan, TrafficPlan, WhenEmpty},
};

/// The frontends some planned Service ports ask for: one per cluster IP of each port, with the tiers of its
/// internal (ClusterIP) traffic, and one per external destination (node address x nodePort, load-balancer
/// IP, externalIP), with the tiers of connects made on the node (`ExternalPlan::from_node`, which pods
/// share), and again in the outside scope (`addr::outside_frontend_key`, the tc programs') with the tiers of
/// traffic from outside the node (`ExternalPlan::from_outside`, externalTrafficPolicy applied). A later port
/// wins a shared VIP:port; a cluster IP wins over an external address of the same Service.
///
/// Returned as a sorted `Frontends` list, not a map: the plans of every Service are held at once during a
/// full sync, and a map per Service took a B-tree leaf of about 1.2 KiB even for one frontend (at 100,000
/// Services the agent's peak RSS fell from 379 to 335 MiB without them). The map here lives only while this
/// Service is lowered.
pub(super) fn frontends(ports: &[PortPlan]) -> Frontends {
    let mut out = Desired::new();
    for p in ports {
        let proto = p.protocol.number();
        let affinity = p.session_affinity.map_or(0, |a| a.timeout_seconds);
        let name = Arc::new(p.name.clone());
        for ip in &p.cluster_ips {
            out.insert(addr::frontend_key(*ip, p.port, proto), desired(&name, &p.internal, proto, affinity));
        }
    }
    for p in ports {
        let Some(ext) = &p.external else { continue };
        let proto = p.protocol.number();
        let affinity = p.session_affinity.map_or(0, |a| a.timeout_seconds);
        let name = Arc::new(p.name.clone());
        for f in &ext.frontends {
            let key = addr::frontend_key(f.addr.ip(), f.addr.port(), proto);
            out.entry(key).or_insert_with(|| desired(&name, &ext.from_node, proto, affinity));
            // sessionAffinity for clients outside the node: keyed by their address (`OUTSIDE_AFFINITY`).
            let mut outside = desired(&name, &ext.from_outside, proto, affinity);
            if f.kind == ExternalKind::NodePort {
                // A node port's SNAT leaves from the node address the client reached.
                outside.flags |= FLAG_SNAT_TO_FRONTEND;
            }
            if !f.source_ranges.is_empty() {
                // Its ranges are written beside it (`north_south`); this flag makes the program check them.
                outside.flags |= FLAG_SOURCE_RANGES;
            }
            let key = addr::outside_frontend_key(f.addr.ip(), f.addr.port(), proto);
            out.entry(key).or_insert(outside);
        }
    }
    out.into_iter().collect()
}

/// The frontends one Service wants, sorted by key, each key once (what `frontends` returns).
pub(super) type Frontends = Vec<(FrontendKey, DesiredFrontend)>;

/// One frontend's map contents for traffic planned as `t`, with sessionAffinity for `affinity_timeout_s`
/// seconds (0: none).
fn desired(
    name: &Arc<ServicePortName>,
    t: &TrafficPlan,
    proto: u8,
    affinity_timeout_s: u32,
) -> DesiredFrontend {
    let convert = |v: &[SocketAddr]| v.iter().map(|a| addr::backend(*a, proto)).collect::<Vec<_>>();
    let tiers = [convert(&t.tiers.node), convert(&t.tiers.zone), convert(&t.tiers.cluster)];
    let mut flags = 0;
    if t.policy == Policy::Local {
        flags |= FLAG_POLICY_LOCAL;
    }
    // Which failure applies once every backend the tiers hold is gone or marked down: kube-proxy's DROP
    // when a Local policy finds endpoints only elsewhere, REJECT otherwise (the plan decided which).
    if t.when_all_down == WhenEmpty::Drop {
        flags |= FLAG_EMPTY_IS_DROP;
    }
    DesiredFrontend { name: name.clone(), tiers, flags, affinity_timeout_s }
}

/// kube-proxy's service health server data: for a Service with externalTrafficPolicy Local and a
/// `healthCheckNodePort`, how many ready local endpoints one port has on this node (terminating ones, which
/// the external traffic still uses when they are all it has, do not count: KEP-1669).
pub(super) fn health_port(svc: &Service, p: &PortPlan) -> Option<(u16, ServiceHealth)> {
    let (Some(port), Some(ext)) = (svc.health_check_node_port, &p.external) else { return None };
    let ext = &ext.from_outside;
    if ext.policy != Policy::Local {
        return None;
    }
    Some((
        port,
        ServiceHealth {
            namespace: svc.key.namespace.to_string(),
            name: svc.key.name.to_string(),
            local_endpoints: p.counts.local_ready,
        },
    ))
}
