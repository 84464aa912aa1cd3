//! `tierlb status`'s view of the north-south data path: the devices the tc programs are on, the tracked
//! flows, and the programs' counters (translations, drops and passes by reason).
use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use serde::Serialize;

use crate::datapath::tc::{self, ConntrackStats, NsMaps};

/// The north-south data path of one agent instance.
#[derive(Clone, Debug, Serialize)]
pub struct NorthSouthStatus {
    /// How the tc programs are attached: `tcx` (Linux 6.6) or `netlink` (clsact filters); `null` when they
    /// are on no device.
    pub attach: Option<tc::Attached>,
    /// The devices the tc programs are on, read off the instance's pins (a tcx link, or the program pinned
    /// beside its netlink filter).
    pub devices: Vec<String>,
    /// The devices `xdp_ingress` is on before tc, and how (`native`, `generic`), read off the instance's
    /// pins; empty when XDP is off or on no device.
    pub xdp: BTreeMap<String, crate::datapath::xdp::XdpAttached>,
    /// Conntrack occupancy.
    pub conntrack: ConntrackStats,
    /// The tc programs' counters by name (`lb_common::NS_COUNTER_NAMES`), summed over CPUs.
    pub counters: BTreeMap<&'static str, u64>,
}

impl NorthSouthStatus {
    /// Read it from the instance's pins in `dir` at `now_ns` (`CLOCK_BOOTTIME`); `None` if its maps are not
    /// pinned there (an agent of an earlier version).
    pub fn read(dir: &Path, now_ns: u64) -> Option<Self> {
        let maps = NsMaps::open_pinned(dir).ok()?;
        let counters = lb_common::NS_COUNTER_NAMES.iter().copied().zip(maps.counters()).collect();
        Some(Self {
            attach: tc::pinned_attach(dir),
            devices: tc::pinned_devices(dir),
            xdp: crate::datapath::xdp::pinned(dir),
            conntrack: maps.conntrack_stats(now_ns),
            counters,
        })
    }

    /// The table form: one line of devices and flows, one of counters that are not zero.
    pub fn table(&self) -> String {
        let devices = match self.attach {
            _ if self.devices.is_empty() => "no device".to_owned(),
            Some(tc::Attached::Netlink) => format!("{} (netlink filters)", self.devices.join(",")),
            _ => self.devices.join(","),
        };
        let xdp = if self.xdp.is_empty() {
            String::new()
        } else {
            let on: Vec<String> = self.xdp.iter().map(|(d, m)| format!("{d} ({})", m.name())).collect();
            format!(", XDP on {}", on.join(","))
        };
        let c = &self.conntrack;
        let mut out = format!(
            "  from outside the node: tc on {devices}{xdp}; {} flows tracked ({} with SNAT), {} conntrack entries\n",
            c.flows, c.snat_flows, c.entries
        );
        let tables: Vec<String> = lb_common::CT_TABLES
            .iter()
            .zip(&c.tables)
            .map(|(name, t)| {
                format!("{name} {}/{} ({} flows, {} evicted)", t.entries, t.capacity, t.flows, t.evicted)
            })
            .collect();
        let _ = writeln!(out, "  conntrack tables: {}", tables.join(", "));
        let nonzero: Vec<String> =
            self.counters.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {v}")).collect();
        if !nonzero.is_empty() {
            let _ = writeln!(out, "  packets from outside: {}", nonzero.join(", "));
        }
        out
    }
}
