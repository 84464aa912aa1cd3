//! UDP (DNS) and IPv6 through Service VIPs, in the kernel: sendmsg/recvmsg translation with the VIP as the
//! reply's source, connected UDP and TCP getpeername, IPv6 with ULA addresses, fast failure with no backend.
use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
};

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

fn cluster(tag: &str) -> SimCluster {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
    SimCluster::new(tag, Path::new(TIERLB), &lb_testkit::workspace_bin("tierlb-lab", "lb-lab"))
        .expect("sandbox")
}

/// A connected UDP socket whose backend leaves the Service is destroyed by the agent (the application sees
/// ECONNABORTED or EDESTADDRREQ) within 100 ms of the change, and a new socket reaches the remaining resolver; no query waits
/// for a timeout.
#[test]
fn a_connected_udp_socket_to_a_removed_backend_is_destroyed_and_a_new_one_reaches_a_live_backend() {
    let (c, vip) =
        dns_cluster("destroy", "10.96.0.53", ["10.244.1.53", "10.244.2.53"], ["10.0.1.1", "10.0.2.2"]);
    let mut cmd = c.client_command("node-1", &lb_testkit::workspace_bin("tierlb-lab", "lb-lab")).unwrap();
    // 1.5 s: the edit comes at 0.4 s, the agent's sync and the socket's end well before the stream's end
    // (both longer under emulation: `patience`).
    let duration_ms = (1_500 * lb_testkit::patience()).to_string();
    cmd.args([
        "dns-stream",
        "--server",
        &vip.to_string(),
        "--duration-ms",
        &duration_ms,
        "--interval-ms",
        "5",
    ])
    .stdout(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    // The client's socket is connected before the edit (under emulation its start alone can take longer).
    std::thread::sleep(Duration::from_millis(400) * lb_testkit::patience());
    // node-1's resolver is being deleted: the EndpointSlice marks it terminating; its process exits shortly.
    let mut svc = Svc::new("kube-dns", vip.ip(), 53, 53);
    svc.protocol = "UDP";
    svc.traffic_distribution = Some("PreferSameNode".into());
    let eps = vec![
        Ep::ready("10.244.1.53".parse().unwrap(), "node-1").prefer_same_node().terminating(),
        Ep::ready("10.244.2.53".parse().unwrap(), "node-2").prefer_same_node(),
    ];
    let before = c.syncs_all();
    let t_edit = lb_testkit::dns::epoch_ms();
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    c.wait_synced(&before).unwrap();
    let out = child.wait_with_output().unwrap();
    let steps: Vec<lb_testkit::dns::StreamStep> = serde_json::from_slice(&out.stdout).unwrap();
    let first_err = steps.iter().position(|s| s.error.is_some()).expect("the socket was ended");
    let err = &steps[first_err];
    // A socket blocked in recv() gets ECONNABORTED; one between calls is left disconnected, so its next send()
    // gets EDESTADDRREQ. Either way the application learns at once.
    assert!(matches!(err.error.as_deref(), Some("ECONNABORTED" | "EDESTADDRREQ")), "{err:?}");
    let after_edit = err.at_ms - t_edit;
    eprintln!("socket ended {after_edit:.1} ms after the EndpointSlice edit");
    // In order: ended after the edit, and while the stream still ran (steps after it, on a new socket).
    assert!(after_edit >= 0.0, "ended before the edit?");
    assert!(first_err + 1 < steps.len(), "ended before the stream's end: {steps:?}");
    assert!(
        steps[..first_err].iter().all(|s| s.answer.as_deref() == Some("10.0.1.1")),
        "local resolver before"
    );
    let rest = &steps[first_err + 1..];
    assert!(rest.len() > 20, "kept querying");
    assert!(rest[0].new_socket);
    assert!(
        rest.iter().all(|s| s.answer.as_deref() == Some("10.0.2.2")),
        "then the remaining one: {:?}",
        &rest[..3]
    );
    assert_eq!(steps.iter().filter(|s| s.error.is_some()).count(), 1, "one error, no timeouts");
}

/// A DNS Service with one resolver pod on node-1 and one on node-2, PreferSameNode, in one family.
fn dns_cluster(tag: &str, vip: &str, pods: [&str; 2], answers: [&str; 2]) -> (SimCluster, SocketAddr) {
    let mut c = cluster(tag);
    let vip: SocketAddr = SocketAddr::new(vip.parse().unwrap(), 53);
    let mut eps = Vec::new();
    for (i, node) in ["node-1", "node-2"].iter().enumerate() {
        let ip: IpAddr = pods[i].parse().unwrap();
        c.add_dns_pod(SocketAddr::new(ip, 53), answers[i].parse().unwrap()).unwrap();
        eps.push(Ep::ready(ip, node).prefer_same_node());
    }
    let mut svc = Svc::new("kube-dns", vip.ip(), 53, 53);
    svc.protocol = "UDP";
    svc.traffic_distribution = Some("PreferSameNode".into());
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    c.add_node("node-1", &[]).unwrap();
    (c, vip)
}

#[test]
fn dns_through_a_vip_answers_from_the_local_resolver_with_the_vip_as_source() {
    for (family, vip, pods, answers) in [
        ("IPv4", "10.96.0.53", ["10.244.1.53", "10.244.2.53"], ["10.0.1.1", "10.0.2.2"]),
        ("IPv6", "fd00:96::53", ["fd00:244:1::53", "fd00:244:2::53"], ["fd00:1::1", "fd00:2::2"]),
    ] {
        let (c, vip) = dns_cluster("dns", vip, pods, answers);
        for connected in [false, true] {
            let lookups = c.dns("node-1", vip, 20, connected).unwrap();
            for l in &lookups {
                assert_eq!(l.error, None, "{family} connected={connected}: {l:?}");
                assert_eq!(
                    l.answer.as_deref(),
                    Some(answers[0]),
                    "{family}: the node-local resolver answers"
                );
                assert_eq!(
                    l.reply_from,
                    Some(vip.to_string()),
                    "{family} connected={connected}: reply source"
                );
                if connected {
                    assert_eq!(l.peer, Some(vip.to_string()), "{family}: getpeername shows the VIP");
                }
            }
        }
    }
}

#[test]
fn tcp_getpeername_returns_the_vip() {
    let mut c = cluster("peer");
    for (vip, pod) in [("10.96.0.10", "10.244.1.10"), ("fd00:96::10", "fd00:244:1::10")] {
        let pod = SocketAddr::new(pod.parse().unwrap(), 8080);
        c.add_pod(pod, "pod-node-1").unwrap();
        let name = if pod.is_ipv4() { "web4" } else { "web6" };
        write_service(
            c.manifests.path(),
            &Svc::new(name, vip.parse().unwrap(), 80, 8080),
            &[Ep::ready(pod.ip(), "node-1")],
        )
        .unwrap();
    }
    c.add_node("node-1", &[]).unwrap();
    for vip in ["10.96.0.10:80", "[fd00:96::10]:80"] {
        let vip: SocketAddr = vip.parse().unwrap();
        let r = c.probe("node-1", vip, 10, Duration::ZERO).unwrap();
        assert_eq!(r.failures(), 0, "{vip}: {:?}", r.errors());
        assert!(r.attempts.iter().all(|a| a.peer == Some(vip.to_string())), "{vip}: {:?}", r.attempts[0]);
    }
}

#[test]
fn sendmsg_and_connect_with_no_backend_fail_fast_with_econnrefused() {
    let mut c = cluster("udpempty");
    let mut svc = Svc::new("kube-dns", "10.96.0.53".parse().unwrap(), 53, 53);
    svc.protocol = "UDP";
    write_service(c.manifests.path(), &svc, &[]).unwrap();
    c.add_node("node-1", &[]).unwrap();
    for connected in [false, true] {
        let lookups = c.dns("node-1", "10.96.0.53:53".parse().unwrap(), 5, connected).unwrap();
        for l in &lookups {
            // The errno is the proof it failed at once: a lookup with no answer ends in its timeout.
            assert_eq!(l.error.as_deref(), Some("ECONNREFUSED"), "connected={connected}: {l:?}");
        }
    }
}
