//! Reverse state: which VIP a socket asked for, so that recvmsg (a reply's source) and getpeername show the
//! VIP, not the backend. It lives exactly as long as the socket:
//!
//! - A TCP socket (connect4/connect6) gets one entry, with the backend it was given in the value: in its slot
//!   of the `REVERSE_TCP` array (`lb_common::tcp_slot` of its cookie) if the slot is free or its own, else
//!   in the `REVERSE` LRU, keyed by its cookie alone (`ReverseKey::tcp`); `sock_release` frees the slot or
//!   deletes the entry when the socket closes. A socket that connects again (after a failed connect, or
//!   `connect(AF_UNSPEC)`) overwrites its entry: however often it reconnects it holds one, and evicts
//!   nobody's. The array first: writing an element in place takes no lock and no allocation, where an LRU
//!   insert pops a free element under a lock and links it into a bucket (with its delete at close, about
//!   half of what tierlb added to a connect, BENCHMARKS.md). Not socket storage: the first
//!   `bpf_sk_storage_get` with the create flag allocates and charges the socket's storage (two slab
//!   allocations), about three quarters of connect4's cost when it did.
//!   Two sockets whose cookies share a slot and that connect at the same instant on two CPUs may both find
//!   it free and both write it: one of them then has no entry (it shows its backend, and passive health does
//!   not follow its connect), or, if their writes interleave, the values of the other (which matter only
//!   when the two went to one backend through different VIPs). A socket that moved from the LRU to its slot
//!   by connecting again leaves its LRU entry to the LRU's eviction.
//! - A connected UDP socket keeps it in its own storage (`SOCKS`), which the kernel frees with the socket,
//!   written only when it changes (a reconnect to another VIP or backend), and is registered in
//!   `CONNECTED_UDP` for the agent's socket destruction (which must find the backend it left on a reconnect),
//!   at most `UDP_PER_NETNS_MAX` sockets per network namespace (`UDP_PER_NETNS` counts them), so one pod
//!   cannot fill the registry for the others.
//! - An unconnected UDP socket (sendmsg4/sendmsg6, run only when the call carries an address) may talk to
//!   many VIPs, one entry per backend: those go to the `REVERSE` LRU too, written only when missing or
//!   different, and recorded in the socket's storage so that `sock_release` deletes them with the socket
//!   (`SOCK_LRU_RECORD` of them; beyond that the LRU's eviction).
use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use lb_common::{
    Backend, COUNTER_REVERSE_UNRECORDED, FAMILY_V4, FAMILY_V6, FrontendKey, GLOBAL_SVC_ID, PROTO_TCP,
    ReverseKey, ReverseValue, SOCK_LRU_RECORD, SOCK_REGISTERED, TcpReverse, V4_MAPPED_WORD2, tcp_slot,
};

use crate::{
    counters::count,
    maps::{CONNECTED_UDP, REVERSE, REVERSE_TCP, SOCKS},
    netns_count,
};

/// The `REVERSE_TCP` slot for the TCP socket with `cookie`, whoever holds it.
#[inline(always)]
fn slot(cookie: u64) -> Option<&'static mut TcpReverse> {
    let slot = REVERSE_TCP.get_ptr_mut(tcp_slot(cookie))?;
    // SAFETY: an array element, valid for the program's run (see the module's comment on two writers).
    Some(unsafe { &mut *slot })
}

/// The `REVERSE_TCP` slot of the TCP socket with `cookie`, if that socket holds it.
#[inline(always)]
pub(crate) fn own_slot(cookie: u64) -> Option<&'static mut TcpReverse> {
    slot(cookie).filter(|s| s.cookie == cookie)
}

/// The reverse entry of the TCP socket with `cookie`: in its `REVERSE_TCP` slot if the slot is its own,
/// else in `REVERSE` (or none).
#[inline(always)]
pub(crate) fn tcp_entry(cookie: u64) -> Option<*mut ReverseValue> {
    match own_slot(cookie) {
        Some(slot) => Some(&raw mut slot.value),
        None => REVERSE.get_ptr_mut(ReverseKey::tcp(cookie)),
    }
}

pub(crate) const AF_INET: u32 = 2;
pub(crate) const AF_INET6: u32 = 10;

