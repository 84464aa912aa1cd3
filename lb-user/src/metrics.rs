//! Prometheus metrics: per Service and tier connection counters, map occupancy and the agent's sync
//! statistics.
//!
//! A scrape never waits for the agent loop, and the loop does no work per scrape. After each sync that
//! changed the maps the loop publishes a `Snapshot` (what it applied: frontends, names, service ids, slot
//! counts); a scrape encodes the latest one, reading the data path's per-CPU counters itself through a
//! handle of its own (`ReadCounters`, on the kernel `KernelCounters`), and the statistics through
//! `AgentStats`, whose metrics are shared atomics the loop counts into.
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use lb_common::{
    COUNTER_CLUSTER, COUNTER_DROPPED, COUNTER_FAIL_OPEN, COUNTER_NODE, COUNTER_REJECTED, COUNTER_ZONE,
    COUNTERS_PER_SERVICE, FrontendKey, GLOBAL_SVC_ID,
};

use crate::{
    datapath::{MapWriter, Reconciler, addr},
    model::ServicePortName,
};

mod kube_proxy;
mod topology;
pub use kube_proxy::KubeProxyStats;
pub use topology::ServiceTopology;

type Labels = Vec<(String, String)>;

/// The counters of one service id, summed over CPUs, indexed by `COUNTER_*`.
pub type Counts = [u64; COUNTERS_PER_SERVICE as usize];

/// Reads the data path's counters for a scrape, on the scrape's thread.
pub trait ReadCounters: Send + Sync {
    /// The counters of `svc_id`; `None` if they cannot be read (the frontend is left out of the scrape).
    fn counters(&self, svc_id: u32) -> Option<Counts>;
    /// The tc programs' counters by `NS_*` kind (traffic from outside the node); `None`: not available.
    fn ns_counters(&self) -> Option<[u64; lb_common::NS_COUNTER_KINDS as usize]> {
        None
    }
}

/// One applied frontend, as a scrape labels it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendEntry {
    /// The frontend (VIP, port, protocol).
    pub key: FrontendKey,
    /// The Service port it serves.
    pub name: std::sync::Arc<ServicePortName>,
    /// Its service id: where its counters are.
    pub svc_id: u32,
    /// It has sessionAffinity ClientIP (its affinity counter is exported).
    pub affinity: bool,
}

/// What a scrape needs from the reconciler, copied by the agent loop after a sync and never changed after.
///
/// Only the labels come from here; the counts are read at scrape time. A service id is reused only after the
/// reconciler's grace period, long after the snapshot without its old frontend is out, so only a scrape still
/// reading from an older snapshot then could count a reused id under the Service that left: Prometheus sees
/// a counter reset of a series that is about to end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every applied frontend, in key order.
    pub frontends: Vec<FrontendEntry>,
    /// Entries of the slot map the applied frontends use (`SLOT_BLOCK` slots each; the generations waiting
    /// for their grace period are not counted).
    pub slots_used: usize,
    /// Capacity of the frontends map.
    pub frontend_capacity: u32,
    /// Capacity of the slot map, in entries.
    pub slot_capacity: u32,
    /// Every planned Service port and family's topology, in Service order (the agent's `topology_rows`).
    pub topology: std::sync::Arc<Vec<ServiceTopology>>,
}

impl Snapshot {
    /// What `rec` has applied now. One clone per frontend: the loop takes it only after a sync that changed
    /// the maps, never per scrape.
    pub fn of<W: MapWriter>(rec: &Reconciler<W>, slot_capacity: u32) -> Self {
        let mut slots_used = 0;
        let frontends = rec
            .applied()
            .map(|(key, value, desired)| {
                slots_used += lb_common::slot_blocks(desired.slots.len());
                FrontendEntry {
                    key: *key,
                    name: desired.name.clone(),
                    svc_id: value.svc_id,
                    affinity: value.affinity_timeout_s != 0,
                }
            })
            .collect();
        Self {
            frontends,
            slots_used,
            frontend_capacity: rec.writer().max_services(),
            slot_capacity,
            topology: std::sync::Arc::default(),
        }
    }

