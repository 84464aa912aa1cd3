//! The north-south programs on the node's devices: `tc_ingress` and `tc_egress` attached to the devices that
//! hold the node's NodePort addresses (or `--devices`), with tcx links on kernels >= 6.6 (pinned, so they
//! outlive the agent like the cgroup links; a restarted agent attaches its programs next to the old ones and
//! then replaces the pin, which detaches the old ones) and netlink clsact filters below (which the kernel
//! keeps until they are removed). Attaching needs CAP_NET_ADMIN in the devices' network namespace.
use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{self, TcAttachOptions},
    },
    util::KernelVersion,
};

use super::error::{DatapathError, bpf_err, is_full};

/// The tc programs, in the order they are attached on each device.
pub const TC_PROGRAMS: [(&str, TcAttachType); 2] =
    [("tc_ingress", TcAttachType::Ingress), ("tc_egress", TcAttachType::Egress)];

/// Where the tcx link of `program` on `device` is pinned.
pub fn tc_link_pin(dir: &Path, program: &str, device: &str) -> PathBuf {
    dir.join(format!("link_{program}@{device}"))
}

/// Whether this kernel attaches tc programs with tcx links (6.6 and later).
pub fn has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

/// The devices of this network namespace that hold one of `addrs` (the node's NodePort addresses), sorted.
pub fn devices_holding(addrs: &[IpAddr]) -> Vec<String> {
    let mut out = BTreeSet::new();
    if let Ok(ifs) = nix::ifaddrs::getifaddrs() {
        for ifa in ifs {
            let Some(a) = ifa.address else { continue };
            let ip = a
                .as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())));
            if ip.is_some_and(|ip| addrs.contains(&ip)) && ifa.interface_name != "lo" {
                out.insert(ifa.interface_name);
            }
        }
    }
    out.into_iter().collect()
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, DatapathError> {
    let p = ebpf.program_mut(name).ok_or_else(|| DatapathError::Bpf {
        what: format!("program {name} missing"),
        source: "absent".into(),
    })?;
    p.try_into().map_err(|e| bpf_err(format!("program {name}"), e))
}

/// Attach both tc programs to `device`. With tcx and `pin_dir`, the links are pinned there (replacing an
/// earlier agent's without a gap); with netlink, a clsact qdisc is added if the device has none.
pub fn attach(ebpf: &mut Ebpf, device: &str, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
    let tcx = has_tcx();
    if !tcx {
        // EEXIST: the device has a clsact qdisc already (a CNI's, or ours from an earlier start).
        if let Err(e) = tc::qdisc_add_clsact(device)
            && !matches!(e, tc::TcError::AlreadyAttached)
        {
            return Err(bpf_err(format!("adding a clsact qdisc to {device}"), e));
        }
    }
    for (name, kind) in TC_PROGRAMS {
        let p = classifier(ebpf, name)?;
        let attaching = |e| bpf_err(format!("attaching {name} to device {device} (needs CAP_NET_ADMIN)"), e);
        let opts = if tcx {
            // Last in the device's chain: a CNI's own programs keep their place before ours.
            TcAttachOptions::TcxOrder(LinkOrder::last())
        } else {
            TcAttachOptions::Netlink(tc::NlOptions::default())
        };
        let id = p.attach_with_options(device, kind, opts).map_err(attaching)?;
        let (Some(dir), true) = (pin_dir, tcx) else {
            // Netlink filters stay with the device after the agent exits; `detach_device` removes them.
            if !tcx {
                let link = p.take_link(id).map_err(|e| bpf_err(format!("link of {name}"), e))?;
                std::mem::forget(link);
            }
            continue;
        };
        let link = p.take_link(id).map_err(|e| bpf_err(format!("taking the link of {name}"), e))?;
        let link = FdLink::try_from(link).map_err(|e| bpf_err(format!("link of {name}"), e))?;
        let path = tc_link_pin(dir, name, device);
        // bpffs refuses names with a dot (`bpf_lookup`): no extension.
        let fresh = dir.join(format!("link_{name}@{device}_new"));
        let _ = std::fs::remove_file(&fresh);
        link.pin(&fresh).map_err(|e| bpf_err(format!("pinning the link of {name} on {device}"), e))?;
        std::fs::rename(&fresh, &path).map_err(|e| bpf_err(format!("replacing {}", path.display()), e))?;
    }
    Ok(())
}

