//! `tierlb trace`: every translation decision of running agents' programs, per connection, streamed from the
//! kernel's ring buffer (`TRACE_EVENTS`) while this command runs.
//!
//! The command takes each matching instance's switch (`switch`), narrowed to the selected service ids for
//! `--service`/`--vip`, reads events until SIGINT/SIGTERM, names each (`event`), attributes it to a pod
//! (`pods`), prints it, and turns the switch off again on every path. Events the kernel could not queue
//! (this command fell behind or was stopped) are counted by the programs; the command says how many it
//! missed.
use std::{
    collections::{BTreeSet, HashMap},
    io::Write as _,
    net::{IpAddr, SocketAddr},
    os::fd::AsFd as _,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use lb_common::{GLOBAL_SVC_ID, GLOBAL_TRACE_LOST, MAP_TRACE_EVENTS, TRACE_ALL, TRACE_SELECTED, TraceEvent};

use crate::{
    datapath::{
        MapReader as _,
        ebpf::KernelMaps,
        pins::{self, DEFAULT_BPFFS},
    },
    model::{ObjKey, ServicePortName},
    output::Output,
};

pub mod event;
pub mod pods;
mod switch;

pub use event::{Line, Reason};
pub use switch::Switch;

/// How often the selection (a Service's frontends may change) and the name cache are refreshed.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// `tierlb trace`.
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// The agents' --bpffs directory.
    #[arg(long, env = pins::BPFFS_ENV, default_value = DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
    /// Only this agent instance (default: every instance under --bpffs).
    #[arg(long)]
    pub instance: Option<String>,
    /// Only decisions for this Service's ports (NAMESPACE/NAME); filtered in the kernel.
    #[arg(long)]
    pub service: Option<ObjKey>,
    /// Only decisions for this VIP: IP, or IP:PORT ([IPv6]:PORT); filtered in the kernel.
    #[arg(long, value_parser = parse_vip)]
    pub vip: Option<Vip>,
    /// Only decisions made for this pod's processes (NAMESPACE/NAME, resolved from their cgroup).
    #[arg(long)]
    pub pod: Option<ObjKey>,
    /// Output format: aligned columns, or one JSON object per line.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// The cgroup2 mount whose tree maps cgroup ids to paths (default: the first cgroup2 mount).
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// The kubelet's pod log directory, whose `<namespace>_<name>_<uid>` entries name pods by UID.
    #[arg(long, default_value = "/var/log/pods")]
    pub pod_logs: PathBuf,
}

/// A `--vip`: an address, and a port if one was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vip {
    /// The address; the port only counts when `with_port`.
    pub addr: SocketAddr,
    /// Whether a port was given.
    pub with_port: bool,
}

fn parse_vip(s: &str) -> Result<Vip, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(Vip { addr, with_port: true });
    }
    s.parse::<IpAddr>()
        .map(|ip| Vip { addr: SocketAddr::new(ip, 0), with_port: false })
        .map_err(|_| format!("{s:?} is not IP or IP:PORT ([IPv6]:PORT)"))
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The instance's pins have no trace maps: its agent is an older tierlb.
    #[error(
        "{}: no trace maps pinned there; the agent was started by a tierlb without `trace`: restart it with \
         this version",
        dir.display()
    )]
    NoTraceMaps {
        /// The instance's pin directory.
        dir: PathBuf,
    },
    /// Another `tierlb trace` holds the instance's switch.
    #[error("{}: another `tierlb trace` (pid {pid}) is tracing this agent; one at a time", dir.display())]
    Busy {
        /// The instance's pin directory.
        dir: PathBuf,
        /// The process holding the switch.
        pid: u32,
    },
    /// A trace map could not be opened, read or written.
    #[error("trace map {name}")]
    Map {
        /// The map.
        name: &'static str,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
}

impl TraceError {
    fn map(name: &'static str, source: aya::maps::MapError) -> Self {
        Self::Map { name, source }
    }
}

/// One traced instance: its ring buffer, switch, names and the lost count when tracing started.
struct Source {
    name: String,
    ring: RingBuf<MapData>,
    maps: KernelMaps,
    switch: Switch,
    names: HashMap<u32, Option<String>>,
    lost_before: u64,
}

impl Source {
    fn lost(&self) -> u64 {
        self.maps.counters(GLOBAL_SVC_ID).map_or(0, |c| c[GLOBAL_TRACE_LOST as usize])
    }

    fn service(&mut self, svc_id: u32) -> Option<String> {
        let maps = &self.maps;
        self.names.entry(svc_id).or_insert_with(|| maps.name(svc_id).ok().flatten()).clone()
    }