    /// With `topology` as the per-Service-port topology rows.
    #[must_use]
    pub fn with_topology(mut self, topology: std::sync::Arc<Vec<ServiceTopology>>) -> Self {
        self.topology = topology;
        self
    }
}

/// Statistics the agent keeps between scrapes. Clones share the same metrics (prometheus-client's metrics
/// are atomics behind an `Arc`): the loop counts into one, the metrics server encodes another.
#[derive(Clone)]
pub struct AgentStats {
    /// Seconds each sync took (reload, plan, apply), and each retry of Services that failed (plan, apply).
    pub sync_duration: Histogram,
    /// Syncs done, and retries.
    pub syncs: Counter,
    /// Frontends that could not be written (map full, ...), summed over syncs.
    pub apply_errors: Counter,
    /// Manifest documents with errors, summed over reloads.
    pub reload_errors: Counter,
    /// Service health listeners that could not be bound.
    pub health_port_errors: Counter,
    /// Connected UDP sockets ended because their backend left their Service (or was marked down).
    pub udp_sockets_destroyed: Counter,
    /// Connected UDP sockets (from the data path's registry) the agent could not reach: their network
    /// namespace was not found (the pod is gone, or its namespace is not visible to the agent).
    pub udp_sockets_unreached: Counter,
    /// Services with at least one frontend not programmed as planned: it failed to apply (it keeps its previous
    /// state, none if new, and waits for a retry), or another Service holds its VIP:port.
    pub services_unprogrammed: Gauge,
    /// Backend marks the agent deleted because their backend left every Service.
    pub marks_cleared: Counter,
    /// The conntrack tables of traffic from outside the node, by table (`lb_common::CT_TABLES`): entries
    /// (dead ones the LRU has not reclaimed included), live flows, capacity. Read by the agent loop every
    /// `CONNTRACK_EVERY` (a walk of the tables), not per scrape.
    pub conntrack_entries: Family<Labels, Gauge>,
    /// Live flows (forward entries) of each conntrack table.
    pub conntrack_flows: Family<Labels, Gauge>,
    /// Each conntrack table's capacity in entries.
    pub conntrack_capacity: Family<Labels, Gauge>,
    /// Entries each conntrack table's LRU reclaimed to make room (`lb_common::ct_evictions`).
    pub conntrack_evictions: Family<Labels, Counter>,
    /// The NodePort devices `xdp_ingress` is attached to, by device and mode (`native`, `generic`): 1 each.
    pub xdp_attached: Family<Labels, Gauge>,
    /// kube-proxy's metric families, for its dashboards and alerts.
    pub kube_proxy: KubeProxyStats,
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
            udp_sockets_destroyed: Counter::default(),
            udp_sockets_unreached: Counter::default(),
            services_unprogrammed: Gauge::default(),
            marks_cleared: Counter::default(),
            conntrack_entries: Family::default(),
            conntrack_flows: Family::default(),
            conntrack_capacity: Family::default(),
            conntrack_evictions: Family::default(),
            xdp_attached: Family::default(),
            kube_proxy: KubeProxyStats::default(),
        }
    }
}

fn counter_family(reg: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let f = Family::<Labels, Counter>::default();
    reg.register(name, help, f.clone());
    f
}