/// The devices an instance's pinned tc links are on (`link_tc_*@DEVICE`).
pub fn pinned_devices(dir: &Path) -> Vec<String> {
    let mut out = BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix("link_tc_")
                && let Some((_, dev)) = rest.split_once('@')
                && !dev.ends_with("_new")
            {
                out.insert(dev.to_owned());
            }
        }
    }
    out.into_iter().collect()
}

/// Detach tierlb's tc programs from `device`: remove the pinned tcx links (which detaches them), or the
/// netlink filters of our programs.
pub fn detach(dir: Option<&Path>, device: &str) {
    if let Some(dir) = dir {
        for (name, _) in TC_PROGRAMS {
            let _ = std::fs::remove_file(tc_link_pin(dir, name, device));
        }
    }
    if !has_tcx() {
        for (name, kind) in TC_PROGRAMS {
            let _ = tc::qdisc_detach_program(device, kind, name);
        }
    }
}

/// The north-south maps the agent writes (local endpoints, settings) and reads (conntrack, counters).
pub struct NsMaps {
    local: aya::maps::HashMap<aya::maps::MapData, lb_common::CtAddr, u32>,
    config: aya::maps::Array<aya::maps::MapData, lb_common::NatConfig>,
    conntrack: aya::maps::HashMap<aya::maps::MapData, lb_common::CtKey, lb_common::CtValue>,
    counters: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
    /// A second descriptor of the counters, for readers off the agent loop (`/metrics`).
    counters_fd: std::os::fd::OwnedFd,
    /// A second descriptor of the conntrack table, for its fdinfo (`conntrack_memory`).
    conntrack_fd: std::os::fd::OwnedFd,
    source_ranges: aya::maps::lpm_trie::LpmTrie<aya::maps::MapData, lb_common::SourceRangeKey, u32>,
}

/// One `loadBalancerSourceRanges` entry: the outside frontend and the range.
pub type SourceRange = (lb_common::FrontendKey, crate::model::node_addresses::Cidr);

/// A local endpoint's key in `LOCAL_BACKENDS`.
fn local_key(ip: IpAddr) -> lb_common::CtAddr {
    lb_common::CtAddr { addr: super::addr::words(ip) }
}

/// A source range's prefix length and key in `SOURCE_RANGES`.
fn range_key((fe, c): &SourceRange) -> (u32, lb_common::SourceRangeKey) {
    let data = lb_common::SourceRangeKey { frontend: *fe, client: super::addr::words(c.ip) };
    (lb_common::SOURCE_RANGE_FRONTEND_BITS + u32::from(c.len), data)
}

