//! An upgrade from the previous release and a rollback to it, as a DaemonSet's rolling update makes them: the
//! agent stopped with SIGTERM, the other release's agent started on the same pins, cgroup and devices, each
//! run as its own release's `deploy/` runs it. Map layout 2 changed a pinned map (NS_COUNTERS), so the upgrade
//! migrates it in place and the rollback meets the previous layout's pin the newer agent left.
//!
//! Under load the whole time: a pod's held TCP connections (IPv4 and IPv6) and connected UDP socket to the
//! Service's cluster IPs, its stream of new connections every 5 ms to the cluster IP and to a Service with
//! sessionAffinity ClientIP; an outside client's held TCP connections to the node port and the load-balancer
//! IP, its connected UDP socket to the UDP node port, its stream of new connections to the node port. The
//! verdict: no connection failed, every held socket still answers with the Service's address as its peer,
//! the sticky Service's connections all reached one pod, the counters carried both ways, and each release's
//! agent applies an edit after its start.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use lb_testkit::{
    deployed::AgentBox,
    hold::{Hold, Round},
    manifests::{to_yaml, write_atomic},
};
use serde_json::{Value, json};

use super::lab::{LB_IP, Lab, NODE_1, POD_1, POD_2, TIERLB, sa};

const VIP: &str = "10.96.0.10";
const VIP_6: &str = "fd00:96::10";
const STICKY: &str = "10.96.0.11";

/// A ClusterIP Service `name` at `ip`:80 to both pods' 8080, with sessionAffinity ClientIP if `sticky`.
fn service(name: &str, ip: &str, sticky: bool) -> Vec<Value> {
    let mut svc = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    });
    if sticky {
        svc["spec"]["sessionAffinity"] = json!("ClientIP");
        svc["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 600}});
    }
    let eps: Vec<Value> = [(POD_1, "node-1"), (POD_2, "node-2")]
        .iter()
        .map(|(a, n)| json!({"addresses": [a], "nodeName": n, "conditions": {"ready": true}}))
        .collect();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-a"), "namespace": "default", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps,
    });
    vec![svc, slice]
}

