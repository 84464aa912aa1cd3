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
    /// Distinct clients (network namespaces) whose failures a hold needs (`--health-clients`, 1 or 2; 0 reads
    /// as 1): with 2, one pod's own failures (a connect whose SYN its own `IP_TTL=1` or a NetworkPolicy kills,
    /// which the kernel cannot tell from a dead backend) never hold a backend for everyone.
    pub clients: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<HealthConfig>() == 32);

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
    /// What the last failure was: `HEALTH_REFUSED`, `HEALTH_TIMEOUT` or `HEALTH_UNREACHABLE`.
    pub reason: u32,
    /// The network namespace (`bpf_get_netns_cookie`) of the first failure since the last success or hold.
    pub first_client: u64,
    /// Distinct clients among the failures since the last success or hold: 0, 1, or 2 (at least two).
    pub clients: u32,
    /// Whom a hold holds the backend for: `HOLD_ALL` (every client), or `HOLD_CLIENT` (only `first_client`,
    /// whose own `failures` in a row held it while no other client had failed: a lone client protected).
    pub scope: u32,
}
const _: () = assert!(size_of::<Health>() == 72);

/// `Health::scope`: the hold holds the backend for every client (the quorum of clients failed).
pub const HOLD_ALL: u32 = 0;
/// `Health::scope`: the hold holds the backend only for `Health::first_client`, the one client that failed.
pub const HOLD_CLIENT: u32 = 1;

/// What a failure began (`Health::fail`), for the holds counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// No new hold.
    No,
    /// A hold for the one client that failed (`HOLD_CLIENT`).
    Client,
    /// A hold for every client (`HOLD_ALL`).
    All,
}

/// `Health::reason`: the connect was refused (an RST answered the SYN: no process listens).
pub const HEALTH_REFUSED: u32 = 1;
/// `Health::reason`: the SYN was not answered within its first retransmission timeout (a dead node, a
/// blackhole).
pub const HEALTH_TIMEOUT: u32 = 2;
/// `Health::reason`: the kernel ended the connect on an ICMP error answering the SYN (unreachable, time
/// exceeded: sent by the backend's host or a router on the way), or on the SYN's last retransmission.
pub const HEALTH_UNREACHABLE: u32 = 3;

