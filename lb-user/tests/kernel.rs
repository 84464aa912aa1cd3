//! In-kernel tests: real BPF programs, real sockets, inside a private network namespace and child cgroups
//! made by each test and removed by RAII guards (also on panic). Needs root.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::{BpfFs, confine},
};
use tierlb::datapath::addr;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// The lab's client binary (probe, DNS), built by lb-lab.
fn lab() -> std::path::PathBuf {
    lb_testkit::workspace_bin("tierlb-lab", "lb-lab")
}

fn require_root() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
}

fn ip(a: u8, b: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, a, b))
}

fn vip() -> SocketAddr {
    "10.96.0.10:80".parse().unwrap()
}

fn cluster(tag: &str) -> SimCluster {
    require_root();
    SimCluster::new(tag, Path::new(TIERLB), &lab()).expect("sandbox")
}

/// Pods named after their node, one per (node, zone) given; returns their endpoints with PreferSameNode hints.
fn pods(c: &mut SimCluster, nodes: &[(&str, &str)]) -> Vec<Ep> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, (node, zone))| {
            let a = ip(i as u8 + 1, 10);
            c.add_pod(SocketAddr::new(a, 8080), &format!("pod-{node}")).unwrap();
            Ep::ready(a, node).zone(zone).prefer_same_node()
        })
        .collect()
}

fn names(r: &Report) -> BTreeSet<String> {
    r.by_backend().into_keys().collect()
}

/// (a), (b), (c): the tier the client's node uses, from real connects through the agent binary.
#[test]
fn vip_reaches_the_first_tier_with_a_backend_node_then_zone_then_cluster() {
    struct Case {
        name: &'static str,
        /// The client node and its zone (via --zone).
        client: (&'static str, &'static str),
        /// Pods: (node, zone).
        pods: &'static [(&'static str, &'static str)],
        want: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "node-local backend exists: node tier",
            client: ("node-1", "a"),
            pods: &[("node-1", "a"), ("node-2", "a"), ("node-3", "b")],
            want: &["pod-node-1"],
        },
        Case {
            name: "no local backend: same-zone tier",
            client: ("node-1", "a"),
            pods: &[("node-2", "a"), ("node-3", "b")],
            want: &["pod-node-2"],
        },
        Case {
            name: "no local and no same-zone backend: cluster tier",
            client: ("node-1", "c"),
            pods: &[("node-2", "a"), ("node-3", "b")],
            want: &["pod-node-2", "pod-node-3"],
        },
    ];
    for case in cases {
        let mut c = cluster("tiers");
        let eps = pods(&mut c, case.pods);
        let mut svc = Svc::new("web", vip().ip(), 80, 8080);
        svc.traffic_distribution = Some("PreferSameNode".into());
        write_service(c.manifests.path(), &svc, &eps).unwrap();
        c.add_node(case.client.0, &["--zone", case.client.1]).unwrap();
        let r = c.probe(case.client.0, vip(), 200, Duration::ZERO).unwrap();
        assert_eq!(r.failures(), 0, "{}: {:?}", case.name, r.errors());
        let want: BTreeSet<String> = case.want.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(names(&r), want, "{}", case.name);
    }
}

#[test]
fn random_choice_spreads_over_the_tier() {
    let mut c = cluster("spread");
    let eps = pods(&mut c, &[("node-2", "a"), ("node-3", "a"), ("node-4", "a")]);
    write_service(c.manifests.path(), &Svc::new("web", vip().ip(), 80, 8080), &eps).unwrap();
    c.add_node("node-1", &[]).unwrap();
    let r = c.probe("node-1", vip(), 1000, Duration::ZERO).unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    let counts = r.by_backend();
    assert_eq!(counts.len(), 3, "{counts:?}");
    for (b, n) in &counts {
        // Expected 333 each; 250..420 is more than 5 standard deviations (sd ~ 15) either way.
        assert!((250..=420).contains(n), "{b} got {n} of 1000: {counts:?}");
    }
}

/// The connection counters of the only frontend of `node`'s pinned maps: (node, zone, cluster) tiers.
fn tier_counts(pins: &Path, node: &str) -> (u64, u64, u64) {
    let maps = tierlb::datapath::ebpf::KernelMaps::open_pinned(&pins.join(node)).unwrap();
    let st = tierlb::status::Instance::read(node, &maps, tierlb::datapath::marks::boottime_ns()).unwrap();
    let c = &st.frontends[0].connections;
    (c.node, c.zone, c.cluster)
}

