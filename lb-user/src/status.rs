//! `tierlb status`: what the data path holds right now, read from an agent's pinned maps.
mod north_south;
pub use north_south::NorthSouthStatus;

pub use crate::datapath::Counters;

use std::{fmt::Write as _, time::Duration};

use lb_common::{Backend, BackendState, COUNTER_FAIL_OPEN, FLAG_POLICY_LOCAL, FrontendKey, GLOBAL_SVC_ID};
use serde::Serialize;

use crate::{
    datapath::{MapError, MapReader, addr, marks::human, read_back},
    model::{ServicePortName, proto_name},
};

/// One backend slot of a tier.
#[derive(Clone, Debug, Serialize)]
pub struct BackendStatus {
    /// The endpoint's address and port.
    pub addr: String,
    /// Marked down in `BACKEND_STATE`: new connects skip it.
    pub down: bool,
}

/// A backend's manual mark (`tierlb backend down`), as it stands now.
#[derive(Clone, Debug, Serialize)]
pub struct MarkStatus {
    /// The backend's address and port.
    pub backend: String,
    /// "TCP", "UDP" or "SCTP".
    pub protocol: &'static str,
    /// How long it has been marked down, in seconds.
    pub age_seconds: f64,
    /// How long until the mark ends by itself, in seconds.
    pub left_seconds: f64,
}

/// A backend passive health follows (its connects failed lately), as it stands now.
#[derive(Clone, Debug, Serialize)]
pub struct HealthStatus {
    /// The backend's address and port.
    pub backend: String,
    /// "failing", "held", "held-for-one-client", "half-open".
    pub state: crate::datapath::health::HealthState,
    /// What the last failure was: "refused" (RST), "unreachable" (an ICMP error, or the last SYN) or "timeout"
    /// (the SYN unanswered at its first retransmission timeout).
    pub reason: &'static str,
    /// Failed connects in a row since the last success or hold.
    pub failures: u32,
    /// Holds in a row without a success (the hold doubles each time).
    pub holds: u32,
    /// Held: seconds since the hold began.
    pub held_for_seconds: Option<f64>,
    /// Held: seconds until it ends (then one trial connect).
    pub left_seconds: Option<f64>,
}

/// sessionAffinity ClientIP of a frontend, as the maps hold it.
#[derive(Clone, Debug, Serialize)]
pub struct AffinityStatus {
    /// Seconds from a client's last connect until it may get another backend.
    pub timeout_seconds: u32,
    /// Clients (network namespaces) whose entry has not timed out: their next connect goes to the backend it
    /// names, if that is still a live member of the frontend in the selected tier.
    pub clients: usize,
}

/// One frontend as the maps hold it.
#[derive(Clone, Debug, Serialize)]
pub struct FrontendStatus {
    /// The Service port (JSON: `service` and `port_name`); empty if the stored name does not read back.
    #[serde(flatten)]
    pub name: ServicePortName,
    /// VIP and port.
    pub frontend: String,
    /// "TCP", "UDP" or "SCTP".
    pub protocol: &'static str,
    /// "connect" (translated at connect()/sendmsg() by the socket programs) or "outside" (traffic arriving
    /// from outside the node, translated per packet by the tc programs).
    pub scope: &'static str,
    /// The traffic policy the tiers were built for: "Local" or "Cluster".
    pub policy: &'static str,
    /// The node, zone and cluster tiers' backends, in slot order.
    pub tiers: [Vec<BackendStatus>; 3],
    /// The tier new connects use now: the first with a backend that is not marked down.
    pub active_tier: &'static str,
    /// The errno a connect gets when no tier has a live backend.
    pub when_empty: &'static str,
    /// Its connects so far.
    pub connections: Counters,
    /// sessionAffinity ClientIP, if the frontend has it.
    pub session_affinity: Option<AffinityStatus>,
    /// How a new flow gets its backend within the tier: "random", or "maglev" (an outside frontend under
    /// `--lb-algorithm=maglev`).
    pub lb_algorithm: &'static str,
    /// Whether a new IPv4 flow from outside to a backend on another node takes direct server return (an
    /// outside frontend under `--dsr`, externalTrafficPolicy Cluster).
    pub dsr: bool,
}

/// What `tierlb status` shows of one agent instance's maps.
#[derive(Clone, Debug, Serialize)]
pub struct Instance {
    /// The instance name (the pin directory under --bpffs).
    pub instance: String,
    /// The node its agent runs on, as the agent wrote it into the maps at start (none from an older agent).
    pub node: Option<String>,
    /// Every frontend, by Service port then address.
    pub frontends: Vec<FrontendStatus>,
    /// Connects that went through untranslated because of an internal error, over all Services.
    pub fail_open_total: u64,
    /// Reverse state the data path could not record (`tierlb_reverse_unrecorded_total`), over all Services.
    pub reverse_unrecorded_total: u64,
    /// Backends marked down now (marks not yet expired), sorted.
    pub backends_marked_down: Vec<String>,
    /// Those marks with their age and time left, sorted by backend.
    pub marks: Vec<MarkStatus>,
    /// Backends passive health follows now (failing, held or half-open), sorted by backend.
    pub health: Vec<HealthStatus>,
    /// Holds and recoveries passive health made, and panics (connects sent to a held backend because all of
    /// the tier's were held), since the maps were made.
    pub health_transitions: HealthTransitions,
    /// The north-south data path (traffic from outside the node), when its maps are pinned.
    pub north_south: Option<NorthSouthStatus>,
}

