//! The raw bpf(2) call, for the few commands aya does not expose (an array of maps with a chosen inner map,
//! `BPF_PROG_QUERY` on a cgroup, `BPF_MAP_UPDATE_BATCH`), and the request of a device ioctl (a device's
//! link-layer type, its driver).

/// `bpf(cmd, attr, size_of::<T>())`: its result, or the errno it set. `T` must be the `#[repr(C)]` part of
/// `union bpf_attr` that `cmd` reads, with any pointer in it valid for the call.
pub(crate) fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: bpf(2) with a valid attr pointer and its size; the kernel reads and writes only within it (and
    // where the pointers the caller put in it lead, which the caller keeps alive for the call).
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}

/// The memory of the map behind `fd` as the kernel accounts it: `memlock` in its fdinfo, since 6.4 the map
/// type's `map_mem_usage` (a hash map: its buckets, sized by its capacity, and every element if preallocated,
/// else those it holds; before 6.4 an estimate from key, value and capacity); `None` if the kernel does not
/// say.
pub(crate) fn map_memory(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
}

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` part of `union bpf_attr` (`BPF_MAP_*_BATCH`).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Write `keys[i]` -> the `i`th value of `values` into the map `fd` with one `BPF_MAP_UPDATE_BATCH` (kernel
/// 5.6; the kernel writes them one by one, without a syscall each). `values` holds `keys.len()` values of
/// `value_bytes` each, laid out as the map's lookup returns them (a per-CPU map: one per possible CPU, each
/// 8-aligned); `EINVAL` if its length says otherwise. On an error, the elements the kernel wrote before it
/// stay written, as with single updates, and their number comes with the error (the kernel writes it back
/// into the attr's `count` on every path of `generic_map_update_batch`).
pub(crate) fn update_batch<K: aya::Pod, V: aya::Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
    value_bytes: usize,
) -> Result<(), (std::io::Error, usize)> {
    let refused = |errno| (std::io::Error::from_raw_os_error(errno), 0);
    if keys.is_empty() {
        return Ok(());
    }
    if size_of_val(values) != keys.len() * value_bytes {
        return Err(refused(libc::EINVAL));
    }
    let count = u32::try_from(keys.len()).map_err(|_| refused(libc::E2BIG))?;
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: std::os::fd::AsRawFd::as_raw_fd(&fd).cast_unsigned(),
        ..BatchAttr::default()
    };
    bpf(BPF_MAP_UPDATE_BATCH, &mut attr).map(|_| ()).map_err(|e| (e, attr.count as usize))
}

/// A socket for a device ioctl and an `ifreq` naming `device` (`None`: a name too long, or no socket).
pub(crate) fn device_request(device: &str) -> Option<(std::os::fd::OwnedFd, libc::ifreq)> {
    let name = device.as_bytes();
    if name.len() >= libc::IFNAMSIZ {
        return None;
    }
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    // SAFETY: all-zero is a valid ifreq; the name is shorter than IFNAMSIZ, so it stays NUL-terminated.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = (*s).cast_signed();
    }
    Some((sock, req))
}

const BPF_LINK_DETACH: libc::c_long = 34;

/// The object pinned at `pin`, opened (`BPF_OBJ_GET`); `None` if there is none or it cannot be opened.
pub(crate) fn open_pin(pin: &std::path::Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    use std::os::unix::ffi::OsStrExt as _;
    const BPF_OBJ_GET: libc::c_long = 7;
    /// The `obj` part of `union bpf_attr` (`BPF_OBJ_GET`).
    #[repr(C)]
    #[derive(Default)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let path = std::ffi::CString::new(pin.as_os_str().as_bytes()).ok()?;
    let mut get = ObjGet { pathname: path.as_ptr() as u64, ..ObjGet::default() };
    let fd = i32::try_from(bpf(BPF_OBJ_GET, &mut get).ok()?).ok()?;
    // SAFETY: BPF_OBJ_GET returned a new file descriptor, owned from here on.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Detach the link behind `link` now (`BPF_LINK_DETACH`, kernel 5.9). Closing a link's last reference (its fd,
/// its pin) releases it in the kernel's deferred work (`bpf_link_put`), so its program stays on the hook a
/// moment after; this does not wait. An fd that is not a link (a map, a program) or a link kind without
/// `detach` is refused (`EINVAL`, `EOPNOTSUPP`): nothing is detached, and the link goes when it is released.
pub(crate) fn detach_link(link: &std::os::fd::OwnedFd) {
    let mut link_fd = std::os::fd::AsRawFd::as_raw_fd(link).cast_unsigned();
    let _ = bpf(BPF_LINK_DETACH, &mut link_fd);
}

/// Detach the link pinned at `pin` now (see [`detach_link`]), then remove the pin; an uninstall that returns
/// leaves nothing attached. Returns whether a pin was removed.
pub(crate) fn detach_link_pin(pin: &std::path::Path) -> bool {
    if let Some(link) = open_pin(pin) {
        detach_link(&link);
    }
    std::fs::remove_file(pin).is_ok()
}
