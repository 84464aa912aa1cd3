//! The north-south programs on the node's devices: `tc_ingress` and `tc_egress` attached to the devices that
//! hold the node's NodePort addresses (or `--devices`), with tcx links on kernels >= 6.6 (pinned, so they
//! outlive the agent like the cgroup links; a restarted agent attaches its programs next to the old ones and
//! then replaces the pin, which detaches the old ones) and netlink clsact filters below (which the kernel
//! keeps until they are removed; the program is pinned per device as their record, for `status` and
//! `--cleanup`). Attaching needs CAP_NET_ADMIN in the devices' network namespace.
use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{self, TcAttachOptions},
    },
};

mod maps;

pub use maps::{ConntrackStats, NsMaps, SourceRange, TableStats, sum_ns_counters};

use super::error::{DatapathError, bpf_err};

/// The tc programs, in the order they are attached on each device: both first ones on an Ethernet device
/// that holds NodePort addresses, `tc_egress` alone on the node's other Ethernet devices, `tc_egress_l3`
/// (the same, for a packet without an Ethernet header) on its L3 devices.
pub const TC_PROGRAMS: [(&str, TcAttachType); 3] = [
    ("tc_ingress", TcAttachType::Ingress),
    ("tc_egress", TcAttachType::Egress),
    ("tc_egress_l3", TcAttachType::Egress),
];

/// Where the tcx link of `program` on `device` is pinned.
pub fn tc_link_pin(dir: &Path, program: &str, device: &str) -> PathBuf {
    dir.join(format!("link_{program}@{device}"))
}

/// Where `program` is pinned for `device` when it is attached there by a netlink filter, which leaves no
/// link to pin: the record of the devices that `status` lists and `--cleanup` visits. Removing it does not
/// detach the filter (`detach` removes both).
pub fn tc_prog_pin(dir: &Path, program: &str, device: &str) -> PathBuf {
    dir.join(format!("prog_{program}@{device}"))
}

/// How the tc programs of an instance are attached, read off its pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attached {
    /// tcx links (`link_tc_*@DEVICE`).
    Tcx,
    /// netlink clsact filters (`prog_tc_*@DEVICE`).
    Netlink,
}

/// Whether tc programs are attached with tcx links: as `--tc-attach` says, or where the kernel has them.
pub fn has_tcx() -> bool {
    match AttachMode::current() {
        AttachMode::Tcx => true,
        AttachMode::Netlink => false,
        AttachMode::Auto => kernel_has_tcx(),
    }
}

/// Whether the running kernel has tcx (Linux 6.6), probed, not read off the version (a distribution kernel
/// may carry it back): asking for loopback's tcx programs (`BPF_PROG_QUERY` with a tcx attach type) succeeds
/// where tcx exists and fails with `EINVAL` before. Asked once per process.
pub fn kernel_has_tcx() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| SchedClassifier::query_tcx("lo", TcAttachType::Ingress).is_ok())
}

/// How the tc programs are attached (`--tc-attach`): tcx links from kernel 6.6, netlink clsact filters below
/// (`Auto`), or one of them forced (netlink on a newer kernel: a CNI that manages clsact filters, or the
/// tests of the path kernels 6.1-6.5 take).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// tcx where the kernel has it (6.6), else netlink.
    #[default]
    Auto,
    /// tcx links, pinned.
    Tcx,
    /// netlink filters on a clsact qdisc, at a fixed priority and handle (`NETLINK_PRIORITY`), replaced in
    /// place by a restarted agent.
    Netlink,
}

static ATTACH_MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl AttachMode {
    /// Set the process's attach mode (the agent, at start).
    pub fn set(self) {
        ATTACH_MODE.store(self as u8, std::sync::atomic::Ordering::Relaxed);
    }

    fn current() -> Self {
        match ATTACH_MODE.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Self::Tcx,
            2 => Self::Netlink,
            _ => Self::Auto,
        }
    }
}

/// The priority of tierlb's netlink filters (the handle is 1): fixed, so a restarted agent replaces its
/// filter in place (`cls_bpf` swaps the program atomically) instead of adding another, and high, so a CNI's
/// filters at the usual low numbers run first (as tcx's last place does).
pub const NETLINK_PRIORITY: u16 = 65_000;
const NETLINK_HANDLE: tc::TcHandle = tc::TcHandle::new(0, 1);