#[inline(always)]
fn cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the helper takes the program's context, which is what it is given.
    unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) }
}

/// The backend a socket's peer address names: `family` is the socket's (`AF_INET`, `AF_INET6`), `ip6` its
/// peer as four network-order words; a v4-mapped peer of a dual-stack socket is IPv4, as connect6 keys it.
#[inline(always)]
pub(crate) fn peer_backend(family: u32, ip4: u32, ip6: [u32; 4], port: u16, proto: u8) -> Option<Backend> {
    match family {
        AF_INET => Some(Backend { addr: [ip4, 0, 0, 0], port, proto, family: FAMILY_V4 }),
        AF_INET6 if ip6[0] == 0 && ip6[1] == 0 && ip6[2] == V4_MAPPED_WORD2 => {
            Some(Backend { addr: [ip6[3], 0, 0, 0], port, proto, family: FAMILY_V4 })
        }
        AF_INET6 => Some(Backend { addr: ip6, port, proto, family: FAMILY_V6 }),
        _ => None,
    }
}

/// connect(): a TCP socket's (cookie, backend) -> VIP in the LRU; a UDP socket's backend and frontend in its
/// storage, if they changed. Each protocol's work out of line (as `remember_sent`): its locals stay off the connect program's
/// stack, which the verifier bounds over a call chain (512 bytes; Linux 6.1 rounds each frame up to 32 bytes,
/// and one function for both protocols took connect6's chain to 544).
#[inline(always)]
pub(crate) fn remember_connected(ctx: &SockAddrContext, backend: Backend, fe: FrontendKey) {
    if backend.proto == PROTO_TCP {
        remember_connected_tcp(ctx, backend, fe);
    } else {
        remember_connected_udp(ctx, backend, fe);
    }
}

/// `remember_connected` for a TCP socket.
#[inline(never)]
fn remember_connected_tcp(ctx: &SockAddrContext, backend: Backend, fe: FrontendKey) {
    // The socket's one entry: new, or an earlier attempt's (a connected socket's second connect() never
    // reaches this hook), which this attempt replaces.
    let (cookie, value) = (cookie(ctx), ReverseValue::new(fe, backend, 0));
    if let Some(slot) = slot(cookie) {
        // Free, or its own.
        if slot.cookie == 0 || slot.cookie == cookie {
            slot.cookie = cookie;
            slot.value = value;
            return;
        }
    }
    // Its slot is another open socket's: the LRU, which never fails for lack of room.
    if REVERSE.insert(ReverseKey::tcp(cookie), value, 0).is_err() {
        count(GLOBAL_SVC_ID, COUNTER_REVERSE_UNRECORDED);
    }
}

/// `remember_connected` for a UDP socket.
#[inline(never)]
fn remember_connected_udp(ctx: &SockAddrContext, backend: Backend, fe: FrontendKey) {
    // SAFETY: `SOCKS` is a socket storage map and the context is a sock_addr context (what aya's wrapper
    // reads the socket from); `None` creates the storage zeroed.
    let st = unsafe { SOCKS.get_or_insert_ptr_mut(ctx, None) };
    if st.is_null() {
        count(GLOBAL_SVC_ID, COUNTER_REVERSE_UNRECORDED);
        return;
    }
    // SAFETY: non-null storage of this socket, valid for the program's run. A TCP connect runs the program
    // under the socket lock (`inet_stream_connect`); a UDP connect does not (`inet_dgram_connect` runs it
    // before `ip4_datagram_connect` locks), so two threads connecting one UDP socket at once may mix their
    // writes: the socket then ends connected to one of the two, and its reverse view may name the other.
    let st = unsafe { &mut *st };
    if st.backend == backend && st.frontend == fe {
        return;
    }
    let old = st.backend;
    st.backend = backend;
    st.frontend = fe;
    // Only the agent's destruction of connected UDP sockets reads the registry (and the namespace).
    let cookie = cookie(ctx);
    // SAFETY: as `cookie`.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) };
    if st.flags & SOCK_REGISTERED != 0 && old != backend {
        // Moved to another backend: registered anew under it (the namespace's count stays the same).
        let _ = CONNECTED_UDP.remove(ReverseKey { cookie, backend: old, _pad: 0 });
    } else if st.flags & SOCK_REGISTERED == 0 && !netns_count::take(netns_cookie) {
        // Its namespace holds its share of the registry: the socket works and shows the VIP, but the agent
        // cannot destroy it if its backend leaves.
        count(GLOBAL_SVC_ID, COUNTER_REVERSE_UNRECORDED);
        return;
    }
    let key = ReverseKey { cookie, backend, _pad: 0 };
    if CONNECTED_UDP.insert(key, ReverseValue::new(fe, backend, netns_cookie), 0).is_ok() {
        st.flags |= SOCK_REGISTERED;
    } else {
        // Full: as above.
        st.flags &= !SOCK_REGISTERED;
        netns_count::give_back(netns_cookie);
        count(GLOBAL_SVC_ID, COUNTER_REVERSE_UNRECORDED);
    }
}

