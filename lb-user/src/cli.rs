//! Command line: `tierlb agent | plan | explain | study | status | backend | trace` (clap), and the one-shot
//! commands' bodies. The agent itself lives in `agent`; this module only maps flags to its options.
use std::{fmt::Write as _, net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use crate::{
    datapath::{
        MapWriter as _,
        pins::{self, DEFAULT_BPFFS},
    },
    model::{NodeInfo, Protocol},
    output::Output,
};

mod cluster_lint;
mod config;
mod generate;
mod input;
mod plan;
mod study;
mod table;
pub use cluster_lint::{EXIT_FINDINGS, LintArgs, LintOutput, lint_on, run_lint};
pub use config::expand_config;
pub use generate::{CompletionArgs, ManArgs, run_completion, run_man};
pub use input::{CliInput, FaceSource, KUBE_TIMEOUT, kube_input, load_for_cli};
pub use plan::{
    EXIT_INVALID_INPUT, ExplainArgs, PlanArgs, PlanOutput, explain_on, plan_on, run_explain, run_plan,
};
pub use study::{StudyArgs, run_study, study_on};
pub use table::{TableNotes, all_nodes_table, plan_table};

pub use crate::output::error_text;

/// `tierlb --version`: the release, the commit it was built from, and the pinned maps' layout number
/// (`0.2.0 (commit 0123abcd..., map layout 2)`).
pub fn version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{} (commit {}, map layout {})",
            env!("CARGO_PKG_VERSION"),
            env!("TIERLB_GIT_COMMIT"),
            crate::datapath::MAP_LAYOUT
        )
    })
}

/// `tierlb`'s command line.
#[derive(Parser, Debug)]
#[command(
    name = "tierlb",
    // The commit comes from build.rs ("unknown" for a build outside git); the image's tags name both.
    version = version(),
    about = "Topology-aware eBPF socket load balancer for Kubernetes Services",
    long_about = None
)]
pub struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parse an argv (for tests of the deploy manifests).
    pub fn try_parse_from_args(argv: &[String]) -> Result<Self, clap::Error> {
        <Self as Parser>::try_parse_from(argv)
    }
}

/// How the agent logs.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the node agent: load the BPF programs, attach them to a cgroup and keep the maps in sync.
    Agent(AgentArgs),
    /// Print which endpoints every Service port uses on a node, tier by tier (no BPF, no root).
    #[command(
        after_help = "Exit status: 0 planned; 1 the source cannot be read; 2 usage error; 3 the plan of the \
                      valid objects printed, but some input is invalid (errors on stderr)."
    )]
    Plan(PlanArgs),
    /// Explain, in plain words, which tier a Service uses on a node and why, with lints.
    Explain(ExplainArgs),
    /// Check every Service across the cluster for topology pitfalls and the plan's lints, naming the nodes
    /// each finding concerns (exit status 1 when something is found).
    #[command(
        after_help = "Exit status: 0 no findings; 1 findings; 2 usage error; 3 input not read whole (a file \
                      that does not parse, an invalid object, no Service: never a pass)."
    )]
    Lint(LintArgs),
    /// Compare how kube-proxy, tierlb and other proxy models route a scenario's cluster.
    Study(StudyArgs),
    /// What is in the maps of running agents now: Services, tiers, live backends and counters.
    Status(StatusArgs),
    /// Mark a backend down for a while (new connects skip it at once and fall back to the next tier) or up
    /// again.
    Backend(BackendArgs),
    /// Stream every translation decision of running agents from the kernel, one event per connect or
    /// sendmsg to a Service VIP: who asked, which backend and tier it got and why, or why it was refused.
    Trace(crate::trace::TraceArgs),
    /// Check whether this node can run the agent: the kernel and the features the programs use (they are
    /// verified), cgroup v2, bpffs, capabilities, and what else translates here (kube-proxy's rules,
    /// another tierlb, Cilium's or Calico's programs).
    Preflight(crate::preflight::PreflightArgs),
    /// Print a shell completion script (as `kubectl completion`): `source <(tierlb completion bash)`.
    Completion(CompletionArgs),
    /// Print the man page of tierlb or of one of its commands, in roff: `tierlb man plan | man -l -`.
    Man(ManArgs),
}

