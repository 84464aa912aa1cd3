//! ICMP errors about a translated flow: port unreachable, fragmentation needed / packet too big (path MTU
//! discovery), time exceeded, parameter problem. Such an error quotes the packet it is about as that packet
//! was when the error's sender saw it, which is after translation; its own addresses are the translated
//! flow's too. Both are translated back, as Linux conntrack's `nf_nat_icmp_reply_translation` does for
//! kube-proxy, so the error reaches the socket that sent the packet.
//!
//! The quoted packet, with its source and destination swapped, is a packet of the flow in the direction
//! the error travels, so its conntrack entry is the one that packet would hit here (`CT_DIR_IN` on ingress,
//! `CT_DIR_OUT` on egress); that entry's translation is applied to the quote's swapped sides: a forward
//! entry (client -> frontend, rewritten to the backend and, with SNAT, from the node) turns the quote's
//! source into the backend and its destination into the node's SNAT port, and sends the error to the
//! backend (from the node, with SNAT); a reply entry turns the quote's destination into the frontend (and
//! its source into the client, with SNAT) and makes the error come from the frontend.
//!
//! Checksums: the quote's IPv4 header and TCP/UDP checksums are updated (the TCP one when the quote holds
//! it: a router may quote only 8 bytes), and the ICMP checksum by every word changed inside the message,
//! computed here (`lb_common::CsumDiff`); the outer addresses go through the kernel's helpers, which know
//! the skb's checksum state (ICMPv6's checksum covers them through its pseudo-header).
use aya_ebpf::{bindings::BPF_F_PSEUDO_HDR, programs::TcContext};
use lb_common::{
    CT_FORWARD, CT_SNAT, CsumDiff, CtKey, FAMILY_V4, NS_DROP_REWRITE, NS_ICMP_TRANSLATED, PROTO_TCP,
    PROTO_UDP,
};

use super::{
    DROP, NOT_OURS, PASS, conntrack,
    packet::{self, Flow, IPV4_CSUM, IPV4_DST, IPV4_SRC, IPV6_DST, IPV6_LEN, IPV6_SRC, NEXTHDR_FRAGMENT},
    route,
};
use crate::counters::count_ns;

/// The ICMP header's length before the quoted packet.
const ICMP_LEN: usize = 8;

/// Whether ICMP type `t` is an error that quotes a packet: IPv4 destination unreachable (fragmentation
/// needed among its codes), time exceeded, parameter problem; ICMPv6 destination unreachable, packet too
/// big, time exceeded, parameter problem. Echo and everything else are not errors about a flow.
#[inline(always)]
fn is_error(family: u8, t: u8) -> bool {
    if family == FAMILY_V4 { matches!(t, 3 | 11 | 12) } else { matches!(t, 1..=4) }
}

/// An ICMP(v6) packet `f` (`packet::Parsed::Icmp`) seen in direction `dir`: translated when it is an error
/// about a tracked flow (its tc verdict), else `NOT_OURS`.
#[inline(never)]
pub(crate) fn error(ctx: &TcContext, f: &Flow, dir: u8) -> i32 {
    let Ok(kind) = ctx.load::<u8>(f.l4) else { return NOT_OURS };
    if !is_error(f.family, kind) {
        return NOT_OURS;
    }
    let mut q = Flow::default();
    if !quoted(ctx, f, &mut q) {
        return NOT_OURS;
    }
    if q.saddr != f.daddr {
        // An error goes to the sender of the packet it quotes: one that does not (forged, or about another
        // hop's packet) is not about this flow (netfilter's "outer daddr mismatch" makes it invalid too).
        return NOT_OURS;
    }
    let key = CtKey {
        saddr: q.daddr,
        daddr: q.saddr,
        sport: q.dport,
        dport: q.sport,
        proto: q.proto,
        family: q.family,
        dir,
        _pad: 0,
    };
    let Some((entry, _)) = conntrack::find(&key, conntrack::now()) else { return NOT_OURS };
    // SAFETY: an LRU value stays mapped for the program's run; its translation fields are written once, at
    // the flow's creation (see `conntrack::hit`).
    let v = unsafe { &*entry };
    let snat = v.flags & CT_SNAT != 0;
    let forward = v.flags & CT_FORWARD != 0;
    // The error's new outer addresses (the SNAT path's, for the FIB) are those of the translated packet a
    // reply to the quote would be: the forward entry's backend and node, or the reply entry's frontend and
    // client.
    let (src, dst) = if forward { (v.b, v.a) } else { (v.a, v.b) };
    let ok = if forward {
        rewrite(ctx, f, &q, false, &v.a, v.a_port, snat, &v.b, v.b_port)
            && set_outer(ctx, f, true, &v.a).is_ok()
            && (!snat || set_outer(ctx, f, false, &v.b).is_ok())
    } else {
        rewrite(ctx, f, &q, true, &v.a, v.a_port, snat, &v.b, v.b_port)
            && set_outer(ctx, f, false, &v.a).is_ok()
            && (!snat || set_outer(ctx, f, true, &v.b).is_ok())
    };
    if !ok {
        count_ns(NS_DROP_REWRITE);
        return DROP;
    }
    count_ns(NS_ICMP_TRANSLATED);
    if !snat {
        // To a local pod (forward), or from one and already on its way out (reply): the stack routes it.
        return PASS;
    }
    // Never answered: no ICMP error about an ICMP error (`lookup`, not `check`, keeps the answer's frames
    // off this path's call chain).
    let verdict = route::quiet(route::lookup(ctx, f, &src, &dst, 0));
    if verdict != route::GO {
        return verdict;
    }
    route::send(ctx, f)
}

