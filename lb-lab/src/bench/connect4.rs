//! connect4's own figures beside the on-node rows: its BPF time per call with three shapes of the measured
//! Service (one endpoint; 10 over three tiers, the node tier empty; the same with two held by passive health),
//! the shapes taken in turn round after round; and its cost at N Services against 1, from statistics runs
//! that alternate between the two counts (one run per row moved by +-15% between runs, more than the
//! difference it was to show).
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail, ensure};
use lb_common::{Backend, FrontendKey, HEALTH_REFUSED, Health, HealthConfig, Held};
use lb_testkit::sandbox::Cgroup;
use tierlb::datapath::{
    Desired, DesiredFrontend, MapReader as _, MapWriter as _, Reconciler, addr, ebpf::KernelMaps,
    ebpf::Programs, health,
};

use super::{
    figures::{Connect4Row, Flatness, Ratio, Shape, median},
    load::LoadMode,
    run::{BpfStats, Loader},
    workloads::{desired, target, vip},
};

/// The shaped Service's endpoints listen on this port, on every address of [`SHAPED_NET`].
pub(super) const SHAPED_PORT: u16 = 8081;

/// The shaped Service's endpoint addresses: routed as local inside the bench's namespace, so that one
/// listener on the wildcard address and [`SHAPED_PORT`] answers them all.
pub(super) const SHAPED_NET: &str = "10.244.1.0/24";

/// Seconds of load per statistics run: about 50,000 connect4 calls, a mean steady to a few ns.
pub(super) const STATS_SECS: f64 = 1.0;

/// Endpoint `e` of the shaped Service.
fn shaped_endpoint(e: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 244, 1, e + 1)), SHAPED_PORT)
}

/// The measured Service's frontend with `shape`: `one` as programmed, or 10 endpoints in three tiers nested
/// as the agent writes them (each tier holds the one before it): none on this node, 3 in its zone, 10 in
/// the cluster.
fn shaped(one: &DesiredFrontend, shape: Shape) -> DesiredFrontend {
    match shape {
        Shape::One => one.clone(),
        Shape::Tiered | Shape::Held => {
            let all: Vec<Backend> = (0..10).map(|e| addr::backend(shaped_endpoint(e), 6)).collect();
            DesiredFrontend { tiers: [Vec::new(), all[..3].to_vec(), all], ..one.clone() }
        }
    }
}

/// The backends `Shape::Held` holds: two of the zone tier's three (a connect's first pick is held two times
/// in three, and then connect4 scans the tier for the live one).
fn held_backends() -> [Backend; 2] {
    [addr::backend(shaped_endpoint(0), 6), addr::backend(shaped_endpoint(1), 6)]
}

/// `CLOCK_BOOTTIME` now, in ns: the clock of `Health`'s times.
fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or_default() * 1_000_000_000
        + u64::try_from(ts.tv_nsec).unwrap_or_default()
}

/// How long the bench's holds last: longer than every round that reads them (a hold that ended would let a
/// trial through, which succeeds and ends the hold).
const BENCH_HOLD_NS: u64 = 600_000_000_000;

/// `backend`'s entry as the kernel leaves it after the default threshold's failed connects from two client
/// namespaces (`Health::fail`, the rule `sock_ops` runs): held for every client, from `now_ns`. The hold is
/// [`BENCH_HOLD_NS`] long, as after repeated holds, so that it outlasts the rounds.
fn held_entry(backend: Backend, cfg: HealthConfig, now_ns: u64) -> anyhow::Result<Health> {
    let cfg = HealthConfig { hold_ns: BENCH_HOLD_NS, max_hold_ns: BENCH_HOLD_NS, ..cfg };
    let mut h = Health { backend, ..Health::default() };
    let mut held = Held::No;
    // Two namespaces' failures in turn, as many as the threshold asks.
    for k in 0..cfg.failures.max(cfg.clients) {
        held = h.fail(u64::from(k % 2) + 1, HEALTH_REFUSED, &cfg, now_ns);
    }
    ensure!(held == Held::All && h.held_until_ns > now_ns, "the failures did not hold {backend:?}: {h:?}");
    Ok(h)
}

