//! The agent as `deploy/` runs it (see `lb_testkit::deployed`): its own PID and mount namespaces, the
//! DaemonSet's hostPath volumes at their mountPaths, its capability bounding set, on a network namespace
//! that plays the node, with pods in namespaces of their own behind veth pairs. Only the source
//! (`--manifests` for `--kube`) and the cgroup (a child cgroup for the cgroup2 root) differ from a node.
use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use lb_testkit::{
    deployed::{AgentBox, BoxPaths, Container, Node},
    dns::{DnsServer, StreamStep},
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::{BpfFs, Cgroup, NamedServer, NetNs, TempDir, confine},
};

mod common;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn lab() -> PathBuf {
    lb_testkit::workspace_bin("tierlb-lab", "lb-lab")
}

/// One node with a web Service (endpoints on node-1 and node-2) and a DNS Service (resolvers on node-1 and
/// node-2), both PreferSameNode, and a client pod on node-1 in the agent's cgroup.
struct Lab {
    container: Container,
    node: Node,
    cgroup: Cgroup,
    bpffs: BpfFs,
    manifests: TempDir,
    log: PathBuf,
    client: NetNs,
    _pods: Vec<(NetNs, Option<NamedServer>, Option<DnsServer>)>,
}

const WEB: &str = "10.96.0.10:80";
const DNS: &str = "10.96.0.53:53";

fn web() -> Svc {
    let mut s = Svc::new("web", ip("10.96.0.10"), 80, 8080);
    s.traffic_distribution = Some("PreferSameNode".into());
    s
}

fn dns(node_1_ready: bool) -> (Svc, Vec<Ep>) {
    let mut s = Svc::new("kube-dns", ip("10.96.0.53"), 53, 53);
    s.protocol = "UDP";
    s.traffic_distribution = Some("PreferSameNode".into());
    let mut eps = vec![Ep::ready(ip("10.244.2.53"), "node-2").prefer_same_node()];
    if node_1_ready {
        eps.insert(0, Ep::ready(ip("10.244.1.53"), "node-1").prefer_same_node());
    }
    (s, eps)
}

impl Lab {
    fn new(tag: &str) -> Self {
        assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
        let container = Container::render(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")).unwrap();
        let mut node = Node::new(tag).unwrap();
        let mut pods = Vec::new();
        for (addr, name) in [("10.244.1.10", "web-node-1"), ("10.244.2.10", "web-node-2")] {
            let ns = node.add_pod(name, ip(addr)).unwrap();
            let server = NamedServer::start(&lab(), &ns, SocketAddr::new(ip(addr), 8080), name).unwrap();
            pods.push((ns, Some(server), None));
        }
        for (addr, answer) in [("10.244.1.53", "10.0.1.1"), ("10.244.2.53", "10.0.2.2")] {
            let ns = node.add_pod("dns", ip(addr)).unwrap();
            let server = DnsServer::start(&ns, SocketAddr::new(ip(addr), 53), ip(answer)).unwrap();
            pods.push((ns, None, Some(server)));
        }
        let client = node.add_pod("client", ip("10.244.1.100")).unwrap();
        let manifests = TempDir::new(tag).unwrap();
        write_service(
            manifests.path(),
            &web(),
            &[
                Ep::ready(ip("10.244.1.10"), "node-1").prefer_same_node(),
                Ep::ready(ip("10.244.2.10"), "node-2").prefer_same_node(),
            ],
        )
        .unwrap();
        let (svc, eps) = dns(true);
        write_service(manifests.path(), &svc, &eps).unwrap();
        let log = manifests.path().join(".agent.log");
        Self {
            container,
            node,
            cgroup: Cgroup::new(tag).unwrap(),
            bpffs: BpfFs::new(tag).unwrap(),
            manifests,
            log,
            client,
            _pods: pods,
        }
    }

    fn paths(&self) -> BoxPaths<'_> {
        BoxPaths {
            tierlb: Path::new(TIERLB),
            manifests: self.manifests.path(),
            cgroup: self.cgroup.path(),
            bpffs: self.bpffs.path(),
            log: &self.log,
        }
    }

