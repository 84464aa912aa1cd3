//! `tierlb trace` in the kernel: one event per decision of connect4/6 and sendmsg4/6, with the backend, tier
//! and reason, or the errno of a refusal; clients attributed to their pod under both kubelet cgroup drivers;
//! the `--service` filter; events lost while the consumer is stopped counted by the programs and reported by
//! the command and by `tierlb_trace_events_lost_total`; the switch off again after every trace. One agent.
mod common;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use common::{TIERLB, cluster, free_port, get, tierlb};
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::{BpfFs, Cgroup, Child, TempDir, confine},
};
use serde_json::Value;

const UID_A: &str = "0f6b9c2e-3d4a-4b5c-8d9e-123456789abc";
const UID_B: &str = "7a1d2c3b-4e5f-4a6b-9c8d-fedcba987654";

/// A running `tierlb trace -o json`, its output in files.
struct Trace {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    _dir: TempDir,
}

impl Trace {
    /// Start it on the pins under `pin` and wait until it traces.
    fn start(pin: &str, pod_logs: &Path, extra: &[&str]) -> Self {
        let dir = TempDir::new("trace-out").unwrap();
        let (out, err) = (dir.path().join("out.json"), dir.path().join("err.txt"));
        let mut cmd = Command::new(TIERLB);
        cmd.args(["trace", "--bpffs", pin, "-o", "json", "--pod-logs"])
            .arg(pod_logs)
            .args(extra)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        let mut child = Child::spawn(&mut cmd).unwrap();
        child.wait_for_log(&err, 0, "tierlb trace: tracing", Duration::from_secs(10)).unwrap();
        Self { child, out, err, _dir: dir }
    }

    /// SIGTERM, then its events and its stderr.
    fn stop(mut self) -> (Vec<Value>, String) {
        let status = self.child.stop(Duration::from_secs(5)).unwrap();
        let err = std::fs::read_to_string(&self.err).unwrap();
        assert!(status.success(), "trace exited {status}: {err}");
        let out = std::fs::read_to_string(&self.out).unwrap();
        (out.lines().map(|l| serde_json::from_str(l).unwrap()).collect(), err)
    }
}