/// The bytes of a map key or value.
fn bytes_of<T: aya_pod::Plain>(v: &T) -> Vec<u8> {
    // SAFETY: `Plain` types are lb-common's `#[repr(C)]` bytemuck::Pod map types: no padding, every byte
    // initialised.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// Map types [`bytes_of`] may read.
mod aya_pod {
    /// lb-common's map types (their layout is `bytemuck::Pod`, proved where they are defined).
    pub(super) trait Plain {}
    impl Plain for lb_common::Backend {}
    impl Plain for lb_common::Health {}
}

/// The programs of this bench's data path by kernel id: their run time read from bpftool by id, so that
/// another tierlb loaded on the machine (a test run) is never read instead.
pub(super) struct Ids {
    connect4: u32,
    sock_ops: u32,
}

impl Ids {
    pub(super) fn of(programs: &mut Programs) -> anyhow::Result<Self> {
        let ids = programs.ids()?;
        let id = |name: &str| {
            ids.iter()
                .find(|(n, _)| *n == name)
                .and_then(|(_, id)| *id)
                .with_context(|| format!("{name}'s id"))
        };
        Ok(Self { connect4: id("connect4")?, sock_ops: id("sock_ops")? })
    }

    /// bpftool's JSON about program `id`.
    fn prog(id: u32) -> anyhow::Result<serde_json::Value> {
        let out = Command::new("bpftool").args(["prog", "show", "id", &id.to_string(), "--json"]).output()?;
        ensure!(out.status.success(), "bpftool prog show id {id}");
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Program `id`'s (run_time_ns, run_cnt); bpftool leaves both out while they are zero.
    fn stats(id: u32) -> anyhow::Result<(u64, u64)> {
        let p = Self::prog(id)?;
        Ok((p["run_time_ns"].as_u64().unwrap_or(0), p["run_cnt"].as_u64().unwrap_or(0)))
    }

    /// The id of connect4's `HEALTH` map.
    fn health_map(&self) -> anyhow::Result<u32> {
        let p = Self::prog(self.connect4)?;
        for m in p["map_ids"].as_array().context("connect4's maps")? {
            let id = m.as_u64().and_then(|x| u32::try_from(x).ok()).context("a map id")?;
            let out =
                Command::new("bpftool").args(["map", "show", "id", &id.to_string(), "--json"]).output()?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            if v["name"] == lb_common::MAP_HEALTH {
                return Ok(id);
            }
        }
        bail!("connect4 has no {} map", lb_common::MAP_HEALTH)
    }
}

/// One statistics run of connect() + close against `target`: connect4's and sock_ops' time per call.
fn stats_run(loader: &Loader, cg: &Cgroup, target: SocketAddr, ids: &Ids) -> anyhow::Result<(f64, f64)> {
    let _on = BpfStats::on();
    let before = (Ids::stats(ids.connect4)?, Ids::stats(ids.sock_ops)?);
    let result = loader.run_for(Some(cg), target, LoadMode::Connect, STATS_SECS)?;
    let after = (Ids::stats(ids.connect4)?, Ids::stats(ids.sock_ops)?);
    ensure!(result.errors == 0, "{} failed connects to {target}", result.errors);
    let per = |(t0, c0): (u64, u64), (t1, c1): (u64, u64)| {
        #[expect(clippy::cast_precision_loss, reason = "ns and calls of one second, far below 2^52")]
        let x = (t1 - t0) as f64 / (c1 - c0).max(1) as f64;
        x
    };
    Ok((per(before.0, after.0), per(before.1, after.1)))
}

/// Put the measured Service (`key`, programmed as `one`) in `shape`: its frontend rewritten as the agent
/// does after an EndpointSlice change, and for `Shape::Held` its held backends' `HEALTH` entries written
/// (into `health_map`, as `sock_ops` leaves them) and the gate opened as the agent's sweep does; for the
/// other shapes the entries deleted and the gate closed again.
fn set_shape(
    rec: &mut Reconciler<KernelMaps>,
    key: FrontendKey,
    one: &DesiredFrontend,
    shape: Shape,
    health_map: u32,
) -> anyhow::Result<()> {
    let want: Desired = [(key, shaped(one, shape))].into_iter().collect();
    let rep = rec.apply_services([&one.name.service], &want, Instant::now());
    ensure!(
        rep.errors.is_empty(),
        "shaping the measured Service: {:?}",
        rep.errors.first().map(ToString::to_string)
    );
    rec.collect_garbage(Instant::now());
    if shape == Shape::Held {
        let cfg = rec.writer().health_config()?;
        let now = boottime_ns();
        for b in held_backends() {
            let h = held_entry(b, cfg, now)?;
            let hex = |v: Vec<u8>| v.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>();
            let status = Command::new("bpftool")
                .args(["map", "update", "id", &health_map.to_string(), "key", "hex"])
                .args(hex(bytes_of(&b)))
                .args(["value", "hex"])
                .args(hex(bytes_of(&h)))
                .status()?;
            ensure!(status.success(), "bpftool map update of HEALTH");
        }
        ensure!(health::gate(rec.writer_mut())?, "the health gate stayed closed with held entries");
    } else {
        // The held entries, and the entries the rows' load left: a connect whose SYN's first retransmission
        // timed out counts a failure, then its success resets the entry, which the agent's sweep deletes (the
        // gate stays open while one is there). The bench's backends are all up.
        for (b, h) in rec.writer().health()? {
            if h.held_until_ns != 0 && !held_backends().contains(&b) {
                bail!("a backend of the bench is held: {h:?}");
            }
            rec.writer_mut().delete_health(b)?;
        }
        ensure!(!health::gate(rec.writer_mut())?, "the health gate stayed open");
    }
    Ok(())
}

/// connect4 with each shape of the measured Service at `services` Services (programmed as `d`): `rounds`
/// rounds of one statistics run per shape, in the order of [`Shape::ALL`] and reversed every other round;
/// the measured Service is left as `d` has it.
pub(super) fn shapes(
    loader: &Loader,
    rec: &mut Reconciler<KernelMaps>,
    cg: &Cgroup,
    ids: &Ids,
    d: &Desired,
    services: usize,
    rounds: usize,
) -> anyhow::Result<Vec<Connect4Row>> {
    let vip = SocketAddr::new(IpAddr::V4(vip(target(services))), 80);
    let key = addr::frontend_key(vip.ip(), 80, 6);
    let one = d.get(&key).context("the measured Service is programmed")?.clone();
    let health_map = ids.health_map()?;
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); Shape::ALL.len()];
    for r in 0..rounds {
        let mut order = Shape::ALL;
        if r % 2 == 1 {
            order.reverse();
        }
        for shape in order {
            set_shape(rec, key, &one, shape, health_map)?;
            runs[shape as usize].push(stats_run(loader, cg, vip, ids)?);
        }
    }
    set_shape(rec, key, &one, Shape::One, health_map)?;
    let ones: Vec<f64> = runs[Shape::One as usize].iter().map(|x| x.0).collect();
    let rows: Vec<Connect4Row> = Shape::ALL
        .iter()
        .map(|&shape| {
            let xs = &runs[shape as usize];
            let c4: Vec<f64> = xs.iter().map(|x| x.0).collect();
            let so: Vec<f64> = xs.iter().map(|x| x.1).collect();
            let vs: Vec<f64> = c4.iter().zip(&ones).map(|(x, o)| x / o).collect();
            Connect4Row {
                services,
                shape,
                rounds,
                ns_per_run: median(&c4),
                vs_one: Ratio::of(&vs),
                sock_ops_ns_per_run: Some(median(&so)),
            }
        })
        .collect();
    for x in &rows {
        eprintln!(
            "bench: connect4 {services:>6} services  {:<62}  {:>4.0} ns/run ({:.2}x 1 endpoint, middle half {:.2}-{:.2}, {rounds} rounds)  sock_ops {:.0} ns/run",
            x.shape.describe(),
            x.ns_per_run,
            x.vs_one.median,
            x.vs_one.q1,
            x.vs_one.q3,
            x.sock_ops_ns_per_run.unwrap_or(f64::NAN),
        );
    }
    Ok(rows)
}