/// Poll until `done` says yes (every 2 ms, for at most 20 s).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// (d): one write to the backend-state map moves new connects to the next tier at once, none fails. The
/// marks follow the client's progress as the data path counts it (no sleeps): node-1's pod is marked once
/// the node tier has served 20 connects, node-2's once the zone tier has; the client's answers must then be
/// node-1's, then node-2's, then node-3's, in that order, as many of each as the data path counted.
#[test]
fn a_backend_marked_down_is_skipped_and_traffic_moves_to_the_next_tier_without_a_failed_connect() {
    let mut c = cluster("down");
    let bpffs = BpfFs::new("down").unwrap();
    let eps = pods(&mut c, &[("node-1", "a"), ("node-2", "a"), ("node-3", "b")]);
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin]).unwrap();

    let backend = |state: &str, b: &str| {
        let out =
            std::process::Command::new(TIERLB).args(["backend", state, b, "--bpffs", &pin]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let total = 600;
    let run = c.start_probe("node-1", vip(), total, Duration::from_millis(2)).unwrap();
    wait_until("20 node-tier connects", || tier_counts(bpffs.path(), "node-1").0 >= 20);
    backend("down", "10.244.1.10:8080");
    wait_until("20 zone-tier connects", || tier_counts(bpffs.path(), "node-1").1 >= 20);
    backend("down", "10.244.2.10:8080");
    let r = run.wait().unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    // The order of answers: node tier, then zone tier (node-2), then cluster (node-3 only live one).
    let seq: Vec<&str> = r.attempts.iter().filter_map(|a| a.backend.as_deref()).collect();
    let first_zone = seq.iter().position(|b| *b != "pod-node-1").expect("moved off node-1");
    assert!(seq[..first_zone].iter().all(|b| *b == "pod-node-1"));
    let first_cluster = seq.iter().position(|b| *b == "pod-node-3").expect("moved to the cluster tier");
    assert!(seq[first_zone..first_cluster].iter().all(|b| *b == "pod-node-2"), "zone tier first: {seq:?}");
    assert!(seq[first_cluster..].iter().all(|b| *b == "pod-node-3"), "then only the live one: {seq:?}");
    // Every connect counted once, in the tier whose pod answered it.
    let answered =
        (first_zone as u64, (first_cluster - first_zone) as u64, (seq.len() - first_cluster) as u64);
    assert_eq!(tier_counts(bpffs.path(), "node-1"), answered, "(node, zone, cluster) counters vs answers");
    assert!(answered.0 >= 20 && answered.1 >= 20 && answered.2 > 0, "{answered:?}");
    // And back up: the node tier is used again.
    backend("up", "10.244.1.10:8080");
    let r = c.probe("node-1", vip(), 50, Duration::ZERO).unwrap();
    assert_eq!(names(&r), BTreeSet::from(["pod-node-1".to_owned()]));
    // `tierlb status` shows it: marked-down backends, the active tier, per-tier counters.
    let out =
        std::process::Command::new(TIERLB).args(["status", "-o", "json", "--bpffs", &pin]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let inst = &st[0];
    assert_eq!(inst["instance"], "node-1");
    assert_eq!(inst["backends_marked_down"], serde_json::json!(["10.244.2.10:8080"]));
    let f = &inst["frontends"][0];
    assert_eq!(
        (f["service"].as_str(), f["port_name"].as_str(), f["active_tier"].as_str()),
        (Some("default/web"), Some("main"), Some("node"))
    );
    let n = |k: &str| f["connections"][k].as_u64().unwrap();
    assert_eq!(
        (n("node"), n("zone"), n("cluster")),
        (answered.0 + 50, answered.1, answered.2),
        "status counts what the clients saw: {f}"
    );
    let table = std::process::Command::new(TIERLB).args(["status", "--bpffs", &pin]).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("default/web:main") && table.contains("10.244.2.10:8080*"), "{table}");
    // The agent wrote its node into the maps: status names it, and `tierlb study --clients-from` places the
    // counted connects there (every one of them node-1's clients').
    assert_eq!(inst["node"], "node-1");
    assert!(table.starts_with("instance node-1 (node node-1): 1 frontends"), "{table}");
    let total = n("node") + n("zone") + n("cluster") + n("rejected") + n("dropped") + n("fail_open");
    let manifests = c.manifests.path().to_str().unwrap().to_owned();
    let out = std::process::Command::new(TIERLB)
        .args(["study", "--manifests", &manifests, "--clients-from", &pin, "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let study: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let web = &study["services"][0];
    assert_eq!(web["service"], "default/web");
    assert_eq!(web["client_shares"]["node-1"], 1.0, "{}", web["client_shares"]);
    let source = web["clients"].as_str().unwrap();
    assert!(source.starts_with(&format!("counted: {total} connects (node-1 {total})")), "{source}");
    // The study's status fixtures (tests/study/fixtures) are written as this real output is: the same fields.
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/study/fixtures");
    for name in ["status-node-1.json", "status-node-2-3.json"] {
        let fx: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap();
        for i in fx.as_array().unwrap() {
            assert_eq!(keys(i), keys(inst), "{name}: an instance's fields");
            for fe in i["frontends"].as_array().unwrap() {
                assert_eq!(keys(fe), keys(f), "{name}: a frontend's fields");
                assert_eq!(keys(&fe["connections"]), keys(&f["connections"]), "{name}: the counters");
            }
        }
    }
}

/// (e): connect fails at once with the documented errno, never a timeout.
#[test]
fn no_usable_endpoint_fails_the_connect_at_once_with_the_documented_errno() {
    struct Case {
        name: &'static str,
        itp: Option<&'static str>,
        /// Pods exist on these nodes (none on node-1, the client).
        pods: &'static [(&'static str, &'static str)],
        errno: &'static str,
    }
    let cases = [
        Case { name: "no endpoints at all (kube-proxy REJECT)", itp: None, pods: &[], errno: "ECONNREFUSED" },
        Case {
            name: "Local policy, endpoints only elsewhere (kube-proxy DROP: would hang)",
            itp: Some("Local"),
            pods: &[("node-2", "a")],
            errno: "EHOSTUNREACH",
        },
    ];
    for case in cases {
        let mut c = cluster("empty");
        let eps = pods(&mut c, case.pods);
        let mut svc = Svc::new("web", vip().ip(), 80, 8080);
        svc.internal_traffic_policy = case.itp;
        write_service(c.manifests.path(), &svc, &eps).unwrap();
        c.add_node("node-1", &[]).unwrap();
        let r = c.probe("node-1", vip(), 20, Duration::ZERO).unwrap();
        assert_eq!(r.errors().get(case.errno), Some(&20), "{}: {:?}", case.name, r.errors());
        // The errno is the proof it did not hang: a dropped SYN would have ended in the probe's timeout.
        let slowest = r.attempts.iter().map(|a| a.ms).fold(0.0, f64::max);
        eprintln!("{}: slowest failed connect took {slowest:.1} ms", case.name);
    }
}

/// (f): only processes in the agent's cgroup are translated.
#[test]
fn a_process_outside_the_cgroup_is_not_rewritten() {
    let mut c = cluster("outside");
    let eps = pods(&mut c, &[("node-1", "a")]);
    write_service(c.manifests.path(), &Svc::new("web", vip().ip(), 80, 8080), &eps).unwrap();
    c.add_node("node-1", &[]).unwrap();
    let inside = c.probe("node-1", vip(), 5, Duration::ZERO).unwrap();
    assert_eq!(inside.count("pod-node-1"), 5);
    // Same netns, no cgroup: the VIP is not rewritten, and the netns has no route to it.
    let mut cmd = std::process::Command::new(lab());
    confine(&mut cmd, None, Some(&c.netns)).unwrap();
    let out = cmd.args(["probe", "--target", &vip().to_string(), "--count", "5"]).output().unwrap();
    let r: Report = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.errors().get("ENETUNREACH"), Some(&5), "{:?}", r.errors());
}

#[test]
fn the_agent_programs_exactly_the_plans_endpoints() {
    let mut c = cluster("exact");
    let bpffs = BpfFs::new("exact").unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/story");
    for f in std::fs::read_dir(&examples).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, c.manifests.path().join(f.file_name().unwrap())).unwrap();
    }
    let pin = bpffs.path().to_str().unwrap().to_owned();
    for node in ["node-1", "node-2"] {
        c.stop_agent("node-1");
        c.add_node(node, &["--bpffs", &pin]).unwrap();
        let out = std::process::Command::new(TIERLB)
            .args(["plan", "--node", node, "--manifests"])
            .arg(c.manifests.path())
            // The agent plans pdf-resume's hintless slices with the controller's hints; so does plan, asked.
            .args(["-o", "json", "--emulate-hints"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let maps = tierlb::datapath::ebpf::KernelMaps::open_pinned(&bpffs.path().join(node)).unwrap();
        let got = tierlb::datapath::read_back(&maps).unwrap();
        let mut want_frontends = 0;
        for s in plan["services"].as_array().unwrap() {
            let strs = |v: &serde_json::Value| -> Vec<String> {
                let mut v: Vec<String> =
                    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect();
                v.sort();
                v
            };
            let proto = match s["protocol"].as_str().unwrap() {
                "TCP" => 6,
                "UDP" => 17,
                _ => 132,
            };
            for ip in s["cluster_ips"].as_array().unwrap() {
                want_frontends += 1;
                let ip: IpAddr = ip.as_str().unwrap().parse().unwrap();
                let key = addr::frontend_key(ip, s["port"].as_u64().unwrap() as u16, proto);
                let rb = got.get(&key).unwrap_or_else(|| panic!("{node}: no frontend for {ip}"));
                let tiers: Vec<Vec<String>> = rb
                    .tiers
                    .iter()
                    .map(|t| {
                        let mut v: Vec<String> =
                            t.iter().map(|b| addr::backend_addr(b).to_string()).collect();
                        v.sort();
                        v
                    })
                    .collect();
                let internal = &s["internal"];
                assert_eq!(tiers[0], strs(&internal["tiers"]["node"]), "{node} {ip}: node tier");
                assert_eq!(tiers[1], strs(&internal["tiers"]["zone"]), "{node} {ip}: zone tier");
                assert_eq!(tiers[2], strs(&internal["tiers"]["cluster"]), "{node} {ip}: cluster tier");
                let first = tiers.iter().find(|t| !t.is_empty()).cloned().unwrap_or_default();
                assert_eq!(first, strs(&internal["endpoints"]), "{node} {ip}: the data path's choice");
                let local = internal["policy"] == "Local";
                assert_eq!(rb.value.flags & lb_common::FLAG_POLICY_LOCAL != 0, local, "{node} {ip}");
            }
        }
        assert_eq!(got.len(), want_frontends, "{node}: no extra frontends");
        assert!(want_frontends >= 4, "the example has several Services");
        // The same maps against expectations written by hand from examples/story and DESIGN.md's rules, not
        // from `tierlb plan` (which shares the planning code with the agent).
        for (vip, tiers, flags) in story_maps(node) {
            let key = addr::frontend_key(vip.ip(), vip.port(), 6);
            let rb = got.get(&key).unwrap_or_else(|| panic!("{node}: no frontend for {vip}"));
            let held: Vec<Vec<String>> = rb
                .tiers
                .iter()
                .map(|t| {
                    let mut v: Vec<String> = t.iter().map(|b| addr::backend_addr(b).to_string()).collect();
                    v.sort();
                    v
                })
                .collect();
            assert_eq!(
                held,
                tiers.map(|t| t.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()),
                "{node} {vip}"
            );
            assert_eq!(rb.value.flags, flags, "{node} {vip}: flags");
        }
    }
}

/// What the maps must hold for examples/story on `node`, worked out by hand: (VIP:port, [node, zone,
/// cluster] tiers, flags). The nodes have no zone label, so no zone tier anywhere.
fn story_maps(node: &str) -> Vec<(SocketAddr, [&'static [&'static str]; 3], u32)> {
    use lb_common::{FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL};
    let local_drop = FLAG_POLICY_LOCAL | FLAG_EMPTY_IS_DROP;
    // booking-api: an unknown trafficDistribution gets no hints; the named port resolves to 8080 in the v1
    // slices and 8081 in the v2 slice; dual-stack, one v6 endpoint.
    let booking_v4: [&[&str]; 3] = [&[], &[], &["10.244.1.31:8080", "10.244.2.31:8080", "10.244.3.32:8081"]];
    let booking_v6: [&[&str]; 3] = [&[], &[], &["[fd00:244::1:31]:8080"]];
    let pdf_cluster: &[&str] = &["10.244.1.21:9000", "10.244.3.21:9000"];
    let mut maps = vec![("10.96.0.40:80", booking_v4, 0), ("[fd00:96::40]:80", booking_v6, 0)];
    match node {
        // nginx-cache: internalTrafficPolicy Local wins over PreferSameNode: node-1's ready local pod.
        // pdf-resume: the controller's forNodes hints name node-1's pod.
        "node-1" => maps.extend([
            ("10.96.0.20:80", [&["10.244.1.10:8080"][..], &[], &[]], local_drop),
            ("10.96.0.30:80", [&["10.244.1.21:9000"][..], &[], pdf_cluster], 0),
        ]),
        // nginx-cache: node-2's pod is not ready but serving and terminating: the local set falls back to it.
        // pdf-resume: no hint names node-2, so no node tier.
        "node-2" => maps.extend([
            ("10.96.0.20:80", [&["10.244.2.10:8080"][..], &[], &[]], local_drop),
            ("10.96.0.30:80", [&[][..], &[], pdf_cluster], 0),
        ]),
        other => panic!("no expectation for {other}"),
    }
    maps.into_iter().map(|(vip, tiers, flags)| (vip.parse().unwrap(), tiers, flags)).collect()
}

/// An agent killed with SIGKILL leaves its programs attached and maps pinned; clients keep connecting with no
/// loss while it is gone; the restarted agent adopts the maps (rewriting nothing), then follows new changes;
/// `tierlb agent --cleanup` detaches everything.
#[test]
fn an_agent_killed_and_restarted_loses_no_connection_and_cleanup_detaches_it() {
    let mut c = cluster("restart");
    let bpffs = BpfFs::new("restart").unwrap();
    let mut eps = pods(&mut c, &[("node-1", "a"), ("node-2", "a")]);
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin]).unwrap();

    // 1,200 connects 5 ms apart: 6 s, room for the restart and the change after it on a loaded machine (at
    // 800, a full run's load once left the change too little of the probe to move 50 connects).
    let run = c.start_probe("node-1", vip(), 1_200, Duration::from_millis(5)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.kill_agent("node-1");
    std::thread::sleep(Duration::from_millis(500));
    let restart = c.restart_agent("node-1").unwrap();
    let log = std::fs::read_to_string(&c.node("node-1").log).unwrap();
    let last_sync = log.lines().rfind(|l| l.contains(" synced")).unwrap().to_owned();
    assert!(log.contains("adopted the maps of a previous agent"), "{log}");
    assert!(
        last_sync.contains("added=0") && last_sync.contains("updated=0"),
        "nothing rewritten: {last_sync}"
    );
    // The new agent follows changes: node-1's pod terminates, traffic moves to node-2.
    std::thread::sleep(Duration::from_millis(300));
    eps[0] = eps[0].clone().terminating();
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    let r = run.wait().unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    assert!(r.count("pod-node-1") > 100 && r.count("pod-node-2") > 50, "{:?}", r.by_backend());
    eprintln!("restart took {restart:?}; {} connects, 0 failed", r.attempts.len());

    let cg = c.node("node-1").cgroup.path().to_owned();
    c.kill_agent("node-1");
    let attached = |cg: &Path| {
        let out = std::process::Command::new("bpftool").args(["cgroup", "show"]).arg(cg).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("connect4")).count()
    };
    assert_eq!(attached(&cg), 1, "still attached after SIGKILL, exactly once");
    let out = std::process::Command::new(TIERLB)
        .args(["agent", "--cleanup", "--node", "node-1", "--bpffs", &pin])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(attached(&cg), 0, "detached by --cleanup");
    assert!(!bpffs.path().join("node-1").exists());
    let r = c.probe("node-1", vip(), 3, Duration::ZERO).unwrap();
    assert_eq!(r.errors().get("ENETUNREACH"), Some(&3), "no longer translated: {:?}", r.errors());
}

