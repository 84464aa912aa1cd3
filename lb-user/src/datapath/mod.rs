//! The data path as user space sees it: the map contents (`Desired`), a reader and a writer over the maps
//! (the aya implementation in `ebpf`, an in-memory fake for tests), the reconciler that writes only what
//! changed, pinning (`pins`) and socket destruction (`destroy`).
//!
//! This module knows map layouts, not Kubernetes semantics: the agent lowers a plan to `Desired` (which
//! tiers, which flags) before anything here sees it.
pub mod addr;
#[cfg(target_os = "linux")]
pub mod attached;
#[cfg(target_os = "linux")]
mod capacity;
mod connects;
#[cfg(target_os = "linux")]
pub mod destroy;
#[cfg(target_os = "linux")]
pub mod ebpf;
#[cfg(target_os = "linux")]
mod error;
pub mod fake;
pub mod health;
#[cfg(target_os = "linux")]
mod layout;
pub mod maglev;
pub mod marks;
#[cfg(target_os = "linux")]
pub mod migrate;
#[cfg(target_os = "linux")]
pub mod pins;
#[cfg(target_os = "linux")]
mod programs;
#[cfg(target_os = "linux")]
mod rcu;
mod reconcile;
#[cfg(target_os = "linux")]
mod sys;
pub mod tc;
#[cfg(target_os = "linux")]
pub mod xdp;

use std::{collections::BTreeMap, sync::Arc};

pub use connects::Counters;
pub use layout::{LAYOUT_HISTORY, MAP_LAYOUT, fingerprint as layout_fingerprint, pin_name, pin_path};
use lb_common::{
    AffinityKey, AffinityValue, Backend, BackendState, COUNTERS_PER_SERVICE, FrontendKey, FrontendValue,
    Health, HealthConfig, MaglevKey, MaglevTable, MemberKey, MemberValue, ReverseKey, ReverseValue,
    SlotBlock, SlotKey, TIER_COUNT,
};
pub use reconcile::{AdoptReport, AppliedFrontend, ApplyError, ApplyReport, DEFAULT_GRACE, Reconciler};

use crate::model::ServicePortName;

/// What one frontend (VIP, port, protocol) should hold: the map contents the agent lowered a plan to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    /// The Service port it serves (stored per service id for `status`, metrics and adoption). Shared: every
    /// frontend of a port, the reconciler's record of it and the metrics snapshot hold the same one.
    pub name: Arc<ServicePortName>,
    /// Backends per tier (node, zone, cluster), in the order the data path tries them.
    pub tiers: [Vec<Backend>; TIER_COUNT],
    /// `FLAG_*` bits of the frontend value.
    pub flags: u32,
    /// sessionAffinity ClientIP timeout in seconds; 0 is none (`FrontendValue::affinity_timeout_s`).
    pub affinity_timeout_s: u32,
}

/// Every frontend the maps should hold, by key.
pub type Desired = BTreeMap<FrontendKey, DesiredFrontend>;

/// A map operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The map has no room for another entry.
    #[error("map {map} is full (capacity {capacity}); raise its capacity with --max-{flag}")]
    Full {
        /// The map's name.
        map: &'static str,
        /// Its max_entries.
        capacity: u32,
        /// The agent flag that sets it, less `--max-`.
        flag: &'static str,
    },
    /// A tier has more backends than a `TierRange`'s u16 length can say.
    #[error("a tier of {len} backends does not fit a slot range (at most 65535)")]
    TierTooLong {
        /// The tier's length.
        len: usize,
    },
    /// Every service id up to the frontends' capacity is taken.
    #[error("no free service id (all {capacity} in use); raise --max-services")]
    NoServiceId {
        /// The frontends' capacity.
        capacity: u32,
    },
    /// The bpf() call failed otherwise.
    #[error("map {map}: {source}")]
    Sys {
        /// The map's name.
        map: &'static str,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
}

