//! From a plan to map contents, and the reconciler that writes only what changed.
pub mod addr;
#[cfg(target_os = "linux")]
pub mod destroy;
#[cfg(target_os = "linux")]
pub mod ebpf;
pub mod fake;
mod reconcile;

use std::collections::BTreeMap;

use lb_common::{
    Backend, COUNTERS_PER_SERVICE, FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL, FrontendKey, FrontendValue, SlotKey,
};
pub use reconcile::{AdoptReport, ApplyError, ApplyReport, DEFAULT_GRACE, Reconciler};

use crate::{
    model::Policy,
    plan::{Plan, PortPlan},
};

/// What one frontend (VIP, port, protocol) should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    /// `namespace/name` and port name, for messages and metrics.
    pub service: String,
    pub port_name: String,
    /// Backends per tier (node, zone, cluster).
    pub tiers: [Vec<Backend>; 3],
    pub flags: u32,
}

pub type Desired = BTreeMap<FrontendKey, DesiredFrontend>;

/// The map contents a plan asks for: one frontend per cluster IP of every planned port, with the tiers of its
/// internal (ClusterIP) traffic.
pub fn desired(plan: &Plan) -> Desired {
    desired_of(&plan.services)
}

/// The frontends of some planned Service ports (later ports win a shared VIP:port, as in `desired`).
pub fn desired_of(ports: &[PortPlan]) -> Desired {
    let mut out = Desired::new();
    for p in ports {
        let proto = p.protocol.number();
        let t = &p.internal;
        let convert =
            |v: &[std::net::SocketAddr]| v.iter().map(|a| addr::backend(*a, proto)).collect::<Vec<_>>();
        let tiers = [convert(&t.tiers.node), convert(&t.tiers.zone), convert(&t.tiers.cluster)];
        let mut flags = 0;
        if t.policy == Policy::Local {
            flags |= FLAG_POLICY_LOCAL;
            // Which failure applies once every local backend is gone (or marked down): kube-proxy's DROP when
            // endpoints exist elsewhere, REJECT when there are none at all.
            if p.has_any_endpoints {
                flags |= FLAG_EMPTY_IS_DROP;
            }
        }
        for ip in &p.cluster_ips {
            out.insert(
                addr::frontend_key(*ip, p.port, proto),
                DesiredFrontend {
                    service: p.service.clone(),
                    port_name: p.port_name.clone(),
                    tiers: tiers.clone(),
                    flags,
                },
            );
        }
    }
    out
}

/// A map operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("map {map} is full ({capacity} entries); raise its capacity with --max-{flag}")]
    Full { map: &'static str, capacity: u32, flag: &'static str },
    #[error("a tier of {len} backends does not fit a slot range (at most 65535)")]
    TierTooLong { len: usize },
    #[error("no free service id (all {capacity} in use); raise --max-services")]
    NoServiceId { capacity: u32 },
    #[error("map {map}: {source}")]
    Sys {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Everything the agent does to the maps. The aya implementation writes the kernel's maps; the fake keeps
/// them in memory for tests of the reconciler.
pub trait MapWriter {
    fn put_slot(&mut self, key: SlotKey, backend: Backend) -> Result<(), MapError>;
    fn delete_slot(&mut self, key: SlotKey) -> Result<(), MapError>;
    fn put_frontend(&mut self, key: FrontendKey, value: FrontendValue) -> Result<(), MapError>;
    fn delete_frontend(&mut self, key: FrontendKey) -> Result<(), MapError>;
    fn frontends(&self) -> Result<Vec<(FrontendKey, FrontendValue)>, MapError>;
    fn slot(&self, key: SlotKey) -> Result<Option<Backend>, MapError>;
    /// Mark a backend down (or up again). One map write; the data path skips it from the next connect on.
    fn set_backend_down(&mut self, backend: Backend, down: bool) -> Result<(), MapError>;
    fn backends_down(&self) -> Result<Vec<Backend>, MapError>;
    /// Counters of one service id, summed over CPUs.
    fn counters(&self, svc_id: u32) -> Result<[u64; COUNTERS_PER_SERVICE as usize], MapError>;
    fn reset_counters(&mut self, svc_id: u32) -> Result<(), MapError>;
    /// How many service ids the counter map has room for.
    fn max_services(&self) -> u32;
    /// Every slot key present (adoption removes slots no frontend points at).
    fn slot_keys(&self) -> Result<Vec<SlotKey>, MapError>;
    /// The `namespace/name:port` label of a service id (for status and adoption).
    fn put_name(&mut self, svc_id: u32, name: &str) -> Result<(), MapError>;
    fn delete_name(&mut self, svc_id: u32) -> Result<(), MapError>;
    fn name(&self, svc_id: u32) -> Result<Option<String>, MapError>;
}

/// The label stored for a frontend: `namespace/name:port` (`namespace/name` for an unnamed port).
pub fn label(service: &str, port_name: &str) -> String {
    if port_name.is_empty() { service.to_owned() } else { format!("{service}:{port_name}") }
}

/// Split a label back into Service and port name.
pub fn split_label(label: &str) -> (String, String) {
    match label.rsplit_once(':') {
        Some((s, p)) if s.contains('/') => (s.to_owned(), p.to_owned()),
        _ => (label.to_owned(), String::new()),
    }
}

/// A frontend as read back from the maps: its value and the backends of each tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBack {
    pub value: FrontendValue,
    pub tiers: [Vec<Backend>; 3],
}

/// Read every frontend and its tiers from the maps (what the data path sees now).
pub fn read_back(w: &impl MapWriter) -> Result<BTreeMap<FrontendKey, ReadBack>, MapError> {
    let mut out = BTreeMap::new();
    for (key, value) in w.frontends()? {
        let mut tiers: [Vec<Backend>; 3] = Default::default();
        for (t, range) in value.tiers.iter().enumerate() {
            for i in 0..u32::from(range.len) {
                let slot = SlotKey {
                    svc_id: value.svc_id,
                    generation: value.generation,
                    index: u32::from(range.start) + i,
                };
                if let Some(b) = w.slot(slot)? {
                    tiers[t].push(b);
                }
            }
        }
        out.insert(key, ReadBack { value, tiers });
    }
    Ok(out)
}
