//! The eight cgroup sock_addr programs: `connect4`/`connect6` and `sendmsg4`/`sendmsg6` translate a Service
//! VIP to a backend (`translate`, which also records the VIP: `reverse`); `recvmsg4`/`recvmsg6` (a UDP
//! reply's source) and `getpeername4`/`getpeername6` turn the backend back into that VIP (`restore`).
use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_ktime_get_boot_ns, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use lb_common::{
    Backend, COUNTER_DROPPED, COUNTER_FAIL_OPEN, COUNTER_NODE, COUNTER_REJECTED, ERRNO_NO_ENDPOINTS,
    ERRNO_NO_LOCAL_ENDPOINT, FAMILY_V4, FAMILY_V6, FLAG_EMPTY_IS_DROP, FrontendKey, FrontendValue,
    GLOBAL_SVC_ID, HealthVerdict, PROTO_TCP, Slot, TRACE_TORN, V4_MAPPED_WORD2, choose_with, trace_info,
};

use crate::{
    affinity,
    counters::count,
    health::{self, is_down},
    maps::{FRONTENDS, backend_at, copy_frontend},
    reverse, trace,
};

/// Let the call proceed (possibly rewritten).
const ALLOW: i32 = 1;
/// Deny the call; with `bpf_set_retval` the application sees that errno instead of EPERM.
const DENY: i32 = 0;

// Not `pub`: the macro's `#[unsafe(no_mangle)]` is what puts each program in the object.
#[cgroup_sock_addr(connect4)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, false, true)
}

#[cgroup_sock_addr(connect6)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn connect6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, true, true)
}

#[cgroup_sock_addr(sendmsg4)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, false, false)
}

#[cgroup_sock_addr(sendmsg6)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn sendmsg6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, true, false)
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

/// Found: `out` holds the frontend at the key.
const FOUND: u32 = 0;
/// The address is no Service VIP.
const NOT_A_VIP: u32 = 1;
/// The element was reused for another key during both of two copies (see `FRONTENDS` in maps.rs).
const TORN: u32 = 2;

