//! The XDP rows (issue 59): the SNAT path from outside (the north-south lab's client to node-2's pod through a
//! node port of node-1) with tierlb's tc programs alone, and with `xdp_ingress` in front of them
//! (`--xdp=native` on node-1's veth uplink), in one lab, interleaved: the XDP program is attached before each
//! of its runs and detached after, so every round meets both paths on the same machine state.
//!
//! The LAN is made a wire for XDP: the client and node-2 send with complete checksums (transmit checksumming
//! off on their uplinks, as a frame that crossed a wire has them), and the bridge's ports of both nodes carry
//! an XDP program that passes everything (a veth needs one on its peer for `XDP_TX`). Both paths run on that
//! same LAN.
//!
//! - Connects: rounds of connect() + close to node-2's pod directly (routed by node-1), through tc, through
//!   XDP, through tc with DSR, through XDP with DSR (A B C D E, then E D C B A; DSR switched by the frontends'
//!   `FLAG_DSR`, node-2 running tierlb's tc programs in every row and answering the client over the LAN), a
//!   ratio per round against that round's direct run; then each node's program runs and time per
//!   connection, SNAT against DSR.
//! - Packet rate: UDP datagrams a second from the client (64 flows, 64-byte payloads) to node-2's pod through
//!   the node port, the offered rate stepped up (doubling, then bisecting) until more than 0.1% are lost;
//!   tc's and XDP's steps alternate.
//! - The programs' cost per packet (`bpf_stats`) over one run of each path at the same offered rate.
use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use lb_common::FLAG_SNAT_TO_FRONTEND;
use lb_testkit::sandbox::NetNs;
use serde::Serialize;
use tierlb::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, ebpf::Loaded, ebpf::Programs, xdp::XdpSetting},
    model::{ObjKey, ServicePortName},
};

use super::{
    figures::{DataPath, NsRow},
    load::LoadMode,
    north_south::{CLIENT, Lab, NODE, POD_2, POD_PORT, attach_in},
    run::{BpfStats, Loader, prog_stats_id},
};

/// tierlb's node ports of the section: TCP to node-2's sink, UDP to the section's counter on node-2's pod.
const TCP_PORT: u16 = 31_500;
const UDP_PORT: u16 = 31_501;
/// The counter's port on node-2's pod.
const COUNTER_PORT: u16 = 9_999;
/// Flows (client sockets) of the packet-rate runs.
const FLOWS: usize = 64;
/// Bytes of each datagram's payload.
const PAYLOAD: usize = 64;
/// A step passes with at most this share of its datagrams lost.
const LOSS: f64 = 0.001;
/// The first step's rate, datagrams a second; none above `CAP`.
const START: u64 = 25_000;
const CAP: u64 = 3_200_000;

/// What the section measured.
#[derive(Clone, Debug, Serialize)]
pub struct XdpFigures {
    /// Interleaved connect rounds.
    pub rounds: usize,
    /// Seconds of each connect run.
    pub seconds: f64,
    /// Connect rows: direct, tc, XDP, tc with DSR, XDP with DSR.
    pub rows: Vec<NsRow>,
    /// The packet-rate search of each path.
    pub rates: Vec<PpsRow>,
    /// The programs' run time per packet of each path at one offered rate.
    pub cost: Vec<CostRow>,
    /// Each node's programs per connection, SNAT against DSR.
    pub per_connection: Vec<ConnectionCost>,
}

/// What one path's connections cost each node's tc and XDP programs (`bpf_stats` over one connect run).
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionCost {
    pub path: DataPath,
    /// Connections of the run.
    pub connections: u64,
    /// Node-1's (the ingress node's) program runs and nanoseconds per connection.
    pub node_1: (f64, f64),
    /// Node-2's (the backend's node's).
    pub node_2: (f64, f64),
}

/// One path's packet-rate search.
#[derive(Clone, Debug, Serialize)]
pub struct PpsRow {
    pub path: DataPath,
    /// The highest offered rate that passed (datagrams a second).
    pub sustained: Option<u64>,
    /// The lowest that failed.
    pub failed_at: Option<u64>,
    pub steps: Vec<PpsStep>,
}