/// The node a command plans for.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// The node's name (matches EndpointSlice `nodeName` and `hints.forNodes`).
    #[arg(long, visible_alias = "hostname-override")]
    pub node: String,
    /// Its zone and addresses.
    #[command(flatten)]
    pub site: NodeSite,
}

/// What a node is besides its name: its zone and the addresses it translates.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeSite {
    /// The node's zone; default: the Node object's topology.kubernetes.io/zone label in the source.
    #[arg(long)]
    pub zone: Option<String>,
    /// Where NodePorts are translated, kube-proxy's flag: comma-separated CIDRs selecting among this host's
    /// interface addresses (a family with no CIDR: all of its addresses), or `primary` (the node's first
    /// InternalIP per family). Default: the InternalIP and ExternalIP addresses of the Node object.
    #[arg(long, value_name = "CIDRS|primary")]
    pub nodeport_addresses: Option<crate::model::node_addresses::NodePortAddresses>,
    /// Translate only the externalIPs inside these comma-separated CIDRs (the others are listed as not
    /// translated); default: every externalIP, as kube-proxy.
    #[arg(long, value_name = "CIDRS")]
    pub external_ip_cidrs: Option<crate::model::node_addresses::CidrList>,
    /// An address no Service frontend may take (repeat for more): a load-balancer IP, externalIP or node
    /// port there is not translated. With --kube the agent adds the API server's address(es) itself.
    #[arg(long = "protect-address", value_name = "IP:PORT")]
    pub protect_addresses: Vec<SocketAddr>,
}

impl NodeArgs {
    /// The external address settings the flags ask for.
    pub fn external(&self) -> crate::model::node_addresses::ExternalConfig {
        self.site.external()
    }

    /// The node to plan for, from the flags and the model (`NodeSite::resolve`).
    pub fn resolve(&self, model: &crate::model::Model) -> NodeInfo {
        self.site.resolve(&self.node, model)
    }
}

impl NodeSite {
    /// The external address settings the flags ask for.
    pub fn external(&self) -> crate::model::node_addresses::ExternalConfig {
        crate::model::node_addresses::ExternalConfig {
            node_port_addresses: self.nodeport_addresses.clone().unwrap_or_default(),
            external_ip_cidrs: self.external_ip_cidrs.clone().map(|l| l.0),
            protected: self.protect_addresses.clone(),
        }
    }

    /// Node `name` to plan for, from the flags and the model. With no Node object of that name (a dump
    /// without Nodes, `--kube` without the right to list them) and no `--zone`, the zone its endpoints carry.
    pub fn resolve(&self, name: &str, model: &crate::model::Model) -> NodeInfo {
        let mut zone = self.zone.clone();
        if zone.is_none() && !model.nodes.contains_key(name) {
            zone = model
                .slices
                .values()
                .flat_map(|s| &s.endpoints)
                .find(|e| e.node_name.as_deref() == Some(name) && e.zone.is_some())
                .and_then(|e| e.zone.as_deref().map(str::to_owned));
            if let Some(z) = &zone {
                eprintln!(
                    "note: no Node {name} in the source: zone {z} taken from its endpoints (--zone sets it)"
                );
            }
        }
        NodeInfo::resolve_with(name, zone.as_deref(), model, &self.external())
    }
}

