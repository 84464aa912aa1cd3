//! Prometheus metrics, encoded on each scrape from the data path's own counters (per-CPU, summed) and the
//! agent's sync statistics.
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use lb_common::{
    COUNTER_CLUSTER, COUNTER_DROPPED, COUNTER_FAIL_OPEN, COUNTER_NODE, COUNTER_REJECTED, COUNTER_ZONE,
    GLOBAL_SVC_ID,
};

use crate::datapath::{MapWriter, Reconciler, addr};

type Labels = Vec<(String, String)>;

/// Statistics the agent keeps between scrapes.
pub struct AgentStats {
    /// Seconds each sync took (reload, plan, apply).
    pub sync_duration: Histogram,
    /// Syncs done.
    pub syncs: Counter,
    /// Frontends that could not be written (map full, ...), summed over syncs.
    pub apply_errors: Counter,
    /// Manifest documents with errors, summed over reloads.
    pub reload_errors: Counter,
    /// Service health listeners that could not be bound.
    pub health_port_errors: Counter,
}

impl Default for AgentStats {
    fn default() -> Self {
        Self {
            sync_duration: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            syncs: Counter::default(),
            apply_errors: Counter::default(),
            reload_errors: Counter::default(),
            health_port_errors: Counter::default(),
        }
    }
}

fn counter_family(reg: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let f = Family::<Labels, Counter>::default();
    reg.register(name, help, f.clone());
    f
}

/// An entry count as a gauge's value; map capacities are u32, so it always fits.
fn gauge(entries: usize) -> i64 {
    i64::try_from(entries).unwrap_or(i64::MAX)
}

/// The whole exposition, OpenMetrics text.
pub fn encode_text<W: MapWriter>(rec: &Reconciler<W>, stats: &AgentStats, slot_capacity: u32) -> String {
    let mut reg = Registry::with_prefix("tierlb");
    let conns = counter_family(&mut reg, "connections", "Connects translated, by Service, frontend and tier");
    let refused =
        counter_family(&mut reg, "connections_refused", "Connects failed fast because no backend was usable");
    let fail_open = Counter::<u64>::default();
    reg.register("fail_open", "Connects let through untranslated after an internal error", fail_open.clone());
    let w = rec.writer();
    let mut slots_used = 0usize;
    let mut frontends = 0usize;
    for (key, value, desired) in rec.applied() {
        frontends += 1;
        slots_used += desired.tiers.iter().map(Vec::len).sum::<usize>();
        let Ok(c) = w.counters(value.svc_id) else { continue };
        let base: Labels = vec![
            ("service".into(), desired.name.service.to_string()),
            ("port".into(), desired.name.port.clone()),
            ("frontend".into(), addr::frontend_addr(key).to_string()),
        ];
        for (tier, kind) in [("node", COUNTER_NODE), ("zone", COUNTER_ZONE), ("cluster", COUNTER_CLUSTER)] {
            let mut l = base.clone();
            l.push(("tier".into(), tier.into()));
            conns.get_or_create(&l).inc_by(c[kind as usize]);
        }
        for (why, kind) in [("no_endpoints", COUNTER_REJECTED), ("no_local_endpoint", COUNTER_DROPPED)] {
            let mut l = base.clone();
            l.push(("reason".into(), why.into()));
            refused.get_or_create(&l).inc_by(c[kind as usize]);
        }
    }
    if let Ok(c) = w.counters(GLOBAL_SVC_ID) {
        fail_open.inc_by(c[COUNTER_FAIL_OPEN as usize]);
    }
    let entries = Family::<Labels, Gauge>::default();
    reg.register("map_entries", "Entries in use per map", entries.clone());
    entries.get_or_create(&vec![("map".into(), lb_common::MAP_FRONTENDS.into())]).set(gauge(frontends));
    entries.get_or_create(&vec![("map".into(), lb_common::MAP_SLOTS.into())]).set(gauge(slots_used));
    let capacity = Family::<Labels, Gauge>::default();
    reg.register("map_capacity", "Capacity per map", capacity.clone());
    capacity
        .get_or_create(&vec![("map".into(), lb_common::MAP_FRONTENDS.into())])
        .set(i64::from(w.max_services()));
    capacity.get_or_create(&vec![("map".into(), lb_common::MAP_SLOTS.into())]).set(i64::from(slot_capacity));
    reg.register(
        "sync_duration_seconds",
        "Time to reload the source, plan and apply",
        stats.sync_duration.clone(),
    );
    reg.register("syncs", "Syncs done", stats.syncs.clone());
    reg.register("apply_errors", "Frontends that could not be written", stats.apply_errors.clone());
    reg.register("reload_errors", "Manifest documents that could not be read", stats.reload_errors.clone());
    reg.register(
        "health_port_errors",
        "healthCheckNodePort listeners that could not be bound",
        stats.health_port_errors.clone(),
    );
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}
