//! Sending a packet this program rewrote to an address of the node (SNAT, and the reply of an SNAT flow)
//! out of the right device itself: the stack would drop it, since a packet that arrives with one of the
//! node's own addresses as its source is a martian (`fib_validate_source`). A DSR flow's packets go the same
//! way (`dsr::forward`), checked for the option's 8 bytes (`grow`). A FIB lookup gives the egress
//! device and the next hop's MAC; without a neighbour entry yet, `bpf_redirect_neigh` resolves it (Cilium's
//! `fib_redirect` in bpf/lib/fib.h does the same). What the stack's forwarding would answer with an ICMP
//! error (an exhausted TTL, a packet too large for the next hop) is answered here (`icmp_send`).
use core::mem::{size_of, zeroed};

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LOOKUP_SRC, bpf_check_mtu_flags::BPF_MTU_CHK_SEGS,
        bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS, bpf_fib_lookup,
    },
    helpers::{bpf_check_mtu, bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_neigh},
    macros::map,
    maps::PerCpuArray,
    programs::TcContext,
};
use lb_common::{FAMILY_V4, NS_DROP_FRAG_NEEDED, NS_DROP_NO_ROUTE};

use super::{DROP, Flow, frame::Frame, icmp_send, packet};
use crate::counters::count_ns;

pub(crate) const AF_INET: u8 = 2;
/// `sizeof(struct bpf_fib_lookup)` as the helper takes it (64 bytes: no truncation).
#[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "64 fits an i32")]
pub(crate) const FIB_PARAMS_LEN: i32 = size_of::<bpf_fib_lookup>() as i32;
pub(crate) const AF_INET6: u8 = 10;

/// The next hop of the packet being forwarded, between `check` and `send` (off the stack: the rewrite
/// between them has frames of its own).
struct Hop {
    p: bpf_fib_lookup,
    rc: i64,
}

#[map]
static HOP: PerCpuArray<Hop> = PerCpuArray::with_max_entries(1, 0);

/// `check`'s answer when the packet may go on (rewrite it, then `send`): not a tc verdict.
pub(crate) const GO: i32 = i32::MIN + 3;

/// `lookup`'s answers for a packet the stack's forwarding would answer with an ICMP error: its TTL would run
/// out, or it is larger than the route's MTU (in the `HOP` scratch's `mtu_result`). Not tc verdicts.
const ANSWER_TIME_EXCEEDED: i32 = i32::MIN + 4;
const ANSWER_TOO_BIG: i32 = i32::MIN + 5;

/// Before the packet `f` is rewritten to `src` -> `dst` and sent on by `send`: its next hop (a FIB
/// lookup), and whether it can go there. A TTL that would run out, or a packet larger than the route's MTU,
/// is answered as the stack's forwarding would answer it, with ICMP time exceeded or "fragmentation needed"
/// / "packet too big" to its sender (`icmp_send`), from the packet as it arrived; `answer` false drops it
/// instead. `grow`: the bytes the packet gains before it is sent (the DSR option), checked against the MTU
/// and taken off the MTU the answer gives. `GO`, or the verdict.
#[inline(always)]
pub(crate) fn check(
    ctx: &TcContext,
    f: &Flow,
    src: &[u32; 4],
    dst: &[u32; 4],
    answer: bool,
    grow: u16,
) -> i32 {
    respond(ctx, f, lookup(ctx, f, src, dst, grow), answer, grow)
}

/// `lookup`'s answer `verdict` for the packet `f`, as `check` gives it. Out of line (five arguments, in
/// registers): the answer's frames sit below this one, not below the caller's.
#[inline(never)]
pub(crate) fn respond(ctx: &TcContext, f: &Flow, verdict: i32, answer: bool, grow: u16) -> i32 {
    match verdict {
        ANSWER_TIME_EXCEEDED if answer => icmp_send::error(ctx, f, icmp_send::TIME_EXCEEDED, 0),
        ANSWER_TOO_BIG if answer => {
            count_ns(NS_DROP_FRAG_NEEDED);
            let Some(h) = HOP.get_ptr(0) else { return DROP };
            // SAFETY: as in `lookup`, which wrote it in this run.
            let mtu = unsafe { (*h).p.__bindgen_anon_1.mtu_result };
            icmp_send::error(ctx, f, icmp_send::TOO_BIG, mtu.saturating_sub(grow))
        }
        verdict => quiet(verdict),
    }
}

/// `lookup`'s answer as a verdict where no ICMP error is sent (an ICMP error being translated: never an
/// error about an error): `ANSWER_*` dropped.
#[inline(always)]
pub(crate) fn quiet(verdict: i32) -> i32 {
    if verdict == ANSWER_TOO_BIG {
        count_ns(NS_DROP_FRAG_NEEDED);
    }
    if verdict == ANSWER_TIME_EXCEEDED || verdict == ANSWER_TOO_BIG { DROP } else { verdict }
}

/// Whether `lookup` found the packet too large for the route's MTU.
#[inline(always)]
pub(crate) const fn too_big(verdict: i32) -> bool {
    verdict == ANSWER_TOO_BIG
}

