//! The node's proxier health, kube-proxy's way: what `/healthz` and `/livez` answer, and their listener.
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use tokio::{net::TcpListener, task::JoinHandle};

use super::{Response, serve};
use crate::agent::Unprogrammed;

/// kube-proxy's default: unhealthy when an update has waited longer than this (2 x its 30 s sync period).
pub const HEALTH_TIMEOUT: Duration = Duration::from_mins(1);

/// What `/healthz` and `/livez` report, updated by the agent loop.
#[derive(Debug, Default)]
pub struct Health {
    /// Time of the last successful sync.
    pub last_updated: Option<SystemTime>,
    /// Since when a change has been waiting to be applied (none: nothing pending).
    pub pending_since: Option<Instant>,
    /// Services with frontends not programmed as planned now (failed: previous state kept, none if new; or
    /// held by another Service), with the reason.
    pub unprogrammed: Vec<Unprogrammed>,
    /// Why the agent's programs are not attached to its cgroup as it attached them (found detached and not
    /// attached again); `/healthz` fails while it is set.
    pub detached: Option<String>,
    /// How often the programs were found detached and attached again.
    pub reattached: u64,
    /// Why this node is not eligible for load balancer traffic (its Node being deleted or tainted
    /// `ToBeDeletedByClusterAutoscaler`, or, reading the API server, no Node of its name): `/healthz` fails,
    /// as kube-proxy's does, so that load balancers take the node out before it goes; `/livez` does not.
    pub not_eligible: Option<String>,
    /// Whether a missing Node of this node's name makes it not eligible (reading the API server).
    pub node_required: bool,
}

/// The agent loop writes it, the health listener reads it.
pub type SharedHealth = Arc<Mutex<Health>>;

