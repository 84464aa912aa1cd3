//! What the bench measures: N Services of `per` endpoints each, as the Service maps the tierlb rows program,
//! as kube-proxy-style iptables and nftables rule sets, and as the manifests the agent figures read.
use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
};

use lb_testkit::manifests;
use tierlb::{
    datapath::{Desired, DesiredFrontend, addr},
    model::{ObjKey, ServicePortName},
};

use super::{figures::DataPath, load::BACKEND};

/// The VIP of Service `i` (10.96.0.10 and up).
pub(super) fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i as u32)
}

/// The measured Service of a set of `n`: in the middle, where a linear rule walk (iptables' KUBE-SERVICES)
/// meets it on average; hash lookups do not care.
pub(super) fn target(n: usize) -> usize {
    n / 2
}

/// Service `i`'s endpoints; only the target's exists (the others are never connected to).
fn endpoints(i: usize, per: usize, n: usize) -> Vec<SocketAddr> {
    endpoints_to(BACKEND.parse().expect("valid"), i, per, n)
}

/// Service `i`'s endpoints in a set of `n` whose measured one is `backend`; the others' addresses answer
/// nothing (never connected to).
pub(super) fn endpoints_to(backend: SocketAddr, i: usize, per: usize, n: usize) -> Vec<SocketAddr> {
    if i == target(n) {
        return vec![backend];
    }
    (0..per).map(|e| SocketAddr::new(endpoint_ip(i, per, e).into(), backend.port())).collect()
}

/// kube-proxy's KUBE-SVC-* chain of Service `i` (`svc`, statistic random over `eps`) and its KUBE-SEP-* DNAT
/// chains: their declarations into `chains`, their rules into `rules`.
pub(super) fn svc_chains(chains: &mut String, rules: &mut String, svc: &str, i: usize, eps: &[SocketAddr]) {
    for (e, a) in eps.iter().enumerate() {
        let sep = format!("KUBE-SEP-{i:08X}{e:04X}");
        let _ = writeln!(chains, ":{sep} - [0:0]");
        let left = eps.len() - e;
        if left > 1 {
            let p = 1.0 / left as f64;
            let _ = writeln!(rules, "-A {svc} -m statistic --mode random --probability {p:.11} -j {sep}");
        } else {
            let _ = writeln!(rules, "-A {svc} -j {sep}");
        }
        let _ = writeln!(rules, "-A {sep} -p tcp -m tcp -j DNAT --to-destination {a}");
    }
}

/// The address of endpoint `e` of Service `i` with `per` endpoints each (10.200.0.0 and up).
fn endpoint_ip(i: usize, per: usize, e: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + (i * per + e) as u32)
}

/// The Service maps' desired state for `services` Services: every endpoint cluster-wide (the third tier).
pub(super) fn desired(services: usize, per: usize) -> Desired {
    (0..services)
        .map(|i| {
            let b: Vec<_> = endpoints(i, per, services).into_iter().map(|a| addr::backend(a, 6)).collect();
            (
                addr::frontend_key(IpAddr::V4(vip(i)), 80, 6),
                DesiredFrontend {
                    name: ServicePortName::new(ObjKey::new("bench", format!("svc-{i}")), "").into(),
                    tiers: [Vec::new(), Vec::new(), b],
                    flags: 0,
                    affinity_timeout_s: 0,
                },
            )
        })
        .collect()
}

/// kube-proxy's iptables layout: KUBE-SERVICES -> KUBE-SVC-* (statistic random) -> KUBE-SEP-* DNAT.
pub fn iptables_rules(services: usize, per: usize) -> String {
    let mut s = String::from("*nat\n:KUBE-SERVICES - [0:0]\n");
    let mut rules = String::new();
    for i in 0..services {
        let svc = format!("KUBE-SVC-{i:012X}");
        let _ = writeln!(s, ":{svc} - [0:0]");
        let _ = writeln!(rules, "-A KUBE-SERVICES -d {}/32 -p tcp -m tcp --dport 80 -j {svc}", vip(i));
        svc_chains(&mut s, &mut rules, &svc, i, &endpoints(i, per, services));
    }
    s.push_str(&rules);
    s.push_str("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n");
    s.replace("-A OUTPUT", ":OUTPUT ACCEPT [0:0]\n-A OUTPUT")
}

