//! The trace switch of one agent instance: `TRACE_CONTROL` (off, all, selected) and the selected service ids
//! (`TRACE_SERVICES`), set by `tierlb trace` and cleared when it ends, on every path (`Drop`).
use std::{collections::BTreeSet, path::Path};

use aya::maps::{Array, HashMap, Map, MapData};
use lb_common::{
    MAP_TRACE_CONTROL, MAP_TRACE_SERVICES, TRACE_LEASE_NS, TRACE_MAX_SERVICES, TRACE_OFF, TraceControl,
};

use super::TraceError;

/// An instance's switch, held by this process; turned off when dropped.
pub struct Switch {
    control: Array<MapData, TraceControl>,
    services: HashMap<MapData, u32, u32>,
    selected: BTreeSet<u32>,
    pid: u32,
}

pub(super) fn open(dir: &Path, name: &'static str) -> Result<Map, TraceError> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(TraceError::NoTraceMaps { dir: dir.to_owned() });
    }
    MapData::from_pin(&path)
        .map(Map::from_map_data)
        .map_err(|e| TraceError::map(name, e))?
        .map_err(|e| TraceError::map(name, e))
}

impl Switch {
    /// Take the switch of the instance pinned in `dir`: refused while another live `tierlb trace` holds it
    /// (two consumers of one ring buffer would each get part of the events); a switch left on by a trace
    /// that was killed is taken over. Tracing starts with `start`.
    pub fn take(dir: &Path) -> Result<Self, TraceError> {
        let control: Array<MapData, TraceControl> = Array::try_from(open(dir, MAP_TRACE_CONTROL)?)
            .map_err(|e| TraceError::map(MAP_TRACE_CONTROL, e))?;
        let services = HashMap::try_from(open(dir, MAP_TRACE_SERVICES)?)
            .map_err(|e| TraceError::map(MAP_TRACE_SERVICES, e))?;
        let pid = std::process::id();
        let now = control.get(&0, 0).map_err(|e| TraceError::map(MAP_TRACE_CONTROL, e))?;
        if now.mode != TRACE_OFF && now.owner_pid != pid && is_trace(now.owner_pid) {
            return Err(TraceError::Busy { dir: dir.to_owned(), pid: now.owner_pid });
        }
        let mut switch = Self { control, services, selected: BTreeSet::new(), pid };
        // What a killed trace selected goes; nothing is traced until `start`.
        switch.set(TRACE_OFF)?;
        let stale: Vec<u32> = switch.services.keys().filter_map(Result::ok).collect();
        for id in stale {
            let _ = switch.services.remove(&id);
        }
        Ok(switch)
    }

    /// Trace the service ids `ids` only (with `start(TRACE_SELECTED)`): the map is brought to `ids`, entries
    /// added before stale ones go, so a frontend traced before and after never drops out. Beyond
    /// `TRACE_MAX_SERVICES` ids the rest are left out (returned: how many).
    pub fn select(&mut self, ids: &BTreeSet<u32>) -> Result<usize, TraceError> {
        let keep: BTreeSet<u32> = ids.iter().copied().take(TRACE_MAX_SERVICES as usize).collect();
        for id in keep.difference(&self.selected) {
            self.services.insert(id, 1, 0).map_err(|e| TraceError::map(MAP_TRACE_SERVICES, e))?;
        }
        for id in self.selected.difference(&keep) {
            let _ = self.services.remove(id);
        }
        self.selected = keep;
        Ok(ids.len() - self.selected.len())
    }

    /// Turn tracing on (`TRACE_ALL` or `TRACE_SELECTED`), for `TRACE_LEASE_NS` unless renewed.
    pub fn start(&mut self, mode: u32) -> Result<(), TraceError> {
        self.set(mode)
    }

    /// Renew the lease (every second while the trace runs), unless another trace took the switch over.
    pub fn renew(&mut self) -> Result<(), TraceError> {
        let now = self.control.get(&0, 0).map_err(|e| TraceError::map(MAP_TRACE_CONTROL, e))?;
        if now.mode == TRACE_OFF || now.owner_pid != self.pid {
            return Ok(());
        }
        self.set(now.mode)
    }

    fn set(&mut self, mode: u32) -> Result<(), TraceError> {
        let (owner_pid, lease_until_ns) = if mode == TRACE_OFF {
            (0, 0)
        } else {
            (self.pid, crate::datapath::marks::boottime_ns() + TRACE_LEASE_NS)
        };
        self.control
            .set(0, TraceControl { mode, owner_pid, lease_until_ns }, 0)
            .map_err(|e| TraceError::map(MAP_TRACE_CONTROL, e))
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        // Off first, so the programs stop reading the selection before it goes; only if still ours (a trace
        // that took over a switch this process had left on must keep it).
        if self.control.get(&0, 0).is_ok_and(|c| c.owner_pid == self.pid) {
            let _ = self.set(TRACE_OFF);
        }
        for id in std::mem::take(&mut self.selected) {
            let _ = self.services.remove(&id);
        }
    }
}

/// Whether `pid` is a live `tierlb` process (a pid reused by another program does not hold the switch).
fn is_trace(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "tierlb")
        && !is_zombie(pid)
}

/// A process that has exited and not been reaped yet (state `Z` in `/proc/PID/stat`, after the command
/// name, which may hold spaces and parentheses): it traces nothing any more.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
