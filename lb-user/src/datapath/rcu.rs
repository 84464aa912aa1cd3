//! Waiting for an RCU grace period from user space: the reconciler's slot grace period, taken from the kernel
//! instead of guessed.
//!
//! The kernel's guarantee: cgroup `sock_addr` programs are not sleepable and run under `rcu_read_lock()`
//! (`bpf_prog_run_array_cg` in kernel/bpf/cgroup.c), so every value a program read from a map (a frontend
//! value, and through it the slots it points at) is used within one RCU read-side critical section. An
//! update or delete of an element of a map-in-map (`BPF_MAP_TYPE_ARRAY_OF_MAPS` / `HASH_OF_MAPS`) calls
//! `maybe_wait_bpf_programs()` after it succeeds (`map_update_elem`, `map_delete_elem` in
//! kernel/bpf/syscall.c, 6.x), which calls `synchronize_rcu()` for exactly those map types: when the bpf()
//! call returns, every non-sleepable program that was running when it began has finished. So: swap the
//! frontends, make one such update, and no program still holds an old frontend value; its slots can go.
//!
//! aya 0.14 can open an array of maps but not create one without a BPF object, so both maps are made here
//! with a raw `BPF_MAP_CREATE`: the outer array of maps (one slot) and the inner array (one `u32`). Nothing
//! reads them.
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};

use aya::maps::{Map, MapData, of_maps::ArrayOfMaps};

/// The name the outer map is created with (what `bpftool map` shows, and errors name).
pub(crate) const MAP_NAME: &str = "TIERLB_RCU";

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE` (include/uapi/linux/bpf.h); the kernel
/// accepts a shorter attr than its own and zero-fills the rest.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// A one-entry array (`u32` key and value) of `map_type`; `inner` is the inner map of an array of maps.
fn create(map_type: u32, name: &str, inner: Option<&MapData>) -> std::io::Result<MapData> {
    let mut attr = MapCreateAttr {
        map_type,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        inner_map_fd: inner.map_or(0, |m| m.fd().as_fd().as_raw_fd().cast_unsigned()),
        ..MapCreateAttr::default()
    };
    attr.map_name[..name.len()].copy_from_slice(name.as_bytes());
    let fd = super::sys::bpf(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    MapData::from_fd(fd).map_err(std::io::Error::other)
}

/// An array of maps with one slot, and the array it holds; each `wait` rewrites the slot.
pub(crate) struct RcuWaiter {
    outer: ArrayOfMaps<MapData, MapData>,
    inner: MapData,
}

impl RcuWaiter {
    pub(crate) fn new() -> std::io::Result<Self> {
        let inner = create(BPF_MAP_TYPE_ARRAY, "TIERLB_RCU_IN", None)?;
        let outer = create(BPF_MAP_TYPE_ARRAY_OF_MAPS, MAP_NAME, Some(&inner))?;
        let outer = ArrayOfMaps::try_from(Map::ArrayOfMaps(outer)).map_err(std::io::Error::other)?;
        Ok(Self { outer, inner })
    }

    /// One `synchronize_rcu()`: returns when every BPF program running at the call has finished.
    pub(crate) fn wait(&mut self) -> std::io::Result<()> {
        self.outer.set(0, &self.inner, 0).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_update_of_the_array_of_maps_waits_for_a_grace_period() {
        assert!(nix::unistd::geteuid().is_root(), "creating a BPF map needs CAP_BPF: run the suite as root");
        let mut w = super::RcuWaiter::new().unwrap();
        // synchronize_rcu() waits until every CPU has passed a quiescent state: milliseconds (scheduler
        // ticks) unless RCU grace periods are expedited (/sys/kernel/rcu_expedited, 0 by default); a map
        // update that does not wait takes a few microseconds. So a call that returns at once did not wait.
        let start = std::time::Instant::now();
        w.wait().unwrap();
        w.wait().unwrap();
        let took = start.elapsed();
        eprintln!("two grace periods took {took:?}");
        assert!(took > std::time::Duration::from_micros(200), "{took:?}");
    }
}
