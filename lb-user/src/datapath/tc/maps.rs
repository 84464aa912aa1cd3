//! The north-south maps the agent writes (local endpoints, source ranges, the pre-filter, settings) and reads
//! (the conntrack tables, counters): their handles, opened from a loaded object or from the pins.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
};

use aya::Ebpf;

use crate::datapath::error::{DatapathError, bpf_err, is_full};

/// The north-south maps the agent writes (local endpoints, settings) and reads (conntrack, counters).
pub struct NsMaps {
    local: aya::maps::HashMap<aya::maps::MapData, lb_common::CtAddr, u32>,
    /// The value each local endpoint gets: `LOCAL_ENDPOINT`, with `LOCAL_DSR` under `--dsr` (`set_dsr`).
    local_value: u32,
    config: aya::maps::Array<aya::maps::MapData, lb_common::NatConfig>,
    /// The conntrack tables in `lb_common::CT_TABLES` order: established TCP, half-open TCP, UDP.
    conntrack: [CtTable; 3],
    counters: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
    /// A second descriptor of the counters, for readers off the agent loop (`/metrics`).
    counters_fd: std::os::fd::OwnedFd,
    source_ranges: aya::maps::lpm_trie::LpmTrie<aya::maps::MapData, lb_common::SourceRangeKey, u32>,
    addrs: aya::maps::HashMap<aya::maps::MapData, lb_common::AddrKey, u32>,
}

/// One conntrack table, and a second descriptor of it for its fdinfo (`conntrack_memory`).
struct CtTable {
    map: aya::maps::HashMap<aya::maps::MapData, lb_common::CtKey, lb_common::CtValue>,
    fd: std::os::fd::OwnedFd,
    capacity: u32,
}

impl CtTable {
    fn new(map: aya::maps::Map, name: &'static str) -> Result<Self, DatapathError> {
        let (fd, capacity) = match &map {
            aya::maps::Map::LruHashMap(data) => (
                crate::datapath::error::second_fd(data, name)?,
                data.info().map_err(map_err(name))?.max_entries(),
            ),
            _ => return Err(DatapathError::MissingMap { name }),
        };
        // The LRU hash is read and written as a hash (aya's HashMap accepts both kinds).
        Ok(Self { map: aya::maps::HashMap::try_from(map).map_err(map_err(name))?, fd, capacity })
    }
}

/// The north-south maps as the loader or the pins give them.
struct NsMapSet {
    local: aya::maps::Map,
    config: aya::maps::Map,
    conntrack: [aya::maps::Map; 3],
    counters: aya::maps::Map,
    source_ranges: aya::maps::Map,
    addrs: aya::maps::Map,
}

impl NsMapSet {
    /// Each map as `get` gives it by name.
    fn get(
        mut get: impl FnMut(&'static str) -> Result<aya::maps::Map, DatapathError>,
    ) -> Result<Self, DatapathError> {
        use lb_common::{MAP_CT_SYN, MAP_CT_TCP, MAP_CT_UDP};
        Ok(Self {
            local: get(lb_common::MAP_LOCAL_BACKENDS)?,
            config: get(lb_common::MAP_NAT_CONFIG)?,
            conntrack: [get(MAP_CT_TCP)?, get(MAP_CT_SYN)?, get(MAP_CT_UDP)?],
            counters: get(lb_common::MAP_NS_COUNTERS)?,
            source_ranges: get(lb_common::MAP_SOURCE_RANGES)?,
            addrs: get(lb_common::MAP_NS_ADDRS)?,
        })
    }
}

/// One `loadBalancerSourceRanges` entry: the outside frontend and the range.
pub type SourceRange = (lb_common::FrontendKey, crate::model::node_addresses::Cidr);

/// A local endpoint's key in `LOCAL_BACKENDS`.
fn local_key(ip: IpAddr) -> lb_common::CtAddr {
    lb_common::CtAddr { addr: crate::datapath::addr::words(ip) }
}

/// A source range's prefix length and key in `SOURCE_RANGES`.
fn range_key((fe, c): &SourceRange) -> (u32, lb_common::SourceRangeKey) {
    let data = lb_common::SourceRangeKey { frontend: *fe, client: crate::datapath::addr::words(c.ip) };
    (lb_common::SOURCE_RANGE_FRONTEND_BITS + u32::from(c.len), data)
}

/// What the conntrack tables hold now, for status and metrics: their sums, and each table's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConntrackStats {
    /// Live forward entries (one per flow).
    pub flows: usize,
    /// Live flows with SNAT.
    pub snat_flows: usize,
    /// Every entry, dead ones the LRU has not reclaimed included.
    pub entries: usize,
    /// Each table's, in `lb_common::CT_TABLES` order (established TCP, half-open TCP, UDP).
    pub tables: [TableStats; 3],
}