    /// The service ids `args` selects in this instance now.
    fn selection(&self, args: &TraceArgs) -> anyhow::Result<BTreeSet<u32>> {
        let mut ids = BTreeSet::new();
        for (key, value) in self.maps.frontends()? {
            let vip = crate::datapath::addr::frontend_addr(&key);
            if let Some(v) = args.vip
                && (vip.ip() != v.addr.ip() || (v.with_port && vip.port() != v.addr.port()))
            {
                continue;
            }
            if let Some(svc) = &args.service {
                let name = self.maps.name(value.svc_id)?.and_then(|n| n.parse::<ServicePortName>().ok());
                if name.is_none_or(|n| n.service != *svc) {
                    continue;
                }
            }
            ids.insert(value.svc_id);
        }
        Ok(ids)
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGINT, SIGTERM and SIGHUP end the trace (through the normal path, which turns the switches off).
fn on_signals_stop() -> anyhow::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    // No SA_RESTART: a signal interrupts poll(2) at once.
    let action = SigAction::new(SigHandler::Handler(stop), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

/// Nanoseconds to add to a `CLOCK_BOOTTIME` time to get Unix time.
fn boot_to_unix_ns() -> i128 {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i128::try_from(unix.as_nanos()).unwrap_or(0) - i128::from(crate::datapath::marks::boottime_ns())
}

/// `tierlb trace`: stream events to stdout until a signal; a summary goes to stderr.
pub fn run(args: &TraceArgs) -> anyhow::Result<()> {
    let mut sources = Vec::new();
    for (name, dir) in pins::instances(&args.bpffs, args.instance.as_deref())? {
        let ring = RingBuf::try_from(switch::open(&dir, MAP_TRACE_EVENTS)?)
            .map_err(|e| TraceError::map(MAP_TRACE_EVENTS, e))?;
        let maps = KernelMaps::open_pinned(&dir)?;
        let switch = Switch::take(&dir)?;
        sources.push(Source { name, ring, maps, switch, names: HashMap::new(), lost_before: 0 });
    }
    let selective = args.service.is_some() || args.vip.is_some();
    for s in &mut sources {
        if selective {
            let ids = s.selection(args)?;
            let left_out = s.switch.select(&ids)?;
            if left_out > 0 {
                eprintln!(
                    "warning: {}: {left_out} service ports beyond the first selected are not traced",
                    s.name
                );
            }
        }
        // Events a trace killed before it read them are still in the ring: dropped here (the switch is
        // off since `take`), not shown as this trace's.
        while s.ring.next().is_some() {}
        s.lost_before = s.lost();
        s.switch.start(if selective { TRACE_SELECTED } else { TRACE_ALL })?;
    }
    on_signals_stop()?;
    let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
    eprintln!("tierlb trace: tracing {} (stop with Ctrl-C)", names.join(", "));
    let root = args.cgroup_root.clone().or_else(|| crate::cgroup::cgroup2_mounts().into_iter().next());
    let mut resolver =
        pods::Resolver::new(root.unwrap_or_else(|| "/sys/fs/cgroup".into()), args.pod_logs.clone());
    let offset = boot_to_unix_ns();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.output.is_table() {
        writeln!(out, "{}", Line::header())?;
    }
    let (mut shown, mut refreshed) = (0u64, Instant::now());
    let result = loop {
        let done = STOP.load(Ordering::Relaxed);
        // Flushed per batch, so a reader (a pipe, a file a test reads) sees each event soon.
        let written = sources
            .iter_mut()
            .try_for_each(|s| drain(s, args, &mut resolver, offset, &mut out, &mut shown))
            .and_then(|()| Ok(out.flush()?));
        if let Err(e) = written {
            break Err(e);
        }
        if done {
            break Ok(());
        }
        if refreshed.elapsed() >= REFRESH_EVERY {
            refreshed = Instant::now();
            for s in &mut sources {
                s.switch.renew()?;
                s.names.clear();
                if selective {
                    let ids = s.selection(args)?;
                    s.switch.select(&ids)?;
                }
            }
        }
        let mut fds: Vec<_> = sources
            .iter()
            .map(|s| nix::poll::PollFd::new(s.ring.as_fd(), nix::poll::PollFlags::POLLIN))
            .collect();
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(250u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => break Err(e.into()),
        }
    };
    let lost: u64 = sources.iter().map(|s| s.lost().saturating_sub(s.lost_before)).sum();
    // Off before the summary (the switches turn off on an error too, when `sources` is dropped).
    drop(sources);
    eprintln!(
        "tierlb trace: {shown} events{}",
        if lost > 0 {
            format!(", {lost} missed (the ring buffer was full: this command fell behind or was stopped)")
        } else {
            String::new()
        }
    );
    match result {
        // A closed pipe (`| head`) ends the trace as a signal does.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Print the events queued in `s`'s ring buffer that pass the filters; `shown` counts them.
fn drain(
    s: &mut Source,
    args: &TraceArgs,
    resolver: &mut pods::Resolver,
    offset: i128,
    out: &mut impl std::io::Write,
    shown: &mut u64,
) -> anyhow::Result<()> {
    loop {
        // The record goes back to the kernel when `item` is dropped: copy it out first.
        let read = match s.ring.next() {
            Some(item) => bytemuck::try_pod_read_unaligned::<TraceEvent>(&item),
            None => break,
        };
        let Ok(e) = read else { continue };
        if let Some(v) = args.vip
            && !Line::is_for(&e, v.addr, v.with_port)
        {
            continue;
        }
        let client = resolver.client(e.cgroup_id, e.pid);
        if args.pod.as_ref().is_some_and(|p| client.pod.as_ref() != Some(p)) {
            continue;
        }
        let service = s.service(e.svc_id);
        let line = Line::new(&e, &s.name, offset + i128::from(e.time_ns), client, service);
        *shown += 1;
        match args.output {
            Output::Json => writeln!(out, "{}", serde_json::to_string(&line)?)?,
            // One document per event, as a YAML stream.
            Output::Yaml => write!(out, "---\n{}", crate::output::yaml(&line)?)?,
            Output::Table | Output::Wide => writeln!(out, "{}", line.row())?,
        }
    }
    Ok(())
}