/// `tierlb agent`. A flag given twice takes its last value, so the command line overrides `--config`.
#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
pub struct AgentArgs {
    /// A YAML file of flags, read before the command line's (which win): each key a flag's long name or
    /// alias without `--` (`node: node-1`, `kube: true`, `protect-address: [192.0.2.1:443]`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The node it runs for.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Directory of Service, EndpointSlice and Node YAML; reloaded on change.
    #[arg(long, required_unless_present_any = ["cleanup", "kube"], conflicts_with = "kube")]
    pub manifests: Option<PathBuf>,
    /// Watch the API server (in-cluster service account, or KUBECONFIG) for Services, EndpointSlices and this
    /// node's Node.
    #[arg(long)]
    pub kube: bool,
    /// With --kube: how long the API server keeps each watch open before ending it (the agent then resumes
    /// it from the last resourceVersion it saw, without listing again). Like kube-proxy's informers, each
    /// watch asks for a time between this and twice this (chosen per node and kind), so that the nodes'
    /// watches do not all end and come back at once.
    #[arg(long, default_value = "5m", value_parser = parse_watch_timeout, requires = "kube")]
    pub watch_timeout: std::time::Duration,
    /// cgroup2 directory whose processes get the translation; default: the cgroup2 root (needs
    /// --allow-root-cgroup).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// Allow attaching to a cgroup2 root (what a real node wants: every pod is below it).
    #[arg(long)]
    pub allow_root_cgroup: bool,
    /// A bpffs directory: maps and program links are pinned in DIR/<instance>, survive a restart of the agent
    /// (the next agent adopts them) and are reachable by `tierlb status` and `tierlb backend`.
    #[arg(long, env = pins::BPFFS_ENV)]
    pub bpffs: Option<PathBuf>,
    /// Pin directory name under --bpffs; default: the node name.
    #[arg(long)]
    pub instance: Option<String>,
    /// kube-proxy-compatible /healthz and /livez: IP:PORT or `off`.
    #[arg(long, visible_alias = "healthz-bind-address", default_value = "0.0.0.0:10256")]
    pub healthz_addr: crate::server::Listen,
    /// Prometheus /metrics: IP:PORT or `off`. Loopback by default, like kube-proxy's metrics address: the
    /// metrics name every Service, its VIP and this node's counters, so exposing them beyond the node is a
    /// choice (pass `0.0.0.0:10249`).
    #[arg(long, visible_alias = "metrics-bind-address", default_value = "127.0.0.1:10249")]
    pub metrics_addr: crate::server::Listen,
    /// Address for the healthCheckNodePort listeners (one per Service with externalTrafficPolicy Local), or
    /// `off`.
    #[arg(long, default_value = "0.0.0.0")]
    pub service_health_bind: crate::server::BindIp,
    /// A proc root to search for pods' network namespaces (socket destruction), after the runtimes'
    /// /run/netns: the host's /proc if it is mounted elsewhere, or `off`.
    #[arg(long, default_value = "/proc")]
    pub host_proc: String,
    /// Detach this instance's programs and remove its pinned maps, then exit (needs --bpffs).
    #[arg(long, requires = "bpffs")]
    pub cleanup: bool,
    /// Capacity: frontends (VIP, port, protocol).
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_FRONTENDS)]
    pub max_services: u32,
    /// Capacity: entries of the slot map over all frontends and generations, 8 backend slots each (a frontend
    /// with n slots over its tiers takes n/8 rounded up; the map is not preallocated); also the member
    /// entries of sessionAffinity frontends (one per distinct backend per frontend).
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_SLOTS)]
    pub max_slots: u32,
    /// Capacity: backends that can be marked down.
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_BACKENDS)]
    pub max_backends: u32,
    /// Capacity: reverse entries (socket, backend) -> VIP of unconnected UDP sends and of TCP sockets whose
    /// slot of the TCP array another open socket holds (an LRU: oldest go first; other TCP sockets keep theirs
    /// in their slot, connected UDP sockets in socket storage), and connected UDP sockets registered for
    /// destruction.
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_REVERSE)]
    pub max_reverse: u32,
    /// Capacity: sessionAffinity entries (frontend, client network namespace) remembered at once (an LRU:
    /// beyond it the least recently used client is balanced anew on its next connect).
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_AFFINITY)]
    pub max_affinity: u32,
    /// Capacity: conntrack entries of established TCP flows from outside the node (an LRU, two entries per
    /// flow; 168 bytes each as the kernel accounts them, preallocated: the default is 21 MiB). Beyond it the
    /// least recently used established flow is forgotten.
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_CONNTRACK)]
    pub max_conntrack: u32,
    /// Capacity: conntrack entries of half-open TCP flows (SYN seen, handshake not complete; an LRU of its own,
    /// so a SYN flood evicts only half-open flows).
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_CONNTRACK_SYN)]
    pub max_conntrack_syn: u32,
    /// Capacity: conntrack entries of UDP flows (an LRU of its own, so a flood of UDP flows evicts only UDP
    /// flows).
    #[arg(long, default_value_t = lb_common::DEFAULT_MAX_CONNTRACK_UDP)]
    pub max_conntrack_udp: u32,
    /// Per Service: frontends (VIP or node address, port, protocol) one Service may have; a Service with more
    /// keeps what it has programmed (nothing if new) and is reported unprogrammed.
    #[arg(long, default_value_t = crate::agent::DEFAULT_LIMITS.frontends)]
    pub max_frontends_per_service: usize,
    /// Per Service: backend slots one Service may take over its frontends' tiers (at the default, at most
    /// about 20,000 entries of the slot map).
    #[arg(long, default_value_t = crate::agent::DEFAULT_LIMITS.slots)]
    pub max_slots_per_service: usize,
    /// Per Service: `spec.externalIPs` one Service may have.
    #[arg(long, default_value_t = crate::agent::DEFAULT_LIMITS.external_ips)]
    pub max_external_ips_per_service: usize,
    /// Per Service: endpoints one Service may have over its EndpointSlices.
    #[arg(long, default_value_t = crate::agent::DEFAULT_LIMITS.endpoints)]
    pub max_endpoints_per_service: usize,
    /// The devices whose traffic from outside the node is translated (NodePorts, load-balancer IPs,
    /// externalIPs), comma-separated; default: the devices holding the node's NodePort addresses
    /// (`--nodeport-addresses`, else the Node's InternalIP/ExternalIP), looked for again on every sync and
    /// every 2 s. The egress program alone goes on every other device with a global address (Ethernet, or
    /// L3: WireGuard, tun, IPIP), so replies are translated wherever they leave.
    /// `none`: translate no traffic from outside.
    #[arg(long, value_delimiter = ',', value_name = "IFACE[,IFACE]")]
    pub devices: Option<Vec<String>>,
    /// The cluster's NodePort range (kube-apiserver's `--service-node-port-range`): the ports the SNAT path
    /// leaves out of its source ports (1024-65535 less this range and the node's ephemeral range), so a
    /// pod's connection to another node's node port is never taken for the reply of an SNAT flow.
    #[arg(long, default_value = "30000-32767", value_name = "LO-HI", value_parser = parse_port_range)]
    pub service_node_port_range: (u16, u16),
    /// How the tc programs are attached to the devices: `auto` (tcx links from kernel 6.6, netlink filters on
    /// a clsact qdisc below), or `tcx` or `netlink` forced. Netlink filters sit at priority 65000, handle 1:
    /// a restarted agent replaces its filter in place; `--cleanup` removes them from every device.
    #[arg(long, value_enum, default_value_t = crate::datapath::tc::AttachMode::Auto)]
    pub tc_attach: crate::datapath::tc::AttachMode,
    /// Where traffic from outside the node is translated first: `xdp_ingress` on the NodePort devices, before
    /// the kernel builds an skb (tracked and new flows to backends on other nodes, sent back out with
    /// XDP_TX or XDP_REDIRECT), handing tc everything else (local backends, ICMP, fragments). `auto`: in the
    /// driver where it has XDP, except on a veth (whose peer needs an XDP program of its own for XDP_TX: say
    /// `native` when it has); `native`; `generic` (in the stack's receive path, any device); `off` (tc alone).
    /// Its links stay pinned when the agent stops; the next agent swaps its program in (no driver
    /// reconfiguration); `off` removes them, as `--cleanup` does.
    #[arg(long, value_enum, default_value_t = crate::datapath::xdp::XdpSetting::Auto)]
    pub xdp: crate::datapath::xdp::XdpSetting,
    /// How a new flow from outside the node gets its backend within the tier the tiers choose: `random`
    /// (kube-proxy's rule), or `maglev` (the flow's hash in a Maglev table of 16,381 entries per tier, the
    /// same on every node holding the same backends: a flow an ECMP router moves to another node keeps its
    /// backend). Connects on the node are always random.
    #[arg(long, value_enum, default_value_t = crate::agent::LbAlgorithm::Random)]
    pub lb_algorithm: crate::agent::LbAlgorithm,
    /// Direct server return for traffic from outside the node (Cilium's `bpf-lb-mode=dsr` with the `opt`
    /// dispatch): a new IPv4 flow to a backend on another node (externalTrafficPolicy Cluster) keeps the
    /// client's address and carries its frontend to the backend's node in an 8-byte IPv4 option, whose agent
    /// (also `--dsr`) gives the backend's reply the frontend's address: the reply goes to the client from
    /// there, never back through this node. The network must let a packet with an IP option between the
    /// nodes, and one from a Service address leave the backend's node. IPv6 flows, and a first UDP datagram
    /// with no room for the option, take SNAT (counted as `dsr_snat`).
    #[arg(long)]
    pub dsr: bool,
    /// Passive health: consecutive failed connects (refused or unreachable, or the SYN unanswered for its
    /// first retransmission timeout) after which the kernel holds a backend down; 0 turns passive health off.
    #[arg(long, default_value_t = 3)]
    pub health_failures: u32,
    /// Passive health: distinct clients (network namespaces) among those failures that a hold needs; 2 (the
    /// default) keeps one pod's own failures from holding a backend for every pod, 1 is the per-node rule.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub health_clients: u32,
    /// Passive health: the first hold (then doubled per hold without a success in between).
    #[arg(long, default_value = "5s", value_parser = crate::datapath::health::parse_hold)]
    pub health_hold: std::time::Duration,
    /// Passive health: the longest hold.
    #[arg(long, default_value = "2m", value_parser = crate::datapath::health::parse_hold)]
    pub health_max_hold: std::time::Duration,
}

