//! The demo: three simulated nodes, a PreferSameNode Service with one pod per node, clients on every node.
//! Node-2's pod is then taken down the way Kubernetes does it (the EndpointSlice marks it terminating, then
//! the process exits) while the clients keep connecting: node-2's clients move to the other nodes' pods with
//! no failed connect.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use super::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    probe::Report,
};

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

fn pod_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, i as u8 + 1, 10))
}

fn row(node: &str, r: &Report) -> String {
    let reached: Vec<String> = r.by_backend().iter().map(|(b, n)| format!("{b}={n}")).collect();
    let errors: Vec<String> = r.errors().iter().map(|(e, n)| format!("{e}={n}")).collect();
    format!(
        "  {node:<7} {:>5} connects  reached: {:<44} failed: {}",
        r.attempts.len(),
        reached.join(" "),
        if errors.is_empty() { "0".to_owned() } else { errors.join(" ") }
    )
}

pub fn run(tierlb: &Path, lab: &Path) -> anyhow::Result<bool> {
    let started = Instant::now();
    println!("== tierlb demo: PreferSameNode on three simulated nodes (private netns, one agent per node)");
    let mut c = SimCluster::new("demo", tierlb, lab)?;
    let vip = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 20)), 80);
    let mut svc = Svc::new("cache", vip.ip(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
    let mut eps: Vec<Ep> =
        NODES.iter().enumerate().map(|(i, n)| Ep::ready(pod_ip(i), n).prefer_same_node()).collect();
    for (i, n) in NODES.iter().enumerate() {
        c.add_pod(SocketAddr::new(pod_ip(i), 8080), &format!("pod-on-{n}"))?;
    }
    write_service(c.manifests.path(), &svc, &eps)?;
    for n in NODES {
        c.add_node(n, &[])?;
    }
    println!(
        "   Service default/cache {vip}, trafficDistribution: PreferSameNode; pods 10.244.{{1,2,3}}.10:8080"
    );
    println!("   ({:.1} s to start three agents)\n", started.elapsed().as_secs_f64());

    println!("-- 1. steady state: every node's clients reach their own node's pod");
    let mut ok = true;
    for n in NODES {
        let r = c.probe(n, vip, 50, Duration::from_millis(2))?;
        println!("{}", row(n, &r));
        ok &= r.failures() == 0 && r.count(&format!("pod-on-{n}")) == r.attempts.len();
    }

    println!("\n-- 2. node-2's pod goes away while clients on every node keep connecting (every 10 ms)");
    let runs: Vec<_> = NODES
        .iter()
        .map(|n| c.start_probe(n, vip, 150, Duration::from_millis(10)))
        .collect::<Result<_, _>>()?;
    std::thread::sleep(Duration::from_millis(400));
    // What the control plane does when the pod is deleted: the endpoint turns terminating (not ready), the
    // controller leaves its old hints alone, and kube-proxy (here: tierlb) stops sending new traffic to it.
    let before = c.syncs_all();
    let t_update = Instant::now();
    eps[1] = eps[1].clone().terminating();
    write_service(c.manifests.path(), &svc, &eps)?;
    let synced = c.wait_synced(&before)?;
    println!(
        "   t=0.4 s  EndpointSlice: node-2's endpoint ready=false terminating=true; all agents re-planned in {:.1} ms",
        synced.as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_millis(200).saturating_sub(t_update.elapsed()));
    c.stop_pod(SocketAddr::new(pod_ip(1), 8080));
    println!("   t=0.6 s  node-2's pod process exits");
    let reports: Vec<Report> =
        runs.into_iter().map(super::cluster::ProbeRun::wait).collect::<Result<_, _>>()?;
    for (n, r) in NODES.iter().zip(&reports) {
        println!("{}", row(n, r));
        ok &= r.failures() == 0;
    }
    let node2 = &reports[1];
    let switched = node2.attempts.iter().position(|a| a.backend.as_deref() != Some("pod-on-node-2"));
    if let Some(i) = switched {
        let t = node2.attempts[i].t_ms;
        let after: Vec<&str> = node2.attempts[i..].iter().filter_map(|a| a.backend.as_deref()).collect();
        let own = after.iter().filter(|b| **b == "pod-on-node-2").count();
        println!(
            "   node-2: until t={:.0} ms its own pod; from then on {} connects went to node-1/node-3 ({} node-1, {} node-3), {own} to its own pod",
            t,
            after.len() - own,
            after.iter().filter(|b| **b == "pod-on-node-1").count(),
            after.iter().filter(|b| **b == "pod-on-node-3").count(),
        );
        ok &= own == 0;
    } else {
        ok = false;
    }
    println!(
        "\n-- 3. DNS through a Service VIP (UDP): kube-dns with resolvers on node-1 and node-3, PreferSameNode"
    );
    let dns_vip = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)), 53);
    let mut dns = Svc::new("kube-dns", dns_vip.ip(), 53, 53);
    dns.protocol = "UDP";
    dns.traffic_distribution = Some("PreferSameNode".into());
    let mut dns_eps = Vec::new();
    for (i, node) in [(0usize, "node-1"), (2, "node-3")] {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 244, i as u8 + 1, 53));
        c.add_dns_pod(SocketAddr::new(ip, 53), IpAddr::V4(Ipv4Addr::new(10, 0, i as u8 + 1, 1)))?;
        dns_eps.push(Ep::ready(ip, node).prefer_same_node());
    }
    let before = c.syncs_all();
    write_service(c.manifests.path(), &dns, &dns_eps)?;
    c.wait_synced(&before)?;
    for n in NODES {
        let lookups = c.dns(n, dns_vip, 10, false)?;
        let answers: std::collections::BTreeSet<String> =
            lookups.iter().filter_map(|l| l.answer.clone()).collect();
        let sources: std::collections::BTreeSet<String> =
            lookups.iter().filter_map(|l| l.reply_from.clone()).collect();
        let failed = lookups.iter().filter(|l| l.error.is_some()).count();
        // Each resolver answers with 10.0.<its node number>.1, so the answer says which one replied.
        let by: Vec<String> = answers
            .iter()
            .map(|a| format!("node-{}", a.split('.').nth(2).unwrap_or("?")))
            .map(|r| if r == n { format!("{r} (local)") } else { r })
            .collect();
        println!(
            "  {n:<7} cache.booking.svc.cluster.local -> {} from the resolver on {}; reply source {}; failed {failed}",
            answers.iter().cloned().collect::<Vec<_>>().join(","),
            by.join(" and "),
            sources.iter().cloned().collect::<Vec<_>>().join(",")
        );
        ok &= failed == 0 && sources.len() == 1 && sources.contains(&dns_vip.to_string());
    }

    let total_failed: usize = reports.iter().map(Report::failures).sum();
    println!(
        "\n{} {} failed connects of {} during the roll; demo took {:.1} s",
        if ok { "PASS" } else { "FAIL" },
        total_failed,
        reports.iter().map(|r| r.attempts.len()).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    drop(c);
    Ok(ok)
}
