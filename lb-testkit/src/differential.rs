//! The differential lab: real kube-proxy (v1.36.3) and tierlb's agent (as deployed) on the same simulated
//! nodes, reading one API server, in front of the same pods; clients that go through one or the other.
//!
//! - Dual-stack throughout: Services get ClusterIPs from 10.96.0.0/16 and fd00:96::/108, nodes and pods an
//!   address of each family (the IPv4 one first, the primary).
//! - A LAN namespace with a bridge. Per node a namespace (`deployed::Node`, forwarding on) on the bridge at
//!   192.0.2.N/24 and fd00:192:2::N/64, linked to the API server, with routes to the other nodes' pod ranges
//!   (10.244.M.0/24 via 192.0.2.M, fd00:244:M::/64 via fd00:192:2::M) and an on-link default route of each
//!   family (a node has one; kube-proxy's rules for a node's own connects sit behind the routing decision).
//!   Pods in namespaces of their own behind veths (10.244.N.X and fd00:244:N::X), Pod objects with a named
//!   container port (`http`, 8080), each served by `tierlb-lab serve` answering its name on both addresses.
//! - On each node: kube-proxy, in iptables or nftables mode (`/healthz` on 10266 and `/metrics` on 10259,
//!   since tierlb's agent keeps kube-proxy's own ports), and tierlb's agent as the DaemonSet runs it
//!   (`BoxedNode`, `--kube` with the service account's token).
//! - Two kinds of client on every node, a pod (its own namespace, 10.244.N.250) and a process of the node
//!   (the node's namespace), each run twice: in the agent's cgroup, where tierlb translates at connect() and
//!   kube-proxy's rules then see a pod address and leave it alone; and in a cgroup beside it with no program,
//!   where kube-proxy's rules translate.
//!
//! - A client outside the nodes for each node: a namespace of its own on the LAN at 192.0.2.(100+N) and
//!   fd00:192:2::(100+N), its default routes through node N (so load-balancer IPs and externalIPs reach that node, as a router or
//!   MetalLB would send them). tierlb's answer for it comes from its tc programs, kube-proxy's from its
//!   PREROUTING rules; since tierlb's tc would see the packets first, kube-proxy's runs begin with the agents
//!   stopped and their programs removed (`stop_agents`).
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::{
    deployed::{AgentBox, BoxedNode, InCluster},
    kube::{ControlPlane, Options},
    kube_proxy::{KubeProxy, Launch, Mode},
    probe::Report,
    sandbox::{Cgroup, NamedServer, NetNs, confine, output},
};

/// The port every pod serves on, named `http` in its Pod object.
pub const POD_PORT: u16 = 8080;

/// Which proxy a client goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// kube-proxy's rules (a client outside the agent's cgroup).
    KubeProxy,
    /// tierlb (a client in the agent's cgroup).
    Tierlb,
}

/// Where a client runs on its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Client {
    /// A pod of the node (its own network namespace).
    Pod,
    /// A process of the node (the node's network namespace).
    Node,
    /// A machine outside the nodes whose traffic for the node's addresses, load-balancer IPs and
    /// externalIPs goes to this node.
    Outside,
}

/// One node of the lab.
pub struct DiffNode {
    /// Its name (the Node object's).
    pub name: String,
    /// Its zone label, if any.
    pub zone: Option<String>,
    /// Its address on the LAN (the Node's first InternalIP).
    pub ip: Ipv4Addr,
    /// Its IPv6 address on the LAN (the Node's second InternalIP).
    pub ip6: Ipv6Addr,
    /// Its namespace, the agent's cgroup and box.
    pub boxed: BoxedNode,
    /// A cgroup beside the agent's with no program: kube-proxy's clients run there.
    pub plain: Cgroup,
    /// The client pod's namespace.
    pub client_pod: NetNs,
    /// The outside client's namespace.
    pub outside: NetNs,
    agent: Option<AgentBox>,
    proxy: Option<KubeProxy>,
    pods: u8,
}

/// The lab: the control plane, the LAN, the nodes and the pods' servers.
pub struct DiffLab {
    // Drop order: the pods' servers, the nodes (agents, kube-proxies, namespaces), the LAN, the control plane.
    servers: std::collections::BTreeMap<String, (NamedServer, NetNs)>,
    /// The nodes, in the order given.
    pub nodes: Vec<DiffNode>,
    /// The LAN's namespace (the bridge).
    pub lan: NetNs,
    /// The control plane.
    pub cp: ControlPlane,
    in_cluster: InCluster,
    lab: PathBuf,
    tag: String,
    /// Starts of kube-proxy that never took their Node's zone and were started again
    /// (`KubeProxy::launch_zoned`).
    pub zone_misses: usize,
}