/// `--service-node-port-range`: `LO-HI`, as kube-apiserver takes it (`LO+N` is not taken).
fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (lo, hi) = s.split_once('-').ok_or_else(|| format!("{s:?}: expected LO-HI, such as 30000-32767"))?;
    let port = |p: &str| p.trim().parse::<u16>().map_err(|e| format!("{s:?}: {p:?} is not a port ({e})"));
    let (lo, hi) = (port(lo)?, port(hi)?);
    if lo == 0 || lo > hi {
        return Err(format!("{s:?}: the range must start above 0 and end at or after its start"));
    }
    Ok((lo, hi))
}

/// `--watch-timeout`: a duration of at least a second (the API server counts whole seconds).
fn parse_watch_timeout(s: &str) -> Result<std::time::Duration, String> {
    let d = crate::datapath::marks::parse_span(s)?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("{s:?}: a watch must be allowed at least 1s (the API server counts seconds)"));
    }
    Ok(d)
}

impl AgentArgs {
    /// The agent's options from its flags.
    pub fn options(&self) -> crate::agent::AgentOptions {
        crate::agent::AgentOptions {
            node: self.node.node.clone(),
            zone: self.node.site.zone.clone(),
            external: self.node.external(),
            source: match &self.manifests {
                Some(dir) => crate::agent::Source::Manifests(dir.clone()),
                None => crate::agent::Source::Kube,
            },
            watch_timeout: self.watch_timeout,
            cgroup: self.cgroup.clone(),
            allow_root_cgroup: self.allow_root_cgroup,
            bpffs: self.bpffs.clone(),
            instance: self.instance.clone(),
            healthz_addr: self.healthz_addr.0,
            metrics_addr: self.metrics_addr.0,
            service_health_bind: self.service_health_bind.0,
            host_proc: (self.host_proc != "off").then(|| PathBuf::from(&self.host_proc)),
            capacities: crate::datapath::ebpf::Capacities {
                services: self.max_services,
                slots: self.max_slots,
                backends: self.max_backends,
                reverse: self.max_reverse,
                affinity: self.max_affinity,
                conntrack: self.max_conntrack,
                conntrack_syn: self.max_conntrack_syn,
                conntrack_udp: self.max_conntrack_udp,
            },
            limits: crate::agent::ServiceLimits {
                frontends: self.max_frontends_per_service,
                slots: self.max_slots_per_service,
                external_ips: self.max_external_ips_per_service,
                endpoints: self.max_endpoints_per_service,
            },
            devices: self.devices.clone(),
            node_port_range: self.service_node_port_range,
            lb_algorithm: self.lb_algorithm,
            dsr: self.dsr,
            health: crate::datapath::health::HealthSettings {
                failures: self.health_failures,
                hold: self.health_hold,
                max_hold: self.health_max_hold,
                clients: self.health_clients,
            },
        }
    }
}

