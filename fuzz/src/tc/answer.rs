//! The one case where a tc program changes a packet's length: it answers a packet of an SNAT flow it cannot
//! forward (its TTL would run out, or it is larger than the next hop's MTU) with an ICMP error of its own,
//! sent back out of the device the packet came in by. Judged from the bytes alone: the MACs swapped, from
//! the address the packet was sent to back to its sender, the packet's first bytes quoted as they arrived,
//! a time exceeded or "fragmentation needed" / "packet too big" error, every checksum valid. (The CI search's
//! first run after the programs began answering stopped on the oracle's old rule, "the length kept": a
//! 50-byte SYN with TTL 1 to a node port whose endpoint is remote, answered with a 70-byte time exceeded.)
use std::net::IpAddr;

use super::{
    oracle::{View, frame_view},
    packet::{checksum, pseudo},
};

/// Judge `output`, the error a program sent for `input` (ingress, verdict `TC_ACT_REDIRECT`). `known` says
/// whether an address is one of the lab's. Panics with what broke.
pub fn judge(input: &[u8], output: &[u8], known: impl Fn(IpAddr) -> bool) {
    let v: View =
        frame_view(input).unwrap_or_else(|| panic!("an answer to a frame that is not IP: {input:02x?}"));
    assert!(known(v.dst), "an answer to a packet for none of the lab's addresses: {:?}", v.dst);
    assert_eq!(output[..6], input[6..12], "the answer goes back to the MAC the packet came from");
    assert_eq!(output[6..12], input[..6], "from the MAC it was sent to");
    assert_eq!(output[12..14], input[12..14], "the same ethertype");
    let sender_ok = match v.src {
        IpAddr::V4(a) => !(a.is_multicast() || a.is_broadcast() || a.is_unspecified() || a.is_loopback()),
        IpAddr::V6(a) => !(a.is_multicast() || a.is_unspecified() || a.is_loopback()),
    };
    assert!(sender_ok, "an error sent to {:?}", v.src);
    if v.v6 {
        assert_eq!(output.len(), 14 + 96, "IPv6 header, ICMPv6 header, 48 bytes quoted");
        assert_eq!(output[14] >> 4, 6);
        assert_eq!(u16::from_be_bytes([output[18], output[19]]), 56, "payload length");
        assert_eq!(output[20], 58, "ICMPv6");
        assert_eq!(output[22..38], input[38..54], "from the address the packet was sent to");
        assert_eq!(output[38..54], input[22..38], "to its sender");
        assert!(
            matches!((output[54], output[55]), (2 | 3, 0)),
            "packet too big or time exceeded: {:?}",
            &output[54..56]
        );
        assert_eq!(output[62..110], input[14..62], "the packet quoted as it arrived");
        let acc = pseudo(&output[22..38], &output[38..54], 58, 56);
        assert_eq!(checksum(&output[54..], acc), 0, "the ICMPv6 checksum");
    } else {
        assert_eq!(output.len(), 14 + 56, "IPv4 header, ICMP header, 28 bytes quoted");
        assert_eq!(output[14], 0x45);
        assert_eq!(output[23], 1, "ICMP");
        assert_eq!(output[26..30], input[30..34], "from the address the packet was sent to");
        assert_eq!(output[30..34], input[26..30], "to its sender");
        assert!(
            matches!((output[34], output[35]), (3, 4) | (11, 0)),
            "fragmentation needed or time exceeded: {:?}",
            &output[34..36]
        );
        assert_eq!(output[42..70], input[14..42], "the packet quoted as it arrived");
        assert_eq!(checksum(&output[14..34], 0), 0, "the IPv4 header checksum");
        assert_eq!(checksum(&output[34..70], 0), 0, "the ICMP checksum");
    }
}
