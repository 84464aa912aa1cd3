//! The lab of the north-south tests: namespaces, pods, the boxed agent, manifests and clients.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    path::Path,
    time::Duration,
};

use lb_testkit::{
    deployed::{AgentBox, BoxedNode},
    manifests::{to_yaml, write_atomic},
    sandbox::NetNs,
};
// The pods' server and the client's calls are the north-south loads' (`lb_testkit::ns_loads`), which the
// bench runs against real kube-proxy too.
pub(crate) use lb_testkit::ns_loads::pod::{PodServer, from, tcp_once};
use serde_json::{Value, json};

pub(crate) const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");
pub(crate) const CLIENT: &str = "192.0.2.100";
pub(crate) const NODE_1: &str = "192.0.2.1";
pub(crate) const NODE_2: &str = "192.0.2.2";
pub(crate) const LB_IP: &str = "198.51.100.10";
pub(crate) const POD_1: &str = "10.244.1.10";
pub(crate) const POD_2: &str = "10.244.2.10";
pub(crate) const CLIENT_6: &str = "2001:db8:1::100";
pub(crate) const NODE_1_6: &str = "2001:db8:1::1";
pub(crate) const NODE_2_6: &str = "2001:db8:1::2";
pub(crate) const POD_1_6: &str = "fd00:244:1::10";
pub(crate) const POD_2_6: &str = "fd00:244:2::10";

/// The Service's ways in from outside the tests reach it by: node port, load-balancer IP, IPv6 node port.
pub(crate) fn ways_in() -> [(SocketAddr, &'static str); 3] {
    [
        (sa(NODE_1, 30080), "node port"),
        (sa(LB_IP, 80), "load-balancer IP"),
        (sa(NODE_1_6, 30080), "IPv6 node port"),
    ]
}

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(crate) fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(self::ip(ip), port)
}

pub(crate) fn ns_run(ns: &NetNs, args: &[&str]) {
    let st = std::process::Command::new("ip").args(["netns", "exec", ns.name()]).args(args).status().unwrap();
    assert!(st.success(), "{args:?} in {}", ns.name());
}

/// `n` UDP requests to `to`, each from a socket of its own, all bound before the first is sent: `n` flows
/// (sockets made and closed one after another may be given a port again, whose flow is then still tracked:
/// one in about 70 runs of 30 did).
pub(crate) fn udp_flows(to: SocketAddr, n: usize) -> Vec<Result<(String, SocketAddr), String>> {
    let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let socks: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind(bind).unwrap()).collect();
    socks.iter().map(|s| udp_on(s, to)).collect()
}

/// One UDP request to `to` from `s`: the answer and the address it came from.
fn udp_on(s: &UdpSocket, to: SocketAddr) -> Result<(String, SocketAddr), String> {
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    s.send_to(b"hello", to).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 512];
    let (n, src) = s.recv_from(&mut buf).map_err(|e| e.to_string())?;
    Ok((String::from_utf8_lossy(&buf[..n]).trim().to_owned(), src))
}

/// An HTTP GET's status line to `to` (the health check node port).
pub(crate) fn http_status(to: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(1500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    Ok(line.trim().to_owned())
}

/// The external client, the LAN, node-1 (the boxed agent's) and node-2, with a pod on each node.
pub(crate) struct Lab {
    pub(crate) boxed: BoxedNode,
    /// Node-2, with its own boxed agent (started only by the tests that need it).
    pub(crate) node_2: BoxedNode,
    pub(crate) client: NetNs,
    pub(crate) lan: NetNs,
    /// Each pod's namespace and server: node-1's first (if it has one), then node-2's.
    pub(crate) pods: Vec<(NetNs, PodServer)>,
    /// `--xdp` for this lab's agents (`None`: the default, which on a veth is none): `with_xdp`, or the
    /// whole suite again with `TIERLB_TEST_XDP=native`.
    pub(crate) xdp: Option<String>,
    /// The XDP programs on veth peers that `xdp` needs (`peer_xdp`).
    pub(crate) peer_xdp: std::sync::Mutex<Vec<aya::Ebpf>>,
}

/// The `--xdp` the suite's agents run with: `native` in the suite's second binary (`north_south_xdp`, this
/// suite again with XDP on node-1's uplink), else `TIERLB_TEST_XDP` if set (`native`, `generic`), else the
/// default (which on a veth is none).
pub(crate) fn xdp_from_env() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    if exe.file_name().is_some_and(|n| n.to_string_lossy().starts_with("north_south_xdp")) {
        return Some("native".to_owned());
    }
    std::env::var("TIERLB_TEST_XDP").ok().filter(|v| !v.is_empty())
}