/// What can be read from the maps: what `tierlb status` and a restarted agent's adoption need. The aya
/// implementation reads the kernel's maps (also from pins); the fake keeps them in memory.
pub trait MapReader {
    /// Every frontend with its value.
    fn frontends(&self) -> Result<Vec<(FrontendKey, FrontendValue)>, MapError>;
    /// One entry of the slot map (`SLOT_BLOCK` slots of a frontend's generation).
    fn slot_block(&self, key: SlotKey) -> Result<Option<SlotBlock>, MapError>;
    /// Every entry's key (adoption removes entries no frontend points at).
    fn slot_keys(&self) -> Result<Vec<SlotKey>, MapError>;
    /// Every backend mark, expired or not (the agent's sweep deletes expired ones).
    fn backend_marks(&self) -> Result<Vec<(Backend, BackendState)>, MapError>;
    /// One backend's mark, if it has one.
    fn backend_mark(&self, backend: Backend) -> Result<Option<BackendState>, MapError>;
    /// Backends the data path skips now: marked down and not expired.
    fn backends_down(&self) -> Result<Vec<Backend>, MapError> {
        let now = marks::boottime_ns();
        Ok(self.backend_marks()?.into_iter().filter(|(_, m)| m.is_down_at(now)).map(|(b, _)| b).collect())
    }
    /// Counters of one service id, summed over CPUs.
    fn counters(&self, svc_id: u32) -> Result<[u64; COUNTERS_PER_SERVICE as usize], MapError>;
    /// How many service ids the counter map has room for.
    fn max_services(&self) -> u32;
    /// The Service port a service id serves, as stored (`namespace/name:port`; cut at 128 bytes).
    fn name(&self, svc_id: u32) -> Result<Option<String>, MapError>;
    /// Every connected UDP socket the data path registered: which socket (cookie, network namespace) is
    /// connected to which backend for which VIP (what socket destruction needs).
    fn connected_udp(&self) -> Result<Vec<(ReverseKey, ReverseValue)>, MapError>;
    /// How many reverse entries the LRU and the connected-UDP registry hold (not the sockets' own storage,
    /// which is freed with them and cannot be counted from user space, nor the TCP slots of `REVERSE_TCP`).
    fn reverse_occupancy(&self) -> Result<ReverseOccupancy, MapError>;
    /// Every member entry of the frontends with sessionAffinity (adoption removes orphans).
    fn members(&self) -> Result<Vec<(MemberKey, MemberValue)>, MapError>;
    /// The keys of every Maglev table (adoption removes orphans).
    fn maglev_keys(&self) -> Result<Vec<MaglevKey>, MapError>;
    /// One Maglev table, if written.
    fn maglev_table(&self, key: MaglevKey) -> Result<Option<Box<MaglevTable>>, MapError>;
    /// Every sessionAffinity entry, expired or not (`tierlb status`).
    fn affinity_entries(&self) -> Result<Vec<(AffinityKey, AffinityValue)>, MapError>;
    /// Every sessionAffinity entry of clients outside the node (the tc programs'), expired or not.
    fn outside_affinity_entries(
        &self,
    ) -> Result<Vec<(lb_common::OutsideAffinityKey, AffinityValue)>, MapError> {
        Ok(Vec::new())
    }
    /// Every passive-health entry the kernel keeps.
    fn health(&self) -> Result<Vec<(Backend, Health)>, MapError>;
    /// One backend's passive-health entry, if it has one.
    fn backend_health(&self, backend: Backend) -> Result<Option<Health>, MapError>;
    /// The passive-health settings as the data path reads them now (with its gate, `active`).
    fn health_config(&self) -> Result<HealthConfig, MapError>;
}

