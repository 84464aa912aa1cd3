//! `tierlb trace`: one event per decision of connect4/6 and sendmsg4/6 for a Service VIP, and of tc_ingress
//! for a new flow from outside the node, in the
//! `TRACE_EVENTS` ring buffer, while the trace command has `TRACE_CONTROL` on.
//!
//! Free when off: `on` is one array lookup (which the JIT inlines), and everything else is out of line in
//! `decision`, so the connect programs neither run nor hold on their stack anything of this unless a trace
//! runs. The event is reserved in the ring buffer and written in place, never built on the stack: the
//! connect programs are close to the verifier's 512-byte bound over a call chain.
use core::ptr::addr_of_mut;

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_netns_cookie, bpf_get_socket_cookie,
        bpf_ktime_get_boot_ns, generated::bpf_get_current_comm,
    },
    programs::SockAddrContext,
};
use lb_common::{
    Backend, Choice, ERRNO_NO_ENDPOINTS, ERRNO_NO_LOCAL_ENDPOINT, FLAG_EMPTY_IS_DROP, FrontendKey,
    FrontendValue, GLOBAL_SVC_ID, GLOBAL_TRACE_LOST, OUTCOME_FAIL_OPEN, OUTCOME_REFUSED, OUTCOME_TRANSLATED,
    TIER_COUNT, TRACE_OFF, TRACE_SELECTED, TRACE_TC, TraceEvent, first_nonempty_tier,
};

use crate::{
    counters::count,
    maps::{TRACE_CONTROL, TRACE_EVENTS, TRACE_SERVICES},
};

/// Whether a trace runs: the one lookup the connect programs pay when none does. A switch whose lease
/// ran out (its trace died without clearing it) is off.
#[inline(always)]
pub(crate) fn on() -> bool {
    // SAFETY: a helper without arguments.
    TRACE_CONTROL
        .get(0)
        .is_some_and(|c| c.mode != TRACE_OFF && unsafe { bpf_ktime_get_boot_ns() } < c.lease_until_ns)
}

/// Record one decision: `choice` for the frontend `key` (`fe`), with `info` (`lb_common::trace_info`, or
/// `TRACE_TORN` and the hook bits). A frontend a filtered trace did not select is left out; a full ring
/// buffer counts the event as lost (`GLOBAL_TRACE_LOST`).
///
/// Out of line, with its arguments by reference: its locals and the helpers' scratch stay off the connect
/// programs' stack.
#[inline(never)]
pub(crate) fn decision(
    ctx: &SockAddrContext,
    key: &FrontendKey,
    fe: &FrontendValue,
    choice: &Choice<Backend>,
    info: u32,
) {
    let Some(mut entry) = reserve(fe.svc_id) else { return };
    let e = entry.as_mut_ptr();
    let (outcome, tier, errno, backend) = outcome_of(choice, fe.flags);
    // SAFETY: `e` points at a reserved, 8-aligned ring buffer record of `size_of::<TraceEvent>()` bytes, ours
    // until submitted; every field is written (the record is not zeroed) through raw field pointers, as the
    // memory is uninitialised. The helpers take the program's context or nothing; bpf_get_current_comm writes
    // at most 16 bytes, the size of `comm`.
    unsafe {
        addr_of_mut!((*e).time_ns).write(bpf_ktime_get_boot_ns());
        addr_of_mut!((*e).cookie).write(bpf_get_socket_cookie(ctx.sock_addr.cast()));
        addr_of_mut!((*e).netns_cookie).write(bpf_get_netns_cookie(ctx.sock_addr.cast()));
        addr_of_mut!((*e).cgroup_id).write(bpf_get_current_cgroup_id());
        addr_of_mut!((*e).frontend).write(*key);
        addr_of_mut!((*e).backend).write(backend);
        addr_of_mut!((*e).svc_id).write(fe.svc_id);
        addr_of_mut!((*e).pid).write((bpf_get_current_pid_tgid() >> 32) as u32);
        bpf_get_current_comm(addr_of_mut!((*e).comm).cast(), 16);
        addr_of_mut!((*e).outcome).write(outcome);
        addr_of_mut!((*e).tier).write(tier);
        addr_of_mut!((*e).errno).write(errno);
        addr_of_mut!((*e)._pad).write(0);
        addr_of_mut!((*e).frontend_flags).write(fe.flags);
        addr_of_mut!((*e).info).write(info);
        addr_of_mut!((*e).first_tier).write(first_nonempty_tier(fe).unwrap_or(TIER_COUNT) as u32);
        addr_of_mut!((*e).client).write(Backend::default());
        addr_of_mut!((*e)._pad2).write(0);
    }
    entry.submit(0);
}

