//! The eight cgroup sock_addr programs: `connect4`/`connect6` and `sendmsg4`/`sendmsg6` translate a Service
//! VIP to a backend (`translate`, which also records the VIP in `REVERSE`); `recvmsg4`/`recvmsg6` (a UDP
//! reply's source) and `getpeername4`/`getpeername6` turn the backend back into that VIP (`restore`).
use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_boot_ns,
        bpf_set_retval,
    },
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use lb_common::{
    Backend, COUNTER_DROPPED, COUNTER_FAIL_OPEN, COUNTER_NODE, COUNTER_REJECTED, ERRNO_NO_ENDPOINTS,
    ERRNO_NO_LOCAL_ENDPOINT, FAMILY_V4, FAMILY_V6, FLAG_EMPTY_IS_DROP, FrontendKey, GLOBAL_SVC_ID, PROTO_UDP,
    ReverseKey, ReverseValue, Slot, SlotKey, V4_MAPPED_WORD2, choose, counter_index,
};

use crate::maps::{BACKEND_STATE, COUNTERS, FRONTENDS, REVERSE, SLOTS};

/// Let the call proceed (possibly rewritten).
const ALLOW: i32 = 1;
/// Deny the call; with `bpf_set_retval` the application sees that errno instead of EPERM.
const DENY: i32 = 0;

// Not `pub`: the macro's `#[unsafe(no_mangle)]` is what puts each program in the object.
#[cgroup_sock_addr(connect4)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, false)
}

#[cgroup_sock_addr(connect6)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn connect6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, true)
}

#[cgroup_sock_addr(sendmsg4)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, false)
}

#[cgroup_sock_addr(sendmsg6)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn sendmsg6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, true)
}

// recvmsg and getpeername programs may rewrite the address but must return 1 (they cannot deny).
#[cgroup_sock_addr(recvmsg4)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn recvmsg4(ctx: SockAddrContext) -> i32 {
    restore(&ctx, false);
    ALLOW
}

#[cgroup_sock_addr(recvmsg6)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn recvmsg6(ctx: SockAddrContext) -> i32 {
    restore(&ctx, true);
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn getpeername4(ctx: SockAddrContext) -> i32 {
    restore(&ctx, false);
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn getpeername6(ctx: SockAddrContext) -> i32 {
    restore(&ctx, true);
    ALLOW
}

#[inline(always)]
fn count(svc_id: u32, kind: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter_index(svc_id, kind)) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs (no preemption in BPF).
        unsafe { *c += 1 };
    }
}

/// The destination (or peer) address of the call: family, words in network order, and whether it came as a
/// v4-mapped IPv6 address (a dual-stack socket talking to an IPv4 Service).
#[derive(Clone, Copy)]
struct Addr {
    words: [u32; 4],
    family: u8,
    mapped: bool,
}

#[inline(always)]
fn read_addr(sa: &bpf_sock_addr, v6: bool) -> Addr {
    if !v6 {
        return Addr { words: [sa.user_ip4, 0, 0, 0], family: FAMILY_V4, mapped: false };
    }
    // user_ip6 must be read with 4-byte loads (the verifier refuses other widths).
    let w = [sa.user_ip6[0], sa.user_ip6[1], sa.user_ip6[2], sa.user_ip6[3]];
    if w[0] == 0 && w[1] == 0 && w[2] == V4_MAPPED_WORD2 {
        Addr { words: [w[3], 0, 0, 0], family: FAMILY_V4, mapped: true }
    } else {
        Addr { words: w, family: FAMILY_V6, mapped: false }
    }
}

#[inline(always)]
fn write_addr(sa: &mut bpf_sock_addr, v6: bool, mapped: bool, words: [u32; 4], port: u16) {
    if !v6 {
        sa.user_ip4 = words[0];
    } else if mapped {
        sa.user_ip6[0] = 0;
        sa.user_ip6[1] = 0;
        sa.user_ip6[2] = V4_MAPPED_WORD2;
        sa.user_ip6[3] = words[0];
    } else {
        sa.user_ip6[0] = words[0];
        sa.user_ip6[1] = words[1];
        sa.user_ip6[2] = words[2];
        sa.user_ip6[3] = words[3];
    }
    sa.user_port = u32::from(port);
}