/// An edit that removes the local endpoint reaches the maps within 100 ms of the file write (inotify,
/// debounce, parse, plan, map writes). Measured over repeated edits; the bound asserted is generous.
#[test]
fn a_manifest_edit_reaches_the_maps_within_100ms() {
    let mut c = cluster("reload");
    let bpffs = BpfFs::new("reload").unwrap();
    let eps = pods(&mut c, &[("node-1", "a"), ("node-2", "a")]);
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin]).unwrap();
    let maps = tierlb::datapath::ebpf::KernelMaps::open_pinned(&bpffs.path().join("node-1")).unwrap();
    let key = addr::frontend_key(vip().ip(), 80, 6);
    let node_tier_len = || tierlb::datapath::read_back(&maps).unwrap()[&key].tiers[0].len();
    let mut times = Vec::new();
    for round in 0..20 {
        let local_gone = round % 2 == 0;
        let mut now = eps.clone();
        if local_gone {
            now[0] = now[0].clone().terminating();
        }
        let t0 = Instant::now();
        write_service(c.manifests.path(), &svc, &now).unwrap();
        let want = usize::from(!local_gone);
        // Each edit reaches the maps before the next is written (an order, not a speed: `cargo xtask bench`
        // measures how fast); 30 s only tells a hang from a slow machine.
        while node_tier_len() != want {
            assert!(t0.elapsed() < Duration::from_secs(30), "round {round}: maps never updated");
            std::thread::sleep(Duration::from_micros(200));
        }
        times.push(t0.elapsed());
        std::thread::sleep(Duration::from_millis(30));
    }
    times.sort();
    let (median, max) = (times[times.len() / 2], times[times.len() - 1]);
    eprintln!(
        "file write -> maps: median {median:?}, max {max:?} over {} edits (the bench measures it)",
        times.len()
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET over loopback (host namespace): status and body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out)
}