/// `tierlb backend`.
#[derive(clap::Args, Debug)]
pub struct BackendArgs {
    /// Down (skipped by new connects) or up again.
    #[arg(value_enum)]
    pub state: BackendState,
    /// The backend, IP:PORT (IPv6 as [ADDR]:PORT).
    pub backend: SocketAddr,
    /// The backend's protocol.
    #[arg(long, default_value = "TCP", value_parser = parse_protocol)]
    pub protocol: Protocol,
    /// How long a `down` mark lasts (as 90s, 10m, 1h30m; at most 24h); then the backend is used again. The
    /// agent also clears a mark as soon as the backend leaves every Service. Default: 10m.
    #[arg(long = "for", value_parser = crate::datapath::marks::parse_duration)]
    pub for_: Option<std::time::Duration>,
    /// The agents' --bpffs directory.
    #[arg(long, env = pins::BPFFS_ENV, default_value = DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
    /// Only this agent instance (default: every instance under --bpffs).
    #[arg(long)]
    pub instance: Option<String>,
}

/// `tierlb status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The agents' --bpffs directory.
    #[arg(long, env = pins::BPFFS_ENV, default_value = DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
    /// Only this agent instance (default: every instance under --bpffs).
    #[arg(long)]
    pub instance: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// What `tierlb backend` sets.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum BackendState {
    /// Marked down for a while (`--for`): new connects skip it and fall back to the next live backend.
    Down,
    /// Up again.
    Up,
}

