//! tierlb's passive health as the study models it: what each node's kernel does when an endpoint crashed
//! before the EndpointSlice says so. It claims only what the data path does (lb-ebpf/src/health.rs):
//!
//! - a node's kernel learns only from its own clients' connects to the backend (nodes do not share health);
//! - a connect to a crashed process is refused at once (its node answers the SYN with an RST); one to a dead
//!   node (or a blackholed path) hangs, and the kernel counts it failed at the SYN's first retransmission
//!   timeout (1 s), so the connects sent meanwhile hang too;
//! - `failures` (K) failed connects in a row hold the backend down for `hold`: the node's new connects skip it
//!   and take the next live backend or tier (node, zone, cluster), and if every backend of every tier is held
//!   they go to a random one of the last non-empty tier anyway (the panic threshold, `last_nonempty_tier`);
//! - when a hold ends, the next connect that picks the backend is a trial (the others skip it until the trial
//!   reports); a failed trial holds it again, twice as long, up to `max_hold`.
//!
//! The study counts shares of requests, so requests are a fluid here: each node sends its share of the
//! scenario's `requestsPerSecond` evenly over time, split evenly among the backends its kernel would pick. The
//! K-th failure to a backend arrives once K connects went to it; a trial once the next connect picking it was
//! sent (on average after as many connects as the set it is picked from has backends). That is the mean of what
//! the kernel does, not one random run: a real run's counts are whole and its times jitter around these.
use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use serde::{Deserialize, Serialize};

use crate::datapath::health::HealthSettings;

/// The SYN's first retransmission timeout (the kernel's `TCP_TIMEOUT_INIT`): when `sock_ops` counts a connect
/// to a dead node as failed.
pub const SYN_TIMEOUT_S: f64 = 1.0;

/// How an endpoint crashed before the EndpointSlice says so: what a connect to it meets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Crash {
    /// Not crashed.
    #[default]
    #[serde(rename = "none")]
    Running,
    /// The pod's process is gone, its node is up: connects are refused at once (ECONNREFUSED).
    Process,
    /// Its node is gone (or the path to it blackholed): SYNs go unanswered and connects hang until the client's
    /// timeout.
    Node,
}

impl Crash {
    /// Whether it crashed at all.
    pub fn crashed(self) -> bool {
        self != Self::Running
    }

    /// Whether a request sent to it hangs (until the client's timeout) rather than failing at once.
    pub fn hangs(self) -> bool {
        self == Self::Node
    }

    /// How long after its connect a failure reaches the kernel's `sock_ops`.
    fn report_delay_s(self) -> f64 {
        if self.hangs() { SYN_TIMEOUT_S } else { 0.0 }
    }

    /// As the study's table says it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Process => "process crashed: connects refused",
            Self::Node => "node gone: SYNs unanswered, connects hang",
        }
    }
}

/// Passive health's settings, as the agent's flags set them (`--health-failures`, `--health-hold`,
/// `--health-max-hold`); a scenario's `health:` may change them, the agent's defaults otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthParams {
    /// Consecutive failed connects that hold a backend down (K); 0 turns passive health off.
    pub failures: u32,
    /// The first hold, in seconds (YAML: a duration such as `5s`).
    #[serde(rename(deserialize = "hold", serialize = "hold_s"), deserialize_with = "duration_s")]
    pub hold_s: f64,
    /// The longest hold, in seconds (YAML `maxHold`, a duration).
    #[serde(rename(deserialize = "maxHold", serialize = "max_hold_s"), deserialize_with = "duration_s")]
    pub max_hold_s: f64,
}

impl Default for HealthParams {
    /// The agent's defaults.
    fn default() -> Self {
        let s = HealthSettings::default();
        Self { failures: s.failures, hold_s: s.hold.as_secs_f64(), max_hold_s: s.max_hold.as_secs_f64() }
    }
}

impl HealthParams {
    /// The hold after `holds` earlier ones without a success, as the kernel computes it (`Health::hold_for`:
    /// doubled each time, at most the longest hold).
    fn hold_for(&self, holds: u32) -> f64 {
        let settings = HealthSettings {
            failures: self.failures,
            hold: Duration::from_secs_f64(self.hold_s),
            max_hold: Duration::from_secs_f64(self.max_hold_s),
            ..HealthSettings::default()
        };
        Duration::from_nanos(lb_common::Health::hold_for(holds, &settings.config())).as_secs_f64()
    }

