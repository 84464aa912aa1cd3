//! `tierlb_service_topology` and `tierlb_service_ready_endpoints`: per Service port and family, what the
//! Service asks for, what this node applies to internal traffic and why, and how many ready endpoints carry
//! node and zone hints. The agent hands these as plain label values read off its plans (the plan decides;
//! this module only writes them out), so the cardinality is one topology series and four endpoint series per
//! Service port and family, never per endpoint.
use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{Labels, gauge};
use crate::model::{Family as IpFamily, ServicePortName};

/// One Service port in one family, as the agent planned it last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceTopology {
    /// The Service port.
    pub name: ServicePortName,
    /// Its IP family.
    pub family: IpFamily,
    /// `plan::Requested::as_str`.
    pub requested: &'static str,
    /// `plan::SelectedTier::as_str` of internal traffic.
    pub applied: &'static str,
    /// `plan::TopologyReason::as_str`.
    pub reason: &'static str,
    /// Ready endpoints.
    pub ready: usize,
    /// Ready endpoints with a node hint.
    pub ready_node_hinted: usize,
    /// Ready endpoints with a zone hint.
    pub ready_zone_hinted: usize,
}

impl ServiceTopology {
    fn base(&self) -> Labels {
        vec![
            ("service".into(), self.name.service.to_string()),
            ("port".into(), self.name.port.clone()),
            ("family".into(), self.family.as_str().into()),
        ]
    }
}

/// Register both families with one series per row (and four endpoint counts per row).
pub(super) fn register(reg: &mut Registry, rows: &[ServiceTopology]) {
    let topo = Family::<Labels, Gauge>::default();
    reg.register(
        "service_topology",
        "1 per Service port and family: the topology it requests (trafficDistribution, Auto for the annotation, \
         Local for internalTrafficPolicy Local, none), the tier this node applies to internal traffic (node, zone, \
         cluster, local, none) and why (a closed set, see docs/cli.md)",
        topo.clone(),
    );
    let ready = Family::<Labels, Gauge>::default();
    reg.register(
        "service_ready_endpoints",
        "Ready endpoints of a Service port and family with (hinted=true) and without (hinted=false) a hint of \
         each kind (hint=node: forNodes, hint=zone: forZones)",
        ready.clone(),
    );
    for r in rows {
        let mut l = r.base();
        l.push(("requested".into(), r.requested.into()));
        l.push(("applied".into(), r.applied.into()));
        l.push(("reason".into(), r.reason.into()));
        topo.get_or_create(&l).set(1);
        for (hint, with) in [("node", r.ready_node_hinted), ("zone", r.ready_zone_hinted)] {
            for (hinted, n) in [("true", with), ("false", r.ready.saturating_sub(with))] {
                let mut l = r.base();
                l.push(("hint".into(), hint.into()));
                l.push(("hinted".into(), hinted.into()));
                ready.get_or_create(&l).set(gauge(n));
            }
        }
    }
}
