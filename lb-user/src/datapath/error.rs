//! Why the data path could not be loaded, attached or opened: the loader's, the maps' and the layout check's
//! errors.
use std::path::PathBuf;

/// Oldest kernel tierlb supports: `bpf_set_retval` from cgroup sock_addr programs needs 5.18; 6.1 is the
/// oldest LTS with everything the data path uses and is what is tested.
pub const MIN_KERNEL: (u32, u32) = (6, 1);

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

/// Whether a map write failed because the map is full (E2BIG: no room for another element).
pub(crate) fn is_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG))
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

/// A second descriptor of map `name` (`data`), for what works on the map beside its typed handle.
pub(in crate::datapath) fn second_fd(
    data: &aya::maps::MapData,
    name: &str,
) -> Result<std::os::fd::OwnedFd, DatapathError> {
    std::os::fd::AsFd::as_fd(data.fd())
        .try_clone_to_owned()
        .map_err(|e| bpf_err(format!("map {name}: duplicating its descriptor"), e))
}