/// sendmsg() with an address: an LRU entry for (socket, backend), written only if missing or different, and
/// recorded in the socket's storage for `sock_release`.
#[inline(never)]
pub(crate) fn remember_sent(ctx: &SockAddrContext, backend: Backend, fe: FrontendKey) {
    let cookie = cookie(ctx);
    let key = ReverseKey { cookie, backend, _pad: 0 };
    // No namespace for LRU entries: only connected sockets (the registry) are ever destroyed.
    let value = ReverseValue::new(fe, backend, 0);
    // SAFETY: we only copy out of the value, valid for the program's run (RCU).
    if let Some(old) = unsafe { REVERSE.get(key) }
        && *old == value
    {
        return;
    }
    // An LRU map never fails for lack of room; if the update fails anyway, only the reverse view is lost.
    if REVERSE.insert(key, value, 0).is_err() {
        return;
    }
    // SAFETY: as in `remember_connected`.
    let st = unsafe { SOCKS.get_or_insert_ptr_mut(ctx, None) };
    if st.is_null() {
        count(GLOBAL_SVC_ID, COUNTER_REVERSE_UNRECORDED);
        return;
    }
    // SAFETY: as in `remember_connected`. The sendmsg hook runs before `udp_sendmsg` takes any lock, so two
    // threads sending through one socket may run this at once: at worst a backend is recorded twice, or one
    // record is lost and its LRU entry outlives the socket until the LRU evicts it.
    let st = unsafe { &mut *st };
    let len = st.lru_len as usize;
    for i in 0..SOCK_LRU_RECORD {
        if i >= len {
            break;
        }
        if st.lru[i] == backend {
            return; // entry rewritten (evicted or its VIP changed), already recorded
        }
    }
    if len < SOCK_LRU_RECORD {
        st.lru[len] = backend;
        st.lru_len = len as u32 + 1;
    } else {
        count(GLOBAL_SVC_ID, COUNTER_REVERSE_UNRECORDED);
    }
}

/// recvmsg() and getpeername(): the frontend the socket asked for when it talked to `backend`: a UDP socket's
/// storage if it is connected to that backend, else the LRU.
#[inline(always)]
pub(crate) fn recall(ctx: &SockAddrContext, backend: Backend) -> Option<FrontendKey> {
    if backend.proto != PROTO_TCP {
        // SAFETY: as in `remember_connected`; without the create flag a socket with no storage gets null.
        let st = unsafe { SOCKS.get_ptr_mut(ctx) };
        // SAFETY: non-null storage of this socket, read only.
        if !st.is_null() && unsafe { (*st).backend } == backend {
            // SAFETY: as above.
            return Some(unsafe { (*st).frontend });
        }
    }
    // SAFETY: map values, valid for the program's run; only read.
    let rev: &ReverseValue = unsafe {
        if backend.proto == PROTO_TCP {
            &*tcp_entry(cookie(ctx))?
        } else {
            REVERSE.get(ReverseKey { cookie: cookie(ctx), backend, _pad: 0 })?
        }
    };
    // A TCP socket's entry is for the backend of its last translated connect: one that connected again to
    // an address no Service has shows that address.
    (rev.peer == backend).then_some(FrontendKey {
        addr: rev.vip,
        port: rev.port,
        proto: backend.proto,
        family: rev.family,
    })
}
