//! The agent's part of the north-south data path (traffic from outside the node, `lb-ebpf`'s tc programs):
//! which devices they are attached to, their settings (the node addresses SNAT uses), the set of this node's
//! endpoints (reached without SNAT), and the UDP flows to departed backends (removed, as kube-proxy flushes
//! their conntrack entries). The frontends themselves are lowered with the others (`lower::frontends`).
mod contributions;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lb_common::NatConfig;

use self::contributions::{Contributions, Delta};
use super::{AgentCore, SyncReport};
use crate::{
    datapath::{
        MapWriter, addr,
        ebpf::Programs,
        tc::{self, NsMaps},
    },
    model::NodeInfo,
};

/// What the agent keeps of the north-south data path between syncs.
pub(super) struct NorthSouth {
    maps: NsMaps,
    /// `--devices` (`None`: the devices holding the NodePort addresses).
    devices: Option<Vec<String>>,
    pin_dir: Option<PathBuf>,
    /// The devices attached to: `true` both programs, `false` the egress program alone; and the device's
    /// index then (a device deleted and made again under its name between two scans has a new one, and
    /// none of our programs).
    attached: std::collections::BTreeMap<String, (bool, u32)>,
    /// The node's NodePort addresses at the last sync (their devices get both programs).
    node_port_addresses: Vec<std::net::IpAddr>,
    /// When the devices were last looked at from the tick.
    rescanned: Option<Instant>,
    /// `--service-node-port-range`, left out of the SNAT ports.
    node_port_range: (u16, u16),
    config: Option<NatConfig>,
    /// What the Services add to the local-endpoint set, the source ranges and the UDP backends (`None`: not
    /// taken yet). A sync that planned a few Services writes only what they change; the first sync and one
    /// that replanned everything read the maps (an earlier agent's pinned contents) and make them equal to
    /// every Service's part.
    written: Option<Contributions>,
    /// When the conntrack occupancy was last read for `/metrics`.
    observed: Option<Instant>,
    /// The ingress pre-filter as last written (`None`: not yet).
    addrs: Option<std::collections::BTreeMap<std::net::IpAddr, u32>>,
    /// The NodePort devices `xdp_ingress` is on, and how.
    xdp: std::collections::BTreeMap<String, crate::datapath::xdp::XdpAttached>,
    /// Whether `/metrics` shows `xdp` as it is.
    xdp_published: bool,
    /// When a write last failed (a full map): the maps are made whole again at most every
    /// [`REWRITE_AFTER_FAILURE`], not on every sync, so an overfull map does not make each edit cost every
    /// Service.
    failed: Option<Instant>,
}

/// How often the tick looks for devices that came or went.
const RESCAN_EVERY: Duration = Duration::from_secs(2);

/// How often `/metrics`' conntrack occupancy is read.
const CONNTRACK_EVERY: Duration = Duration::from_secs(10);

/// How long after a failed write the maps are rewritten whole.
const REWRITE_AFTER_FAILURE: Duration = Duration::from_secs(10);

impl NorthSouth {
    pub(super) fn new(
        maps: NsMaps,
        devices: Option<Vec<String>>,
        pin_dir: Option<&Path>,
        node_port_range: (u16, u16),
    ) -> Self {
        Self {
            maps,
            node_port_range,
            devices,
            pin_dir: pin_dir.map(Path::to_owned),
            attached: std::collections::BTreeMap::new(),
            node_port_addresses: Vec::new(),
            rescanned: None,
            config: None,
            addrs: None,
            observed: None,
            written: None,
            failed: None,
            xdp: std::collections::BTreeMap::new(),
            xdp_published: false,
        }
    }

    /// Rebuild the sets' maps with full nodes (`memory::trim_after`).
    pub(super) fn repack(&mut self) {
        if let Some(c) = &mut self.written {
            c.repack();
        }
    }

    /// The devices both programs belong on now.
    fn wanted(&self) -> Vec<String> {
        match &self.devices {
            Some(d) if d.iter().any(|d| d == "none") => Vec::new(),
            Some(d) => d.clone(),
            None => tc::devices_holding(&self.node_port_addresses),
        }
    }

