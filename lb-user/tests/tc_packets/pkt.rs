//! An independent packet builder (its checksums: `lb_testkit::inet`, RFC 1071): the packets the tests send, and the ones they expect.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_common::{PROTO_TCP, PROTO_UDP};

use super::{CLIENT_MAC, NODE_MAC};

pub(crate) use lb_testkit::inet::{checksum, sum16};

pub(crate) fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Pkt {
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    pub(crate) proto: u8,
    /// TCP flags.
    pub(crate) flags: u8,
    pub(crate) ttl: u8,
    pub(crate) smac: [u8; 6],
    pub(crate) dmac: [u8; 6],
    /// UDP over IPv4 without a checksum (0).
    pub(crate) no_udp_csum: bool,
    /// Payload bytes.
    pub(crate) len: usize,
    /// TCP sequence and acknowledgement numbers.
    pub(crate) seq: u32,
    pub(crate) ack: u32,
    /// IPv4 options after the base header (a multiple of 4 bytes; `dsr_option`).
    pub(crate) ip_options: Option<[u8; 8]>,
}

/// The DSR option announcing frontend `fe` (IPv4), written byte by byte from its definition: type 0x9e
/// (copied, class 0, number 30), length 8, the port, the address.
pub(crate) fn dsr_option(fe: &str) -> [u8; 8] {
    let fe: SocketAddr = fe.parse().unwrap();
    let IpAddr::V4(a) = fe.ip() else { panic!("an IPv4 frontend") };
    let [p0, p1] = fe.port().to_be_bytes();
    let [a0, a1, a2, a3] = a.octets();
    [0x9e, 8, p0, p1, a0, a1, a2, a3]
}

impl Pkt {
    pub(crate) fn tcp(src: &str, dst: &str, flags: u8) -> Self {
        Self {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto: PROTO_TCP,
            flags,
            ttl: 64,
            smac: CLIENT_MAC,
            dmac: NODE_MAC,
            no_udp_csum: false,
            len: 18,
            seq: 1000,
            ack: 0,
            ip_options: None,
        }
    }
    pub(crate) fn udp(src: &str, dst: &str) -> Self {
        Self { proto: PROTO_UDP, flags: 0, ..Self::tcp(src, dst, 0) }
    }
    pub(crate) fn to(self, dst: SocketAddr) -> Self {
        Self { dst, ..self }
    }
    pub(crate) fn from(self, src: SocketAddr) -> Self {
        Self { src, ..self }
    }
    pub(crate) fn seq_ack(self, seq: u32, ack: u32) -> Self {
        Self { seq, ack, ..self }
    }

    /// The packet's bytes with every checksum computed from scratch.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let payload: Vec<u8> = b"tierlb north-south".iter().copied().cycle().take(self.len).collect();
        let mut l4 = Vec::new();
        l4.extend_from_slice(&self.src.port().to_be_bytes());
        l4.extend_from_slice(&self.dst.port().to_be_bytes());
        if self.proto == PROTO_TCP {
            l4.extend_from_slice(&self.seq.to_be_bytes());
            l4.extend_from_slice(&self.ack.to_be_bytes());
            l4.push(5 << 4);
            l4.push(self.flags);
            l4.extend_from_slice(&65535u16.to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
        } else {
            l4.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
        l4.extend_from_slice(&payload);
        let (s, d) = (octets(self.src.ip()), octets(self.dst.ip()));
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&s);
        pseudo.extend_from_slice(&d);
        if self.src.is_ipv4() {
            pseudo.extend_from_slice(&[0, self.proto]);
            pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        } else {
            pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, self.proto]);
        }
        let mut c = checksum(&l4, sum16(&pseudo, 0));
        if self.proto == PROTO_UDP && c == 0 {
            c = 0xffff;
        }
        if !(self.proto == PROTO_UDP && self.no_udp_csum) {
            let at = if self.proto == PROTO_TCP { 16 } else { 6 };
            l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        let options = self.ip_options.as_ref().map_or(&[][..], |o| &o[..]);
        frame(self.smac, self.dmac, (self.src.ip(), self.dst.ip()), self.proto, self.ttl, true, options, &l4)
    }
}

