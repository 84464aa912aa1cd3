//! The agent's part of the north-south data path (traffic from outside the node, `lb-ebpf`'s tc programs):
//! which devices they are attached to, their settings (the node addresses SNAT uses), the set of this node's
//! endpoints (reached without SNAT), and the UDP flows to departed backends (removed, as kube-proxy flushes
//! their conntrack entries). The frontends themselves are lowered with the others (`lower::frontends`).
use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
};

use lb_common::{Backend, NatConfig};

use super::{AgentCore, SyncReport};
use crate::{
    datapath::{
        MapWriter, addr,
        ebpf::Programs,
        tc::{self, NsMaps},
    },
    model::{Model, NodeInfo},
};

/// What the agent keeps of the north-south data path between syncs.
pub(super) struct NorthSouth {
    maps: NsMaps,
    /// `--devices` (`None`: the devices holding the NodePort addresses).
    devices: Option<Vec<String>>,
    pin_dir: Option<PathBuf>,
    attached: BTreeSet<String>,
    config: Option<NatConfig>,
    /// The local-endpoint set and the source ranges last written (`None`: not yet, or the write failed), so
    /// a sync that changes neither costs no map syscalls; the first write reads the maps (an earlier agent's
    /// pinned contents) and makes them equal.
    local: Option<BTreeSet<IpAddr>>,
    ranges: Option<BTreeSet<tc::SourceRange>>,
}

impl NorthSouth {
    pub(super) fn new(maps: NsMaps, devices: Option<Vec<String>>, pin_dir: Option<&Path>) -> Self {
        Self {
            maps,
            devices,
            pin_dir: pin_dir.map(Path::to_owned),
            attached: BTreeSet::new(),
            config: None,
            local: None,
            ranges: None,
        }
    }

    /// The devices the programs belong on now.
    fn wanted(&self, node: &NodeInfo) -> Vec<String> {
        match &self.devices {
            Some(d) if d.iter().any(|d| d == "none") => Vec::new(),
            Some(d) => d.clone(),
            None => tc::devices_holding(&node.node_port_addresses),
        }
    }

    /// After a sync: settings, local endpoints, devices (attaching to any new one). Errors are logged and
    /// leave the rest working (an unattachable device does not stop the agent).
    pub(super) fn sync(&mut self, programs: &mut Programs, node: &NodeInfo, model: &Model) {
        let config = nat_config(node);
        if self.config != Some(config) {
            match self.maps.set_config(config) {
                Ok(()) => self.config = Some(config),
                Err(e) => tracing::error!(error = %e, "cannot write the north-south settings"),
            }
        }
        let local = local_endpoints(model, &node.name);
        if self.local.as_ref() != Some(&local) {
            match self.maps.set_local(&local) {
                Ok(()) => self.local = Some(local),
                Err(e) => {
                    self.local = None;
                    tracing::error!(error = %e, "cannot write this node's endpoints for traffic from outside");
                }
            }
        }
        for device in self.wanted(node) {
            if self.attached.contains(&device) {
                continue;
            }
            match programs.attach_device(&device, self.pin_dir.as_deref()) {
                Ok(()) => {
                    tracing::info!(device = %device, tcx = tc::has_tcx(), "translating traffic from outside the node");
                    self.attached.insert(device);
                }
                Err(e) => {
                    tracing::error!(device = %device, error = %e, "cannot attach the tc programs; traffic from outside the node on this device is not translated");
                }
            }
        }
    }

    /// After a sync or retry: `sync` with its node and, when frontends changed, forget the UDP flows to
    /// backends no applied frontend holds any more.
    pub(super) fn after_sync<W: MapWriter>(
        &mut self,
        programs: &mut Programs,
        r: &SyncReport,
        core: &AgentCore<W>,
    ) {
        if let Some(node) = &r.node {
            self.sync(programs, node, core.model());
        }
        let ranges = source_ranges(core);
        if self.ranges.as_ref() != Some(&ranges) {
            match self.maps.set_source_ranges(&ranges) {
                Ok(()) => self.ranges = Some(ranges),
                Err(e) => {
                    self.ranges = None;
                    tracing::error!(error = %e, "cannot write loadBalancerSourceRanges");
                }
            }
        }
        if r.updated + r.removed > 0 {
            let backends: BTreeSet<Backend> =
                core.reconciler().applied().flat_map(|(_, _, d)| d.tiers.iter().flatten()).copied().collect();
            let forgotten = self.maps.forget_udp_except(&backends);
            if forgotten > 0 {
                tracing::info!(
                    flows = forgotten,
                    "forgot UDP flows from outside the node to departed backends"
                );
            }
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

    /// The devices attached to.
    pub(super) fn devices(&self) -> Vec<String> {
        self.attached.iter().cloned().collect()
    }
}

/// The tc programs' settings for `node`: the node addresses SNAT leaves from for load-balancer IPs and
/// externalIPs (the first NodePort address of each family; a node port SNATs to the address it was reached
/// on), defaults for the rest (see `lb_common::nat`).
pub(super) fn nat_config(node: &NodeInfo) -> NatConfig {
    let mut c = NatConfig::default();
    if let Some(v4) = node.node_port_addresses.iter().find(|a| a.is_ipv4()) {
        c.snat_v4 = addr::words(*v4)[0];
    }
    if let Some(v6) = node.node_port_addresses.iter().find(|a| a.is_ipv6()) {
        c.snat_v6 = addr::words(*v6);
    }
    c
}

/// The source-range entries of every applied outside frontend that has them (`FLAG_SOURCE_RANGES`): the
/// ranges of the Service that frontend is programmed for (`plan::source_ranges`, the plan's rule), so a
/// Service that lost a contested address adds none.
fn source_ranges<W: MapWriter>(core: &AgentCore<W>) -> BTreeSet<tc::SourceRange> {
    let model = core.model();
    let mut out = BTreeSet::new();
    for (key, value, desired) in core.reconciler().applied() {
        if !key.is_outside() || value.flags & lb_common::FLAG_SOURCE_RANGES == 0 {
            continue;
        }
        let Some(svc) = model.services.get(&desired.name.service) else { continue };
        let family = crate::model::Family::of(&addr::frontend_addr(key).ip());
        out.extend(crate::plan::source_ranges(svc, family).into_iter().map(|c| (*key, c)));
    }
    out
}

/// The addresses of every endpoint on node `node` (`nodeName`), whatever its Service: traffic from outside
/// to them keeps the client's address.
pub(super) fn local_endpoints(model: &Model, node: &str) -> BTreeSet<IpAddr> {
    model
        .services
        .keys()
        .flat_map(|k| model.slices_of(k))
        .flat_map(|s| &s.endpoints)
        .filter(|e| e.node_name.as_deref() == Some(node))
        .filter_map(|e| e.address)
        .collect()
}
