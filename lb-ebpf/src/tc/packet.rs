//! Reading a packet's flow and rewriting its addresses and ports, with the checksums updated incrementally by
//! the kernel's helpers (`bpf_l3_csum_replace`, `bpf_l4_csum_replace` with `BPF_F_PSEUDO_HDR` for the
//! addresses, which are in the TCP/UDP pseudo-header): they know the skb's checksum state, so a
//! `CHECKSUM_PARTIAL` packet (veth and most NICs' offload) keeps a valid partial sum instead of a full one
//! computed over a header the device will finish. Loads and stores go through `bpf_skb_load_bytes` /
//! `bpf_skb_store_bytes`, which also work on non-linear skbs (GSO packets on egress).
use aya_ebpf::bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR};
use lb_common::{FAMILY_V4, FAMILY_V6, PROTO_TCP, PROTO_UDP};

use super::{fragment, frame::Frame};
use crate::maps::FragKey;

/// Ethernet header length: where the IP header starts on an Ethernet-like device (veth, physical NICs,
/// bridges); on an L3 device (WireGuard, IPIP and other tunnels: `tc_egress_l3`) it starts at 0.
pub(crate) const ETH_LEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
/// Offsets within the IP header (add `Flow::l3`).
pub(crate) const IPV4_CSUM: usize = 10;
const IPV4_TTL: usize = 8;
pub(crate) const IPV4_SRC: usize = 12;
pub(crate) const IPV4_DST: usize = 16;
const IPV6_HOP: usize = 7;
/// IPv6 next-header values: the Fragment header, and the other extension headers that may come before TCP/UDP
/// (hop-by-hop options, routing, destination options).
pub(crate) const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_OTHER_EXT: [u8; 3] = [0, 43, 60];
pub(crate) const IPV6_SRC: usize = 8;
pub(crate) const IPV6_DST: usize = 24;
pub(crate) const IPV6_LEN: usize = 40;
/// IP protocol numbers of ICMP and ICMPv6.
pub(crate) const PROTO_ICMP: u8 = 1;
pub(crate) const PROTO_ICMPV6: u8 = 58;

/// TCP flag bits (byte 13 of the header).
pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;

/// A packet's flow, as it lies in the packet (addresses and ports in network order).
#[derive(Clone, Copy, Default)]
pub(crate) struct Flow {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    /// TCP flags (0 for UDP).
    pub tcp_flags: u8,
    /// TCP sequence and acknowledgement numbers as they lie in the packet (0 for UDP).
    pub seq: u32,
    pub ack: u32,
    /// `fragment::WHOLE`, `FIRST` or `LATER` (a later fragment has no L4 header: its ports are the first
    /// fragment's, and only its addresses are rewritten).
    pub frag: u8,
    /// The id of a fragment as it lies in the packet: IPv4's 16 bits (in the first two bytes), or the
    /// IPv6 Fragment header's 32.
    pub frag_id: u32,
    /// Offset of the IP header: `ETH_LEN`, or 0 on an L3 device.
    pub l3: usize,
    /// Offset of the L4 header.
    pub l4: usize,
}

/// What `parse` found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A TCP or UDP packet whose ports are in it (written to the `Flow`).
    Flow,
    /// A later fragment whose first fragment was not translated, or IPv6 with an extension header other
    /// than one Fragment header before TCP/UDP: passed on untranslated.
    Fragment,
    /// ICMP (IPv4) or ICMPv6 directly after the IP header: the outer addresses, the family, `proto` and
    /// `l4` (the ICMP header's offset) are written to the `Flow`; the ports and flags are not.
    Icmp,
    /// Anything else (ARP, another protocol, a truncated header): not ours.
    Other,
}

