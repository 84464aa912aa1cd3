//! `tierlb-lab`: the lab tools behind `cargo xtask demo`, `cargo xtask bench` and the in-kernel tests.
//! `probe` connects to an address repeatedly and prints, as JSON, which backend answered each connect;
//! `abort` makes a tenant's own connect failures (local aborts, `IP_TTL=1`);
//! `dns` and `dns-stream` do the same for DNS over UDP; `churn` makes many short-lived sockets between a DNS
//! query and its reply; `flood` and `keep` are two pods sharing the node's reverse state; `load` is the
//! benchmark's load client; `bench`
//! runs the benchmark and `demo` the demo.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tierlb-lab", about = "tierlb lab tools: probe client and demo")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write the BPF object this binary embeds (the product's own, as `tierlb` loads it) to OUT: what the
    /// `tc_packets` fuzz target runs through `BPF_PROG_TEST_RUN`.
    BpfObject { out: PathBuf },
    /// A pod's backend: answer every HTTP GET with NAME (tierlb's HTTP server); prints
    /// `listening ADDR` once bound, runs until SIGTERM.
    Serve {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        name: String,
    },
    /// Connect repeatedly and report which backend answered (JSON on stdout).
    Probe {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 10)]
        count: usize,
        #[arg(long, default_value_t = 0.0)]
        interval_ms: f64,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// Start each request at its time on a thread of its own, whether the ones before it have ended or not
        /// (users who do not wait for each other); without it, one request at a time.
        #[arg(long)]
        open: bool,
    },
    /// `probe` of each target in turn (a JSON list of reports on stdout), a target given up after `--give-up`
    /// failed attempts in a row (a dropped connect costs the whole timeout each time).
    Spread {
        #[arg(long, required = true)]
        target: Vec<SocketAddr>,
        #[arg(long, default_value_t = 10)]
        count: usize,
        #[arg(long, default_value_t = 500)]
        timeout_ms: u64,
        #[arg(long, default_value_t = 3)]
        give_up: usize,
        /// Targets probed at once (each target's attempts stay one after another).
        #[arg(long, default_value_t = 1)]
        parallel: usize,
    },
    /// A tenant's own connect failures (JSON on stdout): COUNT non-blocking connects, with `--ttl` set if given,
    /// each shut down at once (`--end shutdown`) or waited for up to `--wait-ms` (`--end wait`).
    Abort {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 10)]
        count: usize,
        #[arg(long)]
        ttl: Option<u32>,
        #[arg(long, value_parser = ["shutdown", "wait"], default_value = "shutdown")]
        end: String,
        #[arg(long, default_value_t = 1500)]
        wait_ms: u64,
    },
    /// Resolve a name through a DNS server address (JSON on stdout): answer, reply source, getpeername.
    Dns {
        #[arg(long)]
        server: SocketAddr,
        #[arg(long, default_value = "cache.booking.svc.cluster.local")]
        name: String,
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// connect() the socket (else sendto/recvfrom on an unconnected socket).
        #[arg(long)]
        connected: bool,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// One long-lived connected UDP socket querying a DNS server address (JSON steps on stdout).
    DnsStream {
        #[arg(long)]
        server: SocketAddr,
        #[arg(long, default_value_t = 1000)]
        duration_ms: u64,
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        #[arg(long, default_value_t = 500)]
        timeout_ms: u64,
    },
    /// One process's socket churn through VIPs between a DNS query and its reply (JSON on stdout): does the
    /// reply still come from the VIP, does an early TCP socket's getpeername() still show the VIP?
    Churn {
        #[arg(long)]
        dns: Option<SocketAddr>,
        #[arg(long)]
        tcp: SocketAddr,
        #[arg(long, default_value_t = 0)]
        tcp_connects: usize,
        #[arg(long, default_value_t = 0)]
        udp_connects: usize,
        #[arg(long, default_value_t = 0)]
        udp_sends: usize,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// A pod churning the node's shared reverse state (`lb_testkit::tenant::flood`): TCP sockets that
    /// disconnect with AF_UNSPEC, one socket reconnecting, connected UDP sockets held until stdin closes.
    Flood {
        #[arg(long)]
        tcp: SocketAddr,
        #[arg(long, default_value_t = 0)]
        unspec_sockets: usize,
        #[arg(long, default_value_t = 0)]
        reconnects: usize,
        #[arg(long)]
        dns: Option<SocketAddr>,
        #[arg(long, default_value_t = 0)]
        udp_hold: usize,
        /// DNS servers (comma-separated) one unconnected UDP socket sends a query to, in turn.
        #[arg(long, value_delimiter = ',')]
        send_to: Vec<SocketAddr>,
    },
    /// Another pod's TCP connection and connected UDP socket, checked on each stdin line
    /// (`lb_testkit::tenant::keep`).
    Keep {
        #[arg(long)]
        tcp: SocketAddr,
        #[arg(long)]
        dns: SocketAddr,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// A pod's long-lived clients (`lb_testkit::hold`): TCP connections and connected UDP sockets held open,
    /// new connections streamed on a thread; each stdin line is answered with every socket's answer and the
    /// stream's tallies (JSON).
    Hold {
        #[arg(long, value_delimiter = ',')]
        tcp: Vec<SocketAddr>,
        #[arg(long, value_delimiter = ',')]
        udp: Vec<SocketAddr>,
        #[arg(long, value_delimiter = ',')]
        stream: Vec<SocketAddr>,
        #[arg(long, default_value_t = 5)]
        interval_ms: u64,
    },
    /// connect()+close() (or short request/response) load on N threads (JSON result on stdout).
    Load {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, value_enum, default_value = "connect")]
        mode: lb_lab::bench::LoadMode,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Hold the client's threads to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
        /// Run one `--seconds` slice per line read on stdin, printing each slice's result, until stdin
        /// closes.
        #[arg(long)]
        paced: bool,
    },
    /// The benchmark (see BENCHMARKS.md); with --report DIR writes DIR/BENCHMARKS.md and DIR/bench/latency-{connect,rr}.svg.
    Bench {
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        report: Option<PathBuf>,
        #[arg(long)]
        tierlb: Option<PathBuf>,
        /// Run the tierlb rows with `tierlb trace` consuming every decision (connect4's cost, tracing on).
        #[arg(long)]
        trace: bool,
        /// Only the agent's figures (start to ready, one edit, RSS) from each source (manifests, the API-server
        /// stand-in, the real kube-apiserver) at N Services x 10 endpoints, printed as measured: what
        /// deploy/README.md's sizing table is made of.
        #[arg(long, value_name = "N")]
        agent_only: Option<usize>,
        /// Only the on-node connect path at these Service counts (comma-separated): tierlb against direct
        /// in interleaved pairs of 0.2 s slices, printed as measured (for profiling, or comparing two builds
        /// of the data path).
        #[arg(long, value_name = "COUNTS", value_delimiter = ',', conflicts_with_all = ["agent_only", "report", "quick"])]
        on_node: Option<Vec<usize>>,
        /// Only real kube-proxy's rows at these Service counts (comma-separated): its syncs, and its connects
        /// against direct in interleaved pairs of 0.2 s slices, printed as measured.
        #[arg(long, value_name = "COUNTS", value_delimiter = ',', conflicts_with_all = ["agent_only", "report", "quick", "on_node"])]
        kube_proxy: Option<Vec<usize>>,
        /// Only the SNAT section from outside (node-2's pod through node-1's node ports, tierlb against real
        /// kube-proxy: connects, the packet rate, issue 63's three loads), printed as measured and as
        /// BENCHMARKS.md renders it; with --quick, shorter.
        #[arg(long, conflicts_with_all = ["agent_only", "report", "on_node", "kube_proxy"])]
        snat: bool,
        /// Only the XDP section from outside (node-2's pod through node-1's node port, tierlb's tc programs
        /// alone and with xdp_ingress in front: connects, the UDP packet rate, the programs' cost per packet),
        /// printed as measured and as BENCHMARKS.md renders it; with --quick, shorter.
        #[arg(long, conflicts_with_all = ["agent_only", "report", "on_node", "kube_proxy", "snat"])]
        xdp: bool,
        /// With --on-node or --kube-proxy, as many pairs of slices per Service count and operation as this many runs of
        /// --seconds would take (5 x 2 s: 50 pairs).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds of load per run with --on-node or --kube-proxy (see --rounds).
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// The demo: the booking form incident on the cluster in a box (a real control plane, real kube-proxy on
    /// three nodes, tierlb on three), or with --simulated on tierlb's own simulated nodes.
    Demo {
        /// The tierlb binary (default: next to this one).
        #[arg(long)]
        tierlb: Option<PathBuf>,
        /// The earlier demo: three simulated nodes whose EndpointSlices tierlb writes from its own emulation of
        /// the controller, kube-proxy's behaviour from a model; it adds DNS through a VIP and a pod crash
        /// caught by passive health, and needs no control plane.
        #[arg(long)]
        simulated: bool,
        /// Shorter steps and fewer requests, the same claims (the test's pace).
        #[arg(long)]
        quick: bool,
        /// Where to write the chart (demo-timeline.svg) and the data it is drawn from (demo-timeline.json).
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        /// Run nothing: redraw OUT_DIR/demo-timeline.svg from a run's recorded demo-timeline.json.
        #[arg(long, value_name = "JSON")]
        chart_from: Option<PathBuf>,
    },
}

/// `tierlb-lab serve`.
fn serve(listen: SocketAddr, name: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // The agent's backlog (4096, not tokio's 128): a client that connects faster than one thread accepts
        // in bursts (the tenant test's 100,000 connects in a row) overflows a short queue, and each dropped
        // SYN costs that client a 1 s retransmission.
        let listener = tierlb::server::listen(listen)?;
        let body = format!("{name}\n");
        // A pod's server is the backend of every test client: many clients share an address (a node's own
        // processes, and every outside client masqueraded to that node's address), so no per-client bound.
        let limits = tierlb::server::Limits { max_connections: 4096, per_client: 4096, ..Default::default() };
        let _server = tierlb::server::serve_with(listener, limits, move |_path| {
            let reply = tierlb::server::Response::text(200, &body);
            async move { reply }
        });
        let mut out = std::io::stdout();
        writeln!(out, "listening {listen}")?;
        out.flush()?;
        term.recv().await;
        Ok(())
    })
}

