//! The maps' sizes and key/value layouts, by name: what the loader sets before load and what pinned maps
//! left by an earlier agent must match before they are reused.
use std::path::PathBuf;

use aya::maps::MapData;
use lb_common::{
    AddrKey, AffinityKey, AffinityValue, Backend, BackendState, CtAddr, CtKey, CtValue, DEFAULT_MAX_CGROUPS,
    DEFAULT_MAX_LOCAL_BACKENDS, DEFAULT_MAX_NS_ADDRS, DEFAULT_MAX_SOURCE_RANGES, DEFAULT_MAX_UDP_NETNS,
    FrontendKey, FrontendValue, Health, HealthConfig, MAP_AFFINITY, MAP_BACKEND_STATE, MAP_CGROUP_NETNS,
    MAP_CONNECTED_UDP, MAP_COUNTERS, MAP_CT_SYN, MAP_CT_TCP, MAP_CT_UDP, MAP_FRONTENDS, MAP_HEALTH,
    MAP_HEALTH_CONFIG, MAP_LOCAL_BACKENDS, MAP_MEMBERS, MAP_NAT_CONFIG, MAP_NESTED_AFFINITY, MAP_NS_ADDRS,
    MAP_NS_COUNTERS, MAP_OUTSIDE_AFFINITY, MAP_REVERSE, MAP_REVERSE_TCP, MAP_SLOTS, MAP_SOCKS,
    MAP_SOURCE_RANGES, MAP_TRACE_CONTROL, MAP_TRACE_EVENTS, MAP_TRACE_SERVICES, MAP_UDP_PER_NETNS, MemberKey,
    MemberValue, NS_COUNTER_SLOTS, NatConfig, OutsideAffinityKey, REVERSE_TCP_SLOTS, ReverseKey,
    ReverseValue, ServiceCounters, ServiceName, SlotBlock, SlotKey, SockState, SourceRangeKey,
    TRACE_MAX_SERVICES, TRACE_RING_BYTES, TcpReverse, TraceControl,
};

use super::{capacity::Capacities, error::DatapathError};

/// How a map is sized: its entries for these capacities, the flag that sizes it (without `--max-`), that
/// flag's value, and the flag value a map of `n` entries was made for (the counter array holds
/// `COUNTERS_PER_SERVICE` per service id plus the global ones; the name map one per service id plus id 0).
pub(super) struct MapSize {
    pub(super) entries: u32,
    flag: &'static str,
    value: u32,
    value_of: fn(u32) -> u32,
}

/// `MapSize::flag` of a map no flag sizes.
const FIXED: &str = "";

pub(super) fn map_size(name: &str, caps: Capacities) -> MapSize {
    let same = |n: u32| n;
    let (entries, flag, value, value_of): (u32, _, _, fn(u32) -> u32) = match name {
        MAP_FRONTENDS => (caps.services, "services", caps.services, same),
        MAP_SLOTS | MAP_MEMBERS => (caps.slots, "slots", caps.slots, same),
        MAP_AFFINITY | MAP_NESTED_AFFINITY | MAP_OUTSIDE_AFFINITY => {
            (caps.affinity, "affinity", caps.affinity, same)
        }
        MAP_BACKEND_STATE | MAP_HEALTH => (caps.backends, "backends", caps.backends, same),
        // One entry, whatever the flags.
        MAP_HEALTH_CONFIG => (1, "backends", caps.backends, |_| 0),
        MAP_REVERSE | MAP_CONNECTED_UDP => (caps.reverse, "reverse", caps.reverse, same),
        // Socket storage has no capacity of its own (max_entries must be 0): it grows with the sockets.
        MAP_SOCKS => (0, "reverse", caps.reverse, |_| 0),
        // The TCP sockets' reverse slots and the trace maps have fixed sizes (a ring buffer's max_entries is
        // its size in bytes) that no flag changes (`FIXED`): a pin of another size is another version's layout.
        MAP_REVERSE_TCP => (REVERSE_TCP_SLOTS, FIXED, 0, |_| 0),
        MAP_TRACE_EVENTS => (TRACE_RING_BYTES, FIXED, 0, |_| 0),
        MAP_TRACE_CONTROL => (1, FIXED, 0, |_| 0),
        MAP_TRACE_SERVICES => (TRACE_MAX_SERVICES, FIXED, 0, |_| 0),
        MAP_CT_TCP => (caps.conntrack, "conntrack", caps.conntrack, same),
        MAP_CT_SYN => (caps.conntrack_syn, "conntrack-syn", caps.conntrack_syn, same),
        MAP_CT_UDP => (caps.conntrack_udp, "conntrack-udp", caps.conntrack_udp, same),
        MAP_NS_ADDRS => (DEFAULT_MAX_NS_ADDRS, FIXED, 0, |_| 0),
        MAP_LOCAL_BACKENDS => (DEFAULT_MAX_LOCAL_BACKENDS, FIXED, 0, |_| 0),
        MAP_NAT_CONFIG => (1, FIXED, 0, |_| 0),
        MAP_SOURCE_RANGES => (DEFAULT_MAX_SOURCE_RANGES, FIXED, 0, |_| 0),
        MAP_NS_COUNTERS => (NS_COUNTER_SLOTS, FIXED, 0, |_| 0),
        MAP_UDP_PER_NETNS => (DEFAULT_MAX_UDP_NETNS, FIXED, 0, |_| 0),
        MAP_CGROUP_NETNS => (DEFAULT_MAX_CGROUPS, FIXED, 0, |_| 0),
        // One table per outside frontend and tier of two or more backends, an old generation's beside it
        // for its grace period: twice the frontends (not preallocated: a table costs only once written).
        lb_common::MAP_MAGLEV => (caps.services.saturating_mul(2), "services", caps.services, |n| n / 2),
        _ => (caps.services.saturating_add(1), "services", caps.services, |n| n.saturating_sub(1)),
    };
    MapSize { entries, flag, value, value_of }
}