/// `count` connects to `target` from a client in `cg` (a pod's container cgroup) in the cluster's netns.
fn probe_in(c: &SimCluster, cg: &Cgroup, target: SocketAddr, count: usize) -> Report {
    let mut cmd = Command::new(&c.lab);
    confine(&mut cmd, Some(cg), Some(&c.netns)).unwrap();
    let out = cmd
        .args(["probe", "--target", &target.to_string(), "--count", &count.to_string()])
        .args(["--timeout-ms", "2000"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn for_vip<'a>(events: &'a [Value], vip: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["vip"] == vip).collect()
}

/// The instance's trace switch and selection, read from its pins: (mode, owner pid, selected ids).
fn switch_state(pin: &Path) -> (u32, u32, usize) {
    let dir = pin.join("node-1");
    let open = |name: &str| {
        aya::maps::Map::from_map_data(aya::maps::MapData::from_pin(dir.join(name)).unwrap()).unwrap()
    };
    let control: aya::maps::Array<_, lb_common::TraceControl> =
        aya::maps::Array::try_from(open(lb_common::MAP_TRACE_CONTROL)).unwrap();
    let services: aya::maps::HashMap<_, u32, u32> =
        aya::maps::HashMap::try_from(open(lb_common::MAP_TRACE_SERVICES)).unwrap();
    let c = control.get(&0, 0).unwrap();
    (c.mode, c.owner_pid, services.keys().count())
}

/// One agent (node-1, zone a) with five Services, two client pods below its cgroup and the kubelet's pod log
/// directories naming them. Field order is drop order: the pods' cgroups before the cluster's.
struct Fixture {
    pod_a: Cgroup,
    pod_b: Cgroup,
    pod_logs: TempDir,
    metrics: u16,
    bpffs: BpfFs,
    pin: String,
    c: SimCluster,
}

fn vip(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn setup() -> Fixture {
    let mut c = cluster("trace");
    let bpffs = BpfFs::new("trace").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let ip = |s: &str| s.parse().unwrap();
    // web: PreferSameNode, a pod on node-1 and node-2 in zone a. web6: IPv6, no topology. empty: no
    // endpoint. local: internalTrafficPolicy Local, its pod elsewhere. dns: UDP, a resolver on node-1.
    let mut web = Svc::new("web", ip("10.96.0.10"), 80, 8080);
    web.traffic_distribution = Some("PreferSameNode".into());
    let mut web_eps = Vec::new();
    for (node, pod) in [("node-1", "10.244.1.10"), ("node-2", "10.244.2.10")] {
        c.add_pod(SocketAddr::new(ip(pod), 8080), &format!("pod-{node}")).unwrap();
        web_eps.push(Ep::ready(ip(pod), node).zone("a").prefer_same_node());
    }
    write_service(c.manifests.path(), &web, &web_eps).unwrap();
    c.add_pod("[fd00:244:1::10]:8080".parse().unwrap(), "pod6").unwrap();
    let web6 = Svc::new("web6", ip("fd00:96::10"), 80, 8080);
    write_service(c.manifests.path(), &web6, &[Ep::ready(ip("fd00:244:1::10"), "node-1")]).unwrap();
    write_service(c.manifests.path(), &Svc::new("empty", ip("10.96.0.20"), 80, 8080), &[]).unwrap();
    let mut local = Svc::new("local", ip("10.96.0.30"), 80, 8080);
    local.internal_traffic_policy = Some("Local");
    write_service(c.manifests.path(), &local, &[Ep::ready(ip("10.244.2.10"), "node-2")]).unwrap();
    c.add_dns_pod("10.244.1.53:53".parse().unwrap(), ip("10.0.1.1")).unwrap();
    let mut dns = Svc::new("dns", ip("10.96.0.53"), 53, 53);
    dns.protocol = "UDP";
    write_service(c.manifests.path(), &dns, &[Ep::ready(ip("10.244.1.53"), "node-1")]).unwrap();
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin, "--metrics-addr", &metrics_addr]).unwrap();

    // Two client pods below node-1's cgroup, one per kubelet cgroup driver, named by the kubelet's log dirs.
    let pod_a = Cgroup::nested(
        &c.node("node-1").cgroup,
        &format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-4f1e.scope",
            UID_A.replace('-', "_")
        ),
    )
    .unwrap();
    let pod_b =
        Cgroup::nested(&c.node("node-1").cgroup, &format!("kubepods/besteffort/pod{UID_B}/9a8b7c")).unwrap();
    let pod_logs = TempDir::new("pod-logs").unwrap();
    for (pod, uid) in [("client-a", UID_A), ("client-b", UID_B)] {
        std::fs::create_dir(pod_logs.path().join(format!("default_{pod}_{uid}"))).unwrap();
    }
    Fixture { pod_a, pod_b, pod_logs, metrics, bpffs, pin, c }
}

#[test]
fn trace_streams_each_decision_with_its_reason_filters_counts_lost_events_and_is_one_per_instance() {
    let f = setup();
    every_decision_is_one_event_with_its_reason(&f);
    the_service_filter_is_applied_in_the_kernel(&f);
    the_vip_and_pod_filters_select_what_is_traced(&f);
    events_lost_while_the_consumer_is_stopped_are_counted(&f);
    a_killed_trace_stops_tracing_when_its_lease_runs_out(&f);
    a_killed_traces_switch_is_taken_over_and_a_second_live_trace_refused(&f);
}