/// An Ethernet frame carrying an IP packet of `proto` with payload `l4` (the IPv4 header's checksum
/// computed here), from `src` to `dst`. `df`: IPv4 id 0x1234 and DF set, as Linux sets it on TCP and on UDP
/// with path MTU discovery on; else id 0 and no flags, as the node's ICMP errors are sent. `options`: IPv4
/// options after the base header (its length grows by theirs).
#[expect(clippy::too_many_arguments, reason = "a frame's fields, each set by the tests")]
fn frame(
    smac: [u8; 6],
    dmac: [u8; 6],
    (src, dst): (IpAddr, IpAddr),
    proto: u8,
    ttl: u8,
    df: bool,
    options: &[u8],
    l4: &[u8],
) -> Vec<u8> {
    let (s, d) = (octets(src), octets(dst));
    let mut out = Vec::new();
    out.extend_from_slice(&dmac);
    out.extend_from_slice(&smac);
    if src.is_ipv4() {
        out.extend_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(options.len() % 4, 0, "IPv4 options fill 32-bit words");
        let header = 20 + options.len();
        let mut ip = vec![0x40 | (header / 4) as u8, 0];
        ip.extend_from_slice(&((header + l4.len()) as u16).to_be_bytes());
        ip.extend_from_slice(if df { &[0x12, 0x34, 0x40, 0] } else { &[0, 0, 0, 0] }); // id, flags
        ip.extend_from_slice(&[ttl, proto, 0, 0]);
        ip.extend_from_slice(&s);
        ip.extend_from_slice(&d);
        ip.extend_from_slice(options);
        let c = checksum(&ip, 0);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
    } else {
        out.extend_from_slice(&0x86ddu16.to_be_bytes());
        out.extend_from_slice(&[0x60, 0, 0, 0]);
        out.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        out.extend_from_slice(&[proto, ttl]);
        out.extend_from_slice(&s);
        out.extend_from_slice(&d);
    }
    out.extend_from_slice(l4);
    out
}

/// An ICMP (IPv4) or ICMPv6 error from `src` to `dst` quoting the IP packet of `quote` (its first
/// `quote_len` bytes: a router may quote as little as the IP header and 8 bytes), every checksum computed
/// here (ICMPv6's with its pseudo-header).
#[derive(Clone, Copy)]
pub(crate) struct IcmpError {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) kind: u8,
    pub(crate) code: u8,
    /// The header's second word: the next-hop MTU of "fragmentation needed" and "packet too big".
    pub(crate) rest: u32,
    pub(crate) quote: Pkt,
    pub(crate) quote_len: Option<usize>,
    /// Quote only the first of `fragments(quote, at, id)` (at, id), not the whole packet.
    pub(crate) quote_first_fragment: Option<(usize, u16)>,
    pub(crate) ttl: u8,
    pub(crate) smac: [u8; 6],
    pub(crate) dmac: [u8; 6],
    /// IPv4 id 0 and no DF: an error the node's tc program sends (a router's carries its own).
    pub(crate) from_node: bool,
}

impl IcmpError {
    /// `kind`/`code` from `src` to `dst` about `quote`, quoted whole, arriving from the client's MAC.
    pub(crate) fn new(src: &str, dst: &str, kind: u8, code: u8, rest: u32, quote: Pkt) -> Self {
        Self {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            kind,
            code,
            rest,
            quote,
            quote_len: None,
            quote_first_fragment: None,
            ttl: 64,
            smac: CLIENT_MAC,
            dmac: NODE_MAC,
            from_node: false,
        }
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut q = match self.quote_first_fragment {
            Some((at, id)) => fragments(&self.quote, at, id)[0][14..].to_vec(),
            None => self.quote.bytes()[14..].to_vec(),
        };
        if let Some(n) = self.quote_len {
            q.truncate(n);
        }
        let mut m = vec![self.kind, self.code, 0, 0];
        m.extend_from_slice(&self.rest.to_be_bytes());
        m.extend_from_slice(&q);
        let proto = if self.src.is_ipv4() { 1 } else { 58 };
        let acc = if self.src.is_ipv4() {
            0
        } else {
            let mut pseudo = octets(self.src);
            pseudo.extend_from_slice(&octets(self.dst));
            pseudo.extend_from_slice(&(m.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 58]);
            sum16(&pseudo, 0)
        };
        let c = checksum(&m, acc);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        frame(self.smac, self.dmac, (self.src, self.dst), proto, self.ttl, !self.from_node, &[], &m)
    }
}