/// Copy the frontend at `key` into `out` (`FOUND`: every field written), or say why not (`NOT_A_VIP`,
/// `TORN`: `out` may be partly written). Out of line, with an out-parameter: its copies stay off the connect
/// programs' stack, which the verifier bounds over a call chain (512 bytes). `out` is not zeroed first: a
/// 52-byte `Default` compiles to a call of compiler-builtins' byte-at-a-time `memset`, a tenth of the
/// program's instructions on every connect.
#[inline(never)]
fn frontend(key: &FrontendKey, out: *mut FrontendValue) -> u32 {
    for _ in 0..2 {
        let Some(p) = FRONTENDS.get_ptr(key) else { return NOT_A_VIP };
        // SAFETY: a hash map value stays mapped for the program's run (RCU); `out` points to the caller's
        // stack, which `copy_frontend` writes field by field.
        if unsafe { copy_frontend(p, out, key) } {
            return FOUND;
        }
    }
    TORN
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

/// connect() (`connect`) and sendmsg(): VIP -> backend, by tier.
#[inline(always)]
fn translate(ctx: &SockAddrContext, v6: bool, connect: bool) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr for the program's whole run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let dst = read_addr(sa, v6);
    let proto = sa.protocol as u8;
    let key = FrontendKey { addr: dst.words, port: sa.user_port as u16, proto, family: dst.family };
    let mut slot = MaybeUninit::<FrontendValue>::uninit();
    let fe = match frontend(&key, slot.as_mut_ptr()) {
        // SAFETY: `frontend` wrote every field. A reference, not `assume_init`'s copy: the stack is bounded.
        FOUND => unsafe { slot.assume_init_ref() },
        TORN => {
            count(GLOBAL_SVC_ID, COUNTER_FAIL_OPEN);
            if trace::on() {
                let hook = trace_info(v6, connect, false, false, false, false, 0);
                // SAFETY: `frontend` wrote every field (of a torn copy: the event says so).
                let torn = unsafe { slot.assume_init_ref() };
                trace::decision(ctx, &key, torn, &lb_common::Choice::Error, hook | TRACE_TORN);
            }
            return ALLOW;
        }
        _ => return ALLOW, // not a Service VIP: leave it alone
    };
    // Passive health, if on and `HEALTH` may hold an entry (`HealthConfig::active`), for TCP (the only protocol
    // `sock_ops` learns about: UDP backends never have an entry, so their connects skip the lookup): backends it holds down are skipped like marked ones
    // (`saw_held` remembers that one was), and a half-open one taken by this connect becomes the trial
    // (`trial`: the last slot looked up, which is the one `choose` returns, was half-open). Flags, not
    // backends, to keep the stack small (the verifier allows 512 bytes over a call chain).
    let health = proto == PROTO_TCP && health::config().is_some_and(|c| c.active != 0);
    let mut saw_held = false;
    let mut trial = false;
    let lookup = |index| {
        let Some(backend) = backend_at(fe.svc_id, fe.generation, index) else { return Slot::Missing };
        trial = false;
        // A mark (or hold) ends on time even with no agent running: the clock is read only when one exists.
        // SAFETY: helper without preconditions.
        if is_down(backend, || unsafe { bpf_ktime_get_boot_ns() }) {
            return Slot::Down(backend);
        }
        if health {
            // SAFETY: as above.
            // SAFETY: the cookie helper takes the program's context.
            let client = || unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) };
            match health::verdict(backend, client, || unsafe { bpf_ktime_get_boot_ns() }) {
                HealthVerdict::Skip => {
                    saw_held = true;
                    return Slot::Down(backend);
                }
                HealthVerdict::Trial => trial = true,
                HealthVerdict::Use => {}
            }
        }
        Slot::Live(backend)
    };
    // SAFETY: helper without preconditions.
    let random = || unsafe { bpf_get_prandom_u32() };
    // Slots met whose backend was down or held, for `trace` (a counter, no map access).
    let mut downs = 0u32;
    let lookup = {
        let (mut lookup, downs) = (lookup, &mut downs);
        move |index| {
            let slot = lookup(index);
            *downs += u32::from(matches!(slot, Slot::Down(_)));
            slot
        }
    };
    let mut choice = choose_with(fe, lookup, random, crate::scan::scan);
    let none_live = matches!(choice, lb_common::Choice::Empty);
    if matches!(choice, lb_common::Choice::Empty) && saw_held {
        // Every allowed backend is held down or marked: rather than refuse everything on passive evidence,
        // take a random backend of the first tier unless the operator marked it down (the panic threshold).
        choice = health::panic_choice(fe);
    }
    // sessionAffinity after the choice, not instead of it: see `keep_sticky`.
    let sticky = fe.affinity_timeout_s != 0
        && matches!(choice, lb_common::Choice::Backend { .. })
        && affinity::apply(ctx, fe, &key, &mut choice, health);
    // The trial is the backend `choose` returned, unless affinity replaced it.
    if let lb_common::Choice::Backend { backend, .. } = choice
        && trial
        && !sticky
    {
        // SAFETY: helper without preconditions.
        health::start_trial(backend, unsafe { bpf_ktime_get_boot_ns() });
    }
    if trace::on() {
        let panic = none_live && matches!(choice, lb_common::Choice::Backend { .. });
        let info = trace_info(v6, connect, sticky, trial && !sticky, panic, saw_held, downs);
        trace::decision(ctx, &key, fe, &choice, info);
    }
    match choice {
        lb_common::Choice::Backend { tier, backend } => {
            write_addr(sa, v6, dst.mapped, backend.addr, backend.port);
            // COUNTER_NODE, COUNTER_ZONE, COUNTER_CLUSTER are 0, 1, 2: the tier index is the counter kind.
            count(fe.svc_id, COUNTER_NODE + tier as u32);
            if connect {
                reverse::remember_connected(ctx, backend, key);
            } else {
                reverse::remember_sent(ctx, backend, key);
            }
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

/// recvmsg() and getpeername(): backend -> the VIP this socket asked for.
#[inline(always)]
fn restore(ctx: &SockAddrContext, v6: bool) {
    // SAFETY: as in `translate`.
    let sa = unsafe { &mut *ctx.sock_addr };
    let peer = read_addr(sa, v6);
    let backend = Backend {
        addr: peer.words,
        port: sa.user_port as u16,
        proto: sa.protocol as u8,
        family: peer.family,
    };
    let Some(fe) = reverse::recall(ctx, backend) else { return };
    // A stale entry (the Service is gone) is not applied: the VIP no longer means anything. Only presence is
    // asked, no value is read, so an element reused meanwhile changes nothing.
    if FRONTENDS.get_ptr(fe).is_none() {
        return;
    }
    write_addr(sa, v6, peer.mapped, fe.addr, fe.port);
}
