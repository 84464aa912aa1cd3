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
use lb_common::{MAP_COUNTERS, MAPS, PINNED_MAPS};

mod maps;
pub use maps::{KernelMaps, sum_per_cpu};

pub(crate) use super::error::bpf_err;
pub use super::{
    capacity::Capacities,
    error::{DatapathError, MIN_KERNEL},
    programs::{HEALTH_PROGRAM, PROGRAMS, RELEASE_PROGRAM},
};

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
    /// Maps of the previous layout being carried into this one: copied already; `finish` it once every
    /// program is attached (`migrate`).
    pub migration: super::migrate::Plan,
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
        let udp_per_netns = lb_common::udp_per_netns(caps.reverse);
        let mut loader = EbpfLoader::new();
        for name in MAPS.iter().chain(&lb_common::NS_MAPS) {
            loader.map_max_entries(name, super::layout::map_size(name, caps).entries);
        }
        loader.override_global(lb_common::GLOBAL_UDP_PER_NETNS, &udp_per_netns, true);
        let paths: Vec<(&str, PathBuf)> = pin_dir
            .map(|d| PINNED_MAPS.iter().map(|m| (*m, super::layout::pin_path(d, m))).collect())
            .unwrap_or_default();
        // A map of the previous layout is migrated: its new generation is created beside it (under another
        // name) and filled before anything is attached.
        let mut migration = match pin_dir {
            Some(d) => super::migrate::plan(d)?,
            None => super::migrate::Plan::default(),
        };
        if pin_dir.is_some() {
            super::layout::check_pinned_layout(&paths, caps)?;
        }
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        // A counter map pinned by an earlier agent is reused with its counts; else the load creates it zeroed.
        let counters_created = !paths.iter().any(|(name, path)| *name == MAP_COUNTERS && path.exists());
        let mut ebpf = loader.load(object).map_err(|e| bpf_err("loading the BPF object", e))?;
        verify_all(&mut ebpf)?;
        let maps = KernelMaps::from_ebpf(&mut ebpf, caps, counters_created)?;
        let ns = super::tc::NsMaps::from_ebpf(&mut ebpf)?;
        migration.copy()?;
        Ok(Self { programs: Programs { ebpf }, maps, ns, migration })
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
            super::sys::detach_link_pin(&fresh);
            link.pin(&fresh).map_err(|e| bpf_err(format!("pinning the link of {name}"), e))?;
            // rename(2) over the old pin drops the old link's last reference; the old program is detached
            // only now, after the new one is attached, and at once (not when the kernel releases the link).
            let previous = super::sys::open_pin(&path);
            std::fs::rename(&fresh, &path)
                .map_err(|e| bpf_err(format!("replacing {}", path.display()), e))?;
            if let Some(previous) = previous {
                super::sys::detach_link(&previous);
            }
        }
        Ok(())
    }
}

impl Programs {
    /// Each program of `PROGRAMS` with its kernel id (what `attached::check` looks for on the cgroup).
    pub fn ids(&mut self) -> Result<Vec<(&'static str, Option<u32>)>, DatapathError> {
        let mut out = Vec::new();
        for name in PROGRAMS {
            let info = program(&mut self.ebpf, name)?
                .info()
                .map_err(|e| bpf_err(format!("reading {name}'s id"), e))?;
            out.push((*name, Some(info.id())));
        }
        Ok(out)
    }

    /// Attach the tc programs to `device` (see `tc::attach`), then `xdp_ingress` as `--xdp` says
    /// (`xdp::attach`): how XDP is attached there, if it is. An XDP failure leaves tc's programs in place.
    pub fn attach_device(
        &mut self,
        device: &str,
        pin_dir: Option<&Path>,
    ) -> Result<Result<Option<super::xdp::XdpAttached>, DatapathError>, DatapathError> {
        super::tc::attach(&mut self.ebpf, device, pin_dir)?;
        Ok(super::xdp::attach(&mut self.ebpf, device, pin_dir))
    }

    /// The kernel id of the loaded program `name` (`None`: not loaded, or no such program).
    pub fn id(&mut self, name: &str) -> Option<u32> {
        program(&mut self.ebpf, name).ok()?.info().ok().map(|i| i.id())
    }

    /// Attach `xdp_ingress` alone to `device` as the process's `XdpSetting` says (`xdp::attach`), tc's
    /// programs as they are (the bench's XDP rows switch it on and off between runs).
    pub fn attach_xdp(
        &mut self,
        device: &str,
        pin_dir: Option<&Path>,
    ) -> Result<Option<super::xdp::XdpAttached>, DatapathError> {
        super::xdp::attach(&mut self.ebpf, device, pin_dir)
    }

    /// Detach `xdp_ingress` from every device this process attached it to without a pin, and unload it
    /// (the next `attach_xdp` loads it again).
    pub fn detach_xdp(&mut self) -> Result<(), DatapathError> {
        match program(&mut self.ebpf, super::xdp::XDP_PROGRAM)? {
            Program::Xdp(p) => p.unload().map_err(|e| bpf_err("unloading xdp_ingress", e)),
            _ => Err(wrong_type(super::xdp::XDP_PROGRAM)),
        }
    }

    /// Attach the tc egress program alone to `device` (`tc::attach_egress`).
    pub fn attach_egress(&mut self, device: &str, pin_dir: Option<&Path>) -> Result<(), DatapathError> {
        super::tc::attach_egress(&mut self.ebpf, device, pin_dir)
    }
}

/// Load (verify) every program of `PROGRAMS` and the tc programs, on two threads: the kernel verifies a
/// program on the thread that loads it, and one after another they took over a second, on the start's
/// critical path whenever the source is quicker (at 10,000 Services). Each thread takes the next program
/// left, the costliest first (`COSTLIEST_FIRST`), so that the two finish close together.
fn verify_all(ebpf: &mut Ebpf) -> Result<(), DatapathError> {
    let wanted: Vec<&str> =
        PROGRAMS.iter().copied().chain(super::tc::TC_PROGRAMS.iter().map(|(name, _)| *name)).collect();
    for name in &wanted {
        program(ebpf, name)?; // in the object
    }
    let mut queue: Vec<(&str, &mut Program)> =
        ebpf.programs_mut().filter(|(name, _)| wanted.contains(name)).collect();
    queue.sort_by_key(|(name, _)| COSTLIEST_FIRST.iter().position(|c| c == name).unwrap_or(usize::MAX));
    let queue = std::sync::Mutex::new(queue.into_iter());
    let work = || loop {
        let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).next();
        match next {
            Some((name, p)) => verify(name, p)?,
            None => return Ok(()),
        }
    };
    std::thread::scope(|s| {
        let other = s.spawn(work);
        let here = work();
        here.and(other.join().expect("a verifying thread panicked"))
    })
}

/// The programs the verifier takes longest over, longest first (timed one by one on kernel 6.18: sendmsg6 about
/// 335 ms, connect6 305, sendmsg4 160, tc_ingress 125, connect4 110; the others under 20 ms each).
const COSTLIEST_FIRST: [&str; 5] = ["sendmsg6", "connect6", "sendmsg4", "tc_ingress", "connect4"];

fn verify(name: &str, p: &mut Program) -> Result<(), DatapathError> {
    let verified = match p {
        Program::CgroupSockAddr(p) => p.load(),
        Program::CgroupSock(p) => p.load(),
        Program::SockOps(p) => p.load(),
        Program::SchedClassifier(p) => p.load(),
        _ => return Err(wrong_type(name)),
    };
    verified.map_err(|e| bpf_err(format!("verifying program {name}"), e))
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
