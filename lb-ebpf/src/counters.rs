//! The per-CPU counters every program adds to (`COUNTERS`, per Service and global, `lb_common::ServiceCounters`;
//! `NS_COUNTERS`, the tc programs' by `NS_*` kind).
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use lb_common::COUNTERS_PER_SERVICE;

use crate::maps::{COUNTERS, NS_COUNTERS};

/// Add one to counter `kind` of service `svc_id` (`GLOBAL_SVC_ID` for the global ones).
#[inline(always)]
pub(crate) fn count(svc_id: u32, kind: u32) {
    // The mask keeps the kind inside the value for the verifier (every kind is below 8 already).
    const _: () = assert!(COUNTERS_PER_SERVICE.is_power_of_two());
    let kind = (kind & (COUNTERS_PER_SERVICE - 1)) as usize;
    // SAFETY: the pointer is to this CPU's copy of the entry, which lives for the program's run; `kind` is
    // below the array's length.
    add_one(COUNTERS.get_ptr_mut(svc_id).map(|c| unsafe { (&raw mut (*c).counts).cast::<u64>().add(kind) }));
}

/// Add one to the tc programs' counter `kind` (`lb_common::NS_*`).
#[inline(always)]
pub(crate) fn count_ns(kind: u32) {
    add_one(NS_COUNTERS.get_ptr_mut(kind));
}

#[inline(always)]
fn add_one(slot: Option<*mut u64>) {
    if let Some(c) = slot {
        // An atomic add, not `*c += 1`: BPF programs run with migration disabled, not preemption, on a
        // preemptible kernel (`migrate_disable` in `bpf_prog_run_array_cg`), so another program on this CPU
        // (a connect in another task) can preempt a load-add-store between its load and its store and one of
        // the two counts is lost. The result is unused, so LLVM emits BPF's `lock xadd`
        // (`BPF_ATOMIC | BPF_ADD`), which every JIT supports; it costs a locked add on the CPU's own line.
        // The intrinsic, not `AtomicU64::fetch_add`: core offers no read-modify-write atomics on the BPF
        // target (it has no compare-and-swap before v3, so `target_has_atomic = "64"` is off).
        // SAFETY: the pointer is to an 8-aligned u64 map value that lives for the program's run.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, 1) };
    }
}