/// Everything traced: each kind of decision, as many events as decisions; the switch off afterwards.
fn every_decision_is_one_event_with_its_reason(f: &Fixture) {
    let Fixture { c, pod_a, pod_b, pin, .. } = f;
    let node_cg = &c.node("node-1").cgroup;
    let t = Trace::start(pin, f.pod_logs.path(), &[]);
    assert_eq!(probe_in(c, pod_a, vip("10.96.0.10:80"), 5).count("pod-node-1"), 5);
    assert_eq!(probe_in(c, pod_b, vip("[fd00:96::10]:80"), 3).count("pod6"), 3);
    let refused = probe_in(c, pod_a, vip("10.96.0.20:80"), 2);
    assert_eq!(refused.errors().get("ECONNREFUSED"), Some(&2));
    let hung = probe_in(c, pod_a, vip("10.96.0.30:80"), 2);
    assert_eq!(hung.errors().get("EHOSTUNREACH"), Some(&2));
    let lookups = c.dns("node-1", vip("10.96.0.53:53"), 3, false).unwrap();
    assert!(lookups.iter().all(|l| l.error.is_none()), "{lookups:?}");
    let (ok, _, err) = tierlb(&["backend", "down", "10.244.1.10:8080", "--for", "1m", "--bpffs", pin]);
    assert!(ok, "{err}");
    assert_eq!(probe_in(c, pod_a, vip("10.96.0.10:80"), 2).count("pod-node-2"), 2);
    let (events, err) = t.stop();
    assert!(
        err.contains(&format!("tierlb trace: {} events", events.len())) && !err.contains("missed"),
        "{err}"
    );

    for e in &events {
        for field in ["cookie", "netns_cookie", "cgroup_id", "pid"] {
            assert!(e[field].as_u64().is_some_and(|v| v > 0), "{field}: {e}");
        }
        assert!(e["time"].as_str().is_some_and(|t| t.len() == 27 && t.ends_with('Z')), "{e}");
        assert_eq!(e["instance"], "node-1");
    }
    let web_events = for_vip(&events, "10.96.0.10:80");
    assert_eq!(web_events.len(), 7, "{web_events:?}");
    for e in &web_events[..5] {
        assert_eq!(
            (&e["hook"], &e["backend"], &e["tier"], &e["reason"]),
            (&"connect4".into(), &"10.244.1.10:8080".into(), &"node".into(), &"node-hint".into()),
            "{e}"
        );
        assert_eq!(
            (&e["pod"], &e["pod_uid"], &e["comm"]),
            (&"default/client-a".into(), &UID_A.into(), &"tierlb-lab".into())
        );
        assert_eq!((&e["service"], &e["protocol"]), (&"default/web:main".into(), &"TCP".into()), "{e}");
        assert!(e.get("errno").is_none() && e.get("skipped_down").is_none(), "{e}");
    }
    for e in &web_events[5..] {
        // node-1's pod marked down: the zone tier, after skipping it.
        assert_eq!(
            (&e["backend"], &e["tier"], &e["reason"]),
            (&"10.244.2.10:8080".into(), &"zone".into(), &"zone-hint".into()),
            "{e}"
        );
        assert!(e["skipped_down"].as_u64().is_some_and(|n| n >= 1) && e.get("held").is_none(), "{e}");
    }
    let v6 = for_vip(&events, "[fd00:96::10]:80");
    assert_eq!(v6.len(), 3);
    for e in v6 {
        assert_eq!(
            (&e["hook"], &e["tier"], &e["reason"]),
            (&"connect6".into(), &"cluster".into(), &"cluster".into()),
            "{e}"
        );
        assert_eq!(
            (&e["pod"], &e["pod_uid"]),
            (&"default/client-b".into(), &UID_B.into()),
            "cgroupfs driver: {e}"
        );
    }
    for (vip, errno, name, reason) in [
        ("10.96.0.20:80", 111, "ECONNREFUSED", "refused-no-endpoints"),
        ("10.96.0.30:80", 113, "EHOSTUNREACH", "refused-no-local-endpoint"),
    ] {
        let refused = for_vip(&events, vip);
        assert_eq!(refused.len(), 2, "{vip}");
        for e in refused {
            assert_eq!(
                (&e["errno"], &e["errno_name"], &e["reason"]),
                (&errno.into(), &name.into(), &reason.into()),
                "{e}"
            );
            assert!(e.get("backend").is_none() && e.get("tier").is_none(), "{e}");
        }
    }
    let udp = for_vip(&events, "10.96.0.53:53");
    assert_eq!(udp.len(), 3, "one sendmsg per query");
    for e in udp {
        assert_eq!(
            (&e["hook"], &e["protocol"], &e["backend"]),
            (&"sendmsg4".into(), &"UDP".into(), &"10.244.1.53:53".into()),
            "{e}"
        );
        // The resolver client runs in the node's cgroup itself: no pod, its cgroup path instead.
        assert!(e.get("pod").is_none(), "{e}");
        assert_eq!(e["cgroup"].as_str(), node_cg.path().to_str(), "{e}");
    }
    assert_eq!(switch_state(f.bpffs.path()), (0, 0, 0), "the switch is off once the trace ends");
}

