//! What a tc program may do to a packet, judged from the bytes alone (an independent parser, not the
//! programs'): a verdict among tc's; the length kept; only link addresses, IP addresses, TTL/hop limit, ports
//! and checksums changed (in the outer packet, and in the packet an ICMP error quotes); every checksum that was
//! valid before still valid after; nothing rewritten unless an address of the lab's frontends, node or
//! backends is in it; and with no flow tracked yet, nothing rewritten but a TCP/UDP packet arriving for a
//! frontend. The one exception to the length: an ICMP error the program answers with (`answer`).
use std::net::{IpAddr, SocketAddr};

use super::{
    lab::{FRONTENDS, LB_IP, LOCAL_POD, LOCAL_POD6, NODE, NODE6, REMOTE_POD, REMOTE_POD6},
    packet::{checksum, pseudo},
};

/// tc verdicts the programs may return: `TC_ACT_UNSPEC` (-1), `TC_ACT_OK`, `TC_ACT_SHOT`, `TC_ACT_REDIRECT`.
pub const VERDICTS: [u32; 4] = [u32::MAX, 0, 2, 7];
pub const SHOT: u32 = 2;
pub const REDIRECT: u32 = 7;

/// An IP packet as this parser reads it, at `l3` in the frame.
#[derive(Debug, Clone)]
pub struct View {
    pub v6: bool,
    pub l3: usize,
    /// Where the L4 header starts (after options or extension headers).
    pub l4: usize,
    pub proto: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// A fragment other than the first (no L4 header in it).
    pub later_fragment: bool,
    pub fragment: bool,
    /// The header's length field matches the bytes there are.
    pub complete: bool,
    /// Its IPv4 header length, when the header is whole.
    pub header_len: usize,
    /// IPv6 extension headers other than a Fragment header before the L4 header (the programs pass such
    /// packets on untranslated, by design: `Parsed::Fragment`).
    pub extensions: bool,
}

fn ip_at(b: &[u8], at: usize, v6: bool) -> Option<IpAddr> {
    if v6 {
        let o: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
        Some(IpAddr::from(o))
    } else {
        let o: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(IpAddr::from(o))
    }
}

/// The IP packet at `l3` (its end is the end of `b`).
pub fn view(b: &[u8], l3: usize) -> Option<View> {
    let version = b.get(l3)? >> 4;
    if version == 4 {
        let ihl = usize::from(b[l3] & 0x0f) * 4;
        if ihl < 20 || b.len() < l3 + ihl {
            return None;
        }
        let total = usize::from(u16::from_be_bytes([b[l3 + 2], b[l3 + 3]]));
        let frag = u16::from_be_bytes([b[l3 + 6], b[l3 + 7]]);
        Some(View {
            v6: false,
            l3,
            l4: l3 + ihl,
            proto: b[l3 + 9],
            src: ip_at(b, l3 + 12, false)?,
            dst: ip_at(b, l3 + 16, false)?,
            later_fragment: frag & 0x1fff != 0,
            fragment: frag & 0x3fff != 0,
            complete: total == b.len() - l3,
            header_len: ihl,
            extensions: false,
        })
    } else if version == 6 {
        if b.len() < l3 + 40 {
            return None;
        }
        let payload = usize::from(u16::from_be_bytes([b[l3 + 4], b[l3 + 5]]));
        let (mut next, mut at) = (b[l3 + 6], l3 + 40);
        let (mut fragment, mut later, mut extensions) = (false, false, false);
        for _ in 0..8 {
            match next {
                0 | 43 | 60 => {
                    extensions = true;
                    let len = (usize::from(*b.get(at + 1)?) + 1) * 8;
                    next = *b.get(at)?;
                    at += len;
                }
                44 => {
                    let off = u16::from_be_bytes([*b.get(at + 2)?, *b.get(at + 3)?]);
                    fragment = true;
                    later = off >> 3 != 0;
                    next = *b.get(at)?;
                    at += 8;
                }
                _ => break,
            }
        }
        Some(View {
            v6: true,
            l3,
            l4: at,
            proto: next,
            src: ip_at(b, l3 + 8, true)?,
            dst: ip_at(b, l3 + 24, true)?,
            later_fragment: later,
            fragment,
            complete: payload == b.len() - l3 - 40,
            header_len: 40,
            extensions,
        })
    } else {
        None
    }
}

/// The IP packet of an Ethernet frame (IPv4 or IPv6 right after the 14-byte header; nothing else).
pub fn frame_view(b: &[u8]) -> Option<View> {
    match u16::from_be_bytes([*b.get(12)?, *b.get(13)?]) {
        0x0800 | 0x86dd => view(b, 14).filter(|v| v.v6 == (b[12] == 0x86)),
        _ => None,
    }
}

