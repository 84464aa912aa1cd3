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
    match AttachMode::current() {
        AttachMode::Tcx => true,
        AttachMode::Netlink => false,
        AttachMode::Auto => KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0)),
    }
}

/// How the tc programs are attached (`--tc-attach`): tcx links from kernel 6.6, netlink clsact filters below
/// (`Auto`), or one of them forced (netlink on a newer kernel: a CNI that manages clsact filters, or the
/// tests of the path kernels 6.1-6.5 take).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// tcx where the kernel has it (6.6), else netlink.
    #[default]
    Auto,
    /// tcx links, pinned.
    Tcx,
    /// netlink filters on a clsact qdisc, at a fixed priority and handle (`NETLINK_PRIORITY`), replaced in
    /// place by a restarted agent.
    Netlink,
}

static ATTACH_MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl AttachMode {
    /// Set the process's attach mode (the agent, at start).
    pub fn set(self) {
        ATTACH_MODE.store(self as u8, std::sync::atomic::Ordering::Relaxed);
    }

    fn current() -> Self {
        match ATTACH_MODE.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Self::Tcx,
            2 => Self::Netlink,
            _ => Self::Auto,
        }
    }
}

/// The priority of tierlb's netlink filters (the handle is 1): fixed, so a restarted agent replaces its
/// filter in place (`cls_bpf` swaps the program atomically) instead of adding another, and high, so a CNI's
/// filters at the usual low numbers run first (as tcx's last place does).
pub const NETLINK_PRIORITY: u16 = 65_000;
const NETLINK_HANDLE: tc::TcHandle = tc::TcHandle::new(0, 1);

/// The devices of this network namespace that hold one of `addrs` (the node's NodePort addresses), sorted.
pub fn devices_holding(addrs: &[IpAddr]) -> Vec<String> {
    let out: BTreeSet<String> = interface_addresses()
        .into_iter()
        .filter(|(name, ip)| addrs.contains(ip) && name != "lo")
        .map(|(name, _)| name)
        .collect();
    out.into_iter().collect()
}

/// The devices a local backend's reply may leave by: every device of this network namespace but loopback
/// that holds a global unicast address (not loopback, link-local or multicast), sorted.
pub fn reply_devices() -> Vec<String> {
    let ethernet = ethernet_devices();
    let out: BTreeSet<String> = interface_addresses()
        .into_iter()
        .filter(|(name, ip)| name != "lo" && is_global(ip) && ethernet.contains(name))
        .map(|(n, _)| n)
        .collect();
    out.into_iter().collect()
}

/// The devices with an Ethernet header (`ARPHRD_ETHER`, from their link-layer address): the only ones the tc
/// programs parse (an L3 device such as WireGuard's or an IPIP tunnel carries none).
fn ethernet_devices() -> BTreeSet<String> {
    const ARPHRD_ETHER: u16 = 1;
    let Ok(ifs) = nix::ifaddrs::getifaddrs() else { return BTreeSet::new() };
    ifs.filter(|ifa| {
        ifa.address.as_ref().and_then(|a| a.as_link_addr()).is_some_and(|l| l.hatype() == ARPHRD_ETHER)
    })
    .map(|ifa| ifa.interface_name)
    .collect()
}

/// A global unicast address: not loopback, link-local, multicast or unspecified.
pub fn is_global(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !(a.is_loopback() || a.is_link_local() || a.is_multicast() || a.is_unspecified()),
        IpAddr::V6(a) => {
            !(a.is_loopback() || a.is_unicast_link_local() || a.is_multicast() || a.is_unspecified())
        }
    }
}

/// Whether a device of that name exists in this network namespace.
pub fn device_exists(device: &str) -> bool {
    nix::net::if_::if_nametoindex(device).is_ok()
}

/// Every address on an interface of this network namespace, with the interface's name.
pub fn interface_addresses() -> Vec<(String, IpAddr)> {
    let Ok(ifs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    ifs.filter_map(|ifa| {
        let a = ifa.address?;
        let ip = a
            .as_sockaddr_in()
            .map(|s| IpAddr::V4(s.ip()))
            .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))?;
        Some((ifa.interface_name, ip))
    })
    .collect()
}

/// The node's ephemeral port range (`net.ipv4.ip_local_port_range` of this network namespace, which IPv6
/// sockets use too), `None` if it cannot be read.
pub fn ephemeral_ports() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
        _ => None,
    }
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
    attach_programs(ebpf, device, pin_dir, &TC_PROGRAMS)
}

/// Attach `tc_egress` alone to `device`: a device that holds no NodePort address but by which a local
/// backend's reply may leave (policy routing, a second uplink, a tunnel), so the reply is translated
/// whatever device it leaves by.
pub fn attach_egress(ebpf: &mut Ebpf, device: &str, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
    attach_programs(ebpf, device, pin_dir, &TC_PROGRAMS[1..])
}

