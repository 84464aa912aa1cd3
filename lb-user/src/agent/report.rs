//! What the agent says about a sync and a socket-destruction pass: structured `tracing` events, one line per
//! problem and one `synced` line per sync (tests and operators wait for it).
use super::SyncReport;
use crate::{
    datapath::{addr, destroy::DestroyReport, marks::SweepReport},
    source::{Origin, Severity},
};

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
        "synced"
    );
}

/// Frontends that failed to apply (retried with backoff) and VIP:port conflicts.
fn log_apply_problems(r: &SyncReport) {
    for e in &r.errors {
        tracing::error!(service = %e.name, "{e} (left untranslated; tried again with backoff)");
    }
    for c in &r.conflicts {
        let losers: Vec<String> = c.losers.iter().map(ToString::to_string).collect();
        tracing::warn!(
            frontend = %addr::frontend_addr(&c.frontend),
            protocol = crate::status::proto_name(c.frontend.proto),
            winner = %c.winner,
            losers = %losers.join(","),
            "Services {} and {} claim one VIP:port: {} is programmed (the first in namespace/name order); the \
             others are programmed when it leaves",
            c.winner,
            losers.join(", "),
            c.winner
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