/// One step: offered, sent (the client's pace may fall short) and received datagrams.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PpsStep {
    pub rate: u64,
    pub sent: u64,
    pub received: u64,
}

impl PpsStep {
    fn passed(&self) -> bool {
        // The client must have offered the rate (within 5%), and the path lost at most `LOSS` of it.
        let offered = self.sent as f64 >= 0.95 * (self.rate * STEP_MS / 1_000) as f64;
        offered && (self.sent - self.received.min(self.sent)) as f64 <= LOSS * self.sent as f64
    }
}

/// The programs' cost per packet on a path.
#[derive(Clone, Debug, Serialize)]
pub struct CostRow {
    pub path: DataPath,
    /// Datagrams a second offered during the reading.
    pub rate: u64,
    /// Nanoseconds per run of each program that ran, and its runs.
    pub programs: Vec<(String, f64, u64)>,
}

/// The length of a step, milliseconds.
const STEP_MS: u64 = 2_000;

/// The section in a lab of its own; `lab_bin` is `tierlb-lab` (the connect rows' client).
pub(super) fn measure(lab_bin: &std::path::Path, quick: bool) -> anyhow::Result<XdpFigures> {
    let (rounds, secs, max_steps) = if quick { (3, 0.75, 6) } else { (5, 2.0, 12) };
    let lab = Lab::new()?;
    // The LAN as a wire (see the module's comment).
    lab.ext.tx_checksum("uplink", false)?;
    lab.node_2.netns.tx_checksum("eth", false)?;
    let _peers = [pass_program(&lab.lan, "p1")?, pass_program(&lab.lan, "p2")?];
    // Node-2 answers the client straight over the LAN, as a backend's node under DSR must (the other sections
    // route its replies back by node-1 for netfilter's sake; no rule set runs here): a direct connect's
    // replies skip node-1 too.
    lab.node_2.netns.ip(&["route", "del", &format!("{CLIENT}/32")])?;
    let counter = Counter::start(&lab.pods[1])?;
    let loader = Loader { lab: lab_bin, ns: &lab.ext, threads: 1, cpu: lab.cpus.client, secs };
    let Loaded { mut programs, maps, ns: mut ns_maps, .. } =
        Loaded::load(tierlb::datapath::ebpf::Capacities::default(), None)?;
    ns_maps.set_addrs(&std::collections::BTreeMap::from([(IpAddr::V4(NODE), lb_common::ADDR_NODE)]))?;
    let mut config = lb_common::NatConfig { snat_v4: addr::words(IpAddr::V4(NODE))[0], ..Default::default() };
    if let Some((lo, hi)) = lab.node.netns.run(|| Ok(tierlb::datapath::tc::ephemeral_ports()))? {
        (config.ephemeral_min, config.ephemeral_max) = (lo, hi);
    }
    ns_maps.set_config(config)?;
    attach_in(&lab.node.netns, &mut programs)?;
    // Node-2 runs tierlb's tc programs too, as every node of a cluster does: under DSR they give its pod's
    // replies the node port's address (`--dsr`: its pod a local endpoint with `LOCAL_DSR`).
    let Loaded { programs: mut programs_2, ns: mut ns_maps_2, .. } =
        Loaded::load(tierlb::datapath::ebpf::Capacities::default(), None)?;
    ns_maps_2.set_dsr(true);
    ns_maps_2.set_local(&std::collections::BTreeSet::from([IpAddr::V4(POD_2)]))?;
    attach_in(&lab.node_2.netns, &mut programs_2)?;
    XdpSetting::Native.set();
    let mut rec = Reconciler::new(maps);
    let mut dsr = Dsr { rec: &mut rec, on: true };
    dsr.set(false)?;
    let mut xdp = Switch { programs: &mut programs, node: &lab.node.netns, on: false };

    let direct = SocketAddr::new(POD_2.into(), POD_PORT);
    let np = SocketAddr::new(NODE.into(), TCP_PORT);
    let rows = connect_rows(&loader, rounds, (&mut xdp, &mut dsr), direct, np)?;
    // Each node's programs per connection, SNAT against DSR (tc alone on node-1).
    xdp.set(false)?;
    let per_connection = per_connection(&loader, np, &mut dsr, [xdp.programs, &mut programs_2])?;
    dsr.set(false)?;
    for row in &rows {
        super::north_south::progress(row);
    }

    let udp = SocketAddr::new(NODE.into(), UDP_PORT);
    let mut rates = [DataPath::Tierlb, DataPath::TierlbXdp].map(|path| PpsRow {
        path,
        sustained: None,
        failed_at: None,
        steps: Vec::new(),
    });
    let mut next = [Some(START); 2];
    for _ in 0..max_steps {
        for (i, row) in rates.iter_mut().enumerate() {
            let Some(rate) = next[i] else { continue };
            xdp.set(i == 1)?;
            let step = blast(&lab.ext, udp, rate, &counter)?;
            eprintln!(
                "bench: xdp section {:<10} {:>9} datagrams/s offered: {} sent, {} received",
                row.path.as_str(),
                rate,
                step.sent,
                step.received
            );
            row.steps.push(step);
            if step.passed() {
                row.sustained = Some(row.sustained.map_or(rate, |s| s.max(rate)));
            } else {
                row.failed_at = Some(row.failed_at.map_or(rate, |f| f.min(rate)));
            }
            next[i] = next_rate(row.sustained, row.failed_at);
        }
    }
    // The programs' cost per packet at the rate both sustained (or the first step's).
    let rate = rates.iter().filter_map(|r| r.sustained).min().unwrap_or(START);
    let mut cost = Vec::new();
    for (path, on) in [(DataPath::Tierlb, false), (DataPath::TierlbXdp, true)] {
        xdp.set(on)?;
        // By kernel id: the LAN's pass programs are named `xdp_ingress` too, and are the lab's wire, not tierlb.
        let ids: Vec<(&str, Option<u32>)> =
            ["xdp_ingress", "tc_ingress", "tc_egress"].into_iter().map(|n| (n, xdp.programs.id(n))).collect();
        let read = || ids.iter().map(|(_, id)| id.and_then(prog_stats_id)).collect::<Vec<_>>();
        let _stats = BpfStats::on();
        let before = read();
        blast(&lab.ext, udp, rate, &counter)?;
        let after = read();
        let programs = ids
            .iter()
            .zip(before.iter().zip(&after))
            .filter_map(|((n, _), (b, a))| {
                let ((t0, c0), (t1, c1)) = (b.unwrap_or((0, 0)), (*a)?);
                (c1 > c0).then(|| ((*n).to_owned(), (t1 - t0) as f64 / (c1 - c0) as f64, c1 - c0))
            })
            .collect();
        cost.push(CostRow { path, rate, programs });
    }
    xdp.set(false)?;
    drop(programs);
    drop(programs_2);
    counter.stop();
    Ok(XdpFigures { rounds, seconds: secs, rows, rates: rates.to_vec(), cost, per_connection })
}