/// /healthz and /livez answer like kube-proxy's, /metrics counts the connects per Service and tier from the
/// data path's counters, and a healthCheckNodePort listener reports the local endpoints (200, then 503).
/// Clients that fill the metrics listener hold up neither health nor syncs, and are cut off at the deadline.
#[test]
fn health_metrics_and_health_check_node_port_servers() {
    let mut c = cluster("servers");
    let mut eps = pods(&mut c, &[("node-1", "a"), ("node-2", "a")]);
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    let hc = free_port();
    svc.health_check_node_port = Some(hc);
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    let (hz, mp) = (free_port(), free_port());
    let (hz_s, mp_s) = (format!("127.0.0.1:{hz}"), format!("127.0.0.1:{mp}"));
    c.add_node(
        "node-1",
        &["--healthz-addr", &hz_s, "--metrics-addr", &mp_s, "--service-health-bind", "127.0.0.1"],
    )
    .unwrap();
    for path in ["/healthz", "/livez"] {
        let (st, body) = http_get(hz, path);
        assert_eq!(st, 200, "{body}");
        assert!(body.contains("\"lastUpdated\":\"20") && body.contains("\"nodeEligible\":true"), "{body}");
        // Which release answers, and the layout of the maps it pinned (what an upgrade is judged by).
        let layout = format!("\"mapLayout\":{}", tierlb::datapath::MAP_LAYOUT);
        let version = format!("\"version\":\"{}\"", env!("CARGO_PKG_VERSION"));
        assert!(body.contains(&layout) && body.contains(&version), "{body}");
    }
    assert_eq!(http_get(hz, "/nope").0, 404);
    let r = c.probe("node-1", vip(), 40, Duration::ZERO).unwrap();
    assert_eq!(r.failures(), 0);
    let (st, m) = http_get(mp, "/metrics");
    assert_eq!(st, 200);
    let line = m
        .lines()
        .filter(|l| l.starts_with("tierlb_connections_total{") && l.contains("service=\"default/web\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum::<u64>();
    assert_eq!(line, 40, "{m}");
    for name in [
        "tierlb_sync_duration_seconds_count",
        "tierlb_map_entries{",
        "tierlb_fail_open_total 0",
        "tierlb_syncs_total",
    ] {
        assert!(m.contains(name), "{name} missing:\n{m}");
    }
    let (st, body) = http_get(hc, "/");
    assert_eq!(st, 200, "{body}");
    assert!(
        body.contains("X-Load-Balancing-Endpoint-Weight: 1") && body.contains("\"localEndpoints\":1"),
        "{body}"
    );
    // 64 clients that never finish a request fill the metrics listener: the next connection is closed at
    // once, and neither the health server nor the syncs below wait for them.
    let idle: Vec<std::net::TcpStream> =
        (0..64).map(|_| std::net::TcpStream::connect(("127.0.0.1", mp)).unwrap()).collect();
    let held_since = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    let mut over = std::net::TcpStream::connect(("127.0.0.1", mp)).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let r = std::io::Read::read(&mut over, &mut [0u8; 16]);
    assert!(
        matches!(r, Ok(0)) || r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    assert_eq!(http_get(hz, "/healthz").0, 200);
    // The local endpoint goes away: the load balancer's health check sees 503.
    let before = c.syncs_all();
    eps[0] = eps[0].clone().terminating().not_ready();
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    c.wait_synced(&before).unwrap();
    let mut answer = http_get(hc, "/");
    for _ in 0..100 {
        if answer.0 == 503 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        answer = http_get(hc, "/");
    }
    let (st, body) = answer;
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("\"localEndpoints\":0"), "{body}");
    // The idle clients are cut off at the 5 s deadline, and scrapes are served again.
    let wait = Duration::from_millis(5200).saturating_sub(held_since.elapsed());
    std::thread::sleep(wait);
    assert_eq!(http_get(mp, "/metrics").0, 200);
    drop(idle);
}

/// Map capacities are flags; a Service that does not fit is reported by name and left out whole, the
/// others work.
#[test]
fn a_full_map_is_an_error_naming_the_service_and_the_others_keep_working() {
    let mut c = cluster("full");
    let eps = pods(&mut c, &[("node-2", "a"), ("node-3", "a")]);
    // Two endpoints = two cluster-tier slots per Service, one entry of the slot map; room for one.
    write_service(c.manifests.path(), &Svc::new("alpha", "10.96.0.11".parse().unwrap(), 80, 8080), &eps)
        .unwrap();
    write_service(c.manifests.path(), &Svc::new("beta", "10.96.0.12".parse().unwrap(), 80, 8080), &eps)
        .unwrap();
    c.add_node("node-1", &["--max-slots", "1"]).unwrap();
    let log = std::fs::read_to_string(&c.node("node-1").log).unwrap();
    assert!(
        log.contains("Service default/beta:main frontend 10.96.0.12:80: map SLOTS is full (capacity 1)"),
        "{log}"
    );
    assert!(log.contains("--max-slots"), "the fix is named: {log}");
    let ok = c.probe("node-1", "10.96.0.11:80".parse().unwrap(), 10, Duration::ZERO).unwrap();
    assert_eq!(ok.failures(), 0, "{:?}", ok.errors());
    // The Service that did not fit is not half-programmed: its VIP is not translated at all.
    let left_out = c.probe("node-1", "10.96.0.12:80".parse().unwrap(), 3, Duration::ZERO).unwrap();
    assert_eq!(left_out.errors().get("ENETUNREACH"), Some(&3), "{:?}", left_out.errors());
}

/// 500 Services of 10 cluster-tier backends each (5,000 slots, 1,000 entries of the slot map: one round of
/// batches), with sessionAffinity of `affinity_s` seconds (then 5,000 members).
fn five_hundred_services(affinity_s: u32) -> tierlb::datapath::Desired {
    services_of_ten(500, affinity_s)
}

/// `n` Services of 10 cluster-tier backends each, with sessionAffinity of `affinity_s` seconds.
fn services_of_ten(n: u32, affinity_s: u32) -> tierlb::datapath::Desired {
    (0..n)
        .map(|i| {
            let vip = IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i));
            let b = (0..10).map(|e| addr::backend(SocketAddr::new(ip(1, e), 8080), 6)).collect();
            let name =
                tierlb::model::ServicePortName::new(tierlb::model::ObjKey::new("ns", format!("s{i}")), "");
            (
                addr::frontend_key(vip, 80, 6),
                tierlb::datapath::DesiredFrontend {
                    name: name.into(),
                    tiers: [Vec::new(), Vec::new(), b],
                    flags: 0,
                    affinity_timeout_s: affinity_s,
                },
            )
        })
        .collect()
}