/// What the conntrack table holds now, for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConntrackStats {
    /// Live forward entries (one per flow).
    pub flows: usize,
    /// Live flows with SNAT.
    pub snat_flows: usize,
    /// Every entry, dead ones the LRU has not reclaimed included.
    pub entries: usize,
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
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(DatapathError::MissingMap { name });
        Self::from_maps(
            take(lb_common::MAP_LOCAL_BACKENDS)?,
            take(lb_common::MAP_NAT_CONFIG)?,
            take(lb_common::MAP_CONNTRACK)?,
            take(lb_common::MAP_NS_COUNTERS)?,
            take(lb_common::MAP_SOURCE_RANGES)?,
        )
    }

    /// Open an instance's pinned maps (`tierlb status`).
    pub fn open_pinned(dir: &Path) -> Result<Self, DatapathError> {
        let open = |name: &str| {
            let path = dir.join(name);
            aya::maps::MapData::from_pin(&path)
                .map(aya::maps::Map::from_map_data)
                .map_err(|e| DatapathError::Pinned { path: path.clone(), source: Box::new(e) })?
                .map_err(|e| DatapathError::Pinned { path, source: Box::new(e) })
        };
        Self::from_maps(
            open(lb_common::MAP_LOCAL_BACKENDS)?,
            open(lb_common::MAP_NAT_CONFIG)?,
            open(lb_common::MAP_CONNTRACK)?,
            open(lb_common::MAP_NS_COUNTERS)?,
            open(lb_common::MAP_SOURCE_RANGES)?,
        )
    }

    fn from_maps(
        local: aya::maps::Map,
        config: aya::maps::Map,
        conntrack: aya::maps::Map,
        counters: aya::maps::Map,
        source_ranges: aya::maps::Map,
    ) -> Result<Self, DatapathError> {
        use lb_common::{MAP_CONNTRACK, MAP_LOCAL_BACKENDS, MAP_NAT_CONFIG, MAP_NS_COUNTERS};
        let counters_fd = match &counters {
            aya::maps::Map::PerCpuArray(data) => super::error::second_fd(data, MAP_NS_COUNTERS)?,
            _ => return Err(DatapathError::MissingMap { name: MAP_NS_COUNTERS }),
        };
        let conntrack_fd = match &conntrack {
            aya::maps::Map::LruHashMap(data) => super::error::second_fd(data, MAP_CONNTRACK)?,
            _ => return Err(DatapathError::MissingMap { name: MAP_CONNTRACK }),
        };
        // The LRU hash is read and written as a hash (aya's HashMap accepts both kinds).
        Ok(Self {
            local: aya::maps::HashMap::try_from(local).map_err(map_err(MAP_LOCAL_BACKENDS))?,
            config: aya::maps::Array::try_from(config).map_err(map_err(MAP_NAT_CONFIG))?,
            conntrack: aya::maps::HashMap::try_from(conntrack).map_err(map_err(MAP_CONNTRACK))?,
            counters: aya::maps::PerCpuArray::try_from(counters).map_err(map_err(MAP_NS_COUNTERS))?,
            counters_fd,
            conntrack_fd,
            source_ranges: aya::maps::lpm_trie::LpmTrie::try_from(source_ranges)
                .map_err(map_err(lb_common::MAP_SOURCE_RANGES))?,
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

    /// Make the local-endpoint set `want`: add what is missing, delete what is not wanted.
    pub fn set_local(&mut self, want: &BTreeSet<IpAddr>) -> Result<(), DatapathError> {
        let have: BTreeSet<lb_common::CtAddr> = self.local.keys().filter_map(Result::ok).collect();
        let want: BTreeSet<lb_common::CtAddr> = want.iter().map(|ip| local_key(*ip)).collect();
        self.write_local(want.difference(&have), have.difference(&want))
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
            self.local.insert(*k, 1, 0).map_err(local_err)?;
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

    /// The local-endpoint set in the map.
    pub fn local(&self) -> Vec<lb_common::CtAddr> {
        self.local.keys().filter_map(Result::ok).collect()
    }

    /// Conntrack occupancy at `now_ns` (`CLOCK_BOOTTIME`).
    pub fn conntrack_stats(&self, now_ns: u64) -> ConntrackStats {
        let mut s = ConntrackStats::default();
        for (_, v) in self.conntrack.iter().filter_map(Result::ok) {
            s.entries += 1;
            if v.flags & lb_common::CT_FORWARD != 0 && v.expires_ns > now_ns {
                s.flows += 1;
                s.snat_flows += usize::from(v.flags & lb_common::CT_SNAT != 0);
            }
        }
        s
    }

    /// The conntrack table's memory as the kernel accounts it (`memlock` in the map's fdinfo: its
    /// `map_mem_usage`, every preallocated element included), `None` if the kernel does not say.
    pub fn conntrack_memory(&self) -> Option<u64> {
        super::sys::map_memory(std::os::fd::AsFd::as_fd(&self.conntrack_fd))
    }

    /// Delete the UDP entries whose backend (forward: its destination; reply: its source) is not in
    /// `backends` any more: kube-proxy flushes a removed endpoint's UDP conntrack, or a client's datagrams
    /// would go on to the departed backend for as long as it keeps sending. TCP flows are left to end.
    pub fn forget_udp_except(&mut self, backends: &BTreeSet<lb_common::Backend>) -> usize {
        self.forget_udp_where(|b| !backends.contains(b))
    }

    /// Forget the UDP flows to the backends `departed` says are gone; how many.
    fn forget_udp_where(&mut self, departed: impl Fn(&lb_common::Backend) -> bool) -> usize {
        let gone: Vec<lb_common::CtKey> = self
            .conntrack
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| {
                if k.proto != lb_common::PROTO_UDP {
                    return false;
                }
                let (addr, port) =
                    if v.flags & lb_common::CT_FORWARD != 0 { (v.a, v.a_port) } else { (k.saddr, k.sport) };
                departed(&lb_common::Backend { addr, port, proto: k.proto, family: k.family })
            })
            .map(|(k, _)| k)
            .collect();
        for k in &gone {
            let _ = self.conntrack.remove(k);
        }
        gone.len()
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