/// The flow of the packet in `ctx`, into `f` (fully written when the answer is `Parsed::Flow`); its IP header
/// at `l3` (`ETH_LEN`, or 0 on an L3 device, whose protocol is the skb's).
#[inline(always)]
pub(crate) fn parse<C: Frame>(ctx: &C, f: &mut Flow, l3: usize) -> Parsed {
    let eth_proto = if l3 == ETH_LEN {
        let Ok(p) = ctx.load::<u16>(12) else { return Parsed::Other };
        u16::from_be(p)
    } else {
        u16::from_be(ctx.l3_protocol())
    };
    f.l3 = l3;
    f.saddr = [0; 4];
    f.daddr = [0; 4];
    f.tcp_flags = 0;
    f.seq = 0;
    f.ack = 0;
    f.frag = fragment::WHOLE;
    if eth_proto == ETH_P_IP {
        let Ok(vihl) = ctx.load::<u8>(l3) else { return Parsed::Other };
        let ihl = usize::from(vihl & 0x0f) * 4;
        if vihl >> 4 != 4 || ihl < 20 {
            return Parsed::Other;
        }
        let Ok(frag) = ctx.load::<u16>(l3 + 6) else { return Parsed::Other };
        let Ok(proto) = ctx.load::<u8>(l3 + 9) else { return Parsed::Other };
        let icmp = proto == PROTO_ICMP;
        if proto != PROTO_TCP && proto != PROTO_UDP && !icmp {
            return Parsed::Other;
        }
        let (Ok(s), Ok(d), Ok(id)) =
            (ctx.load::<u32>(l3 + IPV4_SRC), ctx.load::<u32>(l3 + IPV4_DST), ctx.load::<u16>(l3 + 4))
        else {
            return Parsed::Other;
        };
        f.saddr[0] = s;
        f.daddr[0] = d;
        f.proto = proto;
        f.family = FAMILY_V4;
        f.l4 = l3 + ihl;
        // More-fragments set or a non-zero offset: only the first fragment carries the ports; the later ones
        // get them from it (`fragment`). An ICMP error is small enough never to be fragmented by a sender
        // that follows RFC 1812 (4.3.2.3).
        let frag = u16::from_be(frag);
        if frag & 0x3fff != 0 {
            if icmp {
                return Parsed::Other;
            }
            f.frag_id = u32::from(id);
            // The fragment offset (13 bits) is zero in the first fragment only.
            let later = frag.trailing_zeros() < 13;
            if let Some(p) = fragment_kind(f, later) {
                return p;
            }
        }
        if icmp {
            return Parsed::Icmp;
        }
    } else if eth_proto == ETH_P_IPV6 {
        let Ok(mut next) = ctx.load::<u8>(l3 + 6) else { return Parsed::Other };
        let (Ok(s), Ok(d)) = (ctx.load::<[u32; 4]>(l3 + IPV6_SRC), ctx.load::<[u32; 4]>(l3 + IPV6_DST))
        else {
            return Parsed::Other;
        };
        f.saddr = s;
        f.daddr = d;
        f.family = FAMILY_V6;
        f.l4 = l3 + IPV6_LEN;
        let mut later = None;
        if next == NEXTHDR_FRAGMENT {
            // next header, reserved, offset (13 bits) | 2 reserved | more fragments, id (32 bits).
            let (Ok(inner), Ok(off_m), Ok(id)) =
                (ctx.load::<u8>(f.l4), ctx.load::<u16>(f.l4 + 2), ctx.load::<u32>(f.l4 + 4))
            else {
                return Parsed::Other;
            };
            let off_m = u16::from_be(off_m);
            // Offset 0 and no more fragments: an atomic fragment (RFC 6946), the datagram whole.
            if off_m & 0xfff9 != 0 {
                later = Some(off_m >> 3 != 0);
            }
            next = inner;
            f.frag_id = id;
            f.l4 += 8;
        }
        let icmp = next == PROTO_ICMPV6;
        if next != PROTO_TCP && next != PROTO_UDP && !icmp {
            // Counted only when it could be a frontend's: a multicast destination (ff00::/8: MLD reports carry
            // a hop-by-hop header) never is.
            let unicast = d[0].to_ne_bytes()[0] != 0xff;
            return if unicast && NEXTHDR_OTHER_EXT.contains(&next) {
                Parsed::Fragment
            } else {
                Parsed::Other
            };
        }
        f.proto = next;
        if let Some(later) = later {
            // An ICMPv6 error is never fragmented (RFC 4443 2.4 (c): at most the minimum MTU).
            if icmp {
                return Parsed::Other;
            }
            if let Some(p) = fragment_kind(f, later) {
                return p;
            }
        }
        if icmp {
            return Parsed::Icmp;
        }
    } else {
        return Parsed::Other;
    }
    l4(ctx, f)
}

