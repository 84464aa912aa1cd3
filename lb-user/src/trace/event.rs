//! A trace event as `tierlb trace` prints it: the kernel's record (`lb_common::TraceEvent`) named (the reason
//! rule, `Reason::of`), placed in time and attributed to a pod.
use std::{fmt::Write as _, net::SocketAddr};

use lb_common::{
    ERRNO_NO_LOCAL_ENDPOINT, FLAG_POLICY_LOCAL, OUTCOME_REFUSED, OUTCOME_TRANSLATED, PROTO_TCP, PROTO_UDP,
    TIER_CLUSTER, TIER_COUNT, TIER_NODE, TIER_ZONE, TRACE_AFFINITY, TRACE_HELD, TRACE_PANIC, TRACE_TORN,
    TRACE_TRIAL, TraceEvent,
};
use serde::Serialize;

use crate::datapath::addr;

/// Why the data path decided as it did: what `reason` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The node tier under a topology mode: the endpoint's `hints.forNodes` names this node.
    NodeHint,
    /// The node tier under a Local traffic policy: one of the node's own endpoints (kube-proxy's local set).
    LocalEndpoint,
    /// The zone tier: the endpoint's `hints.forZones` names this node's zone.
    ZoneHint,
    /// The cluster tier: every usable endpoint.
    Cluster,
    /// sessionAffinity ClientIP: the client's remembered backend.
    Affinity,
    /// Passive health's panic threshold: every allowed backend was held down or marked, so one held down was
    /// taken rather than refusing on passive evidence.
    PanicAllHeld,
    /// Refused: the Service has no usable endpoint (kube-proxy: REJECT).
    RefusedNoEndpoints,
    /// Refused: a Local policy and no local endpoint (kube-proxy: DROP; tierlb fails fast).
    RefusedNoLocalEndpoint,
    /// Refused: the tiers hold backends but every one is marked down or held (the errno is the policy's).
    RefusedAllDown,
    /// An internal error (a missing slot, a torn frontend read): the call went through untranslated.
    FailOpen,
}

impl Reason {
    /// The rule: from what the kernel recorded, the reason it decided so.
    pub fn of(e: &TraceEvent) -> Self {
        match e.outcome {
            OUTCOME_TRANSLATED if e.info & TRACE_AFFINITY != 0 => Self::Affinity,
            OUTCOME_TRANSLATED if e.info & TRACE_PANIC != 0 => Self::PanicAllHeld,
            OUTCOME_TRANSLATED => match usize::from(e.tier) {
                TIER_NODE if e.frontend_flags & FLAG_POLICY_LOCAL != 0 => Self::LocalEndpoint,
                TIER_NODE => Self::NodeHint,
                TIER_ZONE => Self::ZoneHint,
                _ => Self::Cluster,
            },
            OUTCOME_REFUSED if (e.first_tier as usize) < TIER_COUNT => Self::RefusedAllDown,
            OUTCOME_REFUSED if i32::from(e.errno) == ERRNO_NO_LOCAL_ENDPOINT => Self::RefusedNoLocalEndpoint,
            OUTCOME_REFUSED => Self::RefusedNoEndpoints,
            _ => Self::FailOpen,
        }
    }

    /// The word `trace` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeHint => "node-hint",
            Self::LocalEndpoint => "local-endpoint",
            Self::ZoneHint => "zone-hint",
            Self::Cluster => "cluster",
            Self::Affinity => "affinity",
            Self::PanicAllHeld => "panic-all-held",
            Self::RefusedNoEndpoints => "refused-no-endpoints",
            Self::RefusedNoLocalEndpoint => "refused-no-local-endpoint",
            Self::RefusedAllDown => "refused-all-down",
            Self::FailOpen => "fail-open",
        }
    }
}

