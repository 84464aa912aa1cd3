//! What `/metrics` says of each Service port's topology (`metrics::ServiceTopology`), from the plans the agent
//! made: the plan's decision read off (`plan::summarize`), kept Service by Service like `no_local`, so a sync
//! that replans one Service walks nothing else; the whole list is built again only when a snapshot asks for it
//! after a change.
use std::{collections::BTreeMap, sync::Arc};

use crate::{
    metrics::ServiceTopology,
    model::{Family, ObjKey, Service, ServicePortName},
    plan::{self, PortPlan, Requested, SelectedTier, TopologyReason},
};

/// One `ServiceTopology` as it is kept: the plan's decision as its enums and the counts as `u32` (56 bytes a
/// Service port; the metrics row, with three label strings and `usize` counts, takes 120).
#[derive(Debug, PartialEq, Eq)]
struct Row {
    name: ServicePortName,
    family: Family,
    requested: Requested,
    applied: SelectedTier,
    reason: TopologyReason,
    ready: u32,
    ready_node_hinted: u32,
    ready_zone_hinted: u32,
}

const _: () = assert!(size_of::<Row>() <= 56);

impl Row {
    fn metrics(&self) -> ServiceTopology {
        ServiceTopology {
            name: self.name.clone(),
            family: self.family,
            requested: self.requested.as_str(),
            applied: self.applied.as_str(),
            reason: self.reason.as_str(),
            ready: self.ready as usize,
            ready_node_hinted: self.ready_node_hinted as usize,
            ready_zone_hinted: self.ready_zone_hinted as usize,
        }
    }
}

/// The topology rows of every planned Service.
#[derive(Default)]
pub(super) struct Topology {
    by_service: BTreeMap<ObjKey, Box<[Row]>>,
    /// The list as last built; `None` after a change.
    all: Option<Arc<Vec<ServiceTopology>>>,
}

impl Topology {
    /// Rebuild the map with full nodes (`compact::repack`).
    pub(super) fn repack(&mut self) {
        crate::model::compact::repack(&mut self.by_service);
    }
}

/// The rows of one Service's plans, planned on hints the agent wrote itself if `emulated`.
fn rows(svc: &Service, plans: &[PortPlan], emulated: bool) -> Box<[Row]> {
    plans
        .iter()
        .map(|p| {
            let s = plan::summarize(svc, p).emulated(emulated);
            Row {
                name: p.name.clone(),
                family: p.family,
                requested: s.requested,
                applied: s.applied,
                reason: s.reason,
                ready: count(p.counts.ready),
                ready_node_hinted: count(p.counts.ready_node_hinted),
                ready_zone_hinted: count(p.counts.ready_zone_hinted),
            }
        })
        .collect()
}

/// An endpoint count as a row keeps it (a Service has far fewer than 4 billion).
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Topology {
    /// `svc`'s rows are those of `plans` now (planned on hints the agent wrote itself if `emulated`).
    pub(super) fn set(&mut self, svc: &Service, plans: &[PortPlan], emulated: bool) {
        let new = rows(svc, plans, emulated);
        if self.by_service.get(&svc.key) != Some(&new) {
            self.by_service.insert(svc.key.clone(), new);
            self.all = None;
        }
    }

    /// `key` is no longer planned.
    pub(super) fn remove(&mut self, key: &ObjKey) {
        if self.by_service.remove(key).is_some() {
            self.all = None;
        }
    }

    /// Forget every Service (a full replan follows).
    pub(super) fn clear(&mut self) {
        self.by_service.clear();
        self.all = None;
    }

    /// Whether a row changed since `all` was last called.
    pub(super) fn changed(&self) -> bool {
        self.all.is_none()
    }

    /// Every row, in Service order.
    pub(super) fn all(&mut self) -> Arc<Vec<ServiceTopology>> {
        self.all
            .get_or_insert_with(|| Arc::new(self.by_service.values().flatten().map(Row::metrics).collect()))
            .clone()
    }
}
