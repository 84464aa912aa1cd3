//! `tierlb agent`'s options, as the command line (`cli::AgentArgs::options`) gives them to `run`.
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use crate::datapath::ebpf::Capacities;

/// Where the agent reads Services, EndpointSlices and Nodes.
#[derive(Debug, Clone)]
pub enum Source {
    /// A directory of YAML, reloaded on change (inotify).
    Manifests(PathBuf),
    /// The API server: in-cluster configuration or KUBECONFIG.
    Kube,
}

/// `tierlb agent` options.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// This node's name (EndpointSlice `nodeName`, `hints.forNodes`).
    pub node: String,
    /// This node's zone; `None`: the Node object's label.
    pub zone: Option<String>,
    /// `--nodeport-addresses` and `--external-ip-cidrs`.
    pub external: crate::model::node_addresses::ExternalConfig,
    /// Where Services, EndpointSlices and Nodes come from.
    pub source: Source,
    /// With `Source::Kube`: the shortest time a watch stays open (`--watch-timeout`).
    pub watch_timeout: Duration,
    /// The cgroup2 directory to attach to; `None`: the cgroup2 root.
    pub cgroup: Option<PathBuf>,
    /// Allow attaching to a cgroup2 root.
    pub allow_root_cgroup: bool,
    /// A bpffs directory to pin maps and links under; `None`: nothing pinned (detached on exit).
    pub bpffs: Option<PathBuf>,
    /// Name of the pin directory under `bpffs`; default: the node name.
    pub instance: Option<String>,
    /// Map capacities.
    pub capacities: Capacities,
    /// What one Service may take (`--max-*-per-service`).
    pub limits: super::ServiceLimits,
    /// `/healthz` and `/livez`; `None`: off.
    pub healthz_addr: Option<SocketAddr>,
    /// `/metrics`; `None`: off.
    pub metrics_addr: Option<SocketAddr>,
    /// Address the `healthCheckNodePort` listeners bind; `None`: off.
    pub service_health_bind: Option<IpAddr>,
    /// A proc root to search for pods' network namespaces (after /run/netns); `None`: none.
    pub host_proc: Option<PathBuf>,
    /// Passive health (`--health-failures`, `--health-hold`, `--health-max-hold`, `--health-clients`).
    pub health: crate::datapath::health::HealthSettings,
    /// `--devices`: where the tc programs attach (`None`: the devices holding the NodePort addresses;
    /// `["none"]`: nowhere).
    pub devices: Option<Vec<String>>,
    /// `--service-node-port-range`: the cluster's NodePort range, which the SNAT ports leave out.
    pub node_port_range: (u16, u16),
    /// `--lb-algorithm`: how a backend is chosen within a tier for traffic from outside the node.
    pub lb_algorithm: LbAlgorithm,
    /// `--dsr`: direct server return for new IPv4 flows from outside to backends on other nodes.
    pub dsr: bool,
}

/// How the tc programs choose a backend within the chosen tier for a new flow from outside the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LbAlgorithm {
    /// At random among the tier's live backends (kube-proxy's rule).
    #[default]
    Random,
    /// By the flow's hash in the tier's Maglev table: every node with the same backends picks the same one.
    Maglev,
}
