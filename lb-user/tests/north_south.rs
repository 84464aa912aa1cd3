//! Traffic from outside the node, in the kernel, with the agent run as `deploy/` runs it (`BoxedNode`): an
//! external client in its own network namespace, a LAN (a bridge in a namespace of its own), node-1 (the
//! agent's node: its uplink on the LAN, a pod behind a veth) and node-2 (a pod, routes to node-1's pods), all
//! made by the test. The client reaches node-1's NodePort and a load-balancer IP routed to node-1; tierlb's tc
//! programs on node-1's uplink translate it. Pods answer with their name and the client address they saw.
//! Every address is in namespaces the test made (TEST-NET and private ranges that no route leads out of).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use lb_testkit::{
    deployed::{AgentBox, BoxedNode, Node},
    manifests::{to_yaml, write_atomic},
    sandbox::NetNs,
};
use serde_json::{Value, json};

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");
const CLIENT: &str = "192.0.2.100";
const NODE_1: &str = "192.0.2.1";
const NODE_2: &str = "192.0.2.2";
const LB_IP: &str = "198.51.100.10";
const POD_1: &str = "10.244.1.10";
const POD_2: &str = "10.244.2.10";
const CLIENT_6: &str = "2001:db8:1::100";
const NODE_1_6: &str = "2001:db8:1::1";
const NODE_2_6: &str = "2001:db8:1::2";
const POD_1_6: &str = "fd00:244:1::10";
const POD_2_6: &str = "fd00:244:2::10";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(self::ip(ip), port)
}

fn ns_run(ns: &NetNs, args: &[&str]) {
    let st = std::process::Command::new("ip").args(["netns", "exec", ns.name()]).args(args).status().unwrap();
    assert!(st.success(), "{args:?} in {}", ns.name());
}

/// A pod's server, in the pod's namespace (a thread of the test, `setns` to it): TCP answers every line
/// with `NAME PEER` (the client address it saw), UDP every datagram the same. Stops on drop.
struct PodServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl PodServer {
    fn start(ns: &NetNs, name: &str, addrs: &[SocketAddr]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for &addr in addrs {
            let (tx, rx) = std::sync::mpsc::channel();
            let file = ns.file().try_clone().unwrap();
            let (stop_tcp, stop_udp, name_tcp, name_udp) =
                (stop.clone(), stop.clone(), name.to_owned(), name.to_owned());
            threads.push(std::thread::spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let tcp = TcpListener::bind(addr).unwrap();
                let udp = UdpSocket::bind(addr).unwrap();
                tx.send(()).unwrap();
                tcp.set_nonblocking(true).unwrap();
                udp.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let udp_thread = std::thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    while !stop_udp.load(Ordering::Relaxed) {
                        if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                            let _ = udp.send_to(format!("{name_udp} {peer}\n").as_bytes(), peer);
                        }
                    }
                });
                while !stop_tcp.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((s, peer)) => {
                            let name = name_tcp.clone();
                            std::thread::spawn(move || {
                                s.set_nonblocking(false).unwrap();
                                let mut w = s.try_clone().unwrap();
                                for line in BufReader::new(s).lines() {
                                    if line.is_err() || writeln!(w, "{name} {peer}").is_err() {
                                        break;
                                    }
                                }
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                let _ = udp_thread.join();
            }));
            rx.recv_timeout(Duration::from_secs(5)).expect("pod server listening");
        }
        Self { stop, threads }
    }
}

impl Drop for PodServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run `f` on a thread in `ns` (the external client's namespace).
fn from<T: Send + 'static>(ns: &NetNs, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = ns.file().try_clone().unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// One TCP request to `to`: the answer (`NAME PEER`), or the error.
fn tcp_once(to: SocketAddr) -> Result<(String, String), String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(1500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    writeln!(s, "hello").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    let (name, peer) = line.trim().split_once(' ').ok_or_else(|| format!("answer {line:?}"))?;
    Ok((name.to_owned(), peer.to_owned()))
}

/// One UDP request to `to`: the answer and the address it came from.
fn udp_once(to: SocketAddr) -> Result<(String, SocketAddr), String> {
    let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    s.send_to(b"hello", to).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 512];
    let (n, src) = s.recv_from(&mut buf).map_err(|e| e.to_string())?;
    Ok((String::from_utf8_lossy(&buf[..n]).trim().to_owned(), src))
}

