//! What one Service may take of the node's maps (`--max-*-per-service`): every backend is copied into every
//! frontend of its Service, so one Service with many externalIPs and many endpoints would fill `SLOTS` (or
//! `FRONTENDS`) and every other Service's next update would fail. A Service over a limit is refused as a
//! whole: it keeps what it has programmed (nothing, if it is new), says why (the log, `/healthz`'s
//! `unprogrammedServices`, `tierlb_services_unprogrammed`), and the others are planned and written as usual.
//! The cheap limits (externalIPs, endpoints) are checked before the Service is planned, so an oversized one
//! costs no planning either.
use std::{collections::BTreeMap, time::SystemTime};

use lb_common::FrontendKey;

use crate::{
    datapath::DesiredFrontend,
    model::{Model, ObjKey, Service},
};

/// The limits, with the flags that set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceLimits {
    /// Frontends (VIP or node address, port, protocol) of one Service (`--max-frontends-per-service`).
    pub frontends: usize,
    /// Backend slots of one Service over its frontends' tiers (`--max-slots-per-service`).
    pub slots: usize,
    /// `spec.externalIPs` of one Service (`--max-external-ips-per-service`).
    pub external_ips: usize,
    /// Endpoints of one Service over its EndpointSlices (`--max-endpoints-per-service`).
    pub endpoints: usize,
}

/// The defaults: far above what a Service needs (kube-proxy has no such limits), far below what would starve
/// the others at the default map capacities (131,072 slots take at most about 20,000 of the slot map's
/// 1,048,576 entries: 16,384 full ones and one partly filled per frontend).
pub const DEFAULT_LIMITS: ServiceLimits =
    ServiceLimits { frontends: 4096, slots: 131_072, external_ips: 1024, endpoints: 50_000 };

impl Default for ServiceLimits {
    fn default() -> Self {
        DEFAULT_LIMITS
    }
}

impl ServiceLimits {
    /// Why `svc` may not be planned at all: too many externalIPs or endpoints.
    pub fn before_planning(&self, model: &Model, svc: &Service) -> Option<String> {
        if svc.external_ips.len() > self.external_ips {
            return Some(format!(
                "{} externalIPs, more than one Service may have (--max-external-ips-per-service {})",
                svc.external_ips.len(),
                self.external_ips
            ));
        }
        let endpoints: usize = model.slices_of(&svc.key).map(|s| s.endpoints.len()).sum();
        (endpoints > self.endpoints).then(|| {
            format!(
                "{endpoints} endpoints in its EndpointSlices, more than one Service may have \
                 (--max-endpoints-per-service {})",
                self.endpoints
            )
        })
    }

    /// Why the frontends a Service wants may not be written: too many frontends or slots.
    pub fn after_planning(&self, mine: &[(FrontendKey, DesiredFrontend)]) -> Option<String> {
        if mine.len() > self.frontends {
            return Some(format!(
                "{} frontends, more than one Service may have (--max-frontends-per-service {})",
                mine.len(),
                self.frontends
            ));
        }
        let slots: usize = mine.iter().map(|(_, d)| d.tiers.iter().map(Vec::len).sum::<usize>()).sum();
        (slots > self.slots).then(|| {
            format!(
                "{slots} backend slots over its frontends, more than one Service may take (--max-slots-per-service \
                 {})",
                self.slots
            )
        })
    }
}

/// A Service refused for a limit: why, and since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    /// The limit it is over, in words.
    pub(super) why: String,
    /// When it was first refused (for this reason or another, without being programmed in between).
    pub(super) since: SystemTime,
}

/// The Services refused now.
#[derive(Debug, Default)]
pub(super) struct Refused(BTreeMap<ObjKey, Refusal>);

impl Refused {
    /// `key` is refused for `why`; whether it was not refused before (then the agent logs it).
    pub(super) fn set(&mut self, key: &ObjKey, why: String) -> bool {
        if let Some(r) = self.0.get_mut(key) {
            r.why = why;
            return false;
        }
        self.0.insert(key.clone(), Refusal { why, since: SystemTime::now() });
        true
    }

    /// `key` is within its limits again (or gone).
    pub(super) fn clear(&mut self, key: &ObjKey) {
        self.0.remove(key);
    }

    /// Every refused Service.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&ObjKey, &Refusal)> {
        self.0.iter()
    }
}
