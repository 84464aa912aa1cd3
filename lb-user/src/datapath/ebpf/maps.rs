//! The maps as `MapReader` and `MapWriter`: opened from a fresh load or from an earlier agent's pins.
use std::{
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
};
use lb_common::{
    AffinityKey, AffinityValue, Backend, BackendState, COUNTERS_PER_SERVICE, FrontendKey, FrontendValue,
    Health, HealthConfig, MAP_AFFINITY, MAP_BACKEND_STATE, MAP_CONNECTED_UDP, MAP_COUNTERS, MAP_FRONTENDS,
    MAP_HEALTH, MAP_HEALTH_CONFIG, MAP_MAGLEV, MAP_MEMBERS, MAP_NAMES, MAP_NESTED_AFFINITY,
    MAP_OUTSIDE_AFFINITY, MAP_REVERSE, MAP_SLOTS, MAPS, MaglevKey, MaglevTable, MemberKey, MemberValue,
    OutsideAffinityKey, ReverseKey, ReverseValue, ServiceCounters, ServiceName, SlotBlock, SlotKey,
};

use super::{Capacities, DatapathError, bpf_err};
use crate::{
    datapath::{MapError, MapReader, MapWriter, ReverseOccupancy},
    model::ServicePortName,
};

/// The fourteen maps of `lb_common::MAPS`, from a fresh load or from pins (the socket storage, pinned too, is
/// read by the kernel only).
pub struct KernelMaps {
    frontends: HashMap<MapData, FrontendKey, FrontendValue>,
    slots: HashMap<MapData, SlotKey, SlotBlock>,
    state: HashMap<MapData, Backend, BackendState>,
    counters: PerCpuArray<MapData, ServiceCounters>,
    names: HashMap<MapData, u32, ServiceName>,
    reverse: HashMap<MapData, ReverseKey, ReverseValue>,
    connected_udp: HashMap<MapData, ReverseKey, ReverseValue>,
    affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    members: HashMap<MapData, MemberKey, MemberValue>,
    health: HashMap<MapData, Backend, Health>,
    health_config: Array<MapData, HealthConfig>,
    outside_affinity: HashMap<MapData, OutsideAffinityKey, AffinityValue>,
    nested_affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    maglev: HashMap<MapData, MaglevKey, MaglevTable>,
    /// What `wait_for_readers` updates (an RCU grace period per update).
    rcu: crate::datapath::rcu::RcuWaiter,
    max_services: u32,
    caps: Capacities,
    nr_cpus: usize,
    /// A second descriptor of the counter map, from which `counters_reader` makes handles for readers off the
    /// agent loop.
    counters_fd: OwnedFd,
    /// Service ids from this one up were never given out on these maps: their counters still hold the zeros
    /// the kernel created the map with, so `reset_counters` leaves them alone (zeroing 100,000 new ids' counters
    /// was about a sixth of programming that many Services from scratch). `u32::MAX` for maps that may have
    /// counted under any id: pinned by an earlier agent and reused, or opened from pins.
    counters_zero_from: u32,
    /// Second descriptors of the maps written in batches (`put_slot_blocks`, `put_frontends`, `put_names`,
    /// `put_members`).
    batch_fds: BatchFds,
}

/// The maps' second descriptors for `BPF_MAP_UPDATE_BATCH` (aya's typed maps do not lend theirs).
struct BatchFds {
    frontends: OwnedFd,
    slots: OwnedFd,
    names: OwnedFd,
    members: OwnedFd,
}

/// A second descriptor of the hash map `map` named `name`.
fn hash_fd(map: &Map, name: &'static str) -> Result<OwnedFd, DatapathError> {
    match map {
        Map::HashMap(data) => crate::datapath::error::second_fd(data, name),
        _ => Err(DatapathError::MissingMap { name }),
    }
}

/// One batched write of `keys[i]` -> `values[i]` into the map behind `fd`, its error as `sys` makes a single
/// one's, with how many were written before it.
fn batch_counted<K: aya::Pod, V: aya::Pod>(
    fd: &OwnedFd,
    keys: &[K],
    values: &[V],
    (map, flag, capacity): (&'static str, &'static str, u32),
) -> Result<(), (usize, MapError)> {
    crate::datapath::sys::update_batch(fd.as_fd(), keys, values, size_of::<V>())
        .map_err(|(e, written)| (written, batch_err(map, flag, capacity, e)))
}

