//! Pinned maps migrated across a layout change, in the kernel, read back after each step: the map layout 2
//! changed (NS_COUNTERS, 32 -> 64 per-CPU counters) carried up from the previous release's pin with every
//! CPU's counts, the counts its programs made after the copy added at the last pass, and carried back down
//! for a rollback; and the byte-level copy the migrations use, on every kind of map the agent pins.
use std::{collections::BTreeMap, path::Path};

use aya::maps::{MapData, PerCpuArray, PerCpuValues};
use lb_common::{MAP_NS_COUNTERS, PINNED_MAPS};
use lb_testkit::sandbox::BpfFs;
use tierlb::datapath::{
    ebpf::{Capacities, Loaded},
    migrate::{self, RawMap},
    pin_path,
};

const SMALL: Capacities = Capacities::all(64);

/// The previous release's NS_COUNTERS (layout 1: a per-CPU array of 32 `u64`).
const PREVIOUS_SLOTS: u32 = 32;

/// A private bpffs and an instance directory `node-1` on it (needs root).
fn instance(tag: &str) -> (BpfFs, std::path::PathBuf) {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF maps)");
    let bpffs = BpfFs::new(tag).unwrap();
    let dir = bpffs.path().join("node-1");
    std::fs::create_dir_all(&dir).unwrap();
    (bpffs, dir)
}

/// Every CPU's value of each index of a pinned per-CPU `u64` array.
fn per_cpu(path: &Path) -> Vec<Vec<u64>> {
    let data = MapData::from_pin(path).unwrap();
    let map = PerCpuArray::<_, u64>::try_from(aya::maps::Map::PerCpuArray(data)).unwrap();
    (0..map.len()).map(|i| map.get(&i, 0).unwrap().iter().copied().collect()).collect()
}

/// Add `by(index, cpu)` to each CPU's value of each index, as the programs' increments would.
fn count(path: &Path, by: impl Fn(u32, usize) -> u64) {
    let data = MapData::from_pin(path).unwrap();
    let mut map = PerCpuArray::<_, u64>::try_from(aya::maps::Map::PerCpuArray(data)).unwrap();
    for i in 0..map.len() {
        let now: Vec<u64> = map.get(&i, 0).unwrap().iter().copied().collect();
        let values: Vec<u64> = now.iter().enumerate().map(|(cpu, v)| v + by(i, cpu)).collect();
        map.set(i, PerCpuValues::try_from(values).unwrap(), 0).unwrap();
    }
}

#[test]
fn ns_counters_migrate_up_from_layout_1_with_late_counts_and_back_down_for_a_rollback() {
    let (_bpffs, dir) = instance("migrate");
    let old_pin = dir.join(MAP_NS_COUNTERS);
    let new_pin = pin_path(&dir, MAP_NS_COUNTERS);
    assert_ne!(old_pin, new_pin, "layout 2 pins NS_COUNTERS under a new name");

    // The previous release's map, made as its loader made it, with counts on every CPU.
    let old = PerCpuArray::<MapData, u64>::create(PREVIOUS_SLOTS, 0).unwrap();
    old.pin(&old_pin).unwrap();
    count(&old_pin, |i, cpu| u64::from(i) * 1_000 + cpu as u64 + 1);
    let before = per_cpu(&old_pin);

    // Up: the load copies into the new generation, leaving the old pinned (its programs still count).
    let loaded = Loaded::load(SMALL, Some(&dir)).unwrap();
    assert!(old_pin.exists() && new_pin.exists());
    let copied = per_cpu(&new_pin);
    assert_eq!(copied.len(), lb_common::NS_COUNTER_SLOTS as usize);
    assert_eq!(copied[..PREVIOUS_SLOTS as usize], before[..], "every index and CPU copied");
    assert!(copied[PREVIOUS_SLOTS as usize..].iter().flatten().all(|v| *v == 0), "the new slots start at 0");

    // The old programs count on until they are replaced; the new ones count too. The last pass adds the
    // old map's counts since the copy, and unpins it.
    count(&old_pin, |i, _| u64::from(i % 3));
    count(&new_pin, |_, cpu| 100 + cpu as u64);
    let done = loaded.migration.finish().unwrap();
    assert_eq!(done, vec![(MAP_NS_COUNTERS, 1, PREVIOUS_SLOTS as usize)]);
    assert!(!old_pin.exists(), "the old generation unpinned");
    let after = per_cpu(&new_pin);
    for (i, cpus) in after.iter().enumerate().take(PREVIOUS_SLOTS as usize) {
        for (cpu, v) in cpus.iter().enumerate() {
            let want = before[i][cpu] + (i as u64 % 3) + 100 + cpu as u64;
            assert_eq!(*v, want, "index {i}, cpu {cpu}: copied + counted late + counted new");
        }
    }

    // Down: at exit the agent pins the previous layout again, converted back; the next start of this
    // release keeps its own generation (no program uses either here) and removes that snapshot.
    drop(loaded.programs);
    let left = migrate::leave_for_previous(&dir).unwrap();
    assert_eq!(left, vec![old_pin.clone()]);
    let down = per_cpu(&old_pin);
    assert_eq!(down.len(), PREVIOUS_SLOTS as usize, "the previous layout's size");
    assert_eq!(down[..], after[..PREVIOUS_SLOTS as usize], "every CPU's counts carried back");
    let plan = migrate::plan(&dir).unwrap();
    assert!(plan.is_empty(), "this generation kept");
    assert_eq!(plan.stale, vec![old_pin.clone()]);
    assert!(!old_pin.exists() && new_pin.exists());

    // A pin named as the previous layout's but of another shape is refused, naming it.
    let odd = PerCpuArray::<MapData, u64>::create(16, 0).unwrap();
    odd.pin(&old_pin).unwrap();
    std::fs::remove_file(&new_pin).unwrap();
    let err = migrate::plan(&dir).err().expect("refused").to_string();
    assert!(err.contains("NS_COUNTERS") && err.contains("another layout"), "{err}");
}