fn is_icmp_error(v: &View, kind: u8) -> bool {
    if v.v6 { (1..=4).contains(&kind) } else { matches!(kind, 3 | 11 | 12) }
}

/// The packet an ICMP error quotes, if the frame is one with a quote this parser reads.
pub fn quote(b: &[u8], v: &View) -> Option<View> {
    let icmp = if v.v6 { 58 } else { 1 };
    if v.proto != icmp || v.later_fragment || !is_icmp_error(v, *b.get(v.l4)?) {
        return None;
    }
    let q = view(b, v.l4 + 8)?;
    (q.v6 == v.v6).then_some(q)
}

/// What can be judged of a frame's checksums: its IPv4 header's (and a quoted IPv4 header's), its whole
/// segment's (TCP, UDP, ICMP, ICMPv6 with their pseudo-headers). `None` where the bytes cannot say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sums {
    pub header: Option<bool>,
    pub quote_header: Option<bool>,
    pub segment: Option<bool>,
}

fn v4_header_ok(b: &[u8], v: &View) -> Option<bool> {
    (!v.v6).then(|| checksum(&b[v.l3..v.l3 + v.header_len], 0) == 0)
}

pub fn sums(b: &[u8]) -> Sums {
    let Some(v) = frame_view(b) else { return Sums { header: None, quote_header: None, segment: None } };
    let header = v4_header_ok(b, &v);
    let quote_header = quote(b, &v).and_then(|q| v4_header_ok(b, &q));
    let segment = (v.complete && !v.fragment && b.len() >= v.l4).then(|| {
        let seg = &b[v.l4..];
        let (s, d) = (octets(v.src), octets(v.dst));
        match v.proto {
            6 if seg.len() >= 20 => Some(checksum(seg, pseudo(&s, &d, 6, seg.len())) == 0),
            17 if seg.len() >= 8 => {
                Some((!v.v6 && seg[6..8] == [0, 0]) || checksum(seg, pseudo(&s, &d, 17, seg.len())) == 0)
            }
            1 if !v.v6 && seg.len() >= 4 => Some(checksum(seg, 0) == 0),
            58 if v.v6 && seg.len() >= 4 => Some(checksum(seg, pseudo(&s, &d, 58, seg.len())) == 0),
            _ => None,
        }
    });
    Sums { header, quote_header, segment: segment.flatten() }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Byte offsets a translation may change in an IP packet at `v` (addresses, TTL, header checksum, ports and
/// the L4 checksum when its header is there).
fn allowed_in(v: &View, len: usize, allowed: &mut [bool], quoted: bool) {
    let mut allow = |from: usize, to: usize| {
        for a in allowed.iter_mut().take(to.min(len)).skip(from) {
            *a = true;
        }
    };
    if v.v6 {
        allow(v.l3 + 7, v.l3 + 40);
    } else {
        allow(v.l3 + 8, v.l3 + 9);
        allow(v.l3 + 10, v.l3 + 20);
    }
    if v.later_fragment {
        return;
    }
    match v.proto {
        6 => {
            allow(v.l4, v.l4 + 4);
            allow(v.l4 + 16, v.l4 + 18);
        }
        17 => {
            allow(v.l4, v.l4 + 4);
            allow(v.l4 + 6, v.l4 + 8);
        }
        1 | 58 if !quoted => allow(v.l4 + 2, v.l4 + 4),
        _ => {}
    }
}

/// Whether `output` is an ICMP error the program answered the TCP or UDP packet `input` with: no translation
/// turns a TCP or UDP packet into ICMP. By content, not length: an answer is 70 bytes (IPv4) or 110 (IPv6),
/// which a 70-byte input also is (the search's second finding: a frame whose total-length field said 72,
/// answered with a time exceeded of the same frame length, judged as a rewrite of byte 17).
fn answered(input: &[u8], output: &[u8]) -> bool {
    let (Some(i), Some(o)) = (frame_view(input), frame_view(output)) else {
        return output.len() != input.len();
    };
    matches!(i.proto, 6 | 17) && matches!(o.proto, 1 | 58)
}

/// The lab's addresses a translation can be about: frontends, the node (SNAT), backends.
fn known(ip: IpAddr) -> bool {
    [NODE, NODE6, LB_IP, LOCAL_POD, LOCAL_POD6, REMOTE_POD, REMOTE_POD6]
        .iter()
        .any(|k| k.parse::<IpAddr>().expect("lab address") == ip)
}

/// Whether a packet arriving with `v` is addressed to one of the lab's frontends.
fn to_frontend(b: &[u8], v: &View) -> bool {
    if v.later_fragment || !matches!(v.proto, 6 | 17) || b.len() < v.l4 + 4 {
        return false;
    }
    let dport = u16::from_be_bytes([b[v.l4 + 2], b[v.l4 + 3]]);
    FRONTENDS.iter().any(|f| {
        f.proto == v.proto && f.addr.parse::<SocketAddr>().expect("fe") == SocketAddr::new(v.dst, dport)
    })
}

/// Whether `v` opens a flow to a frontend the lab can translate: a whole packet (not a fragment, its length
/// as its header says), TCP with SYN and no ACK or UDP, to a frontend with an endpoint, from a client the
/// frontend admits.
fn new_flow_to_frontend(b: &[u8], v: &View) -> bool {
    if !v.complete || v.fragment || v.extensions || !to_frontend(b, v) {
        return false;
    }
    let syn = v.proto == 17 || b.get(v.l4 + 13).is_some_and(|f| f & 0x12 == 0x02);
    let dport = u16::from_be_bytes([b[v.l4 + 2], b[v.l4 + 3]]);
    let fe = FRONTENDS
        .iter()
        .find(|f| {
            f.proto == v.proto && f.addr.parse::<SocketAddr>().expect("fe") == SocketAddr::new(v.dst, dport)
        })
        .expect("to_frontend found it");
    let has_endpoint = fe.tiers.iter().any(|t| !t.is_empty());
    let admitted = fe.flags & lb_common::FLAG_SOURCE_RANGES == 0
        || matches!(v.src, IpAddr::V4(a) if a.octets()[..3] == [192, 0, 2] && (96..112).contains(&a.octets()[3]));
    syn && has_endpoint && admitted && b.len() >= v.l4 + if v.proto == 6 { 20 } else { 8 }
}

/// Judge one run: `input` through the program (`egress` or ingress) with `tracked_before` conntrack entries,
/// gave `rc` and `output`, leaving `tracked_after`. Panics with what broke.
pub fn judge(
    egress: bool,
    input: &[u8],
    rc: u32,
    output: &[u8],
    tracked_before: usize,
    tracked_after: usize,
) {
    assert!(VERDICTS.contains(&rc), "verdict {rc} is none of tc's");
    if rc == REDIRECT && !egress && answered(input, output) {
        // An ICMP error the program answered the packet with (`super::answer`).
        super::answer::judge(input, output, known);
        return;
    }
    assert_eq!(output.len(), input.len(), "the program changed the packet's length");
    assert!(
        tracked_after <= tracked_before + 2,
        "one packet made {} entries",
        tracked_after - tracked_before
    );
    if output == input && rc != SHOT {
        // A new flow to a frontend, whole and first of its kind, is translated (or dropped, as a drop rule
        // says): the parser must find it wherever its headers put the ports (IPv4 options, extension headers).
        if let Some(v) = frame_view(input) {
            assert!(
                egress || tracked_before != 0 || !new_flow_to_frontend(input, &v),
                "a new {} flow to a frontend passed untranslated: {:?} -> {:?}",
                v.proto,
                v.src,
                v.dst
            );
        }
        return;
    }
    if rc == SHOT {
        return;
    }
    let Some(v) = frame_view(input) else {
        panic!(
            "a frame that is not Ethernet + IP (or not as it says) was rewritten: {input:02x?} -> {output:02x?}"
        )
    };
    let q = quote(input, &v);
    let addresses = [Some(v.src), Some(v.dst), q.as_ref().map(|q| q.src), q.as_ref().map(|q| q.dst)];
    assert!(
        addresses.iter().flatten().any(|ip| known(*ip)),
        "a packet among none of the lab's addresses was rewritten: {addresses:?}"
    );
    if tracked_before == 0 {
        assert!(
            !egress && to_frontend(input, &v),
            "with no flow tracked, a packet that is not a new flow to a frontend was rewritten ({} {:?} -> {:?} proto {})",
            if egress { "egress" } else { "ingress" },
            v.src,
            v.dst,
            v.proto
        );
    }
    let mut allowed = vec![false; input.len()];
    for a in allowed.iter_mut().take(12) {
        *a = true;
    }
    allowed_in(&v, input.len(), &mut allowed, false);
    if let Some(q) = &q {
        allowed_in(q, input.len(), &mut allowed, true);
    }
    for (i, (a, b)) in input.iter().zip(output).enumerate() {
        assert!(
            a == b || allowed[i],
            "byte {i} changed ({a:#04x} -> {b:#04x}), which no translation touches"
        );
    }
    let (before, after) = (sums(input), sums(output));
    for (what, b, a) in [
        ("IPv4 header", before.header, after.header),
        ("quoted IPv4 header", before.quote_header, after.quote_header),
        ("segment", before.segment, after.segment),
    ] {
        assert!(
            b != Some(true) || a == Some(true),
            "the {what} checksum was valid and is not after the rewrite"
        );
    }
}