/// The devices of this network namespace that hold one of `addrs` (the node's NodePort addresses), sorted.
pub fn devices_holding(addrs: &[IpAddr]) -> Vec<String> {
    let out: BTreeSet<String> = interface_addresses()
        .into_iter()
        .filter(|(name, ip)| addrs.contains(ip) && name != "lo")
        .map(|(name, _)| name)
        .collect();
    out.into_iter().collect()
}

/// The devices a local backend's reply may leave by: every device of this network namespace but loopback
/// that holds a global unicast address (not loopback, link-local or multicast), sorted.
pub fn reply_devices() -> Vec<String> {
    let kinds = link_kinds();
    let out: BTreeSet<String> = interface_addresses()
        .into_iter()
        .filter(|(name, ip)| name != "lo" && is_global(ip) && kinds.contains_key(name))
        .map(|(n, _)| n)
        .collect();
    out.into_iter().collect()
}

/// How a device's packets start, for the tc programs: with an Ethernet header, or with the IP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// An Ethernet header (veth, physical NICs, bridges, VXLAN).
    Ethernet,
    /// WireGuard, tun, IPIP, SIT, raw IP: no link-layer header.
    L3,
}

/// The kind of a link-layer type (`ARPHRD_*`); `None` for the ones the programs do not parse (loopback,
/// InfiniBand and the rest).
#[must_use]
pub const fn link_kind(hatype: u16) -> Option<LinkKind> {
    match hatype {
        1 => Some(LinkKind::Ethernet),
        // ARPHRD_RAWIP, ARPHRD_TUNNEL, ARPHRD_TUNNEL6, ARPHRD_SIT, ARPHRD_NONE. Not ARPHRD_IPGRE: a GRE device
        // without a fixed remote has a header of its own (the outer IP and GRE headers) at tc egress.
        519 | 768 | 769 | 776 | 65534 => Some(LinkKind::L3),
        _ => None,
    }
}

/// The node's devices the tc programs parse, by kind.
fn link_kinds() -> std::collections::BTreeMap<String, LinkKind> {
    all_devices().into_iter().filter_map(|d| Some((d.clone(), device_kind(&d)?))).collect()
}

/// The kind of `device` (`None`: absent, or of a type the programs do not parse), from its link-layer type
/// (`SIOCGIFHWADDR`, which gives it for every device: `getifaddrs` has no link entry for a device without
/// a hardware address, such as a tun or WireGuard device).
pub fn device_kind(device: &str) -> Option<LinkKind> {
    let (sock, mut req) = super::sys::device_request(device)?;
    // SAFETY: SIOCGIFHWADDR reads the name and writes the hardware address into the ifreq it is given.
    let rc =
        unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&sock), libc::SIOCGIFHWADDR, &raw mut req) };
    if rc != 0 {
        return None;
    }
    // SAFETY: the kernel wrote the hardware address member of the union.
    link_kind(unsafe { req.ifr_ifru.ifru_hwaddr.sa_family })
}

/// A global unicast address: not loopback, link-local, multicast or unspecified.
pub fn is_global(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !(a.is_loopback() || a.is_link_local() || a.is_multicast() || a.is_unspecified()),
        IpAddr::V6(a) => {
            !(a.is_loopback() || a.is_unicast_link_local() || a.is_multicast() || a.is_unspecified())
        }
    }
}

/// The index of the device of that name in this network namespace, if there is one.
pub fn device_index(device: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(device).ok()
}

/// Every address on an interface of this network namespace, with the interface's name.
pub fn interface_addresses() -> Vec<(String, IpAddr)> {
    let Ok(ifs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    ifs.filter_map(|ifa| {
        let a = ifa.address?;
        let ip = a
            .as_sockaddr_in()
            .map(|s| IpAddr::V4(s.ip()))
            .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))?;
        Some((ifa.interface_name, ip))
    })
    .collect()
}

