//! Pinning: where an agent instance keeps its maps and program links on a bpffs, so that they outlive the
//! agent (a restarted agent adopts them; `tierlb status`, `tierlb backend` and `tierlb trace` open them),
//! and how they are found and removed again.
//!
//! Layout: `BPFFS/<instance>/<MAP NAME>` for each of `lb_common::PINNED_MAPS` (the maps, the socket storage
//! and the trace maps), `BPFFS/<instance>/link_<program>` for each attached program (`programs::PROGRAMS`, the
//! eight sock_addr programs, `sock_release` and `sock_ops`).
use std::path::{Path, PathBuf};

use lb_common::{MAP_FRONTENDS, PINNED_MAPS};

use super::programs::PROGRAMS;

/// Where `status`, `backend` and `trace` look for agents' pins by default.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf/tierlb";

/// The environment variable that sets `--bpffs` when the flag is not given: the DaemonSet sets it to where
/// it mounts the node's bpffs, so `kubectl exec ds/tierlb -- tierlb status` needs no flag.
pub const BPFFS_ENV: &str = "TIERLB_BPFFS";

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// A pin directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The directory does not exist or cannot be read.
    #[error("--bpffs {}: cannot read it; create it and mount bpffs there (`mount -t bpf bpf DIR`)", dir.display())]
    Unreadable {
        /// The `--bpffs` directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// The directory (or, while it does not exist, the nearest one above it) is on another filesystem: pins
    /// there would fail.
    #[error(
        "--bpffs {}: {} is not on a bpf filesystem; mount one there (`mount -t bpf bpf {}`) or use a directory \
         under /sys/fs/bpf",
        dir.display(),
        checked.display(),
        checked.display()
    )]
    NotBpffs {
        /// The `--bpffs` directory.
        dir: PathBuf,
        /// The directory whose filesystem was checked: `dir`, or its nearest existing parent.
        checked: PathBuf,
    },
    /// The directory does not exist: no agent pins there.
    #[error(
        "--bpffs {}: no such directory, so no agent pins there: pass the agent's --bpffs, or set {BPFFS_ENV} \
         to it (the DaemonSet's pod has it set)",
        dir.display()
    )]
    Missing {
        /// The `--bpffs` directory.
        dir: PathBuf,
    },
    /// No agent instance has pinned maps there.
    #[error("no agent instance{} pinned under {} (start `tierlb agent --bpffs {}`)",
        only.as_deref().map(|o| format!(" {o}")).unwrap_or_default(), dir.display(), dir.display())]
    NoInstance {
        /// The `--bpffs` directory.
        dir: PathBuf,
        /// The instance asked for, if one was.
        only: Option<String>,
    },
    /// Listing or removing pins failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// What was being read or removed.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PinError + '_ {
    move |source| PinError::Io { path: path.to_owned(), source }
}

/// Check that `dir` is on a bpffs (pins anywhere else fail, and late).
pub fn check_bpffs(dir: &Path) -> Result<(), PinError> {
    check_bpffs_at(dir, dir)
}

/// Check that `dir`, or while it does not exist the nearest directory above it, is on a bpffs (where the
/// agent's `prepare` would create it).
pub fn check_bpffs_nearest(dir: &Path) -> Result<(), PinError> {
    let existing = dir.ancestors().find(|d| d.exists()).unwrap_or(dir);
    check_bpffs_at(dir, existing)
}

/// Check that `checked` (`dir` or an existing parent of it) is on a bpffs.
fn check_bpffs_at(dir: &Path, checked: &Path) -> Result<(), PinError> {
    let fs = nix::sys::statfs::statfs(checked)
        .map_err(|source| PinError::Unreadable { dir: dir.to_owned(), source })?;
    #[expect(clippy::useless_conversion, reason = "the magic's integer type differs between libc targets")]
    let magic = i64::from(fs.filesystem_type().0);
    if magic != BPF_FS_MAGIC {
        return Err(PinError::NotBpffs { dir: dir.to_owned(), checked: checked.to_owned() });
    }
    Ok(())
}

/// The directory an agent instance pins its maps and links in: `BPFFS/<instance>`.
pub fn instance_dir(bpffs: &Path, instance: &str) -> PathBuf {
    bpffs.join(instance)
}

/// File name of a pinned link in an instance directory.
pub(crate) fn link_pin(dir: &Path, prog: &str) -> PathBuf {
    dir.join(format!("link_{prog}"))
}

/// Where a new link is pinned before it replaces the old one by rename (bpffs refuses names with a dot, so no
/// `.new` suffix). An agent killed between the pin and the rename leaves it behind.
pub(crate) fn new_link_pin(dir: &Path, prog: &str) -> PathBuf {
    dir.join(format!("link_{prog}_new"))
}

