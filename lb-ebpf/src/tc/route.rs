//! Sending a packet this program rewrote to an address of the node (SNAT, and the reply of an SNAT flow)
//! out of the right device itself: the stack would drop it, since a packet that arrives with one of the
//! node's own addresses as its source is a martian (`fib_validate_source`). A FIB lookup gives the egress
//! device and the next hop's MAC; without a neighbour entry yet, `bpf_redirect_neigh` resolves it (Cilium's
//! `fib_redirect` in bpf/lib/fib.h does the same).
use core::mem::{size_of, zeroed};

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LOOKUP_SRC, bpf_fib_lookup,
    },
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_neigh},
    programs::TcContext,
};
use lb_common::{FAMILY_V4, NS_DROP_FRAG_NEEDED, NS_DROP_NO_ROUTE};

use super::{DROP, PASS, packet};
use crate::counters::count_ns;

const AF_INET: u8 = 2;
/// `sizeof(struct bpf_fib_lookup)` as the helper takes it (64 bytes: no truncation).
#[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "64 fits an i32")]
const FIB_PARAMS_LEN: i32 = size_of::<bpf_fib_lookup>() as i32;
const AF_INET6: u8 = 10;

/// Forward the packet (already rewritten to `src` -> `dst`) to its next hop; the tc verdict.
#[inline(never)]
pub(crate) fn forward(ctx: &TcContext, family: u8, proto: u8, src: &[u32; 4], dst: &[u32; 4]) -> i32 {
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: bpf_fib_lookup = unsafe { zeroed() };
    p.l4_protocol = proto;
    // SAFETY: the context's skb pointer is valid for the program's run.
    p.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if family == FAMILY_V4 {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src = src[0];
        p.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        p.family = AF_INET6;
        p.__bindgen_anon_3.ipv6_src = *src;
        p.__bindgen_anon_4.ipv6_dst = *dst;
    }
    match packet::decrement_ttl(ctx, family) {
        Ok(true) => {}
        // TTL exhausted: the stack answers it (and drops it as a martian, which is what an exhausted TTL
        // gets anyway).
        Ok(false) => return PASS,
        Err(_) => return DROP,
    }
    // SAFETY: `p` is a valid lookup structure of the size passed; the context is the program's own.
    let rc = unsafe { fib_lookup(ctx.skb.skb.cast(), &raw mut p, FIB_PARAMS_LEN, 0) };
    if rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        if ctx.store(0, &p.dmac, 0).is_err() || ctx.store(6, &p.smac, 0).is_err() {
            return DROP;
        }
        // SAFETY: helper without memory arguments.
        return unsafe { bpf_redirect(p.ifindex, 0) } as i32;
    }
    if rc == i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
        // SAFETY: a null next hop with length 0 asks the kernel to resolve the packet's own destination.
        return unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) } as i32;
    }
    // Larger than the egress device's MTU (the lookup checks the skb against it, GSO segments included):
    // the stack's forwarding would answer "fragmentation needed", a redirect cannot. Only where this node's
    // uplink has a smaller MTU than the link the packet came in on.
    count_ns(if rc == i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        NS_DROP_FRAG_NEEDED
    } else {
        NS_DROP_NO_ROUTE
    });
    DROP
}

/// The source address the node's routing gives a packet to `dst` forwarded from this packet's device
/// (`BPF_FIB_LOOKUP_SRC`: the route's preferred source, else the egress device's address), into `out`.
/// `false` where the kernel lacks the flag (before 6.8: the helper refuses it) or no route: the caller falls
/// back to the configured address.
#[inline(never)]
pub(crate) fn source(ctx: &TcContext, family: u8, dst: &[u32; 4], out: &mut [u32; 4]) -> bool {
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: bpf_fib_lookup = unsafe { zeroed() };
    // SAFETY: the context's skb pointer is valid for the program's run.
    p.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if family == FAMILY_V4 {
        p.family = AF_INET;
        p.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        p.family = AF_INET6;
        p.__bindgen_anon_4.ipv6_dst = *dst;
    }
    // SAFETY: `p` is a valid lookup structure of the size passed; the context is the program's own.
    let rc = unsafe { fib_lookup(ctx.skb.skb.cast(), &raw mut p, FIB_PARAMS_LEN, BPF_FIB_LOOKUP_SRC) };
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
