//! `xdp_ingress`: the north-south path before an skb exists, on the devices `tc_ingress` is on, over the same
//! maps. It takes what it can finish itself and hands the rest to `tc_ingress` untouched (`XDP_PASS`, counted
//! as `xdp_to_tc` when the packet was a tracked or new flow's):
//!
//! - a tracked SNAT flow's packet (to a backend on another node, or its reply to the client): its entry
//!   refreshed as tc would, the addresses and ports rewritten, the TTL decremented, the next hop's MACs
//!   written, and sent with `XDP_TX` (back out of the device it came in by) or `XDP_REDIRECT` (another
//!   device), when the FIB lookup gives a next hop with a resolved neighbour;
//! - a tracked DSR flow's packet (`dsr`): to the backend with the client's address kept, the frame grown at
//!   its head by the option's 8 bytes (`bpf_xdp_adjust_head`), the headers moved and the option written, then
//!   sent as above; one with no room for the option within the route's MTU is tc's;
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
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect, generated::bpf_xdp_adjust_head},
    macros::{map, xdp},
    maps::PerCpuArray,
    programs::XdpContext,
};
use lb_common::{
    AddrKey, CT_DIR_IN, CT_DSR, CT_FORWARD, CT_SNAT, CtKey, CtValue, DSR_OPT_LEN, FAMILY_V4, NS_TRANSLATED,
    NS_XDP_REDIRECT, NS_XDP_TO_TC, NS_XDP_TX, PROTO_TCP,
};