/// connect() and sendmsg(): VIP -> backend, by tier.
#[inline(always)]
fn translate(ctx: &SockAddrContext, v6: bool) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr for the program's whole run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let dst = read_addr(sa, v6);
    let proto = sa.protocol as u8;
    let key = FrontendKey { addr: dst.words, port: sa.user_port as u16, proto, family: dst.family };
    // SAFETY: hash map values stay valid for the program's run (RCU); we only copy out of it.
    let Some(fe) = (unsafe { FRONTENDS.get(key) }) else {
        return ALLOW; // not a Service VIP: leave it alone
    };
    let fe = *fe;
    let choice = choose(
        &fe,
        |index| {
            let slot = SlotKey { svc_id: fe.svc_id, generation: fe.generation, index };
            // SAFETY: as above.
            match unsafe { SLOTS.get(slot) } {
                None => Slot::Missing,
                Some(backend) => {
                    let backend: Backend = *backend;
                    // SAFETY: as above.
                    match unsafe { BACKEND_STATE.get(backend) } {
                        // A mark ends on time even with no agent running: the clock is read only when one
                        // exists. SAFETY: helper without preconditions.
                        Some(state) if state.is_down_at(unsafe { bpf_ktime_get_boot_ns() }) => {
                            Slot::Down(backend)
                        }
                        _ => Slot::Live(backend),
                    }
                }
            }
        },
        // SAFETY: helper without preconditions.
        || unsafe { bpf_get_prandom_u32() },
    );
    match choice {
        lb_common::Choice::Backend { tier, backend } => {
            write_addr(sa, v6, dst.mapped, backend.addr, backend.port);
            // COUNTER_NODE, COUNTER_ZONE, COUNTER_CLUSTER are 0, 1, 2: the tier index is the counter kind.
            count(fe.svc_id, COUNTER_NODE + tier as u32);
            remember(ctx, backend, key);
            ALLOW
        }
        lb_common::Choice::Empty => {
            let (kind, errno) = if fe.flags & FLAG_EMPTY_IS_DROP != 0 {
                (COUNTER_DROPPED, ERRNO_NO_LOCAL_ENDPOINT)
            } else {
                (COUNTER_REJECTED, ERRNO_NO_ENDPOINTS)
            };
            count(fe.svc_id, kind);
            // SAFETY: allowed in cgroup sock_addr programs (kernel >= 5.18); sets the syscall's return value.
            unsafe { bpf_set_retval(-errno) };
            DENY
        }
        lb_common::Choice::Error => {
            count(fe.svc_id, COUNTER_FAIL_OPEN);
            count(GLOBAL_SVC_ID, COUNTER_FAIL_OPEN);
            ALLOW
        }
    }
}

/// Record which VIP this socket asked for, so a reply from the backend (recvmsg) and getpeername() show it.
#[inline(always)]
fn remember(ctx: &SockAddrContext, backend: Backend, fe: FrontendKey) {
    // SAFETY: both helpers take the program's context, which is what they are given here.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    // Only the agent's destruction of connected UDP sockets reads the namespace; TCP connects skip the call.
    let netns_cookie = if backend.proto == PROTO_UDP {
        // SAFETY: as above.
        unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) }
    } else {
        0
    };
    let key = ReverseKey { cookie, backend, _pad: 0 };
    let value =
        ReverseValue { vip: fe.addr, port: fe.port, family: fe.family, _pad: 0, _pad2: 0, netns_cookie };
    // An LRU map never fails for lack of room; if the update fails anyway, only the reverse view is lost.
    let _ = REVERSE.insert(key, value, 0);
}

/// recvmsg() and getpeername(): backend -> the VIP this socket asked for.
#[inline(always)]
fn restore(ctx: &SockAddrContext, v6: bool) {
    // SAFETY: as in `translate`.
    let sa = unsafe { &mut *ctx.sock_addr };
    let peer = read_addr(sa, v6);
    // SAFETY: as in `remember`.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let backend = Backend {
        addr: peer.words,
        port: sa.user_port as u16,
        proto: sa.protocol as u8,
        family: peer.family,
    };
    let key = ReverseKey { cookie, backend, _pad: 0 };
    // SAFETY: as in `translate`.
    let Some(rev) = (unsafe { REVERSE.get(key) }) else { return };
    let rev = *rev;
    // A stale entry (the Service is gone) is not applied: the VIP no longer means anything.
    let fe = FrontendKey { addr: rev.vip, port: rev.port, proto: backend.proto, family: rev.family };
    // SAFETY: as in `translate`.
    if unsafe { FRONTENDS.get(fe) }.is_none() {
        return;
    }
    write_addr(sa, v6, peer.mapped, rev.vip, rev.port);
}
