//! sessionAffinity ClientIP, decided in the kernel: a client (its network namespace; from outside the node,
//! its address) that connected to a frontend with affinity gets the same backend again while its entry is
//! fresh (the timeout runs from its last connect), the backend is a member of the frontend's current generation and not marked down, and it
//! sits in the tier the topology rules select (`lb_common::keep_sticky`). Otherwise the normal choice runs
//! and the entry is replaced: a backend that left or went down never fails a connect.
//!
//! A pod is one cgroup per container, and a container cannot make cgroups, but it may be allowed to make
//! network namespaces (`unshare(CLONE_NEWNET)` in a user namespace of its own). So a connect's namespace is
//! judged against its cgroup's first one (`CGROUP_NETNS`, learnt on the cgroup's first affinity connect): from
//! that namespace the client's entry lives in `AFFINITY`, from any other in `NESTED_AFFINITY`. Namespaces made
//! by the thousand then evict only each other's entries, never a pod's.
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_cgroup_id, bpf_get_netns_cookie, bpf_ktime_get_boot_ns},
    maps::LruHashMap,
    programs::SockAddrContext,
};
use lb_common::{
    AffinityKey, AffinityValue, Backend, COUNTER_AFFINITY, Choice, FrontendKey, FrontendValue, HealthVerdict,
    MemberKey, OutsideAffinityKey, keep_sticky,
};

use crate::{
    counters::count,
    health::{self, is_down},
    maps::{AFFINITY, CGROUP_NETNS, MEMBERS, NESTED_AFFINITY, OUTSIDE_AFFINITY},
};

/// sessionAffinity for one connect, after the tier choice: the client is its network namespace (`sticky`), in
/// `AFFINITY` if it is its cgroup's first namespace, else in `NESTED_AFFINITY` (see the module's comment).
/// Out of line: its locals stay off the connect programs' stack, which the verifier bounds over a call chain
/// (512 bytes).
#[inline(never)]
pub(crate) fn apply(
    ctx: &SockAddrContext,
    fe: &FrontendValue,
    key: &FrontendKey,
    choice: &mut Choice<Backend>,
    health: bool,
) -> bool {
    // SAFETY: helpers without preconditions (the cookie helper takes the program's context).
    let (now_ns, netns_cookie, cgroup) = unsafe {
        (bpf_ktime_get_boot_ns(), bpf_get_netns_cookie(ctx.sock_addr.cast()), bpf_get_current_cgroup_id())
    };
    let map = if first_netns(cgroup, netns_cookie) { &AFFINITY } else { &NESTED_AFFINITY };
    let health = health.then_some(netns_cookie);
    sticky(map, &AffinityKey { frontend: *key, _pad: 0, netns_cookie }, fe, choice, health, now_ns)
}

/// Whether `netns` is the first network namespace `cgroup` made an affinity connect from, learning it if the
/// cgroup is new (or was forgotten). If `CGROUP_NETNS` cannot take it (every CPU's free list empty), the
/// connect counts as its pod's.
#[inline(always)]
fn first_netns(cgroup: u64, netns: u64) -> bool {
    // SAFETY: a plain copy out of an LRU value.
    if let Some(first) = unsafe { CGROUP_NETNS.get(cgroup) }.copied() {
        return first == netns;
    }
    if CGROUP_NETNS.insert(cgroup, netns, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    // Another CPU learnt this cgroup meanwhile.
    // SAFETY: as above.
    unsafe { CGROUP_NETNS.get(cgroup) }.copied().is_none_or(|first| first == netns)
}

/// sessionAffinity for a new flow from outside the node (the tc programs), after the tier choice: the client
/// is its address, as kube-proxy's `recent` match keys it. Marks are honoured; passive health is the connect
/// path's alone.
#[inline(never)]
pub(crate) fn apply_outside(fe: &FrontendValue, akey: &OutsideAffinityKey, choice: &mut Choice<Backend>) {
    // SAFETY: helper without preconditions.
    let now_ns = unsafe { bpf_ktime_get_boot_ns() };
    sticky(&OUTSIDE_AFFINITY, akey, fe, choice, None, now_ns);
}

/// Look the client's entry (`akey` in `map`) up; keep its backend if the entry is fresh, the backend is a
/// member of the frontend's current generation in the chosen tier (`keep_sticky`) and usable (not marked
/// down, not held by passive health for the client when `health` names it, its network namespace), refreshing the entry's time in place; else
/// remember the chosen backend. Counts the choices that kept their backend and returns whether this one did.
/// Written flat for the verifier.
#[inline(always)]
fn sticky<K>(
    map: &LruHashMap<K, AffinityValue>,
    akey: &K,
    fe: &FrontendValue,
    choice: &mut Choice<Backend>,
    health: Option<u64>,
    now_ns: u64,
) -> bool {
    let Choice::Backend { backend: chosen, .. } = *choice else { return false };
    if let Some(p) = map.get_ptr_mut(akey) {
        // SAFETY: an LRU element stays mapped for the program's run (RCU). Its bytes may be rewritten meanwhile
        // (the element reused for another pair): whatever backend is read is checked below against the member
        // map and the marks, so a torn read can only cost the client its stickiness, never a wrong backend.
        let (backend, last_ns) =
            unsafe { (read_volatile(addr_of!((*p).backend)), read_volatile(addr_of!((*p).last_ns))) };
        let fresh = AffinityValue { backend, _pad: 0, last_ns }.is_fresh(now_ns, fe.affinity_timeout_s);
        let member_key = MemberKey { svc_id: fe.svc_id, generation: fe.generation, backend };
        // SAFETY: a plain copy out of a hash value.
        let member = if fresh { unsafe { MEMBERS.get(member_key) }.copied() } else { None };
        if let Some(member) = member
            && !is_down(backend, || now_ns)
            && health
                .is_none_or(|client| health::verdict(backend, || client, || now_ns) == HealthVerdict::Use)
        {
            let taken;
            (*choice, taken) = keep_sticky(*choice, Some((backend, member)));
            if taken {
                // SAFETY: as above. One 8-byte store: if the element was reused meanwhile, another pair's entry
                // lives a little longer, and its backend is checked on use anyway.
                unsafe { write_volatile(addr_of_mut!((*p).last_ns), now_ns) };
                count(fe.svc_id, COUNTER_AFFINITY);
                return true;
            }
        }
    }
    // Fails only if the LRU cannot find a free element on any CPU (then the client is balanced next time).
    let _ = map.insert(akey, AffinityValue { backend: chosen, _pad: 0, last_ns: now_ns }, 0);
    false
}