/// Whether every checksum of `p` (IPv4 header, TCP/UDP with its pseudo-header) verifies, computed here.
pub(crate) fn checksums_valid(p: &[u8]) -> bool {
    let v4 = u16::from_be_bytes([p[12], p[13]]) == 0x0800;
    let ihl = usize::from(p[14] & 0x0f) * 4;
    let (l3_len, proto, s, d) =
        if v4 { (ihl, p[23], &p[26..30], &p[30..34]) } else { (40, p[20], &p[22..38], &p[38..54]) };
    if v4 && checksum(&p[14..14 + ihl], 0) != 0 {
        return false;
    }
    let l4 = &p[14 + l3_len..];
    if proto == PROTO_UDP && v4 && l4[6..8] == [0, 0] {
        return true; // no checksum
    }
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(s);
    pseudo.extend_from_slice(d);
    if v4 {
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    } else {
        pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, proto]);
    }
    checksum(l4, sum16(&pseudo, 0)) == 0
}

/// The IPv4 destination and port of the frame `p`.
pub(crate) fn dst_of(p: &[u8]) -> SocketAddr {
    let ip = Ipv4Addr::new(p[30], p[31], p[32], p[33]);
    SocketAddr::new(ip.into(), u16::from_be_bytes([p[36], p[37]]))
}

pub(crate) fn src_of(p: &[u8]) -> SocketAddr {
    let v4 = u16::from_be_bytes([p[12], p[13]]) == 0x0800;
    if v4 {
        let ip = Ipv4Addr::new(p[26], p[27], p[28], p[29]);
        SocketAddr::new(ip.into(), u16::from_be_bytes([p[34], p[35]]))
    } else {
        let o: [u8; 16] = p[22..38].try_into().unwrap();
        SocketAddr::new(Ipv6Addr::from(o).into(), u16::from_be_bytes([p[54], p[55]]))
    }
}

/// The frame `p` split at L4 byte `at` (a multiple of 8) into two fragments, as a sender fragments a
/// datagram larger than its MTU: the first with the TCP/UDP header and More Fragments set, the second at
/// offset `at`; IPv4: DF clear, IP id `id` in both, each header's checksum computed here; IPv6: `fragments6`.
pub(crate) fn fragments(p: &Pkt, at: usize, id: u16) -> [Vec<u8>; 2] {
    if p.src.is_ipv6() {
        return fragments6(p, at, u32::from(id));
    }
    assert!(at.is_multiple_of(8));
    let whole = p.bytes();
    let (hdr, l4) = whole.split_at(34);
    let piece = |frag: u16, data: &[u8]| {
        let mut f = hdr.to_vec();
        f[16..18].copy_from_slice(&((20 + data.len()) as u16).to_be_bytes());
        f[18..20].copy_from_slice(&id.to_be_bytes());
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f[24..26].copy_from_slice(&[0, 0]);
        let c = checksum(&f[14..34], 0);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(data);
        f
    };
    [piece(0x2000, &l4[..at]), piece((at / 8) as u16, &l4[at..])]
}

/// The IPv6 frame `p` split as `fragments` splits an IPv4 one: a Fragment header (id `id`) directly after
/// the fixed header of each, More Fragments set in the first.
fn fragments6(p: &Pkt, at: usize, id: u32) -> [Vec<u8>; 2] {
    assert!(at.is_multiple_of(8));
    let whole = p.bytes();
    let (hdr, l4) = whole.split_at(54);
    let piece = |off_m: u16, data: &[u8]| {
        let mut f = hdr.to_vec();
        f[18..20].copy_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        let proto = f[20];
        f[20] = 44;
        f.extend_from_slice(&[proto, 0]);
        f.extend_from_slice(&off_m.to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(data);
        f
    };
    [piece(1, &l4[..at]), piece(at as u16, &l4[at..])]
}
