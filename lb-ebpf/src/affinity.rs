//! sessionAffinity ClientIP, decided in the kernel: a client (its network namespace) that connected to a
//! frontend with affinity gets the same backend again while its entry is fresh (the timeout runs from its
//! last connect), the backend is a member of the frontend's current generation and not marked down, and it
//! sits in the tier the topology rules select (`lb_common::keep_sticky`). Otherwise the normal choice runs
//! and the entry is replaced: a backend that left or went down never fails a connect.
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::{helpers::bpf_get_netns_cookie, programs::SockAddrContext};
use lb_common::{AffinityKey, AffinityValue, Backend, FrontendKey, FrontendValue, MemberKey, MemberValue};

use crate::maps::{AFFINITY, MEMBERS};

/// One client's affinity for one frontend: where its entry is, and the backend it holds if usable.
pub(crate) struct Recalled {
    key: AffinityKey,
    now_ns: u64,
    /// The entry, if the client has one (fresh or not).
    entry: Option<*mut AffinityValue>,
    /// Its backend and member entry, if the entry is fresh and the backend a live member.
    pub(crate) sticky: Option<(Backend, MemberValue)>,
}

/// Look the client's entry up and check it (`down` says whether a backend is marked down at a time).
#[inline(always)]
pub(crate) fn recall(
    ctx: &SockAddrContext,
    fe: &FrontendValue,
    frontend: FrontendKey,
    now_ns: u64,
    down: impl Fn(Backend, u64) -> bool,
) -> Recalled {
    // SAFETY: the helper takes the program's context, which is what it is given.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) };
    let key = AffinityKey { frontend, _pad: 0, netns_cookie };
    let entry = AFFINITY.get_ptr_mut(key);
    let sticky = entry.and_then(|p| {
        // SAFETY: an LRU element stays mapped for the program's run (RCU). Its bytes may be rewritten meanwhile
        // (the element reused for another pair): whatever backend is read is checked below against the member
        // map and the marks, so a torn read can only cost the client its stickiness, never a wrong backend.
        let (backend, last_ns) =
            unsafe { (read_volatile(addr_of!((*p).backend)), read_volatile(addr_of!((*p).last_ns))) };
        let value = AffinityValue { backend, _pad: 0, last_ns };
        if !value.is_fresh(now_ns, fe.affinity_timeout_s) {
            return None;
        }
        // SAFETY: a plain copy out of a hash value.
        let member_key = MemberKey { svc_id: fe.svc_id, generation: fe.generation, backend };
        let member = unsafe { MEMBERS.get(member_key) }.copied()?;
        if down(backend, now_ns) {
            return None;
        }
        Some((backend, member))
    });
    Recalled { key, now_ns, entry, sticky }
}

/// After the choice: refresh the entry's time if its backend was taken, else remember the new backend.
#[inline(always)]
pub(crate) fn remember(recalled: &Recalled, backend: Backend, sticky_taken: bool) {
    if sticky_taken && let Some(p) = recalled.entry {
        // SAFETY: as in `recall`. One 8-byte store: if the element was reused meanwhile, another pair's entry
        // lives a little longer, and its backend is checked on use anyway.
        unsafe { write_volatile(addr_of_mut!((*p).last_ns), recalled.now_ns) };
        return;
    }
    // Fails only if the LRU cannot find a free element on any CPU (then the client is balanced next time).
    let _ = AFFINITY.insert(recalled.key, AffinityValue { backend, _pad: 0, last_ns: recalled.now_ns }, 0);
}
