//! Where the agent is pointed and what it holds: the cgroup (v2), the bpffs, the capabilities.
use std::path::Path;

use super::Check;
use crate::{cgroup::Hierarchy, datapath::pins};

/// The capabilities the agent uses, with why (deploy/daemonset.yaml adds exactly these).
const NEEDED: [(u32, &str, &str); 3] = [
    (39, "CAP_BPF", "create maps and load programs"),
    (12, "CAP_NET_ADMIN", "load cgroup sock_addr and tc programs, attach tc, end sockets"),
    (21, "CAP_SYS_ADMIN", "enter pods' network namespaces to end their stale UDP sockets"),
];

/// The effective capabilities (`CapEff` of /proc/self/status) against `NEEDED`.
pub(super) fn capabilities() -> Check {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(eff) = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    else {
        return Check::warn("capabilities", "CapEff not found in /proc/self/status", "");
    };
    let missing: Vec<String> = NEEDED
        .iter()
        .filter(|(bit, _, _)| eff & (1 << bit) == 0)
        .map(|(_, name, why)| format!("{name} ({why})"))
        .collect();
    let names: Vec<&str> = NEEDED.iter().map(|(_, n, _)| *n).collect();
    if missing.is_empty() {
        Check::ok("capabilities", names.join(", "))
    } else {
        Check::fail(
            "capabilities",
            format!("missing {}", missing.join(", ")),
            "run as root, or add BPF, NET_ADMIN and SYS_ADMIN to the container's capabilities as \
             deploy/daemonset.yaml does",
        )
    }
}

/// `--cgroup` is a cgroup v2 directory (the sock_addr programs attach to nothing else).
pub(super) fn cgroup(path: &Path) -> Check {
    let shown = path.display();
    let elsewhere = || {
        let found: Vec<String> =
            crate::cgroup::cgroup2_mounts().iter().map(|m| m.display().to_string()).collect();
        if found.is_empty() {
            "mount cgroup2 (`mount -t cgroup2 none /sys/fs/cgroup`, or boot with systemd's unified hierarchy) \
             and pass it as --cgroup"
                .to_owned()
        } else {
            format!("pass the cgroup2 mount as --cgroup: {}", found.join(", "))
        }
    };
    match crate::cgroup::hierarchy(path) {
        Some(Hierarchy::V2) => Check::ok("cgroup", format!("{shown} is cgroup v2")),
        Some(Hierarchy::V1) => Check::fail(
            "cgroup",
            format!("{shown} is a cgroup v1 hierarchy: the programs attach only to cgroup v2"),
            elsewhere(),
        ),
        Some(Hierarchy::None) => {
            Check::fail("cgroup", format!("{shown} is not a cgroup v2 directory"), elsewhere())
        }
        None => Check::fail("cgroup", format!("{shown} cannot be read"), elsewhere()),
    }
}

/// `--bpffs` is on a bpf filesystem (or will be: the nearest directory above it that exists is).
pub(super) fn bpffs(path: &Path) -> Check {
    match pins::check_bpffs_nearest(path) {
        Ok(()) => Check::ok("bpffs", format!("{} is on a bpf filesystem", path.display())),
        Err(e) => Check::fail(
            "bpffs",
            e.to_string(),
            "mount bpffs there (`mount -t bpf bpf /sys/fs/bpf`), or \
            pass --bpffs under a bpffs mount; the DaemonSet mounts the node's /sys/fs/bpf",
        ),
    }
}