/// An HTTP GET's status line to `to` (the health check node port).
fn http_status(to: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(1500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    Ok(line.trim().to_owned())
}

/// The external client, the LAN, node-1 (the boxed agent's) and node-2, with a pod on each node.
struct Lab {
    boxed: BoxedNode,
    node_2: Node,
    client: NetNs,
    lan: NetNs,
    _pods: Vec<(NetNs, PodServer)>,
}

fn uplink(lan: &NetNs, ns: &NetNs, port: &str, v4: &str, v6: &str) {
    lan.ip(&["link", "add", port, "type", "veth", "peer", "name", "uplink", "netns", ns.name()]).unwrap();
    lan.ip(&["link", "set", port, "master", "br0", "up"]).unwrap();
    ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", "uplink"]).unwrap();
    ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", "uplink", "nodad"]).unwrap();
    ns.ip(&["link", "set", "uplink", "up"]).unwrap();
}

/// A v6 address for a pod `add_pod` made (it sets up IPv4 only): on the pod's `eth0`, routed by the node.
fn pod_v6(node: &NetNs, pod: &NetNs, host_if: &str, addr: &str) {
    node.ip(&["-6", "addr", "add", "fe80::1/64", "dev", host_if, "nodad"]).unwrap();
    node.ip(&["-6", "route", "add", &format!("{addr}/128"), "dev", host_if]).unwrap();
    pod.ip(&["-6", "addr", "add", &format!("{addr}/128"), "dev", "eth0", "nodad"]).unwrap();
    pod.ip(&["-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"]).unwrap();
}

impl Lab {
    /// `etp`: the Service's externalTrafficPolicy; `pod_1`: whether node-1 has its pod (else only node-2's).
    fn new(tag: &str, etp: &str, pod_1: bool) -> Self {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let mut boxed = BoxedNode::new(tag, Path::new(TIERLB), &deploy).unwrap();
        let mut node_2 = Node::new(&format!("{tag}-n2")).unwrap();
        let lan = NetNs::new(&format!("{tag}-lan")).unwrap();
        lan.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        lan.ip(&["link", "set", "br0", "up"]).unwrap();
        let client = NetNs::new(&format!("{tag}-ext")).unwrap();
        uplink(&lan, &boxed.node.netns, "p1", NODE_1, NODE_1_6);
        uplink(&lan, &node_2.netns, "p2", NODE_2, NODE_2_6);
        uplink(&lan, &client, "p3", CLIENT, CLIENT_6);
        for ns in [&boxed.node.netns, &node_2.netns] {
            ns_run(ns, &["sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"]);
        }
        // The load balancer (MetalLB/BGP would announce it) routes its IP to node-1.
        client.ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_1]).unwrap();
        boxed.node.netns.ip(&["route", "add", "10.244.2.0/24", "via", NODE_2]).unwrap();
        boxed.node.netns.ip(&["-6", "route", "add", "fd00:244:2::/64", "via", NODE_2_6]).unwrap();
        node_2.netns.ip(&["route", "add", "10.244.1.0/24", "via", NODE_1]).unwrap();
        node_2.netns.ip(&["-6", "route", "add", "fd00:244:1::/64", "via", NODE_1_6]).unwrap();
        let mut pods = Vec::new();
        let mut eps = Vec::new();
        if pod_1 {
            let ns = boxed.node.add_pod(&format!("{tag}-p1"), ip(POD_1)).unwrap();
            pod_v6(&boxed.node.netns, &ns, "veth0", POD_1_6);
            let srv = PodServer::start(&ns, "web-node-1", &[sa(POD_1, 8080), sa(POD_1_6, 8080)]);
            pods.push((ns, srv));
            eps.push((POD_1, POD_1_6, "node-1"));
        }
        let ns = node_2.add_pod(&format!("{tag}-p2"), ip(POD_2)).unwrap();
        pod_v6(&node_2.netns, &ns, "veth0", POD_2_6);
        let srv = PodServer::start(&ns, "web-node-2", &[sa(POD_2, 8080), sa(POD_2_6, 8080)]);
        pods.push((ns, srv));
        eps.push((POD_2, POD_2_6, "node-2"));
        write_atomic(boxed.manifests.path(), "web.yaml", &to_yaml(&manifests(etp, &eps))).unwrap();
        Self { boxed, node_2, client, lan, _pods: pods }
    }

    fn start_agent(&self) -> AgentBox {
        self.boxed.start_agent("node-1", &[]).unwrap()
    }

    /// `n` TCP requests from the client to `to`: answers by pod name, the peers pods saw, errors.
    fn tcp(&self, to: SocketAddr, n: usize) -> Vec<Result<(String, String), String>> {
        from(&self.client, move || (0..n).map(|_| tcp_once(to)).collect())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("agent log:\n{}", std::fs::read_to_string(&self.boxed.log).unwrap_or_default());
        }
        let _ = &self.node_2;
    }
}