/// `flow`'s outcome argument: `OUTCOME_*` and the tier, in one word.
#[inline(always)]
pub(crate) const fn outcome(outcome: u8, tier: usize) -> u32 {
    outcome as u32 | (tier as u32) << 8
}

/// Record one decision of `tc_ingress` for a new flow from outside the node (`outcome`: see `outcome`;
/// `backend`: the one chosen, or zero): as `decision`, with the client (the flow's source address and port)
/// instead of a socket and task, which a packet program has not.
#[inline(never)]
pub(crate) fn flow(key: &FrontendKey, fe: &FrontendValue, outcome: u32, backend: &Backend, client: &Backend) {
    let Some(mut entry) = reserve(fe.svc_id) else { return };
    let e = entry.as_mut_ptr();
    let (tier, outcome) = ((outcome >> 8) as u8, outcome as u8);
    let errno = if outcome != OUTCOME_REFUSED {
        0
    } else if fe.flags & FLAG_EMPTY_IS_DROP != 0 {
        ERRNO_NO_LOCAL_ENDPOINT as u8
    } else {
        ERRNO_NO_ENDPOINTS as u8
    };
    let v6 = u32::from(client.family == lb_common::FAMILY_V6);
    // SAFETY: as in `decision`; no helper here takes the context.
    unsafe {
        addr_of_mut!((*e).time_ns).write(bpf_ktime_get_boot_ns());
        addr_of_mut!((*e).cookie).write(0);
        addr_of_mut!((*e).netns_cookie).write(0);
        addr_of_mut!((*e).cgroup_id).write(0);
        addr_of_mut!((*e).frontend).write(*key);
        addr_of_mut!((*e).backend).write(*backend);
        addr_of_mut!((*e).svc_id).write(fe.svc_id);
        addr_of_mut!((*e).pid).write(0);
        addr_of_mut!((*e).comm).write([0; 16]);
        addr_of_mut!((*e).outcome).write(outcome);
        addr_of_mut!((*e).tier).write(tier);
        addr_of_mut!((*e).errno).write(errno);
        addr_of_mut!((*e)._pad).write(0);
        addr_of_mut!((*e).frontend_flags).write(fe.flags);
        addr_of_mut!((*e).info).write(TRACE_TC | v6);
        addr_of_mut!((*e).first_tier).write(first_nonempty_tier(fe).unwrap_or(TIER_COUNT) as u32);
        addr_of_mut!((*e).client).write(*client);
        addr_of_mut!((*e)._pad2).write(0);
    }
    entry.submit(0);
}

/// A ring buffer record for an event of service `svc_id`, if the trace selects it (`None`: not selected, or
/// the buffer is full, which is counted as lost).
#[inline(always)]
fn reserve(svc_id: u32) -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<TraceEvent>> {
    let control = TRACE_CONTROL.get(0)?;
    // SAFETY: a plain read of a hash value.
    if control.mode == TRACE_SELECTED && unsafe { TRACE_SERVICES.get(svc_id) }.is_none() {
        return None;
    }
    let entry = TRACE_EVENTS.reserve::<TraceEvent>(0);
    if entry.is_none() {
        count(GLOBAL_SVC_ID, GLOBAL_TRACE_LOST);
    }
    entry
}

/// (outcome, tier, errno, backend) of a choice, the frontend's flags saying which refusal applies.
#[inline(always)]
fn outcome_of(choice: &Choice<Backend>, flags: u32) -> (u8, u8, u8, Backend) {
    match *choice {
        Choice::Backend { tier, backend } => (OUTCOME_TRANSLATED, tier as u8, 0, backend),
        Choice::Empty if flags & FLAG_EMPTY_IS_DROP != 0 => {
            (OUTCOME_REFUSED, 0, ERRNO_NO_LOCAL_ENDPOINT as u8, Backend::default())
        }
        Choice::Empty => (OUTCOME_REFUSED, 0, ERRNO_NO_ENDPOINTS as u8, Backend::default()),
        Choice::Error => (OUTCOME_FAIL_OPEN, 0, 0, Backend::default()),
    }
}