/// A batch of slots and members long enough to be written by two threads (`PARALLEL_MIN`, 1,024 entries; the
/// names on a third) is in the kernel's maps whole: 600 Services of 10 slots, 1,200 entries of the slot map
/// and 6,000 members in one round, and every frontend reads back with every slot of its tiers, and every
/// member entry is there.
#[test]
fn a_batch_written_by_two_threads_is_in_the_maps_whole() {
    use tierlb::datapath::{
        MapReader as _, Reconciler,
        ebpf::{Capacities, Loaded},
        read_back,
    };
    require_root();
    let caps = Capacities { services: 1_000, slots: 20_000, ..Capacities::default() };
    let Loaded { maps, .. } = Loaded::load(caps, None).expect("the BPF object loads");
    let mut rec = Reconciler::new(maps);
    let d = services_of_ten(600, 30);
    let rep = rec.apply(&d, Instant::now());
    assert!(rep.errors.is_empty(), "{rep:?}");
    let back = read_back(rec.writer()).expect("the maps read back");
    assert_eq!(back.len(), d.len());
    for (key, want) in &d {
        assert_eq!(back[key].tiers, want.tiers, "{}", addr::frontend_addr(key));
    }
    assert_eq!(rec.writer().members().expect("members").len(), 6_000, "one member entry per backend");
}

