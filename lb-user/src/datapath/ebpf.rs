//! The kernel side: load the embedded object, attach its programs to a cgroup, and read/write its maps.
use std::{
    fs::File,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        Program,
        links::{CgroupAttachMode, FdLink},
    },
};
use lb_common::{MAPS, PINNED_MAPS};

mod maps;
pub use maps::KernelMaps;

/// The programs in the object, by function name; all are attached to the agent's cgroup. All are
/// `cgroup/sock_addr` programs but `RELEASE_PROGRAM` and `HEALTH_PROGRAM`.
pub const PROGRAMS: &[&str] = &[
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
    "recvmsg4",
    "recvmsg6",
    "getpeername4",
    "getpeername6",
    RELEASE_PROGRAM,
    HEALTH_PROGRAM,
];

/// The `sock_ops` program: passive health, from the outcome of the TCP connects the others translated.
pub const HEALTH_PROGRAM: &str = "sock_ops";

/// The `cgroup/sock_release` program: deletes a closed socket's reverse entries outside its own storage.
pub const RELEASE_PROGRAM: &str = "sock_release";

/// Oldest kernel tierlb supports: `bpf_set_retval` from cgroup sock_addr programs needs 5.18; 6.1 is the
/// oldest LTS with everything the data path uses and is what is tested.
pub const MIN_KERNEL: (u32, u32) = (6, 1);

/// The maps' sizes, set before load (`EbpfLoader::set_max_entries`); the defaults are lb_common's.
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    /// Frontends (VIP, port, protocol) and service ids.
    pub services: u32,
    /// Backend slots, summed over every frontend's tiers.
    pub slots: u32,
    /// Backends `BACKEND_STATE` can mark down at once.
    pub backends: u32,
    /// Reverse entries (socket, backend) -> VIP of TCP sockets and unconnected UDP (the LRU), and connected UDP sockets tracked
    /// at once for destruction.
    pub reverse: u32,
    /// sessionAffinity entries (frontend, client) remembered at once (an LRU).
    pub affinity: u32,
    /// Conntrack entries of traffic from outside the node (an LRU, two per flow).
    pub conntrack: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            services: lb_common::DEFAULT_MAX_FRONTENDS,
            slots: lb_common::DEFAULT_MAX_SLOTS,
            backends: lb_common::DEFAULT_MAX_BACKENDS,
            reverse: lb_common::DEFAULT_MAX_REVERSE,
            affinity: lb_common::DEFAULT_MAX_AFFINITY,
            conntrack: lb_common::DEFAULT_MAX_CONNTRACK,
        }
    }
}

