//! In-kernel tests of Services the data path cannot take: a Service that did not fit is programmed by the
//! agent's timer once room is freed (no further edit), `/healthz` and `/metrics` name it meanwhile; what a
//! client sees connecting to such a VIP; two Services on one VIP:port. Real sockets in a private netns.
mod common;

use std::time::{Duration, Instant};

use common::{OwnAgent, cluster, eventually, free_port, get};
use lb_testkit::{
    manifests::{Ep, Svc, write_service},
    sandbox::NetNs,
};

fn pod_eps(c: &mut lb_testkit::cluster::SimCluster, pods: &[(&str, &str)]) -> Vec<Ep> {
    pods.iter()
        .map(|(addr, name)| {
            let a: std::net::SocketAddr = addr.parse().unwrap();
            c.add_pod(a, name).unwrap();
            Ep::ready(a.ip(), "node-2")
        })
        .collect()
}

/// alpha (10.96.0.11) and beta (10.96.0.12), two endpoints each (one entry of the slot map): with
/// `--max-slots 1` alpha fits, beta does not.
fn alpha_fits_beta_does_not(c: &mut lb_testkit::cluster::SimCluster) {
    let eps = pod_eps(c, &[("10.244.2.10:8080", "pod-a"), ("10.244.3.10:8080", "pod-b")]);
    for (name, vip) in [("alpha", "10.96.0.11"), ("beta", "10.96.0.12")] {
        write_service(c.manifests.path(), &Svc::new(name, vip.parse().unwrap(), 80, 8080), &eps).unwrap();
    }
}

