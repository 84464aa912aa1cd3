//! Direct server return (`lb_common::dsr`): on the ingress node, a DSR flow's packets leave for the backend
//! with the client's address and the frontend in an IPv4 option (`forward`); on the backend's node, the
//! option becomes the reply entry of the flow (`learn`), which `tc_egress` applies to the backend's reply.
use aya_ebpf::{bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_NET, programs::TcContext};
use lb_common::{
    CT_DIR_OUT, CtAddr, CtKey, CtValue, DSR_OPT_LEN, LOCAL_DSR, NS_DROP_REWRITE, NS_DSR_LEARNED,
    NS_DSR_NO_ROOM, NS_TRANSLATED, PROTO_TCP, option_words, parse_option,
};

use super::{
    DROP, Flow, conntrack, fragment,
    frame::Frame,
    packet::{self, IPV4_CSUM},
    route,
};
use crate::{counters::count_ns, maps::LOCAL_BACKENDS};

/// The base IPv4 header's length: where the option goes.
pub(crate) const IPV4_BASE: usize = 20;

/// A packet of the DSR flow whose forward entry is `v`: to the backend (`v.a`), the client's address kept,
/// the frontend it was sent to (its destination as it arrived) in the option. A TCP segment with no room for
/// the option within the route's MTU is answered with "fragmentation needed" for 8 bytes less (as the stack
/// answers for a tunnel); a UDP datagram without room goes without it (`NS_DSR_NO_ROOM`: the backend's node
/// knows the flow from its first datagram, which `admit` gave DSR only with room). The tc verdict.
#[inline(never)]
pub(crate) fn forward(ctx: &TcContext, f: &Flow, v: &CtValue) -> i32 {
    let grow = u16::from(DSR_OPT_LEN);
    let answer = f.frag != fragment::LATER;
    let mut verdict = route::lookup(ctx, f, &f.saddr, &v.a, grow);
    let mut option = true;
    if route::too_big(verdict) && f.proto != PROTO_TCP {
        option = false;
        verdict = route::lookup(ctx, f, &f.saddr, &v.a, 0);
    }
    let verdict = route::respond(ctx, f, verdict, answer, if option { grow } else { 0 });
    if verdict != route::GO {
        return verdict;
    }
    let (frontend, frontend_port) = (f.daddr[0], f.dport);
    if packet::set_dst(ctx, f, &v.a, v.a_port).is_err() {
        count_ns(NS_DROP_REWRITE);
        return DROP;
    }
    if f.frag == fragment::FIRST {
        fragment::record(&packet::frag_key(f), f.sport, f.dport);
    }
    if option {
        match insert_option(ctx, f, frontend, frontend_port) {
            Ok(true) => {}
            Ok(false) => count_ns(NS_DSR_NO_ROOM),
            Err(()) => {
                count_ns(NS_DROP_REWRITE);
                return DROP;
            }
        }
    } else {
        count_ns(NS_DSR_NO_ROOM);
    }
    count_ns(NS_TRANSLATED);
    route::send(ctx, f)
}

/// Grow the IPv4 header of the packet by the option announcing `addr`:`port` (network order), after the
/// base header, and fix the header's length fields and checksum. `Ok(false)`: not grown (the header has
/// options already, or the kernel cannot grow this packet: a UDP GSO packet); `Err`: grown but not written
/// (the packet must not leave).
#[inline(always)]
fn insert_option(ctx: &TcContext, f: &Flow, addr: u32, port: u16) -> Result<bool, ()> {
    let Some((first, total)) = base_header(ctx, f) else { return Ok(false) };
    // BPF_ADJ_ROOM_NET: the room opens after the base network header (20 bytes for IPv4); what lies before
    // it moves, the L4 header and payload stay. Without BPF_F_ADJ_ROOM_FIXED_GSO, a TCP GSO packet's
    // segment size shrinks by as much, so its segments keep their length on the wire.
    if ctx.adjust_room(i32::from(DSR_OPT_LEN), BPF_ADJ_ROOM_NET, 0).is_err() {
        return Ok(false);
    }
    if write_option(ctx, f.l3, (first, total), addr, port) { Ok(true) } else { Err(()) }
}

/// The first 16-bit word (version, IHL, TOS) and the total length of the packet's IPv4 header, as they lie in
/// the packet, if the header is 20 bytes (no options: the room after it is the L4 header's).
#[inline(always)]
pub(crate) fn base_header<C: Frame>(ctx: &C, f: &Flow) -> Option<(u16, u16)> {
    let first = ctx.load::<u16>(f.l3).ok()?;
    if first.to_ne_bytes()[0] != 0x45 {
        return None;
    }
    Some((first, ctx.load::<u16>(f.l3 + 2).ok()?))
}

/// Once the 8 bytes after the IPv4 header at `l3` are the packet's (grown by tc or XDP), write the option
/// announcing `addr`:`port` there and fix the header: IHL 7, the total length 8 more (`first` and `total`
/// as `base_header` read them before), the checksum updated for the three. Whether every write succeeded.
#[inline(always)]
pub(crate) fn write_option<C: Frame>(
    ctx: &C,
    l3: usize,
    (first, total): (u16, u16),
    addr: u32,
    port: u16,
) -> bool {
    let words = option_words(addr, port);
    let mut bytes = first.to_ne_bytes();
    bytes[0] = 0x47;
    let grown = u16::from_ne_bytes(bytes);
    let new_total = (u16::from_be(total) + u16::from(DSR_OPT_LEN)).to_be();
    let csum = l3 + IPV4_CSUM;
    ctx.store(l3 + IPV4_BASE, &words).is_ok()
        && ctx.store(l3, &grown).is_ok()
        && ctx.store(l3 + 2, &new_total).is_ok()
        && ctx.l3_csum_replace(csum, u64::from(first), u64::from(grown), 2).is_ok()
        && ctx.l3_csum_replace(csum, u64::from(total), u64::from(new_total), 2).is_ok()
        && ctx.l3_csum_replace(csum, 0, u64::from(words[0]), 4).is_ok()
        && ctx.l3_csum_replace(csum, 0, u64::from(words[1]), 4).is_ok()
}

/// On the backend's node: the packet `f` (IPv4, its header 28 bytes: one 8-byte option) to a local
/// endpoint, if its option is a DSR option and DSR is on here (`LOCAL_DSR`), makes or refreshes the flow's
/// reply entry (backend -> client, `CT_DIR_OUT`: the frontend as the reply's source). The packet itself goes
/// on untouched, the option with it.
#[inline(never)]
pub(crate) fn learn(ctx: &TcContext, f: &Flow) {
    let Ok(words) = ctx.load::<[u32; 2]>(f.l3 + IPV4_BASE) else { return };
    let Some((addr, port)) = parse_option(words) else { return };
    let Some(local) = LOCAL_BACKENDS.get_ptr(CtAddr { addr: f.daddr }) else { return };
    // SAFETY: a plain read of a hash value.
    if unsafe { *local } & LOCAL_DSR == 0 {
        return;
    }
    let key = CtKey {
        saddr: f.daddr,
        daddr: f.saddr,
        sport: f.dport,
        dport: f.sport,
        proto: f.proto,
        family: f.family,
        dir: CT_DIR_OUT,
        _pad: 0,
    };
    if conntrack::learn(&key, addr, port, f, conntrack::now()) {
        count_ns(NS_DSR_LEARNED);
    }
}