/// Why the data path could not be loaded, attached or opened.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The binary was built without the BPF object.
    #[error(
        "this tierlb binary carries no BPF object (it was built with AYA_BUILD_SKIP=1); rebuild it with \
         `cargo xtask build`"
    )]
    NoObject,
    /// The running kernel is older than `MIN_KERNEL`.
    #[error("kernel {found} is too old: tierlb needs Linux >= {}.{} with BTF and cgroup2", MIN_KERNEL.0, MIN_KERNEL.1)]
    KernelTooOld {
        /// The kernel's release, as `uname -r` prints it.
        found: String,
    },
    /// A BPF operation failed with EPERM: the process lacks privileges.
    #[error(
        "permission denied while {what}: run the agent as root, or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN"
    )]
    Permission {
        /// The operation, as "loading the BPF object".
        what: String,
        /// aya's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A BPF operation failed otherwise.
    #[error("{what}")]
    Bpf {
        /// The operation, as "map FRONTENDS".
        what: String,
        /// aya's error, or what was missing.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The object lacks a map the agent needs (an object from another version).
    #[error("map {name} is missing from the BPF object")]
    MissingMap {
        /// The map's name (one of `MAPS`).
        name: &'static str,
    },
    /// A pinned map's key or value size differs from this version's.
    #[error(
        "pinned map {path} has another layout (left by another tierlb version): remove the old state with \
         `tierlb agent --cleanup --bpffs DIR --node NAME`, then start the agent again"
    )]
    Incompatible {
        /// The pin.
        path: PathBuf,
    },
    /// The pinned backend-state map is the one of a tierlb whose marks never expired (4-byte values): its
    /// marks cannot be carried over as they are, and its programs read it.
    #[error(
        "pinned map {} holds backend marks of an older tierlb, without an expiry (4-byte values; marks now \
         last `--for` a bounded time): remove the old state with `tierlb agent --cleanup --bpffs DIR --node \
         NAME` (connects are not translated until the agent is back), start the agent, then mark again what \
         should stay down (`tierlb backend down ADDR --for DURATION`)",
        path.display()
    )]
    MarksWithoutExpiry {
        /// The pin.
        path: PathBuf,
    },
    /// A pinned map was made with another capacity than the flags ask for now; reusing it would silently
    /// ignore the flag (and a full map's error would advise raising a flag that has no effect).
    #[error(
        "pinned map {} was made for --max-{flag} {pinned} but the agent now asks for --max-{flag} {wanted}: \
         start it with --max-{flag} {pinned}, or remove the old state with `tierlb agent --cleanup --bpffs DIR \
         --node NAME` (connects are not translated until the agent is back) and start again",
        path.display()
    )]
    Capacity {
        /// The pin.
        path: PathBuf,
        /// The flag that sizes it (without `--max-`).
        flag: &'static str,
        /// The flag's value the pinned map was made for.
        pinned: u32,
        /// The flag's value now.
        wanted: u32,
    },
    /// A pinned map could not be opened or inspected.
    #[error("cannot open pinned map {path}: {source} (is an agent running with this --bpffs?)")]
    Pinned {
        /// The pin.
        path: PathBuf,
        /// aya's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn is_eperm(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            // EACCES from BPF_PROG_LOAD is the verifier rejecting the program, not a permission problem.
            if io.raw_os_error() == Some(libc::EPERM) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

pub(crate) fn bpf_err<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
    e: E,
) -> DatapathError {
    let what = what.into();
    if is_eperm(&e) {
        DatapathError::Permission { what, source: Box::new(e) }
    } else {
        DatapathError::Bpf { what, source: Box::new(e) }
    }
}

/// `uname -r` parsed as (major, minor), with the whole release for messages.
pub fn kernel_version() -> Option<(u32, u32, String)> {
    let release = nix::sys::utsname::uname().ok()?.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor, release))
}

/// Refuse kernels older than `MIN_KERNEL` with a message naming the release; an unparsable release passes
/// (the load then says what is missing).
pub fn check_kernel() -> Result<(), DatapathError> {
    match kernel_version() {
        Some((major, minor, release)) if (major, minor) < MIN_KERNEL => {
            Err(DatapathError::KernelTooOld { found: release })
        }
        _ => Ok(()),
    }
}

/// The embedded BPF object, if this binary was built with it.
pub fn embedded_object() -> Option<&'static [u8]> {
    #[cfg(embedded_ebpf)]
    {
        Some(aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf")))
    }
    #[cfg(not(embedded_ebpf))]
    {
        None
    }
}

/// The loaded programs and their maps.
pub struct Loaded {
    /// The programs of `PROGRAMS`, to attach.
    pub programs: Programs,
    /// The maps, for a `Reconciler`.
    pub maps: KernelMaps,
    /// The north-south maps (local endpoints, settings, conntrack).
    pub ns: super::tc::NsMaps,
}

/// The loaded programs. Dropping it detaches every program attached without pinning its link.
pub struct Programs {
    ebpf: Ebpf,
}

impl Loaded {
    /// Load the embedded object with the given capacities and load (verify) every program.
    ///
    /// With `pin_dir`, every map is pinned there as `DIR/<MAP NAME>`, and maps already pinned there (by an
    /// earlier agent) are reused with their contents: that is how a restarted agent keeps traffic flowing.
    /// Reused maps must have this version's layout.
    pub fn load(caps: Capacities, pin_dir: Option<&Path>) -> Result<Self, DatapathError> {
        check_kernel()?;
        let object = embedded_object().ok_or(DatapathError::NoObject)?;
        let mut loader = EbpfLoader::new();
        for name in MAPS.iter().chain(&lb_common::NS_MAPS) {
            loader.map_max_entries(name, super::layout::map_size(name, caps).entries);
        }
        let paths: Vec<(&str, PathBuf)> =
            pin_dir.map(|d| PINNED_MAPS.iter().map(|m| (*m, d.join(m))).collect()).unwrap_or_default();
        if pin_dir.is_some() {
            super::layout::check_pinned_layout(&paths, caps)?;
        }
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(object).map_err(|e| bpf_err("loading the BPF object", e))?;
        for name in PROGRAMS {
            let verified = match program(&mut ebpf, name)? {
                Program::CgroupSockAddr(p) => p.load(),
                Program::CgroupSock(p) => p.load(),
                Program::SockOps(p) => p.load(),
                _ => return Err(wrong_type(name)),
            };
            verified.map_err(|e| bpf_err(format!("verifying program {name}"), e))?;
        }
        super::tc::load(&mut ebpf)?;
        let maps = KernelMaps::from_ebpf(&mut ebpf, caps)?;
        let ns = super::tc::NsMaps::from_ebpf(&mut ebpf)?;
        Ok(Self { programs: Programs { ebpf }, maps, ns })
    }
}