/// The LAN as a wire is with XDP on node-1's uplink: what arrives carries complete checksums (a frame that
/// crossed a real wire does; a veth hands on the sender's partial one, which XDP, before any skb, cannot
/// know), and node-1's port on the bridge takes XDP_TX frames: a veth's peer needs an XDP program of its own
/// for that (this object's `xdp_ingress` over empty maps, which passes everything). With GRO on instead (the
/// other way a veth gets the NAPI instance XDP_TX needs), SNAT flows lost their backend's segments (Linux
/// 6.18: retransmissions, PAWS drops; every connect answered with the program). The `Ebpf` holds it.
pub(crate) fn wire_for_xdp(lan: &NetNs, senders: &[&NetNs]) -> Vec<aya::Ebpf> {
    for ns in senders {
        ns.tx_checksum("uplink", false).unwrap();
    }
    vec![peer_xdp(lan, "p1"), peer_xdp(lan, "p2")]
}

/// `xdp_ingress` over empty maps (it passes everything) on `device` in `ns`, native: what a veth needs on the
/// peer of a device whose XDP program sends frames out of it (`wire_for_xdp`). Detached when dropped.
pub(crate) fn peer_xdp(ns: &NetNs, device: &str) -> aya::Ebpf {
    let object = tierlb::datapath::ebpf::embedded_object().expect("built with the BPF object");
    let device = device.to_owned();
    from(ns, move || {
        let mut ebpf = aya::Ebpf::load(object).unwrap();
        let p: &mut aya::programs::Xdp = ebpf.program_mut("xdp_ingress").unwrap().try_into().unwrap();
        p.load().unwrap();
        p.attach(&device, aya::programs::XdpMode::Driver).unwrap();
        ebpf
    })
}

pub(crate) fn uplink(lan: &NetNs, ns: &NetNs, port: &str, v4: &str, v6: &str) {
    lan.ip(&["link", "add", port, "type", "veth", "peer", "name", "uplink", "netns", ns.name()]).unwrap();
    lan.ip(&["link", "set", port, "master", "br0", "up"]).unwrap();
    ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", "uplink"]).unwrap();
    ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", "uplink", "nodad"]).unwrap();
    ns.ip(&["link", "set", "uplink", "up"]).unwrap();
}

/// A v6 address for a pod `add_pod` made (it sets up IPv4 only): on the pod's `eth0`, routed by the node.
pub(crate) fn pod_v6(node: &NetNs, pod: &NetNs, host_if: &str, addr: &str) {
    node.ip(&["-6", "addr", "add", "fe80::1/64", "dev", host_if, "nodad"]).unwrap();
    node.ip(&["-6", "route", "add", &format!("{addr}/128"), "dev", host_if]).unwrap();
    pod.ip(&["-6", "addr", "add", &format!("{addr}/128"), "dev", "eth0", "nodad"]).unwrap();
    pod.ip(&["-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"]).unwrap();
}

impl Lab {
    /// `etp`: the Service's externalTrafficPolicy; `pod_1`: whether node-1 has its pod (else only node-2's).
    pub(crate) fn new(tag: &str, etp: &str, pod_1: bool) -> Self {
        Self::with_xdp(tag, etp, pod_1, xdp_from_env().as_deref())
    }