    /// The model's name in the table and chart, with K: what it claims depends on it.
    pub fn label(&self) -> String {
        if self.failures == 0 {
            "tierlb (passive health off)".into()
        } else {
            format!("tierlb (passive health, K={})", self.failures)
        }
    }
}

/// A duration as the agent's flags write it (`5s`, `2m`, `1m30s`), in seconds.
pub(crate) fn duration_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let s = String::deserialize(d)?;
    crate::datapath::marks::parse_duration(&s).map(|d| d.as_secs_f64()).map_err(serde::de::Error::custom)
}

/// What passive health did on one client node about one crashed backend.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detection {
    /// The client node (its kernel's health map).
    pub node: String,
    /// The crashed backend's IP.
    pub backend: String,
    /// How it crashed.
    pub crash: Crash,
    /// The node's requests to it that failed (refused) or hung before its kernel held it down: K for a crashed
    /// process; for a dead node K plus those sent during the K-th connect's SYN timeout. Fluid: may be
    /// fractional.
    pub failed_before_hold: f64,
    /// When the first hold began, in seconds from the crash: from then on the node's connects fall back.
    /// `None`: not within the phase.
    pub held_at_s: Option<f64>,
    /// Trials that failed within the phase (each a request lost, each renewing the hold twice as long).
    pub failed_trials: u32,
}

/// Where one node's requests went, as fractions of them (summing to 1).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Flow {
    /// Requests served, per backend.
    pub ok: BTreeMap<IpAddr, f64>,
    /// Requests refused.
    pub failed: f64,
    /// Requests that hung.
    pub hang: f64,
    /// What the node's kernel learned, per crashed backend it sent to.
    pub detections: Vec<Detection>,
}

impl Flow {
    /// `amount` requests (or a fraction) sent to `ip`, which `crash` says serves or not.
    pub(crate) fn send(&mut self, ip: IpAddr, crash: Crash, amount: f64) {
        if !crash.crashed() {
            *self.ok.entry(ip).or_default() += amount;
        } else if crash.hangs() {
            self.hang += amount;
        } else {
            self.failed += amount;
        }
    }

    fn scale(&mut self, by: f64) {
        for v in self.ok.values_mut() {
            *v *= by;
        }
        self.failed *= by;
        self.hang *= by;
    }
}

/// The data path's choice on a node from its tiers (node, zone, cluster), given which backends are usable:
/// the first tier with a usable backend, uniform among its usable ones (`lb_common::first_live_tier`); when
/// none is usable, every backend of the last non-empty tier (the panic threshold, as
/// `lb_common::last_nonempty_tier`).
pub fn pick(tiers: &[Vec<IpAddr>; 3], usable: impl Fn(&IpAddr) -> bool) -> Vec<IpAddr> {
    let arr = [tiers[0].as_slice(), tiers[1].as_slice(), tiers[2].as_slice()];
    match lb_common::first_live_tier(arr, &usable) {
        Some(t) => arr[t].iter().filter(|ip| usable(ip)).copied().collect(),
        None => arr.iter().rfind(|t| !t.is_empty()).map(|t| t.to_vec()).unwrap_or_default(),
    }
}

/// One crashed backend in one node's kernel.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Used: the node's connects to it fail; once `sent` reaches `need` (K, or 1 for a trial) the last of them
    /// reaches the kernel after the crash's report delay.
    Counting { need: f64, sent: f64, trial: bool },
    /// The deciding connect was sent; its failure reaches the kernel at `until`. Before the first hold the
    /// backend stays in use meanwhile (the kernel has not counted K yet); a trial's backend is skipped until its
    /// trial reports.
    Reporting { until: f64, used: bool },
    /// Held down until `until`.
    Held { until: f64 },
}

struct Tracked {
    crash: Crash,
    state: State,
    holds: u32,
    det: Detection,
}

impl Tracked {
    fn usable(&self) -> bool {
        matches!(self.state, State::Counting { .. } | State::Reporting { used: true, .. })
    }
}

/// Fluid events closer than this are simultaneous.
const EPS: f64 = 1e-9;
/// A bound on the simulation's events (a hold cycle is three); a phase that needs more is cut there.
const MAX_EVENTS: usize = 1_000_000;