/// The connect rows: direct, tc, XDP, tc with DSR, XDP with DSR, interleaved in `rounds` rounds (A B C D E,
/// then E D C B A).
fn connect_rows(
    loader: &Loader<'_>,
    rounds: usize,
    (xdp, dsr): (&mut Switch<'_>, &mut Dsr<'_>),
    direct: SocketAddr,
    np: SocketAddr,
) -> anyhow::Result<Vec<NsRow>> {
    // direct, tc, XDP, tc with DSR, XDP with DSR: (XDP, DSR) of each.
    let paths = [(false, false), (false, false), (true, false), (false, true), (true, true)];
    let mut runs: [Vec<_>; 5] = Default::default();
    for r in 0..rounds {
        let order: [usize; 5] = if r % 2 == 0 { [0, 1, 2, 3, 4] } else { [4, 3, 2, 1, 0] };
        for i in order {
            xdp.set(paths[i].0)?;
            dsr.set(paths[i].1)?;
            runs[i].push(loader.run(None, if i == 0 { direct } else { np }, LoadMode::Connect)?);
        }
    }
    let connect = LoadMode::Connect;
    let rows: Vec<NsRow> = [
        DataPath::Direct,
        DataPath::Tierlb,
        DataPath::TierlbXdp,
        DataPath::TierlbDsr,
        DataPath::TierlbXdpDsr,
    ]
    .into_iter()
    .zip(&runs)
    .map(|(path, r)| NsRow::of(path, 1, connect, r, &runs[0], None))
    .collect();
    Ok(rows)
}

