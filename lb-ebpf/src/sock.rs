//! `sock_release`: a socket's reverse entries outside its own storage go with it.
//!
//! The kernel runs `cgroup/sock_release` from `inet_release` (every IPv4/IPv6 socket of the cgroup, on its
//! last close) before the protocol's close: a TCP socket's entry is in its `REVERSE_TCP` slot if the slot
//! names it (the slot is freed), else in `REVERSE` under its cookie alone (one delete, a miss for a socket
//! connect4/6 did not translate); and before
//! `__sk_destruct` frees a UDP socket's storage, which still tells which `REVERSE` entries (sendmsg) and
//! which `CONNECTED_UDP` registration (connect) the socket made, which its namespace's count in
//! `UDP_PER_NETNS` gets back. A UDP socket without storage (it never talked to a VIP) costs one helper call.
use aya_ebpf::{
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_sk_storage_get},
    macros::cgroup_sock,
    programs::SockContext,
};
use lb_common::{PROTO_TCP, ReverseKey, SOCK_LRU_RECORD, SOCK_REGISTERED, SockState};

use crate::{
    maps::{CONNECTED_UDP, REVERSE, SOCKS},
    netns_count,
};

/// The socket's release cannot be refused; 1 is the only value the verifier accepts here as "proceed".
const PROCEED: i32 = 1;

#[cgroup_sock(sock_release)]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn sock_release(ctx: SockContext) -> i32 {
    // aya's `SkStorage` getters take a sock_addr context only; in a cgroup_sock program the helper takes the
    // context itself (`bpf_sk_storage_get_cg_sock_proto`: arg2 is ARG_PTR_TO_CTX, "context is struct
    // sock"). The map pointer is the static's address, as `SkStorage::as_ptr` (crate-private) returns.
    // SAFETY: the kernel passes a valid bpf_sock for the program's whole run.
    let sk = unsafe { &*ctx.sock };
    if sk.protocol == u32::from(PROTO_TCP) {
        // Whatever the socket's peer is now (none after a connect that failed before its SYN, or after
        // `connect(AF_UNSPEC)`), its one entry is in its slot or, if the slot is another's, under its cookie.
        // SAFETY: `bpf_get_socket_cookie_sock_proto` takes the cgroup_sock context.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.sock.cast()) };
        if let Some(slot) = crate::reverse::own_slot(cookie) {
            slot.cookie = 0;
            return PROCEED;
        }
        let _ = REVERSE.remove(ReverseKey::tcp(cookie));
        return PROCEED;
    }
    let map = core::ptr::from_ref(&SOCKS).cast_mut().cast();
    // SAFETY: a valid map and this program's context; flags 0: look up, never create.
    let st =
        unsafe { bpf_sk_storage_get(map, ctx.sock.cast(), core::ptr::null_mut(), 0) }.cast::<SockState>();
    if st.is_null() {
        return PROCEED;
    }
    // SAFETY: this socket's storage, valid for the program's run; only read.
    let st = unsafe { &*st };
    // SAFETY: `bpf_get_socket_cookie_sock_proto` takes the cgroup_sock context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock.cast()) };
    let len = st.lru_len as usize;
    for i in 0..SOCK_LRU_RECORD {
        if i >= len {
            break;
        }
        let _ = REVERSE.remove(ReverseKey { cookie, backend: st.lru[i], _pad: 0 });
    }
    if st.flags & SOCK_REGISTERED != 0 {
        // Removed here, or already by the agent after destroying the socket: counted until now either way.
        let _ = CONNECTED_UDP.remove(ReverseKey { cookie, backend: st.backend, _pad: 0 });
        // SAFETY: `bpf_get_netns_cookie_sock_proto` takes the cgroup_sock context (the socket's namespace,
        // the one connect4/6 counted it in).
        netns_count::give_back(unsafe { bpf_get_netns_cookie(ctx.sock.cast()) });
    }
    PROCEED
}