/// kube-proxy's nftables layout: a verdict map from VIP . port to a per-Service chain that picks an
/// endpoint with `numgen random`.
pub fn nft_rules(services: usize, per: usize) -> String {
    let mut s = String::from("table ip kube-proxy {\n");
    let mut elems = Vec::new();
    for i in 0..services {
        let eps = endpoints(i, per, services);
        let map: Vec<String> =
            eps.iter().enumerate().map(|(e, a)| format!("{e} : {} . {}", a.ip(), a.port())).collect();
        let _ = writeln!(
            s,
            "  chain svc-{i} {{\n    meta l4proto tcp dnat ip addr . port to numgen random mod {} map {{ {} }}\n  }}",
            eps.len(),
            map.join(", ")
        );
        elems.push(format!("{} . tcp . 80 : goto svc-{i}", vip(i)));
    }
    let _ = writeln!(
        s,
        "  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}",
        elems.join(", ")
    );
    s.push_str("  chain output {\n    type nat hook output priority -100; policy accept;\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }\n}\n");
    s
}

/// A kube-proxy-style rule set: how to load it and how to remove it again.
pub(super) struct RuleSet {
    /// The data path its rows are.
    pub path: DataPath,
    /// The loading tool, as the figures name it.
    pub tool: &'static str,
    /// The command that reads the rule set on stdin.
    pub load: &'static [&'static str],
    /// The commands that remove it again.
    pub flush: &'static [&'static [&'static str]],
    /// The rule set's text for (Services, endpoints per Service).
    pub rules: fn(usize, usize) -> String,
}

/// The rule sets the bench compares tierlb with, in run and table order.
pub(super) const RULE_SETS: [RuleSet; 2] = [
    RuleSet {
        path: DataPath::Iptables,
        tool: "iptables-restore",
        load: &["iptables-restore", "-w"],
        flush: &[&["iptables", "-t", "nat", "-F"], &["iptables", "-t", "nat", "-X"]],
        rules: iptables_rules,
    },
    RuleSet {
        path: DataPath::Nftables,
        tool: "nft -f",
        load: &["nft", "-f", "-"],
        flush: &[&["nft", "flush", "ruleset"]],
        rules: nft_rules,
    },
];

/// The Service whose EndpointSlice the one-change figures edit (in the agent's manifests, in a file of its
/// own: a changed EndpointSlice is one object).
pub(super) const EDITED: usize = 1234;

/// The agent figures' manifests for `services` Services: files of 100 Services, and the edited one alone in
/// [`EDITED_FILE`].
pub(super) fn write_agent_manifests(dir: &Path, services: usize, per: usize) -> anyhow::Result<()> {
    for f in 0..services.div_ceil(100) {
        let text: Vec<String> = (f * 100..((f + 1) * 100).min(services))
            .filter(|i| *i != EDITED)
            .map(|i| manifests::to_yaml(&service_docs(i, per, per)))
            .collect();
        std::fs::write(dir.join(format!("services-{f:04}.yaml")), text.join("---\n"))?;
    }
    manifests::write_atomic(dir, EDITED_FILE, &service_yaml(EDITED, per, per))?;
    Ok(())
}

/// The file that holds only the edited Service.
pub(super) const EDITED_FILE: &str = "edited.yaml";

/// Nodes the agent figures' endpoints are spread over, one endpoint in this many on the agent's node
/// (`node-1`): 1,000 of its own at 100,000 Services x 10, nine times kubelet's default of 110 pods. The
/// layout was two nodes, which put 400,000 endpoint addresses on `node-1`: 24 times what the local-endpoint
/// set holds (`DEFAULT_MAX_LOCAL_BACKENDS`, fixed), so every start measured a failing write of that set.
const NODES: usize = 1_000;

/// Service `i` with `endpoints` of its `per` endpoints: the Service and its EndpointSlices, endpoint `k`
/// overall on `node-{k % NODES + 1}`.
pub(super) fn service_docs(i: usize, endpoints: usize, per: usize) -> Vec<serde_json::Value> {
    let svc = manifests::Svc::new(&format!("svc-{i}"), IpAddr::V4(vip(i)), 80, 8080);
    let eps: Vec<_> = (0..endpoints)
        .map(|e| {
            let node = format!("node-{}", (i * per + e) % NODES + 1);
            manifests::Ep::ready(IpAddr::V4(endpoint_ip(i, per, e)), &node)
        })
        .collect();
    let mut docs = vec![svc.service()];
    docs.extend(svc.slices(&eps));
    docs
}

/// [`service_docs`] as YAML.
pub(super) fn service_yaml(i: usize, endpoints: usize, per: usize) -> String {
    manifests::to_yaml(&service_docs(i, endpoints, per))
}
