//! Structured input for the plan target: a small cluster built from `arbitrary` choices among few nodes,
//! zones, addresses and ports (so that endpoints collide, hints name this node, slices merge), valid by
//! construction: ClusterIP, NodePort and LoadBalancer Services with node ports, ingress IPs, externalIPs,
//! both traffic policies and sessionAffinity, on a planned node `n1` with addresses, under the agent's
//! `--nodeport-addresses` and `--external-ip-cidrs`, with map capacities that are sometimes too small. Every
//! frontend it must get is computed here (`oracle`) from DESIGN.md's statement of `CategorizeEndpoints` and of
//! external destinations, rather than from `tierlb::plan`.
//!
//! No two Services claim one frontend (node ports are distinct per Service and port, ingress IPs and
//! externalIPs distinct per Service): which of several claimants wins has its own tests.
use arbitrary::Arbitrary;

mod build;
mod oracle;

pub use oracle::{Expected, Frontend, NodeView, expected};

/// Node names: the planned node is `NODES[0]`.
pub const NODES: [&str; 3] = ["n1", "n2", "n3"];
const ZONES: [&str; 2] = ["za", "zb"];
const PORT_NAMES: [&str; 3] = ["", "http", "dns"];

/// One generated cluster, planned for node `n1`.
#[derive(Arbitrary, Debug)]
pub struct Cluster {
    /// `--zone` of the agent (else the Node object's label).
    pub zone_flag: Option<u8>,
    /// Zone label of Node n1.
    pub node_zone: Option<u8>,
    /// Node n1's `status.addresses`: whether it is an `ExternalIP` (else `InternalIP`), and which of
    /// `build::NODE_ADDRESSES`.
    node_addresses: Vec<(bool, u8)>,
    /// The agent's external-address flags.
    flags: GenFlags,
    /// Capacities of the frontend map (and service ids) and of the slot map (and member map), small enough
    /// to run out; `None`: roomy.
    capacity: Option<(u8, u8)>,
    /// The Services (their number is capped).
    pub services: Vec<GenService>,
}

/// `--nodeport-addresses`, `--external-ip-cidrs` and the API server's address.
#[derive(Arbitrary, Debug)]
struct GenFlags {
    /// `--nodeport-addresses primary` (else unset: every address of the Node object).
    primary: bool,
    /// `--external-ip-cidrs`, from `build::EXTERNAL_IP_CIDRS`.
    external_ip_cidrs: Option<Vec<u8>>,
    /// The API server's address: one of the node's addresses and a port among the node ports.
    api_server: Option<(u8, u8)>,
}

/// One Service and its slices.
#[derive(Arbitrary, Debug)]
pub struct GenService {
    local: bool,
    /// `externalTrafficPolicy: Local` (set only where the Service is externally reachable, as validation
    /// requires).
    external_local: bool,
    /// `spec.type`: ClusterIP, NodePort or LoadBalancer (`% 3`).
    kind: u8,
    distribution: u8,
    v4: bool,
    v6: bool,
    ports: Vec<GenPort>,
    /// `status.loadBalancer.ingress` (LoadBalancer only): the address, and whether its `ipMode` is `Proxy`.
    ingress: Vec<(GenAddr, bool)>,
    /// `spec.externalIPs`.
    external_ips: Vec<GenAddr>,
    /// `spec.loadBalancerSourceRanges` (LoadBalancer only), from `build::SOURCE_RANGES`.
    source_ranges: Vec<u8>,
    /// `sessionAffinity: ClientIP` with this timeout (folded into 1..=86400 seconds).
    affinity: Option<u32>,
    slices: Vec<GenSlice>,
}

/// One port of a Service.
#[derive(Arbitrary, Debug)]
struct GenPort {
    port: u16,
    udp: bool,
    /// A `nodePort` (NodePort and LoadBalancer Services only; a LoadBalancer without one is
    /// `allocateLoadBalancerNodePorts: false`).
    node_port: bool,
}

/// An ingress IP or externalIP: the Service's own address number `pick % 16` below 12 (distinct per Service
/// and kind), else one of the node's own addresses, a loopback, link-local or unspecified address.
#[derive(Arbitrary, Debug)]
struct GenAddr {
    v6: bool,
    pick: u8,
}

/// One EndpointSlice of a Service.
#[derive(Arbitrary, Debug)]
struct GenSlice {
    v6: bool,
    ports: Vec<(u8, u16, bool)>,
    endpoints: Vec<GenEndpoint>,
}

#[derive(Arbitrary, Debug)]
struct GenEndpoint {
    host: u8,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    node: Option<u8>,
    zone: Option<u8>,
    for_nodes: Option<Vec<u8>>,
    for_zones: Option<Vec<u8>>,
}

fn pick<'a>(pool: &[&'a str], i: u8) -> &'a str {
    pool[usize::from(i) % pool.len()]
}