/// The maps' memory is the kernel's own accounting: the preallocated frontend map holds its capacity before
/// anything is written and stays the same, the slot map (not preallocated) grows with what it holds (from
/// Linux 6.4; before, every map is accounted by its capacity), and the conntrack LRU is preallocated at its
/// capacity.
#[test]
fn the_maps_memory_is_read_from_the_kernels_accounting() {
    use tierlb::datapath::{
        Reconciler,
        ebpf::{Capacities, Loaded},
    };
    require_root();
    let caps = Capacities { services: 1_000, slots: 20_000, conntrack: 4_096, ..Capacities::default() };
    let Loaded { maps, ns, .. } = Loaded::load(caps, None).expect("the BPF object loads");
    let kv = |k: usize, v: usize| (k + v) as u64;
    let ct = ns.conntrack_memory().expect("conntrack memory");
    let per_ct = kv(size_of::<lb_common::CtKey>(), size_of::<lb_common::CtValue>());
    assert!(ct >= u64::from(caps.conntrack) * per_ct, "preallocated: {ct}");
    let mut rec = Reconciler::new(maps);
    let by_map =
        |rec: &Reconciler<tierlb::datapath::ebpf::KernelMaps>| -> std::collections::BTreeMap<&str, u64> {
            rec.writer().service_memory().into_iter().map(|(m, b)| (m, b.expect(m))).collect()
        };
    let before = by_map(&rec);
    let d = five_hundred_services(0);
    let rep = rec.apply(&d, Instant::now());
    assert!(rep.errors.is_empty(), "{rep:?}");
    let after = by_map(&rec);
    let per_fe = kv(size_of::<lb_common::FrontendKey>(), size_of::<lb_common::FrontendValue>());
    assert!(before["FRONTENDS"] >= u64::from(caps.services) * per_fe, "preallocated: {before:?}");
    assert_eq!(before["FRONTENDS"], after["FRONTENDS"], "a preallocated map's memory does not move");
    // 10 slots each: two entries of the slot map.
    let per_entry = kv(size_of::<lb_common::SlotKey>(), size_of::<lb_common::SlotBlock>());
    let counts_entries =
        aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 4, 0));
    if counts_entries {
        assert!(
            after["SLOTS"] >= before["SLOTS"] + 1_000 * per_entry,
            "5,000 slots (1,000 entries) held: {before:?} -> {after:?}"
        );
        assert!(after["SVC_NAMES"] > before["SVC_NAMES"], "500 names held: {before:?} -> {after:?}");
    } else {
        // Before 6.4 (no `map_mem_usage`; Debian 12's 6.1, found by `cargo xtask test --kernel 6.1`) the
        // kernel accounts a map by its capacity, whatever it holds: the figure is that estimate, unmoved.
        assert!(before["SLOTS"] >= u64::from(caps.slots) * per_entry, "the capacity's estimate: {before:?}");
        assert_eq!(before, after, "accounted by capacity, not by what the maps hold");
    }
}