/// The node's ephemeral port range (`net.ipv4.ip_local_port_range` of this network namespace, which IPv6
/// sockets use too), `None` if it cannot be read.
pub fn ephemeral_ports() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
        _ => None,
    }
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, DatapathError> {
    let p = ebpf.program_mut(name).ok_or_else(|| DatapathError::Bpf {
        what: format!("program {name} missing"),
        source: "absent".into(),
    })?;
    p.try_into().map_err(|e| bpf_err(format!("program {name}"), e))
}

/// Attach both tc programs to `device`. With tcx and `pin_dir`, the links are pinned there (replacing an
/// earlier agent's without a gap); with netlink, a clsact qdisc is added if the device has none.
pub fn attach(ebpf: &mut Ebpf, device: &str, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
    attach_programs(ebpf, device, pin_dir, &TC_PROGRAMS[..2])
}

/// Attach the egress program alone to `device` (`tc_egress`, or `tc_egress_l3` on an L3 device): a device
/// that holds no NodePort address but by which a local backend's reply may leave (policy routing, a second
/// uplink, a tunnel), so the reply is translated whatever device it leaves by.
pub fn attach_egress(ebpf: &mut Ebpf, device: &str, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
    let program = if device_kind(device) == Some(LinkKind::L3) { 2 } else { 1 };
    attach_programs(ebpf, device, pin_dir, &TC_PROGRAMS[program..=program])
}

fn attach_programs(
    ebpf: &mut Ebpf,
    device: &str,
    pin_dir: Option<&Path>,
    programs: &[(&str, TcAttachType)],
) -> Result<(), DatapathError> {
    let tcx = has_tcx();
    if !tcx {
        // EEXIST: the device has a clsact qdisc already (a CNI's, or ours from an earlier start). aya 0.14
        // reports it as the netlink error, not `AlreadyAttached`: taken for a failure, it kept every restart
        // of the agent from attaching on kernels without tcx (the first start's programs stayed).
        if let Err(e) = tc::qdisc_add_clsact(device)
            && !matches!(e, tc::TcError::AlreadyAttached)
            && !matches!(&e, tc::TcError::NetlinkError(n) if n.raw_os_error() == Some(libc::EEXIST))
        {
            return Err(bpf_err(format!("adding a clsact qdisc to {device}"), e));
        }
    }
    for &(name, kind) in programs {
        let p = classifier(ebpf, name)?;
        let attaching = |e| bpf_err(format!("attaching {name} to device {device} (needs CAP_NET_ADMIN)"), e);
        let id = if tcx {
            // Last in the device's chain: a CNI's own programs keep their place before ours.
            p.attach_with_options(device, kind, TcAttachOptions::TcxOrder(LinkOrder::last()))
                .map_err(attaching)?
        } else {
            attach_netlink(p, device, name, kind).map_err(attaching)?
        };
        if !tcx {
            // Netlink filters stay with the device after the agent exits; `detach` removes them. The program
            // is pinned per device as the record of where it is (a restarted agent's replaces it).
            let link = p.take_link(id).map_err(|e| bpf_err(format!("link of {name}"), e))?;
            std::mem::forget(link);
            if let Some(dir) = pin_dir {
                let path = tc_prog_pin(dir, name, device);
                let fresh = dir.join(format!("prog_{name}@{device}_new"));
                let _ = std::fs::remove_file(&fresh);
                p.pin(&fresh).map_err(|e| bpf_err(format!("pinning {name} for {device}"), e))?;
                std::fs::rename(&fresh, &path)
                    .map_err(|e| bpf_err(format!("replacing {}", path.display()), e))?;
            }
            continue;
        }
        let Some(dir) = pin_dir else { continue };
        let link = p.take_link(id).map_err(|e| bpf_err(format!("taking the link of {name}"), e))?;
        let link = FdLink::try_from(link).map_err(|e| bpf_err(format!("link of {name}"), e))?;
        let path = tc_link_pin(dir, name, device);
        // bpffs refuses names with a dot (`bpf_lookup`): no extension.
        let fresh = dir.join(format!("link_{name}@{device}_new"));
        super::sys::detach_link_pin(&fresh);
        link.pin(&fresh).map_err(|e| bpf_err(format!("pinning the link of {name} on {device}"), e))?;
        // The previous agent's link, replaced by the rename, is detached at once rather than when the kernel
        // releases it: one program of each kind on the device when the attach returns.
        let previous = super::sys::open_pin(&path);
        std::fs::rename(&fresh, &path).map_err(|e| bpf_err(format!("replacing {}", path.display()), e))?;
        if let Some(previous) = previous {
            super::sys::detach_link(&previous);
        }
    }
    Ok(())
}

