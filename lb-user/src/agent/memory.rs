//! Giving memory back: the agent's peak is its start (every object read, converted and planned at once) and a
//! relist; afterwards it holds only the model, the plans and what the maps hold.
//! - The binary allocates with jemalloc (`main.rs` makes it the global allocator, with `MALLOC_CONF`). glibc's
//!   malloc put the objects the agent keeps between the transients of the lists they came from, and returns
//!   memory to the kernel only where a whole page is free, so after the start the resident size stayed near
//!   the peak: interleaved on one machine (`tierlb-lab bench --agent-only`), the `--kube` agent at 100,000
//!   Services was 475 MiB resident with glibc and 364 MiB with jemalloc, from manifests 414 and 351 MiB (65 and
//!   62, 53 and 53 MiB at 10,000), and its start to ready 7.35 and 5.83 s. jemalloc keeps objects of one size
//!   class together in slabs and returns the pages freed a second ago from a background thread.
//! - `trim_after`: after a sync that changed many frontends, the B-trees rebuilt with full nodes
//!   (`model::compact::repack`), the names nothing holds any more forgotten, and then every arena's free pages
//!   returned at once (`purge`): what the resident size then shows. It logs jemalloc's figures then
//!   (`heap_stats`: what the objects take and the pages held for them). A page that still holds one live object
//!   stays: freed memory between kept objects is reused, not returned.

use std::ffi::CStr;

/// Syncs that changed at least this many frontends are followed by a trim (the first sync, a relist).
pub const TRIM_AFTER: usize = 1_000;

/// jemalloc's options for the agent, NUL-terminated as its `malloc_conf` is read: two arenas (the agent has two
/// runtime workers and a few blocking threads; fewer arenas strand less memory in half-empty ones), a
/// background thread that purges, and pages freed for a second handed back to the kernel (`MADV_DONTNEED`,
/// no lazy "muzzy" stage: the resident size is what the agent uses).
pub const MALLOC_CONF: &[u8] = b"narenas:2,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// After a sync that changed at least `TRIM_AFTER` frontends: the agent's maps rebuilt with full nodes
/// (`AgentCore::repack`, `NorthSouth::repack`), the unused names forgotten, then free heap pages returned to the kernel.
pub(super) fn trim_after<W: crate::datapath::MapWriter>(
    r: &super::SyncReport,
    core: &mut super::AgentCore<W>,
    north_south: &mut super::north_south::NorthSouth,
) {
    if r.added + r.updated + r.removed >= TRIM_AFTER {
        core.repack();
        north_south.repack();
        crate::model::forget_unused_names();
        purge();
        if let Some(h) = heap_stats() {
            tracing::info!(
                allocated_mib = h.allocated >> 20,
                resident_mib = h.resident >> 20,
                "the heap after the trim: what the agent's objects take, and the pages the allocator holds for them"
            );
        }
    }
}

/// jemalloc's account of the heap, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct HeapStats {
    /// What live allocations take (`stats.allocated`).
    pub allocated: usize,
    /// The pages jemalloc has resident: the allocations, their slabs' free room and its metadata
    /// (`stats.resident`).
    pub resident: usize,
}

/// The heap's figures now (jemalloc's statistics refreshed by writing `epoch`); `None` when they cannot be
/// read.
pub fn heap_stats() -> Option<HeapStats> {
    if control(c"epoch", Some(1)) != 0 {
        return None;
    }
    Some(HeapStats {
        allocated: jemalloc_value(c"stats.allocated")?,
        resident: jemalloc_value(c"stats.resident")?,
    })
}

/// Return every jemalloc arena's free pages to the kernel now (`arena.<MALLCTL_ARENAS_ALL>.purge`, 4096 being
/// jemalloc's "all arenas" index). Where jemalloc is not the global allocator (the library's tests), it only
/// purges jemalloc's own empty arenas.
pub fn purge() {
    let rc = control(c"arena.4096.purge", None);
    if rc != 0 {
        tracing::debug!(errno = rc, "jemalloc's purge failed");
    }
}

