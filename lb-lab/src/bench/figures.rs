//! What a run measured, as data: the rows of the data-path comparison and the typed control-plane figures.
//! `run` fills them in; `report` and `charts` are the only places they become text.
use std::time::Duration;

use serde::Serialize;

use super::load::{LoadMode, LoadResult};

/// A data path a connect goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPath {
    /// Straight to the pod IP: the floor, no load balancing.
    Direct,
    /// To a VIP that tierlb's connect4 program rewrites.
    Tierlb,
    /// To a VIP that kube-proxy-style iptables rules DNAT.
    Iptables,
    /// To a VIP that kube-proxy-style nftables rules DNAT.
    Nftables,
    /// To a VIP that real kube-proxy (v1.36.3, iptables mode) programmed from the API server.
    KubeProxyIptables,
    /// To a VIP that real kube-proxy (v1.36.3, nftables mode) programmed from the API server.
    KubeProxyNftables,
    /// To a node port that tierlb's `xdp_ingress` translates before tc (`--xdp=native`; the XDP rows).
    TierlbXdp,
    /// To a node port whose remote backend tierlb reaches with direct server return (`--dsr`; the XDP rows).
    TierlbDsr,
    /// The same with `xdp_ingress` in front (`--xdp=native --dsr`).
    TierlbXdpDsr,
}

impl DataPath {
    /// The data paths of the main tables and charts, in their order (real kube-proxy's rows are a table of
    /// their own, `KUBE_PROXY`).
    pub const ALL: [Self; 4] = [Self::Direct, Self::Tierlb, Self::Iptables, Self::Nftables];
    /// Real kube-proxy's paths.
    pub const KUBE_PROXY: [Self; 2] = [Self::KubeProxyIptables, Self::KubeProxyNftables];

    /// The path's name in the tables, the charts and the run's progress lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Tierlb => "tierlb",
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::KubeProxyIptables => "kube-proxy iptables",
            Self::KubeProxyNftables => "kube-proxy nftables",
            Self::TierlbXdp => "tierlb xdp",
            Self::TierlbDsr => "tierlb dsr",
            Self::TierlbXdpDsr => "tierlb xdp dsr",
        }
    }
}

/// A ratio taken per interleaved round (or pair of slices): the median of the rounds, their quartiles and
/// their least and greatest.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ratio {
    /// The median of the rounds' ratios.
    pub median: f64,
    /// The first quartile: a quarter of the rounds are below it.
    pub q1: f64,
    /// The third quartile: a quarter of the rounds are above it.
    pub q3: f64,
    /// The least.
    pub min: f64,
    /// The greatest.
    pub max: f64,
}

impl Ratio {
    /// Of the rounds' ratios `xs`; a ratio that is not a number (a round that measured nothing, a figure an
    /// older client did not report) is left out.
    pub fn of(xs: &[f64]) -> Self {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        // The value at `num / den` of the way from the least to the greatest, by nearest rank; NaN for none.
        let rank = |num: usize, den: usize| {
            v.get((v.len().saturating_sub(1) * num + den / 2) / den).copied().unwrap_or(f64::NAN)
        };
        Self { median: median(&v), q1: rank(1, 4), q3: rank(3, 4), min: rank(0, 1), max: rank(1, 1) }
    }
}

/// The median of `xs` (NaN for none).
pub(super) fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