/// Everything the agent (and `tierlb backend`) writes to the maps.
pub trait MapWriter: MapReader {
    /// Write one entry of the slot map.
    fn put_slot_block(&mut self, key: SlotKey, block: SlotBlock) -> Result<(), MapError>;
    /// Write `keys[i]` -> `blocks[i]` (the slots of one generation or of many), in one map operation where
    /// the maps have one (`BPF_MAP_UPDATE_BATCH`). On an error some of them may be written, as one by one.
    fn put_slot_blocks(&mut self, keys: &[SlotKey], blocks: &[SlotBlock]) -> Result<(), MapError> {
        for (k, b) in keys.iter().zip(blocks) {
            self.put_slot_block(*k, *b)?;
        }
        Ok(())
    }
    /// Delete one entry of the slot map (absent is fine).
    fn delete_slot_block(&mut self, key: SlotKey) -> Result<(), MapError>;
    /// Write (or replace, in one update) a frontend's value.
    fn put_frontend(&mut self, key: FrontendKey, value: FrontendValue) -> Result<(), MapError>;
    /// Write `keys[i]` -> `values[i]`, each as `put_frontend` does, in one map operation where the maps have
    /// one; in order, stopping at the first error, which comes with how many were written before it.
    fn put_frontends(
        &mut self,
        keys: &[FrontendKey],
        values: &[FrontendValue],
    ) -> Result<(), (usize, MapError)> {
        frontends_one_by_one(self, keys, values)
    }
    /// Delete a frontend (absent is fine).
    fn delete_frontend(&mut self, key: FrontendKey) -> Result<(), MapError>;
    /// Write one member entry of a frontend with sessionAffinity.
    fn put_member(&mut self, key: MemberKey, value: MemberValue) -> Result<(), MapError>;
    /// Write `keys[i]` -> `values[i]` (member entries), in one map operation where the maps have one; on an
    /// error some of them may be written.
    fn put_members(&mut self, keys: &[MemberKey], values: &[MemberValue]) -> Result<(), MapError> {
        keys.iter().zip(values).try_for_each(|(k, v)| self.put_member(*k, *v))
    }
    /// Delete one member entry (absent is fine).
    fn delete_member(&mut self, key: MemberKey) -> Result<(), MapError>;
    /// Write one Maglev table (`maglev::tables`).
    fn put_maglev_table(&mut self, key: MaglevKey, table: &MaglevTable) -> Result<(), MapError>;
    /// Delete one Maglev table (absent is fine).
    fn delete_maglev_table(&mut self, key: MaglevKey) -> Result<(), MapError>;
    /// Delete a backend's passive-health entry (absent is fine).
    fn delete_health(&mut self, backend: Backend) -> Result<(), MapError>;
    /// Write the passive health settings the data path reads.
    fn set_health_config(&mut self, config: HealthConfig) -> Result<(), MapError>;
    /// Write a backend's mark (see `marks::mark_down`). One map write; while the mark lasts the data path
    /// skips the backend from the next connect on.
    fn put_backend_mark(&mut self, backend: Backend, mark: BackendState) -> Result<(), MapError>;
    /// Delete a backend's mark (absent is fine): it is up again.
    fn delete_backend_mark(&mut self, backend: Backend) -> Result<(), MapError>;
    /// Zero the counters of these service ids (a reused id must not inherit another Service's counts), in one
    /// map operation where the maps have one.
    fn reset_counters(&mut self, svc_ids: &[u32]) -> Result<(), MapError>;
    /// Store the Service port a service id serves.
    fn put_name(&mut self, svc_id: u32, name: &ServicePortName) -> Result<(), MapError>;
    /// Store `names[i]` as the Service port `svc_ids[i]` serves, in one map operation where the maps have
    /// one; on an error some of them may be stored.
    fn put_names(&mut self, svc_ids: &[u32], names: &[&ServicePortName]) -> Result<(), MapError> {
        svc_ids.iter().zip(names).try_for_each(|(id, n)| self.put_name(*id, n))
    }
    /// `put_names` and `put_slot_blocks` of one swap's first step, at once where the maps gain from it (the kernel
    /// maps write a long batch's names beside its slots, on another thread); on an error some of either may
    /// be written.
    fn put_names_and_slots(
        &mut self,
        svc_ids: &[u32],
        names: &[&ServicePortName],
        keys: &[SlotKey],
        blocks: &[SlotBlock],
    ) -> Result<(), MapError> {
        self.put_names(svc_ids, names)?;
        self.put_slot_blocks(keys, blocks)
    }
    /// Forget a service id's name.
    fn delete_name(&mut self, svc_id: u32) -> Result<(), MapError>;
    /// Drop a connected UDP socket's registration (it was destroyed, or its namespace is gone); absent is
    /// fine (the socket's release deletes it too).
    fn forget_connected_udp(&mut self, key: &ReverseKey) -> Result<(), MapError>;
    /// Return once no BPF program still runs that started before the call: what a program read from the
    /// maps before it (a frontend value that pointed at old slots) is no longer in use. One wait covers every
    /// write made before it, so callers wait once per batch. In-memory maps have no readers to wait for.
    fn wait_for_readers(&mut self) -> Result<(), MapError>;
}

/// `MapWriter::put_frontends` for maps without a batch operation: `put_frontend` for each, in order.
pub(crate) fn frontends_one_by_one<W: MapWriter + ?Sized>(
    w: &mut W,
    keys: &[FrontendKey],
    values: &[FrontendValue],
) -> Result<(), (usize, MapError)> {
    for (i, (k, v)) in keys.iter().zip(values).enumerate() {
        w.put_frontend(*k, *v).map_err(|e| (i, e))?;
    }
    Ok(())
}

/// Reverse entries outside socket storage, read from the maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReverseOccupancy {
    /// Entries in the reverse LRU (unconnected UDP, TCP sockets whose slot was held) (`REVERSE`; its capacity
    /// is `--max-reverse`).
    pub lru: usize,
    /// Connected UDP sockets registered for destruction (`CONNECTED_UDP`).
    pub connected_udp: usize,
}

/// A frontend as read back from the maps: its value and the backends of each tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBack {
    /// The frontend's map value.
    pub value: FrontendValue,
    /// The backends of each tier's slot range (node, zone, cluster).
    pub tiers: [Vec<Backend>; TIER_COUNT],
}

/// Read every frontend and its tiers from the maps (what the data path sees now).
pub fn read_back(w: &impl MapReader) -> Result<BTreeMap<FrontendKey, ReadBack>, MapError> {
    let mut out = BTreeMap::new();
    for (key, value) in w.frontends()? {
        let mut tiers: [Vec<Backend>; TIER_COUNT] = Default::default();
        // The block read last: a tier's slots are consecutive, so most are in it.
        let mut last: Option<(SlotKey, Option<SlotBlock>)> = None;
        for (t, range) in value.tiers.iter().enumerate() {
            for i in 0..u32::from(range.len) {
                let (key, at) = SlotKey::locate(value.svc_id, value.generation, u32::from(range.start) + i);
                let block = match last {
                    Some((k, block)) if k == key => block,
                    _ => last.insert((key, w.slot_block(key)?)).1,
                };
                if let Some(b) = block {
                    tiers[t].push(b.slots[at]);
                }
            }
        }
        out.insert(key, ReadBack { value, tiers });
    }
    Ok(out)
}