fn node_ip(i: usize) -> anyhow::Result<Ipv4Addr> {
    Ok(Ipv4Addr::new(192, 0, 2, u8::try_from(i + 1)?))
}

/// The `i`-th node's IPv6 address on the LAN.
#[must_use]
pub fn node_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x192, 2, 0, 0, 0, 0, u16::try_from(i + 1).unwrap_or(u16::MAX))
}

/// The dual-stack Service ranges of the lab's API server.
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:96::/108";

impl DiffLab {
    /// The control plane (`deploy/` applied, as the DaemonSet's service account needs), the LAN and one node
    /// per `(name, zone)`, with no agent or kube-proxy running yet.
    pub fn new(
        tag: &str,
        tierlb: &Path,
        lab: &Path,
        deploy: &Path,
        nodes: &[(&str, Option<&str>)],
    ) -> anyhow::Result<Self> {
        let options = Options { service_cidr: Some(SERVICE_CIDRS.to_owned()), ..Options::default() };
        let mut cp = ControlPlane::start(tag, options)?;
        cp.kubectl(&["apply", "-k", &deploy.display().to_string()])?;
        let in_cluster = cp.in_cluster("kube-system", "tierlb")?;
        let lan = NetNs::new(&format!("{tag}-lan"))?;
        lan.ip(&["link", "add", "br0", "type", "bridge"])?;
        lan.ip(&["link", "set", "br0", "up"])?;
        let mut made = Vec::new();
        for (i, (name, zone)) in nodes.iter().enumerate() {
            let ip = node_ip(i)?;
            let mut boxed = BoxedNode::new(&format!("{tag}-n{}", i + 1), tierlb, deploy)?;
            let ns = &boxed.node.netns;
            let port = format!("n{}", i + 1);
            lan.ip(&["link", "add", &port, "type", "veth", "peer", "name", "uplink", "netns", ns.name()])?;
            lan.ip(&["link", "set", &port, "master", "br0", "up"])?;
            let ip6 = node_ip6(i);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "uplink"])?;
            ns.ip(&["addr", "add", &format!("{ip6}/64"), "dev", "uplink", "nodad"])?;
            ns.ip(&["link", "set", "uplink", "up"])?;
            ns.ip(&["route", "add", "default", "dev", "uplink"])?;
            ns.ip(&["-6", "route", "add", "default", "dev", "uplink"])?;
            for j in 0..nodes.len() {
                if j != i {
                    ns.ip(&[
                        "route",
                        "add",
                        &format!("10.244.{}.0/24", j + 1),
                        "via",
                        &node_ip(j)?.to_string(),
                    ])?;
                    ns.ip(&[
                        "-6",
                        "route",
                        "add",
                        &format!("fd00:244:{}::/64", j + 1),
                        "via",
                        &node_ip6(j).to_string(),
                    ])?;
                }
            }
            cp.link(&boxed.node.netns)?;
            cp.add_node_ips(name, *zone, &[IpAddr::V4(ip), IpAddr::V6(ip6)])?;
            let client_pod = boxed.node.add_pod_ips(&format!("{tag}-c{}", i + 1), &client_ips(i)?)?;
            let plain = Cgroup::new(&format!("{tag}-plain{}", i + 1))?;
            let outside = NetNs::new(&format!("{tag}-o{}", i + 1))?;
            let port = format!("o{}", i + 1);
            lan.ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", outside.name()])?;
            lan.ip(&["link", "set", &port, "master", "br0", "up"])?;
            outside.ip(&["addr", "add", &format!("{}/24", outside_ip(i)?), "dev", "eth0"])?;
            let outside6 = Ipv6Addr::new(0xfd00, 0x192, 2, 0, 0, 0, 0, u16::try_from(i + 101)?);
            outside.ip(&["addr", "add", &format!("{outside6}/64"), "dev", "eth0", "nodad"])?;
            outside.ip(&["link", "set", "eth0", "up"])?;
            outside.ip(&["route", "add", "default", "via", &ip.to_string()])?;
            outside.ip(&["-6", "route", "add", "default", "via", &ip6.to_string()])?;
            made.push(DiffNode {
                name: (*name).to_owned(),
                zone: zone.map(str::to_owned),
                ip,
                ip6,
                boxed,
                plain,
                client_pod,
                outside,
                agent: None,
                proxy: None,
                pods: 0,
            });
        }
        Ok(Self {
            servers: std::collections::BTreeMap::new(),
            nodes: made,
            lan,
            cp,
            in_cluster,
            lab: lab.to_owned(),
            tag: tag.to_owned(),
            zone_misses: 0,
        })
    }

    fn index(&self, node: &str) -> anyhow::Result<usize> {
        self.nodes.iter().position(|n| n.name == node).with_context(|| format!("no node {node}"))
    }

    /// The node named `node`.
    pub fn node(&self, node: &str) -> anyhow::Result<&DiffNode> {
        Ok(&self.nodes[self.index(node)?])
    }

    /// Stop pod `name`'s server (its container exits, as the kubelet stops it) and remove its network
    /// namespace and the node's route to it. Its Pod object is the caller's (`ControlPlane::pod_gone`).
    pub fn stop_pod(&mut self, name: &str) -> anyhow::Result<()> {
        let (server, netns) = self.servers.remove(name).with_context(|| format!("no pod {name}"))?;
        drop(server);
        drop(netns);
        Ok(())
    }

    /// `program` run as a pod of `node` (its client pod's network namespace) going through the proxy the
    /// node runs: in the agent's cgroup where tierlb's agent runs, in a cgroup with no program otherwise.
    pub fn pod_client(&self, node: &str, program: &Path) -> anyhow::Result<Command> {
        let n = self.node(node)?;
        let mut cmd = Command::new(program);
        let cgroup = if n.agent.is_some() { &n.boxed.cgroup } else { &n.plain };
        confine(&mut cmd, Some(cgroup), Some(&n.client_pod))?;
        Ok(cmd)
    }

    /// A pod on `node` with `labels`, its server answering `name` on `POD_PORT` on both its addresses,
    /// Ready or not; returns its addresses (IPv4, IPv6).
    pub fn add_pod(
        &mut self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        ready: bool,
    ) -> anyhow::Result<[IpAddr; 2]> {
        let i = self.index(node)?;
        let n = &mut self.nodes[i];
        n.pods += 1;
        let ip = IpAddr::V4(Ipv4Addr::new(10, 244, u8::try_from(i + 1)?, n.pods + 10));
        let ip6 = IpAddr::V6(pod_ip6(i, u16::from(n.pods) + 10));
        let ns = n.boxed.node.add_pod_ips(&format!("{}-{name}", self.tag), &[ip, ip6])?;
        // One socket for both families (`[::]`, IPv4 connects arrive mapped).
        let any = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), POD_PORT);
        let server = NamedServer::start(&self.lab, &ns, any, name)?;
        self.servers.insert(name.to_owned(), (server, ns));
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: \"{v}\"")).collect();
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}, labels: {{{}}}}}\n\
             spec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 3600\n  containers:\n  \
             - {{name: app, image: registry.invalid/app:1, ports: [{{name: http, containerPort: {POD_PORT}}}]}}\n",
            labels.join(", ")
        ))?;
        self.cp.pod_status_ips(namespace, name, &[ip, ip6], ready)?;
        Ok([ip, ip6])
    }

    /// Start tierlb's agent on every node, as deployed, reading the API server; each returns once ready.
    pub fn start_agents(&mut self) -> anyhow::Result<()> {
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].name.clone();
            self.start_agent(&name, &[])?;
        }
        Ok(())
    }

    /// Start tierlb's agent on `node` as deployed (with `extra` arguments), reading the API server; returns
    /// once it is ready.
    pub fn start_agent(&mut self, node: &str, extra: &[&str]) -> anyhow::Result<()> {
        let i = self.index(node)?;
        let n = &mut self.nodes[i];
        n.agent = Some(n.boxed.start_agent_kube(&n.name, &self.in_cluster, extra)?);
        Ok(())
    }

    /// Stop every agent (as the kubelet does) and remove what it left pinned and attached (`tierlb agent
    /// --cleanup`, as the uninstall runs it), so that kube-proxy's rules alone answer afterwards; checks that
    /// no tc program is left on the node's device.
    pub fn stop_agents(&mut self, tierlb: &Path) -> anyhow::Result<()> {
        for n in &mut self.nodes {
            if let Some(agent) = n.agent.take() {
                agent.stop();
            }
            let mut cmd = Command::new(tierlb);
            cmd.args(["agent", "--cleanup", "--node", &n.name, "--bpffs"])
                .arg(n.boxed.bpffs.path().join("tierlb"));
            confine(&mut cmd, None, Some(&n.boxed.node.netns))?;
            output(&mut cmd).with_context(|| format!("tierlb agent --cleanup on {}", n.name))?;
            let mut show = Command::new("bpftool");
            show.args(["-j", "net", "show", "dev", "uplink"]);
            confine(&mut show, None, Some(&n.boxed.node.netns))?;
            let shown: serde_json::Value = serde_json::from_str(&output(&mut show)?)?;
            let left: Vec<&serde_json::Value> = shown
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|o| ["tc", "tcx"].into_iter().filter_map(|k| o.get(k)?.as_array()))
                .flatten()
                .collect();
            anyhow::ensure!(
                left.is_empty(),
                "tc programs left on {}'s uplink after --cleanup: {left:?}",
                n.name
            );
        }
        Ok(())
    }

    /// Start kube-proxy in `mode` on every node (after stopping any running); each returns once it has
    /// written its rules, on a node with a zone once it has taken the zone (started again if it missed it:
    /// `zone_misses`).
    pub fn start_proxies(&mut self, mode: Mode) -> anyhow::Result<()> {
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].name.clone();
            self.start_proxy(&name, mode)?;
        }
        Ok(())
    }

    /// `start_proxies` on `node` alone.
    pub fn start_proxy(&mut self, node: &str, mode: Mode) -> anyhow::Result<()> {
        let i = self.index(node)?;
        {
            let n = &mut self.nodes[i];
            if let Some(mut p) = n.proxy.take() {
                p.stop(std::time::Duration::from_secs(10));
            }
            let how = Launch {
                mode,
                healthz: SocketAddr::from(([0, 0, 0, 0], 10266)),
                metrics: SocketAddr::from(([127, 0, 0, 1], 10259)),
                limit: std::time::Duration::from_mins(1),
                release: None,
                verbosity: 4,
            };
            let ns = &n.boxed.node.netns;
            n.proxy = Some(if n.zone.is_some() {
                let (proxy, missed) = KubeProxy::launch_zoned(&self.cp, &n.name, ns, &how)?;
                self.zone_misses += missed;
                proxy
            } else {
                KubeProxy::launch(&self.cp, &n.name, ns, &how)?
            });
        }
        Ok(())
    }

    /// The running kube-proxy of `node`.
    pub fn proxy(&self, node: &str) -> anyhow::Result<&KubeProxy> {
        self.nodes[self.index(node)?].proxy.as_ref().with_context(|| format!("no kube-proxy on {node}"))
    }

    /// `count` attempts on each of `targets` from a `client` of `node` going `via` one proxy
    /// (`tierlb-lab spread`, eight targets at a time: a target is given up after three failures in a row,
    /// each waiting up to `timeout_ms`). An outside client is in no cgroup of the node: `via` says only which
    /// proxy the caller has running.
    pub fn reach(
        &self,
        node: &str,
        client: Client,
        via: Via,
        targets: &[SocketAddr],
        count: usize,
        timeout_ms: u64,
    ) -> anyhow::Result<Vec<Report>> {
        let n = &self.nodes[self.index(node)?];
        let mut cmd = Command::new(&self.lab);
        cmd.args(["spread", "--parallel", "8", "--count", &count.to_string()])
            .args(["--timeout-ms", &timeout_ms.to_string()]);
        for t in targets {
            cmd.args(["--target", &t.to_string()]);
        }
        let netns = match client {
            Client::Pod => &n.client_pod,
            Client::Node => &n.boxed.node.netns,
            Client::Outside => &n.outside,
        };
        let cgroup = match (via, client) {
            (Via::KubeProxy, _) | (_, Client::Outside) => &n.plain,
            (Via::Tierlb, _) => &n.boxed.cgroup,
        };
        confine(&mut cmd, Some(cgroup), Some(netns))?;
        let out = output(&mut cmd)?;
        serde_json::from_str(&out).with_context(|| format!("tierlb-lab spread's report: {out}"))
    }
}

/// The address of the `i`-th node's outside client.
fn outside_ip(i: usize) -> anyhow::Result<Ipv4Addr> {
    Ok(Ipv4Addr::new(192, 0, 2, u8::try_from(i + 101)?))
}

/// The client pod's addresses on the `i`-th node.
fn client_ips(i: usize) -> anyhow::Result<[IpAddr; 2]> {
    Ok([IpAddr::V4(Ipv4Addr::new(10, 244, u8::try_from(i + 1)?, 250)), IpAddr::V6(pod_ip6(i, 0x250))])
}

/// The IPv6 address `x` of the `i`-th node's pod range, fd00:244:(i+1)::x.
fn pod_ip6(i: usize, x: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x244, u16::try_from(i + 1).unwrap_or(u16::MAX), 0, 0, 0, 0, x)
}