/// Passive health's program-wide counters (`lb_common::GLOBAL_HEALTH_*`), from the global counters `c`.
fn register_health(reg: &mut Registry, c: &Counts) {
    let transitions = counter_family(
        reg,
        "backend_health_transitions",
        "Passive health: backends held down after failed connects (to=held), held down for the one client \
         whose connects failed (to=held_for_one_client) and made healthy again by a successful connect \
         (to=healthy), decided in the kernel",
    );
    for (to, kind) in [
        ("held", lb_common::GLOBAL_HEALTH_HOLDS),
        ("held_for_one_client", lb_common::GLOBAL_HEALTH_CLIENT_HOLDS),
        ("healthy", lb_common::GLOBAL_HEALTH_RECOVERIES),
    ] {
        transitions.get_or_create(&vec![("to".into(), to.into())]).inc_by(c[kind as usize]);
    }
    let panics = Counter::<u64>::default();
    reg.register(
        "backend_health_panics",
        "Connects sent to a backend passive health holds down, because every backend of the tier was held",
        panics.clone(),
    );
    panics.inc_by(c[lb_common::GLOBAL_HEALTH_PANICS as usize]);
}

fn register_trace(reg: &mut Registry, c: &Counts) {
    let lost = Counter::<u64>::default();
    reg.register(
        "trace_events_lost",
        "Trace events the data path could not queue, the ring buffer full (`tierlb trace` fell behind or was \
         stopped)",
        lost.clone(),
    );
    lost.inc_by(c[lb_common::GLOBAL_TRACE_LOST as usize]);
}

/// A count as a gauge's value (counts of map entries, Services, ports: far below `i64::MAX`).
/// One frontend's counters `c` under `base`: per tier into `by_tier`, refusals by reason into `refused`.
fn tier_rows(
    by_tier: &Family<Labels, Counter>,
    refused: &Family<Labels, Counter>,
    base: &Labels,
    c: &Counts,
) {
    for (tier, kind) in [("node", COUNTER_NODE), ("zone", COUNTER_ZONE), ("cluster", COUNTER_CLUSTER)] {
        let mut l = base.clone();
        l.push(("tier".into(), tier.into()));
        by_tier.get_or_create(&l).inc_by(c[kind as usize]);
    }
    for (why, kind) in [("no_endpoints", COUNTER_REJECTED), ("no_local_endpoint", COUNTER_DROPPED)] {
        let mut l = base.clone();
        l.push(("reason".into(), why.into()));
        refused.get_or_create(&l).inc_by(c[kind as usize]);
    }
}

/// The families of the outside-scope frontends: new flows by tier, and flows dropped by reason.
fn external_families(reg: &mut Registry) -> (Family<Labels, Counter>, Family<Labels, Counter>) {
    let flows = counter_family(
        reg,
        "external_flows",
        "New flows from outside the node translated, by Service, frontend and tier (the tc programs)",
    );
    let dropped = counter_family(
        reg,
        "external_flows_dropped",
        "New flows from outside the node dropped because no backend was usable, by Service and frontend",
    );
    (flows, dropped)
}

/// The tc programs' counters by result (`lb_common::NS_COUNTER_NAMES`).
fn register_external_packets(reg: &mut Registry, ns: &[u64]) {
    let packets = counter_family(
        reg,
        "external_packets",
        "Packets from outside the node (and their replies) seen by the tc programs, by what became of them",
    );
    // The conntrack tables' insert and delete tallies are not packets: they give `conntrack_evictions`.
    let tallies = lb_common::NS_CT_INSERTED..=lb_common::NS_CT_REMOVED_BY_AGENT;
    for ((kind, name), n) in (0u32..).zip(lb_common::NS_COUNTER_NAMES).zip(ns) {
        if !tallies.contains(&kind) {
            packets.get_or_create(&vec![("result".into(), name.into())]).inc_by(*n);
        }
    }
}