/// The TCP/UDP header of `f` at `f.l4`: its ports, and TCP's flags and sequence numbers.
#[inline(always)]
fn l4<C: Frame>(ctx: &C, f: &mut Flow) -> Parsed {
    let (Ok(sp), Ok(dp)) = (ctx.load::<u16>(f.l4), ctx.load::<u16>(f.l4 + 2)) else { return Parsed::Other };
    f.sport = sp;
    f.dport = dp;
    if f.proto == PROTO_TCP {
        let (Ok(flags), Ok(seq), Ok(ack)) =
            (ctx.load::<u8>(f.l4 + 13), ctx.load::<u32>(f.l4 + 4), ctx.load::<u32>(f.l4 + 8))
        else {
            return Parsed::Other;
        };
        f.tcp_flags = flags;
        f.seq = seq;
        f.ack = ack;
    }
    Parsed::Flow
}

/// The datagram a fragment of `f` belongs to, as `fragment` keeps it: its addresses, id, protocol and family.
#[inline(always)]
pub(crate) fn frag_key(f: &Flow) -> FragKey {
    FragKey { saddr: f.saddr, daddr: f.daddr, id: f.frag_id, proto: f.proto, family: f.family, _pad: [0; 2] }
}

/// A fragment (`later`: not the first) of the datagram whose addresses, protocol, family and id `f` holds:
/// the first is marked and parsed on as a whole packet (`None`); a later one takes its ports from the first
/// (`Parsed::Flow`), or is passed on without them (`Parsed::Fragment`).
#[inline(always)]
fn fragment_kind(f: &mut Flow, later: bool) -> Option<Parsed> {
    if !later {
        f.frag = fragment::FIRST;
        return None;
    }
    let Some((sport, dport)) = fragment::ports(&frag_key(f)) else { return Some(Parsed::Fragment) };
    f.sport = sport;
    f.dport = dport;
    f.frag = fragment::LATER;
    Some(Parsed::Flow)
}

/// Offset of the L4 checksum and the flags its updates take (UDP over IPv4 may carry no checksum: 0 stays 0,
/// `BPF_F_MARK_MANGLED_0`; UDP over IPv6 always has one).
#[inline(always)]
fn l4_csum(f: &Flow) -> (usize, u64) {
    if f.proto == PROTO_TCP {
        (f.l4 + 16, 0)
    } else if f.family == FAMILY_V4 {
        (f.l4 + 6, u64::from(BPF_F_MARK_MANGLED_0))
    } else {
        (f.l4 + 6, 0)
    }
}

/// Replace one address of the packet (`dst`: the destination, else the source) by `to`.
#[inline(always)]
fn set_addr<C: Frame>(ctx: &C, f: &Flow, dst: bool, to: &[u32; 4]) -> Result<(), i64> {
    let (csum, extra) = l4_csum(f);
    let pseudo = u64::from(BPF_F_PSEUDO_HDR) | extra;
    let from = if dst { f.daddr } else { f.saddr };
    if f.family == FAMILY_V4 {
        let off = f.l3 + if dst { IPV4_DST } else { IPV4_SRC };
        // A later fragment holds no L4 checksum (the first fragment's update covers the datagram).
        if f.frag != fragment::LATER {
            ctx.l4_csum_replace(csum, u64::from(from[0]), u64::from(to[0]), pseudo | 4)?;
        }
        ctx.l3_csum_replace(f.l3 + IPV4_CSUM, u64::from(from[0]), u64::from(to[0]), 4)?;
        ctx.store(off, &to[0])?;
    } else {
        let off = f.l3 + if dst { IPV6_DST } else { IPV6_SRC };
        if f.frag != fragment::LATER {
            pseudo_v6(ctx, csum, pseudo, &from, to)?;
        }
        ctx.store(off, to)?;
    }
    Ok(())
}

/// `bpf_l4_csum_replace`'s flag for an IPv6 packet (Linux 6.16): on a `CHECKSUM_COMPLETE` skb, a change of
/// the pseudo-header's addresses must not be folded into `skb->csum`, which covers the IPv6 header's bytes
/// only as they were received. Older kernels refuse the flag (`EINVAL`).
const BPF_F_IPV6: u64 = 1 << 7;
const EINVAL: i64 = 22;