    fn log_len(&self) -> usize {
        std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize)
    }

    /// `kubectl exec ds/tierlb -- tierlb status`: the same container (its env, mounts and constraints) beside
    /// the agent, with no flag, reads the agent's pins (the DaemonSet's TIERLB_BPFFS names its --bpffs).
    fn status_in_the_pod(&self) {
        let from = self.log_len();
        let status = AgentBox::start(&self.container, &self.node, &self.paths(), &["status".to_owned()])
            .unwrap()
            .wait(lb_testkit::ready_wait())
            .unwrap();
        let said = std::fs::read_to_string(&self.log).unwrap()[from..].to_owned();
        assert!(status.success() && said.contains("instance node-1"), "tierlb status in the pod:\n{said}");
    }

    /// Start the agent as the DaemonSet does, its init container (`tierlb preflight`) first: the pod's agent
    /// starts only once that has passed. Returns once the agent is ready.
    fn start_agent(&self) -> AgentBox {
        let init = self.container.preflight.as_ref().expect("the DaemonSet runs tierlb preflight first");
        let from = self.log_len();
        let args = AgentBox::agent_args(init, "node-1", self.cgroup.path()).unwrap();
        let status = AgentBox::start(init, &self.node, &self.paths(), &args)
            .unwrap()
            .wait(lb_testkit::ready_wait())
            .unwrap();
        let said = std::fs::read_to_string(&self.log).unwrap()[from..].to_owned();
        assert!(
            status.success() && said.contains("ready for tierlb"),
            "the preflight init container:\n{said}"
        );
        let from = self.log_len();
        let args = AgentBox::agent_args(&self.container, "node-1", self.cgroup.path()).unwrap();
        let mut agent = AgentBox::start(&self.container, &self.node, &self.paths(), &args).unwrap();
        agent.wait_for(&self.log, from, "tierlb agent ready", lb_testkit::ready_wait()).unwrap();
        agent
    }

    /// A `tierlb-lab` command in the client pod (its netns, the agent's cgroup).
    fn client(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(lab());
        cmd.args(args).stdout(Stdio::piped()).stdin(Stdio::null());
        confine(&mut cmd, Some(&self.cgroup), Some(&self.client)).unwrap();
        cmd
    }

    fn probe(&self, count: usize, interval_ms: u32) -> std::process::Child {
        let (count, interval) = (count.to_string(), interval_ms.to_string());
        let args = ["probe", "--target", WEB, "--count", &count, "--interval-ms", &interval];
        self.client(&args).spawn().unwrap()
    }

    /// Programs attached to the test's cgroup.
    fn attached(&self) -> usize {
        lb_testkit::sandbox::attached_programs(self.cgroup.path())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("agent log:\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

fn report(child: std::process::Child) -> Report {
    let out = child.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An HTTP GET from inside the node's network namespace (as the kubelet probes a hostNetwork pod).
fn http_get(node: &NetNs, port: u16, path: &str) -> String {
    std::thread::scope(|s| {
        s.spawn(|| {
            node.enter_current_thread().unwrap();
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(c, "GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n").unwrap();
            let mut reply = String::new();
            c.read_to_string(&mut reply).unwrap();
            reply
        })
        .join()
        .unwrap()
    })
}

#[test]
fn the_agent_runs_as_deployed_serves_pods_ends_stale_udp_sockets_survives_a_kill_and_uninstalls_cleanly() {
    let lab = Lab::new("deployed");
    let agent = lab.start_agent();
    let c = &lab.container;
    assert!(!c.privileged, "the container is not privileged");
    eprintln!(
        "boxed agent: capabilities {:?}, hostPID {}, read-only root {}, mounts {:?}",
        c.capabilities, c.host_pid, c.read_only_root, c.mounts
    );

    // A pod's TCP connect to the VIP reaches the node-local endpoint.
    let r = report(lab.probe(20, 0));
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    assert_eq!(r.count("web-node-1"), 20, "node-local endpoint: {:?}", r.by_backend());

    // The kubelet's probes answer 200 on the paths and ports the DaemonSet declares.
    assert!(!c.probes.is_empty());
    for (path, port) in &c.probes {
        let reply = http_get(&lab.node.netns, *port, path);
        assert!(reply.starts_with("HTTP/1.1 200"), "{path} on {port}: {reply}");
    }

    // A pod's connected UDP socket whose endpoint leaves the EndpointSlice (the old resolver keeps running)
    // is ended within 1 s (about 30 ms measured), and the pod's next socket reaches the other resolver.
    // The stream's start and length take `patience()` (under emulation the client started after a fixed
    // 500 ms, so its socket met the edit already made: nothing to end); the verdict below stays 1 s.
    let duration_ms = (2_500 * lb_testkit::patience()).to_string();
    let stream = lab
        .client(&["dns-stream", "--server", DNS, "--duration-ms", &duration_ms, "--interval-ms", "10"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500) * lb_testkit::patience());
    let (svc, eps) = dns(false);
    let t_edit = lb_testkit::dns::epoch_ms();
    write_service(lab.manifests.path(), &svc, &eps).unwrap();
    let out = stream.wait_with_output().unwrap();
    let steps: Vec<StreamStep> = serde_json::from_slice(&out.stdout).unwrap();
    let first_err = steps.iter().position(|s| s.error.is_some()).expect("the socket was ended");
    let ended = steps[first_err].at_ms - t_edit;
    eprintln!("connected UDP socket ended {ended:.0} ms after the edit ({:?})", steps[first_err].error);
    assert!(
        ended >= 0.0 && first_err + 1 < steps.len(),
        "ended after the edit, while the stream ran: {steps:?}"
    );
    assert!(steps[..first_err].iter().all(|s| s.answer.as_deref() == Some("10.0.1.1")), "local before");
    let rest = &steps[first_err + 1..];
    assert!(!rest.is_empty() && rest.iter().all(|s| s.answer.as_deref() == Some("10.0.2.2")), "{rest:?}");
    // ... and counted, on the metrics port the DaemonSet passes.
    let metrics_port = c
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-addr="))
        .and_then(|a| a.rsplit(':').next()?.parse::<u16>().ok())
        .expect("the DaemonSet sets --metrics-addr");
    let metrics = http_get(&lab.node.netns, metrics_port, "/metrics");
    assert!(metrics.contains("tierlb_udp_sockets_destroyed_total 1"), "{metrics}");
    assert!(metrics.contains("tierlb_udp_sockets_unreached_total 0"), "{metrics}");

    // SIGKILL and restart of the agent: no connection lost, and a TCP connection held through it still
    // shows the VIP (its entry in the pinned `REVERSE_TCP` slots, which the new agent reuses).
    let mut held = common::Piped::spawn(lab.client(&["keep", "--tcp", WEB, "--dns", DNS]));
    assert_eq!(held.check().tcp_peer.as_deref(), Some(WEB));
    let probe = lab.probe(300, 5);
    std::thread::sleep(Duration::from_millis(300));
    agent.kill();
    std::thread::sleep(Duration::from_millis(300));
    let mut agent = lab.start_agent();
    let r = report(probe);
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    assert_eq!(r.count("web-node-1"), 300);
    assert_eq!(held.check().tcp_peer.as_deref(), Some(WEB), "getpeername() after the restart");
    drop(held);

    lab.status_in_the_pod();

    // The cgroup links' pins removed under the running agent (an uninstall applied too early): with the
    // DaemonSet's capabilities the agent sees its programs detached and attaches and pins them again.
    let from = lab.log_len();
    let links: Vec<PathBuf> = walk(lab.bpffs.path())
        .into_iter()
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            tierlb::datapath::ebpf::PROGRAMS.iter().any(|prog| name == format!("link_{prog}"))
        })
        .collect();
    assert_eq!(links.len(), tierlb::datapath::ebpf::PROGRAMS.len(), "{links:?}");
    for l in &links {
        std::fs::remove_file(l).unwrap();
    }
    agent.wait_for(&lab.log, from, "programs attached again", Duration::from_secs(5)).unwrap();
    assert_eq!(lab.attached(), tierlb::datapath::ebpf::PROGRAMS.len(), "attached again, once each");
    assert!(links.iter().all(|l| l.exists()), "pinned again");
    let log = std::fs::read_to_string(&lab.log).unwrap();
    assert!(!log.contains("cannot query what is attached"), "{log}");

    // Uninstall as deploy/README.md says: the DaemonSet goes (its pods get SIGTERM; pins keep the programs
    // attached), then the cleanup runs on the node with the same constraints; nothing stays attached or pinned.
    agent.stop();
    assert_eq!(
        lab.attached(),
        tierlb::datapath::ebpf::PROGRAMS.len(),
        "pins keep the programs attached while no agent runs"
    );
    let uninstall =
        Container::render(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/uninstall")).unwrap();
    let cleanup = AgentBox::agent_args(&uninstall, "node-1", lab.cgroup.path()).unwrap();
    let status = AgentBox::start(&uninstall, &lab.node, &lab.paths(), &cleanup)
        .unwrap()
        .wait(lb_testkit::ready_wait());
    assert!(status.unwrap().success(), "{}", std::fs::read_to_string(&lab.log).unwrap_or_default());
    assert_eq!(lab.attached(), 0, "nothing attached after the uninstall");
    // A bpffs always holds the kernel's own `maps.debug` and `progs.debug` (bpf_preload); no pin stays (the
    // kubelet's empty hostPath directory may).
    let left: Vec<PathBuf> = walk(lab.bpffs.path())
        .into_iter()
        .filter(|p| !p.ends_with("maps.debug") && !p.ends_with("progs.debug"))
        .collect();
    assert!(left.is_empty(), "nothing pinned after the uninstall: {left:?}");
    let r = report(lab.probe(3, 0));
    assert_eq!(r.failures(), 3, "no longer translated: {:?}", r.errors());
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// The agent as deployed programs a sync long enough for its map writer's threads (1,024 frontends of 5 slots
/// a round, one entry of the slot map each: the entries on two threads and the names on a third,
/// `PARALLEL_MIN` 1,024 entries) and planned on two
/// threads (1,100 Services in one chunk, from `PARALLEL_PLAN_MIN` 1,024), with the DaemonSet's capabilities
/// and namespaces, and those Services serve.
#[test]
fn the_agent_as_deployed_programs_a_sync_long_enough_for_its_writer_threads() {
    let lab = Lab::new("deployed-bulk");
    let eps: Vec<Ep> =
        ["10.244.1.10:node-1", "10.244.2.10:node-2", "10.244.2.11:node-2", "10.244.2.12:node-2"]
            .iter()
            .map(|e| {
                let (addr, node) = e.split_once(':').unwrap();
                Ep::ready(ip(addr), node).prefer_same_node()
            })
            .collect();
    let base = u32::from(std::net::Ipv4Addr::new(10, 96, 16, 0));
    for i in 0..1_100u32 {
        let vip = IpAddr::V4(std::net::Ipv4Addr::from(base + i));
        write_service(lab.manifests.path(), &Svc::new(&format!("bulk-{i}"), vip, 80, 8080), &eps).unwrap();
    }
    let _agent = lab.start_agent();
    for vip in ["10.96.16.0:80", "10.96.18.75:80"] {
        let args = ["probe", "--target", vip, "--count", "10", "--interval-ms", "0"];
        let r = report(lab.client(&args).spawn().unwrap());
        assert_eq!(r.failures(), 0, "{vip}: {:?}", r.errors());
        assert_eq!(r.count("web-node-1"), 10, "{vip}: node-local endpoint: {:?}", r.by_backend());
    }
    let log = std::fs::read_to_string(&lab.log).unwrap();
    assert!(!log.contains("\"level\":\"ERROR\""), "{log}");
}