/// One north-south row: a path at a Service count under one load mode, over interleaved rounds.
#[derive(Clone, Debug, Serialize)]
pub struct NsRow {
    /// The path (from outside the node: `Tierlb` is its tc node port, the rule sets their node ports).
    pub path: DataPath,
    /// Services programmed (each path's own set; direct's figure is the same run's).
    pub services: usize,
    /// What one operation was.
    pub mode: LoadMode,
    /// Rounds.
    pub rounds: usize,
    /// Median over the rounds of the p50 latency, microseconds.
    pub p50_us: f64,
    /// Median over the rounds of the p99 latency, microseconds.
    pub p99_us: f64,
    /// Median over the rounds of the throughput, operations per second.
    pub per_sec: f64,
    /// p50 / direct's p50 of the same round.
    pub p50_ratio: Ratio,
    /// Throughput / direct's throughput of the same round.
    pub per_sec_ratio: Ratio,
    /// First quartile / direct's of the same round (see `LoadResult::p25_us`).
    pub p25_ratio: Ratio,
    /// tierlb's tc programs' run time per packet (ingress and egress together), tierlb rows only.
    pub tc_ns_per_packet: Option<f64>,
    /// Failed operations over the rounds.
    pub errors: u64,
}

impl NsRow {
    /// The row of `path` from its rounds' results `runs` and direct's of the same rounds.
    pub fn of(
        path: DataPath,
        services: usize,
        mode: LoadMode,
        runs: &[LoadResult],
        direct: &[LoadResult],
        tc_ns_per_packet: Option<f64>,
    ) -> Self {
        let of = |f: fn(&LoadResult) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let ratio = |f: fn(&LoadResult) -> f64| {
            Ratio::of(&runs.iter().zip(direct).map(|(r, d)| f(r) / f(d)).collect::<Vec<_>>())
        };
        Self {
            path,
            services,
            mode,
            rounds: runs.len(),
            p50_us: of(|r| r.p50_us),
            p99_us: of(|r| r.p99_us),
            per_sec: of(|r| r.per_sec),
            p50_ratio: ratio(|r| r.p50_us),
            per_sec_ratio: ratio(|r| r.per_sec),
            p25_ratio: ratio(|r| r.p25_us),
            tc_ns_per_packet,
            errors: runs.iter().map(|r| r.errors).sum(),
        }
    }
}

/// One measured row: a data path at a Service count under one load mode.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The data path.
    pub path: DataPath,
    /// Services programmed (0 for direct).
    pub services: usize,
    /// What one operation was.
    pub mode: LoadMode,
    /// What the load client measured.
    pub result: LoadResult,
    /// BPF run time per connect4 call (kernel.bpf_stats_enabled), tierlb rows only.
    pub bpf_ns_per_run: Option<f64>,
    /// BPF run time per sock_ops call (passive health, on by default), tierlb rows only.
    pub sock_ops_ns_per_run: Option<f64>,
}

/// The measured Service's shape in connect4's own rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// One endpoint, in the cluster tier: the on-node rows' Service.
    One,
    /// 10 endpoints over three tiers as the agent writes hints: none on this node (the node tier empty, so
    /// connect4 walks to the next), 3 in its zone, all 10 in the cluster.
    Tiered,
    /// `Tiered` with 2 of the zone's 3 held by passive health (`HEALTH` entries, the gate open): connect4
    /// asks for a verdict on every slot it considers and skips the held ones.
    Held,
}

impl Shape {
    /// In the order they run in each round (the first is what the others are compared with).
    pub const ALL: [Self; 3] = [Self::One, Self::Tiered, Self::Held];

    /// The measured Service, as the tables say it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::One => "1 endpoint",
            Self::Tiered => "10 endpoints: node tier empty, 3 in the zone, 10 in the cluster",
            Self::Held => "the same, 2 of the zone's 3 held by passive health",
        }
    }
}

/// connect4's BPF time per call with one shape of the measured Service, over rounds of statistics runs that
/// take the shapes in turn.
#[derive(Clone, Debug, Serialize)]
pub struct Connect4Row {
    /// Services programmed.
    pub services: usize,
    /// The measured Service's shape.
    pub shape: Shape,
    /// Rounds (one statistics run of each shape per round).
    pub rounds: usize,
    /// connect4's run time per call, the median of the rounds.
    pub ns_per_run: f64,
    /// Per round, this shape's time per call over the one-endpoint Service's in the same round.
    pub vs_one: Ratio,
    /// sock_ops' run time per call, the median of the rounds.
    pub sock_ops_ns_per_run: Option<f64>,
}