/// Batches at least this long are written by two threads, half each: the kernel's insert into a hash map
/// (`htab_map_update_elem`, its allocation and memcg charge) is most of programming 100,000 Services from
/// scratch, its buckets are locked one by one, and a node's agent has the CPUs to itself at start. A sync
/// of a few Services (one edit: a slot block or two) stays on its own thread, where a spawn would cost more
/// than the write. A round of the reconciler's (1,024 frontends) is about 2,000 slot blocks at 10 endpoints.
const PARALLEL_MIN: usize = 1024;

/// `batch`, the halves of a long batch written at once on two threads; on an error any of them may be
/// written, as with `batch`.
fn batch_parallel<K: aya::Pod + Sync, V: aya::Pod + Sync>(
    fd: &OwnedFd,
    keys: &[K],
    values: &[V],
    what: (&'static str, &'static str, u32),
) -> Result<(), MapError> {
    if keys.len() < PARALLEL_MIN || keys.len() != values.len() {
        return batch(fd, keys, values, what);
    }
    let mid = keys.len() / 2;
    let ((k1, k2), (v1, v2)) = (keys.split_at(mid), values.split_at(mid));
    std::thread::scope(|s| {
        let second = s.spawn(|| batch(fd, k2, v2, what));
        let first = batch(fd, k1, v1, what);
        let second = second.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        first.and(second)
    })
}

/// `names[i]` as the name of `svc_ids[i]` in `SVC_NAMES` (behind `fd`), in one batch.
fn put_names(
    fd: &OwnedFd,
    svc_ids: &[u32],
    names: &[&ServicePortName],
    max_services: u32,
) -> Result<(), MapError> {
    let values: Vec<ServiceName> = names.iter().map(|n| ServiceName::new(&n.to_string())).collect();
    batch(fd, svc_ids, &values, (MAP_NAMES, "services", max_services))
}

/// A Service's counters summed over the CPUs' copies.
pub fn sum_per_cpu<'a>(
    copies: impl Iterator<Item = &'a ServiceCounters>,
) -> [u64; COUNTERS_PER_SERVICE as usize] {
    copies.fold([0; COUNTERS_PER_SERVICE as usize], |mut sum, c| {
        for (s, v) in sum.iter_mut().zip(c.counts) {
            *s += v;
        }
        sum
    })
}

/// Of `svc_ids`, about to be given out, those whose counters may hold counts: the ids below `zero_from` (ids
/// from it up were never given out, see `KernelMaps::counters_zero_from`). `zero_from` moves past every id of
/// `svc_ids`, which will count from now on.
fn ids_to_zero(svc_ids: &[u32], zero_from: &mut u32) -> Vec<u32> {
    let dirty = svc_ids.iter().copied().filter(|&id| id < *zero_from).collect();
    if let Some(&max) = svc_ids.iter().max() {
        *zero_from = (*zero_from).max(max.saturating_add(1));
    }
    dirty
}

/// `batch_counted` without the count.
fn batch<K: aya::Pod, V: aya::Pod>(
    fd: &OwnedFd,
    keys: &[K],
    values: &[V],
    what: (&'static str, &'static str, u32),
) -> Result<(), MapError> {
    batch_counted(fd, keys, values, what).map_err(|(_, e)| e)
}

impl KernelMaps {
    /// The maps of a load; `counters_created`: the load created the counter map (none was pinned to reuse).
    pub(super) fn from_ebpf(
        ebpf: &mut Ebpf,
        caps: Capacities,
        counters_created: bool,
    ) -> Result<Self, DatapathError> {
        let mut maps = Vec::with_capacity(MAPS.len());
        for name in MAPS {
            maps.push(ebpf.take_map(name).ok_or(DatapathError::MissingMap { name })?);
        }
        Self::from_maps(maps, Some(caps), counters_created)
    }

