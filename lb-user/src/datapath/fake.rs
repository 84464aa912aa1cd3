//! In-memory maps with the kernel's capacity behaviour, for reconciler and agent tests: the hash maps the agent
//! writes (FRONTENDS, SLOTS, MEMBERS, SVC_NAMES, BACKEND_STATE) refuse a new key when full as the kernel's do
//! (E2BIG, checked against them by tests/fake_vs_kernel.rs). Not modelled: the LRU maps' eviction (REVERSE,
//! AFFINITY, conntrack: the kernel evicts from per-CPU free lists, in no order a fake could predict; entries
//! the data path would write are kept until deleted), `ReverseOccupancy::lru` (0), and readers in flight
//! (`wait_for_readers` counts the waits).
use std::collections::BTreeMap;

use lb_common::{
    AffinityKey, AffinityValue, Backend, BackendState, COUNTERS_PER_SERVICE, FrontendKey, FrontendValue,
    Health, HealthConfig, MaglevKey, MaglevTable, MemberKey, MemberValue, ReverseKey, ReverseValue,
    SlotBlock, SlotKey,
};

use super::{MapError, MapReader, MapWriter, ReverseOccupancy};
use crate::model::ServicePortName;

/// The maps in memory: a `MapWriter` and `MapReader` that fails where the kernel's would (a full map).
#[derive(Debug, Default)]
pub struct FakeMaps {
    frontends: BTreeMap<FrontendKey, FrontendValue>,
    slots: BTreeMap<SlotKey, SlotBlock>,
    marks: BTreeMap<Backend, BackendState>,
    counters: BTreeMap<u32, [u64; COUNTERS_PER_SERVICE as usize]>,
    names: BTreeMap<u32, String>,
    connected_udp: BTreeMap<ReverseKey, ReverseValue>,
    members: BTreeMap<MemberKey, MemberValue>,
    maglev: BTreeMap<MaglevKey, Box<MaglevTable>>,
    affinity: BTreeMap<AffinityKey, AffinityValue>,
    health: BTreeMap<Backend, Health>,
    health_config: HealthConfig,
    /// A failure `sock_ops` records the instant the gate is closed (`fail_when_the_gate_closes`).
    racing_failure: Option<Health>,
    reader_waits: usize,
    reader_waits_fail: bool,
    max_services: u32,
    max_slots: u32,
    /// `BACKEND_STATE`'s capacity (`--max-backends`); 0: unbounded.
    max_backends: u32,
    writes: usize,
    /// `put_slot_blocks` calls (each one map operation in the kernel's maps).
    slot_batches: usize,
    /// `put_frontends` calls, likewise.
    frontend_batches: usize,
}

impl FakeMaps {
    /// Empty maps holding at most `max_services` frontends and `max_slots` entries of the slot map
    /// (`SLOT_BLOCK` slots each).
    pub fn new(max_services: u32, max_slots: u32) -> Self {
        Self { max_services, max_slots, ..Self::default() }
    }
    /// With room for `max_backends` backend marks, as the kernel's `BACKEND_STATE` has.
    #[must_use]
    pub fn with_backends(self, max_backends: u32) -> Self {
        Self { max_backends, ..self }
    }
    /// The frontend stored under `key`.
    pub fn frontend(&self, key: FrontendKey) -> Option<FrontendValue> {
        self.frontends.get(&key).copied()
    }
    /// Entries of the slot map stored (`SLOT_BLOCK` slots each), over every frontend and generation.
    pub fn slot_entries(&self) -> usize {
        self.slots.len()
    }
    /// The member entries stored, over every frontend and generation.
    pub fn member_map(&self) -> &BTreeMap<MemberKey, MemberValue> {
        &self.members
    }
    /// An affinity entry, as the data path writes one.
    pub fn put_affinity(&mut self, key: AffinityKey, value: AffinityValue) {
        self.affinity.insert(key, value);
    }
    /// A passive-health entry, as the kernel writes one.
    pub fn put_health(&mut self, h: Health) {
        self.health.insert(h.backend, h);
    }
    /// Have the kernel record `h` (its entry, then the flag) just before the agent's next write closes the gate
    /// (`active` 0), so that write clears the kernel's flag: the interleaving `health::gate`'s second read is
    /// for, made deterministic.
    pub fn fail_when_the_gate_closes(&mut self, h: Health) {
        self.racing_failure = Some(h);
    }
    /// Map updates and deletes so far.
    pub fn writes(&self) -> usize {
        self.writes
    }
    /// Batched slot writes so far (`MapWriter::put_slot_blocks`).
    pub fn slot_batches(&self) -> usize {
        self.slot_batches
    }
    /// Batched frontend writes so far (`MapWriter::put_frontends`).
    pub fn frontend_batches(&self) -> usize {
        self.frontend_batches
    }
    /// A connected UDP socket's registration, as connect4 writes one.
    pub fn put_connected_udp(&mut self, key: ReverseKey, value: ReverseValue) {
        self.connected_udp.insert(key, value);
    }
    /// Make `wait_for_readers` fail (as when the kernel refuses the map-in-map update), or succeed again.
    pub fn fail_reader_waits(&mut self, fail: bool) {
        self.reader_waits_fail = fail;
    }
    /// How many times `wait_for_readers` succeeded.
    pub fn reader_waits(&self) -> usize {
        self.reader_waits
    }
    /// Count one connect of `kind` (a `COUNTER_*`) for a service id, as the data path does.
    pub fn bump_counter(&mut self, svc_id: u32, kind: u32) {
        self.counters.entry(svc_id).or_default()[kind as usize] += 1;
    }
}