/// Pinned maps from another tierlb version may have another key or value size; reusing them would make
/// every lookup wrong, so refuse and say how to start clean. Pinned maps of another capacity than the flags
/// ask for are refused too, naming both values.
pub(super) fn check_pinned_layout(paths: &[(&str, PathBuf)], caps: Capacities) -> Result<(), DatapathError> {
    for (name, path) in paths {
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(path)
            .map_err(|e| DatapathError::Pinned { path: path.clone(), source: Box::new(e) })?;
        let info =
            data.info().map_err(|e| DatapathError::Pinned { path: path.clone(), source: Box::new(e) })?;
        let (k, v) = key_value_sizes(name);
        if *name == MAP_BACKEND_STATE && info.value_size() == 4 {
            return Err(DatapathError::MarksWithoutExpiry { path: path.clone() });
        }
        if (info.key_size(), info.value_size()) != (k, v) {
            return Err(DatapathError::Incompatible { path: path.clone() });
        }
        let size = map_size(name, caps);
        if info.max_entries() != size.entries && size.flag == FIXED {
            return Err(DatapathError::Incompatible { path: path.clone() });
        }
        if info.max_entries() != size.entries {
            return Err(DatapathError::Capacity {
                path: path.clone(),
                flag: size.flag,
                pinned: (size.value_of)(info.max_entries()),
                wanted: size.value,
            });
        }
    }
    Ok(())
}

/// The pinned maps' layout, numbered: `tierlb --version` and `/healthz` report it, and a release whose
/// number differs from the one before cannot reuse that release's pins as they are (CHANGELOG.md says which
/// releases change it). Raised with every change to a pinned map's key or value (size, or the meaning of its
/// bytes) or to a fixed capacity; `LAYOUT_HISTORY` holds each number's fingerprint, and a test fails when
/// the fingerprint moves without a new number.
pub const MAP_LAYOUT: u32 = 2;

/// Each layout number with its `fingerprint`, oldest first (numbering began at 0.1.0; the layouts before it
/// were not numbered).
pub const LAYOUT_HISTORY: [(u32, u64); 2] = [(1, 0xf4d7_197f_ed70_1296), (2, 0x19a9_65e8_3b7a_0158)];

/// A pinned map whose layout changed at map layout `layout`: since then it is pinned as `pin`, before as
/// `before.pin` with `before`'s layout. A new layout pins the map under a new name, so that the agent of the
/// release before and this one each find their own generation by name (`migrate` carries the contents across,
/// both ways).
#[derive(Debug)]
pub(crate) struct Change {
    /// The map (its name in the object).
    pub(crate) map: &'static str,
    /// The layout number that changed it.
    pub(crate) layout: u32,
    /// Its pin's name from that layout on.
    pub(crate) pin: &'static str,
    /// Its pin and shape in the layout before.
    pub(crate) before: Shape,
    /// How entries written to the old map after the copy reach the new one (`migrate::finish`).
    pub(crate) sweep: Sweep,
}

/// A map's shape in one layout: what `migrate` creates and checks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) pin: &'static str,
    /// `enum bpf_map_type`.
    pub(crate) map_type: u32,
    pub(crate) key: u32,
    pub(crate) value: u32,
    pub(crate) entries: u32,
}

/// How a migration's last pass treats what the old generation's programs wrote after the first copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// Per-CPU `u64` counters: the new map gains what the old one counted since the copy. (A state map's
    /// change would add its own rule: copy the entries the new map lacks, an entry both have being the new
    /// programs' by then.)
    Counters,
}

/// `BPF_MAP_TYPE_PERCPU_ARRAY`.
const PERCPU_ARRAY: u32 = 6;

/// Every layout change of a pinned map, oldest first. A release migrates the changes of its own layout number
/// in place (from the release before, and back: `migrate`); older ones need `uninstall/`, then `deploy/`.
pub(crate) const CHANGES: [Change; 1] = [Change {
    map: MAP_NS_COUNTERS,
    layout: 2,
    pin: "NS_COUNTERS_v2",
    before: Shape { pin: MAP_NS_COUNTERS, map_type: PERCPU_ARRAY, key: 4, value: 8, entries: 32 },
    sweep: Sweep::Counters,
}];

