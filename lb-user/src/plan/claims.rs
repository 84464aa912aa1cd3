//! Which Service programs a frontend (address, port, protocol) that several claim: the rule, the claims of
//! a port plan, every claim of a plan's ports, and what `plan`, `explain` and `lint` say of a contested one.
use std::{collections::BTreeMap, net::SocketAddr};

use super::PortPlan;
use crate::model::{ObjKey, Protocol};

/// One Service's claim on a frontend (address, port, protocol). Ordered so that the smallest is the one
/// programmed: a cluster IP before an external address, then the older Service, then namespace/name order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claimant {
    /// The claim is for a node port, load-balancer IP or externalIP. A cluster IP is allocated by the API
    /// server, an externalIP is whatever a Service's author writes (CVE-2020-8554): it never takes a
    /// frontend from a cluster IP, whatever the names.
    pub external: bool,
    /// When the Service was created (`Claimant::created`): a Service made later to take an address another
    /// already has does not get it, whatever its namespace is called.
    pub created: i64,
    /// The claiming Service.
    pub service: ObjKey,
}

impl Claimant {
    /// `metadata.creationTimestamp` as the claim orders it: seconds since the epoch, unknown (a manifest
    /// without it) after every known time.
    #[must_use]
    pub fn created(created: Option<i64>) -> i64 {
        created.unwrap_or(i64::MAX)
    }
}

/// Of Services claiming one VIP, port and protocol (manifests can say that; the API server's allocator never
/// gives one cluster IP to two Services, but externalIPs and ingress IPs can be anything), the one that is
/// programmed: a cluster IP's claim first, then the oldest Service (`metadata.creationTimestamp`), then the
/// first in namespace/name order. kube-proxy has no rule: its iptables proxier writes both Services' rules
/// and which matches first differs from node to node (kubernetes#69599), so one node serves one Service and
/// the next the other. This rule is one anyone can apply by reading the objects, that does not depend on
/// which arrived first (a restarted agent picks the same one), and under which a Service created later
/// cannot take an address from one that has it (by naming its namespace to sort first); the others are
/// programmed when it leaves the frontend.
pub fn vip_winner<'a>(claimants: impl IntoIterator<Item = &'a Claimant>) -> Option<&'a Claimant> {
    claimants.into_iter().min()
}

/// Which of several Services claiming one VIP:port is programmed, in words (`plan`, `explain`, the agent's log).
pub const VIP_RULE: &str = "of Services on one VIP:port, a cluster IP wins over an external address, then the oldest Service, then \
     the first in namespace/name order is programmed";

/// What `plan` and `explain` say of a VIP:port claimed by several Services, on each of them.
pub fn vip_conflict_text(vip: SocketAddr, protocol: &str, claimants: &[&Claimant], this: &ObjKey) -> String {
    let winner = vip_winner(claimants.iter().copied()).map_or(this, |c| &c.service);
    let mut others: Vec<String> =
        claimants.iter().filter(|c| c.service != *this).map(|c| c.service.to_string()).collect();
    others.dedup();
    let rule = VIP_RULE;
    if winner == this {
        format!("{vip}/{protocol} is also claimed by {}: {this} is programmed ({rule})", others.join(", "))
    } else {
        format!(
            "{vip}/{protocol} is also claimed by {}: {this} is NOT programmed there until {winner} leaves it ({rule})",
            others.join(", ")
        )
    }
}

/// The frontends a port plan claims: its cluster IPs, then its external destinations (an address claimed
/// both ways by the same port counts as a cluster IP, as the lowering programs it).
pub fn claims_of(p: &PortPlan) -> Vec<(SocketAddr, bool)> {
    let mut out: Vec<(SocketAddr, bool)> =
        p.cluster_ips.iter().map(|ip| (SocketAddr::new(*ip, p.port), false)).collect();
    for f in p.external.iter().flat_map(|x| &x.frontends) {
        if !out.iter().any(|(a, _)| *a == f.addr) {
            out.push((f.addr, true));
        }
    }
    out
}

/// Every frontend the port plans claim, with its claimants in the order they were met (each Service once).
pub fn claim_table(services: &[PortPlan]) -> BTreeMap<(SocketAddr, Protocol), Vec<Claimant>> {
    let mut claims: BTreeMap<(SocketAddr, Protocol), Vec<Claimant>> = BTreeMap::new();
    for p in services {
        for (addr, external) in claims_of(p) {
            let who = claims.entry((addr, p.protocol)).or_default();
            let c =
                Claimant { external, created: Claimant::created(p.created), service: p.name.service.clone() };
            if !who.contains(&c) {
                who.push(c);
            }
        }
    }
    claims
}
