//! ICMP errors the node sends itself about a packet of an SNAT flow it cannot forward: its TTL would run
//! out (time exceeded), or it is larger than the next hop's MTU ("fragmentation needed" with the MTU,
//! ICMPv6 "packet too big"). The SNAT path forwards past the stack (`route`), so the stack's forwarding,
//! which answers these, never sees the packet; without an answer a client behind a smaller MTU on the way
//! to the backend (an overlay, a tunnel) never learns it, and its large segments vanish (Cilium answers
//! the same cases from BPF, `bpf/lib/icmp6.h` and nodeport.h's frag-needed reply).
//!
//! The packet becomes the error in place: its first bytes (the IP header and 8 bytes after it, as RFC 792
//! asks; 48 bytes for IPv6, enough for the receiver to find its socket) are quoted, the skb is cut to the
//! error's length, the new headers are written over it and it goes back out of the device it came in by,
//! to the MAC it came from. Its source is the address the packet was sent to (the node port's address or
//! the load-balancer IP: where the client's packet stopped), its destination the packet's sender.
//! IPv4 packets with options are not answered (dropped, counted as before): the quote is of fixed length.
//!
//! Rate: time exceeded at most `BURST` at once and one a millisecond after, per CPU (a token bucket; the
//! kernel's `icmp_msgs_per_sec` default is 1,000 a second with a burst of 50, for the whole node), so a
//! flood of packets with TTL 1 cannot make the node a reflector; what is over the rate is dropped and
//! counted (`NS_ICMP_RATE_LIMITED`). "Fragmentation needed" is not limited, as the kernel does not limit
//! it. It is also sent about an IPv4 packet without DF, which the stack would have fragmented (a program
//! cannot): a sender that does not do path MTU discovery ignores it. No error goes to a multicast,
//! broadcast, unspecified or loopback source, nor about an IPv6 packet with extension headers.
use aya_ebpf::{
    bindings::BPF_F_RECOMPUTE_CSUM,
    helpers::{bpf_csum_diff, bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes},
    macros::map,
    maps::PerCpuArray,
    programs::TcContext,
};
use lb_common::{FAMILY_V4, NS_ICMP_RATE_LIMITED, NS_ICMP_SENT};

use super::{
    DROP, Flow,
    conntrack::now,
    packet::{ETH_LEN, PROTO_ICMP, PROTO_ICMPV6},
};
use crate::counters::count_ns;

/// The error to send: time exceeded in transit.
pub(crate) const TIME_EXCEEDED: u8 = 0;
/// The error to send: the packet is too big for the next hop (its MTU goes in the error).
pub(crate) const TOO_BIG: u8 = 1;

/// Errors a CPU may send at once, and the time it takes to earn one more.
const BURST: u64 = 50;
const EVERY_NS: u64 = 1_000_000;

/// The quote: the IPv4 header (no options) and 8 bytes; the IPv6 header and 8 bytes.
const V4_QUOTE: usize = 28;
const V6_QUOTE: usize = 48;
/// The error's IP packet: header, ICMP header (8 bytes), quote.
const V4_LEN: usize = 20 + 8 + V4_QUOTE;
const V6_LEN: usize = V6_HEADER + 8 + V6_QUOTE;
/// IPv6's fixed header.
const V6_HEADER: usize = 40;
/// The TTL / hop limit of the errors (the kernel's default, `ip_default_ttl`, `hop_limit`).
const TTL: u8 = 64;

/// The error being built, off the stack (96 bytes, and `bpf_csum_diff` sums it in 32-bit words).
#[repr(C, align(4))]
struct Out {
    ip: [u8; V6_LEN],
    macs: [u8; 12],
}

#[map]
static ICMP_OUT: PerCpuArray<Out> = PerCpuArray::with_max_entries(1, 0);

/// A CPU's token bucket: tokens left at `at_ns`.
#[repr(C)]
struct Bucket {
    at_ns: u64,
    tokens: u64,
}

#[map]
static ICMP_BUCKET: PerCpuArray<Bucket> = PerCpuArray::with_max_entries(1, 0);