fn attach_programs(
    ebpf: &mut Ebpf,
    device: &str,
    pin_dir: Option<&Path>,
    programs: &[(&str, TcAttachType)],
) -> Result<(), DatapathError> {
    let tcx = has_tcx();
    if !tcx {
        // EEXIST: the device has a clsact qdisc already (a CNI's, or ours from an earlier start). aya 0.14
        // reports it as the netlink error, not `AlreadyAttached`: taken for a failure, it kept every restart
        // of the agent from attaching on kernels without tcx (the first start's programs stayed).
        if let Err(e) = tc::qdisc_add_clsact(device)
            && !matches!(e, tc::TcError::AlreadyAttached)
            && !matches!(&e, tc::TcError::NetlinkError(n) if n.raw_os_error() == Some(libc::EEXIST))
        {
            return Err(bpf_err(format!("adding a clsact qdisc to {device}"), e));
        }
    }
    for &(name, kind) in programs {
        let p = classifier(ebpf, name)?;
        let attaching = |e| bpf_err(format!("attaching {name} to device {device} (needs CAP_NET_ADMIN)"), e);
        let id = if tcx {
            // Last in the device's chain: a CNI's own programs keep their place before ours.
            p.attach_with_options(device, kind, TcAttachOptions::TcxOrder(LinkOrder::last()))
                .map_err(attaching)?
        } else {
            attach_netlink(p, device, name, kind).map_err(attaching)?
        };
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

/// Attach `p` (named `name`) to `device` by netlink at `NETLINK_PRIORITY`: replace our filter there in place
/// (an earlier agent's; no moment without a program), or, where there is none, remove any filter of ours at
/// another priority (an earlier version added one at a new priority on every start) and add it.
fn attach_netlink(
    p: &mut SchedClassifier,
    device: &str,
    name: &str,
    kind: TcAttachType,
) -> Result<tc::SchedClassifierLinkId, aya::programs::ProgramError> {
    let ours = tc::SchedClassifierLink::attached(device, kind, NETLINK_PRIORITY, NETLINK_HANDLE, None)
        .map_err(tc::TcError::IoError)?;
    if let Ok(id) = p.attach_to_link(ours) {
        return Ok(id);
    }
    let _ = tc::qdisc_detach_program(device, kind, name);
    let opts = tc::NlOptions { priority: NETLINK_PRIORITY, handle: NETLINK_HANDLE, ..Default::default() };
    p.attach_with_options(device, kind, TcAttachOptions::Netlink(opts))
}

/// Every device of this network namespace (`if_nameindex`), for the netlink filters, which leave no pin.
pub fn all_devices() -> Vec<String> {
    nix::net::if_::if_nameindex()
        .map(|ifs| ifs.iter().map(|i| i.name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
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
        detach_netlink(device);
    }
}

/// Remove the netlink filters of our programs from `device` (none there: nothing done).
pub fn detach_netlink(device: &str) {
    for (name, kind) in TC_PROGRAMS {
        let _ = tc::qdisc_detach_program(device, kind, name);
    }
}

/// The north-south maps the agent writes (local endpoints, settings) and reads (conntrack, counters).
pub struct NsMaps {
    local: aya::maps::HashMap<aya::maps::MapData, lb_common::CtAddr, u32>,
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
            aya::maps::Map::LruHashMap(data) => {
                (super::error::second_fd(data, name)?, data.info().map_err(map_err(name))?.max_entries())
            }
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
    lb_common::CtAddr { addr: super::addr::words(ip) }
}

/// A source range's prefix length and key in `SOURCE_RANGES`.
fn range_key((fe, c): &SourceRange) -> (u32, lb_common::SourceRangeKey) {
    let data = lb_common::SourceRangeKey { frontend: *fe, client: super::addr::words(c.ip) };
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
            let path = dir.join(name);
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
            aya::maps::Map::PerCpuArray(data) => super::error::second_fd(data, MAP_NS_COUNTERS)?,
            _ => return Err(DatapathError::MissingMap { name: MAP_NS_COUNTERS }),
        };
        let [tcp, syn, udp] = m.conntrack;
        Ok(Self {
            local: aya::maps::HashMap::try_from(m.local).map_err(map_err(MAP_LOCAL_BACKENDS))?,
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

    /// Make the ingress pre-filter (`NS_ADDRS`) hold exactly `want` (address -> `ADDR_*` flags).
    pub fn set_addrs(&mut self, want: &std::collections::BTreeMap<IpAddr, u32>) -> Result<(), DatapathError> {
        let name = lb_common::MAP_NS_ADDRS;
        let key = |ip: IpAddr| lb_common::AddrKey {
            addr: super::addr::words(ip),
            family: if ip.is_ipv4() { lb_common::FAMILY_V4 } else { lb_common::FAMILY_V6 },
            _pad: [0; 3],
        };
        let want: std::collections::BTreeMap<lb_common::AddrKey, u32> =
            want.iter().map(|(ip, f)| (key(*ip), *f)).collect();
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
        for (table, out) in self.conntrack.iter().zip(s.tables.iter_mut()) {
            out.capacity = table.capacity;
            for (_, v) in table.map.iter().filter_map(Result::ok) {
                out.entries += 1;
                if v.flags & lb_common::CT_FORWARD != 0 && v.expires_ns > now_ns {
                    out.flows += 1;
                    s.snat_flows += usize::from(v.flags & lb_common::CT_SNAT != 0);
                }
            }
            s.flows += out.flows;
            s.entries += out.entries;
        }
        s
    }

    /// The conntrack tables' memory as the kernel accounts it (`memlock` in each map's fdinfo: its
    /// `map_mem_usage`, every preallocated element included), `None` if the kernel does not say.
    pub fn conntrack_memory(&self) -> Option<u64> {
        self.conntrack.iter().map(|t| super::sys::map_memory(std::os::fd::AsFd::as_fd(&t.fd))).sum()
    }

    /// The memory of the UDP conntrack table alone (`conntrack_memory`'s accounting).
    pub fn udp_conntrack_memory(&self) -> Option<u64> {
        super::sys::map_memory(std::os::fd::AsFd::as_fd(&self.conntrack[2].fd))
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
        for k in &gone {
            let _ = udp.remove(k);
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