fn parse_protocol(s: &str) -> Result<Protocol, String> {
    Protocol::parse(&s.to_ascii_uppercase())
        .ok_or_else(|| format!("unknown protocol {s:?} (TCP, UDP or SCTP)"))
}

/// `tierlb agent --cleanup`: detach the instance's programs and remove its maps.
pub fn run_cleanup(bpffs: &std::path::Path, instance: &str) -> anyhow::Result<String> {
    let dir = pins::instance_dir(bpffs, instance);
    let removed = pins::cleanup(bpffs, instance)?;
    Ok(if removed.is_empty() {
        format!("nothing pinned in {}\n", dir.display())
    } else {
        format!("removed {} pins in {} (programs detached, maps freed)\n", removed.len(), dir.display())
    })
}

/// `tierlb backend`: mark a backend down (for `--for`) or up in every matching agent instance whose Services
/// hold it (and, when down, end the connected UDP sockets to it).
pub fn run_backend(args: &BackendArgs) -> anyhow::Result<String> {
    use crate::datapath::marks;
    let b = crate::datapath::addr::backend(args.backend, args.protocol.number());
    let what = format!("backend {} {}", args.backend, args.protocol.as_str());
    let mut out = String::new();
    let length = match (args.state, args.for_) {
        (BackendState::Up, Some(_)) => {
            anyhow::bail!("--for applies to `backend down` only: `up` ends a mark now")
        }
        (BackendState::Up, None) => None,
        (BackendState::Down, length) => Some(length.unwrap_or(marks::DEFAULT_MARK)),
    };
    let mut marked = 0;
    for (name, dir) in pins::instances(&args.bpffs, args.instance.as_deref())? {
        let mut maps = crate::datapath::ebpf::KernelMaps::open_pinned(&dir)?;
        let Some(length) = length else {
            maps.delete_backend_mark(b)?;
            let _ = writeln!(out, "{name}: {what} marked up");
            continue;
        };
        // A mark on an address no Service holds would change nothing, and the agent's sweep deletes it.
        let held =
            crate::datapath::read_back(&maps)?.values().any(|rb| rb.tiers.iter().flatten().any(|x| *x == b));
        if !held {
            let _ = writeln!(out, "{name}: {what} is in none of its Services: not marked");
            continue;
        }
        marks::mark_down(&mut maps, b, length, marks::boottime_ns())?;
        marked += 1;
        let _ = writeln!(out, "{name}: {what} marked down for {}", marks::human(length));
        // Connected UDP sockets to it would keep sending there: end them, they reconnect through the VIP.
        let finder = crate::datapath::destroy::NetnsFinder::default();
        let r = crate::datapath::destroy::destroy_udp_sockets(&mut maps, &finder, |_, x| *x == b);
        if r.destroyed > 0 {
            let _ = writeln!(out, "{name}: destroyed {} connected UDP sockets to it", r.destroyed);
        }
        for e in r.errors {
            eprintln!("warning: {e}");
        }
    }
    anyhow::ensure!(
        length.is_none() || marked > 0,
        "{what} is in no Service of any agent under {} (check the address, the port and --protocol): nothing \
         marked",
        args.bpffs.display()
    );
    Ok(out)
}

