//! Direct server return (`tierlb agent --dsr`), IPv4: the node a client's packet reaches (the ingress node)
//! translates the destination to a backend on another node and keeps the client's address as the source, as
//! Cilium's `bpf-lb-mode=dsr` with `bpf-lb-dsr-dispatch=opt` does; the original destination (the frontend's
//! address and port) travels to the backend's node in an IPv4 option of 8 bytes after the base header. That
//! node's `tc_ingress` reads it and writes the reply entry a local backend's flow has (backend -> client,
//! `CT_DIR_OUT`), so its `tc_egress` gives the pod's reply the frontend's address as its source, and the reply
//! goes to the client straight from the backend's node: it never passes the ingress node, and no SNAT port is
//! spent.
//!
//! Why an IP option and not IP-in-IP: the option costs 8 bytes of MTU where an IPv4 tunnel header costs 20,
//! the backend's node needs no tunnel device nor decapsulation (the packet is delivered to the pod as routed,
//! the option with it: Linux ignores an option type it does not know on a packet it receives), and the packet
//! stays addressed to the pod, so the network between the nodes routes it as pod traffic. The cost: routers
//! may send packets with options on a slow path, and a network that drops them (some firewalls do) breaks
//! DSR; IPv6 has no such option here (Cilium uses an extension header): IPv6 flows take SNAT, counted.
//!
//! The option's type is 0x9e: copied on fragmentation (bit 7), class 0, number 30, the experimental value of
//! RFC 4727 (Cilium's is 0x9a, number 26, unassigned). Its bytes: type, length (8), the frontend's port and
//! its IPv4 address, both in network order.

/// `FrontendValue::flags` of an outside frontend whose new flows to a backend on another node take DSR
/// (`--dsr`, externalTrafficPolicy Cluster); IPv6 ones and those without room take SNAT (`NS_DSR_SNAT`).
pub const FLAG_DSR: u32 = 1 << 5;

/// `CtValue::flags` of a forward entry whose packets leave with the client's address and the option
/// (no reply entry on this node: the replies do not come back through it).
pub const CT_DSR: u16 = 1 << 9;

/// `MAP_LOCAL_BACKENDS` value bits: an endpoint of this node (always set)...
pub const LOCAL_ENDPOINT: u32 = 1 << 0;
/// ... whose flows an option may announce: the agent runs with `--dsr`, so its `tc_ingress` learns the
/// option's frontend for packets to this endpoint (without it, an option is ignored: a packet from outside
/// cannot make the node rewrite a pod's replies unless DSR is on).
pub const LOCAL_DSR: u32 = 1 << 1;

/// The option's type byte: copied (0x80), class 0, number 30 (RFC 4727's experimental value).
pub const DSR_OPT_TYPE: u8 = 0x9e;
/// The option's length, its type and length bytes included; what the IPv4 header grows by.
pub const DSR_OPT_LEN: u8 = 8;

/// The option for frontend `addr`:`port` (both network order, as they lie in the packet), as its two
/// 32-bit words lie in the packet, each in network order: (type, length, port), then the address.
#[must_use]
pub const fn option_words(addr: u32, port: u16) -> [u32; 2] {
    let p = port.to_ne_bytes();
    let w0 = u32::from_be_bytes([DSR_OPT_TYPE, DSR_OPT_LEN, p[0], p[1]]).to_be();
    [w0, addr]
}

/// The frontend an option's two words (as loaded from the packet) announce: (address, port), network order;
/// `None` if they are not this option.
#[must_use]
pub const fn parse_option(words: [u32; 2]) -> Option<(u32, u16)> {
    let b = words[0].to_ne_bytes();
    if b[0] != DSR_OPT_TYPE || b[1] != DSR_OPT_LEN {
        return None;
    }
    Some((words[1], u16::from_ne_bytes([b[2], b[3]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_carries_the_frontend_byte_for_byte() {
        // 198.51.100.10:80 and 192.0.2.1:30080, as a packet holds them.
        let cases = [([198, 51, 100, 10], 80u16), ([192, 0, 2, 1], 30080)];
        for (addr, port) in cases {
            let a = u32::from_ne_bytes(addr);
            let p = port.to_be();
            let words = option_words(a, p);
            let mut bytes = [0u8; 8];
            bytes[..4].copy_from_slice(&words[0].to_ne_bytes());
            bytes[4..].copy_from_slice(&words[1].to_ne_bytes());
            let want = [0x9e, 8, (port >> 8) as u8, port as u8, addr[0], addr[1], addr[2], addr[3]];
            assert_eq!(bytes, want, "{addr:?}:{port}");
            assert_eq!(parse_option(words), Some((a, p)), "{addr:?}:{port} read back");
        }
    }

    #[test]
    fn other_options_are_not_read_as_dsr() {
        let cases = [
            ("record route", [0x07, 8, 0, 0]),
            ("another length", [DSR_OPT_TYPE, 12, 0, 80]),
            ("Cilium's type", [0x9a, 8, 0, 80]),
            ("no-op padding", [0x01, 0x01, 0x01, 0x01]),
        ];
        for (name, w0) in cases {
            assert_eq!(parse_option([u32::from_ne_bytes(w0), 0x0a64_33c6]), None, "{name}");
        }
    }
}