/// Make the agent's pin directory `BPFFS/<instance>`, creating `BPFFS` too if it does not exist yet (on a
/// fresh node the bpffs is `/sys/fs/bpf` itself and nothing has made `/sys/fs/bpf/tierlb`). The directory,
/// or the nearest one above it that exists, must be on a bpffs.
pub fn prepare(bpffs: &Path, instance: &str) -> Result<PathBuf, PinError> {
    check_bpffs_nearest(bpffs)?;
    let dir = instance_dir(bpffs, instance);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    Ok(dir)
}

/// Maps earlier versions pinned that this one does not use: `--cleanup` removes them too (`CONNTRACK`, the
/// single conntrack table the three `CT_*` tables replaced).
const LEGACY_MAPS: [&str; 1] = ["CONNTRACK"];

/// Remove an instance's pinned links (detaching its programs) and maps, then its directory if empty
/// (`tierlb agent --cleanup`). Returns the pins removed.
pub fn cleanup(bpffs: &Path, instance: &str) -> Result<Vec<PathBuf>, PinError> {
    if !bpffs.exists() {
        return Ok(Vec::new());
    }
    check_bpffs(bpffs)?;
    let dir = instance_dir(bpffs, instance);
    let mut removed = Vec::new();
    // The tc programs first: removing a tcx link's pin detaches it; a netlink filter's program pin is only
    // its record (`detach` removes the filter), and an agent of an earlier version left none, so every
    // device of the namespace is rid of filters with our programs' names.
    removed.extend(super::xdp::detach_all(&dir));
    for device in super::tc::pinned_devices(&dir) {
        removed.extend(super::tc::device_pins(&dir, &device));
        super::tc::detach(Some(&dir), &device);
    }
    // Whatever the attach mode now (an agent may have run with `--tc-attach netlink` on a kernel with tcx).
    for device in super::tc::all_devices() {
        super::tc::detach_netlink(&device);
    }
    // The cgroup programs' links: detached now, not when the kernel gets round to releasing the unpinned link.
    for p in PROGRAMS.iter().flat_map(|p| [link_pin(&dir, p), new_link_pin(&dir, p)]) {
        if p.exists() && super::sys::detach_link_pin(&p) {
            removed.push(p);
        }
    }
    let pins = PROGRAMS
        .iter()
        .flat_map(|p| [link_pin(&dir, p), new_link_pin(&dir, p)])
        .chain(PINNED_MAPS.iter().flat_map(|m| super::layout::all_pin_names(m)).map(|m| dir.join(m)))
        .chain(LEGACY_MAPS.iter().map(|m| dir.join(m)));
    for p in pins {
        if p.exists() {
            std::fs::remove_file(&p).map_err(io(&p))?;
            removed.push(p);
        }
    }
    remove_if_empty(&dir)?;
    // The agent made `--bpffs` itself on a fresh node (see `prepare`); an uninstall leaves no trace of it,
    // unless it is a mount point (a bpffs mounted there by the operator) or still holds other instances.
    let is_mount_point = |d: &Path| {
        use std::os::unix::fs::MetadataExt as _;
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        d.parent().is_none_or(|p| dev(p) != dev(d))
    };
    if bpffs.exists() && !is_mount_point(bpffs) {
        remove_if_empty(bpffs)?;
    }
    Ok(removed)
}

fn remove_if_empty(dir: &Path) -> Result<(), PinError> {
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_none() {
        std::fs::remove_dir(dir).map_err(io(dir))?;
    }
    Ok(())
}

/// Agent instances pinned under `bpffs`, sorted: (instance name, its directory). `only` picks one.
pub fn instances(bpffs: &Path, only: Option<&str>) -> Result<Vec<(String, PathBuf)>, PinError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(bpffs) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PinError::Missing { dir: bpffs.to_owned() });
        }
        r => r.map_err(io(bpffs))?,
    };
    for e in entries {
        let path = e.map_err(io(bpffs))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if path.join(MAP_FRONTENDS).exists() && only.is_none_or(|o| o == name) {
            out.push((name, path));
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(PinError::NoInstance { dir: bpffs.to_owned(), only: only.map(str::to_owned) });
    }
    Ok(out)
}

/// The program ids of the links pinned in `dir` (an earlier agent of this instance): attached, and replaced
/// by this agent's attach, so not another instance's.
pub fn pinned_program_ids(dir: &Path) -> Vec<u32> {
    PROGRAMS
        .iter()
        .filter_map(|p| aya::programs::links::PinnedLink::from_pin(link_pin(dir, p)).ok())
        .filter_map(|l| aya::programs::links::FdLink::from(l).info().ok())
        .map(|i| i.program_id())
        .collect()
}