/// Passive health's program-wide counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HealthTransitions {
    /// Backends held down (for every client).
    pub held: u64,
    /// Backends held down for one client only.
    pub held_for_one_client: u64,
    /// Held backends a successful connect made healthy.
    pub healthy: u64,
    /// Connects sent to a held backend by the panic threshold.
    pub panics: u64,
}

/// The backends passive health follows now (not healthy), sorted by backend.
fn health_status(maps: &impl MapReader, now_ns: u64) -> Result<Vec<HealthStatus>, MapError> {
    use crate::datapath::health::{HealthState, reason, state};
    let secs = |ns: u64| Duration::from_nanos(ns).as_secs_f64();
    let mut out: Vec<HealthStatus> = maps
        .health()?
        .into_iter()
        .filter_map(|(b, h)| {
            let state = state(&h, now_ns);
            let held = matches!(state, HealthState::Held | HealthState::HeldForOneClient);
            (state != HealthState::Healthy).then(|| HealthStatus {
                backend: addr::backend_addr(&b).to_string(),
                state,
                reason: reason(&h),
                failures: h.failures,
                holds: h.holds,
                held_for_seconds: held.then(|| secs(now_ns.saturating_sub(h.held_since_ns))),
                left_seconds: held.then(|| secs(h.held_until_ns.saturating_sub(now_ns))),
            })
        })
        .collect();
    out.sort_by(|a, b| a.backend.cmp(&b.backend));
    Ok(out)
}

impl Instance {
    /// Read instance `name`'s status from `maps`, with marks as of `now_ns` (`CLOCK_BOOTTIME`).
    pub fn read(name: &str, maps: &impl MapReader, now_ns: u64) -> Result<Self, MapError> {
        let mut marks: Vec<(Backend, BackendState)> =
            maps.backend_marks()?.into_iter().filter(|(_, m)| m.is_down_at(now_ns)).collect();
        marks.sort_by_key(|(b, _)| addr::backend_addr(b));
        let down: Vec<Backend> = marks.iter().map(|(b, _)| *b).collect();
        let frontend_values = read_back(maps)?;
        // Fresh affinity entries per frontend (one read of the LRU, only if some frontend has affinity).
        let mut clients: std::collections::BTreeMap<FrontendKey, usize> = std::collections::BTreeMap::new();
        if frontend_values.values().any(|rb| rb.value.affinity_timeout_s != 0) {
            let connect = maps.affinity_entries()?.into_iter().map(|(k, v)| (k.frontend, v));
            let outside = maps.outside_affinity_entries()?.into_iter().map(|(k, v)| (k.frontend, v));
            for (frontend, v) in connect.chain(outside) {
                let Some(rb) = frontend_values.get(&frontend) else { continue };
                if v.is_fresh(now_ns, rb.value.affinity_timeout_s) {
                    *clients.entry(frontend).or_default() += 1;
                }
            }
        }
        let mut frontends = Vec::new();
        for (key, rb) in frontend_values {
            let label = maps.name(rb.value.svc_id)?.unwrap_or_default();
            let name = label.parse::<ServicePortName>().unwrap_or_default();
            let [node, zone, cluster] = &rb.tiers;
            let active = lb_common::first_live_tier([node, zone, cluster], |b| !down.contains(b));
            let tiers = rb.tiers.map(|t| {
                t.iter()
                    .map(|b| BackendStatus {
                        addr: addr::backend_addr(b).to_string(),
                        down: down.contains(b),
                    })
                    .collect::<Vec<_>>()
            });

            let local = rb.value.flags & FLAG_POLICY_LOCAL != 0;
            let c = maps.counters(rb.value.svc_id)?;
            frontends.push(FrontendStatus {
                name,
                frontend: addr::frontend_addr(&key).to_string(),
                protocol: proto_name(key.proto),
                scope: if key.is_outside() { "outside" } else { "connect" },
                policy: if local { "Local" } else { "Cluster" },
                active_tier: match active {
                    Some(0) if local => "local",
                    Some(0) => "node",
                    Some(1) => "zone",
                    Some(_) => "cluster",
                    None => "none",
                },
                when_empty: lb_common::errno_name(lb_common::refusal_errno(rb.value.flags)),
                tiers,
                connections: Counters::of(&c),
                session_affinity: (rb.value.affinity_timeout_s != 0).then(|| AffinityStatus {
                    timeout_seconds: rb.value.affinity_timeout_s,
                    clients: clients.get(&key).copied().unwrap_or(0),
                }),
                lb_algorithm: if rb.value.flags & lb_common::FLAG_MAGLEV != 0 { "maglev" } else { "random" },
                dsr: rb.value.flags & lb_common::FLAG_DSR != 0,
            });
        }
        frontends.sort_by(|a, b| (&a.name, &a.frontend).cmp(&(&b.name, &b.frontend)));
        let secs = |ns: u64| Duration::from_nanos(ns).as_secs_f64();
        let global = maps.counters(GLOBAL_SVC_ID)?;
        let fail_open_total = global[COUNTER_FAIL_OPEN as usize];
        let reverse_unrecorded_total = global[lb_common::COUNTER_REVERSE_UNRECORDED as usize];
        let health_transitions = HealthTransitions {
            held: global[lb_common::GLOBAL_HEALTH_HOLDS as usize],
            held_for_one_client: global[lb_common::GLOBAL_HEALTH_CLIENT_HOLDS as usize],
            healthy: global[lb_common::GLOBAL_HEALTH_RECOVERIES as usize],
            panics: global[lb_common::GLOBAL_HEALTH_PANICS as usize],
        };
        let health = health_status(maps, now_ns)?;
        let backends_marked_down = down.iter().map(|b| addr::backend_addr(b).to_string()).collect();
        let marks = marks
            .iter()
            .map(|(b, m)| MarkStatus {
                backend: addr::backend_addr(b).to_string(),
                protocol: proto_name(b.proto),
                age_seconds: secs(now_ns.saturating_sub(m.since_ns)),
                left_seconds: secs(m.until_ns.saturating_sub(now_ns)),
            })
            .collect();
        Ok(Self {
            instance: name.to_owned(),
            node: maps.name(GLOBAL_SVC_ID)?.filter(|n| !n.is_empty()),
            frontends,
            fail_open_total,
            reverse_unrecorded_total,
            backends_marked_down,
            marks,
            health,
            health_transitions,
            north_south: None,
        })
    }

