//! Warnings about Service configurations that do not do what they seem to.
use crate::{
    model::{NodeInfo, Policy, Service},
    plan::PortEndpoint,
};

/// Warnings for one Service port on one node.
pub fn port_warnings(svc: &Service, _endpoints: &[PortEndpoint], _node: &NodeInfo) -> Vec<String> {
    let mut w = Vec::new();
    if svc.internal_policy == Policy::Local
        && let Some(td) = &svc.traffic_distribution
    {
        w.push(format!(
                "internalTrafficPolicy: Local overrides trafficDistribution: {td} (dead line): traffic stays on \
                 this node and is dropped when it has no ready endpoint; remove internalTrafficPolicy to get the \
                 {td} fallback"
            ));
    }
    w
}
