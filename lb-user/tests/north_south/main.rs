//! Traffic from outside the node, in the kernel, with the agent run as `deploy/` runs it (`BoxedNode`): an
//! external client in its own network namespace, a LAN (a bridge in a namespace of its own), node-1 (the
//! agent's node: its uplink on the LAN, a pod behind a veth) and node-2 (a pod, routes to node-1's pods), all
//! made by the test. The client reaches node-1's NodePort and a load-balancer IP routed to node-1; tierlb's tc
//! programs on node-1's uplink translate it. Pods answer with their name and the client address they saw.
//! Every address is in namespaces the test made (TEST-NET and private ranges that no route leads out of).
mod affinity;
mod dsr;
mod fragments;
mod icmp;
mod l3_device;
mod lab;
mod load;
mod maglev;
mod mtu;
mod netlink;
mod reply_device;
mod reuse;
mod two_nodes;
mod upgrade;
mod xdp;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use lab::*;
use lb_testkit::{
    manifests::{to_yaml, write_atomic},
    sandbox::NetNs,
};
use serde_json::{Value, json};

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
    for (to, what) in ways_in() {
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
    let r = from(&lab.client, move || udp_flows(to, 30));
    let mut seen = std::collections::BTreeSet::new();
    for a in &r {
        let (answer, src) = a.as_ref().expect("UDP answered");
        assert_eq!(*src, to, "the reply's source is the node port");
        seen.insert(answer.split(' ').next().unwrap().to_owned());
    }
    assert_eq!(seen.len(), 2, "both pods answer UDP: {seen:?}");
    // What an operator sees: the outside-scope frontends, the devices, the flows and the counters.
    let st = lab.status();
    let pins = lab.boxed.bpffs.path().join("tierlb");
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
    // Another process holding the killed agent's tc links open (a monitor, bpftool): the kernel releases a link
    // only when its last reference goes, so what takes the old programs off the device must be a detach.
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let hold_tc_links = || -> Vec<aya::programs::links::PinnedLink> {
        ["tc_ingress", "tc_egress"]
            .iter()
            .filter_map(|p| {
                aya::programs::links::PinnedLink::from_pin(pins.join(format!("node-1/link_{p}@uplink"))).ok()
            })
            .collect()
    };
    let held = hold_tc_links();
    // (A kernel without tcx has netlink filters, not links: nothing to hold.)
    assert_eq!(
        held.len(),
        if tierlb::datapath::tc::has_tcx() { 2 } else { 0 },
        "the killed agent's tc links"
    );
    let agent = lab.start_agent();
    tx_cmd.send(()).unwrap();
    let after = rx_res.recv_timeout(Duration::from_secs(30)).unwrap();
    client.join().unwrap();
    assert!(after.iter().all(|l| l.starts_with("web-node")), "both connections kept working: {after:?}");
    // `tierlb agent --cleanup` (what deploy/uninstall runs) detaches the tc programs from the device too, by the
    // time it exits.
    // (Debian 12's bpftool 7.1 does not list tcx links: `tc_programs` asks the kernel through aya, or reads
    // the netlink filters on a kernel without tcx.)
    let tc_progs = || {
        let names: Vec<String> = tc_programs(&lab.boxed.node.netns, "uplink").concat();
        let n = names.iter().filter(|n| n.starts_with("tc_")).count();
        (n, format!("{names:?}"))
    };
    // The new agent pins its links over the old ones and detaches the old ones (`BPF_LINK_DETACH`) before it
    // says it is ready: one of each on the device now, though the old links are still held open.
    let seen = tc_progs();
    drop(held);
    let held = hold_tc_links();
    let (n, text) = seen;
    assert_eq!(n, 2, "ingress and egress attached once each, after the restart: {text}");
    drop(agent);
    // In the node's network namespace, as deploy/uninstall runs it (host network): netlink filters, on a
    // kernel without tcx, are found on the node's devices only.
    let st = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.boxed.node.netns.name(),
            TIERLB,
            "agent",
            "--cleanup",
            "--node",
            "node-1",
        ])
        .args(["--bpffs", pins.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let (n, text) = tc_progs();
    assert_eq!(n, 0, "no tc program left on the device, though its links are held open: {text}");
    drop(held);
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
    lab.client_on_lan(&other, "p4", "192.0.2.200", "2001:db8:1::200");
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
    let st = lab.status();
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
