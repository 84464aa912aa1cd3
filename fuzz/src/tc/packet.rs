//! Packets from `arbitrary` choices, built here independently of the programs' parser: Ethernet (or a VLAN
//! tag, or garbage) carrying IPv4 (options, any IHL, fragments, a wrong total length or header checksum) or
//! IPv6 (extension headers, a Fragment header), carrying TCP (any flags and data offset), UDP (with or
//! without a checksum) or ICMP/ICMPv6 (errors quoting a packet built the same way, cut anywhere), cut
//! anywhere. Addresses and ports are drawn mostly from the lab's (frontends, node, pods, clients) so that
//! frontends and flows are hit; a port may be the one an earlier packet of the input was given (the SNAT port
//! a reply must come back to).
use arbitrary::Arbitrary;

use super::lab::{
    CLIENT, CLIENT6, LB_IP, LOCAL_POD, LOCAL_POD6, NEXT_HOP, NODE, NODE6, REMOTE_POD, REMOTE_POD6, STRANGER,
};

const V4_POOL: [&str; 7] = [CLIENT, NODE, LOCAL_POD, REMOTE_POD, LB_IP, STRANGER, NEXT_HOP];
const V6_POOL: [&str; 5] = [CLIENT6, NODE6, LOCAL_POD6, REMOTE_POD6, "2001:db8::99"];
const PORT_POOL: [u16; 10] = [30080, 30053, 30081, 30054, 30082, 80, 8080, 53, 40000, 61000];

/// An address: one of the lab's, or any.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Addr {
    Pool(u8),
    Any(u128),
}

/// A port: one of the lab's, one an earlier packet of the input carried, or any.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Port {
    Pool(u8),
    /// The source (false) or destination port of the previous packet as the program left it.
    Previous(bool),
    Any(u16),
}

#[derive(Arbitrary, Debug, Clone)]
pub enum L4 {
    Tcp {
        sport: Port,
        dport: Port,
        flags: u8,
        extra_words: u8,
        options: Vec<u8>,
    },
    Udp {
        sport: Port,
        dport: Port,
        no_checksum: bool,
    },
    /// ICMP (IPv4) or ICMPv6: its type, code, the 4 bytes after the checksum, and what it quotes.
    Icmp {
        kind: u8,
        code: u8,
        rest: u32,
        quote: Option<Box<Ip>>,
        quote_cut: u16,
    },
    Other {
        proto: u8,
    },
}

#[derive(Arbitrary, Debug, Clone)]
pub struct Ip {
    pub v6: bool,
    pub src: Addr,
    pub dst: Addr,
    pub ttl: u8,
    /// IPv4: option bytes (IHL grows by their words, at most 10); IPv6: extension headers before the L4
    /// header (hop-by-hop, routing, destination options), each `(kind, length words)`.
    pub options: Vec<u8>,
    pub extensions: Vec<(u8, u8)>,
    /// A fragment: (more fragments, offset in 8-byte units, id).
    pub fragment: Option<(bool, u16, u32)>,
    /// Lies told by the header: a raw IHL, a total (payload) length off by this much, a bad header checksum.
    pub bad_ihl: Option<u8>,
    pub length_off: i8,
    pub bad_checksum: bool,
    pub l4: L4,
    pub payload: Vec<u8>,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum Frame {
    Ip(Ip),
    /// The same behind an 802.1Q tag.
    Vlan(u16, Ip),
    /// Any bytes.
    Raw(Vec<u8>),
}

/// One packet of an input: the frame, which program sees it, and where it is cut.
#[derive(Arbitrary, Debug, Clone)]
pub struct Step {
    pub egress: bool,
    pub frame: Frame,
    pub cut: Option<u16>,
}

/// What a fuzz input is: up to four packets in turn through the same state.
#[derive(Arbitrary, Debug, Clone)]
pub struct Input {
    pub steps: Vec<Step>,
}

/// Ports the previous packet left with (source, destination), for `Port::Previous`.
pub type Previous = Option<(u16, u16)>;

fn addr(a: Addr, v6: bool) -> Vec<u8> {
    match (a, v6) {
        (Addr::Pool(i), false) => {
            let ip: std::net::Ipv4Addr = V4_POOL[usize::from(i) % V4_POOL.len()].parse().expect("pool");
            ip.octets().to_vec()
        }
        (Addr::Pool(i), true) => {
            let ip: std::net::Ipv6Addr = V6_POOL[usize::from(i) % V6_POOL.len()].parse().expect("pool");
            ip.octets().to_vec()
        }
        (Addr::Any(x), false) => (x as u32).to_be_bytes().to_vec(),
        (Addr::Any(x), true) => x.to_be_bytes().to_vec(),
    }
}

fn port(p: Port, prev: Previous) -> u16 {
    match p {
        Port::Pool(i) => PORT_POOL[usize::from(i) % PORT_POOL.len()],
        Port::Previous(dst) => prev.map_or(61_000, |(s, d)| if dst { d } else { s }),
        Port::Any(x) => x,
    }
}

/// RFC 1071 one's-complement sum, folded (not inverted).
pub fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
        acc += u32::from(w);
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

pub fn checksum(data: &[u8], acc: u32) -> u16 {
    !(sum16(data, acc) as u16)
}

/// The pseudo-header sum of an L4 segment of `len` bytes.
pub fn pseudo(src: &[u8], dst: &[u8], proto: u8, len: usize) -> u32 {
    let mut p = Vec::with_capacity(40);
    p.extend_from_slice(src);
    p.extend_from_slice(dst);
    if src.len() == 4 {
        p.extend_from_slice(&[0, proto]);
        p.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        p.extend_from_slice(&(len as u32).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, proto]);
    }
    sum16(&p, 0)
}