/// The conntrack tables' occupancy (`AgentStats::conntrack_*`).
fn register_conntrack(reg: &mut Registry, stats: &AgentStats) {
    reg.register(
        "conntrack_entries",
        "Entries of the conntrack tables of traffic from outside the node, by table (two per flow; expired ones \
         the LRU has not reclaimed included)",
        stats.conntrack_entries.clone(),
    );
    reg.register(
        "conntrack_flows",
        "Live flows in the conntrack tables of traffic from outside the node, by table",
        stats.conntrack_flows.clone(),
    );
    reg.register(
        "conntrack_capacity",
        "Capacity of the conntrack tables of traffic from outside the node (entries), by table; a table at its \
         capacity evicts its least recently used flow for each new one",
        stats.conntrack_capacity.clone(),
    );
    reg.register(
        "conntrack_evictions",
        "Entries the conntrack tables of traffic from outside the node reclaimed to make room for new ones, by \
         table (live flows and expired entries alike; the keys written less those deleted and those held)",
        stats.conntrack_evictions.clone(),
    );
    reg.register(
        "xdp_attached",
        "The NodePort devices xdp_ingress is attached to (1 each), by device and mode (native: in the driver; \
         generic: in the stack's receive path); a device without XDP has its traffic from outside translated by tc",
        stats.xdp_attached.clone(),
    );
}

pub(crate) fn gauge(entries: usize) -> i64 {
    i64::try_from(entries).unwrap_or(i64::MAX)
}

/// The whole exposition, OpenMetrics text: the labels from `snap`, the counts from `counters` (`None`: no
/// per-Service counters), the statistics from `stats`; the `tierlb_*` families, then kube-proxy's
/// (`kubeproxy_*`).
pub fn encode_text(snap: &Snapshot, stats: &AgentStats, counters: Option<&dyn ReadCounters>) -> String {
    let mut root = Registry::default();
    let reg = root.sub_registry_with_prefix("tierlb");
    let conns = counter_family(reg, "connections", "Connects translated, by Service, frontend and tier");
    let refused =
        counter_family(reg, "connections_refused", "Connects failed fast because no backend was usable");
    let sticky = counter_family(
        reg,
        "connections_affinity",
        "Connects that went to the client's sessionAffinity backend (also counted by tier), by frontend",
    );
    let (external, external_dropped) = external_families(reg);
    let fail_open = Counter::<u64>::default();
    reg.register("fail_open", "Connects let through untranslated after an internal error", fail_open.clone());
    let unrecorded = Counter::<u64>::default();
    reg.register(
        "reverse_unrecorded",
        "Reverse state not recorded: entries a closing socket cannot take with it (a socket sending to over 8 \
         backends, socket storage full), left to the reverse LRU's eviction, and connected UDP sockets not \
         registered for destruction (the registry full, or their network namespace's share of it taken)",
        unrecorded.clone(),
    );
    for f in &snap.frontends {
        let Some(c) = counters.and_then(|r| r.counters(f.svc_id)) else { continue };
        let base: Labels = vec![
            ("service".into(), f.name.service.to_string()),
            ("port".into(), f.name.port.clone()),
            ("frontend".into(), addr::frontend_addr(&f.key).to_string()),
        ];
        // Outside-scope frontends (the tc programs') count flows, not connects: families of their own.
        if f.key.is_outside() {
            tier_rows(&external, &external_dropped, &base, &c);
            continue;
        }
        tier_rows(&conns, &refused, &base, &c);
        if f.affinity {
            sticky.get_or_create(&base).inc_by(c[lb_common::COUNTER_AFFINITY as usize]);
        }
    }
    if let Some(c) = counters.and_then(|r| r.counters(GLOBAL_SVC_ID)) {
        fail_open.inc_by(c[COUNTER_FAIL_OPEN as usize]);
        unrecorded.inc_by(c[lb_common::COUNTER_REVERSE_UNRECORDED as usize]);
        register_health(reg, &c);
        register_trace(reg, &c);
    }
    if let Some(ns) = counters.and_then(ReadCounters::ns_counters) {
        register_external_packets(reg, &ns);
    }
    topology::register(reg, &snap.topology);
    let entries = Family::<Labels, Gauge>::default();
    reg.register("map_entries", "Entries in use per map", entries.clone());
    entries
        .get_or_create(&vec![("map".into(), lb_common::MAP_FRONTENDS.into())])
        .set(gauge(snap.frontends.len()));
    entries.get_or_create(&vec![("map".into(), lb_common::MAP_SLOTS.into())]).set(gauge(snap.slots_used));
    let capacity = Family::<Labels, Gauge>::default();
    reg.register("map_capacity", "Capacity per map", capacity.clone());
    capacity
        .get_or_create(&vec![("map".into(), lb_common::MAP_FRONTENDS.into())])
        .set(i64::from(snap.frontend_capacity));
    capacity
        .get_or_create(&vec![("map".into(), lb_common::MAP_SLOTS.into())])
        .set(i64::from(snap.slot_capacity));
    reg.register(
        "sync_duration_seconds",
        "Time to reload the source, plan and apply (and to plan and apply a retry of failed Services)",
        stats.sync_duration.clone(),
    );
    reg.register("syncs", "Syncs done, retries of failed Services included", stats.syncs.clone());
    reg.register("apply_errors", "Frontends that could not be written", stats.apply_errors.clone());
    reg.register("reload_errors", "Manifest documents that could not be read", stats.reload_errors.clone());
    reg.register(
        "health_port_errors",
        "healthCheckNodePort listeners that could not be bound",
        stats.health_port_errors.clone(),
    );
    reg.register(
        "udp_sockets_destroyed",
        "Connected UDP sockets ended because their backend left their Service",
        stats.udp_sockets_destroyed.clone(),
    );
    reg.register(
        "udp_sockets_unreached",
        "Connected UDP sockets to a departed backend not ended: their network namespace was not found",
        stats.udp_sockets_unreached.clone(),
    );
    register_conntrack(reg, stats);
    reg.register(
        "services_unprogrammed",
        "Services with a frontend not programmed as planned (failed to apply: previous state kept, none if new; \
         or VIP:port held by another Service); /healthz names them",
        stats.services_unprogrammed.clone(),
    );
    reg.register(
        "backend_marks_cleared",
        "Backend marks deleted because their backend left every Service",
        stats.marks_cleared.clone(),
    );
    stats.kube_proxy.register(root.sub_registry_with_prefix("kubeproxy"));
    let mut out = String::new();
    encode(&mut out, &root).expect("writing to a String cannot fail");
    out
}