/// `t` as RFC 3339 in UTC, whole seconds (`2023-11-14T22:13:20Z`), as Kubernetes writes times.
pub fn rfc3339(t: SystemTime) -> String {
    // Seconds since the epoch formatted as UTC, without pulling in a date crate.
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil from days (Howard Hinnant's algorithm). u64 seconds make fewer than 2^48 days: no wrap.
    let z = days.cast_signed() + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

/// kube-proxy's proxier health, what `/healthz` answers: healthy once the first sync is done, no change
/// has waited longer than `HEALTH_TIMEOUT`, and the node is eligible for load balancer traffic (`nodeEligible`:
/// its Node neither being deleted nor tainted `ToBeDeletedByClusterAutoscaler`, as kube-proxy 1.31+ decides).
///
/// Services the data path cannot take do not make it unhealthy: kube-proxy's status says whether the proxy
/// keeps its rules in sync, and load balancers (externalTrafficPolicy Cluster) and liveness probes act on it
/// for the whole node. A 503 for one Service that does not fit would take every other Service's traffic
/// off the node, and a restart would not make a full map bigger. The body names them instead
/// (`unprogrammedServices`, beside kube-proxy's fields), as does `tierlb_services_unprogrammed`.
pub fn health_response(h: &Health, now: Instant) -> Response {
    let mut r = proxier_health(h, now);
    if h.not_eligible.is_some() {
        r.status = 503;
    }
    r
}

/// `/healthz` without the node's eligibility (what `/livez` builds on, as kube-proxy's does).
fn proxier_health(h: &Health, now: Instant) -> Response {
    let healthy = h.last_updated.is_some()
        && h.pending_since.is_none_or(|p| now.duration_since(p) < HEALTH_TIMEOUT)
        && h.detached.is_none();
    let unprogrammed: Vec<serde_json::Value> = h
        .unprogrammed
        .iter()
        .map(|u| {
            serde_json::json!({
                "service": u.service.to_string(),
                "reasons": u.reasons,
                "since": u.since.map(rfc3339),
                "attempts": u.attempts,
                "nextRetrySeconds": u.next_retry.map(|t| t.saturating_duration_since(now).as_secs_f64()),
            })
        })
        .collect();
    let body = serde_json::json!({
        "lastUpdated": h.last_updated.map(rfc3339).unwrap_or_default(),
        "currentTime": rfc3339(SystemTime::now()),
        "nodeEligible": h.not_eligible.is_none(),
        "notEligibleBecause": h.not_eligible,
        "unprogrammedServices": unprogrammed,
        "programsDetached": h.detached,
        "programsReattached": h.reattached,
        "version": env!("CARGO_PKG_VERSION"),
        "commit": env!("TIERLB_GIT_COMMIT"),
        "mapLayout": crate::datapath::MAP_LAYOUT,
    });
    Response::json(if healthy { 200 } else { 503 }, &body)
}

/// What `/livez` answers: alive (200) while the agent starts, however long the first sync takes (a large
/// cluster, a slow API server), so a liveness probe does not kill a start that is making progress; after
/// the first sync, the proxier health of `/healthz`, so a loop stuck on a change is restarted.
pub fn livez_response(h: &Health, now: Instant) -> Response {
    let mut r = proxier_health(h, now);
    if h.last_updated.is_none() {
        r.status = 200;
    }
    r
}

/// Serve `/healthz` and `/livez` from `health` on `listener`. Started before the first sync: `/healthz`
/// says 503 and `/livez` 200 until it is done.
pub fn start_health(listener: TcpListener, health: SharedHealth) -> JoinHandle<()> {
    serve(listener, move |path| {
        let health = health.clone();
        async move {
            let respond = match path.as_str() {
                "/healthz" => health_response,
                "/livez" => livez_response,
                _ => return Response::text(404, "not found\n"),
            };
            respond(&health.lock().expect("health lock"), Instant::now())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::ObjKey,
        server::tests::{get, listener},
    };

    #[test]
    fn health_follows_kube_proxy() {
        let now = Instant::now();
        let mut h = Health::default();
        assert_eq!(health_response(&h, now).status, 503, "no sync yet");
        h.last_updated = Some(SystemTime::now());
        assert_eq!(health_response(&h, now).status, 200);
        h.pending_since = Some(now);
        assert_eq!(health_response(&h, now + Duration::from_secs(5)).status, 200, "a fresh pending change");
        assert_eq!(health_response(&h, now + HEALTH_TIMEOUT).status, 503, "a change stuck too long");
        let body: serde_json::Value = serde_json::from_str(&health_response(&h, now).body).unwrap();
        assert!(body["lastUpdated"].as_str().unwrap().ends_with('Z'));
        assert_eq!(body["nodeEligible"], true);
        assert_eq!(body["unprogrammedServices"], serde_json::json!([]));
    }

    /// kube-proxy's `nodeEligible`: a node being deleted (or tainted for the cluster autoscaler) fails
    /// `/healthz`, so load balancers drain it, while `/livez` stays 200 (the agent is not restarted for it).
    #[test]
    fn a_node_not_eligible_fails_healthz_with_the_reason_and_livez_stays_alive() {
        let now = Instant::now();
        let mut h = Health { last_updated: Some(SystemTime::now()), ..Health::default() };
        h.not_eligible = Some("the Node is tainted ToBeDeletedByClusterAutoscaler".into());
        let r = health_response(&h, now);
        assert_eq!(r.status, 503);
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["nodeEligible"], false);
        assert_eq!(body["notEligibleBecause"], "the Node is tainted ToBeDeletedByClusterAutoscaler");
        assert_eq!(livez_response(&h, now).status, 200);
        h.not_eligible = None;
        assert_eq!(health_response(&h, now).status, 200);
    }

    #[test]
    fn programs_detached_and_not_attached_again_fail_healthz_with_the_reason() {
        let mut h = Health { last_updated: Some(SystemTime::now()), reattached: 2, ..Health::default() };
        assert_eq!(health_response(&h, Instant::now()).status, 200);
        h.detached = Some("connect4 not attached to /sys/fs/cgroup/x".into());
        let r = health_response(&h, Instant::now());
        assert_eq!(r.status, 503);
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["programsDetached"], "connect4 not attached to /sys/fs/cgroup/x");
        assert_eq!(body["programsReattached"], 2);
    }

    #[test]
    fn a_service_the_data_path_cannot_take_is_named_and_the_node_stays_healthy() {
        let now = Instant::now();
        let h = Health {
            last_updated: Some(SystemTime::now()),
            pending_since: None,
            unprogrammed: vec![Unprogrammed {
                service: ObjKey::new("default", "beta"),
                reasons: vec!["map SLOTS is full".into()],
                since: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
                attempts: 3,
                next_retry: Some(now + Duration::from_secs(4)),
            }],
            ..Health::default()
        };
        let r = health_response(&h, now);
        assert_eq!(r.status, 200, "one Service that does not fit does not take the node out");
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            body["unprogrammedServices"],
            serde_json::json!([{
                "service": "default/beta",
                "reasons": ["map SLOTS is full"],
                "since": "2023-11-14T22:13:20Z",
                "attempts": 3,
                "nextRetrySeconds": 4.0,
            }])
        );
    }

    #[tokio::test]
    async fn before_the_first_sync_livez_says_alive_and_healthz_not_ready() {
        let (l, addr) = listener();
        let health = SharedHealth::default();
        let _server = start_health(l, health.clone());
        let reply = |path| async move { get(addr, path).await.unwrap() };
        assert!(reply("/livez").await.starts_with("HTTP/1.1 200"), "a slow start is not a dead agent");
        assert!(reply("/healthz").await.starts_with("HTTP/1.1 503"));
        let now = Instant::now();
        {
            let mut h = health.lock().unwrap();
            h.last_updated = Some(SystemTime::now());
            h.pending_since = Some(now);
        }
        assert!(reply("/healthz").await.starts_with("HTTP/1.1 200"));
        let h = health.lock().unwrap();
        assert_eq!(livez_response(&h, now + HEALTH_TIMEOUT).status, 503, "a loop stuck on a change");
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
    }
}
