//! What the agent says about a sync and a socket-destruction pass: structured `tracing` events, one line per
//! problem and one `synced` line per sync (tests and operators wait for it).
use super::SyncReport;
use crate::{
    datapath::destroy::DestroyReport,
    source::{Origin, Severity},
};

/// Log one sync: input problems, frontends that failed to apply, Services that got the controller's hints,
/// then the `synced` summary.
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
    for e in &r.errors {
        tracing::error!(service = %e.name, "{e}");
    }
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