/// Write `value` to jemalloc's control `name`, or nothing for a control that takes no value (a purge);
/// mallctl's return: 0, or the errno it refused with. Nothing is read back.
fn control(name: &CStr, value: Option<u64>) -> std::ffi::c_int {
    let mut v = value.unwrap_or_default();
    let (new, len) = match value {
        Some(_) => ((&raw mut v).cast(), size_of::<u64>()),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `new` is null with length 0, or `v`'s 8 bytes, which jemalloc only reads (it checks the length
    // against the control's type and refuses with EINVAL otherwise); no old value is asked for.
    unsafe { tikv_jemalloc_sys::mallctl(name.as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), new, len) }
}

/// A value jemalloc's `mallctl` reads out as plain bytes.
pub trait Plain: Copy + Default + sealed::Sealed {}
impl Plain for bool {}
impl Plain for u32 {}
impl Plain for usize {}
impl Plain for isize {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for bool {}
    impl Sealed for u32 {}
    impl Sealed for usize {}
    impl Sealed for isize {}
}

/// One of jemalloc's values by name (`opt.narenas` is a `u32`, `opt.background_thread` a `bool`,
/// `opt.dirty_decay_ms` an `isize`); `None` when jemalloc has no such name or its type has another size.
pub fn jemalloc_value<T: Plain>(name: &CStr) -> Option<T> {
    let mut value = T::default();
    let mut len = size_of::<T>();
    // SAFETY: `value` is `len` writable bytes of a type with no invalid bit patterns jemalloc could write
    // (jemalloc checks that `len` is its value's size, else returns EINVAL and writes nothing).
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut value).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0 && len == size_of::<T>()).then_some(value)
}

/// What an agent's memory cgroup needs for `services` Services of about 10 endpoints at the default `--max-*`
/// capacities: the BPF maps, which the kernel charges to the cgroup of the process that made them (about
/// 167 MiB loaded and empty, mostly the preallocated LRUs and the 4 MiB `REVERSE_TCP` array; 0.8 KiB more per
/// Service, its slots and names: 1.3 KiB before the slot map held 8 slots to an entry, whose entries then took 496 bytes a Service less, the
/// kernel's accounting of `SLOTS` at 100,000 Services in BENCHMARKS.md), plus the
/// agent's own peak with a fifth again as margin. The peak is its start (the first list and plan: `VmHWM`
/// 34 MiB and 3.5 KiB per Service, 67.6 MiB at 10,000 Services and 379 MiB at 100,000, `--kube`, the
/// bench's `--agent-only` runs; its RSS after the trim is 21 MiB and 2.3 KiB per Service, 42.9 and 245.0 MiB
/// in the full run) unless `/metrics` is served (`scraped`): a scrape adds 17 MiB and 6.4 KiB per Service
/// to that RSS (the registry and the text it builds, and the text kept for the next scrape: the RSS during
/// three scrapes over the RSS before them, 77 MiB more at 10,000 Services and 624 MiB at 100,000, measured
/// once with a patch of the lab that is not in the repository).
/// deploy/README.md, "Sizing the agent's memory", makes its tables from the same figures.
pub fn needed_bytes(services: usize, scraped: bool) -> u64 {
    const MIB: u64 = 1024 * 1024;
    let n = services as u64;
    // 166 MiB measured before the `REVERSE_TCP` array, and the array (its memlock read 4,194,616 bytes); of
    // the 166, 40 were the single conntrack table of 262,144 entries, which the three tables replaced.
    let slots = u64::from(lb_common::REVERSE_TCP_SLOTS) * size_of::<lb_common::TcpReverse>() as u64;
    let conntrack = u64::from(
        lb_common::DEFAULT_MAX_CONNTRACK
            + lb_common::DEFAULT_MAX_CONNTRACK_SYN
            + lb_common::DEFAULT_MAX_CONNTRACK_UDP,
    ) * lb_common::CONNTRACK_ENTRY_BYTES;
    let maps = 166 * MIB - 40 * MIB + conntrack + slots + n * 835;
    let start = 34 * MIB + n * 3_628;
    let steady = 21 * MIB + n * 2_355;
    let scrape = 17 * MIB + n * 6_554;
    let peak = if scraped { start.max(steady + scrape) } else { start };
    maps + peak + peak / 5
}

