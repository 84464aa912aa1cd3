//! Pinned maps carried across a change of their layout (`layout::CHANGES`), so that an upgrade from the
//! release before, and a rollback to it, are rolling updates and not outages.
//!
//! Up (this release finds the previous release's pin): the old map stays pinned and in use by the old
//! programs while the loader creates the new generation under its versioned name (`plan`); the contents are
//! copied across before anything is attached (`Migration::copy`); the programs attached with the new maps
//! replace the old ones hook by hook; then `Migration::finish` carries what the old programs wrote after the
//! copy (a counter's increments, an entry the new map lacks) and unpins the old map. A connect meets one
//! complete generation at every instant: each program reads its own generation's maps.
//!
//! Down (the release before cannot read this layout): at exit the agent leaves what that release needs,
//! the previous layout's pin with the contents converted back (`leave_for_previous`), beside its own. Which of
//! two pins is live is decided by the programs attached: the generation their maps are.
use std::{
    collections::BTreeSet,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::{Path, PathBuf},
};

use aya::maps::MapData;

use super::{
    error::{DatapathError, bpf_err},
    layout::{CHANGES, Change, Shape, Sweep},
    sys::bpf,
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
/// Per-CPU map types: `PERCPU_HASH`, `PERCPU_ARRAY`, `LRU_PERCPU_HASH`.
const PER_CPU: [u32; 3] = [5, 6, 10];
/// Array types (every index in range exists): `ARRAY`, `PERCPU_ARRAY`.
const ARRAYS: [u32; 2] = [2, 6];

/// The `elem` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// A map read and written as bytes, whatever its key and value types: what a migration needs of it.
pub struct RawMap {
    data: MapData,
    map_type: u32,
    key: usize,
    value: usize,
    entries: u32,
    flags: u32,
    cpus: usize,
}

impl RawMap {
    /// The map pinned at `path`.
    pub fn open(path: &Path) -> Result<Self, DatapathError> {
        let data = MapData::from_pin(path)
            .map_err(|e| DatapathError::Pinned { path: path.to_owned(), source: Box::new(e) })?;
        Self::of(data, path)
    }

    fn of(data: MapData, path: &Path) -> Result<Self, DatapathError> {
        let info =
            data.info().map_err(|e| DatapathError::Pinned { path: path.to_owned(), source: Box::new(e) })?;
        let map_type = info.map_type().map_or(0, |t| t as u32);
        let cpus = if PER_CPU.contains(&map_type) {
            aya::util::nr_cpus().map_err(|(what, e)| bpf_err(what.to_owned(), e))?
        } else {
            1
        };
        Ok(Self {
            data,
            map_type,
            key: info.key_size() as usize,
            value: info.value_size() as usize,
            entries: info.max_entries(),
            flags: info.map_flags(),
            cpus,
        })
    }

    /// Create a map of `shape` (not pinned).
    pub(crate) fn create(shape: &Shape, name: &str) -> Result<Self, DatapathError> {
        Self::create_with(shape, 0, name)
    }

    /// An empty map of this one's type, sizes and flags (not pinned).
    pub fn empty_like(&self, name: &str) -> Result<Self, DatapathError> {
        let shape = Shape {
            pin: "",
            map_type: self.map_type,
            key: self.key as u32,
            value: self.value as u32,
            entries: self.entries,
        };
        Self::create_with(&shape, self.flags, name)
    }

    /// `enum bpf_map_type` of the map.
    pub fn map_type(&self) -> u32 {
        self.map_type
    }

    /// Key and value sizes, and capacity.
    pub fn shape(&self) -> (usize, usize, u32) {
        (self.key, self.value, self.entries)
    }

    fn create_with(shape: &Shape, flags: u32, name: &str) -> Result<Self, DatapathError> {
        let obj = aya_obj::Map::new_from_params(shape.map_type, shape.key, shape.value, shape.entries, flags);
        let data =
            MapData::create(obj, name, None).map_err(|e| bpf_err(format!("creating map {name}"), e))?;
        Self::of(data, Path::new(name))
    }

    /// The kernel's id of the map.
    pub fn id(&self) -> Option<u32> {
        self.data.info().ok().map(|i| i.id())
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.data.fd().as_fd()
    }

    /// Bytes of a value as a lookup returns it: per CPU, each rounded up to 8.
    pub fn stride(&self) -> usize {
        if PER_CPU.contains(&self.map_type) { self.value.div_ceil(8) * 8 } else { self.value }
    }

    /// Bytes of a value as `get` returns it and `put` takes it.
    pub fn value_len(&self) -> usize {
        self.stride() * self.cpus
    }

    /// Every key, in the kernel's order (an array's: its indices).
    pub fn keys(&self) -> std::io::Result<Vec<Vec<u8>>> {
        if ARRAYS.contains(&self.map_type) {
            return Ok((0..self.entries).map(|i| i.to_ne_bytes().to_vec()).collect());
        }
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut next = vec![0u8; self.key];
        loop {
            let mut attr = ElemAttr {
                map_fd: self.fd().as_raw_fd().cast_unsigned(),
                key: out.last().map_or(0, |k| k.as_ptr() as u64),
                value: next.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                Ok(_) => out.push(next.clone()),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
                Err(e) => return Err(e),
            }
        }
    }

    /// The value of `key` as lookup returns it, `None` if absent.
    pub fn get(&self, key: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
        let mut value = vec![0u8; self.value_len()];
        let mut attr = ElemAttr {
            map_fd: self.fd().as_raw_fd().cast_unsigned(),
            key: key.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            ..ElemAttr::default()
        };
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(_) => Ok(Some(value)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Write `value` (laid out as `get` returns it: per CPU, each rounded up to 8) under `key`; `flags` as
    /// `BPF_MAP_UPDATE_ELEM` takes them (0: create or replace).
    pub fn put(&self, key: &[u8], value: &[u8], flags: u64) -> std::io::Result<()> {
        let mut attr = ElemAttr {
            map_fd: self.fd().as_raw_fd().cast_unsigned(),
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            flags,
            ..ElemAttr::default()
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
    }

    /// `value` of `from` in this map's layout: each CPU's value cut or zero-extended to this map's size (a
    /// layout that appends a field, or the previous one without it).
    fn convert(&self, from: &Self, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; self.value_len()];
        for cpu in 0..self.cpus.min(from.cpus) {
            let n = self.value.min(from.value);
            out[cpu * self.stride()..][..n].copy_from_slice(&value[cpu * from.stride()..][..n]);
        }
        out
    }

    /// Whether `key` is an entry this map can hold (an array's index below its size).
    fn holds(&self, key: &[u8]) -> bool {
        !ARRAYS.contains(&self.map_type)
            || key.try_into().is_ok_and(|k: [u8; 4]| u32::from_ne_bytes(k) < self.entries)
    }

    /// Every entry: (key, value as `get` returns it).
    pub fn entries(&self) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for key in self.keys()? {
            if let Some(v) = self.get(&key)? {
                out.push((key, v));
            }
        }
        Ok(out)
    }

    /// Write `entries` of `from` (as `from.entries()` read them) into this map, converted; returns how many.
    pub fn write_from(&self, from: &Self, entries: &[(Vec<u8>, Vec<u8>)]) -> std::io::Result<usize> {
        let mut n = 0;
        for (key, value) in entries {
            if self.holds(key) {
                self.put(key, &self.convert(from, value), 0)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Copy every entry of `from` into this map, converted; returns how many.
    pub fn copy_from(&self, from: &Self) -> std::io::Result<usize> {
        self.write_from(from, &from.entries()?)
    }
}

/// One map being migrated: its old generation, open, until `finish`.
pub(crate) struct Migration {
    change: &'static Change,
    old: RawMap,
    old_path: PathBuf,
    new_path: PathBuf,
    /// The old map's entries as copied (`Sweep::Counters` adds what was counted after).
    then: Vec<(Vec<u8>, Vec<u8>)>,
    copied: usize,
}

/// What `plan` found: the migrations to make, and the pins it removed as stale.
#[derive(Default)]
pub struct Plan {
    pub(crate) migrations: Vec<Migration>,
    /// Pins of a generation no attached program uses, removed (a rollback's snapshot, or ours after one).
    pub stale: Vec<PathBuf>,
}

/// The maps the programs attached from `dir`'s pins use, by kernel id: the live generation.
fn live_map_ids(dir: &Path) -> BTreeSet<u32> {
    let mut programs: BTreeSet<u32> = super::pins::pinned_program_ids(dir).into_iter().collect();
    for device in super::tc::pinned_devices(dir) {
        for pin in super::tc::device_pins(dir, &device) {
            // A tcx link's pin, or a netlink filter's program pin.
            if let Ok(link) = aya::programs::links::PinnedLink::from_pin(&pin)
                && let Ok(info) = aya::programs::links::FdLink::from(link).info()
            {
                programs.insert(info.program_id());
            } else if let Ok(info) = aya::programs::ProgramInfo::from_pin(&pin) {
                programs.insert(info.id());
            }
        }
    }
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| programs.contains(&p.id()))
        .filter_map(|p| p.map_ids().ok().flatten())
        .flatten()
        .collect()
}

/// Before the load: for each map this layout changed, find which generation is pinned in `dir` and live.
/// The previous generation live (or alone): migrate it (a stale pin of this generation is removed first, so
/// the loader creates it afresh). This generation live (or neither used by an attached program): keep it, and
/// remove the previous generation's pin, a snapshot left for a rollback.
pub fn plan(dir: &Path) -> Result<Plan, DatapathError> {
    let mut out = Plan::default();
    let current = CHANGES.iter().filter(|c| c.layout == super::layout::MAP_LAYOUT);
    let mut live = None;
    for change in current {
        let old_path = dir.join(change.before.pin);
        let new_path = dir.join(change.pin);
        if !old_path.exists() {
            continue;
        }
        let old = RawMap::open(&old_path)?;
        let shape = (old.key as u32, old.value as u32, old.entries);
        if shape != (change.before.key, change.before.value, change.before.entries) {
            return Err(DatapathError::Incompatible { path: old_path });
        }
        if new_path.exists() {
            let live = live.get_or_insert_with(|| live_map_ids(dir));
            let new_id = RawMap::open(&new_path)?.id();
            let old_live = old.id().is_some_and(|id| live.contains(&id));
            let new_live = new_id.is_some_and(|id| live.contains(&id));
            // The previous generation is live only after a rollback; else ours is (or neither is in use).
            let migrate = old_live && !new_live;
            let stale = if migrate { &new_path } else { &old_path };
            std::fs::remove_file(stale).map_err(|e| bpf_err(format!("removing {}", stale.display()), e))?;
            out.stale.push(stale.clone());
            if !migrate {
                continue;
            }
        }
        out.migrations.push(Migration { change, old, old_path, new_path, then: Vec::new(), copied: 0 });
    }
    Ok(out)
}

impl Plan {
    /// After the load, before any program is attached: fill each new generation from the old one.
    pub fn copy(&mut self) -> Result<(), DatapathError> {
        for m in &mut self.migrations {
            let new = RawMap::open(&m.new_path)?;
            let failed =
                |e| bpf_err(format!("copying {} into {}", m.old_path.display(), m.new_path.display()), e);
            m.then = m.old.entries().map_err(failed)?;
            m.copied = new.write_from(&m.old, &m.then).map_err(failed)?;
        }
        Ok(())
    }

    /// After every program is attached with the new maps: carry what the old programs wrote since the copy,
    /// then unpin the old generation. Returns (map, layout it came from, entries copied) for the log.
    pub fn finish(self) -> Result<Vec<(&'static str, u32, usize)>, DatapathError> {
        let mut done = Vec::new();
        for m in self.migrations {
            let new = RawMap::open(&m.new_path)?;
            let failed = |e| bpf_err(format!("the last pass from {}", m.old_path.display()), e);
            let Sweep::Counters = m.change.sweep;
            for (key, now) in m.old.entries().map_err(failed)? {
                let then = m.then.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_slice());
                let Some(mut value) = new.get(&key).map_err(failed)? else { continue };
                add_since(&mut value, &new, &now, then, &m.old);
                new.put(&key, &value, 0).map_err(failed)?;
            }
            std::fs::remove_file(&m.old_path)
                .map_err(|e| bpf_err(format!("removing {}", m.old_path.display()), e))?;
            done.push((m.change.map, m.change.layout - 1, m.copied));
        }
        Ok(done)
    }

    /// Whether there is nothing to migrate.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.migrations.is_empty()
    }
}

/// Add to `value` (a `new` value as lookup returns it) each CPU's `u64` counts of `old` between `then` and
/// `now` (values as `old`'s lookup returns them).
fn add_since(value: &mut [u8], new: &RawMap, now: &[u8], then: Option<&[u8]>, old: &RawMap) {
    let word = |bytes: &[u8], at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    for cpu in 0..new.cpus.min(old.cpus) {
        for w in 0..(new.value.min(old.value) / 8) {
            let from = cpu * old.stride() + w * 8;
            let delta = word(now, from).wrapping_sub(then.map_or(0, |t| word(t, from)));
            let at = cpu * new.stride() + w * 8;
            let sum = word(value, at).wrapping_add(delta);
            value[at..at + 8].copy_from_slice(&sum.to_ne_bytes());
        }
    }
}

/// At exit: pin each map this layout changed under its previous layout's name as well, its contents converted
/// back, for an agent of the release before (which reuses that pin, and does not know this one's). Returns
/// the pins written.
pub fn leave_for_previous(dir: &Path) -> Result<Vec<PathBuf>, DatapathError> {
    let mut out = Vec::new();
    for change in CHANGES.iter().filter(|c| c.layout == super::layout::MAP_LAYOUT) {
        let new_path = dir.join(change.pin);
        if !new_path.exists() {
            continue;
        }
        let new = RawMap::open(&new_path)?;
        let old = RawMap::create(&change.before, change.map)?;
        old.copy_from(&new).map_err(|e| bpf_err(format!("copying {} back", new_path.display()), e))?;
        let path = dir.join(change.before.pin);
        // Pinned beside, then renamed over whatever is there: the name is never missing nor half-written.
        let fresh = dir.join(format!("{}_prev", change.before.pin));
        let _ = std::fs::remove_file(&fresh);
        old.data.pin(&fresh).map_err(|e| bpf_err(format!("pinning {}", fresh.display()), e))?;
        std::fs::rename(&fresh, &path).map_err(|e| bpf_err(format!("replacing {}", path.display()), e))?;
        out.push(path);
    }
    Ok(out)
}
