//! What a sync did (`SyncReport`) and what the servers show of it (`ServiceHealth`, `Unprogrammed`), and what
//! the agent says about it and about a socket-destruction pass: structured `tracing` events, one line per
//! problem and one `synced` line per sync (tests and operators wait for it).
use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime},
};

use lb_common::FrontendKey;

use super::{no_local::NoLocalCounts, tracker::Taken};
use crate::{
    datapath::{ApplyError, addr, destroy::DestroyReport, marks::SweepReport},
    model::{NodeInfo, ObjKey, proto_name},
    source::{Diagnostic, Origin, Severity},
};

/// One Service's health for its `healthCheckNodePort`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    /// The Service's namespace, echoed in the body.
    pub namespace: String,
    /// The Service's name, echoed in the body.
    pub name: String,
    /// Ready endpoints on this node: 0 makes the port answer 503.
    pub local_endpoints: usize,
}

/// A Service (or some of its frontends) not programmed as planned, as `/healthz` names it.
#[derive(Clone, Debug, PartialEq)]
pub struct Unprogrammed {
    /// The Service.
    pub service: ObjKey,
    /// Why, one line per frontend left out (what the maps refused, or the Service that holds its VIP:port).
    pub reasons: Vec<String>,
    /// Since when it has failed to apply; `None` for a VIP:port held by another Service.
    pub since: Option<SystemTime>,
    /// Attempts that failed in a row (0 for a VIP:port held by another Service: nothing to retry).
    pub attempts: u32,
    /// When it is tried again; `None` when only the other Service's leaving programs it.
    pub next_retry: Option<Instant>,
}

/// A frontend (VIP, port, protocol) several Services claim: the one programmed, then the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipConflict {
    /// The frontend.
    pub frontend: FrontendKey,
    /// The Service programmed there (`plan::vip_winner`).
    pub winner: ObjKey,
    /// The Services not programmed there until the winner leaves it.
    pub losers: Vec<ObjKey>,
}

/// What one sync did, for logs, metrics and tests.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// The node planned for (its zone as resolved now).
    pub node: Option<NodeInfo>,
    /// Frontends the plan wants in total (a VIP:port several Services claim counts once).
    pub frontends: usize,
    /// Frontends written for the first time.
    pub added: usize,
    /// Frontends swapped to a new generation.
    pub updated: usize,
    /// Frontends deleted.
    pub removed: usize,
    /// Services planned in this sync: those a change touched, or all of them.
    pub replanned: usize,
    /// The Services planned (with those whose frontends moved to them); `None`: every Service.
    pub touched: Option<std::collections::BTreeSet<ObjKey>>,
    /// Frontends that could not be applied (they keep their previous state; retried with backoff, see
    /// `retry`).
    pub errors: Vec<ApplyError>,
    /// VIP:port conflicts this sync started or changed (each is reported when its claimants change).
    pub conflicts: Vec<VipConflict>,
    /// Every problem the input has now.
    pub diagnostics: Vec<Diagnostic>,
    /// Inputs (files, API objects) whose objects come from their last good version.
    pub stale: Vec<Origin>,
    /// How many Services' slices carried no hints and got the controller's (the set:
    /// `AgentCore::hints_filled`).
    pub hints_filled: usize,
    /// Those of them not reported by an earlier sync.
    pub hints_newly_filled: Vec<ObjKey>,
    /// `healthCheckNodePort` -> the Service's local endpoints (Services with externalTrafficPolicy Local).
    pub health_ports: BTreeMap<u16, ServiceHealth>,
    /// How long the sync took.
    pub duration: Duration,
    /// Of that: reading the source's changes (converted objects) and tracking them (`read`), writing the
    /// maps (`program`); the rest is planning (plans, claims, topology).
    pub read: Duration,
    /// Writing the maps (the reconciler's apply).
    pub program: Duration,
    /// What the source's changes brought in (kube-proxy's change counts and trigger times).
    pub taken: Taken,
    /// Planned Service ports with a Local policy and no local endpoint, after the sync.
    pub no_local: NoLocalCounts,
}