/// The quoted packet's flow into `q` (`q.l4`: its TCP/UDP header's offset): `false` when it is not TCP or
/// UDP of `f`'s family, or a later fragment (no ports); an IPv6 first fragment's Fragment header is skipped.
#[inline(always)]
fn quoted(ctx: &TcContext, f: &Flow, q: &mut Flow) -> bool {
    let ih = f.l4 + ICMP_LEN;
    q.family = f.family;
    if f.family == FAMILY_V4 {
        let (Ok(vihl), Ok(frag), Ok(proto)) =
            (ctx.load::<u8>(ih), ctx.load::<u16>(ih + 6), ctx.load::<u8>(ih + 9))
        else {
            return false;
        };
        let ihl = usize::from(vihl & 0x0f) * 4;
        if vihl >> 4 != 4 || ihl < 20 || u16::from_be(frag) & 0x1fff != 0 {
            return false;
        }
        let (Ok(s), Ok(d)) = (ctx.load::<u32>(ih + 12), ctx.load::<u32>(ih + 16)) else { return false };
        q.saddr[0] = s;
        q.daddr[0] = d;
        q.proto = proto;
        q.l4 = ih + ihl;
    } else {
        let (Ok(mut next), Ok(s), Ok(d)) =
            (ctx.load::<u8>(ih + 6), ctx.load::<[u32; 4]>(ih + 8), ctx.load::<[u32; 4]>(ih + 24))
        else {
            return false;
        };
        q.saddr = s;
        q.daddr = d;
        q.l4 = ih + IPV6_LEN;
        if next == NEXTHDR_FRAGMENT {
            // A fragment quoted (packet too big about a fragmented datagram): the first one carries the
            // ports, a later one none.
            let (Ok(inner), Ok(off_m)) = (ctx.load::<u8>(q.l4), ctx.load::<u16>(q.l4 + 2)) else {
                return false;
            };
            if u16::from_be(off_m) >> 3 != 0 {
                return false;
            }
            next = inner;
            q.l4 += 8;
        }
        q.proto = next;
    }
    if q.proto != PROTO_TCP && q.proto != PROTO_UDP {
        return false;
    }
    let (Ok(sp), Ok(dp)) = (ctx.load::<u16>(q.l4), ctx.load::<u16>(q.l4 + 2)) else { return false };
    q.sport = sp;
    q.dport = dp;
    true
}