/// One conntrack table's occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableStats {
    /// Live forward entries (flows).
    pub flows: usize,
    /// Every entry, dead ones included.
    pub entries: usize,
    /// Its capacity (entries).
    pub capacity: u32,
    /// Entries the LRU reclaimed to make room since the table was created (`lb_common::ct_evictions`).
    pub evicted: u64,
}

fn map_err(name: &str) -> impl Fn(aya::maps::MapError) -> DatapathError + '_ {
    move |e| bpf_err(format!("map {name}"), e)
}

/// A failed write to the local-endpoint set. Its capacity is fixed (no node runs that many pods), so a full
/// set says so and what it means, rather than naming a flag.
fn local_err(e: aya::maps::MapError) -> DatapathError {
    if is_full(&e) {
        bpf_err(
            format!(
                "map {} is full (capacity {}): this node has more endpoint addresses than that; traffic from \
                 outside to the others leaves with the node's address as its source",
                lb_common::MAP_LOCAL_BACKENDS,
                lb_common::DEFAULT_MAX_LOCAL_BACKENDS
            ),
            e,
        )
    } else {
        map_err(lb_common::MAP_LOCAL_BACKENDS)(e)
    }
}

impl NsMaps {
    /// Take the maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self, DatapathError> {
        Self::from_maps(NsMapSet::get(|name| ebpf.take_map(name).ok_or(DatapathError::MissingMap { name }))?)
    }

    /// Open an instance's pinned maps (`tierlb status`).
    pub fn open_pinned(dir: &Path) -> Result<Self, DatapathError> {
        let open = |name: &'static str| {
            let path = crate::datapath::pin_path(dir, name);
            aya::maps::MapData::from_pin(&path)
                .map(aya::maps::Map::from_map_data)
                .map_err(|e| DatapathError::Pinned { path: path.clone(), source: Box::new(e) })?
                .map_err(|e| DatapathError::Pinned { path, source: Box::new(e) })
        };
        Self::from_maps(NsMapSet::get(open)?)
    }

    fn from_maps(m: NsMapSet) -> Result<Self, DatapathError> {
        use lb_common::{MAP_LOCAL_BACKENDS, MAP_NAT_CONFIG, MAP_NS_COUNTERS};
        let counters_fd = match &m.counters {
            aya::maps::Map::PerCpuArray(data) => crate::datapath::error::second_fd(data, MAP_NS_COUNTERS)?,
            _ => return Err(DatapathError::MissingMap { name: MAP_NS_COUNTERS }),
        };
        let [tcp, syn, udp] = m.conntrack;
        Ok(Self {
            local: aya::maps::HashMap::try_from(m.local).map_err(map_err(MAP_LOCAL_BACKENDS))?,
            local_value: lb_common::LOCAL_ENDPOINT,
            config: aya::maps::Array::try_from(m.config).map_err(map_err(MAP_NAT_CONFIG))?,
            conntrack: [
                CtTable::new(tcp, lb_common::MAP_CT_TCP)?,
                CtTable::new(syn, lb_common::MAP_CT_SYN)?,
                CtTable::new(udp, lb_common::MAP_CT_UDP)?,
            ],
            counters: aya::maps::PerCpuArray::try_from(m.counters).map_err(map_err(MAP_NS_COUNTERS))?,
            counters_fd,
            source_ranges: aya::maps::lpm_trie::LpmTrie::try_from(m.source_ranges)
                .map_err(map_err(lb_common::MAP_SOURCE_RANGES))?,
            addrs: aya::maps::HashMap::try_from(m.addrs).map_err(map_err(lb_common::MAP_NS_ADDRS))?,
        })
    }

    /// Write the tc programs' settings.
    pub fn set_config(&mut self, c: lb_common::NatConfig) -> Result<(), DatapathError> {
        self.config.set(0, c, 0).map_err(map_err(lb_common::MAP_NAT_CONFIG))
    }

    /// The settings in the map.
    pub fn config(&self) -> Result<lb_common::NatConfig, DatapathError> {
        self.config.get(&0, 0).map_err(map_err(lb_common::MAP_NAT_CONFIG))
    }

    /// Whether this node's `tc_ingress` takes a DSR option to one of its endpoints as the flow's frontend
    /// (`--dsr`): the value `set_local` and `update_local` write from now on.
    pub fn set_dsr(&mut self, on: bool) {
        self.local_value = lb_common::LOCAL_ENDPOINT | if on { lb_common::LOCAL_DSR } else { 0 };
    }

    /// Make the local-endpoint set `want`: add what is missing, delete what is not wanted, and rewrite what
    /// an earlier agent wrote with another value (`--dsr` turned on or off).
    pub fn set_local(&mut self, want: &BTreeSet<IpAddr>) -> Result<(), DatapathError> {
        let have: BTreeMap<lb_common::CtAddr, u32> = self.local.iter().filter_map(Result::ok).collect();
        let want: BTreeSet<lb_common::CtAddr> = want.iter().map(|ip| local_key(*ip)).collect();
        let value = self.local_value;
        let add: Vec<lb_common::CtAddr> =
            want.iter().filter(|k| have.get(k) != Some(&value)).copied().collect();
        let remove: Vec<lb_common::CtAddr> = have.keys().filter(|k| !want.contains(k)).copied().collect();
        self.write_local(add.iter(), remove.iter())
    }

    /// Add `added` to the local-endpoint set and take `removed` out of it.
    pub fn update_local(&mut self, added: &[IpAddr], removed: &[IpAddr]) -> Result<(), DatapathError> {
        let (added, removed): (Vec<_>, Vec<_>) = (
            added.iter().map(|ip| local_key(*ip)).collect(),
            removed.iter().map(|ip| local_key(*ip)).collect(),
        );
        self.write_local(added.iter(), removed.iter())
    }

    fn write_local<'a>(
        &mut self,
        added: impl Iterator<Item = &'a lb_common::CtAddr>,
        removed: impl Iterator<Item = &'a lb_common::CtAddr>,
    ) -> Result<(), DatapathError> {
        for k in removed {
            let _ = self.local.remove(k);
        }
        for k in added {
            self.local.insert(*k, self.local_value, 0).map_err(local_err)?;
        }
        Ok(())
    }

    /// Make the source-range trie hold exactly `want`.
    pub fn set_source_ranges(&mut self, want: &BTreeSet<SourceRange>) -> Result<(), DatapathError> {
        let want: BTreeSet<(u32, lb_common::SourceRangeKey)> = want.iter().map(range_key).collect();
        let have: BTreeSet<(u32, lb_common::SourceRangeKey)> =
            self.source_ranges.keys().filter_map(Result::ok).map(|k| (k.prefix_len(), k.data())).collect();
        self.write_source_ranges(want.difference(&have), have.difference(&want))
    }

    /// Add `added` to the source-range trie and take `removed` out of it.
    pub fn update_source_ranges(
        &mut self,
        added: &[SourceRange],
        removed: &[SourceRange],
    ) -> Result<(), DatapathError> {
        let (added, removed): (Vec<_>, Vec<_>) =
            (added.iter().map(range_key).collect(), removed.iter().map(range_key).collect());
        self.write_source_ranges(added.iter(), removed.iter())
    }

    fn write_source_ranges<'a>(
        &mut self,
        added: impl Iterator<Item = &'a (u32, lb_common::SourceRangeKey)>,
        removed: impl Iterator<Item = &'a (u32, lb_common::SourceRangeKey)>,
    ) -> Result<(), DatapathError> {
        use aya::maps::lpm_trie::Key;
        for (len, data) in removed {
            let _ = self.source_ranges.remove(&Key::new(*len, *data));
        }
        for (len, data) in added {
            self.source_ranges
                .insert(&Key::new(*len, *data), 1, 0)
                .map_err(map_err(lb_common::MAP_SOURCE_RANGES))?;
        }
        Ok(())
    }

    /// Make the ingress pre-filter (`NS_ADDRS`) hold exactly `want` (address -> `ADDR_*` flags).
    pub fn set_addrs(&mut self, want: &BTreeMap<IpAddr, u32>) -> Result<(), DatapathError> {
        let name = lb_common::MAP_NS_ADDRS;
        let key = |ip: IpAddr| lb_common::AddrKey {
            addr: crate::datapath::addr::words(ip),
            family: crate::datapath::addr::family(ip),
            _pad: [0; 3],
        };
        let want: BTreeMap<lb_common::AddrKey, u32> = want.iter().map(|(ip, f)| (key(*ip), *f)).collect();
        let have: Vec<(lb_common::AddrKey, u32)> = self.addrs.iter().filter_map(Result::ok).collect();
        for (k, _) in have.iter().filter(|(k, _)| !want.contains_key(k)) {
            self.addrs.remove(k).map_err(map_err(name))?;
        }
        for (k, f) in &want {
            if !have.contains(&(*k, *f)) {
                self.addrs.insert(k, f, 0).map_err(map_err(name))?;
            }
        }
        Ok(())
    }

    /// The pre-filter's entries (`NS_ADDRS`).
    pub fn addrs(&self) -> Vec<(lb_common::AddrKey, u32)> {
        self.addrs.iter().filter_map(Result::ok).collect()
    }

    /// The local-endpoint set in the map.
    pub fn local(&self) -> Vec<lb_common::CtAddr> {
        self.local.keys().filter_map(Result::ok).collect()
    }

    /// Conntrack occupancy at `now_ns` (`CLOCK_BOOTTIME`).
    pub fn conntrack_stats(&self, now_ns: u64) -> ConntrackStats {
        let mut s = ConntrackStats::default();
        let c = self.counters();
        for ((i, table), out) in (0usize..).zip(&self.conntrack).zip(s.tables.iter_mut()) {
            out.capacity = table.capacity;
            for (_, v) in table.map.iter().filter_map(Result::ok) {
                out.entries += 1;
                if v.flags & lb_common::CT_FORWARD != 0 && v.expires_ns > now_ns {
                    out.flows += 1;
                    s.snat_flows += usize::from(v.flags & lb_common::CT_SNAT != 0);
                }
            }
            let removed = c[lb_common::NS_CT_REMOVED as usize + i]
                + if i == 2 { c[lb_common::NS_CT_REMOVED_BY_AGENT as usize] } else { 0 };
            out.evicted = lb_common::ct_evictions(
                c[lb_common::NS_CT_INSERTED as usize + i],
                removed,
                out.entries as u64,
            );
            s.flows += out.flows;
            s.entries += out.entries;
        }
        s
    }

    /// The conntrack tables' memory as the kernel accounts it (`memlock` in each map's fdinfo: its
    /// `map_mem_usage`, every preallocated element included), `None` if the kernel does not say.
    pub fn conntrack_memory(&self) -> Option<u64> {
        self.conntrack.iter().map(|t| crate::datapath::sys::map_memory(std::os::fd::AsFd::as_fd(&t.fd))).sum()
    }

    /// The memory of the UDP conntrack table alone (`conntrack_memory`'s accounting).
    pub fn udp_conntrack_memory(&self) -> Option<u64> {
        crate::datapath::sys::map_memory(std::os::fd::AsFd::as_fd(&self.conntrack[2].fd))
    }

    /// Delete the UDP entries whose backend (forward: its destination; reply: its source) is not in
    /// `backends` any more: kube-proxy flushes a removed endpoint's UDP conntrack, or a client's datagrams
    /// would go on to the departed backend for as long as it keeps sending. TCP flows are left to end.
    pub fn forget_udp_except(&mut self, backends: &BTreeSet<lb_common::Backend>) -> usize {
        self.forget_udp_where(|b| !backends.contains(b))
    }

    /// Forget the UDP flows to the backends `departed` says are gone; how many.
    fn forget_udp_where(&mut self, departed: impl Fn(&lb_common::Backend) -> bool) -> usize {
        let udp = &mut self.conntrack[2].map;
        let gone: Vec<lb_common::CtKey> = udp
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| {
                let (addr, port) =
                    if v.flags & lb_common::CT_FORWARD != 0 { (v.a, v.a_port) } else { (k.saddr, k.sport) };
                departed(&lb_common::Backend { addr, port, proto: k.proto, family: k.family })
            })
            .map(|(k, _)| k)
            .collect();
        let removed = gone.iter().filter(|k| udp.remove(k).is_ok()).count();
        self.count_agent_removals(removed as u64);
        gone.len()
    }

    /// Add `n` to the counter of UDP entries the agent deleted (`NS_CT_REMOVED_BY_AGENT`), which the eviction
    /// figure subtracts. No program writes that slot, so a read, add and write back on CPU 0's value loses
    /// nothing; a failure only leaves the eviction figure high by `n` (logged).
    fn count_agent_removals(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let slot = lb_common::NS_CT_REMOVED_BY_AGENT;
        let r = self.counters.get(&slot, 0).and_then(|v| {
            let mut v: Vec<u64> = v.iter().copied().collect();
            v[0] += n;
            let v = aya::maps::PerCpuValues::try_from(v).map_err(aya::maps::MapError::from)?;
            self.counters.set(slot, v, 0)
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot count the UDP conntrack entries deleted; the eviction figure is high by {n}");
        }
    }

    /// Forget the UDP flows to `departed` (backends no frontend holds any more); how many.
    pub fn forget_udp_to(&mut self, departed: &[lb_common::Backend]) -> usize {
        if departed.is_empty() {
            return 0;
        }
        let departed: BTreeSet<lb_common::Backend> = departed.iter().copied().collect();
        self.forget_udp_where(|b| departed.contains(b))
    }

    /// The counters by `NS_*` kind, summed over CPUs.
    pub fn counters(&self) -> [u64; lb_common::NS_COUNTER_KINDS as usize] {
        sum_ns_counters(&self.counters)
    }

    /// A handle on the counters through a descriptor of its own, for a reader off the agent loop.
    pub fn counters_reader(&self) -> Result<aya::maps::PerCpuArray<aya::maps::MapData, u64>, DatapathError> {
        let name = lb_common::MAP_NS_COUNTERS;
        let fd =
            self.counters_fd.try_clone().map_err(|e| bpf_err(format!("map {name}: duplicating it"), e))?;
        let data = aya::maps::MapData::from_fd(fd).map_err(map_err(name))?;
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).map_err(map_err(name))
    }
}

/// The tc programs' counters of `map` (`MAP_NS_COUNTERS`) by `NS_*` kind, summed over CPUs (0 where a read
/// fails).
pub fn sum_ns_counters(
    map: &aya::maps::PerCpuArray<aya::maps::MapData, u64>,
) -> [u64; lb_common::NS_COUNTER_KINDS as usize] {
    let mut out = [0u64; lb_common::NS_COUNTER_KINDS as usize];
    for (i, slot) in (0u32..).zip(out.iter_mut()) {
        if let Ok(v) = map.get(&i, 0) {
            *slot = v.iter().sum();
        }
    }
    out
}