    /// `maps` in the order of `MAPS`.
    fn from_maps(
        maps: Vec<Map>,
        caps: Option<Capacities>,
        counters_created: bool,
    ) -> Result<Self, DatapathError> {
        fn conv(name: &'static str) -> impl Fn(aya::maps::MapError) -> DatapathError {
            move |e| bpf_err(format!("map {name}"), e)
        }
        let [
            frontends,
            slots,
            state,
            counters,
            names,
            reverse,
            connected_udp,
            affinity,
            members,
            health,
            health_config,
            outside_affinity,
            nested_affinity,
            maglev,
        ]: [Map; MAPS.len()] =
            maps.try_into().map_err(|_| DatapathError::MissingMap { name: "(one per name in MAPS)" })?;
        let batch_fds = BatchFds {
            frontends: hash_fd(&frontends, MAP_FRONTENDS)?,
            slots: hash_fd(&slots, MAP_SLOTS)?,
            names: hash_fd(&names, MAP_NAMES)?,
            members: hash_fd(&members, MAP_MEMBERS)?,
        };
        let frontends: HashMap<MapData, FrontendKey, FrontendValue> =
            HashMap::try_from(frontends).map_err(conv(MAP_FRONTENDS))?;
        let slots = HashMap::try_from(slots).map_err(conv(MAP_SLOTS))?;
        let state = HashMap::try_from(state).map_err(conv(MAP_BACKEND_STATE))?;
        let counters_fd = match &counters {
            Map::PerCpuArray(data) => crate::datapath::error::second_fd(data, MAP_COUNTERS)?,
            _ => return Err(DatapathError::MissingMap { name: MAP_COUNTERS }),
        };
        let counters: PerCpuArray<MapData, ServiceCounters> =
            PerCpuArray::try_from(counters).map_err(conv(MAP_COUNTERS))?;
        let names = HashMap::try_from(names).map_err(conv(MAP_NAMES))?;
        let reverse = HashMap::try_from(reverse).map_err(conv(MAP_REVERSE))?;
        let connected_udp = HashMap::try_from(connected_udp).map_err(conv(MAP_CONNECTED_UDP))?;
        let affinity = HashMap::try_from(affinity).map_err(conv(MAP_AFFINITY))?;
        let members = HashMap::try_from(members).map_err(conv(MAP_MEMBERS))?;
        let health = HashMap::try_from(health).map_err(conv(MAP_HEALTH))?;
        let health_config = Array::try_from(health_config).map_err(conv(MAP_HEALTH_CONFIG))?;
        let outside_affinity = HashMap::try_from(outside_affinity).map_err(conv(MAP_OUTSIDE_AFFINITY))?;
        let nested_affinity = HashMap::try_from(nested_affinity).map_err(conv(MAP_NESTED_AFFINITY))?;
        let maglev = HashMap::try_from(maglev).map_err(conv(MAP_MAGLEV))?;
        let caps = caps.unwrap_or(Capacities {
            services: counters.len().saturating_sub(1),
            slots: u32::MAX,
            backends: u32::MAX,
            reverse: u32::MAX,
            affinity: u32::MAX,
            conntrack: u32::MAX,
            conntrack_syn: u32::MAX,
            conntrack_udp: u32::MAX,
        });
        let nr_cpus = aya::util::nr_cpus().map_err(|(what, e)| bpf_err(what, e))?;
        Ok(Self {
            frontends,
            slots,
            state,
            counters,
            names,
            reverse,
            connected_udp,
            affinity,
            members,
            health,
            health_config,
            outside_affinity,
            nested_affinity,
            maglev,
            rcu: crate::datapath::rcu::RcuWaiter::new()
                .map_err(|e| bpf_err("creating the grace-period map", e))?,
            max_services: caps.services,
            caps,
            nr_cpus,
            counters_fd,
            counters_zero_from: if counters_created { lb_common::GLOBAL_SVC_ID + 1 } else { u32::MAX },
            batch_fds,
        })
    }

    /// Write the name of the node the agent runs on where `tierlb status` finds it: `SVC_NAMES` under
    /// `GLOBAL_SVC_ID`, an id no Service is given (and the adoption's sweep of unused names never visits).
    pub fn put_node_name(&mut self, node: &str) -> Result<(), MapError> {
        self.names.insert(lb_common::GLOBAL_SVC_ID, ServiceName::new(node), 0).map_err(sys(
            MAP_NAMES,
            "services",
            self.max_services,
        ))
    }

