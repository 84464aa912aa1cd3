//! Reverse state: which VIP a socket asked for (so recvmsg and getpeername show it, not the backend), and
//! which connected UDP sockets the agent may have to destroy. The maps, their keys and values.
use core::mem::size_of;

use bytemuck::{Pod, Zeroable};

use crate::{Backend, FrontendKey, PROTO_TCP};

/// Reverse translation of unconnected UDP sends and of the TCP connects whose `MAP_REVERSE_TCP` slot another
/// open socket holds, for getpeername and recvmsg: such a TCP socket has one entry under
/// `ReverseKey::tcp(cookie)` whatever it connects to (a reconnect after a failed connect overwrites it), an
/// unconnected UDP socket one per backend it sent to, under (cookie, backend). An LRU; `sock_release` deletes
/// a closing socket's entries.
pub const MAP_REVERSE: &str = "REVERSE";
/// Reverse translation of TCP connects, first: an array of `REVERSE_TCP_SLOTS` `TcpReverse` entries, the
/// socket with cookie `c` in slot `tcp_slot(c)` if that slot is free or already its own; a socket whose slot
/// another live socket holds has its entry in `MAP_REVERSE` instead. `sock_release` frees the slot. An array
/// element is written in place with no lock and no allocation, where an LRU insert pops a free element under
/// a lock and links it into a bucket (about half of what tierlb added to a connect, BENCHMARKS.md).
pub const MAP_REVERSE_TCP: &str = "REVERSE_TCP";
/// Slots of `MAP_REVERSE_TCP`, a power of two. Socket cookies increase (each CPU takes them in batches of
/// 4,096 from one counter), so the sockets open at once mostly fall in distinct slots; with L translated TCP sockets open, a new one finds its
/// slot held with a chance of about L / 65,536 and goes to the LRU.
pub const REVERSE_TCP_SLOTS: u32 = 65_536;

/// The slot of `MAP_REVERSE_TCP` for the socket with `cookie`.
#[must_use]
pub const fn tcp_slot(cookie: u64) -> u32 {
    (cookie & (REVERSE_TCP_SLOTS as u64 - 1)) as u32
}

/// A slot of `MAP_REVERSE_TCP`: the socket holding it (its cookie; 0 when free) and its reverse entry.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
pub struct TcpReverse {
    /// The cookie of the socket whose entry this is; 0: free (no socket has cookie 0).
    pub cookie: u64,
    /// What `MAP_REVERSE` would hold under `ReverseKey::tcp(cookie)`.
    pub value: ReverseValue,
}
const _: () = assert!(size_of::<TcpReverse>() == 64);
// `tcp_slot`'s mask is the slot count less one.
const _: () = assert!(REVERSE_TCP_SLOTS.is_power_of_two());

/// Connected UDP sockets by (socket cookie, backend) -> VIP and network namespace: the sockets the agent
/// destroys when their backend leaves (user space cannot enumerate socket storage). Entries go with their
/// socket (`sock_release`). One network namespace (a pod) registers at most `udp_per_netns(capacity)`.
pub const MAP_CONNECTED_UDP: &str = "CONNECTED_UDP";
/// How many sockets each network namespace has in `MAP_CONNECTED_UDP`: netns cookie (u64) -> count (u32).
/// An entry goes when its count would drop to 0.
pub const MAP_UDP_PER_NETNS: &str = "UDP_PER_NETNS";
/// Socket-local storage (`SockState`): the reverse state of connected UDP sockets, and the record of a UDP
/// socket's `REVERSE` entries for `sock_release`; freed with the socket.
pub const MAP_SOCKS: &str = "SOCKS";

/// Default entries of the reverse LRU (unconnected UDP, and TCP sockets whose slot was held: beyond this the
/// oldest translations are forgotten); also the most connected UDP sockets tracked at once for destruction
/// (`MAP_CONNECTED_UDP`).
pub const DEFAULT_MAX_REVERSE: u32 = 262_144;
/// Network namespaces `MAP_UDP_PER_NETNS` counts at once (the pods of a node with connected UDP sockets to
/// Services; a namespace without one has no entry).
pub const DEFAULT_MAX_UDP_NETNS: u32 = 16_384;
/// Name of the programs' global that holds `udp_per_netns` of the loaded capacity (set by the loader).
pub const GLOBAL_UDP_PER_NETNS: &str = "UDP_PER_NETNS_MAX";

/// Connected UDP sockets one network namespace may register for destruction: a sixteenth of the registry,
/// so that one pod holding sockets open cannot keep every other pod's out (sixteen such pods can). A socket
/// over it works and shows the VIP; only its destruction when its backend leaves is lost (counted as
/// `COUNTER_REVERSE_UNRECORDED`).
#[must_use]
pub const fn udp_per_netns(registry: u32) -> u32 {
    if registry / 16 == 0 { 1 } else { registry / 16 }
}

