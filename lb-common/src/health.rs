//! Passive health as the kernel keeps it (`MAP_HEALTH`, `MAP_HEALTH_CONFIG`) and the rule the connect
//! programs apply to it (`Health::verdict`, `Health::hold_for`), shared with user space.
use core::mem::size_of;

use bytemuck::{Pod, Zeroable};

use crate::Backend;

/// Passive health settings, written by the agent (`--health-failures`, `--health-hold`, `--health-max-hold`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct HealthConfig {
    /// Consecutive failed connects that hold a backend down; 0 turns passive health off.
    pub failures: u32,
    /// Nonzero while `HEALTH` may hold an entry: the data path looks backends up in `HEALTH` only then (a
    /// hash lookup per slot it considers, saved on the common path, a healthy cluster). `sock_ops` sets it
    /// after every failure it records; the agent's sweep clears it when the map is empty, then reads the map
    /// again and sets it back if an entry appeared meanwhile (`datapath::health::gate`).
    pub active: u32,
    /// The first hold, in ns; each further hold without a success in between doubles it.
    pub hold_ns: u64,
    /// The longest hold, in ns.
    pub max_hold_ns: u64,
}
const _: () = assert!(size_of::<HealthConfig>() == 24);

/// How long a half-open trial connect may take before another connect may try the backend (its SYN's first
/// retransmission timeout is 1 s; a trial that never reports, its socket closed first, frees the slot then).
pub const HEALTH_TRIAL_NS: u64 = 3_000_000_000;

/// A backend's passive health, as the kernel keeps it (`MAP_HEALTH`). Times are `CLOCK_BOOTTIME` ns.
///
/// States: failing (`failures` < threshold, `held_until_ns` 0): used; held (now < `held_until_ns`): skipped;
/// half-open (the hold is over): the next connect picked for it is a trial (`trial_until_ns` set), the others
/// skip it until the trial's outcome; a success deletes nothing but resets the entry to healthy (all zero but
/// the key), which the agent deletes.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct Health {
    /// The key, repeated: checked before a write through a pointer (the element may have been reused).
    pub backend: Backend,
    /// Consecutive failed connects since the last success or hold.
    pub failures: u32,
    /// End of the current (or last) hold; 0: never held since the last success.
    pub held_until_ns: u64,
    /// Start of the current (or last) hold.
    pub held_since_ns: u64,
    /// Half-open: the trial connect in flight may report until then.
    pub trial_until_ns: u64,
    /// Holds since the last success (the backoff exponent).
    pub holds: u32,
    /// What the last failure was: `HEALTH_REFUSED` or `HEALTH_TIMEOUT`.
    pub reason: u32,
}
const _: () = assert!(size_of::<Health>() == 56);

/// `Health::reason`: the connect was refused (an RST answered the SYN: no process listens).
pub const HEALTH_REFUSED: u32 = 1;
/// `Health::reason`: the SYN was not answered within its first retransmission timeout (a dead node, a
/// blackhole).
pub const HEALTH_TIMEOUT: u32 = 2;

/// What the connect programs do with a backend, by its health at `now_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthVerdict {
    /// Use it (healthy, failing below the threshold, or already the trial's: see `Trial`).
    Use,
    /// Held down (or half-open with a trial in flight): skip it.
    Skip,
    /// Half-open with no trial in flight: usable, and the connect that takes it becomes the trial.
    Trial,
}

impl Health {
    /// The verdict at `now_ns`.
    #[inline(always)]
    #[must_use]
    pub const fn verdict(&self, now_ns: u64) -> HealthVerdict {
        if self.held_until_ns == 0 {
            HealthVerdict::Use
        } else if now_ns < self.held_until_ns || now_ns < self.trial_until_ns {
            HealthVerdict::Skip
        } else {
            HealthVerdict::Trial
        }
    }

    /// The hold after `holds` earlier ones without a success: `hold_ns` doubled each time, at most `max_hold_ns`.
    #[inline(always)]
    #[must_use]
    pub const fn hold_for(holds: u32, cfg: &HealthConfig) -> u64 {
        let shift = if holds > 16 { 16 } else { holds };
        let hold = cfg.hold_ns << shift;
        if hold > cfg.max_hold_ns || hold < cfg.hold_ns { cfg.max_hold_ns } else { hold }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_verdicts_by_time() {
        let b = Backend::default();
        let h = |until, trial| Health {
            backend: b,
            held_until_ns: until,
            trial_until_ns: trial,
            ..Health::default()
        };
        let cases = [
            ("never held: used", h(0, 0), 50, HealthVerdict::Use),
            ("inside the hold: skipped", h(100, 0), 50, HealthVerdict::Skip),
            ("the hold is over: this connect is the trial", h(100, 0), 100, HealthVerdict::Trial),
            ("a trial in flight: skipped", h(100, 200), 150, HealthVerdict::Skip),
            ("the trial never reported: another trial", h(100, 200), 200, HealthVerdict::Trial),
        ];
        for (name, health, now, want) in cases {
            assert_eq!(health.verdict(now), want, "{name}");
        }
    }
}