/// One node's requests under passive health while the `crashed` backends are down: `rate` requests per second
/// from the node, over `duration` seconds from the crash. Without a duration the flow is the steady state
/// after every crashed backend the node sends to is held (a phase without time), and the detections say what
/// it cost to get there.
pub fn simulate(
    node: &str,
    tiers: &[Vec<IpAddr>; 3],
    crashed: &BTreeMap<IpAddr, Crash>,
    params: &HealthParams,
    rate: f64,
    duration: Option<f64>,
) -> Flow {
    let crash_of = |ip: &IpAddr| crashed.get(ip).copied().unwrap_or_default();
    let steady = |usable: &dyn Fn(&IpAddr) -> bool| {
        let set = pick(tiers, usable);
        let mut f = Flow::default();
        for ip in &set {
            f.send(*ip, crash_of(ip), 1.0 / set.len() as f64);
        }
        if set.is_empty() {
            // No endpoint in any tier: tierlb fails the connect at once.
            f.failed = 1.0;
        }
        f
    };
    let in_tiers = |ip: &IpAddr| tiers.iter().any(|t| t.contains(ip));
    let mut tracked: BTreeMap<IpAddr, Tracked> = crashed
        .iter()
        .filter(|(ip, c)| c.crashed() && in_tiers(ip))
        .map(|(ip, c)| {
            let det = Detection {
                node: node.to_owned(),
                backend: ip.to_string(),
                crash: *c,
                failed_before_hold: 0.0,
                held_at_s: None,
                failed_trials: 0,
            };
            let state = State::Counting { need: f64::from(params.failures), sent: 0.0, trial: false };
            (*ip, Tracked { crash: *c, state, holds: 0, det })
        })
        .collect();
    if params.failures == 0 || tracked.is_empty() || rate <= 0.0 {
        // Nothing to learn (or nobody to learn it): the node keeps its choice, crashed backends included.
        return steady(&|_| true);
    }
    let horizon = duration.unwrap_or(f64::INFINITY);
    let mut flow = Flow::default();
    let mut t = 0.0;
    for _ in 0..MAX_EVENTS {
        settle(&mut tracked, params, t);
        let set = pick(tiers, |ip| tracked.get(ip).is_none_or(Tracked::usable));
        if duration.is_none()
            && tracked.iter().all(|(ip, b)| {
                b.det.held_at_s.is_some() || (matches!(b.state, State::Counting { .. }) && !set.contains(ip))
            })
        {
            break;
        }
        let per = rate / set.len() as f64;
        let mut next = horizon;
        for (ip, b) in &tracked {
            next = next.min(match b.state {
                State::Counting { need, sent, .. } if set.contains(ip) => t + (need - sent) / per,
                State::Counting { .. } => f64::INFINITY,
                State::Reporting { until, .. } | State::Held { until } => until,
            });
        }
        if !next.is_finite() {
            break;
        }
        let dt = next - t;
        for ip in &set {
            let n = per * dt;
            flow.send(*ip, crash_of(ip), n);
            if let Some(b) = tracked.get_mut(ip) {
                if b.det.held_at_s.is_none() {
                    b.det.failed_before_hold += n;
                }
                if let State::Counting { sent, .. } = &mut b.state {
                    *sent += n;
                }
            }
        }
        t = next;
        if t >= horizon - EPS {
            break;
        }
    }
    let detections =
        tracked.into_values().map(|b| b.det).filter(|d| d.failed_before_hold > EPS || d.held_at_s.is_some());
    let mut out = if let Some(d) = duration {
        flow.scale(1.0 / (rate * d));
        flow
    } else {
        steady(&|ip| !crash_of(ip).crashed())
    };
    out.detections = detections.collect();
    out
}

/// Apply every transition due at `t` (a process crash's report is immediate, so one instant can chain a
/// count reaching K, its report and the hold).
fn settle(tracked: &mut BTreeMap<IpAddr, Tracked>, params: &HealthParams, t: f64) {
    for b in tracked.values_mut() {
        loop {
            b.state = match b.state {
                State::Counting { need, sent, trial } if sent >= need - EPS => {
                    if trial {
                        b.det.failed_trials += 1;
                    }
                    State::Reporting { until: t + b.crash.report_delay_s(), used: !trial }
                }
                State::Reporting { until, .. } if until <= t + EPS => {
                    b.det.held_at_s.get_or_insert(t);
                    let hold = params.hold_for(b.holds);
                    b.holds += 1;
                    State::Held { until: t + hold }
                }
                State::Held { until } if until <= t + EPS => {
                    State::Counting { need: 1.0, sent: 0.0, trial: true }
                }
                _ => break,
            };
        }
    }
}