#[test]
fn a_service_that_did_not_fit_is_programmed_by_the_timer_once_room_is_freed_and_health_names_it_meanwhile() {
    let mut c = cluster("unprog");
    alpha_fits_beta_does_not(&mut c);
    let (hz, mp) = (free_port(), free_port());
    let (hz_s, mp_s) = (format!("127.0.0.1:{hz}"), format!("127.0.0.1:{mp}"));
    let agent = OwnAgent::start(&c, &["--max-slots", "1", "--healthz-addr", &hz_s, "--metrics-addr", &mp_s]);
    let beta: std::net::SocketAddr = "10.96.0.12:80".parse().unwrap();
    let probe = |n| agent.probe(&c, beta, n, Duration::from_secs(1));
    assert_eq!(probe(1).failures(), 1, "not translated yet");

    // Not programmed: the node stays healthy (kube-proxy's meaning), the body and the gauge name it.
    let (status, body) = get(hz, "/healthz");
    assert_eq!(status, 200, "{body}");
    let h: serde_json::Value = serde_json::from_str(&body).unwrap();
    let u = &h["unprogrammedServices"];
    assert_eq!(u.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(u[0]["service"], "default/beta");
    let reason = u[0]["reasons"][0].as_str().unwrap();
    assert!(reason.contains("map SLOTS is full (capacity 1)") && reason.contains("--max-slots"), "{reason}");
    assert!(u[0]["nextRetrySeconds"].as_f64().is_some_and(|s| s <= 30.0), "{body}");
    assert!(
        eventually(3, || get(mp, "/metrics").1.contains("\ntierlb_services_unprogrammed 1\n")),
        "{}",
        get(mp, "/metrics").1
    );

    // alpha leaves. Its slots are free only after the grace period, after the sync that removed it; no
    // other edit follows: the timer programs beta.
    let before = agent.syncs();
    std::fs::remove_file(c.manifests.path().join("alpha.yaml")).unwrap();
    assert!(eventually(3, || agent.syncs() > before), "the removal is synced");
    let removed_at = Instant::now();
    assert!(eventually(3, || probe(1).failures() == 0), "beta translated within 3 s of alpha's removal");
    eprintln!("beta programmed within {:?} of the removal's sync", removed_at.elapsed());
    let r = probe(20);
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    let log = agent.log();
    assert!(log.contains("retried Services that failed to apply") && log.contains("added=1"), "{log}");
    assert_eq!(agent.syncs(), before + 1, "no sync but the removal's: the timer programmed beta\n{log}");
    assert!(eventually(3, || get(hz, "/healthz").1.contains("\"unprogrammedServices\":[]")));
    assert!(eventually(3, || get(mp, "/metrics").1.contains("\ntierlb_services_unprogrammed 0\n")));
}

/// Where a connect to an untranslated VIP goes: the kernel routes the ClusterIP like any address. With no
/// route: ENETUNREACH at once; with a default route, the SYN leaves toward the gateway, and the client sees
/// what the network does with an address nobody owns: silence (a timeout) or an ICMP unreachable
/// (EHOSTUNREACH).
#[test]
fn a_connect_to_an_unprogrammed_vip_goes_out_untranslated_and_fails_as_the_network_decides() {
    // (gateway's route to the Service CIDR, what the client sees within its 1 s timeout)
    let cases =
        [(None, "ENETUNREACH"), (Some("blackhole"), "ETIMEDOUT"), (Some("unreachable"), "EHOSTUNREACH")];
    for (gateway_route, want) in cases {
        let mut c = cluster("untrans");
        alpha_fits_beta_does_not(&mut c);
        let _gw = gateway_route.map(|route| gateway(&c.netns, route));
        let agent =
            OwnAgent::start(&c, &["--max-slots", "1", "--healthz-addr", "off", "--metrics-addr", "off"]);
        let r = agent.probe(&c, "10.96.0.12:80".parse().unwrap(), 3, Duration::from_secs(1));
        assert_eq!(r.errors().get(want), Some(&3), "{gateway_route:?}: {:?}", r.errors());
        let programmed = agent.probe(&c, "10.96.0.11:80".parse().unwrap(), 3, Duration::from_secs(1));
        assert_eq!(programmed.failures(), 0, "the Service that fit works: {:?}", programmed.errors());
    }
}

/// A gateway for the cluster netns: a veth to a namespace of its own that forwards, with `route` (blackhole:
/// dropped silently; unreachable: answered with ICMP host unreachable) for 10.96.0.0/12, and the cluster
/// netns's default route through it.
fn gateway(cluster: &NetNs, route: &str) -> NetNs {
    let gw = NetNs::new("gw").unwrap();
    cluster
        .ip(&["link", "add", "tlb-c", "type", "veth", "peer", "name", "tlb-g", "netns", gw.name()])
        .unwrap();
    cluster.ip(&["addr", "add", "192.0.2.1/30", "dev", "tlb-c"]).unwrap();
    cluster.ip(&["link", "set", "tlb-c", "up"]).unwrap();
    cluster.ip(&["route", "add", "default", "via", "192.0.2.2"]).unwrap();
    gw.ip(&["addr", "add", "192.0.2.2/30", "dev", "tlb-g"]).unwrap();
    gw.ip(&["link", "set", "tlb-g", "up"]).unwrap();
    gw.ip(&["route", "add", route, "10.96.0.0/12"]).unwrap();
    let out = std::process::Command::new("ip")
        // Forward, and answer every packet with ICMP (routers rate-limit it: a client then sees a mix of
        // EHOSTUNREACH and timeouts).
        .args([
            "netns",
            "exec",
            gw.name(),
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.icmp_ratelimit=0",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    gw
}

#[test]
fn two_services_on_one_vip_the_first_by_name_is_served_and_the_other_takes_over_when_it_leaves() {
    let mut c = cluster("dupvip");
    let vip: std::net::SocketAddr = "10.96.0.10:80".parse().unwrap();
    let a = pod_eps(&mut c, &[("10.244.2.10:8080", "pod-of-a")]);
    let b = pod_eps(&mut c, &[("10.244.3.10:8080", "pod-of-b")]);
    // b is written first: arrival order does not decide.
    write_service(c.manifests.path(), &Svc::new("b", vip.ip(), 80, 8080), &b).unwrap();
    write_service(c.manifests.path(), &Svc::new("a", vip.ip(), 80, 8080), &a).unwrap();
    c.add_node("node-1", &[]).unwrap();
    let r = c.probe("node-1", vip, 10, Duration::ZERO).unwrap();
    assert_eq!(r.count("pod-of-a"), 10, "{:?}", r.by_backend());
    let log = std::fs::read_to_string(&c.node("node-1").log).unwrap();
    assert!(
        log.contains("Services default/a and default/b claim one VIP:port: default/a is programmed"),
        "{log}"
    );

    let before = c.syncs_all();
    std::fs::remove_file(c.manifests.path().join("a.yaml")).unwrap();
    c.wait_synced(&before).unwrap();
    let r = c.probe("node-1", vip, 10, Duration::ZERO).unwrap();
    assert_eq!(r.count("pod-of-b"), 10, "{:?}", r.by_backend());
}
