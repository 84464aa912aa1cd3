//! `xdp_ingress`: the north-south path before an skb exists, on the devices `tc_ingress` is on, over the same
//! maps. It takes what it can finish itself and hands the rest to `tc_ingress` untouched (`XDP_PASS`, counted
//! as `xdp_to_tc` when the packet was a tracked or new flow's):
//!
//! - a tracked SNAT flow's packet (to a backend on another node, or its reply to the client): its entry
//!   refreshed as tc would, the addresses and ports rewritten, the TTL decremented, the next hop's MACs
//!   written, and sent with `XDP_TX` (back out of the device it came in by) or `XDP_REDIRECT` (another
//!   device), when the FIB lookup gives a next hop with a resolved neighbour;
//! - a new flow (a TCP SYN or a UDP datagram to an outside frontend): chosen and tracked by the same code as
//!   in tc (`new_flow`, sessionAffinity, `admit`), then forwarded as above if its backend is remote; a
//!   refused flow is dropped here (counted as in tc).
//!
//! tc's: a flow to a local backend (the stack delivers it), a packet whose next hop has no neighbour entry
//! yet, one whose TTL runs out or that is larger than the route's MTU (tc answers with ICMP), fragments,
//! ICMP, a TCP RST (one outside the window is counted and passed), a SYN or SYN-ACK on a tracked tuple (it
//! may end a closed flow), and anything not addressed to the node or an outside frontend.
use core::mem::zeroed;

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect},
    macros::xdp,
    programs::XdpContext,
};
use lb_common::{
    AddrKey, CT_DIR_IN, CT_FORWARD, CT_SNAT, CtKey, CtValue, FAMILY_V4, NS_TRANSLATED, NS_XDP_REDIRECT,
    NS_XDP_TO_TC, NS_XDP_TX, PROTO_TCP,
};

use super::{
    CHOSEN, CREATED, DROP, PACKET, Packet, SCRATCH, admit, conntrack, fragment,
    frame::{Frame, Xdp},
    new_flow,
    packet::{self, Flow, Parsed, TCP_ACK, TCP_RST, TCP_SYN},
    route::{AF_INET, AF_INET6, FIB_PARAMS_LEN},
    with_affinity,
};
use crate::{counters::count_ns, maps::NS_ADDRS};

#[xdp]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn xdp_ingress(ctx: XdpContext) -> u32 {
    ingress(&Xdp(&ctx))
}

#[inline(always)]
fn ingress(x: &Xdp<'_>) -> u32 {
    let Some(scratch) = PACKET.get_ptr_mut(0) else { return XDP_PASS };
    // SAFETY: this CPU's scratch value, shared with the tc programs: XDP runs in the driver's poll (or, generic,
    // in the receive path) with bottom halves disabled, and the tc program that may take the packet next runs
    // after this one has returned.
    let Packet { flow: f, key: k } = unsafe { &mut *scratch };
    if !read(x, f, k) {
        return XDP_PASS;
    }
    let (f, k): (&Flow, &CtKey) = (f, k);
    let tcp = f.proto == PROTO_TCP;
    let syn = tcp && f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    let Some(cfg) = conntrack::config() else { return XDP_PASS };
    let t = conntrack::now();
    if let Some((p, _)) = conntrack::find(k, t) {
        // SAFETY: a plain read of a hash value, which stays mapped for the program's run.
        // A SYN (or SYN-ACK) on a tracked tuple may end a closed flow (`conntrack::hit`): tc's.
        if f.tcp_flags & TCP_SYN != 0 || unsafe { (*p).flags } & CT_SNAT == 0 {
            return to_tc();
        }
        return forward(x, f, p, true);
    }
    if tcp && !syn {
        // No flow of ours: the node's own traffic, or an expired flow's segment (tc counts it).
        return XDP_PASS;
    }
    let verdict = new_flow(f);
    if verdict != CHOSEN {
        return verdict_of(verdict);
    }
    if !with_affinity() {
        return XDP_PASS;
    }
    let Some(scratch_flow) = SCRATCH.get_ptr_mut(0) else { return XDP_PASS };
    let verdict = admit(x, f, cfg, t);
    if verdict != CREATED {
        return verdict_of(verdict);
    }
    // SAFETY: as above; `admit` wrote the flow's entries, their copy in the scratch value.
    let fwd = unsafe { &raw mut (*scratch_flow).fwd };
    // SAFETY: as above.
    if unsafe { (*fwd).flags } & CT_SNAT == 0 {
        // A local backend: its entries are written; tc's translation finds them, and the stack delivers it.
        return to_tc();
    }
    forward(x, f, fwd, false)
}