    /// After a sync: settings and devices (attaching to any new one). Errors are logged and leave the rest
    /// working (an unattachable device does not stop the agent).
    fn sync(&mut self, programs: &mut Programs, node: &NodeInfo) {
        let config = nat_config(node, self.node_port_range);
        if self.config != Some(config) {
            let ports = config.snat_ports().count();
            if ports < 4_536 {
                tracing::warn!(
                    ports,
                    "few SNAT ports: the node's ephemeral range (net.ipv4.ip_local_port_range) covers most of \
                     1024-65535, and SNAT uses only ports outside it; new flows from outside to backends on other \
                     nodes are dropped when they run out (drop_snat_ports_exhausted): narrow the range"
                );
            }
            match self.maps.set_config(config) {
                Ok(()) => self.config = Some(config),
                Err(e) => tracing::error!(error = %e, "cannot write the north-south settings"),
            }
        }
        self.node_port_addresses.clone_from(&node.node_port_addresses);
        self.follow_devices(programs);
    }

    /// Attach to the devices that want the programs and do not have them yet: both programs on the
    /// NodePort devices, the egress program on every other device a local backend's reply may leave by
    /// (`tc::reply_devices`); forget devices that went away (their tcx links went with them; their pins
    /// are removed). Called after each sync and from the loop's tick (`rescan`), so devices are followed
    /// as they come and go.
    fn follow_devices(&mut self, programs: &mut Programs) {
        let gone: Vec<String> = self
            .attached
            .iter()
            .filter(|(d, (_, index))| tc::device_index(d) != Some(*index))
            .map(|(d, _)| d.clone())
            .collect();
        for device in gone {
            tracing::info!(device = %device, "device gone, or made again under its name");
            tc::detach(self.pin_dir.as_deref(), &device);
            self.attached.remove(&device);
            self.xdp.remove(&device);
            self.xdp_published = false;
        }
        // Both programs on the NodePort devices (or `--devices`); the egress program alone on every other
        // Ethernet device with a global address, so a local backend's reply is translated wherever it leaves.
        // Not `tc_ingress` there: a bridge's ingress is its pods' traffic, which the unmatched-packet drop
        // for foreign load-balancer IPs must not meet.
        let full = self.wanted();
        let none = matches!(&self.devices, Some(d) if d.iter().any(|d| d == "none"));
        let reply = if none { Vec::new() } else { tc::reply_devices() };
        let egress: Vec<String> = reply.into_iter().filter(|d| !full.contains(d)).collect();
        for (device, both) in
            full.into_iter().map(|d| (d, true)).chain(egress.into_iter().map(|d| (d, false)))
        {
            // An L3 device (no Ethernet header) gets the egress program alone, even as a NodePort device: an
            // answer or a forward past the stack from its ingress has no MAC to go to.
            let l3 = tc::device_kind(&device) == Some(tc::LinkKind::L3);
            if self.attached.get(&device).is_some_and(|(had, _)| *had || !both || l3) {
                continue;
            }
            if both && l3 {
                tracing::warn!(device = %device, "an L3 device: traffic from outside arriving by it is not translated, only replies leaving by it");
            }
            let both = both && !l3;
            let pins = self.pin_dir.as_deref();
            // The index before attaching: a device made again meanwhile is seen as changed on the next scan.
            let index = tc::device_index(&device).unwrap_or(0);
            let r = if both {
                programs.attach_device(&device, pins).map(|xdp| self.note_xdp(&device, xdp))
            } else {
                programs.attach_egress(&device, pins)
            };
            match r {
                Ok(()) => {
                    if both {
                        let xdp = self.xdp.get(&device).map_or("off", |m| m.name());
                        tracing::info!(device = %device, tcx = tc::has_tcx(), xdp, "translating traffic from outside the node");
                    } else {
                        tracing::info!(device = %device, tcx = tc::has_tcx(), "translating replies to outside the node that leave by this device");
                    }
                    self.attached.insert(device, (both, index));
                }
                Err(e) => {
                    tracing::error!(device = %device, error = %e, "cannot attach the tc programs; traffic from outside the node on this device is not translated");
                }
            }
        }
    }

    /// Record how XDP went on `device` (logged when it failed: tc translates its traffic).
    fn note_xdp(
        &mut self,
        device: &str,
        xdp: Result<Option<crate::datapath::xdp::XdpAttached>, crate::datapath::ebpf::DatapathError>,
    ) {
        match xdp {
            Ok(Some(mode)) => {
                self.xdp.insert(device.to_owned(), mode);
            }
            Ok(None) => {
                self.xdp.remove(device);
            }
            Err(e) => {
                self.xdp.remove(device);
                tracing::error!(device = %device, error = %e, "cannot attach XDP; tc translates this device's traffic from outside");
            }
        }
        self.xdp_published = false;
    }