/// connect4's cost at `services` Services against 1 Service: pairs of statistics runs, the maps programmed
/// with 1 Service, then with `services` (or the other way round, alternating), a ratio per pair.
#[derive(Clone, Debug, Serialize)]
pub struct Flatness {
    /// The larger count.
    pub services: usize,
    /// Pairs of runs.
    pub pairs: usize,
    /// connect4's time per call at 1 Service, the median of the pairs.
    pub one_ns: f64,
    /// connect4's time per call at `services`, the median of the pairs.
    pub many_ns: f64,
    /// Per pair, the time at `services` over the time at 1.
    pub ratio: Ratio,
}

/// What a whole run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The kernel release the run was on.
    pub kernel: String,
    /// CPUs available to the run.
    pub cpus: usize,
    /// Load client threads per row.
    pub threads: usize,
    /// The CPUs the load client and the backend were held to.
    pub placement: super::load::Placement,
    /// Length of each row's load, in seconds.
    pub seconds: f64,
    /// The data-path rows, in the order they ran.
    pub rows: Vec<Row>,
    /// tierlb's connects made on the node against direct, interleaved per round (the ratios the targets
    /// judge).
    pub east_west: Vec<NsRow>,
    /// The north-south rows (traffic from outside the node), interleaved per round.
    pub north_south: Vec<NsRow>,
    /// The SNAT path from outside (node-2's pod through node-1's node ports): connects, the packet rate and
    /// issue 63's three loads, tierlb against real kube-proxy.
    pub snat: Option<super::north_south_snat::Snat>,
    /// The XDP section (`bench::xdp`): tc against XDP on the SNAT path.
    pub xdp: Option<super::xdp::XdpFigures>,
    /// Conntrack memory of flows from outside the node: tierlb's table, then nf_conntrack's.
    pub conntrack: Vec<CtMemory>,
    /// Real kube-proxy: its syncs per mode and Service count (its connect rows are in `rows`, their ratios
    /// to direct in `east_west`).
    pub kube_proxy: Vec<KubeProxySync>,
    /// The control-plane figures.
    pub control: ControlPlane,
    /// connect4's BPF time per call by the measured Service's shape, at each on-node Service count.
    pub connect4: Vec<Connect4Row>,
    /// connect4's cost at the largest count against 1 Service, from statistics runs alternating between them.
    pub flatness: Option<Flatness>,
}

impl Report {
    /// The row of `path` at `services` Services under `mode` (direct has one per mode, whatever `services`).
    pub fn row(&self, path: DataPath, services: usize, mode: LoadMode) -> Option<&Row> {
        self.rows.iter().find(|x| {
            x.path == path && x.mode == mode && (x.services == services || path == DataPath::Direct)
        })
    }
}

/// Real kube-proxy programming a Service count from the API server, in one mode.
#[derive(Clone, Debug, Serialize)]
pub struct KubeProxySync {
    /// `iptables` or `nftables`.
    pub mode: &'static str,
    /// Services (each with its EndpointSlice) in the API server.
    pub services: usize,
    /// From its start to its first sync's end (its rules for every Service), wall time; or stopped at the
    /// limit (its `iptables-restore` killed with it).
    pub first_sync: LoadTime,
    /// What followed a first sync within the limit.
    pub after: Option<KubeProxyAfter>,
}

/// kube-proxy's figures once its first sync is done.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct KubeProxyAfter {
    /// The first sync's own duration by kube-proxy's `kubeproxy_sync_proxy_rules_duration_seconds`, seconds.
    pub first_sync_metric: f64,
    /// From `kubectl replace` of one EndpointSlice to the end of the sync that wrote it, wall time (kube-proxy's
    /// default `minSyncPeriod` of 1 s included).
    pub one_change: Duration,
    /// The syncs after the change by its own metric, seconds each (their mean).
    pub one_change_metric: f64,
}