/// The north-south counters `status -o json` of `tierlb` reports for the node's pins, by name.
fn ns_counters(lab: &Lab, tierlb: &Path) -> BTreeMap<String, u64> {
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let out = std::process::Command::new(tierlb)
        .args(["status", "-o", "json", "--bpffs", pins.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let counters = &st[0]["north_south"]["counters"];
    let pairs: Vec<(String, u64)> = match counters {
        Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect(),
        Value::Array(a) => {
            a.iter().filter_map(|p| Some((p[0].as_str()?.to_owned(), p[1].as_u64().unwrap_or(0)))).collect()
        }
        other => panic!("no north-south counters in status: {other}"),
    };
    pairs.into_iter().collect()
}

/// Every held socket answered by a pod with `peer` as its peer; no connection of the stream failed; the
/// sticky Service's connections went to one pod.
fn check(phase: &str, r: &Round, peers: &[(String, String)]) {
    for (a, (to, peer)) in r.held.iter().zip(peers) {
        assert_eq!((a.error.as_deref(), a.to.as_str()), (None, to.as_str()), "{phase}: {a:?}");
        assert!(a.pod.as_deref().is_some_and(|p| p.starts_with("web-node")), "{phase}: {a:?}");
        assert_eq!(a.peer.as_deref(), Some(peer.as_str()), "{phase}: the peer of {} {to}", a.kind);
    }
    assert_eq!(r.held.len(), peers.len(), "{phase}: {r:?}");
    assert!(r.failed().is_empty(), "{phase}: failed connections: {:?}", r.failed());
    if let Some(sticky) = r.connects.get(&format!("{STICKY}:80")) {
        assert_eq!(sticky.len(), 1, "{phase}: sessionAffinity kept one pod: {sticky:?}");
    }
}

/// Ask `hold` to connect to `to` until a pod answers (the agent applied the edit), for up to 10 s.
fn reaches(hold: &mut Hold, to: SocketAddr) -> bool {
    (0..100).any(|_| {
        let r = hold.round(Some(to)).unwrap();
        let ok = r.once.as_ref().is_some_and(|a| a.pod.is_some());
        if !ok {
            std::thread::sleep(Duration::from_millis(100));
        }
        ok
    })
}

/// The log written since byte `from`.
fn log_since(lab: &Lab, from: usize) -> String {
    std::fs::read_to_string(&lab.boxed.log).unwrap_or_default().get(from..).unwrap_or_default().to_owned()
}

/// The DaemonSet's roll on node-1: SIGTERM to `agent`, then the agent of `tierlb` as `deploy` runs it, on the
/// same pins; returns the new agent, the log of both (the old one's exit, the new one's start) and how long
/// the node had no agent running (SIGTERM to ready).
fn roll(lab: &mut Lab, agent: AgentBox, tierlb: &Path, deploy: &Path) -> (AgentBox, String, Duration) {
    let from = std::fs::metadata(&lab.boxed.log).map_or(0, |m| m.len() as usize);
    let t = Instant::now();
    assert!(agent.stop().is_some_and(|s| s.success()), "the agent exits cleanly on SIGTERM");
    lab.boxed.use_release(tierlb, deploy).unwrap();
    // The previous release knows no `--xdp` (`TIERLB_TEST_XDP` reaches this release's agents alone).
    let agent = if tierlb == Path::new(TIERLB) {
        lab.start_agent()
    } else {
        lab.boxed.start_agent("node-1", &[]).unwrap()
    };
    (agent, log_since(lab, from), t.elapsed())
}

/// Every counter of `after` at least what it was in `before` (the counts carried), where both name it.
fn carried(what: &str, before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) {
    // A counter the older release does not know (this one's XDP counters, after a rollback) is not compared.
    for (name, n) in before {
        let Some(&m) = after.get(name) else { continue };
        assert!(m >= *n, "{name}: {n} before, {m} after the {what}");
    }
}

/// The pod's clients and the outside client's, with the peer each held socket must show.
struct Load {
    pod: Hold,
    outside: Hold,
    pod_peers: Vec<(String, String)>,
    outside_peers: Vec<(String, String)>,
}

impl Load {
    fn start(lab: &Lab) -> Self {
        let (vip, vip_6, udp) = (sa(VIP, 80), sa(VIP_6, 80), sa(VIP, 53));
        let (cgroup, node) = (Some(&lab.boxed.cgroup), &lab.boxed.node.netns);
        let pod = Hold::start(
            cgroup,
            node,
            &[vip, vip_6],
            &[udp],
            &[vip, sa(STICKY, 80)],
            Duration::from_millis(5),
        );
        let (node_port, lb, udp_port) = (sa(NODE_1, 30080), sa(LB_IP, 80), sa(NODE_1, 30053));
        let every = Duration::from_millis(10);
        let outside = Hold::start(None, &lab.client, &[node_port, lb], &[udp_port], &[node_port], every);
        // A pod's sockets show the Service's address (the socket programs); the outside client's show the
        // address it sent to, and the UDP reply comes from it (the tc programs).
        let peers = |a: &[SocketAddr]| a.iter().map(|a| (a.to_string(), a.to_string())).collect();
        Self {
            pod: pod.unwrap(),
            outside: outside.unwrap(),
            pod_peers: peers(&[vip, vip_6, udp]),
            outside_peers: peers(&[node_port, lb, udp_port]),
        }
    }

    /// Let the streams run half a second, then check every client (see `check`).
    fn check(&mut self, phase: &str) {
        std::thread::sleep(Duration::from_millis(500));
        check(phase, &self.pod.round(None).unwrap(), &self.pod_peers);
        check(&format!("{phase}, outside"), &self.outside.round(None).unwrap(), &self.outside_peers);
    }
}

#[test]
fn upgrade_from_the_previous_release_and_rollback_under_load_fail_no_connection() {
    let (previous, previous_deploy) = lb_testkit::previous_release();
    let version = std::process::Command::new(&previous).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(version.contains("map layout 1"), "the previous release: {version}");
    let (this, deploy) = (Path::new(TIERLB), Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy"));

    let mut lab = Lab::new("upgrade", "Cluster", true);
    let manifests = lab.boxed.manifests.path().to_owned();
    write_atomic(&manifests, "sticky.yaml", &to_yaml(&service("sticky", STICKY, true))).unwrap();
    lab.boxed.use_release(&previous, &previous_deploy).unwrap();
    let agent = lab.boxed.start_agent("node-1", &[]).unwrap();
    let mut load = Load::start(&lab);
    load.check("previous release");
    let counted_before = ns_counters(&lab, &previous);

    // Up: SIGTERM, then this release's agent on the same pins.
    let (agent, up_log, up_gap) = roll(&mut lab, agent, this, &deploy);
    load.check("upgraded");
    let counted_up = ns_counters(&lab, this);
    carried("upgrade", &counted_before, &counted_up);
    write_atomic(&manifests, "added.yaml", &to_yaml(&service("added", "10.96.0.12", false))).unwrap();
    assert!(reaches(&mut load.pod, sa("10.96.0.12", 80)), "the upgraded agent applies an edit");

    // Down: SIGTERM (the agent leaves the previous layout's pin), then the previous release's agent.
    let (agent, down_log, down_gap) = roll(&mut lab, agent, &previous, &previous_deploy);
    load.check("rolled back");
    let counted_down = ns_counters(&lab, &previous);
    carried("rollback", &counted_up, &counted_down);
    write_atomic(&manifests, "added-2.yaml", &to_yaml(&service("added-2", "10.96.0.13", false))).unwrap();
    assert!(reaches(&mut load.pod, sa("10.96.0.13", 80)), "the rolled-back agent applies an edit");

    let (last, last_outside) = (load.pod.round(None).unwrap(), load.outside.round(None).unwrap());
    let total = |r: &Round| r.connects.values().flat_map(BTreeMap::values).sum::<usize>();
    eprintln!(
        "upgrade (no agent for {up_gap:?}) and rollback (no agent for {down_gap:?}): {} new connections from \
         the pod and {} from outside, none failed; held sockets answered throughout; counters \
         {counted_before:?} -> {counted_up:?} -> {counted_down:?}",
        total(&last),
        total(&last_outside)
    );
    assert!(total(&last) > 100 && total(&last_outside) > 50, "the streams ran: {last:?} {last_outside:?}");
    drop(load);
    // What the logs say of it, last (the behaviour above is the verdict).
    assert!(
        up_log.contains("migrated a pinned map in place") && up_log.contains("NS_COUNTERS"),
        "the upgrade migrated NS_COUNTERS: {up_log}"
    );
    assert!(down_log.contains("left the previous map layout's pin"), "{down_log}");

    // This release's --cleanup removes every generation's pins (the rollback left both NS_COUNTERS pins), in
    // the node's network namespace as deploy/uninstall runs it.
    assert!(agent.stop().is_some());
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let mut cleanup = std::process::Command::new(TIERLB);
    cleanup.args(["agent", "--cleanup", "--node", "node-1", "--bpffs", pins.to_str().unwrap()]);
    lb_testkit::sandbox::confine(&mut cleanup, None, Some(&lab.boxed.node.netns)).unwrap();
    assert!(cleanup.status().unwrap().success());
    let left = std::fs::read_dir(pins.join("node-1")).map(Iterator::count);
    assert!(!pins.join("node-1").exists(), "every pin removed: {left:?}");
}