/// The maps programmed from scratch with `services` Services (see `on_node`: what the emptying buried is
/// collected first).
fn program(rec: &mut Reconciler<KernelMaps>, services: usize, per: usize) -> anyhow::Result<()> {
    rec.apply(&Desired::default(), Instant::now());
    rec.collect_garbage(Instant::now());
    let rep = rec.apply(&desired(services, per), Instant::now());
    ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));
    Ok(())
}

/// connect4's cost at `services` Services against 1: `pairs` pairs of statistics runs, the maps programmed
/// from scratch with 1 Service and with `services` in the order A B B A A B ..., so that the machine's drift
/// lands on both sides of a pair's ratio. The maps are left with `services` Services.
pub(super) fn flatness(
    loader: &Loader,
    rec: &mut Reconciler<KernelMaps>,
    cg: &Cgroup,
    ids: &Ids,
    services: usize,
    per: usize,
    pairs: usize,
) -> anyhow::Result<Flatness> {
    let (mut one, mut many) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    let mut programmed = services;
    for i in 0..pairs {
        let order = if i % 2 == 0 { [1, services] } else { [services, 1] };
        for n in order {
            if programmed != n {
                program(rec, n, per)?;
                programmed = n;
            }
            let (c4, _) = stats_run(loader, cg, SocketAddr::new(IpAddr::V4(vip(target(n))), 80), ids)?;
            if n == 1 {
                one.push(c4);
            } else {
                many.push(c4);
            }
        }
    }
    if programmed != services {
        program(rec, services, per)?;
    }
    let ratios: Vec<f64> = many.iter().zip(&one).map(|(m, o)| m / o).collect();
    let f =
        Flatness { services, pairs, one_ns: median(&one), many_ns: median(&many), ratio: Ratio::of(&ratios) };
    eprintln!(
        "bench: connect4 {services} vs 1 services  {:.0} vs {:.0} ns/run (medians), per pair {:.3}x (middle half {:.2}-{:.2}, all {:.2}-{:.2}, {pairs} pairs)",
        f.many_ns, f.one_ns, f.ratio.median, f.ratio.q1, f.ratio.q3, f.ratio.min, f.ratio.max
    );
    Ok(f)
}