impl Programs {
    /// Attach every program to the cgroup (already checked with `cgroup::check`).
    ///
    /// With `pin_dir`, each link is pinned there, so the programs stay attached after the agent exits; links
    /// an earlier agent pinned there are replaced without a gap: the new program is attached next to the old
    /// one first (cgroup links are always multi-attach; the second to run sees an address the first already rewrote, which is no
    /// VIP, and leaves it alone), then the old pin is removed, which detaches the old program.
    pub fn attach(&mut self, cgroup: &Path, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
        let file =
            File::open(cgroup).map_err(|e| bpf_err(format!("opening cgroup {}", cgroup.display()), e))?;
        for name in PROGRAMS {
            let attaching = |e| bpf_err(format!("attaching {name} to {}", cgroup.display()), e);
            let taking = |e| bpf_err(format!("taking the link of {name}"), e);
            let linking = |e| bpf_err(format!("link of {name}"), e);
            // With a BPF link (kernel >= 5.7, what aya uses) the kernel always attaches in multi mode and
            // rejects BPF_F_ALLOW_MULTI in the link flags, so `Single` (flags 0) is the mode that works and
            // already lets the new program sit next to an old one. Without a pin directory the link stays
            // with the program (dropping `Programs` detaches).
            let link = match program(&mut self.ebpf, name)? {
                Program::CgroupSockAddr(p) => {
                    let id = p.attach(&file, CgroupAttachMode::Single).map_err(attaching)?;
                    if pin_dir.is_none() {
                        continue;
                    }
                    FdLink::try_from(p.take_link(id).map_err(taking)?).map_err(linking)?
                }
                Program::CgroupSock(p) => {
                    let id = p.attach(&file, CgroupAttachMode::Single).map_err(attaching)?;
                    if pin_dir.is_none() {
                        continue;
                    }
                    FdLink::try_from(p.take_link(id).map_err(taking)?).map_err(linking)?
                }
                Program::SockOps(p) => {
                    let id = p.attach(&file, CgroupAttachMode::Single).map_err(attaching)?;
                    if pin_dir.is_none() {
                        continue;
                    }
                    FdLink::try_from(p.take_link(id).map_err(taking)?).map_err(linking)?
                }
                _ => return Err(wrong_type(name)),
            };
            let Some(dir) = pin_dir else { continue };
            let path = super::pins::link_pin(dir, name);
            let fresh = super::pins::new_link_pin(dir, name);
            let _ = std::fs::remove_file(&fresh);
            link.pin(&fresh).map_err(|e| bpf_err(format!("pinning the link of {name}"), e))?;
            // rename(2) over the old pin drops the old link's last reference: the old program detaches only
            // now, after the new one is attached.
            std::fs::rename(&fresh, &path)
                .map_err(|e| bpf_err(format!("replacing {}", path.display()), e))?;
        }
        Ok(())
    }
}

impl Programs {
    /// Attach the tc programs to `device` (see `tc::attach`).
    pub fn attach_device(&mut self, device: &str, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
        super::tc::attach(&mut self.ebpf, device, pin_dir)
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Program, DatapathError> {
    ebpf.program_mut(name).ok_or_else(|| DatapathError::Bpf {
        what: format!("program {name} missing"),
        source: "absent".into(),
    })
}

fn wrong_type(name: &str) -> DatapathError {
    DatapathError::Bpf {
        what: format!("program {name} has the wrong type"),
        source: "neither cgroup/sock_addr nor cgroup/sock".into(),
    }
}
