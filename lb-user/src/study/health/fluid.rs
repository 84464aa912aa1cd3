//! One node's requests as a fluid, its kernel's entries for the crashed backends as the kernel keeps them: the
//! connects the fluid makes whole go through `lb_common::Health` (`verdict` at the choice, `fail` when the
//! failure is reported), so the model and the kernel's rule cannot part.
use std::{
    collections::{BTreeMap, VecDeque},
    net::IpAddr,
};

use lb_common::{HEALTH_TRIAL_NS, Health, HealthConfig, HealthVerdict, Held};

use super::{Crash, Detection, Flow, HealthParams, pick};

/// A client pod of the node as the kernel tells clients apart (its network namespace's cookie).
pub(super) type Pod = u64;

/// One whole connect the model fed to the kernel's rule: when it was sent, by which pod, whether it was a trial
/// and what hold its failure began when it was reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Fed {
    pub(super) sent_s: f64,
    pub(super) pod: Pod,
    pub(super) trial: bool,
    pub(super) held: Held,
}

/// One crashed backend in one node's kernel.
struct Tracked {
    crash: Crash,
    /// The node's entry for it (`HEALTH`).
    kernel: Health,
    /// The pods whose connects use it now: picked and not skipped.
    users: Vec<Pod>,
    /// Connects' worth that `users` sent to it since the last whole connect (or since `users` changed).
    owed: f64,
    /// Whose turn among `users` the next whole connect is.
    turn: usize,
    /// Failed connects on their way to `sock_ops`, in order: (sent, pod, trial).
    reports: VecDeque<(f64, Pod, bool)>,
    det: Detection,
}

impl Tracked {
    /// Whether `pod`'s connects skip it at `now` (held for all, for that pod, or a trial in flight).
    fn skips(&self, pod: Pod, now: u64) -> bool {
        self.kernel.verdict(pod, now) == HealthVerdict::Skip
    }
}

/// Fluid events closer than this are simultaneous.
const EPS: f64 = 1e-9;
/// A bound on the simulation's events (a hold cycle is a handful); a phase that needs more is cut there.
const MAX_EVENTS: usize = 1_000_000;

/// Seconds from the crash as the kernel's clock (ns; the model's times are never negative).
#[expect(clippy::cast_sign_loss, reason = "times from the crash, never negative")]
pub(super) fn ns(t: f64) -> u64 {
    (t * 1e9).round() as u64
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// One node's requests under passive health while the `crashed` backends are down: `rate` requests per second
/// from the node's `pods` client pods (network namespaces; at least one), over `duration` seconds from the
/// crash. Without a duration the flow is the steady state after every crashed backend the node sends to is
/// held (a phase without time), and the detections say what it cost to get there.
pub fn simulate(
    node: &str,
    tiers: &[Vec<IpAddr>; 3],
    crashed: &BTreeMap<IpAddr, Crash>,
    params: &HealthParams,
    pods: u32,
    rate: f64,
    duration: Option<f64>,
) -> Flow {
    run(node, tiers, crashed, params, pods, rate, duration).0
}

/// `simulate`, with the connects fed to the kernel's rule, in the order they were reported.
pub(super) fn run(
    node: &str,
    tiers: &[Vec<IpAddr>; 3],
    crashed: &BTreeMap<IpAddr, Crash>,
    params: &HealthParams,
    pods: u32,
    rate: f64,
    duration: Option<f64>,
) -> (Flow, Vec<Fed>) {
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
    let mut sim = Node::new(node, tiers, crashed, params, pods, rate);
    if params.failures == 0 || sim.tracked.is_empty() || rate <= 0.0 {
        // Nothing to learn (or nobody to learn it): the node keeps its choice, crashed backends included.
        return (steady(&|_| true), Vec::new());
    }
    let horizon = duration.unwrap_or(f64::INFINITY);
    let mut t = 0.0;
    for _ in 0..MAX_EVENTS {
        sim.deliver(t);
        let sets = sim.choose(ns(t));
        sim.watch(t, &sets);
        if duration.is_none() && sim.learned(&sets) {
            break;
        }
        let next = sim.next_event(t, &sets).min(horizon);
        if !next.is_finite() {
            break;
        }
        sim.send(&sets, (next - t).max(0.0));
        t = next;
        sim.make_whole(t);
        if t >= horizon - EPS {
            break;
        }
    }
    let Node { tracked, mut flow, fed, .. } = sim;
    let detections = tracked
        .into_values()
        .map(|b| Detection { holds: b.kernel.holds, ..b.det })
        .filter(|d| d.failed_before_hold > EPS || d.held_at_s.is_some());
    let mut out = if let Some(d) = duration {
        flow.scale(1.0 / (rate * d));
        flow
    } else {
        steady(&|ip| !crash_of(ip).crashed())
    };
    out.detections = detections.collect();
    (out, fed)
}

/// One node: its client pods, its kernel's entries for the crashed backends it may pick, and where its
/// requests went so far.
struct Node<'a> {
    tiers: &'a [Vec<IpAddr>; 3],
    crashed: &'a BTreeMap<IpAddr, Crash>,
    cfg: HealthConfig,
    pods: Vec<Pod>,
    /// Each pod's requests per second.
    each: f64,
    tracked: BTreeMap<IpAddr, Tracked>,
    flow: Flow,
    fed: Vec<Fed>,
}

