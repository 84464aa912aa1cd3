//! Conversions between std addresses and the network-byte-order map layout.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_common::{Backend, FAMILY_MASK, FAMILY_V4, FAMILY_V6, FrontendKey, SCOPE_OUTSIDE};

/// The in-memory (network order) words of an address, as the kernel stores `user_ip4` / `user_ip6`.
pub fn words(ip: IpAddr) -> [u32; 4] {
    match ip {
        IpAddr::V4(v4) => [u32::from_ne_bytes(v4.octets()), 0, 0, 0],
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            [w(0), w(4), w(8), w(12)]
        }
    }
}

/// The address `words` hold, read as `family` (`FAMILY_V6`, else IPv4; a frontend key's scope bit ignored).
pub fn ip_from_words(words: [u32; 4], family: u8) -> IpAddr {
    if family & FAMILY_MASK == FAMILY_V6 {
        let mut o = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(o))
    } else {
        IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))
    }
}

/// `FAMILY_V4` or `FAMILY_V6` of `ip`.
pub fn family(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 }
}

/// The `FRONTENDS` key of a Service's `ip`:`port` over `proto` (an IPPROTO_* number).
pub fn frontend_key(ip: IpAddr, port: u16, proto: u8) -> FrontendKey {
    FrontendKey { addr: words(ip), port: port.to_be(), proto, family: family(ip) }
}

/// The `FRONTENDS` key of `ip`:`port` over `proto` for traffic from outside the node (the tc programs').
pub fn outside_frontend_key(ip: IpAddr, port: u16, proto: u8) -> FrontendKey {
    let mut k = frontend_key(ip, port, proto);
    k.family |= SCOPE_OUTSIDE;
    k
}

/// The map form of an endpoint's `addr` over `proto`, as `SLOTS` and `BACKEND_STATE` hold it.
pub fn backend(addr: SocketAddr, proto: u8) -> Backend {
    Backend { addr: words(addr.ip()), port: addr.port().to_be(), proto, family: family(addr.ip()) }
}

/// The Service address a `FRONTENDS` key stands for.
pub fn frontend_addr(key: &FrontendKey) -> SocketAddr {
    SocketAddr::new(ip_from_words(key.addr, key.family), u16::from_be(key.port))
}

/// The endpoint address a map `Backend` stands for.
pub fn backend_addr(b: &Backend) -> SocketAddr {
    SocketAddr::new(ip_from_words(b.addr, b.family), u16::from_be(b.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_keep_network_order() {
        let a: SocketAddr = "10.96.0.10:80".parse().unwrap();
        let b = backend(a, 6);
        // 10.96.0.10 in memory is the bytes 0a 60 00 0a, as the kernel's user_ip4 holds it.
        assert_eq!(b.addr[0].to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(b.port.to_ne_bytes(), [0, 80]);
        assert_eq!(backend_addr(&b), a);
        let v6: SocketAddr = "[fd00::1:5]:8443".parse().unwrap();
        assert_eq!(backend_addr(&backend(v6, 17)), v6);
        let k = frontend_key(v6.ip(), 53, 17);
        assert_eq!(frontend_addr(&k), "[fd00::1:5]:53".parse().unwrap());
    }
}
