//! What else translates on the node: programs on the cgroup (another tierlb instance, Cilium's or
//! Calico's socket load balancing), programs on the devices, kube-proxy's rules and ports, other instances'
//! pins.
use std::{net::SocketAddr, path::Path};

use super::{Check, nft};
use crate::datapath::{attached, ebpf::PROGRAMS, pins, tc};

/// Who a program of another project belongs to, by the name it was loaded with.
fn owner(name: &str) -> Option<&'static str> {
    if name.starts_with("cil_") {
        Some("Cilium")
    } else if name.starts_with("calico_") || name.starts_with("cali_") {
        Some("Calico")
    } else {
        None
    }
}

/// Programs on the agent's cgroup (or above it, which run too) at the attach points of the agent's: another
/// instance's tierlb programs, and other projects' socket load balancers.
pub(super) fn cgroup(cgroup: &Path, bpffs: &Path, instance: Option<&str>) -> Vec<Check> {
    let Ok(file) = std::fs::File::open(cgroup) else {
        // The cgroup check above says why.
        return Vec::new();
    };
    let ours = instance.map(|i| pins::pinned_program_ids(&pins::instance_dir(bpffs, i))).unwrap_or_default();
    let names = attached::loaded_names();
    let (mut tierlb, mut others) = (Vec::new(), Vec::new());
    for (point, attach_type) in attached::ATTACH_TYPES {
        let Ok(ids) = attached::effective_ids(&file, attach_type) else { continue };
        for id in ids {
            let name = names.get(&id).cloned().unwrap_or_default();
            if PROGRAMS.contains(&name.as_str()) {
                if !ours.contains(&id) {
                    tierlb.push(format!("{name} (id {id})"));
                }
            } else {
                others.push((point, name, id));
            }
        }
    }
    let mut out = Vec::new();
    if tierlb.is_empty() {
        let detail = if ours.is_empty() {
            "no tierlb program attached".to_owned()
        } else {
            format!("this instance's earlier programs ({}), which the agent replaces", ours.len())
        };
        out.push(Check::ok("cgroup-programs", detail));
    } else if instance.is_none() {
        out.push(Check::warn(
            "cgroup-programs",
            format!("tierlb programs attached: {}", tierlb.join(", ")),
            "pass --instance (the agent's --instance or --node) to tell its own from another instance's",
        ));
    } else {
        out.push(Check::fail(
            "cgroup-programs",
            format!("another tierlb instance's programs are attached: {}", tierlb.join(", ")),
            "remove them with that agent's settings (`tierlb agent --cleanup --bpffs DIR --instance NAME`), \
             or `bpftool cgroup detach` each",
        ));
    }
    let (known, unknown): (Vec<_>, Vec<_>) =
        others.into_iter().partition(|(_, name, _)| owner(name).is_some());
    let list = |v: &[(&str, String, u32)]| {
        v.iter().map(|(p, n, id)| format!("{n} (id {id}) at {p}")).collect::<Vec<_>>().join(", ")
    };
    if !known.is_empty() {
        let who = owner(&known[0].1).unwrap_or_default();
        out.push(Check::fail(
            "socket-lb",
            format!("{who}'s socket load balancing is attached: {}", list(&known)),
            format!(
                "two socket load balancers on one cgroup translate each other's results: turn off {who}'s \
                 (Cilium: socketLB.enabled=false / kubeProxyReplacement=false) or keep tierlb off this node"
            ),
        ));
    }
    if !unknown.is_empty() {
        out.push(Check::warn(
            "socket-programs",
            format!("other programs at the agent's attach points: {}", list(&unknown)),
            "they run beside tierlb's on every connect: make sure none of them rewrites addresses",
        ));
    }
    out
}