/// Rewrite the quote `q` inside the error `f`: its destination (`dst`, else its source) to `to:port`, and,
/// with `snat`, its other side to `other:other_port`; then the ICMP checksum by every word changed.
#[inline(always)]
#[expect(clippy::too_many_arguments, reason = "both sides of the quote, as the conntrack entry gives them")]
fn rewrite(
    ctx: &TcContext,
    f: &Flow,
    q: &Flow,
    dst: bool,
    to: &[u32; 4],
    port: u16,
    snat: bool,
    other: &[u32; 4],
    other_port: u16,
) -> bool {
    let mut acc = CsumDiff::default();
    if set_quoted(ctx, f, q, dst, to, port, &mut acc).is_err()
        || (snat && set_quoted(ctx, f, q, !dst, other, other_port, &mut acc).is_err())
    {
        return false;
    }
    let at = f.l4 + 2;
    let Ok(c) = ctx.load::<u16>(at) else { return false };
    ctx.store(at, &acc.apply(c), 0).is_ok()
}

/// Where the IP packet `f` ends (its length field: an Ethernet frame may carry padding after it).
#[inline(always)]
fn end(ctx: &TcContext, f: &Flow) -> usize {
    let len = if f.family == FAMILY_V4 {
        ctx.load::<u16>(f.l3 + 2).map_or(0, |l| usize::from(u16::from_be(l)))
    } else {
        ctx.load::<u16>(f.l3 + 4).map_or(0, |l| usize::from(u16::from_be(l)) + IPV6_LEN)
    };
    f.l3 + len
}

/// Rewrite one side of the quote (`dst`: its destination) to `to:port`, with the quote's own checksums;
/// every word changed in the ICMP message (the checksums included) is added to `acc`.
#[inline(always)]
fn set_quoted(
    ctx: &TcContext,
    f: &Flow,
    q: &Flow,
    dst: bool,
    to: &[u32; 4],
    port: u16,
    acc: &mut CsumDiff,
) -> Result<(), i64> {
    let ih = f.l4 + ICMP_LEN;
    let v4 = q.family == FAMILY_V4;
    let (from, from_port) = if dst { (q.daddr, q.dport) } else { (q.saddr, q.sport) };
    let mut addr = CsumDiff::default();
    for i in 0..4 {
        if from[i] != to[i] {
            addr = addr.long(from[i], to[i]);
        }
    }
    let ports =
        if from_port == port { CsumDiff::default() } else { CsumDiff::default().word(from_port, port) };
    if v4 {
        let c: u16 = ctx.load(ih + 10)?;
        let n = addr.apply(c);
        ctx.store(ih + 10, &n, 0)?;
        *acc = acc.word(c, n);
    }
    let udp = q.proto == PROTO_UDP;
    let at = q.l4 + if udp { 6 } else { 16 };
    if at + 2 <= end(ctx, f) {
        let c: u16 = ctx.load(at)?;
        // UDP over IPv4 without a checksum (0) keeps none.
        if !(udp && v4 && c == 0) {
            let mut n = addr.and(ports).apply(c);
            if udp && n == 0 {
                n = 0xffff;
            }
            ctx.store(at, &n, 0)?;
            *acc = acc.word(c, n);
        }
    }
    if v4 {
        ctx.store(ih + if dst { 16 } else { 12 }, &to[0], 0)?;
    } else {
        ctx.store(ih + if dst { 24 } else { 8 }, to, 0)?;
    }
    ctx.store(q.l4 + if dst { 2 } else { 0 }, &port, 0)?;
    *acc = acc.and(addr).and(ports);
    Ok(())
}

/// Rewrite the error's own destination (`dst`, else its source) to `to`: the IPv4 header checksum, or the
/// ICMPv6 checksum's pseudo-header part.
#[inline(always)]
fn set_outer(ctx: &TcContext, f: &Flow, dst: bool, to: &[u32; 4]) -> Result<(), i64> {
    let from = if dst { f.daddr } else { f.saddr };
    if from == *to {
        return Ok(());
    }
    if f.family == FAMILY_V4 {
        ctx.l3_csum_replace(f.l3 + IPV4_CSUM, u64::from(from[0]), u64::from(to[0]), 4)?;
        ctx.store(f.l3 + if dst { IPV4_DST } else { IPV4_SRC }, &to[0], 0)?;
    } else {
        packet::pseudo_v6(ctx, f.l4 + 2, u64::from(BPF_F_PSEUDO_HDR), &from, to)?;
        ctx.store(f.l3 + if dst { IPV6_DST } else { IPV6_SRC }, to, 0)?;
    }
    Ok(())
}