/// Update the L4 checksum at `csum` for an IPv6 address changed from `from` to `to` (`flags`: the pseudo-header
/// flag and any other), with `BPF_F_IPV6` where the kernel has it.
#[inline(always)]
pub(crate) fn pseudo_v6<C: Frame>(
    ctx: &C,
    csum: usize,
    flags: u64,
    from: &[u32; 4],
    to: &[u32; 4],
) -> Result<(), i64> {
    let mut v6 = BPF_F_IPV6;
    for i in 0..4 {
        match ctx.l4_csum_replace(csum, u64::from(from[i]), u64::from(to[i]), flags | v6 | 4) {
            Err(e) if e == -EINVAL && v6 != 0 => {
                // A kernel before the flag: the same update without it (what it always did).
                v6 = 0;
                ctx.l4_csum_replace(csum, u64::from(from[i]), u64::from(to[i]), flags | 4)?;
            }
            r => r?,
        }
    }
    Ok(())
}

/// Replace one port of the packet (`dst`: the destination, else the source) by `to` (network order).
#[inline(always)]
fn set_port<C: Frame>(ctx: &C, f: &Flow, dst: bool, to: u16) -> Result<(), i64> {
    if f.frag == fragment::LATER {
        return Ok(());
    }
    let (csum, extra) = l4_csum(f);
    let from = if dst { f.dport } else { f.sport };
    ctx.l4_csum_replace(csum, u64::from(from), u64::from(to), extra | 2)?;
    ctx.store(f.l4 + if dst { 2 } else { 0 }, &to)?;
    Ok(())
}

/// Rewrite the destination to `addr:port` (DNAT, or the reply of an SNAT flow).
#[inline(always)]
pub(crate) fn set_dst<C: Frame>(ctx: &C, f: &Flow, addr: &[u32; 4], port: u16) -> Result<(), i64> {
    if *addr != f.daddr {
        set_addr(ctx, f, true, addr)?;
    }
    if port != f.dport {
        set_port(ctx, f, true, port)?;
    }
    Ok(())
}

/// Rewrite the source to `addr:port` (SNAT, or a reply's source back to the frontend).
#[inline(always)]
pub(crate) fn set_src<C: Frame>(ctx: &C, f: &Flow, addr: &[u32; 4], port: u16) -> Result<(), i64> {
    if *addr != f.saddr {
        set_addr(ctx, f, false, addr)?;
    }
    if port != f.sport {
        set_port(ctx, f, false, port)?;
    }
    Ok(())
}

/// The IP packet's length (IPv4's total length; IPv6's payload length and its fixed header).
#[inline(always)]
pub(crate) fn ip_len<C: Frame>(ctx: &C, f: &Flow) -> Result<u16, i64> {
    if f.family == FAMILY_V4 {
        Ok(u16::from_be(ctx.load::<u16>(f.l3 + 2)?))
    } else {
        Ok(u16::from_be(ctx.load::<u16>(f.l3 + 4)?).saturating_add(IPV6_LEN as u16))
    }
}

/// The packet's TTL (IPv4) or hop limit (IPv6).
#[inline(always)]
pub(crate) fn ttl<C: Frame>(ctx: &C, f: &Flow) -> Result<u8, i64> {
    ctx.load(f.l3 + if f.family == FAMILY_V4 { IPV4_TTL } else { IPV6_HOP })
}

/// Decrement the TTL (IPv4, with its header checksum) or hop limit (IPv6) of a packet this node forwards
/// itself (a redirect bypasses the stack's forwarding, which would do it). `false`: it would reach zero
/// (`route::check` answered such a packet before it was rewritten).
#[inline(always)]
pub(crate) fn decrement_ttl<C: Frame>(ctx: &C, f: &Flow) -> Result<bool, i64> {
    if f.family == FAMILY_V4 {
        // TTL and protocol form one 16-bit word of the header checksum.
        let word: u16 = ctx.load(f.l3 + IPV4_TTL)?;
        let ttl = word.to_ne_bytes()[0];
        if ttl <= 1 {
            return Ok(false);
        }
        let new = u16::from_ne_bytes([ttl - 1, word.to_ne_bytes()[1]]);
        ctx.l3_csum_replace(f.l3 + IPV4_CSUM, u64::from(word), u64::from(new), 2)?;
        ctx.store(f.l3 + IPV4_TTL, &new)?;
    } else {
        let hop: u8 = ctx.load(f.l3 + IPV6_HOP)?;
        if hop <= 1 {
            return Ok(false);
        }
        ctx.store(f.l3 + IPV6_HOP, &(hop - 1))?;
    }
    Ok(true)
}
