//! In-kernel tests of manual backend marks (`tierlb backend down ADDR --for DURATION`): connects move away
//! while a mark lasts and come back when it expires, decided by the data path even with no agent running;
//! the agent clears the mark of a backend that left every Service, so a pod reusing the IP starts unmarked;
//! the CLI refuses marks that would mean nothing; an old pinned map without expiry is refused by name.
mod common;

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use common::{TIERLB, cluster, eventually, tierlb};
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    sandbox::BpfFs,
};

fn vip() -> SocketAddr {
    "10.96.0.10:80".parse().unwrap()
}

/// web on the VIP, PreferSameNode, with a pod on each of `nodes` (10.244.<i+1>.10, named pod-<node>), all in
/// zone a; returns the Service and its endpoints.
fn web(c: &mut SimCluster, nodes: &[&str]) -> (Svc, Vec<Ep>) {
    let eps = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let a = SocketAddr::new(format!("10.244.{}.10", i + 1).parse().unwrap(), 8080);
            c.add_pod(a, &format!("pod-{node}")).unwrap();
            Ep::ready(a.ip(), node).zone("a").prefer_same_node()
        })
        .collect();
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
    (svc, eps)
}

fn status(pin: &str) -> serde_json::Value {
    let (ok, out, err) = tierlb(&["status", "-o", "json", "--bpffs", pin]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn backends(r: &lb_testkit::probe::Report) -> Vec<String> {
    r.by_backend().into_keys().collect()
}

#[test]
fn a_mark_for_2s_moves_connects_away_and_they_come_back_when_it_expires_even_with_no_agent_running() {
    let mut c = cluster("mark-expiry");
    let bpffs = BpfFs::new("mark-expiry").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let (svc, eps) = web(&mut c, &["node-1", "node-2"]);
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin]).unwrap();
    let probe = |c: &SimCluster| backends(&c.probe("node-1", vip(), 10, Duration::ZERO).unwrap());
    assert_eq!(probe(&c), ["pod-node-1"]);

    // Marks that would mean nothing are refused, each with what to do instead.
    for (args, says) in [
        (&["--for", "0s"][..], "a mark must last some time"),
        (&["--for", "48h"][..], "longer than the longest mark (24h)"),
        (&["--for", "10"][..], "is not a duration"),
    ] {
        let mut argv = vec!["backend", "down", "10.244.1.10:8080", "--bpffs", &pin];
        argv.extend_from_slice(args);
        let (ok, _, err) = tierlb(&argv);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
    let (ok, _, err) = tierlb(&["backend", "down", "10.244.9.9:8080", "--bpffs", &pin]);
    assert!(!ok && err.contains("is in no Service of any agent"), "{err}");
    let (ok, _, err) = tierlb(&["backend", "up", "10.244.1.10:8080", "--for", "1m", "--bpffs", &pin]);
    assert!(!ok && err.contains("--for applies to `backend down` only"), "{err}");

    let (ok, out, err) = tierlb(&["backend", "down", "10.244.1.10:8080", "--for", "2s", "--bpffs", &pin]);
    let marked_at = Instant::now();
    assert!(ok, "{err}");
    assert!(out.contains("node-1: backend 10.244.1.10:8080 TCP marked down for 2.0s"), "{out}");
    let st = status(&pin);
    let mark = &st[0]["marks"][0];
    assert_eq!(
        (mark["backend"].as_str(), mark["protocol"].as_str()),
        (Some("10.244.1.10:8080"), Some("TCP"))
    );
    let (age, left) = (mark["age_seconds"].as_f64().unwrap(), mark["left_seconds"].as_f64().unwrap());
    assert!(age < 1.0 && left > 1.0 && left <= 2.0, "{mark}");
    let (_, table, _) = tierlb(&["status", "--bpffs", &pin]);
    assert!(table.contains("10.244.1.10:8080 TCP marked down") && table.contains("left"), "{table}");

    // The agent stops (its programs stay attached through their pins): the mark holds, then ends on time.
    c.stop_agent("node-1");
    assert_eq!(probe(&c), ["pod-node-2"], "moved to the zone tier while marked");
    std::thread::sleep((marked_at + Duration::from_millis(2100)).saturating_duration_since(Instant::now()));
    assert_eq!(probe(&c), ["pod-node-1"], "back on the node tier once the mark expired, no agent running");
    assert_eq!(status(&pin)[0]["backends_marked_down"], serde_json::json!([]));
}

#[test]
fn a_mark_is_cleared_when_its_address_leaves_the_service_and_a_pod_reusing_it_starts_unmarked() {
    let mut c = cluster("mark-sweep");
    let bpffs = BpfFs::new("mark-sweep").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let (svc, eps) = web(&mut c, &["node-1", "node-2", "node-3"]);
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin]).unwrap();
    let (ok, _, err) = tierlb(&["backend", "down", "10.244.2.10:8080", "--bpffs", &pin]);
    assert!(ok, "{err}");
    let marked = status(&pin)[0]["marks"].clone();
    assert_eq!(marked[0]["backend"], "10.244.2.10:8080");
    let left = marked[0]["left_seconds"].as_f64().unwrap();
    assert!(left > 590.0 && left <= 600.0, "the default mark is 10 minutes: {marked}");

    // The pod leaves the Service: its mark goes at the agent's next sweep.
    write_service(c.manifests.path(), &svc, &[eps[0].clone(), eps[2].clone()]).unwrap();
    assert!(eventually(3, || status(&pin)[0]["marks"] == serde_json::json!([])), "{}", status(&pin));
    let log = std::fs::read_to_string(&c.node("node-1").log).unwrap();
    assert!(log.contains("cleared the mark of a backend that left every Service"), "{log}");

    // A new pod with the same IP joins: it is used (node-1's pod marked down, node-2's takes the zone tier).
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    assert!(eventually(3, || {
        let st = status(&pin);
        st[0]["frontends"][0]["tiers"][1].as_array().is_some_and(|t| t.len() == 3)
    }));
    let (ok, _, err) = tierlb(&["backend", "down", "10.244.1.10:8080", "--for", "1m", "--bpffs", &pin]);
    assert!(ok, "{err}");
    let r = c.probe("node-1", vip(), 20, Duration::ZERO).unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    assert!(r.count("pod-node-2") > 0, "the reused IP is not marked: {:?}", r.by_backend());
}