impl Ip {
    /// The IP packet (no link header), checksums right unless the input says otherwise. `depth` 1 is a
    /// quoted packet, which quotes nothing itself.
    pub fn bytes(&self, prev: Previous, depth: u8) -> Vec<u8> {
        let (src, dst) = (addr(self.src, self.v6), addr(self.dst, self.v6));
        let (proto, mut l4) = match &self.l4 {
            L4::Tcp { sport, dport, flags, extra_words, options } => {
                let words = usize::from(*extra_words % 11);
                let mut h = vec![0u8; 20 + words * 4];
                h[0..2].copy_from_slice(&port(*sport, prev).to_be_bytes());
                h[2..4].copy_from_slice(&port(*dport, prev).to_be_bytes());
                h[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
                h[12] = ((5 + words) as u8) << 4;
                h[13] = *flags;
                h[14..16].copy_from_slice(&64_240u16.to_be_bytes());
                for (d, s) in h[20..].iter_mut().zip(options) {
                    *d = *s;
                }
                h.extend_from_slice(&self.payload);
                (lb_common::PROTO_TCP, h)
            }
            L4::Udp { sport, dport, .. } => {
                let mut h = vec![0u8; 8];
                h[0..2].copy_from_slice(&port(*sport, prev).to_be_bytes());
                h[2..4].copy_from_slice(&port(*dport, prev).to_be_bytes());
                h[4..6].copy_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
                h.extend_from_slice(&self.payload);
                (lb_common::PROTO_UDP, h)
            }
            L4::Icmp { kind, code, rest, quote, quote_cut } => {
                let mut h = vec![*kind, *code, 0, 0];
                h.extend_from_slice(&rest.to_be_bytes());
                match quote {
                    Some(q) if depth == 0 => {
                        let mut inner = q.bytes(prev, 1);
                        inner.truncate(usize::from(*quote_cut).max(1));
                        h.extend_from_slice(&inner);
                    }
                    _ => h.extend_from_slice(&self.payload),
                }
                (if self.v6 { 58 } else { 1 }, h)
            }
            L4::Other { proto } => (*proto, self.payload.clone()),
        };
        let fragment = self.fragment.map(|(more, off, id)| (more, off & 0x1fff, id));
        // Checksums over the whole segment as sent (a later fragment's bytes are not a segment: left as made).
        let l4_len = l4.len();
        match &self.l4 {
            L4::Tcp { .. } => {
                let c = checksum(&l4, pseudo(&src, &dst, proto, l4_len));
                l4[16..18].copy_from_slice(&c.to_be_bytes());
            }
            L4::Udp { no_checksum, .. } => {
                if !(*no_checksum && !self.v6) {
                    let mut c = checksum(&l4, pseudo(&src, &dst, proto, l4_len));
                    if c == 0 {
                        c = 0xffff;
                    }
                    l4[6..8].copy_from_slice(&c.to_be_bytes());
                }
            }
            L4::Icmp { .. } => {
                let acc = if self.v6 { pseudo(&src, &dst, proto, l4_len) } else { 0 };
                let c = checksum(&l4, acc);
                l4[2..4].copy_from_slice(&c.to_be_bytes());
            }
            L4::Other { .. } => {}
        }
        if self.v6 {
            self.v6_header(&src, &dst, proto, l4, fragment)
        } else {
            self.v4_header(&src, &dst, proto, l4, fragment)
        }
    }

    fn v4_header(
        &self,
        src: &[u8],
        dst: &[u8],
        proto: u8,
        l4: Vec<u8>,
        frag: Option<(bool, u16, u32)>,
    ) -> Vec<u8> {
        let mut options: Vec<u8> = self.options.iter().take(40).copied().collect();
        while options.len() % 4 != 0 {
            options.push(0); // end of options list padding
        }
        let ihl = 5 + options.len() / 4;
        let mut h = vec![0u8; 20];
        h[0] = 0x40 | self.bad_ihl.map_or(ihl as u8, |i| i & 0x0f);
        let total = (20 + options.len() + l4.len()) as i32 + i32::from(self.length_off);
        h[2..4].copy_from_slice(&(total.clamp(0, 0xffff) as u16).to_be_bytes());
        let (id, frag_field) = match frag {
            Some((more, off, id)) => (id as u16, (u16::from(more) << 13) | off),
            None => (0x1234, 0x4000), // don't fragment
        };
        h[4..6].copy_from_slice(&id.to_be_bytes());
        h[6..8].copy_from_slice(&frag_field.to_be_bytes());
        h[8] = self.ttl;
        h[9] = proto;
        h[12..16].copy_from_slice(src);
        h[16..20].copy_from_slice(dst);
        h.extend_from_slice(&options);
        let mut c = checksum(&h, 0);
        if self.bad_checksum {
            c ^= 0x5a5a;
        }
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(&l4);
        h
    }

    fn v6_header(
        &self,
        src: &[u8],
        dst: &[u8],
        proto: u8,
        l4: Vec<u8>,
        frag: Option<(bool, u16, u32)>,
    ) -> Vec<u8> {
        // Extension headers in order, each naming the next; a Fragment header last if there is one.
        let mut kinds: Vec<(u8, usize)> = self
            .extensions
            .iter()
            .take(3)
            .map(|(k, len)| ([0u8, 43, 60][usize::from(*k) % 3], usize::from(*len % 4)))
            .collect();
        if let Some(f) = frag {
            kinds.push((44, usize::from(f.0)));
        }
        let mut ext = Vec::new();
        for (i, (kind, words)) in kinds.iter().enumerate() {
            let next = kinds.get(i + 1).map_or(proto, |n| n.0);
            if *kind == 44 {
                let (more, off, id) = frag.expect("a fragment header");
                ext.push(next);
                ext.push(0);
                ext.extend_from_slice(&((off << 3) | u16::from(more)).to_be_bytes());
                ext.extend_from_slice(&id.to_be_bytes());
            } else {
                let len = 8 + words * 8;
                let mut e = vec![0u8; len];
                e[0] = next;
                e[1] = *words as u8;
                // PadN over the rest.
                e[2] = 1;
                e[3] = (len - 4) as u8;
                ext.extend_from_slice(&e);
            }
        }
        let first = kinds.first().map_or(proto, |k| k.0);
        let mut h = vec![0u8; 40];
        h[0] = 0x60;
        let payload = (ext.len() + l4.len()) as i32 + i32::from(self.length_off);
        h[4..6].copy_from_slice(&(payload.clamp(0, 0xffff) as u16).to_be_bytes());
        h[6] = first;
        h[7] = self.ttl;
        h[8..24].copy_from_slice(src);
        h[24..40].copy_from_slice(dst);
        h.extend_from_slice(&ext);
        h.extend_from_slice(&l4);
        h
    }
}

const NODE_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x64];