/// `tierlb-lab load`: one run, its result printed as JSON; with `paced`, one run per line read on stdin.
fn load(
    target: SocketAddr,
    mode: lb_lab::bench::LoadMode,
    threads: usize,
    cpu: Option<usize>,
    seconds: f64,
    paced: bool,
) -> ExitCode {
    let slice = Duration::from_secs_f64(seconds);
    let ran = if paced {
        lb_lab::bench::paced(target, threads, cpu, slice, mode)
    } else {
        lb_lab::bench::load(target, threads, cpu, slice, mode)
            .map(|r| println!("{}", serde_json::to_string(&r).expect("result serialises")))
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierlb-lab load: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `hold`: a pod's long-lived clients until stdin closes.
fn hold(tcp: &[SocketAddr], udp: &[SocketAddr], stream: &[SocketAddr], interval_ms: u64) -> ExitCode {
    match lb_testkit::hold::serve(tcp, udp, stream, Duration::from_millis(interval_ms)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierlb-lab hold: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    if matches!(command, Cmd::Bench { .. } | Cmd::Demo { chart_from: None, .. }) {
        interruptible();
    }
    // An interrupted run ends from the clean-up thread, with 128 + the signal, once its sandbox is removed.
    lb_testkit::interrupt::unless_interrupted(run(command))
}

/// What `command` does, and how it ended.
/// `bench --agent-only N`: whether every source gave its figures (each prints them as it ends).
fn every_source(tierlb: &Path, n: usize) -> bool {
    lb_lab::bench::agent_only(tierlb, n).len() == lb_lab::bench::AgentSource::ALL.len()
}

/// `tierlb-lab spread`: each target probed (`parallel` targets at a time, each target's attempts one after
/// another), the reports as a JSON list in the targets' order.
fn spread(
    targets: &[SocketAddr],
    count: usize,
    timeout_ms: u64,
    give_up: usize,
    parallel: usize,
) -> ExitCode {
    let timeout = Duration::from_millis(timeout_ms);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<lb_testkit::probe::Report>>> =
        targets.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..parallel.clamp(1, targets.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&t) = targets.get(i) else { break };
                    let r = lb_testkit::probe::spread(t, count, timeout, give_up);
                    *slots[i].lock().expect("slot lock") = Some(r);
                }
            });
        }
    });
    let reports: Vec<lb_testkit::probe::Report> =
        slots.into_iter().filter_map(|m| m.into_inner().expect("slot lock")).collect();
    println!("{}", serde_json::to_string(&reports).expect("reports serialise"));
    ExitCode::SUCCESS
}

