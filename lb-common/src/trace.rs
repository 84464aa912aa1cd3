//! Tracing the data path's decisions: the event the connect and sendmsg programs write to a ring buffer
//! (`TraceEvent`), the switch `tierlb trace` turns them on with (`TraceControl`), and the bits that say how a
//! decision was reached (`TRACE_*`), which user space turns into a reason (`lb-user`'s trace module).
//!
//! The kernel records what it decided and the inputs of the reason (tier, frontend flags, the detail bits,
//! the errno it set), never a reason code of its own: the rule that names a decision is written once, in user
//! space, where it is tested, and the programs stay as small as the verifier's stack bound needs.
use core::mem::size_of;

use bytemuck::{Pod, Zeroable};

use crate::{Backend, FrontendKey};

/// Ring buffer of `TraceEvent`s (`BPF_MAP_TYPE_RINGBUF`), read by `tierlb trace`.
pub const MAP_TRACE_EVENTS: &str = "TRACE_EVENTS";
/// The switch (`TraceControl`), one entry: off unless a `tierlb trace` runs.
pub const MAP_TRACE_CONTROL: &str = "TRACE_CONTROL";
/// svc_id -> 1: the Service ports traced when `TraceControl::mode` is `TRACE_SELECTED`.
pub const MAP_TRACE_SERVICES: &str = "TRACE_SERVICES";

/// Bytes of the event ring buffer (a power-of-2 multiple of the page size, as the kernel requires): about
/// 1,800 events of 136 bytes (each has an 8-byte header) for a consumer that falls behind; more are lost
/// (and counted, `GLOBAL_TRACE_LOST`). It is memory the kernel holds for as long as the maps are pinned.
pub const TRACE_RING_BYTES: u32 = 256 * 1024;
/// Entries of `MAP_TRACE_SERVICES`: service ports one filtered trace can select.
pub const TRACE_MAX_SERVICES: u32 = 1024;

/// `TraceControl::mode`: nobody traces; the programs pay one array lookup per decision.
pub const TRACE_OFF: u32 = 0;
/// `TraceControl::mode`: every decision is an event.
pub const TRACE_ALL: u32 = 1;
/// `TraceControl::mode`: decisions for the svc_ids in `MAP_TRACE_SERVICES` only.
pub const TRACE_SELECTED: u32 = 2;

/// Global counter kind (`GLOBAL_SVC_ID`, the slot Services use for `COUNTER_DROPPED`): trace events lost
/// because the ring buffer was full (the consumer fell behind, or was stopped).
pub const GLOBAL_TRACE_LOST: u32 = 4;

/// How long one renewal of the switch's lease lasts: a `tierlb trace` renews it every second, so one that
/// dies without clearing the switch (SIGKILL, a node reboot of its pod) stops the tracing within this.
pub const TRACE_LEASE_NS: u64 = 10_000_000_000;

/// The switch `tierlb trace` sets, renews and clears when it exits.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
pub struct TraceControl {
    /// `TRACE_OFF`, `TRACE_ALL` or `TRACE_SELECTED`.
    pub mode: u32,
    /// The process id of the `tierlb trace` that set it (in its own PID namespace): a second trace refuses to
    /// start while that process lives, and takes over a switch left on by one that was killed.
    pub owner_pid: u32,
    /// `CLOCK_BOOTTIME` (ns) until which the switch holds: the programs trace only before it, so tracing ends
    /// by itself when the trace that set it is gone.
    pub lease_until_ns: u64,
}
const _: () = assert!(size_of::<TraceControl>() == 16);

// `TraceEvent::info` bits. The hook is the two low bits: `TRACE_V6 | TRACE_CONNECT`.
/// The program is an IPv6 one (connect6, sendmsg6); the VIP may still be IPv4 (v4-mapped).
pub const TRACE_V6: u32 = 1 << 0;
/// connect() (else sendmsg()).
pub const TRACE_CONNECT: u32 = 1 << 1;
/// sessionAffinity: the client's remembered backend was taken.
pub const TRACE_AFFINITY: u32 = 1 << 2;
/// Passive health: the backend was half-open and this connect is its trial.
pub const TRACE_TRIAL: u32 = 1 << 3;
/// Passive health's panic threshold: every allowed backend was held down or marked, so a held one was taken.
pub const TRACE_PANIC: u32 = 1 << 4;
/// Passive health held at least one of the backends the choice skipped.
pub const TRACE_HELD: u32 = 1 << 5;
/// The frontend's value was being rewritten during both copies: the connect went through untranslated.
pub const TRACE_TORN: u32 = 1 << 6;
/// A new flow from outside the node, decided by `tc_ingress` (no socket, task or cgroup: those fields are 0;
/// `TraceEvent::client` is the client).
pub const TRACE_TC: u32 = 1 << 7;
/// `TraceEvent::info >> TRACE_SKIPPED_SHIFT`: slots whose backend was marked down or held that the choice met
/// (`lb_common::choose`'s slow path: the random pick, then each tier's scan window).
pub const TRACE_SKIPPED_SHIFT: u32 = 16;

