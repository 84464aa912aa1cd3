//! Services the data path could not take (a map full, a tier over 65,535 backends, no service id free), and
//! when to try them again: on a timer with exponential backoff, with no source event needed, and at once
//! when capacity may have been freed (frontends removed or swapped: their slots and ids come back after the
//! reconciler's grace period).
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant, SystemTime},
};

use crate::{
    datapath::{ApplyError, DEFAULT_GRACE},
    model::ObjKey,
};

/// The first retry of a Service that failed comes this long after the failure.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Each failed retry doubles the wait, up to this (kube-proxy's default sync period: a Service that cannot
/// be programmed is tried at least as often as kube-proxy would rewrite its rules).
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The wait before retry number `attempts + 1`: 1 s, 2 s, 4 s, ... 30 s.
pub fn backoff(attempts: u32) -> Duration {
    let doubled = RETRY_FIRST.saturating_mul(1 << attempts.saturating_sub(1).min(16));
    doubled.min(RETRY_MAX)
}

/// One Service that failed to apply.
#[derive(Clone, Debug)]
pub(super) struct Failure {
    /// When it first failed (since then it has not been programmed).
    pub(super) since: SystemTime,
    /// Attempts that failed in a row.
    pub(super) attempts: u32,
    /// When it is tried again (earlier if capacity is freed).
    pub(super) next: Instant,
    /// What the maps refused, one line per frontend (naming the Service port, the frontend and the fix).
    pub(super) reasons: Vec<String>,
}

/// Which Services a pass tried.
pub(super) enum Tried<'a> {
    /// Every Service in the model (a full replan): failures of Services not tried are forgotten too.
    All,
    /// These.
    Some(&'a BTreeSet<ObjKey>),
}

/// The Services waiting for a retry.
#[derive(Debug, Default)]
pub(super) struct Retries {
    failed: BTreeMap<ObjKey, Failure>,
    /// From then on every failed Service is due (capacity was freed).
    all_at: Option<Instant>,
}

impl Retries {
    /// The failures, by Service.
    pub(super) fn failures(&self) -> &BTreeMap<ObjKey, Failure> {
        &self.failed
    }

    /// The Services to try again at `now`.
    pub(super) fn due(&self, now: Instant) -> BTreeSet<ObjKey> {
        let all = self.all_at.is_some_and(|t| t <= now);
        self.failed.iter().filter(|(_, f)| all || f.next <= now).map(|(k, _)| k.clone()).collect()
    }

    /// Frontends were removed or swapped at `now`: their slots and service ids are free once the grace
    /// period is over, so every failed Service is worth a try then.
    pub(super) fn capacity_freed(&mut self, now: Instant) {
        if !self.failed.is_empty() {
            self.all_at = Some(now + DEFAULT_GRACE);
        }
    }

    /// Take in the outcome of a pass that tried `tried` and failed with `errors`.
    pub(super) fn record(&mut self, tried: &Tried<'_>, errors: &[ApplyError], now: Instant) {
        let mut reasons: BTreeMap<&ObjKey, Vec<String>> = BTreeMap::new();
        for e in errors {
            reasons.entry(&e.name.service).or_default().push(e.to_string());
        }
        match tried {
            Tried::All => self.failed.retain(|k, _| reasons.contains_key(k)),
            Tried::Some(keys) => self.failed.retain(|k, _| !keys.contains(k) || reasons.contains_key(k)),
        }
        for (service, reasons) in reasons {
            let f = self.failed.entry(service.clone()).or_insert_with(|| Failure {
                since: SystemTime::now(),
                attempts: 0,
                next: now,
                reasons: Vec::new(),
            });
            f.attempts += 1;
            f.next = now + backoff(f.attempts);
            f.reasons = reasons;
        }
        if self.all_at.is_some_and(|t| t <= now) || self.failed.is_empty() {
            self.all_at = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_one_second_up_to_thirty() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(u32::MAX), RETRY_MAX, "no overflow");
    }
}