/// Log one sync: input problems, frontends that failed to apply, VIP:port conflicts, Services that got the
/// controller's hints, then the `synced` summary.
pub(super) fn log_sync(r: &SyncReport) {
    for d in &r.diagnostics {
        match d.severity {
            Severity::Error => tracing::error!(origin = %d.origin, "{d}"),
            Severity::Warning => tracing::warn!(origin = %d.origin, "{d}"),
        }
    }
    for o in &r.stale {
        match o {
            Origin::File { path, .. } => tracing::warn!(
                file = %path.display(),
                "file has errors: keeping the objects of its last good version"
            ),
            Origin::Api(id) => {
                tracing::warn!(object = %id, "new version has errors: keeping the last good version");
            }
        }
    }
    log_apply_problems(r);
    for s in &r.hints_newly_filled {
        tracing::info!(service = %s, "EndpointSlices carry no hints: using the hints the EndpointSlice controller would write");
    }
    let zone = r.node.as_ref().and_then(|n| n.zone.clone()).unwrap_or_else(|| "-".into());
    tracing::info!(
        frontends = r.frontends,
        hints_filled = r.hints_filled,
        added = r.added,
        updated = r.updated,
        removed = r.removed,
        replanned = r.replanned,
        errors = r.errors.len(),
        zone = %zone,
        took_us = r.duration.as_micros() as u64,
        read_us = r.read.as_micros() as u64,
        plan_us = r.duration.saturating_sub(r.read + r.program).as_micros() as u64,
        program_us = r.program.as_micros() as u64,
        "synced"
    );
}

/// Frontends that failed to apply (retried with backoff) and VIP:port conflicts.
fn log_apply_problems(r: &SyncReport) {
    for e in &r.errors {
        tracing::error!(service = %e.name, "{e} (the frontend keeps its previous state, none if it is new; tried again with backoff)");
    }
    for c in &r.conflicts {
        let losers: Vec<String> = c.losers.iter().map(ToString::to_string).collect();
        tracing::warn!(
            frontend = %addr::frontend_addr(&c.frontend),
            protocol = proto_name(c.frontend.proto),
            winner = %c.winner,
            losers = %losers.join(","),
            "Services {} and {} claim one VIP:port: {} is programmed ({}); the others are programmed when it \
             leaves",
            c.winner,
            losers.join(", "),
            c.winner,
            crate::plan::VIP_RULE
        );
    }
}

/// Log one retry of Services that failed to apply (never `synced`: see the agent's ordering rules).
pub(super) fn log_retry(r: &SyncReport) {
    log_apply_problems(r);
    tracing::info!(
        added = r.added,
        updated = r.updated,
        removed = r.removed,
        replanned = r.replanned,
        errors = r.errors.len(),
        took_us = r.duration.as_micros() as u64,
        "retried Services that failed to apply"
    );
}

/// Log what passive health did since the last sweep: holds, recoveries, entries of departed backends.
pub(super) fn log_health(r: &crate::datapath::health::HealthSweep) {
    use crate::datapath::{addr::backend_addr, health, marks::human};
    for (b, h) in &r.held {
        let hold = Duration::from_nanos(h.held_until_ns.saturating_sub(h.held_since_ns));
        if h.scope == lb_common::HOLD_CLIENT {
            tracing::info!(
                backend = %backend_addr(b),
                reason = health::reason(h),
                hold = %human(hold),
                holds = h.holds,
                client_netns = h.first_client,
                "backend held down for one client by passive health (its connects failed, no other client's had)"
            );
            continue;
        }
        tracing::info!(
            backend = %backend_addr(b),
            reason = health::reason(h),
            hold = %human(hold),
            holds = h.holds,
            "backend held down by passive health (its connects failed)"
        );
    }
    for b in &r.recovered {
        tracing::info!(backend = %backend_addr(b), "backend healthy again (a connect succeeded)");
    }
    for b in &r.departed {
        tracing::info!(backend = %backend_addr(b), "forgot the passive health of a backend that left every Service");
    }
}

/// Log the backend marks a sweep deleted.
pub(super) fn log_sweep(r: &SweepReport) {
    for b in &r.departed {
        tracing::info!(
            backend = %addr::backend_addr(b),
            "cleared the mark of a backend that left every Service (a pod reusing its IP starts unmarked)"
        );
    }
    for b in &r.expired {
        tracing::debug!(backend = %addr::backend_addr(b), "deleted an expired backend mark");
    }
}

/// Log one socket-destruction pass (nothing when it had nothing to do).
pub(super) fn log_destroyed(r: &DestroyReport) {
    if r.destroyed > 0 {
        tracing::info!(
            sockets = r.destroyed,
            "destroyed connected UDP sockets whose backend left their Service"
        );
    }
    if r.netns_not_found > 0 {
        tracing::warn!(
            entries = r.netns_not_found,
            "connected UDP sockets not ended: their network namespace was not found (the pod is gone, or its \
             namespace is not visible to the agent)"
        );
    }
    for e in &r.errors {
        tracing::warn!("{e}");
    }
}