/// What each node's tc programs ran per connection to `np`, SNAT against DSR: one connect run of each with the
/// kernel's statistics on, `programs` node-1's and node-2's.
fn per_connection(
    loader: &Loader<'_>,
    np: SocketAddr,
    dsr: &mut Dsr<'_>,
    programs: [&mut Programs; 2],
) -> anyhow::Result<Vec<ConnectionCost>> {
    let ids: Vec<Vec<Option<u32>>> =
        programs.into_iter().map(|p| ["tc_ingress", "tc_egress"].map(|n| p.id(n)).to_vec()).collect();
    let read = |ids: &[Option<u32>]| -> (u64, u64) {
        ids.iter()
            .filter_map(|id| id.and_then(prog_stats_id))
            .fold((0, 0), |(t, c), (t1, c1)| (t + t1, c + c1))
    };
    let mut out = Vec::new();
    for (path, on) in [(DataPath::Tierlb, false), (DataPath::TierlbDsr, true)] {
        dsr.set(on)?;
        let _stats = BpfStats::on();
        let before = [read(&ids[0]), read(&ids[1])];
        let run = loader.run(None, np, LoadMode::Connect)?;
        let after = [read(&ids[0]), read(&ids[1])];
        let n = run.ops.max(1) as f64;
        let per = |i: usize| ((after[i].1 - before[i].1) as f64 / n, (after[i].0 - before[i].0) as f64 / n);
        out.push(ConnectionCost { path, connections: run.ops, node_1: per(0), node_2: per(1) });
    }
    Ok(out)
}

/// The next step: double the highest that passed until one fails, then bisect (`None`: within 2%).
fn next_rate(sustained: Option<u64>, failed_at: Option<u64>) -> Option<u64> {
    match (sustained, failed_at) {
        (Some(s), None) => (s < CAP).then(|| (s * 2).min(CAP)),
        (None, Some(f)) => (f > START / 8).then_some(f / 2),
        (Some(s), Some(f)) => (f - s > f / 50).then_some(s + (f - s) / 2),
        (None, None) => Some(START),
    }
}

/// DSR for the section's frontends, on or off (`FLAG_DSR`, written by the reconciler as the agent writes it).
struct Dsr<'a> {
    rec: &'a mut Reconciler<tierlb::datapath::ebpf::KernelMaps>,
    on: bool,
}

impl Dsr<'_> {
    fn set(&mut self, on: bool) -> anyhow::Result<()> {
        if on == self.on {
            return Ok(());
        }
        let rep = self.rec.apply(&desired(on), Instant::now());
        anyhow::ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));
        self.on = on;
        Ok(())
    }
}

/// XDP on node-1's uplink, on or off.
struct Switch<'a> {
    programs: &'a mut Programs,
    node: &'a NetNs,
    on: bool,
}

impl Switch<'_> {
    fn set(&mut self, on: bool) -> anyhow::Result<()> {
        if on == self.on {
            return Ok(());
        }
        let programs = &mut *self.programs;
        if on {
            let mode = self.node.run(|| Ok(programs.attach_xdp("eth", None)?))?;
            anyhow::ensure!(mode.is_some(), "xdp_ingress was not attached to node-1's uplink");
        } else {
            programs.detach_xdp()?;
        }
        self.on = on;
        // Let a run's first packets meet the path as it is (attach and detach are immediate; a moment for the
        // veth's NAPI to follow).
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    }
}