/// `check` without the answers: `GO`, a verdict, or `ANSWER_*`. Out of line and apart from `icmp_send`, so
/// the ICMP-translation path (`icmp::error`, a large frame) never has the answer's frames below it: the
/// verifier bounds the stack over every call chain the program has, taken or not.
#[inline(never)]
pub(crate) fn lookup(ctx: &TcContext, f: &Flow, src: &[u32; 4], dst: &[u32; 4], grow: u16) -> i32 {
    let Some(h) = HOP.get_ptr_mut(0) else { return DROP };
    // SAFETY: this CPU's scratch value; a tc program runs with bottom halves disabled, so no other run on
    // this CPU uses it until this one returns.
    let h = unsafe { &mut *h };
    let Ok(ttl) = packet::ttl(ctx, f) else { return DROP };
    if ttl <= 1 {
        return ANSWER_TIME_EXCEEDED;
    }
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    h.p = unsafe { zeroed() };
    h.p.l4_protocol = f.proto;
    // SAFETY: the context's skb pointer is valid for the program's run.
    h.p.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if f.family == FAMILY_V4 {
        h.p.family = AF_INET;
        h.p.__bindgen_anon_3.ipv4_src = src[0];
        h.p.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        h.p.family = AF_INET6;
        h.p.__bindgen_anon_3.ipv6_src = *src;
        h.p.__bindgen_anon_4.ipv6_dst = *dst;
    }
    // SAFETY: the context's skb pointer is valid for the program's run.
    let gso = unsafe { (*ctx.skb.skb).gso_size } != 0;
    if !gso {
        // The IP packet's length: the lookup then checks it against the MTU the stack's forwarding uses (a
        // locked route `mtu`, a learned path MTU, else the device's), whatever the egress device's header
        // length. A GSO packet's length is its segments' sum: checked per segment below.
        let Ok(len) = packet::ip_len(ctx, f) else { return DROP };
        h.p.__bindgen_anon_1.tot_len = len.saturating_add(grow);
    }
    // SAFETY: `p` is a valid lookup structure of the size passed; the context is the program's own.
    h.rc = unsafe { fib_lookup(ctx.skb.skb.cast(), &raw mut h.p, FIB_PARAMS_LEN, 0) };
    if h.rc == i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        // The helper wrote the route's MTU in the union on this result, which `respond` reads (and counts).
        return ANSWER_TOO_BIG;
    }
    if h.rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) && h.rc != i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
        count_ns(NS_DROP_NO_ROUTE);
        return DROP;
    }
    if gso {
        // A GSO packet (GRO-merged on the way in, a veth peer's TSO burst) passes the lookup whatever its
        // segments' size: each segment is checked against the egress device's MTU (`BPF_MTU_CHK_SEGS`,
        // from the IP header, as `ip_exceeds_mtu`). One too large is dropped unanswered: a GRO-merged skb
        // is `CHECKSUM_PARTIAL` at its TCP checksum's offset, which an error built over it would keep (a
        // NIC filling checksums would write into the quote); the client's retransmission, one segment, is
        // answered. `grow` is not added: growing a TCP GSO packet's header takes as much off its segments'
        // size (`bpf_skb_adjust_room` without `BPF_F_ADJ_ROOM_FIXED_GSO`), and a UDP one is not grown.
        let mut mtu = 0u32;
        // SAFETY: the context's skb and a u32 out-parameter.
        let rc = unsafe {
            bpf_check_mtu(ctx.skb.skb.cast(), h.p.ifindex, &raw mut mtu, 0, u64::from(BPF_MTU_CHK_SEGS))
        };
        if rc != i64::from(BPF_MTU_CHK_RET_SUCCESS) {
            count_ns(NS_DROP_FRAG_NEEDED);
            return DROP;
        }
    }
    GO
}

/// Send the packet `check` let go on (since rewritten) to its next hop: its TTL decremented (a redirect
/// bypasses the stack's forwarding, which would do it), the next hop's MAC written, out of the egress
/// device; without a neighbour entry yet, `bpf_redirect_neigh` resolves it. The tc verdict.
#[inline(never)]
pub(crate) fn send(ctx: &TcContext, f: &Flow) -> i32 {
    let Some(h) = HOP.get_ptr(0) else { return DROP };
    // SAFETY: as in `check`, which wrote it in this run.
    let h = unsafe { &*h };
    if packet::decrement_ttl(ctx, f).is_err() {
        return DROP;
    }
    if h.rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        if ctx.store(0, &h.p.dmac, 0).is_err() || ctx.store(6, &h.p.smac, 0).is_err() {
            return DROP;
        }
        // SAFETY: helper without memory arguments.
        return unsafe { bpf_redirect(h.p.ifindex, 0) } as i32;
    }
    // SAFETY: a null next hop with length 0 asks the kernel to resolve the packet's own destination.
    unsafe { bpf_redirect_neigh(h.p.ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

/// The source address the node's routing gives a packet to `dst` forwarded from this packet's device
/// (`BPF_FIB_LOOKUP_SRC`: the route's preferred source, else the egress device's address), into `out`.
/// `false` where the kernel lacks the flag (before 6.8: the helper refuses it) or no route: the caller falls
/// back to the configured address.
#[inline(never)]
pub(crate) fn source<C: Frame>(ctx: &C, family: u8, dst: &[u32; 4], out: &mut [u32; 4]) -> bool {
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: bpf_fib_lookup = unsafe { zeroed() };
    p.ifindex = ctx.ifindex();
    if family == FAMILY_V4 {
        p.family = AF_INET;
        p.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        p.family = AF_INET6;
        p.__bindgen_anon_4.ipv6_dst = *dst;
    }
    // SAFETY: `p` is a valid lookup structure of the size passed; the context is the program's own.
    let rc = unsafe { fib_lookup(ctx.raw(), &raw mut p, FIB_PARAMS_LEN, BPF_FIB_LOOKUP_SRC) };
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) && rc != i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
        return false;
    }
    // SAFETY: the helper wrote the source of the family asked for.
    *out = if family == FAMILY_V4 {
        [unsafe { p.__bindgen_anon_3.ipv4_src }, 0, 0, 0]
    } else {
        unsafe { p.__bindgen_anon_3.ipv6_src }
    };
    *out != [0; 4]
}