    /// The human-readable form: a header line, then one line per frontend.
    pub fn table(&self) -> String {
        let mut out = format!("instance {}", self.instance);
        if let Some(node) = &self.node {
            let _ = write!(out, " (node {node})");
        }
        let _ = write!(out, ": {} frontends", self.frontends.len());
        if !self.backends_marked_down.is_empty() {
            let _ = write!(out, ", marked down: {}", self.backends_marked_down.join(" "));
        }
        if self.fail_open_total > 0 {
            let _ = write!(out, ", FAIL-OPEN connects: {}", self.fail_open_total);
        }
        out.push('\n');
        for m in &self.marks {
            let _ = writeln!(
                out,
                "  {} {} marked down {} ago, {} left",
                m.backend,
                m.protocol,
                human(Duration::from_secs_f64(m.age_seconds)),
                human(Duration::from_secs_f64(m.left_seconds))
            );
        }
        for h in &self.health {
            let _ = write!(out, "  {} {} by passive health ({}", h.backend, h.state.as_str(), h.reason);
            if let (Some(age), Some(left)) = (h.held_for_seconds, h.left_seconds) {
                let d = Duration::from_secs_f64;
                let _ =
                    write!(out, ", held {} ago, {} left, hold {}", human(d(age)), human(d(left)), h.holds);
            } else {
                let _ = write!(out, ", {} failed in a row", h.failures);
            }
            out.push_str(")\n");
        }
        if let Some(ns) = &self.north_south {
            out.push_str(&ns.table());
        }
        let _ = writeln!(
            out,
            "{:<34} {:<24} {:<8} {:<8} {:>8} {:>8} {:>8} {:>8}  TIERS (node | zone | cluster; * = down)",
            "SERVICE", "FRONTEND", "POLICY", "ACTIVE", "NODE", "ZONE", "CLUSTER", "REFUSED"
        );
        for f in &self.frontends {
            let name = f.name.to_string();
            let tiers: Vec<String> = f
                .tiers
                .iter()
                .map(|t| {
                    if t.is_empty() {
                        "-".to_owned()
                    } else {
                        t.iter()
                            .map(|b| format!("{}{}", b.addr, if b.down { "*" } else { "" }))
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                })
                .collect();
            let c = &f.connections;
            let _ = writeln!(
                out,
                "{:<34} {:<24} {:<8} {:<8} {:>8} {:>8} {:>8} {:>8}  {}",
                name,
                format!("{}/{}{}", f.frontend, f.protocol, if f.scope == "outside" { " ext" } else { "" }),
                f.policy,
                f.active_tier,
                c.node,
                c.zone,
                c.cluster,
                c.rejected + c.dropped,
                tiers.join(" | ")
            );
            if let Some(a) = &f.session_affinity {
                let _ = writeln!(
                    out,
                    "{:<34} sessionAffinity ClientIP {} s: {} clients remembered, {} connects to their backend",
                    "", a.timeout_seconds, a.clients, c.affinity
                );
            }
        }
        out
    }
}