/// Attach `p` (named `name`) to `device` by netlink at `NETLINK_PRIORITY`: replace our filter there in place
/// (an earlier agent's; no moment without a program), or, where there is none, remove any filter of ours at
/// another priority (an earlier version added one at a new priority on every start) and add it.
fn attach_netlink(
    p: &mut SchedClassifier,
    device: &str,
    name: &str,
    kind: TcAttachType,
) -> Result<tc::SchedClassifierLinkId, aya::programs::ProgramError> {
    let ours = tc::SchedClassifierLink::attached(device, kind, NETLINK_PRIORITY, NETLINK_HANDLE, None)
        .map_err(tc::TcError::IoError)?;
    if let Ok(id) = p.attach_to_link(ours) {
        return Ok(id);
    }
    let _ = tc::qdisc_detach_program(device, kind, name);
    let opts = tc::NlOptions { priority: NETLINK_PRIORITY, handle: NETLINK_HANDLE, ..Default::default() };
    p.attach_with_options(device, kind, TcAttachOptions::Netlink(opts))
}

/// Every device of this network namespace (`if_nameindex`), for the netlink filters, which leave no pin.
pub fn all_devices() -> Vec<String> {
    nix::net::if_::if_nameindex()
        .map(|ifs| ifs.iter().map(|i| i.name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// The devices an instance's tc programs are on, by their pins (`link_tc_*@DEVICE` for tcx links,
/// `prog_tc_*@DEVICE` for netlink filters), sorted.
pub fn pinned_devices(dir: &Path) -> Vec<String> {
    pinned(dir).into_iter().map(|(dev, _)| dev).collect::<BTreeSet<_>>().into_iter().collect()
}

/// How an instance's tc programs are attached, by their pins (`None`: on no device).
pub fn pinned_attach(dir: &Path) -> Option<Attached> {
    let kinds: BTreeSet<bool> = pinned(dir).into_iter().map(|(_, tcx)| tcx).collect();
    kinds.last().map(|&tcx| if tcx { Attached::Tcx } else { Attached::Netlink })
}

/// Each tc pin of an instance as (device, whether it is a tcx link).
fn pinned(dir: &Path) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let (rest, tcx) = match (name.strip_prefix("link_tc_"), name.strip_prefix("prog_tc_")) {
                (Some(rest), _) => (rest, true),
                (_, Some(rest)) => (rest, false),
                _ => continue,
            };
            if let Some((_, dev)) = rest.split_once('@')
                && !dev.ends_with("_new")
            {
                out.push((dev.to_owned(), tcx));
            }
        }
    }
    out
}

/// The pins of `device`'s tc programs in `dir` that exist (tcx links and netlink records).
pub fn device_pins(dir: &Path, device: &str) -> Vec<PathBuf> {
    TC_PROGRAMS
        .iter()
        .flat_map(|(name, _)| [tc_link_pin(dir, name, device), tc_prog_pin(dir, name, device)])
        .filter(|p| p.exists())
        .collect()
}

/// Detach tierlb's tc programs from `device`: remove the pinned tcx links (which detaches them), or the
/// netlink filters of our programs and their pins.
pub fn detach(dir: Option<&Path>, device: &str) {
    let mut netlink = !has_tcx();
    if let Some(dir) = dir {
        super::xdp::detach(dir, device);
        for p in device_pins(dir, device) {
            netlink |= p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("prog_"));
            super::sys::detach_link_pin(&p);
        }
    }
    if netlink {
        detach_netlink(device);
    }
}

/// Remove the netlink filters of our programs from `device` (none there: nothing done).
pub fn detach_netlink(device: &str) {
    for (name, kind) in TC_PROGRAMS {
        let _ = tc::qdisc_detach_program(device, kind, name);
    }
}