/// Answer the packet `f` (as it arrived) with the error `kind` (`TIME_EXCEEDED`, `TOO_BIG` with `mtu`):
/// the tc verdict (a redirect back out of the device it came in by, or a drop).
#[inline(never)]
pub(crate) fn error(ctx: &TcContext, f: &Flow, kind: u8, mtu: u16) -> i32 {
    if f.l3 != ETH_LEN {
        // Sent back to the MAC the packet came from: only on an Ethernet device's ingress.
        return DROP;
    }
    if !unicast_sender(f) || (f.family != FAMILY_V4 && f.l4 != ETH_LEN + V6_HEADER) {
        // No error to a multicast, broadcast, unspecified or loopback source (`__icmp_send`'s rule); none
        // about an IPv6 packet with extension headers, whose 48-byte quote would end before the ports the
        // receiver looks its socket up by.
        return DROP;
    }
    // "Packet too big" is never limited, as the kernel never limits it (path MTU discovery must work): it
    // is smaller than the packet it answers. Time exceeded is.
    if kind != TOO_BIG && !take_token() {
        count_ns(NS_ICMP_RATE_LIMITED);
        return DROP;
    }
    let Some(o) = ICMP_OUT.get_ptr_mut(0) else { return DROP };
    // SAFETY: this CPU's scratch value; a tc program runs with bottom halves disabled, so no other run on
    // this CPU uses it until this one returns.
    let o = unsafe { &mut *o };
    let built = if f.family == FAMILY_V4 { v4(ctx, f, o, kind, mtu) } else { v6(ctx, f, o, kind, mtu) };
    let Some(len) = built else { return DROP };
    // The frame's Ethernet header, the MACs swapped: back to the hop the packet came from.
    if !load(ctx, 0, &mut o.macs) {
        return DROP;
    }
    // SAFETY: the context's skb pointer is valid for the program's run.
    let cut = unsafe { bpf_skb_change_tail(ctx.skb.skb, (ETH_LEN + len) as u32, 0) };
    if cut != 0 {
        return DROP;
    }
    // `BPF_F_RECOMPUTE_CSUM`: a received skb's `CHECKSUM_COMPLETE` sum follows the new bytes, so the
    // receiving end of a veth does not find it stale.
    let flags = u64::from(BPF_F_RECOMPUTE_CSUM);
    let (Some(to), Some(from)) = (o.macs.last_chunk::<6>(), o.macs.first_chunk::<6>()) else { return DROP };
    let stored =
        ctx.store(0, to, flags).is_ok() && ctx.store(6, from, flags).is_ok() && store_ip(ctx, o, len, flags);
    if !stored {
        return DROP;
    }
    count_ns(NS_ICMP_SENT);
    // SAFETY: the context's skb pointer is valid; helper without memory arguments.
    unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 }
}

/// Write the error's IP packet (`len` bytes of `o.ip`) after the Ethernet header.
#[inline(always)]
fn store_ip(ctx: &TcContext, o: &Out, len: usize, flags: u64) -> bool {
    if len == V4_LEN {
        let ip: &[u8; V4_LEN] = o.ip.first_chunk().unwrap_or(&[0; V4_LEN]);
        ctx.store(ETH_LEN, ip, flags).is_ok()
    } else {
        ctx.store(ETH_LEN, &o.ip, flags).is_ok()
    }
}

/// Copy `dst.len()` bytes of the packet from `offset` into `dst` (a map value's bytes). The raw helper with
/// the constant length: `TcContext::load_bytes` cuts the length to the packet's, which the verifier cannot
/// prove non-zero.
#[inline(always)]
fn load(ctx: &TcContext, offset: usize, dst: &mut [u8]) -> bool {
    // SAFETY: `dst` is `dst.len()` writable bytes; the helper checks the packet's bounds itself.
    let rc = unsafe {
        bpf_skb_load_bytes(ctx.skb.skb.cast(), offset as u32, dst.as_mut_ptr().cast(), dst.len() as u32)
    };
    rc == 0
}

/// Whether the packet's source may be sent an error: not multicast, broadcast (255.255.255.255, within
/// 240.0.0.0/4), unspecified or loopback.
#[inline(always)]
fn unicast_sender(f: &Flow) -> bool {
    let first = f.saddr[0].to_ne_bytes()[0];
    if f.family == FAMILY_V4 {
        return first != 0 && first != 127 && first < 224;
    }
    let loopback = f.saddr == [0, 0, 0, 1u32.to_be()];
    first != 0xff && f.saddr != [0; 4] && !loopback
}

/// One token of this CPU's bucket, refilled for the time since its last use; `false` when it is empty.
#[inline(always)]
fn take_token() -> bool {
    let Some(b) = ICMP_BUCKET.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's value (see `error`).
    let b = unsafe { &mut *b };
    let t = now();
    let earned = t.saturating_sub(b.at_ns) / EVERY_NS;
    if earned > 0 {
        b.tokens = (b.tokens + earned).min(BURST);
        b.at_ns = t;
    }
    if b.tokens == 0 {
        return false;
    }
    b.tokens -= 1;
    true
}