impl<'a> Node<'a> {
    fn new(
        node: &str,
        tiers: &'a [Vec<IpAddr>; 3],
        crashed: &'a BTreeMap<IpAddr, Crash>,
        params: &HealthParams,
        pods: u32,
        rate: f64,
    ) -> Self {
        let pods: Vec<Pod> = (1..=u64::from(pods.max(1))).collect();
        let in_tiers = |ip: &IpAddr| tiers.iter().any(|t| t.contains(ip));
        let tracked = crashed
            .iter()
            .filter(|(ip, c)| c.crashed() && in_tiers(ip))
            .map(|(ip, c)| {
                let det = Detection {
                    node: node.to_owned(),
                    client_pods: pods.len() as u32,
                    backend: ip.to_string(),
                    crash: *c,
                    failed_before_hold: 0.0,
                    held_at_s: None,
                    failed_trials: 0,
                    failed_after_hold: 0.0,
                    holds: 0,
                };
                let (kernel, users, reports) = (Health::default(), Vec::new(), VecDeque::new());
                (*ip, Tracked { crash: *c, kernel, users, owed: 0.0, turn: 0, reports, det })
            })
            .collect();
        let each = rate / pods.len() as f64;
        let (flow, fed) = (Flow::default(), Vec::new());
        Self { tiers, crashed, cfg: params.config(), pods, each, tracked, flow, fed }
    }

    /// The failures reported by `t` reach the kernel's rule, in the order they were sent.
    fn deliver(&mut self, t: f64) {
        for b in self.tracked.values_mut() {
            while let Some(&(sent, pod, trial)) = b.reports.front()
                && sent + b.crash.report_delay_s() <= t + EPS
            {
                b.reports.pop_front();
                let held =
                    b.kernel.fail(pod, b.crash.reason(), &self.cfg, ns(sent + b.crash.report_delay_s()));
                self.fed.push(Fed { sent_s: sent, pod, trial, held });
            }
        }
    }

    /// Each pod's choice at `now`: the connect programs ask the kernel's entry with the pod's namespace.
    fn choose(&self, now: u64) -> Vec<Vec<IpAddr>> {
        let skipped = |ip: &IpAddr, pod| self.tracked.get(ip).is_some_and(|b| b.skips(pod, now));
        self.pods.iter().map(|&pod| pick(self.tiers, |ip| !skipped(ip, pod))).collect()
    }