    /// The Service maps' memory as the kernel accounts it (`sys::map_memory`), by map: the frontends
    /// (preallocated), their slots, their affinity members and their names (not preallocated: their buckets,
    /// sized by capacity, and what they hold).
    pub fn service_memory(&self) -> [(&'static str, Option<u64>); 4] {
        use std::os::fd::AsFd as _;
        let b = &self.batch_fds;
        [
            (MAP_FRONTENDS, crate::datapath::sys::map_memory(b.frontends.as_fd())),
            (MAP_SLOTS, crate::datapath::sys::map_memory(b.slots.as_fd())),
            (MAP_MEMBERS, crate::datapath::sys::map_memory(b.members.as_fd())),
            (MAP_NAMES, crate::datapath::sys::map_memory(b.names.as_fd())),
        ]
    }

    /// Another handle on the per-CPU counter map, for a reader off the agent loop (`/metrics`): two
    /// descriptors of one map are independent in the kernel, and a per-CPU lookup is a copy, so reads through
    /// it neither wait on nor disturb the loop's writes.
    pub fn counters_reader(&self) -> Result<PerCpuArray<MapData, ServiceCounters>, DatapathError> {
        let fd = self
            .counters_fd
            .try_clone()
            .map_err(|e| bpf_err(format!("map {MAP_COUNTERS}: duplicating its descriptor"), e))?;
        let data = MapData::from_fd(fd).map_err(|e| bpf_err(format!("map {MAP_COUNTERS}"), e))?;
        PerCpuArray::try_from(Map::PerCpuArray(data)).map_err(|e| bpf_err(format!("map {MAP_COUNTERS}"), e))
    }

    /// Open maps pinned by an agent under `dir`.
    pub fn open_pinned(dir: &Path) -> Result<Self, DatapathError> {
        let open = |name: &str| {
            let path = crate::datapath::pin_path(dir, name);
            MapData::from_pin(&path)
                .map(Map::from_map_data)
                .map_err(|e| DatapathError::Pinned { path: path.clone(), source: Box::new(e) })?
                .map_err(|e| DatapathError::Pinned { path, source: Box::new(e) })
        };
        let state = dir.join(MAP_BACKEND_STATE);
        if let Ok(data) = MapData::from_pin(&state)
            && data.info().is_ok_and(|i| i.value_size() == 4)
        {
            return Err(DatapathError::MarksWithoutExpiry { path: state });
        }
        let mut maps = Vec::with_capacity(MAPS.len());
        for name in MAPS {
            maps.push(open(name)?);
        }
        Self::from_maps(maps, None, false)
    }
}

pub(super) fn sys(
    map: &'static str,
    flag: &'static str,
    capacity: u32,
) -> impl Fn(aya::maps::MapError) -> MapError {
    move |e| match e {
        e if crate::datapath::error::is_full(&e) => MapError::Full { map, capacity, flag },
        aya::maps::MapError::SyscallError(aya::sys::SyscallError { io_error, .. }) => {
            MapError::Sys { map, source: io_error }
        }
        other => MapError::Sys { map, source: std::io::Error::other(other) },
    }
}

/// A batched write's error as `sys` makes a single one's: a full map names its flag.
fn batch_err(map: &'static str, flag: &'static str, capacity: u32, e: std::io::Error) -> MapError {
    sys(map, flag, capacity)(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
        call: "bpf_map_update_batch",
        io_error: e,
    }))
}