    /// From the loop's tick: follow the devices (`follow_devices`), at most every [`RESCAN_EVERY`].
    pub(super) fn rescan(&mut self, programs: &mut Programs) {
        if self.config.is_none() || self.rescanned.is_some_and(|t| t.elapsed() < RESCAN_EVERY) {
            return;
        }
        self.rescanned = Some(Instant::now());
        self.follow_devices(programs);
        // The pre-filter follows the interfaces' addresses too (a device or a kube-vip address that came).
        if !self.write_addrs() {
            self.failed.get_or_insert_with(Instant::now);
        }
    }

    /// After a sync or retry: `sync` with its node; the local endpoints and source ranges of the Services it
    /// planned written, and the UDP flows to backends no applied frontend holds any more forgotten.
    pub(super) fn after_sync<W: MapWriter>(
        &mut self,
        programs: &mut Programs,
        r: &SyncReport,
        core: &AgentCore<W>,
    ) {
        let Some(node) = &r.node else { return };
        self.sync(programs, node);
        let (model, rec) = (core.model(), core.reconciler());
        let rewrite = self.failed.is_some_and(|t| t.elapsed() >= REWRITE_AFTER_FAILURE);
        if !rewrite && let (Some(written), Some(services)) = (self.written.as_mut(), &r.touched) {
            let delta = written.update(model, &node.name, rec, services);
            let ok = self.write(&delta);
            if !(ok && self.write_addrs()) {
                self.failed.get_or_insert_with(Instant::now);
            }
            return;
        }
        let all = Contributions::of_all(model, &node.name, rec);
        let local = self.maps.set_local(&all.local().collect());
        log_failure(local.as_ref().err(), "cannot write this node's endpoints for traffic from outside");
        let ranges = self.maps.set_source_ranges(&all.ranges().collect());
        log_failure(ranges.as_ref().err(), "cannot write loadBalancerSourceRanges");
        if r.updated + r.removed > 0 {
            log_forgotten(self.maps.forget_udp_except(&all.udp().collect()));
        }
        self.written = Some(all);
        let addrs = self.write_addrs();
        self.failed = (local.is_err() || ranges.is_err() || !addrs).then(Instant::now);
    }

    /// Write the ingress pre-filter if it changed: the node's NodePort addresses, and the load-balancer IPs
    /// and externalIPs of the applied outside frontends, each marked as the node's (on one of its
    /// interfaces) or foreign. False (logged) if the write failed.
    fn write_addrs(&mut self) -> bool {
        let Some(c) = &self.written else { return true };
        let full: Vec<&str> =
            self.attached.iter().filter(|(_, (both, _))| *both).map(|(d, _)| d.as_str()).collect();
        let want = pre_filter(&self.node_port_addresses, &full, c.lb_addrs(), &tc::interface_addresses());
        if self.addrs.as_ref() == Some(&want) {
            return true;
        }
        let r = self.maps.set_addrs(&want);
        log_failure(r.as_ref().err(), "cannot write the addresses of traffic from outside");
        if r.is_ok() {
            self.addrs = Some(want);
        }
        r.is_ok()
    }

    /// Write what changed; false (logged) if a write failed.
    fn write(&mut self, d: &Delta) -> bool {
        let local = self.maps.update_local(&d.local_added, &d.local_removed);
        log_failure(local.as_ref().err(), "cannot write this node's endpoints for traffic from outside");
        let ranges = self.maps.update_source_ranges(&d.ranges_added, &d.ranges_removed);
        log_failure(ranges.as_ref().err(), "cannot write loadBalancerSourceRanges");
        log_forgotten(self.maps.forget_udp_to(&d.udp_departed));
        local.is_ok() && ranges.is_ok()
    }

    /// Publish the conntrack tables' occupancy to `/metrics`, at most every [`CONNTRACK_EVERY`] (a walk of
    /// the tables).
    pub(super) fn observe(&mut self, stats: &crate::metrics::AgentStats) {
        if !self.xdp_published {
            self.xdp_published = true;
            stats.xdp_attached.clear();
            for (device, mode) in &self.xdp {
                let labels =
                    vec![("device".to_owned(), device.clone()), ("mode".to_owned(), mode.name().to_owned())];
                stats.xdp_attached.get_or_create(&labels).set(1);
            }
        }
        if self.observed.is_some_and(|t| t.elapsed() < CONNTRACK_EVERY) {
            return;
        }
        self.observed = Some(Instant::now());
        let c = self.maps.conntrack_stats(crate::datapath::marks::boottime_ns());
        for (name, t) in lb_common::CT_TABLES.iter().zip(&c.tables) {
            let labels = vec![("table".to_owned(), (*name).to_owned())];
            stats.conntrack_entries.get_or_create(&labels).set(crate::metrics::gauge(t.entries));
            stats.conntrack_flows.get_or_create(&labels).set(crate::metrics::gauge(t.flows));
            stats.conntrack_capacity.get_or_create(&labels).set(i64::from(t.capacity));
            // A counter: grows by what the derived figure grew (it can dip by the keys written between the
            // counters' read and the walk, never below what was published).
            let published = stats.conntrack_evictions.get_or_create(&labels).get();
            stats.conntrack_evictions.get_or_create(&labels).inc_by(t.evicted.saturating_sub(published));
        }
    }

