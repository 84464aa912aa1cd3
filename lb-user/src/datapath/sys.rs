//! The raw bpf(2) call, for the few commands aya does not expose (an array of maps with a chosen inner map,
//! `BPF_PROG_QUERY` on a cgroup).

/// `bpf(cmd, attr, size_of::<T>())`: its result, or the errno it set. `T` must be the `#[repr(C)]` part of
/// `union bpf_attr` that `cmd` reads, with any pointer in it valid for the call.
pub(crate) fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: bpf(2) with a valid attr pointer and its size; the kernel reads and writes only within it (and
    // where the pointers the caller put in it lead, which the caller keeps alive for the call).
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}