/// The data path's counter map (`lb_common::MAP_COUNTERS`) through a file descriptor of the scrape's own.
///
/// Why a second descriptor: a scrape must read the per-CPU counters without asking the agent loop (which owns
/// `KernelMaps` inside its reconciler) and without a lock the loop would wait on: it reads through a
/// descriptor of its own (`KernelMaps::counters_reader`).
#[cfg(target_os = "linux")]
pub struct KernelCounters(
    pub aya::maps::PerCpuArray<aya::maps::MapData, lb_common::ServiceCounters>,
    /// The tc programs' counters (`MAP_NS_COUNTERS`), if their map could be opened.
    pub Option<aya::maps::PerCpuArray<aya::maps::MapData, u64>>,
);

#[cfg(target_os = "linux")]
impl ReadCounters for KernelCounters {
    fn counters(&self, svc_id: u32) -> Option<Counts> {
        let values = self.0.get(&svc_id, 0).ok()?;
        Some(crate::datapath::ebpf::sum_per_cpu(values.iter()))
    }

    fn ns_counters(&self) -> Option<[u64; lb_common::NS_COUNTER_KINDS as usize]> {
        self.1.as_ref().map(crate::datapath::tc::sum_ns_counters)
    }
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Instant};

    use super::*;
    use crate::{
        datapath::{Desired, DesiredFrontend, fake::FakeMaps},
        model::ObjKey,
    };

    /// Every counter of a service id holds the id itself; `unreadable`'s cannot be read.
    struct IdAsCount {
        unreadable: u32,
    }

    impl ReadCounters for IdAsCount {
        fn counters(&self, svc_id: u32) -> Option<Counts> {
            (svc_id != self.unreadable).then_some([u64::from(svc_id); COUNTERS_PER_SERVICE as usize])
        }
    }

    /// The program-wide counters hold their kind's index (fail-open 5, unrecorded reverse entries 6, ...).
    struct GlobalKinds;

    impl ReadCounters for GlobalKinds {
        fn counters(&self, svc_id: u32) -> Option<Counts> {
            (svc_id == GLOBAL_SVC_ID).then(|| std::array::from_fn(|k| k as u64))
        }
    }

    #[test]
    fn the_program_wide_counters_are_exported_each_under_its_own_name() {
        let rec = Reconciler::new(FakeMaps::new(16, 64));
        let text = encode_text(&Snapshot::of(&rec, 64), &AgentStats::default(), Some(&GlobalKinds));
        assert!(text.contains("tierlb_fail_open_total 5"), "{text}");
        assert!(text.contains("tierlb_reverse_unrecorded_total 6"), "{text}");
        assert!(text.contains("tierlb_trace_events_lost_total 4"), "{text}");
        assert!(text.contains("tierlb_backend_health_transitions_total{to=\"held\"} 1"), "{text}");
        assert!(text.contains("tierlb_backend_health_transitions_total{to=\"healthy\"} 2"), "{text}");
        assert!(text.contains("tierlb_backend_health_panics_total 3"), "{text}");
    }

    #[test]
    fn the_snapshot_holds_what_was_applied_and_the_counts_come_at_scrape_time() {
        let b = |i| addr::backend(SocketAddr::from(([10, 244, 1, i], 8080)), 6);
        let mut desired = Desired::new();
        // 1 + 9 slots (two entries of the slot map) and 1 slot (one).
        let tiers = [[vec![b(1)], vec![], (1..=9).map(b).collect()], [vec![], vec![], vec![b(10)]]];
        for (i, tiers) in (0u8..).zip(tiers) {
            let name = ServicePortName::new(ObjKey::new("default", format!("s{i}")), "http");
            let key = addr::frontend_key([10, 96, 0, 10 + i].into(), 80, 6);
            desired
                .insert(key, DesiredFrontend { name: name.into(), tiers, flags: 0, affinity_timeout_s: 0 });
        }
        let mut rec = Reconciler::new(FakeMaps::new(16, 64));
        rec.apply(&desired, Instant::now());
        let snap = Snapshot::of(&rec, 64);
        assert_eq!((snap.frontends.len(), snap.slots_used), (2, 3), "slot entries, not slots");
        assert_eq!((snap.frontend_capacity, snap.slot_capacity), (16, 64));
        let ids: Vec<u32> = snap.frontends.iter().map(|f| f.svc_id).collect();
        assert_eq!(ids, rec.applied().map(|(_, v, _)| v.svc_id).collect::<Vec<_>>());
        let text = encode_text(&snap, &AgentStats::default(), Some(&IdAsCount { unreadable: ids[1] }));
        let labels = r#"service="default/s0",port="http",frontend="10.96.0.10:80",tier="zone""#;
        let s0_zone = format!("tierlb_connections_total{{{labels}}} {}", ids[0]);
        assert!(text.contains(&s0_zone), "{text}");
        assert!(
            !text.contains("default/s1"),
            "a frontend whose counters cannot be read is left out:\n{text}"
        );
        assert!(text.contains(r#"tierlb_map_entries{map="SLOTS"} 3"#), "{text}");
        let without = encode_text(&snap, &AgentStats::default(), None);
        assert!(!without.contains("tierlb_connections_total{"), "{without}");
        assert!(without.contains(r#"tierlb_map_entries{map="FRONTENDS"} 2"#), "{without}");
        let stats = AgentStats::default();
        stats.services_unprogrammed.set(3);
        let text = encode_text(&snap, &stats, None);
        assert!(text.contains("# TYPE tierlb_services_unprogrammed gauge"), "{text}");
        assert!(text.contains("\ntierlb_services_unprogrammed 3\n"), "{text}");
    }
}