impl Step {
    /// The frame as the program gets it.
    pub fn bytes(&self, prev: Previous) -> Vec<u8> {
        let (dmac, smac) = if self.egress { (PEER_MAC, NODE_MAC) } else { (NODE_MAC, PEER_MAC) };
        let mut f = Vec::with_capacity(128);
        f.extend_from_slice(&dmac);
        f.extend_from_slice(&smac);
        match &self.frame {
            Frame::Ip(ip) => {
                f.extend_from_slice(&(if ip.v6 { 0x86ddu16 } else { 0x0800 }).to_be_bytes());
                f.extend_from_slice(&ip.bytes(prev, 0));
            }
            Frame::Vlan(tag, ip) => {
                f.extend_from_slice(&0x8100u16.to_be_bytes());
                f.extend_from_slice(&(tag & 0x0fff).to_be_bytes());
                f.extend_from_slice(&(if ip.v6 { 0x86ddu16 } else { 0x0800 }).to_be_bytes());
                f.extend_from_slice(&ip.bytes(prev, 0));
            }
            Frame::Raw(bytes) => {
                f.clear();
                f.extend_from_slice(bytes);
            }
        }
        if let Some(cut) = self.cut {
            f.truncate(usize::from(cut));
        }
        // BPF_PROG_TEST_RUN needs at least an Ethernet header.
        f.resize(f.len().max(14), 0);
        f
    }
}