/// One printed event (`-o json`: one object per line, fields absent when they do not apply).
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// Wall-clock time, RFC 3339 UTC with microseconds.
    pub time: String,
    /// The agent instance whose programs decided (its node).
    pub instance: String,
    /// connect4, connect6, sendmsg4, sendmsg6.
    pub hook: &'static str,
    /// "TCP" or "UDP".
    pub protocol: &'static str,
    /// The VIP asked for, IP:PORT.
    pub vip: String,
    /// `tc_ingress` only: the client outside the node, IP:PORT (there is no socket, process or cgroup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The Service port (`namespace/name:port`), from the agent's names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The backend chosen, IP:PORT; absent unless translated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// "node", "zone" or "cluster"; absent unless translated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<&'static str>,
    /// `Reason::as_str`.
    pub reason: &'static str,
    /// Backends the choice skipped because they were marked down or held (absent when none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_down: Option<u32>,
    /// Passive health held at least one skipped backend.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// This connect is the trial of a half-open backend.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub trial: bool,
    /// The errno the call got when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<u8>,
    /// Its name (ECONNREFUSED, EHOSTUNREACH).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno_name: Option<&'static str>,
    /// The socket's cookie.
    pub cookie: u64,
    /// The socket's network namespace cookie.
    pub netns_cookie: u64,
    /// The caller's cgroup2 id.
    pub cgroup_id: u64,
    /// Its cgroup path, when found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The caller's process id (initial PID namespace).
    pub pid: u32,
    /// The calling thread's name.
    pub comm: String,
    /// `namespace/name` of the caller's pod, when its cgroup is a pod's whose name is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's UID, when the cgroup is a pod's (also when its name is not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl Line {
    /// The printed form of `e`, decided by `instance`'s programs, at wall-clock `unix_ns`, by `client`, for
    /// Service port `service`.
    pub fn new(
        e: &TraceEvent,
        instance: &str,
        unix_ns: i128,
        client: super::pods::Client,
        service: Option<String>,
    ) -> Self {
        let translated = e.outcome == OUTCOME_TRANSLATED;
        let tc = e.info & lb_common::TRACE_TC != 0;
        // A packet program has no caller to give an errno: a refused flow from outside is dropped.
        let refused = e.outcome == OUTCOME_REFUSED && !tc;
        Self {
            time: rfc3339(unix_ns),
            instance: instance.to_owned(),
            hook: e.hook(),
            protocol: match e.frontend.proto {
                PROTO_TCP => "TCP",
                PROTO_UDP => "UDP",
                _ => "other",
            },
            vip: addr::frontend_addr(&e.frontend).to_string(),
            client: tc.then(|| addr::backend_addr(&e.client).to_string()),
            service,
            backend: translated.then(|| addr::backend_addr(&e.backend).to_string()),
            tier: translated.then(|| match usize::from(e.tier) {
                TIER_NODE => "node",
                TIER_ZONE => "zone",
                TIER_CLUSTER => "cluster",
                _ => "?",
            }),
            reason: if e.info & TRACE_TORN != 0 { "fail-open-torn-read" } else { Reason::of(e).as_str() },
            skipped_down: (e.skipped() > 0).then_some(e.skipped()),
            held: e.info & TRACE_HELD != 0 && e.skipped() > 0,
            trial: e.info & TRACE_TRIAL != 0,
            errno: refused.then_some(e.errno),
            errno_name: refused.then(|| lb_common::errno_name(i32::from(e.errno))),
            cookie: e.cookie,
            netns_cookie: e.netns_cookie,
            cgroup_id: e.cgroup_id,
            cgroup: client.cgroup.map(|p| p.display().to_string()),
            pid: e.pid,
            comm: comm(&e.comm),
            pod: client.pod.map(|p| p.to_string()),
            pod_uid: client.pod_uid,
        }
    }

    /// Whether the event is for `vip` (an IP, or IP:PORT when `port` is set).
    pub fn is_for(e: &TraceEvent, vip: SocketAddr, port: bool) -> bool {
        let asked = addr::frontend_addr(&e.frontend);
        asked.ip() == vip.ip() && (!port || asked.port() == vip.port())
    }

    /// The table's header, aligned as `row`.
    pub fn header() -> String {
        row(["TIME", "NODE", "HOOK", "CLIENT", "VIP", "BACKEND", "TIER", "REASON"])
    }

    /// One table row.
    pub fn row(&self) -> String {
        let client = self
            .client
            .clone()
            .or_else(|| self.pod.clone())
            .unwrap_or_else(|| format!("{}[{}]", self.comm, self.pid));
        let backend =
            self.backend.clone().or(self.errno_name.map(str::to_owned)).unwrap_or_else(|| "-".into());
        let mut reason = self.reason.to_owned();
        if let Some(n) = self.skipped_down {
            let _ = write!(reason, " skipped-down {n}{}", if self.held { " (held)" } else { "" });
        }
        if self.trial {
            reason.push_str(" trial");
        }
        let time = self.time.get(11..26).unwrap_or(&self.time);
        row([
            time,
            &self.instance,
            self.hook,
            &client,
            &self.vip,
            &backend,
            self.tier.unwrap_or("-"),
            &reason,
        ])
    }
}

fn row(cols: [&str; 8]) -> String {
    let widths = [15, 8, 8, 28, 21, 21, 7, 0];
    let mut out = String::new();
    for (c, w) in cols.iter().zip(widths) {
        let _ = write!(out, "{c:<w$}  ");
    }
    out.trim_end().to_owned()
}

