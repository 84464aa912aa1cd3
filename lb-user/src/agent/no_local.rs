//! kube-proxy's count of Service ports with a Local traffic policy and no local endpoint
//! (`serviceNoLocalEndpointsTotalInternal` / `External` in its proxiers' `syncProxyRules`, exported as
//! `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy, ip_family}`): a port counts when its
//! Service has endpoints somewhere but none usable here under the Local policy, the case kube-proxy DROPs
//! (the plan's `WhenEmpty::Drop`). Kept Service by Service, so a sync that replans one Service walks nothing
//! else.
use std::collections::BTreeMap;

use crate::{
    model::{Family, ObjKey},
    plan::{PortPlan, WhenEmpty},
};

/// Which traffic a count is about: kube-proxy's `traffic_policy` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// ClusterIP traffic (`internal`).
    Internal,
    /// Node port, load-balancer and external IP traffic (`external`).
    External,
}

impl Traffic {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Internal => "internal",
            Self::External => "external",
        }
    }
}

/// Counts by family (IPv4, IPv6) and traffic (internal, external).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoLocalCounts([[usize; 2]; 2]);

impl NoLocalCounts {
    fn index(family: Family, traffic: Traffic) -> (usize, usize) {
        (usize::from(family == Family::V6), usize::from(traffic == Traffic::External))
    }

    /// The count of one family and traffic.
    pub fn get(&self, family: Family, traffic: Traffic) -> usize {
        let (f, t) = Self::index(family, traffic);
        self.0[f][t]
    }

    /// Every (family, traffic, count), IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = (Family, Traffic, usize)> + '_ {
        [Family::V4, Family::V6].into_iter().flat_map(move |f| {
            [Traffic::Internal, Traffic::External].into_iter().map(move |t| (f, t, self.get(f, t)))
        })
    }

    /// The ports of one Service's plans that count.
    fn of(plans: &[PortPlan]) -> Self {
        let mut c = Self::default();
        for p in plans {
            // kube-proxy counts external traffic as it handles traffic from outside the node (`from_outside`).
            let external = p.external.as_ref().map(|e| &e.from_outside);
            let traffic = [(Traffic::Internal, Some(&p.internal)), (Traffic::External, external)];
            for (t, plan) in traffic {
                if plan.is_some_and(|x| x.when_empty == Some(WhenEmpty::Drop)) {
                    let (f, t) = Self::index(p.family, t);
                    c.0[f][t] += 1;
                }
            }
        }
        c
    }

    fn add(&mut self, other: Self, sign: bool) {
        for (row, o) in self.0.iter_mut().zip(other.0) {
            for (x, y) in row.iter_mut().zip(o) {
                *x = if sign { *x + y } else { *x - y };
            }
        }
    }
}

/// The counts of every planned Service, and their sum.
#[derive(Debug, Default)]
pub(super) struct NoLocal {
    per_service: BTreeMap<ObjKey, NoLocalCounts>,
    total: NoLocalCounts,
}

impl NoLocal {
    /// Rebuild the map with full nodes (`compact::repack`).
    pub(super) fn repack(&mut self) {
        crate::model::compact::repack(&mut self.per_service);
    }

    /// Forget a Service (it is replanned, or gone).
    pub(super) fn remove(&mut self, key: &ObjKey) {
        if let Some(old) = self.per_service.remove(key) {
            self.total.add(old, false);
        }
    }

    /// A Service's new plans.
    pub(super) fn set(&mut self, key: &ObjKey, plans: &[PortPlan]) {
        self.remove(key);
        let c = NoLocalCounts::of(plans);
        if c != NoLocalCounts::default() {
            self.total.add(c, true);
            self.per_service.insert(key.clone(), c);
        }
    }

    /// Forget every Service (everything is replanned).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// The sum over every planned Service.
    pub(super) fn total(&self) -> NoLocalCounts {
        self.total
    }
}
