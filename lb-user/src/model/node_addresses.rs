//! The node's external-address configuration: where a Service's external addresses are on this node, and which of them tierlb may translate: the node
//! addresses its NodePorts listen on (kube-proxy's `--nodeport-addresses`) and the limit on translated
//! `externalIPs` (`--external-ip-cidrs`). Resolved once per sync into `NodeInfo`, so the plan stays pure and a
//! change (a Node address, an interface address) replans every Service.
use std::{fmt, net::IpAddr, str::FromStr};

use serde::Serialize;

use super::{Model, Node, NodeAddressKind};

/// An IP prefix (`10.0.0.0/8`, `2001:db8::/32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// The address as written (host bits are allowed, as Go's `ParseCIDR` allows them).
    pub ip: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl Cidr {
    /// Whether `ip` is inside the prefix (never across families).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.ip, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(net) & mask == u32::from(*a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.len)).unwrap_or(0);
                u128::from(net) & mask == u128::from(*a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.len)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A flag value that is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a CIDR (an address, a slash and a prefix length, e.g. 10.0.0.0/8)")]
pub struct BadCidr {
    /// What was given.
    pub value: String,
}

impl FromStr for Cidr {
    type Err = BadCidr;
    fn from_str(s: &str) -> Result<Self, BadCidr> {
        let bad = || BadCidr { value: s.to_owned() };
        let (ip, len) = s.split_once('/').ok_or_else(bad)?;
        let ip: IpAddr = ip.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(bad());
        }
        Ok(Self { ip, len })
    }
}

/// Comma-separated CIDRs (empty items are ignored).
fn cidr_list(s: &str) -> Result<Vec<Cidr>, BadCidr> {
    s.split(',').map(str::trim).filter(|c| !c.is_empty()).map(str::parse).collect()
}

/// Which node addresses NodePorts are translated on (`--nodeport-addresses`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "cidrs")]
pub enum NodePortAddresses {
    /// Unset: the `InternalIP` and `ExternalIP` addresses of this node's Node object. kube-proxy's iptables
    /// mode defaults to every local address instead; tierlb reads the Node object so that `plan` and
    /// `explain` run anywhere show what the agent on that node programs (see docs/cli.md).
    #[default]
    NodeObject,
    /// `primary`: kube-proxy's NodeIPs, the first `InternalIP` (else `ExternalIP`) of each family
    /// (`GetNodeHostIPs`, pkg/util/node), as kube-proxy's `newProxyServer` (cmd/kube-proxy/app/server.go)
    /// turns `primary` into one /32 and one /128.
    Primary,
    /// CIDRs: the addresses of this host's interfaces (read in the agent's network namespace) inside them;
    /// a family with no CIDR takes every address of that family, as kube-proxy's `NewNodePortAddresses`
    /// (pkg/proxy/util/nodeport_addresses.go) adds `0.0.0.0/0` or `::/0` then.
    Cidrs(Vec<Cidr>),
}

impl FromStr for NodePortAddresses {
    type Err = BadCidr;
    fn from_str(s: &str) -> Result<Self, BadCidr> {
        if s.trim() == "primary" {
            return Ok(Self::Primary);
        }
        Ok(Self::Cidrs(cidr_list(s)?))
    }
}

/// Comma-separated CIDRs as one flag value (`--external-ip-cidrs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrList(pub Vec<Cidr>);

impl FromStr for CidrList {
    type Err = BadCidr;
    fn from_str(s: &str) -> Result<Self, BadCidr> {
        cidr_list(s).map(Self)
    }
}

/// What the agent, `plan` and `explain` are told about external addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExternalConfig {
    /// `--nodeport-addresses`.
    pub node_port_addresses: NodePortAddresses,
    /// `--external-ip-cidrs` (`None`: every externalIP is translated).
    pub external_ip_cidrs: Option<Vec<Cidr>>,
    /// Addresses no frontend may take: the API server's (the agent's own connects go there).
    pub protected: Vec<std::net::SocketAddr>,
}

/// kube-proxy's `GetNodeHostIPs` (pkg/util/node/node.go): `InternalIP`s first, then `ExternalIP`s; the first
/// of them, and the first of the other family.
pub fn primary_ips(node: &Node) -> Vec<IpAddr> {
    let ordered = [NodeAddressKind::InternalIP, NodeAddressKind::ExternalIP]
        .into_iter()
        .flat_map(|k| node.addresses.iter().filter(move |a| a.kind == k).map(|a| a.ip));
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in ordered {
        if out.iter().all(|o| o.is_ipv4() != ip.is_ipv4()) {
            out.push(ip);
        }
    }
    out
}