    /// A handle on the tc programs' counters for `/metrics` (`None`, logged, if it cannot be made).
    pub(super) fn counters_reader(&self) -> Option<aya::maps::PerCpuArray<aya::maps::MapData, u64>> {
        self.maps
            .counters_reader()
            .inspect_err(
                |e| tracing::error!(error = %e, "/metrics will have no counters of traffic from outside"),
            )
            .ok()
    }

    /// The devices attached to (both programs, or the egress program alone).
    pub(super) fn devices(&self) -> Vec<String> {
        self.attached.keys().cloned().collect()
    }
}

/// The ingress pre-filter (`NS_ADDRS`): the node's NodePort addresses and its other addresses on the devices
/// with `tc_ingress` (`ADDR_NODE`), and the load-balancer
/// IPs and externalIPs `lb`, `ADDR_NODE` where one of the node's interfaces (`interfaces`) holds them (kube-vip
/// and the like assign them), else `ADDR_FOREIGN` (MetalLB and BGP speakers route them to the node without
/// assigning them: an unmatched packet to one is dropped, not routed back out).
pub(super) fn pre_filter(
    node_port_addresses: &[std::net::IpAddr],
    ingress_devices: &[&str],
    lb: impl Iterator<Item = std::net::IpAddr>,
    interfaces: &[(String, std::net::IpAddr)],
) -> std::collections::BTreeMap<std::net::IpAddr, u32> {
    // The node's own addresses where `tc_ingress` runs: the NodePort addresses, and every global address of
    // the devices with both programs (an SNAT flow to a load-balancer IP's backend may leave from one, as its
    // route gives it, and its replies come back there; the programs take no other address for it).
    let on_ingress = interfaces
        .iter()
        .filter(|(d, a)| ingress_devices.contains(&d.as_str()) && tc::is_global(a))
        .map(|(_, a)| a);
    let mut out: std::collections::BTreeMap<_, _> =
        node_port_addresses.iter().chain(on_ingress).map(|a| (*a, lb_common::ADDR_NODE)).collect();
    for ip in lb {
        let on_node = out.contains_key(&ip) || interfaces.iter().any(|(_, a)| *a == ip);
        out.insert(ip, if on_node { lb_common::ADDR_NODE } else { lb_common::ADDR_FOREIGN });
    }
    out
}

/// The tc programs' settings for `node`: the node addresses SNAT leaves from for load-balancer IPs and
/// externalIPs (the first NodePort address of each family; a node port SNATs to the address it was reached
/// on), the node's ephemeral port range (cut out of the SNAT ports, so no socket of the node is given one
/// of them automatically) and the cluster's NodePort range `node_ports` (cut out too), defaults for the rest
/// (see `lb_common::nat`).
pub(super) fn nat_config(node: &NodeInfo, node_ports: (u16, u16)) -> NatConfig {
    let mut c =
        NatConfig { node_port_min: node_ports.0, node_port_max: node_ports.1, ..NatConfig::default() };
    if let Some((lo, hi)) = tc::ephemeral_ports() {
        (c.ephemeral_min, c.ephemeral_max) = (lo, hi);
    }
    if let Some(v4) = node.node_port_addresses.iter().find(|a| a.is_ipv4()) {
        c.snat_v4 = addr::words(*v4)[0];
    }
    if let Some(v6) = node.node_port_addresses.iter().find(|a| a.is_ipv6()) {
        c.snat_v6 = addr::words(*v6);
    }
    c
}

/// Log a failed write with its causes ("map X: the kernel's error"), not only its outermost message.
fn log_failure<E: std::error::Error>(e: Option<&E>, what: &str) {
    if let Some(e) = e {
        let mut text = e.to_string();
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        tracing::error!(error = %text, "{what}");
    }
}

fn log_forgotten(flows: usize) {
    if flows > 0 {
        tracing::info!(flows, "forgot UDP flows from outside the node to departed backends");
    }
}
