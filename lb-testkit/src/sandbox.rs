//! Private network namespaces, child cgroups and bpffs mounts for in-kernel tests, the demo and benchmarks.
//!
//! Safety on shared machines: every guard removes what it made when dropped (also on panic); nothing is ever
//! attached to a root cgroup; traffic to VIPs and pod IPs only happens inside a namespace made here, which has
//! nothing but `lo`, so a failed rewrite cannot send a packet off the machine.
use std::{
    fs::File,
    net::SocketAddr,
    os::fd::{AsFd as _, AsRawFd as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique(tag: &str) -> String {
    format!("tierlb-{tag}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Whether `name` is one `unique` gave in process `pid` (`tierlb-TAG-PID-N`): what an interrupted run
/// removes (`interrupt::sweep`).
pub fn made_by(name: &str, pid: u32) -> bool {
    let Some(rest) = name.strip_prefix("tierlb-") else { return false };
    let mut parts = rest.rsplitn(3, '-');
    let (n, p) = (parts.next(), parts.next());
    parts.next().is_some_and(|tag| !tag.is_empty())
        && n.is_some_and(|n| n.parse::<u32>().is_ok())
        && p == Some(pid.to_string().as_str())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    output(cmd).map(drop)
}

/// Run `cmd` to its end: its standard output, or an error naming it with what it printed (`kubectl auth
/// can-i` says its "no" on standard output).
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new directory under the system's temporary directory, named after `tag` and unique to this run.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The cgroup2 mount (the unified hierarchy), from /proc/self/mountinfo: where test cgroups are made (as
/// children, never the root itself).
pub fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    info.lines()
        .find_map(|line| {
            let (fields, fs) = line.split_once(" - ")?;
            let mount_point = fields.split(' ').nth(4)?;
            fs.starts_with("cgroup2 ").then(|| PathBuf::from(mount_point.replace("\\040", " ")))
        })
        .context("no cgroup2 filesystem is mounted")
}

/// A named network namespace with `lo` up, deleted on drop.
pub struct NetNs {
    name: String,
    file: File,
}

impl NetNs {
    /// A new namespace (`ip netns add`), named after `tag` and unique to this run.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let name = unique(tag);
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let guard_name = name.clone();
        let file = match File::open(format!("/run/netns/{name}")) {
            Ok(f) => f,
            Err(e) => {
                let _ = Command::new("ip").args(["netns", "del", &guard_name]).output();
                return Err(e).context("opening the new netns");
            }
        };
        let ns = Self { name, file };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name under /run/netns, for `ip netns exec` and `ip -n`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file (for setns).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Turn transmit checksumming of `device` in this namespace on or off (the legacy `ETHTOOL_STXCSUM`
    /// ioctl; no ethtool binary needed). Off, what the device sends carries complete checksums, as a frame that
    /// crossed a wire does: what XDP on the receiving side needs (a veth otherwise hands on a partial one).
    pub fn tx_checksum(&self, device: &str, on: bool) -> anyhow::Result<()> {
        const SIOCETHTOOL: libc::c_ulong = 0x8946;
        const ETHTOOL_STXCSUM: u32 = 0x17;
        #[repr(C)]
        struct EthtoolValue {
            cmd: u32,
            data: u32,
        }
        anyhow::ensure!(device.len() < libc::IFNAMSIZ, "device name {device:?} too long");
        self.run(|| {
            let mut v = EthtoolValue { cmd: ETHTOOL_STXCSUM, data: u32::from(on) };
            let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
            // SAFETY: all-zero is a valid ifreq; the name is shorter than IFNAMSIZ (checked above).
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in req.ifr_name.iter_mut().zip(device.as_bytes()) {
                *d = (*s).cast_signed();
            }
            req.ifr_ifru.ifru_data = (&raw mut v).cast();
            // SAFETY: SIOCETHTOOL reads the ethtool_value `ifr_data` points to, alive for the call.
            let rc =
                unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&sock), SIOCETHTOOL, &raw mut req) };
            anyhow::ensure!(rc == 0, "ETHTOOL_STXCSUM on {device}: {}", std::io::Error::last_os_error());
            Ok(())
        })
    }

    /// `ip -n NS ARGS...`
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Add an address (a pod IP or VIP stand-in) to `lo` inside the namespace.
    pub fn add_address(&self, ip: std::net::IpAddr) -> anyhow::Result<()> {
        let cidr = if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") };
        let mut args = vec!["addr", "add", cidr.as_str(), "dev", "lo"];
        if ip.is_ipv6() {
            args.push("nodad");
        }
        self.ip(&args)
    }

    /// Move the calling thread into the namespace (threads keep their own netns in Linux).
    pub fn enter_current_thread(&self) -> anyhow::Result<()> {
        nix::sched::setns(self.file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).context("setns")
    }

    /// `f` on a thread of its own inside the namespace (the caller's thread stays where it is): what it
    /// returns, or an error if it could not enter or panicked.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter_current_thread()?;
                f()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread in netns {} panicked", self.name))?
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// A child cgroup under the cgroup2 mount, removed on drop (after its processes are gone).
pub struct Cgroup {
    path: PathBuf,
    /// Directories made above `path` by `nested`, deepest first: removed after it.
    above: Vec<PathBuf>,
}

impl Cgroup {
    /// A new child of the cgroup2 root, named after `tag` and unique to this run.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let root = cgroup2_root()?;
        let path = root.join(unique(tag));
        std::fs::create_dir(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
        Ok(Self { path, above: Vec::new() })
    }

    /// A cgroup at `rel` (several levels, e.g. the kubelet's `kubepods/burstable/pod<uid>/<container>`)
    /// below `parent`, which must outlive it; every level made here is removed on drop, deepest first.
    pub fn nested(parent: &Cgroup, rel: &str) -> anyhow::Result<Self> {
        let mut made = Vec::new();
        let mut dir = parent.path.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
                made.push(dir.clone());
            }
        }
        let path = made.pop().context("the nested cgroup exists already")?;
        made.reverse();
        Ok(Self { path, above: made })
    }

    /// A cgroup whose memory is limited to `bytes`, as the kubelet gives a container its `limits.memory`
    /// (kernel memory, the BPF maps its processes create, included): in the cgroup2 root where the memory
    /// controller is enabled for its children (`memory.max`), else in cgroup v1's memory hierarchy
    /// (`memory.limit_in_bytes`, hybrid hosts). `None` where neither is there.
    pub fn memory_limited(tag: &str, bytes: u64) -> anyhow::Result<Option<Self>> {
        let root = cgroup2_root()?;
        let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        let (parent, file) = if enabled.split_whitespace().any(|c| c == "memory") {
            (root, "memory.max")
        } else if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            (PathBuf::from("/sys/fs/cgroup/memory"), "memory.limit_in_bytes")
        } else {
            return Ok(None);
        };
        let path = parent.join(unique(tag));
        std::fs::create_dir(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
        let cg = Self { path, above: Vec::new() };
        std::fs::write(cg.path.join(file), bytes.to_string())
            .with_context(|| format!("setting {} of {}", file, cg.path.display()))?;
        Ok(Some(cg))
    }

    /// Its directory in the cgroup2 mount (where programs attach and `cgroup.procs` is).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pids in it now (none if it cannot be read).
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The processes we put here are our children; they are ended by their own guards. Wait for them.
        for _ in 0..200 {
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                for dir in &self.above {
                    let _ = std::fs::remove_dir(dir);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("warning: cgroup {} still has processes {:?}", self.path.display(), self.procs());
    }
}

/// A private bpffs mount in a temporary directory, unmounted and removed on drop.
pub struct BpfFs {
    path: PathBuf,
}

impl BpfFs {
    /// Mount a new bpffs on a temporary directory named after `tag`.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir(&path)?;
        if let Err(e) =
            nix::mount::mount(Some("bpf"), &path, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>)
        {
            let _ = std::fs::remove_dir(&path);
            return Err(e).context("mounting bpffs");
        }
        Ok(Self { path })
    }

    /// The mount point, where agents pin under `--bpffs`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Make `cmd` start inside `cgroup` (joined first) and then `netns` (joining a netns by `ip netns exec`
/// would remount /sys, so setns is done directly). Only the child moves; the caller stays where it is.
pub fn confine(cmd: &mut Command, cgroup: Option<&Cgroup>, netns: Option<&NetNs>) -> anyhow::Result<()> {
    let procs = match cgroup {
        Some(cg) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .open(cg.path().join("cgroup.procs"))
                .context("opening cgroup.procs")?,
        ),
        None => None,
    };
    let ns = match netns {
        Some(ns) => Some(ns.file.try_clone()?),
        None => None,
    };
    // SAFETY: between fork and exec this only calls write(2) and setns(2) on descriptors opened above
    // (async-signal-safe, no allocation).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(p) = &procs {
                // "0" moves the writing process (the child) into the cgroup.
                if libc::write(p.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(ns) = &ns
                && libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// A child process ended (SIGTERM, then SIGKILL) and reaped on drop. Only ends the pid it started.
pub struct Child {
    child: Option<std::process::Child>,
}

impl Child {
    /// Start `cmd`.
    pub fn spawn(cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        Ok(Self { child: Some(child) })
    }
    /// Its pid; 0 once it has been stopped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }
    /// The process, for its pipes and `try_wait`; panics once it has been stopped.
    pub fn inner(&mut self) -> &mut std::process::Child {
        self.child.as_mut().expect("child present until drop")
    }
    /// Wait until `needle` shows in the log file `log` after byte `from` (an agent's `tierlb agent ready`),
    /// failing with the log's new part when the process ends first or `timeout` passes.
    pub fn wait_for_log(
        &mut self,
        log: &Path,
        from: usize,
        needle: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let new = text.get(from..).unwrap_or_default();
            if new.contains(needle) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.inner().try_wait() {
                bail!("exited ({status}) before {needle:?}:\n{new}");
            }
            if std::time::Instant::now() > deadline {
                bail!("no {needle:?} after {timeout:?}:\n{new}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Send a signal (e.g. SIGKILL in restart tests).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(pid_of(c), sig);
        }
    }
    /// Stop gracefully (SIGTERM) and wait up to `timeout`, then SIGKILL.
    pub fn stop(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // Already reaped (a caller waited after a SIGKILL): its pid may belong to another process by now.
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        let _ = nix::sys::signal::kill(pid_of(&c), nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if std::time::Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// `child`'s pid as nix takes it. Linux pids are at most pid_max (2^22), so the u32 fits a pid_t.
fn pid_of(child: &std::process::Child) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(child.id().cast_signed())
}

/// A pod's backend: `tierlb-lab serve` (tierlb's HTTP server) on an address inside a netns,
/// answering every request with its name, so a client sees which backend it reached. A process of its own,
/// as a pod is: stopping it makes connects to its address fail as a crashed pod's do. Stops on drop.
pub struct NamedServer {
    addr: SocketAddr,
    child: Child,
}

impl NamedServer {
    /// Start `lab serve --listen ADDR --name NAME` in `netns` and wait until it listens.
    pub fn start(lab: &Path, netns: &NetNs, addr: SocketAddr, name: &str) -> anyhow::Result<Self> {
        let mut cmd = Command::new(lab);
        cmd.args(["serve", "--listen", &addr.to_string(), "--name", name])
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null());
        confine(&mut cmd, None, Some(netns))?;
        let mut child = Child::spawn(&mut cmd)?;
        let stdout = child.inner().stdout.take().context("server stdout")?;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        if !line.starts_with("listening") {
            bail!("backend {name} on {addr} did not start (see its stderr)");
        }
        Ok(Self { addr, child })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Send its process a signal (SIGKILL: a crash).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        self.child.signal(sig);
    }
}

/// How many BPF programs are attached to the cgroup at `cg`, as `bpftool cgroup show` lists them.
pub fn attached_programs(cg: &Path) -> usize {
    let Ok(out) = Command::new("bpftool").args(["cgroup", "show"]).arg(cg).output() else { return 0 };
    // One line per program, starting with its id (after a header line).
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().filter(|l| l.split_whitespace().next().is_some_and(|id| id.parse::<u32>().is_ok())).count()
}