/// A conntrack table's memory with a number of flows from outside the node in it.
#[derive(Clone, Debug, Serialize)]
pub struct CtMemory {
    /// `tierlb` (its tc programs' table) or `nf_conntrack` (kube-proxy's rules).
    pub table: String,
    /// Flows the table held when it was read (tierlb: live forward entries; nf_conntrack: its count).
    pub flows: usize,
    /// Entries (tierlb keeps two a flow).
    pub entries: usize,
    /// The table's memory: tierlb's map as the kernel accounts it (allocated when loaded, whatever it
    /// holds), nf_conntrack's slab growth over its flows.
    pub bytes: u64,
    /// The kernel's unreclaimable slab growth while the flows were made.
    pub slab_growth: u64,
    /// Flows the table holds at most (tierlb's LRU: its entries / 2), `None` where it grows on demand.
    pub capacity_flows: Option<u64>,
    /// nf_conntrack's entries in the node's namespace when the table was read.
    pub nf_conntrack_alongside: usize,
}

/// The control-plane figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ControlPlane {
    /// Programming the Service maps directly, at each Service count of the run from 10,000 up.
    pub maps: Vec<MapWrites>,
    /// The Service maps' memory at the largest count.
    pub map_memory: MapMemory,
    /// The agent's own figures, per source and Service count (those that could not be taken are missing; the
    /// run said why on stderr).
    pub agent: Vec<AgentFigures>,
    /// Each rule set's load at each Service count, in the order they ran.
    pub rule_loads: Vec<RuleLoad>,
}

impl ControlPlane {
    /// The map writes at `services` Services.
    pub fn maps_at(&self, services: usize) -> Option<&MapWrites> {
        self.maps.iter().find(|m| m.services == services)
    }

    /// The agent's figures with `source` at `services` Services.
    pub fn agent_at(&self, source: AgentSource, services: usize) -> Option<&AgentFigures> {
        self.agent.iter().find(|a| a.source == source && a.services == services)
    }
}

/// Writing N Services x 10 endpoints into the maps, through the reconciler.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MapWrites {
    /// Services written.
    pub services: usize,
    /// All of them, from scratch.
    pub program: Duration,
    /// One EndpointSlice change: the changed Service's new slots and its frontend swap.
    pub one_change: Duration,
}

/// The Service maps' memory as the kernel accounts it (fdinfo `memlock`), by map.
#[derive(Clone, Debug, Serialize)]
pub struct MapMemory {
    /// Services programmed when it was taken.
    pub services: usize,
    /// Each map's name and bytes (a map the kernel gave no figure for is left out).
    pub maps: Vec<(String, u64)>,
}

impl MapMemory {
    /// The maps' bytes together.
    pub fn bytes(&self) -> u64 {
        self.maps.iter().map(|(_, b)| b).sum()
    }
}

/// Where the agent read the Services from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentSource {
    /// `--manifests DIR`: YAML files, 100 Services each.
    Manifests,
    /// `--kube` against the bench's API-server stand-in (chunked lists, watch streams, bookmarks).
    Kube,
    /// `--kube` against the real kube-apiserver v1.36.3 and etcd, built here.
    #[serde(rename = "kube-apiserver")]
    ApiServer,
}

impl AgentSource {
    /// Every source, in table order.
    pub const ALL: [Self; 3] = [Self::Manifests, Self::Kube, Self::ApiServer];

    /// The source's name in tables and charts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Manifests => "manifests",
            Self::Kube => "kube",
            Self::ApiServer => "kube-apiserver",
        }
    }
}

/// The agent with N Services x 10 endpoints from one source.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AgentFigures {
    /// The source.
    pub source: AgentSource,
    /// Services (each with one EndpointSlice of 10 endpoints).
    pub services: usize,
    /// From start to ready (read the source, plan, load, program).
    pub ready: Duration,
    /// One EndpointSlice edit, from reading the change to maps written: the agent's own `took_us`.
    pub edit_took: Spread,
    /// The same edits from the change (file written, watch event sent) to the agent's `synced` log line.
    pub edit_wall: Spread,
    /// Resident set size after the edits (VmRSS).
    pub rss_bytes: u64,
    /// Start to ready by phase, from the agent's ready line.
    pub phases: Phases,
}