/// The section's node ports as the agent would program them: outside-scope frontends whose one endpoint is
/// node-2's pod (SNAT, or with `dsr` direct server return).
fn desired(dsr: bool) -> Desired {
    [(TCP_PORT, 6, POD_PORT), (UDP_PORT, 17, COUNTER_PORT)]
        .into_iter()
        .map(|(port, proto, to)| {
            (
                addr::outside_frontend_key(IpAddr::V4(NODE), port, proto),
                DesiredFrontend {
                    name: ServicePortName::new(ObjKey::new("bench", format!("xdp-{port}")), "").into(),
                    tiers: [
                        Vec::new(),
                        Vec::new(),
                        vec![addr::backend(SocketAddr::new(POD_2.into(), to), proto)],
                    ],
                    flags: FLAG_SNAT_TO_FRONTEND | if dsr { lb_common::FLAG_DSR } else { 0 },
                    affinity_timeout_s: 0,
                },
            )
        })
        .collect()
}

/// `xdp_ingress` over empty maps (it passes everything), native, on `device` in `ns`: a veth's peer needs an
/// XDP program for `XDP_TX`. Detached when the returned object is dropped.
fn pass_program(ns: &NetNs, device: &str) -> anyhow::Result<aya::Ebpf> {
    ns.run(|| {
        let object = tierlb::datapath::ebpf::embedded_object()
            .ok_or_else(|| anyhow::anyhow!("tierlb was built without its BPF object"))?;
        let mut ebpf = aya::Ebpf::load(object)?;
        let prog: &mut aya::programs::Xdp =
            ebpf.program_mut("xdp_ingress").ok_or_else(|| anyhow::anyhow!("no xdp_ingress"))?.try_into()?;
        prog.load()?;
        prog.attach(device, aya::programs::XdpMode::Driver)?;
        Ok(ebpf)
    })
}

/// Datagrams received on node-2's pod at `COUNTER_PORT`, counted by a thread in its namespace.
struct Counter {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Counter {
    fn start(pod: &NetNs) -> anyhow::Result<Self> {
        let sock = pod.run(|| Ok(UdpSocket::bind(SocketAddr::new(POD_2.into(), COUNTER_PORT))?))?;
        // 32 MiB of receive buffer (past rmem_max: SO_RCVBUFFORCE, as root): a scheduling gap of the counter's
        // thread on the shared CPUs is absorbed, so a loss is the path's, not the counter's.
        let size: libc::c_int = 32 << 20;
        // SAFETY: setsockopt on an open socket with an int option of its size.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        anyhow::ensure!(rc == 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (received.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !s.load(Ordering::Relaxed) {
                if sock.recv(&mut buf).is_ok() {
                    r.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Ok(Self { received, stop, thread: Some(thread) })
    }

    fn count(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One step: `rate` datagrams a second for `STEP_MS` from `FLOWS` sockets in `ns` to `to`, paced per
/// millisecond; then what arrived (after a quarter second for the last ones).
fn blast(ns: &NetNs, to: SocketAddr, rate: u64, counter: &Counter) -> anyhow::Result<PpsStep> {
    let before = counter.count();
    let sent = ns.run(|| {
        let socks: Vec<UdpSocket> = (0..FLOWS)
            .map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.connect(to)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .collect::<anyhow::Result<_>>()?;
        let payload = [0x5au8; PAYLOAD];
        let start = Instant::now();
        let total = rate * STEP_MS / 1_000;
        let mut sent = 0u64;
        while sent < total {
            let elapsed = start.elapsed();
            if elapsed > Duration::from_millis(STEP_MS + 500) {
                break;
            }
            let due = u64::try_from(u128::from(rate) * elapsed.as_micros() / 1_000_000)
                .unwrap_or(u64::MAX)
                .min(total);
            while sent < due {
                if socks[(sent % FLOWS as u64) as usize].send(&payload).is_ok() {
                    sent += 1;
                } else {
                    break;
                }
            }
            if sent >= due {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        Ok(sent)
    })?;
    std::thread::sleep(Duration::from_millis(250));
    Ok(PpsStep { rate, sent, received: counter.count() - before })
}

/// Only this section (`bench --xdp`): its figures printed as measured, then as BENCHMARKS.md renders them.
pub fn xdp_only(lab_bin: &std::path::Path, quick: bool) -> anyhow::Result<()> {
    let figures = measure(lab_bin, quick)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    print!("{}", super::report::xdp_section(&figures));
    Ok(())
}