    /// `new`, its agents run with `--xdp=XDP` (and the LAN made a wire for it: `wire_for_xdp`).
    pub(crate) fn with_xdp(tag: &str, etp: &str, pod_1: bool, xdp: Option<&str>) -> Self {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let mut boxed = BoxedNode::new(tag, Path::new(TIERLB), &deploy).unwrap();
        let mut node_2 = BoxedNode::new(&format!("{tag}-n2"), Path::new(TIERLB), &deploy).unwrap();
        let lan = NetNs::new(&format!("{tag}-lan")).unwrap();
        lan.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        lan.ip(&["link", "set", "br0", "up"]).unwrap();
        let client = NetNs::new(&format!("{tag}-ext")).unwrap();
        uplink(&lan, &boxed.node.netns, "p1", NODE_1, NODE_1_6);
        uplink(&lan, &node_2.node.netns, "p2", NODE_2, NODE_2_6);
        uplink(&lan, &client, "p3", CLIENT, CLIENT_6);
        for ns in [&boxed.node.netns, &node_2.node.netns] {
            ns_run(ns, &["sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"]);
        }
        // The load balancer (MetalLB/BGP would announce it) routes its IP to node-1.
        client.ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_1]).unwrap();
        boxed.node.netns.ip(&["route", "add", "10.244.2.0/24", "via", NODE_2]).unwrap();
        boxed.node.netns.ip(&["-6", "route", "add", "fd00:244:2::/64", "via", NODE_2_6]).unwrap();
        node_2.node.netns.ip(&["route", "add", "10.244.1.0/24", "via", NODE_1]).unwrap();
        node_2.node.netns.ip(&["-6", "route", "add", "fd00:244:1::/64", "via", NODE_1_6]).unwrap();
        let mut pods = Vec::new();
        let mut eps = Vec::new();
        if pod_1 {
            let ns = boxed.node.add_pod(&format!("{tag}-p1"), ip(POD_1)).unwrap();
            pod_v6(&boxed.node.netns, &ns, "veth0", POD_1_6);
            let srv = PodServer::start(&ns, "web-node-1", &[sa(POD_1, 8080), sa(POD_1_6, 8080)]);
            pods.push((ns, srv));
            eps.push((POD_1, POD_1_6, "node-1"));
        }
        let ns = node_2.node.add_pod(&format!("{tag}-p2"), ip(POD_2)).unwrap();
        pod_v6(&node_2.node.netns, &ns, "veth0", POD_2_6);
        let srv = PodServer::start(&ns, "web-node-2", &[sa(POD_2, 8080), sa(POD_2_6, 8080)]);
        pods.push((ns, srv));
        eps.push((POD_2, POD_2_6, "node-2"));
        write_atomic(boxed.manifests.path(), "web.yaml", &to_yaml(&manifests(etp, &eps))).unwrap();
        let peer_xdp = xdp
            .map_or_else(Vec::new, |_| wire_for_xdp(&lan, &[&client, &node_2.node.netns, &boxed.node.netns]));
        Self {
            boxed,
            node_2,
            client,
            lan,
            pods,
            xdp: xdp.map(str::to_owned),
            peer_xdp: std::sync::Mutex::new(peer_xdp),
        }
    }

    pub(crate) fn start_agent(&self) -> AgentBox {
        self.start_agent_with(&[])
    }

    /// Node-1's agent with `extra` flags (and the lab's `--xdp`).
    pub(crate) fn start_agent_with(&self, extra: &[&str]) -> AgentBox {
        self.boxed.start_agent("node-1", &self.flags(extra)).unwrap()
    }

    /// Node-2's agent with `extra` flags (and the lab's `--xdp`).
    pub(crate) fn start_node_2_with(&self, extra: &[&str]) -> AgentBox {
        self.node_2.start_agent("node-2", &self.flags(extra)).unwrap()
    }

    /// Another outside client, `ns`, on the LAN by bridge port `port` (`uplink`), sending as a wire would when
    /// the lab's XDP is on (`wire`).
    pub(crate) fn client_on_lan(&self, ns: &NetNs, port: &str, v4: &str, v6: &str) {
        uplink(&self.lan, ns, port, v4, v6);
        self.wire(ns, true, &[]);
    }

    /// With the lab's XDP on: `ns` sends by its `uplink` as a wire would (complete checksums), and
    /// `devices` (a veth in its namespace each, which node-1's XDP may send out of) get the peer program.
    pub(crate) fn wire(&self, ns: &NetNs, sender: bool, devices: &[(&NetNs, &str)]) {
        if self.xdp.is_none() {
            return;
        }
        if sender {
            ns.tx_checksum("uplink", false).unwrap();
        }
        for (ns, device) in devices {
            self.peer_xdp.lock().unwrap().push(peer_xdp(ns, device));
        }
    }

    fn flags<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut out = extra.to_vec();
        if let Some(x) = &self.xdp {
            out.extend(["--xdp", x.as_str()]);
        }
        out
    }

    /// `tierlb status -o json` of the boxed agent's pins.
    pub(crate) fn status(&self) -> Value {
        status_of(&self.boxed)
    }

    /// `n` TCP requests from the client to `to`: answers by pod name, the peers pods saw, errors.
    pub(crate) fn tcp(&self, to: SocketAddr, n: usize) -> Vec<Result<(String, String), String>> {
        from(&self.client, move || (0..n).map(|_| tcp_once(to)).collect())
    }
}