/// A NUL-padded task name.
fn comm(bytes: &[u8; 16]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Nanoseconds since the Unix epoch as RFC 3339 UTC with microseconds (`2026-01-02T03:04:05.678901Z`): the
/// server's seconds (`server::rfc3339`), and the microseconds a trace needs.
pub fn rfc3339(unix_ns: i128) -> String {
    let ns = u64::try_from(unix_ns).unwrap_or(0);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    let secs = crate::server::rfc3339(t);
    format!("{}.{:06}Z", secs.trim_end_matches('Z'), ns % 1_000_000_000 / 1000)
}

#[cfg(test)]
mod tests {
    use lb_common::ERRNO_NO_ENDPOINTS;

    use lb_common::{FLAG_EMPTY_IS_DROP, OUTCOME_FAIL_OPEN, TRACE_CONNECT, trace_info};

    use super::*;

    fn ev(outcome: u8, tier: usize, flags: u32, info: u32) -> TraceEvent {
        TraceEvent {
            outcome,
            tier: tier as u8,
            frontend_flags: flags,
            info,
            first_tier: TIER_COUNT as u32,
            ..TraceEvent::default()
        }
    }

    #[test]
    fn each_decision_is_named_by_one_rule() {
        let refused = |errno: i32, first_tier: usize| TraceEvent {
            errno: u8::try_from(errno).unwrap(),
            first_tier: first_tier as u32,
            ..ev(OUTCOME_REFUSED, 0, 0, 0)
        };
        let cases = [
            ("node tier, topology", ev(OUTCOME_TRANSLATED, TIER_NODE, 0, 0), Reason::NodeHint),
            (
                "node tier, Local policy",
                ev(OUTCOME_TRANSLATED, TIER_NODE, FLAG_POLICY_LOCAL, 0),
                Reason::LocalEndpoint,
            ),
            ("zone tier", ev(OUTCOME_TRANSLATED, TIER_ZONE, 0, 0), Reason::ZoneHint),
            ("cluster tier", ev(OUTCOME_TRANSLATED, TIER_CLUSTER, 0, 0), Reason::Cluster),
            (
                "affinity wins over its tier",
                ev(OUTCOME_TRANSLATED, TIER_NODE, 0, TRACE_AFFINITY),
                Reason::Affinity,
            ),
            ("panic threshold", ev(OUTCOME_TRANSLATED, TIER_NODE, 0, TRACE_PANIC), Reason::PanicAllHeld),
            ("no endpoint anywhere", refused(ERRNO_NO_ENDPOINTS, TIER_COUNT), Reason::RefusedNoEndpoints),
            (
                "Local, none here",
                refused(ERRNO_NO_LOCAL_ENDPOINT, TIER_COUNT),
                Reason::RefusedNoLocalEndpoint,
            ),
            ("tiers, all down", refused(ERRNO_NO_ENDPOINTS, TIER_CLUSTER), Reason::RefusedAllDown),
            ("Local, all down", refused(ERRNO_NO_LOCAL_ENDPOINT, TIER_NODE), Reason::RefusedAllDown),
            ("missing slot", ev(OUTCOME_FAIL_OPEN, 0, FLAG_EMPTY_IS_DROP, 0), Reason::FailOpen),
        ];
        for (name, e, want) in cases {
            assert_eq!(Reason::of(&e), want, "{name}");
        }
    }

    #[test]
    fn a_line_says_what_applies_and_leaves_the_rest_out() {
        let mut e =
            ev(OUTCOME_TRANSLATED, TIER_ZONE, 0, trace_info(false, true, false, false, false, true, 2));
        e.frontend = addr::frontend_key("10.96.0.10".parse().unwrap(), 80, PROTO_TCP);
        e.backend = addr::backend("10.244.2.10:8080".parse().unwrap(), PROTO_TCP);
        e.comm[..4].copy_from_slice(b"curl");
        let l =
            Line::new(&e, "node-1", 1_700_000_000_123_456_789, super::super::pods::Client::default(), None);
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["time"], "2023-11-14T22:13:20.123456Z");
        assert_eq!((json["hook"].as_str(), json["vip"].as_str()), (Some("connect4"), Some("10.96.0.10:80")));
        assert_eq!(
            (json["backend"].as_str(), json["tier"].as_str()),
            (Some("10.244.2.10:8080"), Some("zone"))
        );
        assert_eq!((json["reason"].as_str(), json["skipped_down"].as_u64()), (Some("zone-hint"), Some(2)));
        assert_eq!((json["held"].as_bool(), json["comm"].as_str()), (Some(true), Some("curl")));
        for absent in ["errno", "pod", "trial", "service"] {
            assert!(json.get(absent).is_none(), "{absent}: {json}");
        }
        assert!(l.row().ends_with("zone     zone-hint skipped-down 2 (held)"), "{}", l.row());

        let mut r = ev(OUTCOME_REFUSED, 0, FLAG_EMPTY_IS_DROP, TRACE_CONNECT);
        r.errno = ERRNO_NO_LOCAL_ENDPOINT as u8;
        let json =
            serde_json::to_value(Line::new(&r, "n", 0, super::super::pods::Client::default(), None)).unwrap();
        assert_eq!((json["errno"].as_u64(), json["errno_name"].as_str()), (Some(113), Some("EHOSTUNREACH")));
        assert_eq!(json["reason"], "refused-no-local-endpoint");
        assert!(json.get("backend").is_none() && json.get("tier").is_none(), "{json}");
        assert_eq!(json["time"], "1970-01-01T00:00:00.000000Z");
    }
}