pub(super) fn absent_ok<T>(r: Result<T, aya::maps::MapError>) -> Result<Option<T>, aya::maps::MapError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(aya::maps::MapError::KeyNotFound | aya::maps::MapError::ElementNotFound) => Ok(None),
        Err(aya::maps::MapError::SyscallError(aya::sys::SyscallError { io_error, .. }))
            if io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl MapReader for KernelMaps {
    fn frontends(&self) -> Result<Vec<(FrontendKey, FrontendValue)>, MapError> {
        self.frontends.iter().collect::<Result<Vec<_>, _>>().map_err(sys(
            MAP_FRONTENDS,
            "services",
            self.caps.services,
        ))
    }
    fn slot_block(&self, key: SlotKey) -> Result<Option<SlotBlock>, MapError> {
        absent_ok(self.slots.get(&key, 0)).map_err(sys(MAP_SLOTS, "slots", self.caps.slots))
    }
    fn slot_keys(&self) -> Result<Vec<SlotKey>, MapError> {
        self.slots.keys().collect::<Result<Vec<_>, _>>().map_err(sys(MAP_SLOTS, "slots", self.caps.slots))
    }
    fn backend_marks(&self) -> Result<Vec<(Backend, BackendState)>, MapError> {
        let all = self.state.iter().collect::<Result<Vec<_>, _>>();
        all.map_err(sys(MAP_BACKEND_STATE, "backends", self.caps.backends))
    }
    fn backend_mark(&self, backend: Backend) -> Result<Option<BackendState>, MapError> {
        absent_ok(self.state.get(&backend, 0)).map_err(sys(MAP_BACKEND_STATE, "backends", self.caps.backends))
    }
    fn counters(&self, svc_id: u32) -> Result<[u64; COUNTERS_PER_SERVICE as usize], MapError> {
        let values =
            self.counters.get(&svc_id, 0).map_err(sys(MAP_COUNTERS, "services", self.max_services))?;
        Ok(sum_per_cpu(values.iter()))
    }
    fn max_services(&self) -> u32 {
        self.max_services
    }
    fn name(&self, svc_id: u32) -> Result<Option<String>, MapError> {
        let n =
            absent_ok(self.names.get(&svc_id, 0)).map_err(sys(MAP_NAMES, "services", self.max_services))?;
        Ok(n.map(|n| n.as_str().to_owned()))
    }
    fn connected_udp(&self) -> Result<Vec<(ReverseKey, ReverseValue)>, MapError> {
        self.connected_udp.iter().collect::<Result<Vec<_>, _>>().map_err(sys(
            MAP_CONNECTED_UDP,
            "reverse",
            self.caps.reverse,
        ))
    }
    fn reverse_occupancy(&self) -> Result<ReverseOccupancy, MapError> {
        let lru = self.reverse.keys().collect::<Result<Vec<_>, _>>();
        let lru = lru.map_err(sys(MAP_REVERSE, "reverse", self.caps.reverse))?.len();
        let registered = self.connected_udp.keys().collect::<Result<Vec<_>, _>>();
        let registered = registered.map_err(sys(MAP_CONNECTED_UDP, "reverse", self.caps.reverse))?.len();
        Ok(ReverseOccupancy { lru, connected_udp: registered })
    }
    fn members(&self) -> Result<Vec<(MemberKey, MemberValue)>, MapError> {
        self.members.iter().collect::<Result<Vec<_>, _>>().map_err(sys(MAP_MEMBERS, "slots", self.caps.slots))
    }
    fn maglev_keys(&self) -> Result<Vec<MaglevKey>, MapError> {
        self.maglev.keys().collect::<Result<Vec<_>, _>>().map_err(sys(
            MAP_MAGLEV,
            "services",
            self.caps.services,
        ))
    }
    fn maglev_table(&self, key: MaglevKey) -> Result<Option<Box<MaglevTable>>, MapError> {
        let got =
            absent_ok(self.maglev.get(&key, 0)).map_err(sys(MAP_MAGLEV, "services", self.caps.services))?;
        Ok(got.map(Box::new))
    }
    /// The pods' entries and those of namespaces made inside pods (`NESTED_AFFINITY`): each is a client.
    fn affinity_entries(&self) -> Result<Vec<(AffinityKey, AffinityValue)>, MapError> {
        let all = self.affinity.iter().collect::<Result<Vec<_>, _>>();
        let mut all = all.map_err(sys(MAP_AFFINITY, "affinity", self.caps.affinity))?;
        let nested = self.nested_affinity.iter().collect::<Result<Vec<_>, _>>();
        all.extend(nested.map_err(sys(MAP_NESTED_AFFINITY, "affinity", self.caps.affinity))?);
        Ok(all)
    }
    fn outside_affinity_entries(&self) -> Result<Vec<(OutsideAffinityKey, AffinityValue)>, MapError> {
        let all = self.outside_affinity.iter().collect::<Result<Vec<_>, _>>();
        all.map_err(sys(MAP_OUTSIDE_AFFINITY, "affinity", self.caps.affinity))
    }
    fn health(&self) -> Result<Vec<(Backend, Health)>, MapError> {
        let all = self.health.iter().collect::<Result<Vec<_>, _>>();
        all.map_err(sys(MAP_HEALTH, "backends", self.caps.backends))
    }
    fn backend_health(&self, backend: Backend) -> Result<Option<Health>, MapError> {
        absent_ok(self.health.get(&backend, 0)).map_err(sys(MAP_HEALTH, "backends", self.caps.backends))
    }
    fn health_config(&self) -> Result<HealthConfig, MapError> {
        self.health_config.get(&0, 0).map_err(sys(MAP_HEALTH_CONFIG, "backends", 1))
    }
}