/// The name `map` is pinned under in this layout.
#[must_use]
pub fn pin_name(map: &str) -> &str {
    CHANGES.iter().rev().find(|c| c.map == map).map_or(map, |c| c.pin)
}

/// Where `map` is pinned in the instance directory `dir`.
#[must_use]
pub fn pin_path(dir: &std::path::Path, map: &str) -> PathBuf {
    dir.join(pin_name(map))
}

/// Every name `map` was pinned under in a numbered layout (`--cleanup` removes them all).
pub(crate) fn all_pin_names(map: &'static str) -> impl Iterator<Item = &'static str> {
    std::iter::once(map).chain(CHANGES.iter().filter(move |c| c.map == map).map(|c| c.pin))
}

/// FNV-1a over every pinned map's pin name, key and value sizes, and fixed capacity, in `PINNED_MAPS`' order:
/// what `check_pinned_layout` compares, so a change it would refuse changes this. (A change of the bytes'
/// meaning at the same sizes does not: that needs `MAP_LAYOUT` raised by hand.)
#[must_use]
pub fn fingerprint() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for name in lb_common::PINNED_MAPS {
        let (k, v) = key_value_sizes(name);
        let size = map_size(name, Capacities::default());
        let fixed = if size.flag == FIXED { size.entries } else { 0 };
        // The pin's name since layout 2 (a map's new layout is pinned under a new name: `CHANGES`).
        eat(pin_name(name).as_bytes());
        for n in [k, v, fixed] {
            eat(&n.to_le_bytes());
        }
    }
    h
}

/// The key and value sizes of the pinned map `name` (a ring buffer's are 0).
fn key_value_sizes(name: &str) -> (u32, u32) {
    match name {
        MAP_FRONTENDS => (size_of::<FrontendKey>() as u32, size_of::<FrontendValue>() as u32),
        MAP_SLOTS => (size_of::<SlotKey>() as u32, size_of::<SlotBlock>() as u32),
        MAP_BACKEND_STATE => (size_of::<Backend>() as u32, size_of::<BackendState>() as u32),
        MAP_COUNTERS => (4, size_of::<ServiceCounters>() as u32),
        MAP_NS_COUNTERS => (4, 8),
        MAP_REVERSE | MAP_CONNECTED_UDP => (size_of::<ReverseKey>() as u32, size_of::<ReverseValue>() as u32),
        MAP_SOCKS => (4, size_of::<SockState>() as u32),
        MAP_REVERSE_TCP => (4, size_of::<TcpReverse>() as u32),
        MAP_UDP_PER_NETNS => (8, 4),
        MAP_AFFINITY | MAP_NESTED_AFFINITY => {
            (size_of::<AffinityKey>() as u32, size_of::<AffinityValue>() as u32)
        }
        MAP_CGROUP_NETNS => (8, 8),
        MAP_OUTSIDE_AFFINITY => (size_of::<OutsideAffinityKey>() as u32, size_of::<AffinityValue>() as u32),
        MAP_MEMBERS => (size_of::<MemberKey>() as u32, size_of::<MemberValue>() as u32),
        lb_common::MAP_MAGLEV => {
            (size_of::<lb_common::MaglevKey>() as u32, size_of::<lb_common::MaglevTable>() as u32)
        }
        MAP_HEALTH => (size_of::<Backend>() as u32, size_of::<Health>() as u32),
        MAP_HEALTH_CONFIG => (4, size_of::<HealthConfig>() as u32),
        MAP_TRACE_EVENTS => (0, 0),
        MAP_TRACE_CONTROL => (4, size_of::<TraceControl>() as u32),
        MAP_TRACE_SERVICES => (4, 4),
        MAP_CT_TCP | MAP_CT_SYN | MAP_CT_UDP => (size_of::<CtKey>() as u32, size_of::<CtValue>() as u32),
        MAP_NS_ADDRS => (size_of::<AddrKey>() as u32, 4),
        MAP_LOCAL_BACKENDS => (size_of::<CtAddr>() as u32, 4),
        MAP_NAT_CONFIG => (4, size_of::<NatConfig>() as u32),
        // An LPM trie's key is its prefix length and the data.
        MAP_SOURCE_RANGES => (4 + size_of::<SourceRangeKey>() as u32, 4),
        _ => (4, size_of::<ServiceName>() as u32),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_layout_number_names_this_layout() {
        let (number, fingerprint) = super::LAYOUT_HISTORY[super::LAYOUT_HISTORY.len() - 1];
        assert_eq!(
            (super::MAP_LAYOUT, super::fingerprint()),
            (number, fingerprint),
            "a pinned map's key, value or fixed capacity changed: raise MAP_LAYOUT, add ({}, {:#x}) to \
             LAYOUT_HISTORY, and say in CHANGELOG.md how a node upgrades to it",
            super::MAP_LAYOUT + 1,
            super::fingerprint()
        );
    }
}