/// The memory limit of the agent's own cgroup, if it has one and it can be read: cgroup2's `memory.max` at
/// the path `/proc/self/cgroup` gives (`0::PATH`) below the mount (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid hosts; in a container with its own cgroup namespace the path is `/`),
/// else cgroup v1's `memory.limit_in_bytes` where the memory controller is a v1 hierarchy (`N:memory:PATH`).
pub fn own_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |file: String| parse_limit(&std::fs::read_to_string(file).ok()?);
    let v2 = own.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.trim().trim_end_matches('/'));
    let v1 = own.lines().find_map(|l| l.split_once(":memory:")).map(|(_, p)| p.trim().trim_end_matches('/'));
    v2.and_then(|p| {
        ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"].iter().find_map(|m| read(format!("{m}{p}/memory.max")))
    })
    .or_else(|| read(format!("/sys/fs/cgroup/memory{}/memory.limit_in_bytes", v1?)))
}

/// `memory.max`'s content: a byte count, or `max` (no limit); v1's "no limit" is a huge count, which no
/// need reaches.
fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// Warn, once the first sync says how many Services the cluster has, when the cgroup's limit is below what
/// they need (`scraped`: `/metrics` is served): the kernel would kill the agent in a loop as the cluster
/// grows past it.
pub fn check_limit(services: usize, scraped: bool) {
    let Some(limit) = own_limit() else { return };
    let need = needed_bytes(services, scraped);
    if limit < need {
        tracing::warn!(
            services,
            limit_mib = limit >> 20,
            needed_mib = need >> 20,
            "the agent's memory limit is below what this many Services need (deploy/README.md, \"Sizing the \
             agent's memory\"): raise limits.memory in the DaemonSet, or the agent is killed and restarted in a loop"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_follows_the_sizing_table_and_memory_max_parses() {
        // deploy/README.md's rows. Not scraped: 512Mi holds 61,000 Services, 640Mi 87,000, 768Mi 100,000;
        // the 256Mi request 9,000.
        let bare = |n| needed_bytes(n, false);
        assert!(bare(9_000) <= 256 << 20 && bare(10_000) > 256 << 20);
        assert!(bare(61_000) <= 512 << 20 && bare(62_000) > 512 << 20);
        assert!(bare(87_000) <= 640 << 20 && bare(88_000) > 640 << 20);
        assert!(bare(100_000) <= 768 << 20 && bare(100_000) > 640 << 20);
        // Scraped (`/metrics` on, as the DaemonSet runs it): 512Mi holds 27,000, 768Mi 50,000, 1Gi 73,000,
        // 1280Mi 97,000; 100,000 need 1408Mi.
        let scraped = |n| needed_bytes(n, true);
        assert!(scraped(27_000) <= 512 << 20 && scraped(28_000) > 512 << 20);
        assert!(scraped(50_000) <= 768 << 20 && scraped(51_000) > 768 << 20);
        assert!(scraped(73_000) <= 1024 << 20 && scraped(74_000) > 1024 << 20);
        assert!(scraped(97_000) <= 1280 << 20 && scraped(98_000) > 1280 << 20);
        assert!(scraped(100_000) <= 1408 << 20 && scraped(100_000) > 1280 << 20);
        assert_eq!(parse_limit("268435456\n"), Some(268_435_456));
        assert_eq!(parse_limit("max\n"), None);
    }

    #[test]
    fn jemalloc_values_are_read_by_name_and_type() {
        // The library's tests do not run with main.rs's options, so these are jemalloc's defaults.
        assert!(jemalloc_value::<u32>(c"opt.narenas").is_some_and(|n| n >= 1));
        assert!(jemalloc_value::<isize>(c"opt.dirty_decay_ms").is_some());
        assert_eq!(jemalloc_value::<u32>(c"opt.dirty_decay_ms"), None, "another size than jemalloc's");
        assert_eq!(jemalloc_value::<u32>(c"opt.no_such_option"), None);
        assert_eq!(MALLOC_CONF.last(), Some(&0));
        purge();
        let h = heap_stats().expect("jemalloc's statistics");
        assert!(h.resident >= h.allocated, "{h:?}");
    }
}