impl MapWriter for KernelMaps {
    fn put_slot_block(&mut self, key: SlotKey, block: SlotBlock) -> Result<(), MapError> {
        self.slots.insert(key, block, 0).map_err(sys(MAP_SLOTS, "slots", self.caps.slots))
    }
    fn put_slot_blocks(&mut self, keys: &[SlotKey], blocks: &[SlotBlock]) -> Result<(), MapError> {
        batch_parallel(&self.batch_fds.slots, keys, blocks, (MAP_SLOTS, "slots", self.caps.slots))
    }
    fn delete_slot_block(&mut self, key: SlotKey) -> Result<(), MapError> {
        absent_ok(self.slots.remove(&key)).map(|_| ()).map_err(sys(MAP_SLOTS, "slots", self.caps.slots))
    }
    fn put_frontend(&mut self, key: FrontendKey, value: FrontendValue) -> Result<(), MapError> {
        self.frontends.insert(key, value, 0).map_err(sys(MAP_FRONTENDS, "services", self.caps.services))
    }
    fn put_frontends(
        &mut self,
        keys: &[FrontendKey],
        values: &[FrontendValue],
    ) -> Result<(), (usize, MapError)> {
        batch_counted(
            &self.batch_fds.frontends,
            keys,
            values,
            (MAP_FRONTENDS, "services", self.caps.services),
        )
    }
    fn delete_frontend(&mut self, key: FrontendKey) -> Result<(), MapError> {
        absent_ok(self.frontends.remove(&key)).map(|_| ()).map_err(sys(
            MAP_FRONTENDS,
            "services",
            self.caps.services,
        ))
    }
    fn put_member(&mut self, key: MemberKey, value: MemberValue) -> Result<(), MapError> {
        self.members.insert(key, value, 0).map_err(sys(MAP_MEMBERS, "slots", self.caps.slots))
    }
    fn put_members(&mut self, keys: &[MemberKey], values: &[MemberValue]) -> Result<(), MapError> {
        batch_parallel(&self.batch_fds.members, keys, values, (MAP_MEMBERS, "slots", self.caps.slots))
    }
    fn delete_member(&mut self, key: MemberKey) -> Result<(), MapError> {
        absent_ok(self.members.remove(&key)).map(|_| ()).map_err(sys(MAP_MEMBERS, "slots", self.caps.slots))
    }
    fn put_maglev_table(&mut self, key: MaglevKey, table: &MaglevTable) -> Result<(), MapError> {
        self.maglev.insert(key, table, 0).map_err(sys(MAP_MAGLEV, "services", self.caps.services))
    }
    fn delete_maglev_table(&mut self, key: MaglevKey) -> Result<(), MapError> {
        absent_ok(self.maglev.remove(&key)).map(|_| ()).map_err(sys(
            MAP_MAGLEV,
            "services",
            self.caps.services,
        ))
    }
    fn delete_health(&mut self, backend: Backend) -> Result<(), MapError> {
        let err = sys(MAP_HEALTH, "backends", self.caps.backends);
        absent_ok(self.health.remove(&backend)).map(|_| ()).map_err(err)
    }
    fn set_health_config(&mut self, config: HealthConfig) -> Result<(), MapError> {
        self.health_config.set(0, config, 0).map_err(sys(MAP_HEALTH_CONFIG, "backends", 1))
    }
    fn put_backend_mark(&mut self, backend: Backend, mark: BackendState) -> Result<(), MapError> {
        self.state.insert(backend, mark, 0).map_err(sys(MAP_BACKEND_STATE, "backends", self.caps.backends))
    }
    fn delete_backend_mark(&mut self, backend: Backend) -> Result<(), MapError> {
        let err = sys(MAP_BACKEND_STATE, "backends", self.caps.backends);
        absent_ok(self.state.remove(&backend)).map(|_| ()).map_err(err)
    }
    fn reset_counters(&mut self, svc_ids: &[u32]) -> Result<(), MapError> {
        let svc_ids = ids_to_zero(svc_ids, &mut self.counters_zero_from);
        if svc_ids.is_empty() {
            return Ok(());
        }
        // Each id's counters, zero on every CPU, all in one batched write.
        let zeros = vec![ServiceCounters::default(); svc_ids.len() * self.nr_cpus];
        let fd = std::os::fd::AsFd::as_fd(&self.counters_fd);
        crate::datapath::sys::update_batch(fd, &svc_ids, &zeros, size_of::<ServiceCounters>() * self.nr_cpus)
            .map_err(|(e, _)| batch_err(MAP_COUNTERS, "services", self.max_services, e))
    }
    fn put_name(&mut self, svc_id: u32, name: &ServicePortName) -> Result<(), MapError> {
        self.names.insert(svc_id, ServiceName::new(&name.to_string()), 0).map_err(sys(
            MAP_NAMES,
            "services",
            self.max_services,
        ))
    }
    fn put_names(&mut self, svc_ids: &[u32], names: &[&ServicePortName]) -> Result<(), MapError> {
        put_names(&self.batch_fds.names, svc_ids, names, self.max_services)
    }
    fn put_names_and_slots(
        &mut self,
        svc_ids: &[u32],
        names: &[&ServicePortName],
        keys: &[SlotKey],
        blocks: &[SlotBlock],
    ) -> Result<(), MapError> {
        if keys.len() < PARALLEL_MIN {
            self.put_names(svc_ids, names)?;
            return self.put_slot_blocks(keys, blocks);
        }
        let slots = (MAP_SLOTS, "slots", self.caps.slots);
        // A long batch (programming many Services): the names (one allocating insert each; at 100,000 Services
        // about 170 ms, measured when they were written before the slots) on a thread of their own beside the
        // slot entries' two.
        let (fds, max_services) = (&self.batch_fds, self.max_services);
        std::thread::scope(|s| {
            let naming = s.spawn(|| put_names(&fds.names, svc_ids, names, max_services));
            let slotted = batch_parallel(&fds.slots, keys, blocks, slots);
            naming.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)).and(slotted)
        })
    }
    fn delete_name(&mut self, svc_id: u32) -> Result<(), MapError> {
        absent_ok(self.names.remove(&svc_id)).map(|_| ()).map_err(sys(
            MAP_NAMES,
            "services",
            self.max_services,
        ))
    }
    fn forget_connected_udp(&mut self, key: &ReverseKey) -> Result<(), MapError> {
        absent_ok(self.connected_udp.remove(key)).map(|_| ()).map_err(sys(
            MAP_CONNECTED_UDP,
            "reverse",
            self.caps.reverse,
        ))
    }
    fn wait_for_readers(&mut self) -> Result<(), MapError> {
        self.rcu.wait().map_err(|source| MapError::Sys { map: crate::datapath::rcu::MAP_NAME, source })
    }
}

#[cfg(test)]
mod tests {
    use super::ids_to_zero;

    /// Ids never given out are left alone and the bound moves past what is given out now; ids below it (given
    /// out before, freed, reused) are zeroed; on maps that may have counted anywhere every id is.
    #[test]
    fn only_ids_that_may_have_counted_are_zeroed() {
        let mut zero_from = 1;
        assert_eq!(ids_to_zero(&[1, 2, 3, 4], &mut zero_from), Vec::<u32>::new(), "new maps, new ids");
        assert_eq!(zero_from, 5);
        assert_eq!(ids_to_zero(&[4, 9], &mut zero_from), vec![4], "4 was given out before");
        assert_eq!(zero_from, 10, "5 to 9 count as given out: zeroed if ever handed out");
        assert_eq!(ids_to_zero(&[7], &mut zero_from), vec![7]);
        assert_eq!(ids_to_zero(&[], &mut zero_from), Vec::<u32>::new());
        assert_eq!(zero_from, 10);
        let mut reused = u32::MAX;
        assert_eq!(ids_to_zero(&[2, 70_000], &mut reused), vec![2, 70_000], "pinned maps: all");
        assert_eq!(reused, u32::MAX);
    }
}
