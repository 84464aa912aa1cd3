//! What the in-kernel tests of backend marks and unprogrammed Services share: a simulated cluster, the CLI,
//! and GETs over loopback to the agent's servers.
#![expect(dead_code, reason = "each test binary uses a part of it")]
use std::{path::Path, process::Command};

use lb_testkit::cluster::SimCluster;

pub(crate) mod exposition;

/// The `tierlb` binary under test.
pub(crate) const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// A simulated cluster (a netns of its own); needs root.
pub(crate) fn cluster(tag: &str) -> SimCluster {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
    SimCluster::new(tag, Path::new(TIERLB), &lb_testkit::workspace_bin("tierlb-lab", "lb-lab"))
        .expect("sandbox")
}

/// `tierlb ARGS`: (success, stdout, stderr).
pub(crate) fn tierlb(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(TIERLB).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A loopback port free now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` from 127.0.0.1:`port` (host namespace, loopback only): status and the body.
pub(crate) fn get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    // `Connection: close`, so a server that keeps connections alive (Go's) ends the reply.
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// `get` inside `netns` (a thread of the test enters it).
pub(crate) fn get_in(netns: &lb_testkit::sandbox::NetNs, port: u16, path: &str) -> (u16, String) {
    std::thread::scope(|s| {
        s.spawn(|| {
            netns.enter_current_thread().unwrap();
            get(port, path)
        })
        .join()
        .unwrap()
    })
}

/// The named checks of one story told in one fixture: each runs even after an earlier one failed, and
/// `finish` fails the test naming every check that failed with its message, so one failure hides none of
/// the others.
#[derive(Default)]
pub(crate) struct Checks {
    failed: Vec<String>,
}

impl Checks {
    /// Run check `name`; a panic in it is recorded, not propagated.
    pub(crate) fn check(&mut self, name: &str, f: impl FnOnce()) {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            self.failed.push(format!("{name}: {msg}"));
        }
    }

    /// Fail if any check did, listing them.
    pub(crate) fn finish(self) {
        assert!(self.failed.is_empty(), "{} checks failed:\n{}", self.failed.len(), self.failed.join("\n"));
    }
}

/// Poll `check` every 20 ms for up to `secs`; true as soon as it holds.
pub(crate) fn eventually(secs: u64, mut check: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    check()
}

/// An agent started by the test itself on a `SimCluster`'s manifests, with its own cgroup and log, so a test
/// reads exactly this agent's lines (a timer's work apart from a sync's). Dropped: the agent (which
/// detaches), then its cgroup.
pub(crate) struct OwnAgent {
    child: lb_testkit::sandbox::Child,
    /// Its stderr.
    pub(crate) log: std::path::PathBuf,
    /// The cgroup it attaches to; `probe` runs clients in it.
    pub(crate) cgroup: lb_testkit::sandbox::Cgroup,
    _logs: lb_testkit::sandbox::TempDir,
}

impl OwnAgent {
    /// `tierlb agent --node node-1` on `c`'s manifests with `extra` arguments; returns once it is ready.
    pub(crate) fn start(c: &SimCluster, extra: &[&str]) -> Self {
        Self::spawn(c, extra, None)
    }

    /// As `start`, with the agent inside `c`'s network namespace: its listeners are on that namespace's
    /// loopback, where only the test's own processes (`get_in`) reach them.
    pub(crate) fn start_in_netns(c: &SimCluster, extra: &[&str]) -> Self {
        Self::spawn(c, extra, Some(&c.netns))
    }

    fn spawn(c: &SimCluster, extra: &[&str], netns: Option<&lb_testkit::sandbox::NetNs>) -> Self {
        let logs = lb_testkit::sandbox::TempDir::new("own-agent").unwrap();
        let log = logs.path().join("agent.log");
        let cgroup = lb_testkit::sandbox::Cgroup::new("own-agent").unwrap();
        let mut cmd = Command::new(TIERLB);
        cmd.args(["agent", "--node", "node-1", "--manifests"])
            .arg(c.manifests.path())
            .arg("--cgroup")
            .arg(cgroup.path())
            .args(["--service-health-bind", "off"])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        lb_testkit::sandbox::confine(&mut cmd, None, netns).unwrap();
        let mut child = lb_testkit::sandbox::Child::spawn(&mut cmd).unwrap();
        child.wait_for_log(&log, 0, "tierlb agent ready", lb_testkit::ready_wait()).unwrap();
        Self { child, log, cgroup, _logs: logs }
    }

    /// Its log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `synced` lines so far (one per source change).
    pub(crate) fn syncs(&self) -> usize {
        self.log().matches(" synced").count()
    }

    /// `count` connects to `target` from a client in the agent's cgroup and `c`'s netns, each with `timeout`.
    pub(crate) fn probe(
        &self,
        c: &SimCluster,
        target: std::net::SocketAddr,
        count: usize,
        timeout: std::time::Duration,
    ) -> lb_testkit::probe::Report {
        let mut cmd = Command::new(&c.lab);
        lb_testkit::sandbox::confine(&mut cmd, Some(&self.cgroup), Some(&c.netns)).unwrap();
        let out = cmd
            .args(["probe", "--target", &target.to_string(), "--count", &count.to_string()])
            .args(["--timeout-ms", &timeout.as_millis().to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// Load nftables `rule` inside `ns` (a netns the test made).
pub(crate) fn nft(ns: &lb_testkit::sandbox::NetNs, rule: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(rule.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
}

/// A `tierlb-lab` tool talking over stdin/stdout (`flood`, `keep`): started from `cmd`, ended on drop.
pub(crate) struct Piped {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Piped {
    pub(crate) fn spawn(mut cmd: Command) -> Self {
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let (stdin, stdout) = (child.stdin.take(), std::io::BufReader::new(child.stdout.take().unwrap()));
        Self { child, stdin, stdout }
    }

    /// The next line it prints, as JSON.
    pub(crate) fn line<T: serde::de::DeserializeOwned>(&mut self) -> T {
        let mut l = String::new();
        std::io::BufRead::read_line(&mut self.stdout, &mut l).unwrap();
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"))
    }

    /// `keep`: one check.
    pub(crate) fn check(&mut self) -> lb_testkit::tenant::Kept {
        std::io::Write::write_all(self.stdin.as_mut().unwrap(), b"check\n").unwrap();
        self.line()
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The map pinned at `path`, opened with aya (the kernel's map, not the agent's view).
pub(crate) fn pinned_map(path: &Path) -> aya::maps::Map {
    aya::maps::Map::from_map_data(aya::maps::MapData::from_pin(path).unwrap()).unwrap()
}

/// The entries of the hash map pinned at `path`, with `K` keys and `V` values.
pub(crate) fn hash_entries<K: aya::Pod, V: aya::Pod>(path: &Path) -> Vec<(K, V)> {
    let map: aya::maps::HashMap<_, K, V> = aya::maps::HashMap::try_from(pinned_map(path)).unwrap();
    map.iter().map(Result::unwrap).collect()
}

/// The pinned `REVERSE_TCP` array at `path`.
pub(crate) fn tcp_slots(path: &Path) -> aya::maps::Array<aya::maps::MapData, lb_common::TcpReverse> {
    aya::maps::Array::try_from(pinned_map(path)).unwrap()
}

/// Slot index and cookie of every slot a socket holds in the pinned `REVERSE_TCP` array at `path`.
pub(crate) fn tcp_slots_held(path: &Path) -> Vec<(u32, u64)> {
    let slots = tcp_slots(path);
    (0..slots.len())
        .filter_map(|i| Some((i, slots.get(&i, 0).unwrap().cookie)).filter(|s| s.1 != 0))
        .collect()
}

/// The cookie `hold_every_tcp_slot` writes into slot `i`: one no socket has (the top bit set, a count socket
/// cookies never reach) and whose slot is `i`.
pub(crate) fn held_cookie(i: u32) -> u64 {
    (1 << 63) | u64::from(i)
}

/// Write `slot(i)` into every slot `i` of the pinned `REVERSE_TCP` array at `path`.
pub(crate) fn set_every_tcp_slot(path: &Path, slot: impl Fn(u32) -> lb_common::TcpReverse) {
    let mut slots = tcp_slots(path);
    for i in 0..slots.len() {
        slots.set(i, slot(i), 0).unwrap();
    }
}

/// Fill every slot of the pinned `REVERSE_TCP` array at `path` with a `held_cookie`, as if open sockets held
/// them all.
pub(crate) fn hold_every_tcp_slot(path: &Path) {
    set_every_tcp_slot(path, |i| lb_common::TcpReverse { cookie: held_cookie(i), ..Default::default() });
}