/// --service: only the Service's decisions reach the ring buffer (the kernel filters by service id).
fn the_service_filter_is_applied_in_the_kernel(f: &Fixture) {
    let Fixture { c, pod_a, pin, .. } = f;
    let (ok, _, err) = tierlb(&["backend", "up", "10.244.1.10:8080", "--bpffs", pin]);
    assert!(ok, "{err}");
    let t = Trace::start(pin, f.pod_logs.path(), &["--service", "default/web"]);
    let (mode, owner, selected) = switch_state(f.bpffs.path());
    assert_eq!((mode, selected), (lb_common::TRACE_SELECTED, 1));
    assert!(owner > 0);
    probe_in(c, pod_a, vip("10.96.0.20:80"), 3);
    probe_in(c, pod_a, vip("10.96.0.10:80"), 4);
    let (events, _) = t.stop();
    let vips: BTreeSet<&str> = events.iter().filter_map(|e| e["vip"].as_str()).collect();
    assert_eq!((events.len(), vips), (4, BTreeSet::from(["10.96.0.10:80"])));
    assert_eq!(switch_state(f.bpffs.path()), (0, 0, 0), "off, and the selection cleared");
}

/// `--vip IP:PORT` and `--vip IP` select frontends in the kernel (one port of web, or each port of the
/// address); `--pod` keeps the decisions of one pod's processes only (the caller's cgroup), whatever others
/// connect to.
fn the_vip_and_pod_filters_select_what_is_traced(f: &Fixture) {
    let Fixture { c, pod_a, pod_b, pin, .. } = f;
    for filter in ["10.96.0.10:80", "10.96.0.10"] {
        let t = Trace::start(pin, f.pod_logs.path(), &["--vip", filter]);
        assert_eq!(
            switch_state(f.bpffs.path()).0,
            lb_common::TRACE_SELECTED,
            "--vip {filter}: in the kernel"
        );
        probe_in(c, pod_a, vip("10.96.0.20:80"), 3);
        probe_in(c, pod_a, vip("10.96.0.10:80"), 4);
        let (events, _) = t.stop();
        let vips: BTreeSet<&str> = events.iter().filter_map(|e| e["vip"].as_str()).collect();
        assert_eq!((events.len(), vips), (4, BTreeSet::from(["10.96.0.10:80"])), "--vip {filter}");
    }
    let t = Trace::start(pin, f.pod_logs.path(), &["--pod", "default/client-b"]);
    probe_in(c, pod_a, vip("10.96.0.10:80"), 3);
    probe_in(c, pod_b, vip("10.96.0.10:80"), 5);
    let (events, _) = t.stop();
    let pods: BTreeSet<&str> = events.iter().filter_map(|e| e["pod"].as_str()).collect();
    assert_eq!((events.len(), pods), (5, BTreeSet::from(["default/client-b"])), "--pod default/client-b");
}

