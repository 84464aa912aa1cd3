//! Giving memory back: the agent's peak is its start (every object read, converted and planned at once) and a
//! relist; afterwards it holds only the model, the plans and what the maps hold. glibc keeps freed memory in
//! its arenas (one per thread that contended, up to 8 per CPU) and returns it to the kernel only from the top
//! of a heap, so without help the resident size after the start stays near the peak.
//! - `limit_arenas`: two arenas, before the runtime's threads exist (the agent has two workers and a few
//!   blocking threads; fewer arenas mean less memory stranded in half-empty ones).
//! - `trim_after`: after a sync that changed many frontends, the B-trees rebuilt with full nodes
//!   (`model::compact::repack`), then `malloc_trim(0)`, which hands every free page of every arena back
//!   (madvise): what the resident size then shows. The node and zone names and hint lists nothing holds any
//!   more leave the interning tables then too. A page that still holds one live object stays: freed memory
//!   between kept objects is reused, not returned.

/// Syncs that changed at least this many frontends are followed by a trim (the first sync, a relist).
pub const TRIM_AFTER: usize = 1_000;

/// At most two malloc arenas (glibc's `M_ARENA_MAX`); call before any thread starts. (A fixed
/// `M_MMAP_THRESHOLD` of 128 KiB, so that list pages are mappings of their own rather than blocks between the
/// objects kept from them, took 12 MiB off the `--kube` agent's 495 MiB at 100,000 Services and added 1.2 s
/// to its lists: not kept.)
pub fn limit_arenas() {
    // SAFETY: mallopt only changes the allocator's parameters; no pointer is involved.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
}

/// After a sync that changed at least `TRIM_AFTER` frontends: the agent's maps rebuilt with full nodes
/// (`AgentCore::repack`), then free heap pages returned to the kernel.
pub fn trim_after<W: crate::datapath::MapWriter>(r: &super::SyncReport, core: &mut super::AgentCore<W>) {
    if r.added + r.updated + r.removed >= TRIM_AFTER {
        core.repack();
        crate::model::forget_unused_names();
        // SAFETY: malloc_trim walks the allocator's own free lists; no pointer of ours is involved.
        unsafe { libc::malloc_trim(0) };
    }
}

/// What an agent's memory cgroup needs for `services` Services of about 10 endpoints at the default `--max-*`
/// capacities: the BPF maps, which the kernel charges to the cgroup of the process that made them (166 MiB
/// loaded and empty, mostly the preallocated LRUs; 1.3 KiB more per Service, its slots and names), plus the
/// agent's resident memory with half again as headroom (the `--kube` agent's 22 MiB and 4.7 KiB per
/// Service: 67.7 MiB at 10,000 Services and 476.7 MiB at 100,000 in the bench's full run). deploy/README.md,
/// "Sizing the agent's memory", makes its table from the same figures.
pub fn needed_bytes(services: usize) -> u64 {
    let n = services as u64;
    let maps = 166 * 1024 * 1024 + n * 1_331;
    let resident = 22 * 1024 * 1024 + n * 4_765;
    maps + resident + resident / 2
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
/// they need: the kernel would kill the agent in a loop as the cluster grows past it.
pub fn check_limit(services: usize) {
    let Some(limit) = own_limit() else { return };
    let need = needed_bytes(services);
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
        // deploy/README.md's rows: the DaemonSet's 512Mi holds 38,000 Services, not 39,000; 10,000 need more
        // than 256Mi; 50,000 fit 640Mi and 100,000 1024Mi.
        assert!(needed_bytes(38_000) <= 512 << 20);
        assert!(needed_bytes(39_000) > 512 << 20);
        assert!(needed_bytes(10_000) > 256 << 20 && needed_bytes(10_000) <= 384 << 20);
        assert!(needed_bytes(50_000) <= 640 << 20 && needed_bytes(50_000) > 512 << 20);
        assert!(needed_bytes(100_000) <= 1024 << 20 && needed_bytes(100_000) > 896 << 20);
        assert_eq!(parse_limit("268435456\n"), Some(268_435_456));
        assert_eq!(parse_limit("max\n"), None);
    }
}
