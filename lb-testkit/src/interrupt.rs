//! Clean-up when a long run (the demo, the benchmark) is interrupted: SIGINT (Ctrl-C), SIGTERM or SIGHUP
//! would end the process without running the sandbox's guards, leaving its network namespaces, cgroups
//! (with the programs attached to them), bpffs mounts and temporary directories behind. After
//! [`clean_up_on_signals`] such a signal makes a thread of this process remove everything the sandbox made
//! for this process, found by the names it gives (`tierlb-TAG-PID-N`, `sandbox::unique`), then exit with
//! 128 + the signal's number. This process's children (agents, tools, load clients) are ended first, with
//! SIGTERM and then SIGKILL, and what is left in those cgroups (only ever what the sandbox started) with
//! SIGKILL, so that the cgroups can be removed; files the run changed and registered
//! ([`restore_on_interrupt`]) get their contents back.
use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, IntoRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicI32, Ordering},
    },
    time::{Duration, Instant},
};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

use crate::sandbox::made_by;

/// The pipe's write end, for the handler (-1 until installed).
static PIPE: AtomicI32 = AtomicI32::new(-1);
/// Set by the handler: the run is being ended by the clean-up thread.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Files to write back on interruption, with their contents before the run changed them.
static RESTORE: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    let fd = PIPE.load(Ordering::Relaxed);
    let byte = u8::try_from(sig).unwrap_or(0);
    // SAFETY: write(2) is async-signal-safe; the buffer is a local byte.
    unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
}

/// Install the handlers (once; later calls do nothing). A child process starts with the default
/// dispositions again (exec resets handled signals), so the agents and tools this process starts still end on
/// SIGTERM as before.
pub fn clean_up_on_signals() -> anyhow::Result<()> {
    if PIPE.load(Ordering::Relaxed) >= 0 {
        return Ok(());
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // Both ends stay open for the process's life: the write end for the handler, the read end for the thread.
    PIPE.store(write.into_raw_fd(), Ordering::Relaxed);
    let read = read.into_raw_fd();
    std::thread::Builder::new().name("clean-up".into()).spawn(move || {
        // SAFETY: the pipe's read end, owned by this thread from here on.
        let read = unsafe { OwnedFd::from_raw_fd(read) };
        let mut byte = 0u8;
        // SAFETY: a read of one byte into a local.
        while unsafe { libc::read(read.as_raw_fd(), (&raw mut byte).cast(), 1) } != 1 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                eprintln!(
                    "tierlb-lab: the clean-up on interruption stopped: {}",
                    std::io::Error::last_os_error()
                );
                return;
            }
        }
        eprintln!("interrupted (signal {byte}): removing this run's namespaces, cgroups and mounts");
        sweep(std::process::id());
        std::process::exit(128 + i32::from(byte));
    })?;
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only calls write(2) on a descriptor that stays open.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

/// `code`, the run's end, unless it was interrupted: then the clean-up thread is removing the run's sandbox
/// and exits with 128 + the signal when it is done, so this waits for it (a run whose child the signal or the
/// clean-up ended fails meanwhile, and must not end the process first, with its own code).
#[must_use]
pub fn unless_interrupted(code: ExitCode) -> ExitCode {
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::park();
    }
    code
}

/// On interruption, write `before` back to `file` (a setting the run changes while it lives, e.g. a sysctl).
pub fn restore_on_interrupt(file: &Path, before: &str) {
    if let Ok(mut r) = RESTORE.lock() {
        r.push((file.to_path_buf(), before.to_owned()));
    }
}

/// The entries of `dir` whose names the sandbox gave in process `pid`.
pub fn ours_in(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().filter(|e| made_by(&e.file_name().to_string_lossy(), pid)).map(|e| e.path()).collect()
}

/// Remove what the sandbox made in process `pid`: its cgroups (their processes killed first), network
/// namespaces, bpffs mounts and temporary directories.
pub fn sweep(pid: u32) {
    end_children(pid);
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup/memory")];
    if let Ok(root) = super::sandbox::cgroup2_root() {
        roots.insert(0, root);
    }
    for cg in roots.iter().flat_map(|r| ours_in(r, pid)) {
        remove_cgroup(&cg);
    }
    for ns in ours_in(Path::new("/run/netns"), pid) {
        if let Some(name) = ns.file_name().and_then(|n| n.to_str()) {
            let _ = std::process::Command::new("ip").args(["netns", "del", name]).output();
        }
    }
    for dir in ours_in(&std::env::temp_dir(), pid) {
        // A bpffs mount point first loses its mount; a plain directory is removed with what it holds.
        let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&dir);
    }
    for (file, before) in RESTORE.lock().map(|r| r.clone()).unwrap_or_default() {
        let _ = std::fs::write(file, before);
    }
}

/// The processes whose parent is `pid` (`/proc/N/stat`, field 4).
fn children_of(pid: u32) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|n| {
            let stat = std::fs::read_to_string(format!("/proc/{n}/stat")).unwrap_or_default();
            let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
            after.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid)
        })
        .collect()
}

/// End `pid`'s children: SIGTERM (an agent then detaches and unpins), SIGKILL to those left after 3 s.
fn end_children(pid: u32) {
    let signal = |sig| {
        for c in children_of(pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c), sig);
        }
    };
    signal(Signal::SIGTERM);
    let t0 = Instant::now();
    // A child that ended stays a zombie (nobody reaps it here) and still names its parent: count the live.
    let live = || children_of(pid).into_iter().filter(|c| !is_zombie(*c)).count();
    while live() > 0 && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(Signal::SIGKILL);
}

/// Whether process `pid` has ended and waits to be reaped.
fn is_zombie(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'))
}

/// Kill the processes in `cg` and every cgroup below it, then remove them, deepest first.
fn remove_cgroup(cg: &Path) {
    let mut all = vec![cg.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            all.extend(entries.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
        }
        i += 1;
    }
    for dir in all.iter().rev() {
        for _ in 0..100 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only names of the sandbox's pattern with this pid are ours.
    #[test]
    fn only_the_sandboxs_names_of_this_process_are_swept() {
        assert!(made_by("tierlb-bench-4058-0", 4058));
        assert!(made_by("tierlb-node-1-4058-12", 4058), "a tag with a dash");
        assert!(!made_by("tierlb-bench-4058-0", 405));
        assert!(!made_by("tierlb-bench-40580-0", 4058));
        assert!(!made_by("tierlb-4058-0", 4058), "no tag");
        assert!(!made_by("tierlb-bench-4058-x", 4058));
        assert!(!made_by("other-bench-4058-0", 4058));
        assert!(!made_by("tierlb", 4058));
    }
}