impl MapReader for FakeMaps {
    fn frontends(&self) -> Result<Vec<(FrontendKey, FrontendValue)>, MapError> {
        Ok(self.frontends.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn slot_block(&self, key: SlotKey) -> Result<Option<SlotBlock>, MapError> {
        Ok(self.slots.get(&key).copied())
    }
    fn slot_keys(&self) -> Result<Vec<SlotKey>, MapError> {
        Ok(self.slots.keys().copied().collect())
    }
    fn backend_marks(&self) -> Result<Vec<(Backend, BackendState)>, MapError> {
        Ok(self.marks.iter().map(|(b, m)| (*b, *m)).collect())
    }
    fn backend_mark(&self, backend: Backend) -> Result<Option<BackendState>, MapError> {
        Ok(self.marks.get(&backend).copied())
    }
    fn counters(&self, svc_id: u32) -> Result<[u64; COUNTERS_PER_SERVICE as usize], MapError> {
        Ok(self.counters.get(&svc_id).copied().unwrap_or_default())
    }
    fn max_services(&self) -> u32 {
        self.max_services
    }
    fn name(&self, svc_id: u32) -> Result<Option<String>, MapError> {
        Ok(self.names.get(&svc_id).cloned())
    }
    fn connected_udp(&self) -> Result<Vec<(ReverseKey, ReverseValue)>, MapError> {
        Ok(self.connected_udp.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn reverse_occupancy(&self) -> Result<ReverseOccupancy, MapError> {
        Ok(ReverseOccupancy { lru: 0, connected_udp: self.connected_udp.len() })
    }
    fn maglev_keys(&self) -> Result<Vec<MaglevKey>, MapError> {
        Ok(self.maglev.keys().copied().collect())
    }
    fn maglev_table(&self, key: MaglevKey) -> Result<Option<Box<MaglevTable>>, MapError> {
        Ok(self.maglev.get(&key).cloned())
    }
    fn members(&self) -> Result<Vec<(MemberKey, MemberValue)>, MapError> {
        Ok(self.members.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn affinity_entries(&self) -> Result<Vec<(AffinityKey, AffinityValue)>, MapError> {
        Ok(self.affinity.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn health(&self) -> Result<Vec<(Backend, Health)>, MapError> {
        Ok(self.health.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn backend_health(&self, backend: Backend) -> Result<Option<Health>, MapError> {
        Ok(self.health.get(&backend).copied())
    }
    fn health_config(&self) -> Result<HealthConfig, MapError> {
        Ok(self.health_config)
    }
}

impl MapWriter for FakeMaps {
    fn put_slot_blocks(&mut self, keys: &[SlotKey], blocks: &[SlotBlock]) -> Result<(), MapError> {
        self.slot_batches += 1;
        for (k, b) in keys.iter().zip(blocks) {
            self.put_slot_block(*k, *b)?;
        }
        Ok(())
    }
    fn put_slot_block(&mut self, key: SlotKey, block: SlotBlock) -> Result<(), MapError> {
        if !self.slots.contains_key(&key) && self.slots.len() >= self.max_slots as usize {
            return Err(MapError::Full {
                map: lb_common::MAP_SLOTS,
                capacity: self.max_slots,
                flag: "slots",
            });
        }
        self.writes += 1;
        self.slots.insert(key, block);
        Ok(())
    }
    fn delete_slot_block(&mut self, key: SlotKey) -> Result<(), MapError> {
        self.writes += 1;
        self.slots.remove(&key);
        Ok(())
    }
    fn put_frontend(&mut self, key: FrontendKey, value: FrontendValue) -> Result<(), MapError> {
        if !self.frontends.contains_key(&key) && self.frontends.len() >= self.max_services as usize {
            return Err(MapError::Full {
                map: lb_common::MAP_FRONTENDS,
                capacity: self.max_services,
                flag: "services",
            });
        }
        self.writes += 1;
        self.frontends.insert(key, value);
        Ok(())
    }
    fn put_frontends(
        &mut self,
        keys: &[FrontendKey],
        values: &[FrontendValue],
    ) -> Result<(), (usize, MapError)> {
        self.frontend_batches += 1;
        super::frontends_one_by_one(self, keys, values)
    }
    fn delete_frontend(&mut self, key: FrontendKey) -> Result<(), MapError> {
        self.writes += 1;
        self.frontends.remove(&key);
        Ok(())
    }
    fn put_member(&mut self, key: MemberKey, value: MemberValue) -> Result<(), MapError> {
        // The member map has the slot map's capacity.
        if !self.members.contains_key(&key) && self.members.len() >= self.max_slots as usize {
            return Err(MapError::Full {
                map: lb_common::MAP_MEMBERS,
                capacity: self.max_slots,
                flag: "slots",
            });
        }
        self.writes += 1;
        self.members.insert(key, value);
        Ok(())
    }
    fn delete_member(&mut self, key: MemberKey) -> Result<(), MapError> {
        self.writes += 1;
        self.members.remove(&key);
        Ok(())
    }
    fn put_maglev_table(&mut self, key: MaglevKey, table: &MaglevTable) -> Result<(), MapError> {
        // Twice the frontend capacity, as the kernel's map (`layout::map_size`).
        let capacity = self.max_services.saturating_mul(2);
        if !self.maglev.contains_key(&key) && self.maglev.len() >= capacity as usize {
            return Err(MapError::Full { map: lb_common::MAP_MAGLEV, capacity, flag: "services" });
        }
        self.writes += 1;
        self.maglev.insert(key, Box::new(*table));
        Ok(())
    }
    fn delete_maglev_table(&mut self, key: MaglevKey) -> Result<(), MapError> {
        self.writes += 1;
        self.maglev.remove(&key);
        Ok(())
    }
    fn delete_health(&mut self, backend: Backend) -> Result<(), MapError> {
        self.writes += 1;
        self.health.remove(&backend);
        Ok(())
    }
    fn set_health_config(&mut self, config: HealthConfig) -> Result<(), MapError> {
        self.health_config = config;
        if config.active == 0
            && let Some(h) = self.racing_failure.take()
        {
            // sock_ops wrote its entry and set the flag just before: the agent's clear overwrote the flag.
            self.health.insert(h.backend, h);
        }
        Ok(())
    }
    fn put_backend_mark(&mut self, backend: Backend, mark: BackendState) -> Result<(), MapError> {
        if self.max_backends != 0
            && !self.marks.contains_key(&backend)
            && self.marks.len() >= self.max_backends as usize
        {
            return Err(MapError::Full {
                map: lb_common::MAP_BACKEND_STATE,
                capacity: self.max_backends,
                flag: "backends",
            });
        }
        self.writes += 1;
        self.marks.insert(backend, mark);
        Ok(())
    }
    fn delete_backend_mark(&mut self, backend: Backend) -> Result<(), MapError> {
        self.writes += 1;
        self.marks.remove(&backend);
        Ok(())
    }
    fn reset_counters(&mut self, svc_ids: &[u32]) -> Result<(), MapError> {
        for id in svc_ids {
            self.counters.remove(id);
        }
        Ok(())
    }
    fn put_name(&mut self, svc_id: u32, name: &ServicePortName) -> Result<(), MapError> {
        // Ids 0 (the node's name) to `max_services`, as the kernel's map is sized.
        if !self.names.contains_key(&svc_id) && self.names.len() > self.max_services as usize {
            return Err(MapError::Full {
                map: lb_common::MAP_NAMES,
                capacity: self.max_services,
                flag: "services",
            });
        }
        self.names.insert(svc_id, name.to_string());
        Ok(())
    }
    fn delete_name(&mut self, svc_id: u32) -> Result<(), MapError> {
        self.names.remove(&svc_id);
        Ok(())
    }
    fn forget_connected_udp(&mut self, key: &ReverseKey) -> Result<(), MapError> {
        self.connected_udp.remove(key);
        Ok(())
    }
    fn wait_for_readers(&mut self) -> Result<(), MapError> {
        if self.reader_waits_fail {
            let source = std::io::Error::other("the kernel refused the map-in-map update (simulated)");
            return Err(MapError::Sys { map: "TIERLB_RCU", source });
        }
        self.reader_waits += 1;
        Ok(())
    }
}