/// `bpf-object OUT`: the embedded BPF object, written to OUT.
fn bpf_object(out: &Path) -> ExitCode {
    let Some(object) = tierlb::datapath::ebpf::embedded_object() else {
        eprintln!("tierlb-lab bpf-object: built without the BPF object (AYA_BUILD_SKIP)");
        return ExitCode::FAILURE;
    };
    match std::fs::write(out, object) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierlb-lab bpf-object: writing {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

fn run(command: Cmd) -> ExitCode {
    match command {
        Cmd::BpfObject { out } => bpf_object(&out),
        Cmd::Serve { listen, name } => match serve(listen, &name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tierlb-lab serve {listen}: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Probe { target, count, interval_ms, timeout_ms, open } => {
            let run = if open { lb_testkit::probe::run_open } else { lb_testkit::probe::run };
            let r = run(
                target,
                count,
                Duration::from_secs_f64(interval_ms / 1e3),
                Duration::from_millis(timeout_ms),
            );
            println!("{}", serde_json::to_string(&r).expect("report serialises"));
            ExitCode::SUCCESS
        }
        Cmd::Spread { target, count, timeout_ms, give_up, parallel } => {
            spread(&target, count, timeout_ms, give_up, parallel)
        }
        Cmd::Abort { target, count, ttl, end, wait_ms } => abort(target, count, ttl, &end, wait_ms),
        Cmd::Dns { server, name, count, connected, timeout_ms } => {
            let r =
                lb_testkit::dns::resolve(server, &name, count, connected, Duration::from_millis(timeout_ms));
            println!("{}", serde_json::to_string(&r).expect("lookups serialise"));
            ExitCode::SUCCESS
        }
        Cmd::DnsStream { server, duration_ms, interval_ms, timeout_ms } => {
            let r = lb_testkit::dns::stream(
                server,
                Duration::from_millis(duration_ms),
                Duration::from_millis(interval_ms),
                Duration::from_millis(timeout_ms),
            );
            println!("{}", serde_json::to_string(&r).expect("steps serialise"));
            ExitCode::SUCCESS
        }
        Cmd::Churn { dns, tcp, tcp_connects, udp_connects, udp_sends, timeout_ms } => {
            let plan = lb_testkit::churn::Plan {
                dns,
                tcp,
                tcp_connects,
                udp_connects,
                udp_sends,
                timeout: Duration::from_millis(timeout_ms),
            };
            let r = lb_testkit::churn::run(&plan);
            println!("{}", serde_json::to_string(&r).expect("outcome serialises"));
            ExitCode::SUCCESS
        }
        Cmd::Flood { tcp, unspec_sockets, reconnects, dns, udp_hold, send_to } => {
            lb_testkit::tenant::flood(&lb_testkit::tenant::FloodPlan {
                tcp,
                unspec_sockets,
                reconnects,
                dns,
                udp_hold,
                send_to,
            });
            ExitCode::SUCCESS
        }
        Cmd::Keep { tcp, dns, timeout_ms } => keep(tcp, dns, timeout_ms),
        Cmd::Hold { tcp, udp, stream, interval_ms } => hold(&tcp, &udp, &stream, interval_ms),
        Cmd::Load { target, mode, threads, seconds, cpu, paced } => {
            load(target, mode, threads, cpu, seconds, paced)
        }
        bench @ Cmd::Bench { .. } => bench_cmd(bench),
        Cmd::Demo { chart_from: Some(json), out_dir, .. } => match lb_lab::demo::redraw(&json, &out_dir) {
            Ok(svg) => {
                println!("{}", svg.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tierlb-lab demo: error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Cmd::Demo { tierlb, out_dir, chart_from: None, simulated, quick } => {
            let me = std::env::current_exe().expect("own path");
            let tierlb = tierlb.unwrap_or_else(|| me.with_file_name("tierlb"));
            let pace = if quick { lb_lab::demo::Pace::QUICK } else { lb_lab::demo::Pace::FULL };
            let ran = if simulated {
                lb_lab::demo::run(&tierlb, &me, &out_dir)
            } else {
                lb_lab::demo::run_real(&tierlb, &me, &out_dir, pace)
            };
            match ran {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("tierlb-lab demo: error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// An interrupted run (Ctrl-C, SIGTERM, SIGHUP) removes its namespaces, cgroups and mounts before it exits
/// (`lb_testkit::interrupt`).
fn interruptible() {
    if let Err(e) = lb_testkit::interrupt::clean_up_on_signals() {
        eprintln!(
            "tierlb-lab: warning: no clean-up on interruption ({e:#}): an interrupted run leaves its sandbox"
        );
    }
}

/// `tierlb-lab bench`.
fn bench(me: &Path, tierlb: &Path, quick: bool, report: Option<PathBuf>, trace: bool) -> ExitCode {
    match lb_lab::bench::run(me, tierlb, quick, trace) {
        Ok(r) => {
            let md = lb_lab::bench::markdown(&r);
            print!("{md}");
            if let Some(dir) = report
                && let Err(e) = write_report(&dir, &r, &md)
            {
                eprintln!("tierlb-lab bench: writing the report: {e:#}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tierlb-lab bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `tierlb-lab bench` with its flags.
fn bench_cmd(command: Cmd) -> ExitCode {
    let Cmd::Bench {
        quick,
        report,
        tierlb,
        trace,
        agent_only,
        on_node,
        kube_proxy,
        snat,
        xdp,
        rounds,
        seconds,
    } = command
    else {
        return ExitCode::FAILURE;
    };
    let me = std::env::current_exe().expect("own path");
    let tierlb = tierlb.unwrap_or_else(|| me.with_file_name("tierlb"));
    if let Some(counts) = kube_proxy {
        return done(lb_lab::bench::kube_proxy_only(&me, &counts, rounds, seconds));
    }
    if snat {
        return done(lb_lab::bench::snat_only(&me, quick));
    }
    if xdp {
        return done(lb_lab::bench::xdp_only(&me, quick));
    }
    match (on_node, agent_only) {
        (Some(counts), _) => on_node_only(&me, &tierlb, &counts, rounds, seconds),
        // Each run prints its figures as it ends; a source that fails says why.
        (None, Some(n)) if every_source(&tierlb, n) => ExitCode::SUCCESS,
        (None, Some(_)) => ExitCode::FAILURE,
        (None, None) => bench(&me, &tierlb, quick, report, trace),
    }
}

/// `tierlb-lab bench --on-node COUNTS`.
fn on_node_only(me: &Path, tierlb: &Path, counts: &[usize], rounds: usize, seconds: f64) -> ExitCode {
    done(lb_lab::bench::on_node_only(me, tierlb, counts, rounds, seconds))
}

/// A bench run's exit: its error said.
fn done(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierlb-lab bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `tierlb-lab abort`.
fn abort(target: SocketAddr, count: usize, ttl: Option<u32>, end: &str, wait_ms: u64) -> ExitCode {
    let end = if end == "wait" { lb_testkit::abort::End::Wait } else { lb_testkit::abort::End::Shutdown };
    let r = lb_testkit::abort::run(target, count, ttl, end, Duration::from_millis(wait_ms));
    println!("{}", serde_json::to_string(&r).expect("outcomes serialise"));
    ExitCode::SUCCESS
}

/// DIR/BENCHMARKS.md and its charts, DIR/bench/*.svg.
fn write_report(dir: &Path, r: &lb_lab::bench::Report, md: &str) -> anyhow::Result<()> {
    let charts = lb_lab::bench::charts(r)?;
    std::fs::create_dir_all(dir.join("bench"))?;
    for (name, svg) in charts {
        std::fs::write(dir.join("bench").join(name), svg)?;
    }
    std::fs::write(dir.join("BENCHMARKS.md"), md)?;
    Ok(())
}

fn keep(tcp: SocketAddr, dns: SocketAddr, timeout_ms: u64) -> ExitCode {
    match lb_testkit::tenant::keep(tcp, dns, Duration::from_millis(timeout_ms)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keep: {e}");
            ExitCode::FAILURE
        }
    }
}
