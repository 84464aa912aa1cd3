//! The packet-rate row: new TCP flows a second through the SNAT path sustained with no failed connect. Each
//! path's offered rate is stepped up, doubling from `START` until a step fails, then bisected between the
//! highest step that passed and the lowest that failed; the paths' steps alternate (A B A B ...), so a drift
//! of the machine meets both. A step is `lb_testkit::ns_loads::NewFlows` at that rate for a few seconds,
//! each connection a request and its answer ended with a reset (the client's own TIME_WAIT would otherwise
//! bound the rate by its ports, not by the path); it passes when no connect failed and the pace held.
use std::net::SocketAddr;

use lb_testkit::{
    ns_loads::{NewFlows, pod::Close},
    sandbox::NetNs,
};
use serde::Serialize;

use super::{figures::DataPath, north_south_snat::Sizes};

/// The first step's rate, connections a second.
const START: usize = 250;
/// No step above this (the client and the pods' servers share the machine: far past what it sustains).
const CAP: usize = 64_000;

/// One step of a path's search.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RateStep {
    /// Connections a second offered.
    pub rate: usize,
    /// Of them, failed.
    pub failed: usize,
    /// Whether every connect started on time (within half a second of the step's end).
    pub pace_held: bool,
}

impl RateStep {
    fn passed(&self) -> bool {
        self.failed == 0 && self.pace_held
    }
}

/// One path's search.
#[derive(Clone, Debug, Serialize)]
pub struct RateRow {
    /// The path.
    pub path: DataPath,
    /// The kube-proxy mode that ran beside it (its own for kube-proxy's rows; for tierlb's, the one whose
    /// steps its alternated with).
    pub beside: DataPath,
    /// Seconds of each step.
    pub step_secs: f64,
    /// The highest rate with no failed connect.
    pub sustained: Option<usize>,
    /// The lowest rate with a failed connect (or a pace that did not hold).
    pub failed_at: Option<usize>,
    /// Every step, in the order run.
    pub steps: Vec<RateStep>,
}

impl RateRow {
    fn new(path: DataPath, beside: DataPath, step_secs: f64) -> Self {
        Self { path, beside, step_secs, sustained: None, failed_at: None, steps: Vec::new() }
    }

    /// The next rate to offer, or none when the search is done: the gap between the highest pass and the
    /// lowest failure within a tenth of the pass (or 25 a second), or the cap reached.
    fn next(&self) -> Option<usize> {
        match (self.sustained, self.failed_at) {
            (None, None) => Some(START),
            (Some(ok), None) => (ok < CAP).then(|| (ok * 2).min(CAP)),
            (ok, Some(bad)) => {
                let ok = ok.unwrap_or(0);
                (bad - ok > (ok / 10).max(25)).then(|| ok + (bad - ok) / 2)
            }
        }
    }

    fn record(&mut self, step: RateStep) {
        if step.passed() {
            self.sustained = Some(step.rate);
        } else {
            self.failed_at = Some(step.rate);
        }
        self.steps.push(step);
    }
}

/// The search on each of `paths` (each to its node port, answered by `pod`), steps alternating, at most
/// `size.max_steps` each; `beside` is the kube-proxy mode running.
pub(super) fn max_rates(
    client: &NetNs,
    paths: &[(DataPath, SocketAddr)],
    pod: &str,
    size: &Sizes,
    beside: DataPath,
) -> Vec<RateRow> {
    let mut rows: Vec<RateRow> =
        paths.iter().map(|(p, _)| RateRow::new(*p, beside, size.step_secs)).collect();
    for step in 0..size.max_steps {
        let mut any = false;
        // A B, then B A: neither path always runs right after the other's step.
        let order: Vec<usize> =
            if step % 2 == 0 { (0..paths.len()).collect() } else { (0..paths.len()).rev().collect() };
        for i in order {
            let Some(rate) = rows[i].next() else { continue };
            any = true;
            // Enough workers for a few milliseconds a connect at this rate; a failing step's connects take
            // 1.5 s each and slow it, which fails it anyway.
            let load = NewFlows {
                rate,
                seconds: size.step_secs,
                workers: (rate / 20).clamp(16, 512),
                close: Close::Rst,
            };
            let run = load.run(client, paths[i].1, pod);
            let s = RateStep { rate, failed: run.failed, pace_held: run.pace_held(0.5) };
            eprintln!(
                "bench: packet rate {:<19} {rate:>6}/s for {} s: {} of {} failed{}, last started at {:.2} s{}",
                paths[i].0.as_str(),
                size.step_secs,
                run.failed,
                run.offered,
                if run.errors.is_empty() { String::new() } else { format!(" {:?}", run.errors) },
                run.last_start,
                if s.pace_held { "" } else { " (pace not held)" }
            );
            rows[i].record(s);
            // The step's flows closed; their entries (a reset: seconds in either table) leave before the next.
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        if !any {
            break;
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: usize, ok: bool) -> RateStep {
        RateStep { rate, failed: usize::from(!ok), pace_held: true }
    }

    /// Doubling from 250 until a step fails, then bisecting to within a tenth.
    #[test]
    fn the_search_doubles_then_bisects() {
        let mut r = RateRow::new(DataPath::Tierlb, DataPath::KubeProxyIptables, 1.0);
        let limit = 1_300;
        let mut rates = Vec::new();
        while let Some(rate) = r.next() {
            rates.push(rate);
            r.record(step(rate, rate <= limit));
        }
        assert_eq!(rates[..4], [250, 500, 1_000, 2_000]);
        assert_eq!(rates[4], 1_500);
        let (ok, bad) = (r.sustained.unwrap(), r.failed_at.unwrap());
        assert!(ok <= limit && bad > limit && bad - ok <= ok / 10, "{ok} {bad} {rates:?}");
        // A first step that fails bisects towards zero.
        let mut r = RateRow::new(DataPath::Tierlb, DataPath::KubeProxyIptables, 1.0);
        r.record(step(250, false));
        assert_eq!(r.next(), Some(125));
    }
}