/// The addresses this node's NodePorts are translated on, sorted and without duplicates. `local` is only
/// called for CIDRs (it reads the host's interfaces). Loopback addresses are never taken: a socket-level
/// frontend on 127.0.0.1 would also capture a pod's connects to its own loopback (every pod has one), which
/// kube-proxy's NAT never sees; kube-proxy's nftables mode does not serve NodePorts on loopback either.
pub fn node_port_addresses(
    mode: &NodePortAddresses,
    node: Option<&Node>,
    local: impl FnOnce() -> Vec<IpAddr>,
) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = match mode {
        NodePortAddresses::NodeObject => node.iter().flat_map(|n| n.addresses.iter().map(|a| a.ip)).collect(),
        NodePortAddresses::Primary => node.map(primary_ips).unwrap_or_default(),
        NodePortAddresses::Cidrs(cidrs) => {
            let has_family = |v4: bool| cidrs.iter().any(|c| c.ip.is_ipv4() == v4);
            local()
                .into_iter()
                .filter(|ip| !has_family(ip.is_ipv4()) || cidrs.iter().any(|c| c.contains(ip)))
                .collect()
        }
    };
    out.retain(|ip| !ip.is_loopback());
    out.sort();
    out.dedup();
    out
}

/// The node's NodePort addresses under `cfg` for node `name` of `model`, reading interfaces when the mode
/// needs them (an unreadable interface list counts as none: nothing is translated rather than a guess).
pub fn resolve_node_ports(cfg: &ExternalConfig, name: &str, model: &Model) -> Vec<IpAddr> {
    node_port_addresses(&cfg.node_port_addresses, model.nodes.get(name), || {
        interface_addresses().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read this host's interface addresses: no NodePort is translated");
            Vec::new()
        })
    })
}

/// Every address of this process's network namespace's interfaces (the host's, under the DaemonSet's
/// `hostNetwork`), as Go's `net.InterfaceAddrs` that kube-proxy reads.
pub fn interface_addresses() -> nix::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let Some(addr) = ifa.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            out.push(IpAddr::V6(v6.ip()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeAddress;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(addrs: &[(NodeAddressKind, &str)]) -> Node {
        Node {
            name: "n1".into(),
            addresses: addrs.iter().map(|(kind, a)| NodeAddress { kind: *kind, ip: ip(a) }).collect(),
            ..Node::default()
        }
    }

    #[test]
    fn cidrs_parse_and_match_within_their_family_only() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(&ip("10.255.0.1")) && !c.contains(&ip("11.0.0.1")) && !c.contains(&ip("::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(&ip("192.0.2.1")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(&ip("2001:db8:1::1")) && !v6.contains(&ip("2001:db9::1")));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!("primary".parse::<NodePortAddresses>(), Ok(NodePortAddresses::Primary));
    }

    #[test]
    fn node_port_addresses_follow_kube_proxy_per_mode() {
        use NodeAddressKind::{ExternalIP as Ext, InternalIP as Int};
        let n = node(&[(Ext, "203.0.113.5"), (Int, "10.0.0.1"), (Int, "10.0.0.2"), (Int, "fd00::1")]);
        let local = || vec![ip("127.0.0.1"), ip("10.0.0.1"), ip("192.168.1.1"), ip("fd00::1"), ip("::1")];
        let cases: [(&str, NodePortAddresses, Vec<&str>); 5] = [
            (
                "default: the Node's InternalIPs and ExternalIPs",
                NodePortAddresses::NodeObject,
                vec!["10.0.0.1", "10.0.0.2", "203.0.113.5", "fd00::1"],
            ),
            (
                "primary: the first InternalIP of each family (GetNodeHostIPs)",
                NodePortAddresses::Primary,
                vec!["10.0.0.1", "fd00::1"],
            ),
            (
                "a v4 CIDR: local v4 addresses inside it, every v6 one but loopback",
                "10.0.0.0/8".parse().unwrap(),
                vec!["10.0.0.1", "fd00::1"],
            ),
            (
                "both families given",
                "192.168.0.0/16,fd00::/8".parse().unwrap(),
                vec!["192.168.1.1", "fd00::1"],
            ),
            (
                "zero CIDR: every local address but loopback",
                "0.0.0.0/0".parse().unwrap(),
                vec!["10.0.0.1", "192.168.1.1", "fd00::1"],
            ),
        ];
        for (name, mode, want) in cases {
            let got = node_port_addresses(&mode, Some(&n), local);
            assert_eq!(got, want.iter().map(|s| ip(s)).collect::<Vec<_>>(), "{name}");
        }
        let only_external = node(&[(Ext, "203.0.113.5")]);
        assert_eq!(primary_ips(&only_external), [ip("203.0.113.5")], "no InternalIP: the ExternalIP");
        assert!(
            node_port_addresses(&NodePortAddresses::NodeObject, None, local).is_empty(),
            "no Node object"
        );
    }
}