/// Parse the frame into `f` and its conntrack key into `k`: whether it may be ours, a whole TCP or UDP packet
/// to an address of the pre-filter (fragments, ICMP and the rest are tc's), and not a TCP RST (one outside
/// the window is passed on unchanged and counted by `conntrack::hit`: tc's, once). Out of line: its frame is
/// gone before the new flow's calls (the verifier bounds the stack over the call chain at 512 bytes).
#[inline(never)]
fn read(x: &Xdp<'_>, f: &mut Flow, k: &mut CtKey) -> bool {
    if packet::parse(x, f, packet::ETH_LEN) != Parsed::Flow || f.frag != fragment::WHOLE {
        return false;
    }
    if NS_ADDRS.get_ptr(AddrKey { addr: f.daddr, family: f.family, _pad: [0; 3] }).is_none() {
        return false;
    }
    if f.proto == PROTO_TCP && f.tcp_flags & TCP_RST != 0 {
        return false;
    }
    *k = conntrack::key(f, CT_DIR_IN);
    true
}

/// A tc verdict of the shared steps as XDP's: a drop stays a drop; anything else is tc's to decide.
#[inline(always)]
fn verdict_of(tc: i32) -> u32 {
    if tc == DROP { XDP_DROP } else { XDP_PASS }
}

/// A flow of ours left to tc.
#[inline(always)]
fn to_tc() -> u32 {
    count_ns(NS_XDP_TO_TC);
    XDP_PASS
}

/// Forward the packet `f` of the SNAT flow whose entry (for its direction) is at `entry`: `tracked` (a flow
/// found in conntrack, its key in the `PACKET` scratch) refreshes the entry as tc's `conntrack::hit` does,
/// after the next hop is known (a packet handed to tc is refreshed there, once). The XDP verdict. Four
/// arguments in registers: a fifth, or one larger than a register, would sit on the caller's frame.
#[inline(never)]
fn forward(x: &Xdp<'_>, f: &Flow, entry: *mut CtValue, tracked: bool) -> u32 {
    // SAFETY: a map value or this CPU's scratch value, mapped for the program's run; its translation fields
    // are written once, when the flow is created.
    let (to, to_port, from, from_port, fwd) = unsafe {
        ((*entry).a, (*entry).a_port, (*entry).b, (*entry).b_port, (*entry).flags & CT_FORWARD != 0)
    };
    let (src, dst) = if fwd { (from, to) } else { (to, from) };
    match packet::ttl(x, f) {
        Ok(ttl) if ttl > 1 => {}
        _ => return to_tc(),
    }
    let Ok(len) = packet::ip_len(x, f) else { return to_tc() };
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut hop: bpf_fib_lookup = unsafe { zeroed() };
    hop.l4_protocol = f.proto;
    hop.ifindex = x.ifindex();
    hop.__bindgen_anon_1.tot_len = len;
    if f.family == FAMILY_V4 {
        hop.family = AF_INET;
        hop.__bindgen_anon_3.ipv4_src = src[0];
        hop.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        hop.family = AF_INET6;
        hop.__bindgen_anon_3.ipv6_src = src;
        hop.__bindgen_anon_4.ipv6_dst = dst;
    }
    // SAFETY: `p` is a valid lookup structure of the size passed; the context is the program's own.
    let rc = unsafe { fib_lookup(x.raw(), &raw mut hop, FIB_PARAMS_LEN, 0) };
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        // No neighbour entry yet, too large for the route, no route: tc resolves, answers or drops it.
        return to_tc();
    }
    if tracked {
        let (Some(scratch), Some(cfg)) = (PACKET.get_ptr(0), conntrack::config()) else { return to_tc() };
        // SAFETY: this CPU's scratch value, whose key `ingress` wrote in this run.
        if conntrack::hit(unsafe { &(*scratch).key }, f, cfg, conntrack::now()).is_none() {
            return to_tc();
        }
    }
    let ok = if fwd {
        packet::set_dst(x, f, &to, to_port).is_ok() && packet::set_src(x, f, &from, from_port).is_ok()
    } else {
        packet::set_src(x, f, &to, to_port).is_ok() && packet::set_dst(x, f, &from, from_port).is_ok()
    };
    if !ok
        || !packet::decrement_ttl(x, f).unwrap_or(false)
        || x.store(0, &hop.dmac).is_err()
        || x.store(6, &hop.smac).is_err()
    {
        count_ns(lb_common::NS_DROP_REWRITE);
        return XDP_DROP;
    }
    count_ns(NS_TRANSLATED);
    if hop.ifindex == x.ifindex() {
        count_ns(NS_XDP_TX);
        return XDP_TX;
    }
    count_ns(NS_XDP_REDIRECT);
    // SAFETY: helper without memory arguments. It answers XDP_REDIRECT (4), or XDP_ABORTED (0) for flags it
    // does not know: never negative.
    unsafe { bpf_redirect(hop.ifindex, 0) }.unsigned_abs() as u32
}