/// How many backends one socket's storage remembers having REVERSE entries for, so `sock_release` can delete
/// them. A socket sending to more backends (a resolver cycling through many DNS VIPs) leaves the rest to the
/// LRU's eviction, and the data path counts `COUNTER_REVERSE_UNRECORDED`.
pub const SOCK_LRU_RECORD: usize = 8;
/// `SockState::flags`: the socket has an entry in `MAP_CONNECTED_UDP` (under its cookie and `backend`) and
/// is counted in `MAP_UDP_PER_NETNS`.
pub const SOCK_REGISTERED: u32 = 1 << 0;
/// `ReverseValue::flags`: passive health has counted this TCP socket's connect as failed (once per connect).
pub const REVERSE_HEALTH_REPORTED: u32 = 1 << 0;

/// Key of a reverse entry: which socket talked to which backend.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReverseKey {
    /// The socket's cookie (`bpf_get_socket_cookie`), stable for the socket's life.
    pub cookie: u64,
    /// The backend the socket was sent to, as recvmsg/getpeername later see it; for a TCP socket's entry
    /// only `proto` is set (`ReverseKey::tcp`), its backend is `ReverseValue::peer`.
    pub backend: Backend,
    /// Explicit tail padding (the key is 8-aligned); always 0 so equal keys hash equal.
    pub _pad: u32,
}
const _: () = assert!(size_of::<ReverseKey>() == 32);

impl ReverseKey {
    /// The one entry of TCP socket `cookie`. Keyed by the socket alone, not by its peer: a socket that
    /// connects again (after a refused or timed-out connect, or after `connect(AF_UNSPEC)`) overwrites it
    /// rather than adding one per attempt, and `sock_release` finds it even when the kernel has cleared
    /// the socket's peer (a connect that failed before sending its SYN leaves no port).
    #[must_use]
    pub const fn tcp(cookie: u64) -> Self {
        Self { cookie, backend: Backend { addr: [0; 4], port: 0, proto: PROTO_TCP, family: 0 }, _pad: 0 }
    }
}

/// What the socket asked for (the VIP and port), the backend it was given, and the network namespace it
/// lives in (for the agent's socket destruction, which must run inside that namespace).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReverseValue {
    /// The VIP the socket asked for, network byte order (`FrontendKey::addr`).
    pub vip: [u32; 4],
    /// Network byte order.
    pub port: u16,
    /// `FAMILY_V4` or `FAMILY_V6` of the VIP.
    pub family: u8,
    /// Explicit padding, always 0.
    pub _pad: u8,
    /// `REVERSE_HEALTH_REPORTED`; 0 when written.
    pub flags: u32,
    /// The backend the socket was given: recvmsg and getpeername show the VIP only while the socket's peer
    /// is this backend (a TCP socket that connected again to an address no Service has shows that).
    pub peer: Backend,
    /// Explicit padding before the 8-aligned cookie, always 0.
    pub _pad2: u32,
    /// The socket's network namespace (`bpf_get_netns_cookie`), recorded for UDP only; 0 otherwise.
    pub netns_cookie: u64,
}
const _: () = assert!(size_of::<ReverseValue>() == 56);

impl ReverseValue {
    /// Frontend `fe` given `peer`, in namespace `netns_cookie` (0: not recorded).
    #[must_use]
    pub const fn new(fe: FrontendKey, peer: Backend, netns_cookie: u64) -> Self {
        Self {
            vip: fe.addr,
            port: fe.port,
            family: fe.family,
            _pad: 0,
            flags: 0,
            peer,
            _pad2: 0,
            netns_cookie,
        }
    }
}

/// A socket's own reverse state, in socket-local storage (`MAP_SOCKS`), freed by the kernel with the socket.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    /// The backend a UDP connect() chose; all zero if the socket never connected to a VIP.
    pub backend: Backend,
    /// The frontend that connect() asked for: recvmsg and getpeername show its VIP and port.
    pub frontend: FrontendKey,
    /// Backends this socket has `MAP_REVERSE` entries for (sendmsg to a VIP), the first `lru_len`; deleted
    /// with the socket by `sock_release`.
    pub lru: [Backend; SOCK_LRU_RECORD],
    /// How many of `lru` are set.
    pub lru_len: u32,
    /// `SOCK_REGISTERED`.
    pub flags: u32,
}
const _: () = assert!(size_of::<SockState>() == 208);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_netns_may_take_a_sixteenth_of_the_registry_and_at_least_one() {
        assert_eq!(udp_per_netns(DEFAULT_MAX_REVERSE), 16_384);
        assert_eq!(udp_per_netns(1024), 64);
        assert_eq!(udp_per_netns(15), 1);
        assert_eq!(udp_per_netns(0), 1);
    }

    #[test]
    fn a_tcp_sockets_key_names_the_socket_not_its_peer() {
        let k = ReverseKey::tcp(7);
        assert_eq!((k.cookie, k.backend.proto, k.backend.addr, k.backend.port), (7, PROTO_TCP, [0; 4], 0));
    }
}