#[test]
fn a_pinned_backend_state_map_without_expiry_is_refused_by_name() {
    let c = cluster("mark-old");
    let bpffs = BpfFs::new("mark-old").unwrap();
    let dir = bpffs.path().join("tierlb").join("node-1");
    std::fs::create_dir_all(&dir).unwrap();
    // What an older agent left: its frontends (this layout) and its marks (4-byte values, no expiry).
    let old = dir.join(lb_common::MAP_BACKEND_STATE);
    let frontend_value = size_of::<lb_common::FrontendValue>().to_string();
    for (name, value, entries) in [
        (lb_common::MAP_FRONTENDS, frontend_value.as_str(), "65536"),
        (lb_common::MAP_BACKEND_STATE, "4", "262144"),
    ] {
        let out = std::process::Command::new("bpftool")
            .args(["map", "create"])
            .arg(dir.join(name))
            .args(["type", "hash", "key", "20", "value", value, "entries", entries, "name", name])
            .output()
            .unwrap();
        assert!(out.status.success(), "bpftool: {}", String::from_utf8_lossy(&out.stderr));
    }
    let base = bpffs.path().join("tierlb");
    // A cgroup of the test's own: the agent stops before attaching anything.
    let cg = lb_testkit::sandbox::Cgroup::new("mark-old").unwrap();
    let out = std::process::Command::new(TIERLB)
        .args(["agent", "--node", "node-1", "--manifests"])
        .arg(c.manifests.path())
        .arg("--cgroup")
        .arg(cg.path())
        .arg("--bpffs")
        .arg(&base)
        .args(["--healthz-addr", "off", "--metrics-addr", "off", "--service-health-bind", "off"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("pinned map {} holds backend marks of an older tierlb", old.display()))
            && err.contains("tierlb agent --cleanup"),
        "{err}"
    );
    let (ok, _, err) = tierlb(&["status", "--bpffs", base.to_str().unwrap()]);
    assert!(!ok && err.contains("without an expiry"), "{err}");
}