/// The local-endpoint set has a fixed capacity (no flag raises it): a node with more endpoint addresses than
/// it holds gets an error that says the set is full and its capacity, not only the map's name.
#[test]
fn a_full_local_endpoint_set_says_so_with_its_capacity() {
    use tierlb::datapath::ebpf::{Capacities, Loaded};
    require_root();
    let caps = Capacities { services: 100, slots: 1_000, conntrack: 1_024, ..Capacities::default() };
    let Loaded { mut ns, .. } = Loaded::load(caps, None).expect("the BPF object loads");
    let max = lb_common::DEFAULT_MAX_LOCAL_BACKENDS;
    let addr = |i: u32| IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i));
    ns.set_local(&(0..max).map(addr).collect()).expect("exactly the capacity fits");
    let e = ns.set_local(&(0..=max).map(addr).collect()).expect_err("one more does not");
    assert!(e.to_string().starts_with(&format!("map LOCAL_BACKENDS is full (capacity {max})")), "{e}");
}

/// Counters start at zero for a Service id given out on maps an earlier agent pinned, which count under ids
/// this agent has not given out yet: the writer skips zeroing only on counter maps its own load created.
#[test]
fn an_id_given_out_on_reused_pinned_maps_starts_with_zero_counters() {
    use tierlb::datapath::{
        MapReader as _, Reconciler,
        ebpf::{Capacities, Loaded},
    };
    require_root();
    let bpffs = BpfFs::new("counters").expect("a bpffs");
    let caps = Capacities { services: 1_000, slots: 20_000, ..Capacities::default() };
    let d = five_hundred_services(0);
    {
        let Loaded { maps, .. } = Loaded::load(caps, Some(bpffs.path())).expect("the BPF object loads");
        let mut rec = Reconciler::new(maps);
        assert!(rec.apply(&d, Instant::now()).errors.is_empty());
    }
    // An earlier agent's counts under every id it may have used (as connects through its frontends leave).
    let path = bpffs.path().join(lb_common::MAP_COUNTERS);
    let data = aya::maps::MapData::from_pin(&path).expect("the pinned counters");
    let mut counters =
        aya::maps::PerCpuArray::<_, lb_common::ServiceCounters>::try_from(aya::maps::Map::PerCpuArray(data))
            .expect("a per-CPU array");
    let cpus = aya::util::nr_cpus().expect("CPUs");
    let seven = lb_common::ServiceCounters { counts: [7; lb_common::COUNTERS_PER_SERVICE as usize] };
    for id in 1..=600 {
        let counts = aya::maps::PerCpuValues::try_from(vec![seven; cpus]).expect("one per CPU");
        counters.set(id, counts, 0).expect("written");
    }
    let Loaded { maps, .. } = Loaded::load(caps, Some(bpffs.path())).expect("the pinned maps are reused");
    // A reconciler over the reused maps that does not adopt them: it gives out ids from the first again.
    let mut rec = Reconciler::new(maps);
    rec.apply(&tierlb::datapath::Desired::default(), Instant::now());
    assert!(rec.apply(&d, Instant::now()).errors.is_empty());
    // Ids 1 to 500 given out again (`GLOBAL_SVC_ID` is 0): zeroed, every kind. 501 and up: not given out,
    // not touched.
    for id in [1, 250, 500] {
        assert_eq!(rec.writer().counters(id).expect("counters"), [0; 8], "id {id}");
    }
    assert_eq!(rec.writer().counters(501).expect("counters"), [7 * cpus as u64; 8], "id 501");
}