/// `tierlb status -o json` of `node`'s agent's pins.
pub(crate) fn status_of(node: &BoxedNode) -> Value {
    let pins = node.bpffs.path().join("tierlb");
    let out = std::process::Command::new(TIERLB)
        .args(["status", "-o", "json", "--bpffs", pins.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("agent log:\n{}", std::fs::read_to_string(&self.boxed.log).unwrap_or_default());
            if let Ok(log) = std::fs::read_to_string(&self.node_2.log) {
                eprintln!("node-2's agent log:\n{log}");
            }
        }
    }
}

/// A LoadBalancer Service `web` (ports 80/TCP and 53/UDP, node ports 30080 and 30053, target 8080; 54/UDP,
/// node port 30054, to the closed target port 9), its load-balancer IP, dual-stack cluster IPs, the two Nodes
/// with their addresses, and slices for `eps`.
pub(crate) fn manifests(etp: &str, eps: &[(&str, &str, &str)]) -> Vec<Value> {
    manifests_with(etp, eps, &[])
}

/// `manifests`, with `loadBalancerSourceRanges`.
pub(crate) fn manifests_with(etp: &str, eps: &[(&str, &str, &str)], ranges: &[&str]) -> Vec<Value> {
    let ready: Vec<_> = eps.iter().map(|&(v4, v6, node)| (v4, v6, node, json!({"ready": true}))).collect();
    manifests_cond(etp, &ready, ranges)
}

/// `manifests_with`, each endpoint with its `conditions`.
pub(crate) fn manifests_cond(etp: &str, eps: &[(&str, &str, &str, Value)], ranges: &[&str]) -> Vec<Value> {
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
                // Nothing listens on 9 in the pods: their kernels answer with ICMP port unreachable.
                {"name": "closed", "port": 54, "targetPort": 9, "protocol": "UDP", "nodePort": 30054},
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
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 8080, "protocol": "UDP"},
                      {"name": "closed", "port": 9, "protocol": "UDP"}],
            "endpoints": endpoints,
        }));
    }
    docs
}

pub(crate) fn names(rs: &[Result<(String, String), String>]) -> std::collections::BTreeMap<String, usize> {
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

/// The body of an HTTP GET of `path` at `to`.
pub(crate) fn http_body(to: SocketAddr, path: &str) -> Result<String, String> {
    use std::io::Read as _;
    let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(1500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    Ok(text.split_once("\r\n\r\n").map_or(text.clone(), |(_, b)| b.to_owned()))
}

/// The names of the programs tc runs on `device` in `ns`, ingress then egress: its tcx links' where the kernel
/// has tcx, else its netlink filters' (`tc filter show`; Debian 12's 6.1, where the agent attaches by netlink).
pub(crate) fn tc_programs(ns: &NetNs, device: &str) -> [Vec<String>; 2] {
    let mut out: [Vec<String>; 2] = Default::default();
    for (i, kind) in
        [aya::programs::TcAttachType::Ingress, aya::programs::TcAttachType::Egress].into_iter().enumerate()
    {
        out[i] = if tierlb::datapath::tc::kernel_has_tcx() {
            let device = device.to_owned();
            from(ns, move || {
                let (_, progs) = aya::programs::SchedClassifier::query_tcx(&device, kind).unwrap();
                progs.iter().filter_map(|p| p.name_as_str().map(str::to_owned)).collect()
            })
        } else {
            let text = tc_filters(ns, device, if i == 0 { "ingress" } else { "egress" });
            text.split(" name ")
                .skip(1)
                .filter_map(|r| r.split_whitespace().next().map(str::to_owned))
                .collect()
        };
    }
    out
}

/// `tc filter show dev DEVICE DIR` in `ns`: the netlink filters on one side of a device.
pub(crate) fn tc_filters(ns: &NetNs, device: &str, dir: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "tc", "filter", "show", "dev", device, dir])
        .output()
        .unwrap();
    assert!(out.status.success(), "tc filter show: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
