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
    attached: std::collections::BTreeSet<String>,
    config: Option<NatConfig>,
    /// What the Services add to the local-endpoint set, the source ranges and the UDP backends (`None`: not
    /// taken yet). A sync that planned a few Services writes only what they change; the first sync and one
    /// that replanned everything read the maps (an earlier agent's pinned contents) and make them equal to
    /// every Service's part.
    written: Option<Contributions>,
    /// When a write last failed (a full map): the maps are made whole again at most every
    /// [`REWRITE_AFTER_FAILURE`], not on every sync, so an overfull map does not make each edit cost every
    /// Service.
    failed: Option<Instant>,
}

/// How long after a failed write the maps are rewritten whole.
const REWRITE_AFTER_FAILURE: Duration = Duration::from_secs(10);

impl NorthSouth {
    pub(super) fn new(maps: NsMaps, devices: Option<Vec<String>>, pin_dir: Option<&Path>) -> Self {
        Self {
            maps,
            devices,
            pin_dir: pin_dir.map(Path::to_owned),
            attached: std::collections::BTreeSet::new(),
            config: None,
            written: None,
            failed: None,
        }
    }

    /// Rebuild the sets' maps with full nodes (`memory::trim_after`).
    pub(super) fn repack(&mut self) {
        if let Some(c) = &mut self.written {
            c.repack();
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

    /// After a sync: settings and devices (attaching to any new one). Errors are logged and leave the rest
    /// working (an unattachable device does not stop the agent).
    fn sync(&mut self, programs: &mut Programs, node: &NodeInfo) {
        let config = nat_config(node);
        if self.config != Some(config) {
            match self.maps.set_config(config) {
                Ok(()) => self.config = Some(config),
                Err(e) => tracing::error!(error = %e, "cannot write the north-south settings"),
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
            if !self.write(&delta) {
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
        self.failed = (local.is_err() || ranges.is_err()).then(Instant::now);
        self.written = Some(all);
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
