//! Each network namespace's share of the connected-UDP registry: `UDP_PER_NETNS` counts the sockets a
//! namespace has in `CONNECTED_UDP`, and a namespace at `UDP_PER_NETNS_MAX` registers no more.
//!
//! The count is kept with atomic adds and no lock, so sockets of one namespace registering or closing on
//! several CPUs at once may leave it off by a few: a namespace may register a few sockets over its share,
//! or its entry may go while one of its sockets is still counted (which then gives nothing back). It cannot
//! drift far: an entry whose count reads above twice the share (decrements that raced below 0) is dropped
//! and counted anew, and the entry goes when its last socket does, so a node's many short-lived pods leave
//! no entries behind.
use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::read_volatile,
};

use aya_ebpf::bindings::BPF_NOEXIST;

use crate::maps::{UDP_PER_NETNS, UDP_PER_NETNS_MAX};

#[inline(always)]
fn share() -> u32 {
    // SAFETY: a `static` the loader may have rewritten; read as memory, not as the compile-time constant.
    unsafe { read_volatile(&raw const UDP_PER_NETNS_MAX) }
}

/// One more registered socket for namespace `netns`; false if it holds its share already (or the count map
/// is full), and then nothing changed.
#[inline(never)]
pub(crate) fn take(netns: u64) -> bool {
    let share = share();
    if let Some(n) = UDP_PER_NETNS.get_ptr_mut(netns) {
        // SAFETY: a u32 map value, valid for the program's run.
        let now = unsafe { read_volatile(n) };
        if now > share.saturating_mul(2) {
            // Raced below 0 (see the module's comment): start over from this socket.
            let _ = UDP_PER_NETNS.insert(netns, 1, 0);
            return true;
        }
        if now >= share {
            return false;
        }
        // SAFETY: as above; the result is unused, so this is BPF's `lock xadd`.
        unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(n, 1) };
        return true;
    }
    if UDP_PER_NETNS.insert(netns, 1, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    // Another CPU created it meanwhile: add to its count; or the map is full.
    match UDP_PER_NETNS.get_ptr_mut(netns) {
        Some(n) => {
            // SAFETY: as above.
            unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(n, 1) };
            true
        }
        None => false,
    }
}

/// One registered socket of namespace `netns` fewer (it closed, or its registration failed after `take`).
#[inline(never)]
pub(crate) fn give_back(netns: u64) {
    let Some(n) = UDP_PER_NETNS.get_ptr_mut(netns) else { return };
    // SAFETY: a u32 map value, valid for the program's run.
    let now = unsafe { read_volatile(n) };
    if now <= 1 || now > share().saturating_mul(2) {
        let _ = UDP_PER_NETNS.remove(netns);
    } else {
        // SAFETY: as above; adding u32::MAX subtracts one.
        unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(n, u32::MAX) };
    }
}