// `TraceEvent::outcome`.
/// Rewritten to `TraceEvent::backend`, from `TraceEvent::tier`.
pub const OUTCOME_TRANSLATED: u8 = 1;
/// Refused with `TraceEvent::errno`.
pub const OUTCOME_REFUSED: u8 = 2;
/// An internal error (a missing slot, a torn frontend read): the call went through untranslated.
pub const OUTCOME_FAIL_OPEN: u8 = 3;

/// One decision of connect4/6 or sendmsg4/6 for a Service VIP, written in place in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// When (`CLOCK_BOOTTIME` ns, as `BackendState`).
    pub time_ns: u64,
    /// The socket's cookie (`bpf_get_socket_cookie`).
    pub cookie: u64,
    /// The socket's network namespace (`bpf_get_netns_cookie`).
    pub netns_cookie: u64,
    /// The calling task's cgroup2 id (`bpf_get_current_cgroup_id`): the inode number of its cgroup directory.
    pub cgroup_id: u64,
    /// The frontend asked for: VIP, port, protocol, family.
    pub frontend: FrontendKey,
    /// The backend chosen; all zero unless `outcome` is `OUTCOME_TRANSLATED`.
    pub backend: Backend,
    /// The frontend's service id (its name is in `MAP_NAMES`).
    pub svc_id: u32,
    /// The calling process (the thread group id, in the initial PID namespace).
    pub pid: u32,
    /// The calling thread's name, NUL-padded.
    pub comm: [u8; 16],
    /// `OUTCOME_TRANSLATED`, `OUTCOME_REFUSED` or `OUTCOME_FAIL_OPEN`.
    pub outcome: u8,
    /// `TIER_NODE`, `TIER_ZONE` or `TIER_CLUSTER` when translated.
    pub tier: u8,
    /// The errno the call got when refused (`ERRNO_NO_ENDPOINTS`, `ERRNO_NO_LOCAL_ENDPOINT`), else 0.
    pub errno: u8,
    /// Explicit padding, always 0.
    pub _pad: u8,
    /// The frontend's `FrontendValue::flags` (`FLAG_POLICY_LOCAL`, `FLAG_EMPTY_IS_DROP`).
    pub frontend_flags: u32,
    /// `TRACE_*` bits, and the skipped count above `TRACE_SKIPPED_SHIFT`.
    pub info: u32,
    /// The frontend's first non-empty tier when the decision was made (`TIER_COUNT` if all were empty): a
    /// refusal with tiers to choose from is one where every backend was down.
    pub first_tier: u32,
    /// A `TRACE_TC` event's client: its address and source port as they arrived; all zero otherwise.
    pub client: Backend,
    /// Explicit tail padding, always 0.
    pub _pad2: u32,
}
const _: () = assert!(size_of::<TraceEvent>() == 136);

impl TraceEvent {
    /// The hook that decided: "connect4", "connect6", "sendmsg4", "sendmsg6" or "tc_ingress".
    #[must_use]
    pub const fn hook(&self) -> &'static str {
        if self.info & TRACE_TC != 0 {
            return "tc_ingress";
        }
        match (self.info & TRACE_CONNECT != 0, self.info & TRACE_V6 != 0) {
            (true, false) => "connect4",
            (true, true) => "connect6",
            (false, false) => "sendmsg4",
            (false, true) => "sendmsg6",
        }
    }
    /// Slots the choice skipped because their backend was marked down or held.
    #[must_use]
    pub const fn skipped(&self) -> u32 {
        self.info >> TRACE_SKIPPED_SHIFT
    }
}

/// The `info` word of a decision, from what `translate` knows (`downs`: Down slots met; more than 65,535 is
/// capped, which the verifier's loop bounds make impossible anyway).
#[inline(always)]
#[must_use]
#[expect(clippy::fn_params_excessive_bools, reason = "each is one fact of the decision, packed here once")]
pub const fn trace_info(
    v6: bool,
    connect: bool,
    affinity: bool,
    trial: bool,
    panic: bool,
    held: bool,
    downs: u32,
) -> u32 {
    let downs = if downs > 0xffff { 0xffff } else { downs };
    (v6 as u32)
        | (connect as u32) << 1
        | (affinity as u32) << 2
        | (trial as u32) << 3
        | (panic as u32) << 4
        | (held as u32) << 5
        | downs << TRACE_SKIPPED_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_info_word_carries_the_hook_the_flags_and_the_skipped_count() {
        let e = |info| TraceEvent { info, ..TraceEvent::default() };
        assert_eq!(e(trace_info(false, true, false, false, false, false, 0)).hook(), "connect4");
        assert_eq!(e(trace_info(true, true, false, false, false, false, 0)).hook(), "connect6");
        assert_eq!(e(trace_info(false, false, false, false, false, false, 0)).hook(), "sendmsg4");
        assert_eq!(e(trace_info(true, false, false, false, false, false, 0)).hook(), "sendmsg6");
        let all = trace_info(true, true, true, true, true, true, 3);
        assert_eq!(
            all & 0xffff,
            TRACE_V6 | TRACE_CONNECT | TRACE_AFFINITY | TRACE_TRIAL | TRACE_PANIC | TRACE_HELD
        );
        assert_eq!(e(all).skipped(), 3);
        assert_eq!(e(trace_info(false, false, false, false, false, false, 1 << 20)).skipped(), 0xffff);
    }
}