/// `tierlb status`: every matching agent instance's maps, as a table or JSON.
pub fn run_status(args: &StatusArgs) -> anyhow::Result<String> {
    let mut all = Vec::new();
    for (name, dir) in pins::instances(&args.bpffs, args.instance.as_deref())? {
        let maps = crate::datapath::ebpf::KernelMaps::open_pinned(&dir)?;
        let now = crate::datapath::marks::boottime_ns();
        let mut inst = crate::status::Instance::read(&name, &maps, now)?;
        inst.north_south = crate::status::NorthSouthStatus::read(&dir, now);
        all.push(inst);
    }
    args.output
        .render(&all, |_| all.iter().map(crate::status::Instance::table).collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn service_node_port_range_is_read_as_kube_apiserver_writes_it() {
        let cases = [
            ("30000-32767", Ok((30000, 32767))),
            ("20000-20000", Ok((20000, 20000))),
            (" 1024 - 2047 ", Ok((1024, 2047))),
            ("30000+2767", Err("expected LO-HI")),
            ("32767-30000", Err("end at or after its start")),
            ("0-100", Err("start above 0")),
            ("30000-70000", Err("is not a port")),
        ];
        for (given, want) in cases {
            let got = super::parse_port_range(given);
            match want {
                Ok(range) => assert_eq!(got, Ok(range), "{given}"),
                Err(text) => assert!(got.as_ref().is_err_and(|e| e.contains(text)), "{given}: {got:?}"),
            }
        }
    }
}