/// A LoadBalancer Service `web` (ports 80/TCP and 53/UDP, node ports 30080 and 30053, target 8080), its
/// load-balancer IP, dual-stack cluster IPs, the two Nodes with their addresses, and slices for `eps`.
fn manifests(etp: &str, eps: &[(&str, &str, &str)]) -> Vec<Value> {
    manifests_with(etp, eps, &[])
}

/// `manifests`, with `loadBalancerSourceRanges`.
fn manifests_with(etp: &str, eps: &[(&str, &str, &str)], ranges: &[&str]) -> Vec<Value> {
    let ready: Vec<_> = eps.iter().map(|&(v4, v6, node)| (v4, v6, node, json!({"ready": true}))).collect();
    manifests_cond(etp, &ready, ranges)
}

/// `manifests_with`, each endpoint with its `conditions`.
fn manifests_cond(etp: &str, eps: &[(&str, &str, &str, Value)], ranges: &[&str]) -> Vec<Value> {
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "type": "LoadBalancer", "externalTrafficPolicy": etp,
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
            "healthCheckNodePort": if etp == "Local" { json!(32000) } else { Value::Null },
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080},
                {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP", "nodePort": 30053},
            ],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": LB_IP, "ipMode": "VIP"}]}},
    })];
    if etp != "Local" {
        docs[0]["spec"].as_object_mut().unwrap().remove("healthCheckNodePort");
    }
    if !ranges.is_empty() {
        docs[0]["spec"]["loadBalancerSourceRanges"] = json!(ranges);
    }
    for (name, v4, v6) in [("node-1", NODE_1, NODE_1_6), ("node-2", NODE_2, NODE_2_6)] {
        docs.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": v4}, {"type": "InternalIP", "address": v6}]}}));
    }
    for (family, idx) in [("IPv4", 0), ("IPv6", 1)] {
        let endpoints: Vec<Value> = eps
            .iter()
            .map(|e| {
                let a = if idx == 0 { e.0 } else { e.1 };
                json!({"addresses": [a], "nodeName": e.2, "conditions": e.3})
            })
            .collect();
        docs.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("web-{}", family.to_lowercase()), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": family,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 8080, "protocol": "UDP"}],
            "endpoints": endpoints,
        }));
    }
    docs
}

