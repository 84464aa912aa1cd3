//! tierlb's passive health as the study models it: what each node's kernel does when an endpoint crashed
//! before the EndpointSlice says so. It claims only what the data path does (lb-ebpf/src/health.rs), and
//! decides nothing of its own: each node's entry for a crashed backend is an `lb_common::Health`, every failure
//! the model counts goes through `Health::fail` and every choice asks `Health::verdict`, as in the kernel:
//!
//! - a node's kernel learns only from its own clients' connects to the backend (nodes do not share health); a
//!   client is a network namespace, and the node's requests come from its `clientPods` pods;
//! - a connect to a crashed process is refused at once (its node answers the SYN with an RST); one to a dead
//!   node (or a blackholed path) hangs, and the kernel counts it failed at the SYN's first retransmission
//!   timeout (1 s), so the connects sent meanwhile hang too;
//! - `failures` (K) failed connects in a row from `clients` (the quorum, `--health-clients`: 1 or 2) distinct
//!   pods hold the backend down for `hold` for every pod of the node: its new connects skip it and take the next
//!   live backend or tier (node, zone, cluster), and if every backend of every tier is held they go to a random
//!   one of the last non-empty tier anyway (the panic threshold, `last_nonempty_tier`). The same K failures
//!   from one pod alone hold it for that pod only; another pod's failure then completes the quorum (held for
//!   all). So a node with fewer client pods than the quorum (one pod, the default quorum 2) still loses K:
//!   its one pod holds the backend for itself;
//! - when a hold ends, the next connect that picks the backend is a trial (the others skip it until the trial
//!   reports); a failed trial holds it again, twice as long, up to `max_hold`: for every pod if the quorum is
//!   1, else for the trial's pod alone, and the next failed connect of another pod (which still uses it)
//!   holds it for all, twice as long again. With two client pods or more and the quorum 2, each failed trial
//!   therefore costs that other pod's connect too (and, for a dead node, its connects during that connect's
//!   SYN timeout), and the holds double twice per trial.
//!
//! The study counts shares of requests, so requests are a fluid here (`fluid`): each node sends its share of
//! the scenario's `requestsPerSecond` evenly over time, its pods equal parts, each split evenly among the
//! backends its kernel lets that pod pick. The connects to a crashed backend are made whole for the kernel's
//! rule: the n-th once n connects' worth went to it since the pods using it last changed, from those pods in
//! turn; its failure reaches `Health::fail` after the crash's report delay. So the K-th failure arrives once K
//! connects went to the backend, and a trial once the next connect picking it was sent (on average after as
//! many connects as the set it is picked from has backends). That is the mean of what the kernel does, not
//! one random run: a real run's counts are whole and its times jitter around these. One thing is left out: a
//! connect the panic threshold sends to a held backend is lost but not counted (its failure comes back inside
//! the hold, which it does not change, unless the node is dead and the hold ends within the SYN timeout).
mod fluid;
#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

pub use fluid::simulate;
use lb_common::{HEALTH_REFUSED, HEALTH_TIMEOUT, HealthConfig};
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

    /// The failure's reason as `sock_ops` records it (`Health::reason`).
    fn reason(self) -> u32 {
        if self.hangs() { HEALTH_TIMEOUT } else { HEALTH_REFUSED }
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
/// `--health-max-hold`, `--health-clients`); a scenario's `health:` may change them, the agent's defaults
/// otherwise.
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
    /// Distinct clients (network namespaces: pods) whose failures hold a backend for every client of a node
    /// (the quorum, `--health-clients`: 1 or 2).
    #[serde(deserialize_with = "quorum")]
    pub clients: u32,
}

impl Default for HealthParams {
    /// The agent's defaults.
    fn default() -> Self {
        let s = HealthSettings::default();
        Self {
            failures: s.failures,
            hold_s: s.hold.as_secs_f64(),
            max_hold_s: s.max_hold.as_secs_f64(),
            clients: s.clients,
        }
    }
}

impl HealthParams {
    /// The settings as the agent writes them for the kernel (`HealthSettings::config`).
    fn config(&self) -> HealthConfig {
        HealthSettings {
            failures: self.failures,
            hold: Duration::from_secs_f64(self.hold_s),
            max_hold: Duration::from_secs_f64(self.max_hold_s),
            clients: self.clients,
        }
        .config()
    }

    /// The model's name in the table and chart, with K and the quorum: what it claims depends on them.
    pub fn label(&self) -> String {
        if self.failures == 0 {
            "tierlb (passive health off)".into()
        } else {
            let s = if self.clients == 1 { "" } else { "s" };
            format!("tierlb (passive health, K={}, {} client{s})", self.failures, self.clients)
        }
    }
}

/// A duration as the agent's flags write it (`5s`, `2m`, `1m30s`), in seconds.
pub(crate) fn duration_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let s = String::deserialize(d)?;
    crate::datapath::marks::parse_duration(&s).map(|d| d.as_secs_f64()).map_err(serde::de::Error::custom)
}

/// The quorum as `--health-clients` takes it: 1 or 2 (the kernel counts at most two distinct clients).
fn quorum<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    if matches!(n, 1 | 2) {
        Ok(n)
    } else {
        Err(serde::de::Error::custom(format!("{n}: 1 or 2, as --health-clients")))
    }
}

/// What passive health did on one client node about one crashed backend.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detection {
    /// The client node (its kernel's health map).
    pub node: String,
    /// Its client pods (network namespaces), whose failures the quorum counts.
    pub client_pods: u32,
    /// The crashed backend's IP.
    pub backend: String,
    /// How it crashed.
    pub crash: Crash,
    /// The node's requests to it that failed (refused) or hung before every pod of the node skipped it: K for
    /// a crashed process (one pod's K with fewer pods than the quorum, K from the node's pods in turn
    /// otherwise); for a dead node K plus those sent during the K-th connect's SYN timeout. Fluid: may be
    /// fractional.
    pub failed_before_hold: f64,
    /// When every pod of the node first skipped it (held for all, or the node's one pod's own hold), in
    /// seconds from the crash: from then on the node's connects fall back. `None`: not within the phase.
    pub held_at_s: Option<f64>,
    /// Trials that failed within the phase (each a request lost, each renewing the hold twice as long).
    pub failed_trials: u32,
    /// The node's requests to it lost after `held_at_s` within the phase: the failed trials, with the quorum
    /// 2 and two pods or more the other pods' connects that held it for all again after each (and for a dead
    /// node those sent during their SYN timeout), and what the panic threshold sends to it. Fluid.
    pub failed_after_hold: f64,
    /// Holds the node's kernel began within the phase, for every pod or for one (`Health::holds`).
    pub holds: u32,
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