    /// Which pods use each crashed backend now (a change starts its count of connects again), and whether every
    /// pod skips it: the node's hold.
    fn watch(&mut self, t: f64, sets: &[Vec<IpAddr>]) {
        let now = ns(t);
        for (ip, b) in &mut self.tracked {
            if b.det.held_at_s.is_none() && self.pods.iter().all(|&pod| b.skips(pod, now)) {
                b.det.held_at_s = Some(t);
            }
            let users: Vec<Pod> = self
                .pods
                .iter()
                .zip(sets)
                .filter(|&(&pod, set)| set.contains(ip) && !b.skips(pod, now))
                .map(|(&pod, _)| pod)
                .collect();
            if users != b.users {
                b.users = users;
                b.owed = 0.0;
            }
        }
    }

    /// Without a duration: whether every crashed backend the node sends to is held (the steady state).
    fn learned(&self, sets: &[Vec<IpAddr>]) -> bool {
        self.tracked.iter().all(|(ip, b)| {
            b.det.held_at_s.is_some()
                || (b.reports.is_empty()
                    && b.kernel.held_until_ns == 0
                    && sets.iter().all(|s| !s.contains(ip)))
        })
    }

    /// Requests per second a pod sends to each backend of `set`.
    fn per(&self, set: &[IpAddr]) -> f64 {
        if set.is_empty() { 0.0 } else { self.each / set.len() as f64 }
    }

    /// The next time something changes: a connect made whole, a failure reported, a hold or a trial's window
    /// ending.
    fn next_event(&self, t: f64, sets: &[Vec<IpAddr>]) -> f64 {
        let now = ns(t);
        let mut next = f64::INFINITY;
        for b in self.tracked.values() {
            // Pods are 1..=n: pod p's set is sets[p - 1].
            let to_it: f64 = b.users.iter().map(|&pod| self.per(&sets[pod as usize - 1])).sum();
            if to_it > 0.0 {
                next = next.min(t + (1.0 - b.owed) / to_it);
            }
            if let Some((sent, _, _)) = b.reports.front() {
                next = next.min(sent + b.crash.report_delay_s());
            }
            for until in [b.kernel.held_until_ns, b.kernel.trial_until_ns] {
                if until > now {
                    next = next.min(secs(until));
                }
            }
        }
        next
    }

    /// `dt` seconds of each pod's requests, split evenly over its set.
    fn send(&mut self, sets: &[Vec<IpAddr>], dt: f64) {
        for (&pod, set) in self.pods.iter().zip(sets) {
            if set.is_empty() {
                // No endpoint in any tier: tierlb fails the connect at once.
                self.flow.failed += self.each * dt;
            }
            let n = self.per(set) * dt;
            for ip in set {
                self.flow.send(*ip, self.crashed.get(ip).copied().unwrap_or_default(), n);
                if let Some(b) = self.tracked.get_mut(ip) {
                    if b.det.held_at_s.is_none() {
                        b.det.failed_before_hold += n;
                    } else {
                        b.det.failed_after_hold += n;
                    }
                    if b.users.contains(&pod) {
                        b.owed += n;
                    }
                }
            }
        }
    }

    /// A connect made whole by `t`: from the next of the pods using the backend; the trial if the kernel says
    /// so; its failure on its way to `sock_ops`.
    fn make_whole(&mut self, t: f64) {
        let now = ns(t);
        for b in self.tracked.values_mut() {
            if b.users.is_empty() || b.owed < 1.0 - EPS {
                continue;
            }
            b.owed = 0.0;
            let pod = b.users[b.turn % b.users.len()];
            b.turn += 1;
            let trial = b.kernel.verdict(pod, now) == HealthVerdict::Trial;
            if trial {
                // The connect program's `start_trial`: the others skip it until this one reports.
                b.kernel.trial_until_ns = now + HEALTH_TRIAL_NS;
                b.det.failed_trials += 1;
            }
            b.reports.push_back((t, pod, trial));
        }
    }
}