/// Other projects' tc programs on the node's devices (tcx; netlink filters are not listed).
pub(super) fn devices() -> Check {
    if !tc::kernel_has_tcx() {
        return Check::ok(
            "device-programs",
            "not listed: no tcx on this kernel (netlink filters are not read)",
        );
    }
    let mut found = Vec::new();
    for device in tc::all_devices() {
        for kind in [aya::programs::TcAttachType::Ingress, aya::programs::TcAttachType::Egress] {
            let Ok((_, progs)) = aya::programs::SchedClassifier::query_tcx(&device, kind) else { continue };
            for p in progs {
                let name = p.name_as_str().unwrap_or_default().to_owned();
                if !tc::TC_PROGRAMS.iter().any(|(n, _)| *n == name) {
                    found.push((device.clone(), name, p.id()));
                }
            }
        }
    }
    if found.is_empty() {
        return Check::ok("device-programs", "no other tcx program on the node's devices");
    }
    let list: Vec<String> = found.iter().map(|(d, n, id)| format!("{n} (id {id}) on {d}")).collect();
    let fix = match found.iter().find_map(|(_, n, _)| owner(n)) {
        Some(who) => format!(
            "{who}'s programs see packets from outside before tierlb's (tierlb attaches last): with {who}'s \
             NodePort handling on, keep tierlb off this node"
        ),
        None => {
            "they run before tierlb's tc programs (tierlb attaches last in each device's chain)".to_owned()
        }
    };
    Check::warn("device-programs", format!("other tc programs: {}", list.join(", ")), fix)
}

/// kube-proxy's rules: nftables mode's `kube-proxy` tables, iptables-nft's `KUBE-` chains, and whether legacy
/// iptables (whose chains are not read) has a nat table.
pub(super) fn kube_proxy() -> Vec<Check> {
    let mut out = Vec::new();
    match nft::chains() {
        Ok(chains) => {
            let mut tables: Vec<String> = chains
                .iter()
                .filter(|c| c.table == "kube-proxy" || c.name.starts_with("KUBE-"))
                .map(|c| format!("{} {}", c.family_name(), c.table))
                .collect();
            tables.sort();
            tables.dedup();
            let kube: Vec<&nft::Chain> = chains.iter().filter(|c| c.name.starts_with("KUBE-")).collect();
            if tables.is_empty() {
                out.push(Check::ok(
                    "kube-proxy-rules",
                    format!("none among {} nftables chains", chains.len()),
                ));
            } else {
                out.push(Check::warn(
                    "kube-proxy-rules",
                    format!(
                        "kube-proxy's rules are present (nftables: {}; {} KUBE- chains)",
                        tables.join(", "),
                        kube.len()
                    ),
                    "expected while replacing kube-proxy; once tierlb runs on this node, flush them with \
                     `kube-proxy --cleanup` (deploy/README.md, Install, step 5)",
                ));
            }
        }
        Err(e) => out.push(Check::warn("kube-proxy-rules", format!("nftables not readable: {e}"), "")),
    }
    let legacy = std::fs::read_to_string("/proc/net/ip_tables_names").unwrap_or_default();
    if legacy.lines().any(|l| l == "nat") {
        out.push(Check::warn(
            "iptables-legacy",
            "legacy iptables has a nat table; its chains are not read here",
            "if kube-proxy ran with iptables-legacy, flush its rules with `kube-proxy --cleanup`",
        ));
    }
    out
}

/// The agent's listen addresses are free (kube-proxy, still running, holds the same ones).
pub(super) fn ports(addrs: &[(Option<SocketAddr>, &str)]) -> Check {
    let mut free = Vec::new();
    for (addr, flag) in addrs {
        let Some(addr) = addr else { continue };
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Check::fail(
                "ports",
                format!("{addr} (the agent's {flag}) cannot be bound: {e}"),
                "kube-proxy still running on this node? Delete its DaemonSet first (deploy/README.md, \
                 Install, step 3), or give the agent another address",
            );
        }
        free.push(addr.to_string());
    }
    Check::ok(
        "ports",
        if free.is_empty() {
            "no listener asked for".to_owned()
        } else {
            format!("{} free", free.join(" and "))
        },
    )
}

/// Other agent instances pinned under `--bpffs`.
pub(super) fn instances(bpffs: &Path, instance: Option<&str>) -> Check {
    let found = pins::instances(bpffs, None).unwrap_or_default();
    let others: Vec<&str> =
        found.iter().map(|(n, _)| n.as_str()).filter(|n| instance.is_none_or(|i| i != *n)).collect();
    let mine = instance.is_some_and(|i| found.iter().any(|(n, _)| n == i));
    match (others.is_empty(), mine) {
        (true, false) => Check::ok("pins", format!("no agent has pinned under {} yet", bpffs.display())),
        (true, true) => Check::ok("pins", "this instance's pins, which the agent adopts".to_owned()),
        (false, _) => Check::warn(
            "pins",
            format!("other instances pinned under {}: {}", bpffs.display(), others.join(", ")),
            "an instance that no agent runs any more keeps its maps: `tierlb agent --cleanup --instance NAME`",
        ),
    }
}
