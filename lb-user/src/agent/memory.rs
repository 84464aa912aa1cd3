//! Giving memory back: the agent's peak is its start (every object read, converted and planned at once) and a
//! relist; afterwards it holds only the model, the plans and what the maps hold. glibc keeps freed memory in
//! its arenas (one per thread that contended, up to 8 per CPU) and returns it to the kernel only from the top
//! of a heap, so without help the resident size after the start stays near the peak.
//! - `limit_arenas`: two arenas, before the runtime's threads exist (the agent has two workers and a few
//!   blocking threads; fewer arenas mean less memory stranded in half-empty ones).
//! - `trim_after`: `malloc_trim(0)` after a sync that changed many frontends hands every free page of every arena back
//!   (madvise), which is what the resident size then shows.

/// Syncs that changed at least this many frontends are followed by a trim (the first sync, a relist).
pub const TRIM_AFTER: usize = 1_000;

/// At most two malloc arenas (glibc's `M_ARENA_MAX`); call before any thread starts.
pub fn limit_arenas() {
    // SAFETY: mallopt only changes the allocator's parameters; no pointer is involved.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
}

/// After a sync that changed at least `TRIM_AFTER` frontends: return free heap pages to the kernel.
pub fn trim_after(r: &super::SyncReport) {
    if r.added + r.updated + r.removed >= TRIM_AFTER {
        // SAFETY: malloc_trim walks the allocator's own free lists; no pointer of ours is involved.
        unsafe { libc::malloc_trim(0) };
    }
}