/// The agent's start to ready by phase (its `tierlb agent ready` line): the source's start (with `--kube`
/// the lists, converted as they arrive), loading the programs and maps, and the first sync's reading of the
/// source, plan and map writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    /// `source_ms`.
    pub source: Duration,
    /// `load_ms`.
    pub load: Duration,
    /// `read_ms`.
    pub read: Duration,
    /// `plan_ms`.
    pub plan: Duration,
    /// `program_ms`.
    pub program: Duration,
    /// `attach_ms`: from the first sync's end to ready (programs attached, north-south maps, first sweep and
    /// snapshot); zero from an agent whose ready line has none.
    pub attach: Duration,
}

impl Phases {
    /// From the ready line's fields; `None` if one is missing.
    pub fn of_ready_line(fields: &serde_json::Value) -> Option<Self> {
        let ms = |k: &str| fields[k].as_u64().map(Duration::from_millis);
        Some(Self {
            source: ms("source_ms")?,
            load: ms("load_ms")?,
            read: ms("read_ms")?,
            plan: ms("plan_ms")?,
            program: ms("program_ms")?,
            attach: ms("attach_ms").unwrap_or_default(),
        })
    }

    /// "source 210 ms, load 1318 ms, read 851 ms, plan 74 ms, program 155 ms, attach 40 ms".
    pub fn describe(&self) -> String {
        let ms = |d: Duration| d.as_millis();
        format!(
            "source {} ms, load {} ms, read {} ms, plan {} ms, program {} ms, attach {} ms",
            ms(self.source),
            ms(self.load),
            ms(self.read),
            ms(self.plan),
            ms(self.program),
            ms(self.attach)
        )
    }
}

/// Median and maximum of repeated timings, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    /// Median (the upper one of an even count).
    pub median_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

impl Spread {
    /// The median and maximum of `ms` (which must not be empty).
    pub fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        Self { median_ms: ms[ms.len() / 2], max_ms: ms[ms.len() - 1] }
    }
}

/// Loading one kube-proxy-style rule set.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RuleLoad {
    /// The loading tool (`iptables-restore`, `nft -f`).
    pub tool: &'static str,
    /// Services in the rule set.
    pub services: usize,
    /// How long it took.
    pub took: LoadTime,
}

/// How a rule set's load ended.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadTime {
    /// Loaded in this time.
    Done(Duration),
    /// Not loaded within the limit; the tool was stopped.
    Stopped {
        /// The limit.
        limit: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ratio's median, quartiles and extremes by rank, whatever the order the pairs came in; an even
    /// count's median is the midpoint of the middle two; ratios that are not numbers are left out.
    #[test]
    fn a_ratio_gives_the_median_quartiles_and_extremes_of_its_pairs() {
        let r = Ratio::of(&[1.07, 0.9, 1.3, 1.01, 1.04, 1.02, 1.06, 1.05, 1.03]);
        assert_eq!((r.min, r.q1, r.median, r.q3, r.max), (0.9, 1.02, 1.04, 1.06, 1.3));
        let r = Ratio::of(&[1.5, 1.0]);
        assert_eq!((r.min, r.median, r.max), (1.0, 1.25, 1.5));
        let r = Ratio::of(&[]);
        assert!(r.median.is_nan() && r.q1.is_nan() && r.max.is_nan());
        // A pair whose figure is missing (0 / 0) or was zero (x / 0) is not counted.
        let r = Ratio::of(&[1.0, f64::NAN, 1.5, f64::INFINITY]);
        assert_eq!((r.min, r.median, r.max), (1.0, 1.25, 1.5));
    }
}