/// Right after a trace was SIGKILLed (its switch left on; the process not reaped yet, a zombie, which holds
/// no switch), the next trace takes the switch over; while it
/// runs, a second one is refused at once, naming the first one's pid; stopped, it leaves the switch off.
fn a_killed_traces_switch_is_taken_over_and_a_second_live_trace_refused(f: &Fixture) {
    let Fixture { c, pod_a, pin, .. } = f;
    let killed = Trace::start(pin, f.pod_logs.path(), &[]);
    killed.child.signal(nix::sys::signal::Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(100));
    let t = Trace::start(pin, f.pod_logs.path(), &[]);
    let mut second = Command::new(TIERLB)
        .args(["trace", "--bpffs", pin, "-o", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = second.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > end {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second trace ran beside the first");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
    let pid = format!("another `tierlb trace` (pid {}) is tracing this agent", t.child.pid());
    assert!(!status.success() && err.contains(&pid), "{status}: {err}");
    probe_in(c, pod_a, vip("10.96.0.10:80"), 3);
    let (events, _) = t.stop();
    assert_eq!(events.len(), 3, "the trace that took over gets its events, none the killed one left unread");
    assert_eq!(switch_state(Path::new(pin)).0, lb_common::TRACE_OFF, "off after it");
    drop(killed);
}

/// The consumer stopped: the ring buffer (256 KiB, about 1,800 events of 136 bytes) fills, and every decision is either
/// an event or counted as lost, by the command and by the agent's metric.
fn events_lost_while_the_consumer_is_stopped_are_counted(f: &Fixture) {
    let Fixture { c, pod_a, pin, metrics, .. } = f;
    let t = Trace::start(pin, f.pod_logs.path(), &[]);
    t.child.signal(nix::sys::signal::Signal::SIGSTOP);
    let n = 3000;
    assert_eq!(probe_in(c, pod_a, vip("10.96.0.10:80"), n).failures(), 0);
    t.child.signal(nix::sys::signal::Signal::SIGCONT);
    let (events, err) = t.stop();
    let lost = n - events.len();
    assert!(lost > 0 && events.len() > 1500, "{} events", events.len());
    assert!(err.contains(&format!("{} events, {lost} missed", events.len())), "{err}");
    let (status, body) = get(*metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains(&format!("\ntierlb_trace_events_lost_total {lost}\n")), "{body}");
}

/// `tierlb_trace_events_lost_total` of the agent now.
fn lost_now(metrics: u16) -> u64 {
    let (status, body) = get(metrics, "/metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix("tierlb_trace_events_lost_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no tierlb_trace_events_lost_total in {body}"))
}

/// A trace SIGKILLed cannot clear the switch: the programs keep tracing (into a ring buffer nobody reads:
/// events lost) only until the lease it renewed every second runs out, then stop by themselves.
fn a_killed_trace_stops_tracing_when_its_lease_runs_out(f: &Fixture) {
    let Fixture { c, pod_a, pin, metrics, .. } = f;
    let t = Trace::start(pin, f.pod_logs.path(), &[]);
    t.child.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = std::time::Instant::now();
    let before = lost_now(*metrics);
    assert_eq!(probe_in(c, pod_a, vip("10.96.0.10:80"), 2500).failures(), 0);
    let during = lost_now(*metrics);
    assert!(during > before, "still tracing right after the kill (the ring fills): {before} -> {during}");
    let lease = Duration::from_nanos(lb_common::TRACE_LEASE_NS) + Duration::from_secs(1);
    std::thread::sleep(lease.saturating_sub(killed.elapsed()));
    assert_eq!(probe_in(c, pod_a, vip("10.96.0.10:80"), 2500).failures(), 0);
    let after = lost_now(*metrics);
    assert_eq!(after, during, "no event once the lease ran out");
    assert_eq!(switch_state(Path::new(pin)).0, lb_common::TRACE_ALL, "the switch itself is left as it was");
    drop(t);
}