/// The ones' complement sum of `words` added to `seed` (`bpf_csum_diff` with nothing removed), unfolded.
#[inline(always)]
#[expect(
    clippy::cast_sign_loss,
    reason = "the helper's result is a 32-bit sum, never an error for these sizes"
)]
fn sum(words: *const u8, len: usize, seed: u32) -> u32 {
    // SAFETY: `words` points at `len` readable bytes, `len` a multiple of 4 (the helper reads them as words
    // and writes nothing).
    unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, words.cast_mut().cast(), len as u32, seed) as u32 }
}

/// The 16-bit checksum of a sum, as it lies in the packet.
#[inline(always)]
fn fold(mut s: u32) -> [u8; 2] {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    (!(s as u16)).to_ne_bytes()
}

/// The IPv4 error into `o.ip`: its length, `None` for a packet with options or one too short to quote.
#[inline(always)]
fn v4(ctx: &TcContext, f: &Flow, o: &mut Out, kind: u8, mtu: u16) -> Option<usize> {
    let quote = o.ip.get_mut(28..28 + V4_QUOTE)?;
    if !load(ctx, ETH_LEN, quote) {
        return None;
    }
    if quote[0] != 0x45 {
        return None;
    }
    let h = &mut o.ip;
    h[..4].copy_from_slice(&[0x45, 0, 0, V4_LEN as u8]);
    h[4..12].copy_from_slice(&[0, 0, 0, 0, TTL, PROTO_ICMP, 0, 0]);
    h[12..16].copy_from_slice(&f.daddr[0].to_ne_bytes());
    h[16..20].copy_from_slice(&f.saddr[0].to_ne_bytes());
    let (icmp_type, rest) = if kind == TOO_BIG { (3, u32::from(mtu)) } else { (11, 0) };
    // Type 3 code 4 "fragmentation needed" (the next-hop MTU in the second word's low half); type 11 code 0.
    h[20..24].copy_from_slice(&[icmp_type, if kind == TOO_BIG { 4 } else { 0 }, 0, 0]);
    h[24..28].copy_from_slice(&rest.to_be_bytes());
    let header = fold(sum(h.as_ptr(), 20, 0));
    h[10..12].copy_from_slice(&header);
    let message = fold(sum(h[20..].as_ptr(), 8 + V4_QUOTE, 0));
    h[22..24].copy_from_slice(&message);
    Some(V4_LEN)
}

/// The ICMPv6 error into `o.ip`: its length, `None` for a packet too short to quote.
#[inline(always)]
fn v6(ctx: &TcContext, f: &Flow, o: &mut Out, kind: u8, mtu: u16) -> Option<usize> {
    let quote = o.ip.get_mut(48..48 + V6_QUOTE)?;
    if !load(ctx, ETH_LEN, quote) {
        return None;
    }
    let h = &mut o.ip;
    let payload = (8 + V6_QUOTE) as u16;
    h[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    h[4..6].copy_from_slice(&payload.to_be_bytes());
    h[6] = PROTO_ICMPV6;
    h[7] = TTL;
    for i in 0..4 {
        h[8 + 4 * i..12 + 4 * i].copy_from_slice(&f.daddr[i].to_ne_bytes());
        h[24 + 4 * i..28 + 4 * i].copy_from_slice(&f.saddr[i].to_ne_bytes());
    }
    // Type 3 code 0 "hop limit exceeded in transit"; type 2 "packet too big" with the MTU.
    let (icmp_type, rest) = if kind == TOO_BIG { (2, u32::from(mtu)) } else { (3, 0) };
    h[40..44].copy_from_slice(&[icmp_type, 0, 0, 0]);
    h[44..48].copy_from_slice(&rest.to_be_bytes());
    // The pseudo-header: both addresses, the ICMPv6 length and next header 58, as 32-bit words.
    let tail: [u32; 2] = [u32::from(payload).to_be(), u32::from(PROTO_ICMPV6).to_be()];
    let pseudo = sum(h[8..40].as_ptr(), 32, 0);
    let pseudo = sum(tail.as_ptr().cast(), 8, pseudo);
    let message = fold(sum(h[40..].as_ptr(), 8 + V6_QUOTE, pseudo));
    h[42..44].copy_from_slice(&message);
    Some(V6_LEN)
}
