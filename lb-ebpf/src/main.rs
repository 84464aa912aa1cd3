//! tierlb's BPF programs: eight `cgroup/sock_addr` programs (`sock_addr`) and one `cgroup/sock_release`
//! program (`sock`) over eight maps (`maps`).
//!
//! - `connect4`, `connect6`, `sendmsg4`, `sendmsg6`: Service VIP -> backend, by tier (`lb_common::choose`).
//! - `recvmsg4`, `recvmsg6`, `getpeername4`, `getpeername6`: backend -> the VIP the socket asked for
//!   (`reverse`: a slot of `REVERSE_TCP`, else an LRU, for TCP; socket storage for connected UDP; the LRU for
//!   unconnected UDP).
//! - `sock_release`: a closed socket's reverse entries go with it.
//! - Maps: `FRONTENDS`, `SLOTS`, `BACKEND_STATE`, `COUNTERS`, `REVERSE_TCP`, `REVERSE`, `CONNECTED_UDP`,
//!   `UDP_PER_NETNS`, `SOCKS`, and
//!   `SVC_NAMES` (user space only).
//! - Helpers the programs call down into, never back: `affinity`, `health`, `reverse`, `trace`, over `maps` and
//!   `counters` (`count`, the per-CPU counters every program adds to).
//!
//! Entry points are thin: they call into `sock_addr`, which fails open on internal errors (the connect
//! proceeds untranslated and a counter says so) and rejects only in the documented "no endpoint" cases.
#![no_std]
#![no_main]
// `core::intrinsics::atomic_xadd` for the per-CPU counters (see `counters::count`); the build sets
// RUSTC_BOOTSTRAP=1 already (build-std needs it).
#![feature(core_intrinsics)]
#![expect(
    internal_features,
    reason = "core offers no atomic add on the BPF target; the intrinsic is what it would call"
)]

mod affinity;
mod counters;
mod health;
mod maps;
mod netns_count;
mod reverse;
mod scan;
mod sock;
mod sock_addr;
mod tc;
mod trace;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier proves no panic path is reachable; this only satisfies `no_std`.
    loop {}
}

// bpf_set_retval and bpf_get_socket_cookie are GPL-only helpers: the programs are MIT or GPL-2.0 (LICENSE-MIT,
// LICENSE-GPL2; lb-ebpf/Cargo.toml), the rest of tierlb MIT or Apache-2.0.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