/// Deterministic bytes for test entries.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Map types whose contents user space cannot copy as bytes: socket storage (keyed by a socket's fd) and a
/// ring buffer (no elements). A layout change of them cannot be migrated, only recreated.
const NOT_COPIED: [(u32, &str); 2] = [(24, "sk_storage"), (27, "ringbuf")];

#[test]
fn every_pinned_map_kind_copies_byte_for_byte() {
    let (_bpffs, dir) = instance("migrate-copy");
    let loaded = Loaded::load(SMALL, Some(&dir)).unwrap();
    let mut kinds = BTreeMap::new();
    let mut skipped = Vec::new();
    for name in PINNED_MAPS {
        let map = RawMap::open(&pin_path(&dir, name)).unwrap();
        if NOT_COPIED.iter().any(|(t, _)| *t == map.map_type()) {
            skipped.push(name);
            continue;
        }
        let (key, value, entries) = map.shape();
        let arrays = [2, 6].contains(&map.map_type());
        let mut written = 0;
        for n in 0..5u64 {
            let mut k = bytes(n + 1, key);
            if arrays {
                k = ((n as u32 * 7) % entries).to_ne_bytes().to_vec();
            } else if map.map_type() == 11 {
                // An LPM trie's key: a prefix length no longer than its data, then the data.
                let bits = ((key - 4) * 8) as u32;
                k[..4].copy_from_slice(&(n as u32 * 8 % (bits + 1)).to_ne_bytes());
            }
            let mut v = vec![0u8; map.value_len()];
            for (cpu, chunk) in v.chunks_mut(map.stride()).enumerate() {
                chunk[..value].copy_from_slice(&bytes(n * 31 + cpu as u64 + 7, value));
            }
            map.put(&k, &v, 0).unwrap_or_else(|e| panic!("{name}: writing an entry: {e}"));
            written += 1;
        }
        let copy = map.empty_like(name).unwrap();
        let n = copy.copy_from(&map).unwrap();
        let (mut a, mut b) = (map.entries().unwrap(), copy.entries().unwrap());
        a.sort();
        b.sort();
        assert!(written > 0 && n == a.len(), "{name}: {n} copied of {}", a.len());
        assert_eq!(a, b, "{name}: contents equal after the copy, read back from the kernel");
        *kinds.entry(map.map_type()).or_insert(0) += 1;
    }
    assert_eq!(skipped, ["SOCKS", "TRACE_EVENTS"], "only socket storage and the ring buffer are not copied");
    // Hash, array, per-CPU array, LRU hash, LPM trie: every kind the agent pins, besides those two.
    assert!(kinds.len() >= 5, "map kinds copied: {kinds:?}");
    drop(loaded);
}