fn names(rs: &[Result<(String, String), String>]) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for r in rs {
        let k = match r {
            Ok((n, _)) => n.clone(),
            Err(e) => format!("error: {e}"),
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

#[test]
fn north_south_node_port_and_load_balancer_ip_reach_both_nodes_pods_with_cluster_policy() {
    let lab = Lab::new("ns-cluster", "Cluster", true);
    // Baseline: without tierlb nothing outside the node reaches the Service.
    for to in [sa(NODE_1, 30080), sa(LB_IP, 80)] {
        let r = lab.tcp(to, 1);
        assert!(r[0].is_err(), "{to} answered without the agent: {r:?}");
        eprintln!("{to} without tierlb: {r:?}");
    }
    let _agent = lab.start_agent();
    for (to, what) in [
        (sa(NODE_1, 30080), "node port"),
        (sa(LB_IP, 80), "load-balancer IP"),
        (sa(NODE_1_6, 30080), "IPv6 node port"),
    ] {
        let r = lab.tcp(to, 40);
        let by = names(&r);
        eprintln!("{what} {to}: {by:?}");
        assert_eq!(by.values().sum::<usize>(), 40);
        assert!(
            by.get("web-node-1") > Some(&0) && by.get("web-node-2") > Some(&0),
            "{what}: both pods: {by:?}"
        );
        assert!(r.iter().all(Result::is_ok), "{what}: every connect answered: {by:?}");
        for (name, peer) in r.iter().flatten() {
            let peer: SocketAddr = peer.parse().unwrap();
            if name == "web-node-1" {
                assert_eq!(
                    peer.ip(),
                    if to.is_ipv4() { ip(CLIENT) } else { ip(CLIENT_6) },
                    "the local pod sees the client"
                );
            } else {
                assert_eq!(
                    peer.ip(),
                    if to.is_ipv4() { ip(NODE_1) } else { ip(NODE_1_6) },
                    "the remote pod sees node-1 (SNAT)"
                );
            }
        }
    }
    // UDP: the reply comes from nodeIP:nodePort, from either pod.
    let to = sa(NODE_1, 30053);
    let r: Vec<_> = from(&lab.client, move || (0..30).map(|_| udp_once(to)).collect());
    let mut seen = std::collections::BTreeSet::new();
    for a in &r {
        let (answer, src) = a.as_ref().expect("UDP answered");
        assert_eq!(*src, to, "the reply's source is the node port");
        seen.insert(answer.split(' ').next().unwrap().to_owned());
    }
    assert_eq!(seen.len(), 2, "both pods answer UDP: {seen:?}");
    // What an operator sees: the outside-scope frontends, the devices, the flows and the counters.
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let out = std::process::Command::new(TIERLB)
        .args(["status", "-o", "json", "--bpffs", pins.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outside: Vec<&Value> =
        st[0]["frontends"].as_array().unwrap().iter().filter(|f| f["scope"] == "outside").collect();
    let addrs: Vec<&str> = outside.iter().map(|f| f["frontend"].as_str().unwrap()).collect();
    for want in ["192.0.2.1:30080", "198.51.100.10:80", "[2001:db8:1::1]:30080", "192.0.2.1:30053"] {
        assert!(addrs.contains(&want), "{want} among the outside frontends: {addrs:?}");
    }
    let ns = &st[0]["north_south"];
    assert_eq!(ns["devices"], json!(["uplink"]), "{ns}");
    assert!(ns["conntrack"]["entries"].as_u64() > Some(0), "{ns}");
    for counter in ["new_local", "new_snat", "translated"] {
        assert!(ns["counters"][counter].as_u64() > Some(0), "{counter}: {ns}");
    }
    let table = std::process::Command::new(TIERLB)
        .args(["status", "--bpffs", pins.to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    eprintln!("tierlb status:\n{table}");
    assert!(table.contains("from outside the node: tc on uplink"), "{table}");
    // And what Prometheus sees, from the node's own namespace.
    let metrics = from(&lab.boxed.node.netns, || http_body(sa("127.0.0.1", 10249), "/metrics")).unwrap();
    let value = |prefix: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert!(value("tierlb_external_packets_total{result=\"new_snat\"}") > 0, "{metrics}");
    assert!(value("tierlb_external_packets_total{result=\"new_local\"}") > 0, "{metrics}");
    assert!(value("tierlb_external_flows_total{") >= 150, "40 + 40 + 40 TCP and 30 UDP flows: {metrics}");
}

/// The body of an HTTP GET of `path` at `to`.
fn http_body(to: SocketAddr, path: &str) -> Result<String, String> {
    use std::io::Read as _;
    let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(1500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    Ok(text.split_once("\r\n\r\n").map_or(text.clone(), |(_, b)| b.to_owned()))
}

#[test]
fn north_south_local_policy_keeps_the_client_address_and_drops_without_a_local_endpoint() {
    {
        let lab = Lab::new("ns-local", "Local", true);
        let _agent = lab.start_agent();
        let r = lab.tcp(sa(NODE_1, 30080), 30);
        let by = names(&r);
        assert_eq!(by.get("web-node-1"), Some(&30), "only node-1's pod: {by:?}");
        assert!(r.iter().flatten().all(|(_, peer)| peer.parse::<SocketAddr>().unwrap().ip() == ip(CLIENT)));
        let r = lab.tcp(sa(LB_IP, 80), 10);
        assert_eq!(names(&r).get("web-node-1"), Some(&10), "LB IP, Local: {r:?}");
        let hc = from(&lab.client, || http_status(sa(NODE_1, 32000)));
        assert!(hc.as_ref().is_ok_and(|s| s.contains(" 200")), "health check with a local endpoint: {hc:?}");
    }

    let lab = Lab::new("ns-nolocal", "Local", false);
    let _agent = lab.start_agent();
    let trace = Trace::start(&lab);
    let started = Instant::now();
    let r = lab.tcp(sa(NODE_1, 30080), 2);
    assert!(r.iter().all(Result::is_err), "no local endpoint: no answer (kube-proxy's DROP): {r:?}");
    assert!(started.elapsed() >= Duration::from_secs(2), "dropped, so the client times out: {r:?}");
    let hc = from(&lab.client, || http_status(sa(NODE_1, 32000)));
    assert!(hc.as_ref().is_ok_and(|s| s.contains(" 503")), "the balancer's health check says 503: {hc:?}");
    // `tierlb trace` shows each dropped flow (SYN and its retransmissions: one event per packet without a flow).
    let events = trace.stop();
    let tc: Vec<&Value> = events.iter().filter(|e| e["hook"] == "tc_ingress").collect();
    assert!(tc.len() >= 2, "{events:?}");
    for e in &tc {
        assert_eq!(e["reason"], "refused-no-local-endpoint", "{e}");
        assert_eq!(e["vip"], "192.0.2.1:30080", "{e}");
        assert!(e["client"].as_str().unwrap().starts_with("192.0.2.100:"), "{e}");
        assert!(e.get("errno").is_none(), "a dropped packet has no errno: {e}");
    }
}

/// `tierlb trace -o json` on the boxed agent's pins, until `stop`.
struct Trace {
    child: lb_testkit::sandbox::Child,
    out: std::path::PathBuf,
    _dir: lb_testkit::sandbox::TempDir,
}

impl Trace {
    fn start(lab: &Lab) -> Self {
        let dir = lb_testkit::sandbox::TempDir::new("ns-trace").unwrap();
        let (out, err) = (dir.path().join("out.json"), dir.path().join("err.txt"));
        let pins = lab.boxed.bpffs.path().join("tierlb");
        let mut cmd = std::process::Command::new(TIERLB);
        cmd.args(["trace", "--bpffs", pins.to_str().unwrap(), "-o", "json"])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        let mut child = lb_testkit::sandbox::Child::spawn(&mut cmd).unwrap();
        child.wait_for_log(&err, 0, "tierlb trace: tracing", Duration::from_secs(10)).unwrap();
        Self { child, out, _dir: dir }
    }

    fn stop(mut self) -> Vec<Value> {
        let status = self.child.stop(Duration::from_secs(5)).unwrap();
        assert!(status.success(), "trace exited {status}");
        let out = std::fs::read_to_string(&self.out).unwrap();
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

#[test]
fn north_south_connection_survives_an_agent_sigkill_and_restart() {
    let lab = Lab::new("ns-restart", "Cluster", true);
    let agent = lab.start_agent();
    let to = sa(NODE_1, 30080);
    // One connection per pod, opened before the agent dies.
    let (tx_cmd, rx_cmd) = std::sync::mpsc::channel::<()>();
    let (tx_res, rx_res) = std::sync::mpsc::channel::<Vec<String>>();
    let file = lab.client.file().try_clone().unwrap();
    let client = std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut conns = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut names = std::collections::BTreeSet::new();
        while names.len() < 2 && Instant::now() < deadline {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            writeln!(s, "hello").unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            if names.insert(line.split(' ').next().unwrap().to_owned()) {
                conns.push(s);
            }
        }
        tx_res.send(names.into_iter().collect()).unwrap();
        rx_cmd.recv().unwrap();
        let after: Vec<String> = conns
            .iter_mut()
            .map(|s| {
                writeln!(s, "again").map_err(|e| e.to_string())?;
                let mut line = String::new();
                BufReader::new(&*s).read_line(&mut line).map_err(|e| e.to_string())?;
                Ok::<_, String>(line.trim().to_owned())
            })
            .map(|r| r.unwrap_or_else(|e| format!("error: {e}")))
            .collect();
        tx_res.send(after).unwrap();
    });
    let before = rx_res.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(before.len(), 2, "a connection to each pod: {before:?}");
    agent.kill();
    let agent = lab.start_agent();
    tx_cmd.send(()).unwrap();
    let after = rx_res.recv_timeout(Duration::from_secs(30)).unwrap();
    client.join().unwrap();
    assert!(after.iter().all(|l| l.starts_with("web-node")), "both connections kept working: {after:?}");
    // `tierlb agent --cleanup` (what deploy/uninstall runs) detaches the tc programs from the device too.
    // (Debian 12's bpftool 7.1 does not list tcx links: ask the kernel through aya.)
    let tc_progs = || {
        from(&lab.boxed.node.netns, || {
            let mut names = Vec::new();
            for kind in [aya::programs::TcAttachType::Ingress, aya::programs::TcAttachType::Egress] {
                let (_, progs) = aya::programs::SchedClassifier::query_tcx("uplink", kind).unwrap();
                names.extend(progs.iter().filter_map(|p| p.name_as_str().map(str::to_owned)));
            }
            let n = names.iter().filter(|n| n.starts_with("tc_")).count();
            (n, format!("{names:?}"))
        })
    };
    let (n, text) = tc_progs();
    assert_eq!(n, 2, "ingress and egress attached once each, after the restart: {text}");
    drop(agent);
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let st = std::process::Command::new(TIERLB)
        .args(["agent", "--cleanup", "--node", "node-1", "--bpffs", pins.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let (n, text) = tc_progs();
    assert_eq!(n, 0, "no tc program left on the device: {text}");
}

#[test]
fn north_south_udp_flows_to_a_departed_backend_are_forgotten() {
    let lab = Lab::new("ns-udp", "Cluster", true);
    let mut agent = lab.start_agent();
    let to = sa(NODE_1, 30053);
    // A client socket whose flow went to node-2's pod (sockets are tried until one does).
    let file = lab.client.file().try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (tx_res, rx_res) = std::sync::mpsc::channel::<Vec<String>>();
    let client = std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let ask = |s: &UdpSocket| {
            s.send_to(b"hello", to).unwrap();
            let mut buf = [0u8; 512];
            let (n, _) = s.recv_from(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).split(' ').next().unwrap().to_owned()
        };
        let s = (0..50)
            .map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
                s
            })
            .find(|s| ask(s) == "web-node-2")
            .expect("a flow to node-2's pod");
        let before: Vec<String> = (0..3).map(|_| ask(&s)).collect();
        tx_res.send(before).unwrap();
        rx.recv().unwrap();
        tx_res.send((0..3).map(|_| ask(&s)).collect()).unwrap();
    });
    let before = rx_res.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(before, ["web-node-2"; 3], "the flow sticks to its backend");
    // node-2's pod leaves the EndpointSlice (it still answers: only the agent can move the flow).
    let from_len = std::fs::metadata(&lab.boxed.log).map_or(0, |m| m.len() as usize);
    write_atomic(
        lab.boxed.manifests.path(),
        "web.yaml",
        &to_yaml(&manifests("Cluster", &[(POD_1, POD_1_6, "node-1")])),
    )
    .unwrap();
    agent.wait_for(&lab.boxed.log, from_len, "forgot UDP flows", Duration::from_secs(10)).unwrap();
    tx.send(()).unwrap();
    let after = rx_res.recv_timeout(Duration::from_secs(30)).unwrap();
    client.join().unwrap();
    assert_eq!(after, ["web-node-1"; 3], "the same socket's datagrams go to the remaining pod");
}

#[test]
fn north_south_load_balancer_source_ranges_admit_only_their_clients() {
    let lab = Lab::new("ns-ranges", "Cluster", true);
    // A second client on the LAN, outside the Service's range.
    let other = NetNs::new("ns-ranges-ext2").unwrap();
    uplink(&lab.lan, &other, "p4", "192.0.2.200", "2001:db8:1::200");
    other.ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_1]).unwrap();
    let eps = [(POD_1, POD_1_6, "node-1"), (POD_2, POD_2_6, "node-2")];
    let docs = manifests_with("Cluster", &eps, &["192.0.2.96/28", "2001:db8:1::/120"]);
    write_atomic(lab.boxed.manifests.path(), "web.yaml", &to_yaml(&docs)).unwrap();
    let _agent = lab.start_agent();
    let to = sa(LB_IP, 80);
    let allowed = lab.tcp(to, 20);
    assert!(allowed.iter().all(Result::is_ok), "192.0.2.100 is in 192.0.2.96/28: {:?}", names(&allowed));
    let refused: Vec<_> = from(&other, move || (0..2).map(|_| tcp_once(to)).collect());
    assert!(refused.iter().all(Result::is_err), "192.0.2.200 is not: {refused:?}");
    // The node port is not limited by the ranges (kube-proxy limits load-balancer IPs only).
    let np: Vec<_> = from(&other, || (0..5).map(|_| tcp_once(sa(NODE_1, 30080))).collect());
    assert!(np.iter().all(Result::is_ok), "{np:?}");
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let out = std::process::Command::new(TIERLB)
        .args(["status", "-o", "json", "--bpffs", pins.to_str().unwrap()])
        .output()
        .unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(st[0]["north_south"]["counters"]["drop_source_range"].as_u64() >= Some(2), "{st}");
}

/// KEP-1669 from outside the node: externalTrafficPolicy Local, node-1's only endpoint terminating but still
/// serving: new connections from outside still go to it (no ready local endpoint, so the serving terminating
/// one), and the health check node port answers 503, as kube-proxy's counts only ready local endpoints (the
/// balancer drains the node). A connection opened while the endpoint was ready keeps working while it
/// terminates, also once it stops serving: then new connections are dropped, the open one still answers.
#[test]
fn north_south_local_policy_uses_a_terminating_local_endpoint_and_established_flows_last() {
    let lab = Lab::new("ns-term", "Local", true);
    let mut agent = lab.start_agent();
    let to = sa(NODE_1, 30080);
    let ask = |s: &mut TcpStream| -> Result<String, String> {
        writeln!(s, "hello").map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(&*s).read_line(&mut line).map_err(|e| e.to_string())?;
        Ok(line.split(' ').next().unwrap_or_default().to_owned())
    };
    let mut open = from(&lab.client, move || TcpStream::connect_timeout(&to, Duration::from_millis(1500)))
        .expect("a connection while the endpoint is ready");
    open.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    assert_eq!(ask(&mut open).as_deref(), Ok("web-node-1"));
    let mut node_1 = |conditions: Value| {
        let eps =
            [(POD_1, POD_1_6, "node-1", conditions), (POD_2, POD_2_6, "node-2", json!({"ready": true}))];
        let from_len = std::fs::metadata(&lab.boxed.log).map_or(0, |m| m.len() as usize);
        write_atomic(lab.boxed.manifests.path(), "web.yaml", &to_yaml(&manifests_cond("Local", &eps, &[])))
            .unwrap();
        agent.wait_for(&lab.boxed.log, from_len, "synced", Duration::from_secs(10)).unwrap();
    };
    node_1(json!({"ready": false, "serving": true, "terminating": true}));
    let r = lab.tcp(to, 10);
    assert_eq!(names(&r).get("web-node-1"), Some(&10), "the terminating, serving local endpoint: {r:?}");
    let hc = from(&lab.client, || http_status(sa(NODE_1, 32000)));
    assert!(hc.as_ref().is_ok_and(|s| s.contains(" 503")), "only a terminating local endpoint: {hc:?}");
    assert_eq!(ask(&mut open).as_deref(), Ok("web-node-1"), "the open connection, endpoint terminating");
    node_1(json!({"ready": false, "serving": false, "terminating": true}));
    let r = lab.tcp(to, 2);
    assert!(r.iter().all(Result::is_err), "no usable local endpoint: new connections dropped: {r:?}");
    assert_eq!(ask(&mut open).as_deref(), Ok("web-node-1"), "the open connection lasts until it ends");
}