use super::{
    CHOSEN, CREATED, DROP, PACKET, Packet, SCRATCH, admit, conntrack, dsr, fragment,
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
        let flags = unsafe { (*p).flags };
        // A SYN (or SYN-ACK) on a tracked tuple may end a closed flow (`conntrack::hit`): tc's.
        if f.tcp_flags & TCP_SYN != 0 {
            return to_tc();
        }
        if flags & CT_DSR != 0 {
            return forward_dsr(x, f, p, true);
        }
        if flags & CT_SNAT == 0 {
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
    let flags = unsafe { (*fwd).flags };
    if flags & CT_DSR != 0 {
        return forward_dsr(x, f, fwd, false);
    }
    if flags & CT_SNAT == 0 {
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
    let Some(hop) = next_hop(x, f, &src, &dst, 0) else { return to_tc() };
    if tracked && !refresh(f) {
        return to_tc();
    }
    let ok = if fwd {
        packet::set_dst(x, f, &to, to_port).is_ok() && packet::set_src(x, f, &from, from_port).is_ok()
    } else {
        packet::set_src(x, f, &to, to_port).is_ok() && packet::set_dst(x, f, &from, from_port).is_ok()
    };
    send(x, f, hop, ok)
}

/// Forward the packet `f` of the DSR flow whose forward entry is at `entry` as tc's `dsr::forward` does: to
/// the backend, the client's address kept, the frontend it was sent to in the IPv4 option (the frame grown
/// at its head by 8 bytes, the Ethernet and IPv4 base headers moved to the new start). A packet whose header
/// has options already, whose TTL runs out, or that has no room for the option within the route's MTU is
/// tc's (it answers or sends it without the option). `tracked`: as in `forward`. The XDP verdict.
#[inline(never)]
fn forward_dsr(x: &Xdp<'_>, f: &Flow, entry: *mut CtValue, tracked: bool) -> u32 {
    // SAFETY: as in `forward`.
    let (to, to_port) = unsafe { ((*entry).a, (*entry).a_port) };
    let Some(base) = dsr::base_header(x, f) else { return to_tc() };
    let Some(hop) = next_hop(x, f, &f.saddr, &to, u16::from(DSR_OPT_LEN)) else { return to_tc() };
    if tracked && !refresh(f) {
        return to_tc();
    }
    let base = (u32::from(base.0) << 16) | u32::from(base.1);
    let ok = packet::set_dst(x, f, &to, to_port).is_ok() && grow(x, f, base, f.daddr[0], f.dport);
    send(x, f, hop, ok)
}

/// Grow the frame by the option's 8 bytes at its head, move the Ethernet and IPv4 base headers (34 bytes) to
/// the new start, and write the option announcing `addr`:`port` in the 8 bytes after the base header
/// (`dsr::write_option`; `base`: the header's first word and total length as `dsr::base_header` read them,
/// high and low half). Out of line, five arguments in registers: its 34-byte copy of the headers stays off
/// the frame of `forward_dsr`, above the conntrack calls (the verifier bounds the stack over the call chain).
#[inline(never)]
fn grow(x: &Xdp<'_>, f: &Flow, base: u32, addr: u32, port: u16) -> bool {
    if f.l3 != packet::ETH_LEN {
        return false;
    }
    // SAFETY: the program's own context; a negative delta grows the head into the headroom (the driver's
    // XDP_PACKET_HEADROOM), which the helper checks.
    if unsafe { bpf_xdp_adjust_head(x.0.ctx, -i32::from(DSR_OPT_LEN)) } != 0 {
        return false;
    }
    let Ok(head) = x.load::<[u8; packet::ETH_LEN + dsr::IPV4_BASE]>(usize::from(DSR_OPT_LEN)) else {
        return false;
    };
    // The headers moved to the frame's new start: the IPv4 header is where it was relative to it.
    x.store(0, &head).is_ok() && dsr::write_option(x, f.l3, ((base >> 16) as u16, base as u16), addr, port)
}

/// The next hop of the packet being forwarded, off the stack: the frames of `forward` and `forward_dsr` sit
/// above the conntrack calls, and the verifier bounds the stack over the call chain at 512 bytes.
#[map]
static XDP_HOP: PerCpuArray<bpf_fib_lookup> = PerCpuArray::with_max_entries(1, 0);

/// The next hop of the packet `f` rewritten to `src` -> `dst` and grown by `grow` bytes (in `XDP_HOP`), if
/// the FIB gives one with a resolved neighbour and the packet fits its MTU (anything else is tc's), and its
/// TTL does not run out here.
#[inline(always)]
fn next_hop(
    x: &Xdp<'_>,
    f: &Flow,
    src: &[u32; 4],
    dst: &[u32; 4],
    grow: u16,
) -> Option<&'static bpf_fib_lookup> {
    match packet::ttl(x, f) {
        Ok(ttl) if ttl > 1 => {}
        _ => return None,
    }
    let len = packet::ip_len(x, f).ok()?;
    // SAFETY: this CPU's scratch value; XDP runs with bottom halves disabled, and the value is used only
    // within this run.
    let hop = unsafe { &mut *XDP_HOP.get_ptr_mut(0)? };
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    *hop = unsafe { zeroed() };
    hop.l4_protocol = f.proto;
    hop.ifindex = x.ifindex();
    hop.__bindgen_anon_1.tot_len = len.saturating_add(grow);
    if f.family == FAMILY_V4 {
        hop.family = AF_INET;
        hop.__bindgen_anon_3.ipv4_src = src[0];
        hop.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        hop.family = AF_INET6;
        hop.__bindgen_anon_3.ipv6_src = *src;
        hop.__bindgen_anon_4.ipv6_dst = *dst;
    }
    // SAFETY: `p` is a valid lookup structure of the size passed; the context is the program's own.
    let rc = unsafe { fib_lookup(x.raw(), core::ptr::from_mut(hop), FIB_PARAMS_LEN, 0) };
    // No neighbour entry yet, too large for the route, no route: tc resolves, answers or drops it.
    (rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS)).then_some(hop)
}

/// Refresh the tracked flow of `f` (its key in the `PACKET` scratch) as tc's `conntrack::hit` does, after the
/// next hop is known (a packet handed to tc is refreshed there, once); `false`: gone since, tc's.
#[inline(always)]
fn refresh(f: &Flow) -> bool {
    let (Some(scratch), Some(cfg)) = (PACKET.get_ptr(0), conntrack::config()) else { return false };
    // SAFETY: this CPU's scratch value, whose key `ingress` wrote in this run.
    conntrack::hit(unsafe { &(*scratch).key }, f, cfg, conntrack::now()).is_some()
}

/// Send the rewritten packet `f` (`ok`: every rewrite succeeded, else it is dropped) to `hop`: its TTL
/// decremented, the next hop's MACs written, back out of its device (`XDP_TX`) or another (`XDP_REDIRECT`).
#[inline(always)]
fn send(x: &Xdp<'_>, f: &Flow, hop: &bpf_fib_lookup, ok: bool) -> u32 {
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