/// How a connect in `SYN_SENT` that went to `CLOSE` ended, from what `sock_ops` sees at that state change
/// (`bpf_sock_ops::packets_out`, `segs_in`): `None` for a local abort, which is no failure of the backend.
///
/// The kernel ends a connect on the backend's word in `tcp_done_with_error` (an RST: `tcp_reset`; an ICMP
/// error: `tcp_v4_err`/`tcp_v6_err`; the last SYN retransmission: `tcp_write_err`), which purges the
/// retransmission queue (`tcp_write_queue_purge`: `packets_out` 0) before `tcp_done` sets the state. A local
/// abort (`shutdown()` or `connect(AF_UNSPEC)`: `tcp_disconnect`; `close()`: `tcp_close`) sets the state first,
/// with the SYN still queued (`packets_out` 1). A received RST is a segment in (`segs_in`, counted by
/// `tcp_v4_rcv` before the socket processes it); an ICMP error is not.
#[inline(always)]
#[must_use]
pub const fn syn_sent_close_reason(packets_out: u32, segs_in: u32) -> Option<u32> {
    if packets_out != 0 {
        None
    } else if segs_in != 0 {
        Some(HEALTH_REFUSED)
    } else {
        Some(HEALTH_UNREACHABLE)
    }
}

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
    /// The verdict for a connect from `client` (its network namespace) at `now_ns`: a hold for one client
    /// changes nothing for the others.
    #[inline(always)]
    #[must_use]
    pub const fn verdict(&self, client: u64, now_ns: u64) -> HealthVerdict {
        if self.held_until_ns == 0 || (self.scope == HOLD_CLIENT && client != self.first_client) {
            HealthVerdict::Use
        } else if now_ns < self.held_until_ns || now_ns < self.trial_until_ns {
            HealthVerdict::Skip
        } else {
            HealthVerdict::Trial
        }
    }

    /// A translated connect from `client` (its network namespace) failed for `reason` at `now_ns`: count it
    /// and hold the backend if the rule says so; what hold began (for the holds counters).
    ///
    /// The rule: `cfg.failures` failures in a row (no success between: any client's success resets the entry)
    /// from at least `cfg.clients` distinct clients hold the backend for every client. The same failures from
    /// one client alone hold it for that client only (`HOLD_CLIENT`): its own next connects skip the backend
    /// at once, and no other client's change, so one pod's failures (its own policy dropping its SYNs) decide
    /// nothing for another. Another client's failure while a client hold is on (or half-open) completes the
    /// quorum: held for every client. A failure while held changes nothing (its connect began before the
    /// hold). Half-open (the hold is over), a failed trial holds again, for longer: for every client once the
    /// failures since the hold come from `cfg.clients` clients, else for the client whose trial failed (so one
    /// client failing every trial cannot keep a backend held that answers the others).
    #[inline(always)]
    pub fn fail(&mut self, client: u64, reason: u32, cfg: &HealthConfig, now_ns: u64) -> Held {
        self.reason = reason;
        if self.scope == HOLD_CLIENT && client != self.first_client {
            // The held client's failures, and now another client's: the quorum (at most 2).
            self.failures = self.failures.saturating_add(1);
            self.clients = 2;
            self.hold(cfg, now_ns);
            return Held::All;
        }
        let half_open = self.held_until_ns != 0;
        if half_open && now_ns < self.held_until_ns {
            return Held::No;
        }
        self.failures = self.failures.saturating_add(1);
        if self.clients == 0 {
            self.first_client = client;
            self.clients = 1;
        } else if self.clients == 1 && client != self.first_client {
            self.clients = 2;
        }
        if half_open || self.failures >= cfg.failures {
            if self.clients >= cfg.clients {
                self.hold(cfg, now_ns);
                return Held::All;
            }
            if self.clients == 1 {
                self.hold_client(cfg, now_ns);
                return Held::Client;
            }
        }
        if half_open {
            self.trial_until_ns = 0;
        }
        Held::No
    }

    /// Hold for `first_client` only, from `now_ns`, for twice as long as the last hold without a success
    /// between; its failures and client are kept (another client's failure completes the quorum).
    #[inline(always)]
    pub fn hold_client(&mut self, cfg: &HealthConfig, now_ns: u64) {
        self.begin_hold(cfg, now_ns);
        self.scope = HOLD_CLIENT;
    }

    /// The hold's times from `now_ns` (twice as long as the last hold without a success between) and its
    /// count: what both kinds of hold begin with.
    #[inline(always)]
    fn begin_hold(&mut self, cfg: &HealthConfig, now_ns: u64) {
        self.held_since_ns = now_ns;
        self.held_until_ns = now_ns + Self::hold_for(self.holds, cfg);
        self.trial_until_ns = 0;
        self.holds += 1;
    }

    /// Hold from `now_ns`, for twice as long as the last hold without a success between.
    #[inline(always)]
    pub fn hold(&mut self, cfg: &HealthConfig, now_ns: u64) {
        self.begin_hold(cfg, now_ns);
        self.failures = 0;
        self.first_client = 0;
        self.clients = 0;
        self.scope = HOLD_ALL;
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
            assert_eq!(health.verdict(7, now), want, "{name}");
        }
        // A hold for one client: that client skips the backend, another uses it.
        let mine = Health { first_client: 7, scope: HOLD_CLIENT, ..h(100, 0) };
        assert_eq!(mine.verdict(7, 50), HealthVerdict::Skip, "the client that failed");
        assert_eq!(mine.verdict(8, 50), HealthVerdict::Use, "another client");
        assert_eq!(
            mine.verdict(8, 150),
            HealthVerdict::Use,
            "another client, half-open: no trial of its own"
        );
        assert_eq!(mine.verdict(7, 150), HealthVerdict::Trial, "the client's own trial");
    }

    fn cfg(failures: u32, clients: u32) -> HealthConfig {
        HealthConfig { failures, clients, hold_ns: 100, max_hold_ns: 1_000, ..HealthConfig::default() }
    }

    /// Failures by client, one per time step from 1; the step at which the backend was held for every
    /// client (if it was).
    fn held_at(cfg: &HealthConfig, clients: &[u64]) -> Option<usize> {
        let mut h = Health::default();
        (1..)
            .zip(clients)
            .find_map(|(t, &c)| (h.fail(c, HEALTH_REFUSED, cfg, t) == Held::All).then_some(t as usize))
    }

    #[test]
    fn a_hold_needs_k_failures_in_a_row_from_enough_clients() {
        let cases = [
            ("one client, quorum 2: never held for all", cfg(3, 2), &[7, 7, 7, 7, 7, 7][..], None),
            ("two clients alternating: held at the K-th failure", cfg(3, 2), &[7, 8, 7, 8][..], Some(3)),
            (
                "the second client comes late: held at its first failure",
                cfg(3, 2),
                &[7, 7, 7, 7, 8][..],
                Some(5),
            ),
            ("quorum 1 (the old rule): one client's K failures", cfg(3, 1), &[7, 7, 7][..], Some(3)),
            ("quorum 0 reads as 1", cfg(2, 0), &[7, 7][..], Some(2)),
            ("K = 1, quorum 2: the second client's failure", cfg(1, 2), &[7, 8][..], Some(2)),
        ];
        for (name, cfg, clients, want) in cases {
            assert_eq!(held_at(&cfg, clients), want, "{name}");
        }
    }

    #[test]
    fn a_lone_clients_k_failures_hold_the_backend_for_it_alone_until_another_client_fails() {
        let one = cfg(3, 1);
        let cfg = cfg(3, 2);
        let mut h = Health::default();
        assert_eq!(h.fail(7, HEALTH_REFUSED, &cfg, 1), Held::No);
        assert_eq!(h.fail(7, HEALTH_REFUSED, &cfg, 2), Held::No);
        assert_eq!(h.fail(7, HEALTH_REFUSED, &cfg, 3), Held::Client, "K failures from client 7: held for it");
        assert_eq!((h.scope, h.first_client, h.held_until_ns), (HOLD_CLIENT, 7, 103));
        assert_eq!((h.verdict(7, 4), h.verdict(8, 4)), (HealthVerdict::Skip, HealthVerdict::Use));
        assert_eq!(h.fail(7, HEALTH_REFUSED, &cfg, 5), Held::No, "its own connect begun before the hold");
        // Its trial after the hold fails: held for it again, for twice as long.
        assert_eq!(h.fail(7, HEALTH_TIMEOUT, &cfg, 110), Held::Client);
        assert_eq!((h.held_until_ns, h.holds), (110 + 200, 2));
        // Another client fails: with client 7's failures, the quorum: held for every client.
        assert_eq!(h.fail(8, HEALTH_REFUSED, &cfg, 120), Held::All);
        assert_eq!((h.scope, h.verdict(9, 121)), (HOLD_ALL, HealthVerdict::Skip));
        // The per-node rule (quorum 1) never holds for one client only.
        let mut h = Health::default();
        assert_eq!([1, 2, 3].map(|t| h.fail(7, HEALTH_REFUSED, &one, t)), [Held::No, Held::No, Held::All]);
    }

    #[test]
    fn a_failed_trial_holds_again_only_with_the_quorum() {
        let cfg = cfg(2, 2);
        let mut h = Health::default();
        assert_eq!(h.fail(7, HEALTH_REFUSED, &cfg, 1), Held::No);
        assert_eq!(h.fail(8, HEALTH_REFUSED, &cfg, 2), Held::All, "two clients, K = 2: held");
        assert_eq!((h.held_until_ns, h.holds, h.clients), (102, 1, 0));
        assert_eq!(
            h.fail(7, HEALTH_REFUSED, &cfg, 50),
            Held::No,
            "inside the hold: a connect begun before it"
        );
        h.trial_until_ns = 102 + HEALTH_TRIAL_NS;
        assert_eq!(
            h.fail(7, HEALTH_TIMEOUT, &cfg, 110),
            Held::Client,
            "client 7's trial failed: not enough clients for all, held for client 7"
        );
        assert_eq!(h.verdict(8, 111), HealthVerdict::Use, "another client still uses it");
        assert_eq!(
            h.fail(8, HEALTH_TIMEOUT, &cfg, 120),
            Held::All,
            "client 8's connect failed too: held for all"
        );
        assert_eq!(h.held_until_ns, 120 + 400, "for longer each hold");
    }

    #[test]
    fn only_the_kernel_ending_a_connect_is_a_failure() {
        assert_eq!(syn_sent_close_reason(1, 0), None, "shutdown/close with the SYN in flight: local");
        assert_eq!(syn_sent_close_reason(0, 1), Some(HEALTH_REFUSED), "an RST came in");
        assert_eq!(syn_sent_close_reason(0, 0), Some(HEALTH_UNREACHABLE), "an ICMP error, or the last SYN");
    }
}
