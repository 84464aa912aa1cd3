//! README.md and docs/cli.md claims that need the kernel, checked in one simulated cluster (two agents) to keep
//! the suite short, each as a named check (`common::Checks`: a failed one fails the test by its name and
//! the later ones still run): the errnos of connect() and of UDP sendmsg() when there is no endpoint, or no local one,
//! or every backend is marked down; v4-mapped addresses on dual-stack sockets; `tierlb backend`'s
//! `--protocol` and `--instance`, and the connected UDP sockets it ends; `tierlb status`'s refused counts;
//! the metric families of refusals, map capacities (`--max-services`, `--max-backends`), reload and health
//! port errors; `--log-format json`; and an agent without `--bpffs` detaching on SIGTERM. Needs root; a
//! private netns, child cgroups and a bpffs mount, removed on drop.
mod common;

use std::{
    net::{IpAddr, SocketAddr},
    process::Stdio,
    time::Duration,
};

use common::{cluster, eventually, free_port, get, tierlb};
use lb_testkit::{
    dns::StreamStep,
    manifests::{Ep, Svc, write_atomic, write_service},
    probe::Report,
    sandbox::BpfFs,
};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The errno names of a probe's failed attempts; every attempt must have failed.
fn only_errors(r: &Report, what: &str) -> Vec<(String, usize)> {
    assert_eq!(r.failures(), r.attempts.len(), "{what}: some connects went through: {:?}", r.by_backend());
    r.errors().into_iter().collect()
}

/// `max_entries` of a pinned map, as bpftool reads it from the kernel.
fn max_entries(pin: &std::path::Path) -> u64 {
    let out = std::process::Command::new("bpftool").args(["-j", "map", "show", "pinned"]).arg(pin).output();
    let out = out.expect("bpftool is needed for this test (cargo xtask setup installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["max_entries"].as_u64().unwrap()
}

/// The value of the exposition line `name{labels}` (or `name` alone).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
#[expect(clippy::too_many_lines, reason = "one cluster's story, claim by claim")]
fn refusals_marks_dual_stack_sockets_and_the_agents_flags_do_what_the_docs_say() {
    let mut c = cluster("claims");
    let bpffs = BpfFs::new("claims").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let (pod_a, pod_b) = (sa("10.244.1.10:8080"), sa("10.244.2.10:8080"));
    c.add_pod(pod_a, "pod-a").unwrap();
    c.add_pod(pod_b, "pod-b").unwrap();
    let (dns_a, dns_b) = (sa("10.244.1.53:53"), sa("10.244.2.53:53"));
    c.add_dns_pod(dns_a, ip("10.0.1.1")).unwrap();
    c.add_dns_pod(dns_b, ip("10.0.2.2")).unwrap();
    let (ep_a, ep_b) = (Ep::ready(pod_a.ip(), "node-1"), Ep::ready(pod_b.ip(), "node-2"));
    let dir = c.manifests.path().to_owned();
    let svc = |name: &str, vip: &str, itp: Option<&'static str>| {
        let mut s = Svc::new(name, ip(vip), 80, 8080);
        s.internal_traffic_policy = itp;
        s
    };
    write_service(&dir, &svc("web", "10.96.0.10", None), &[ep_a.clone(), ep_b.clone()]).unwrap();
    write_service(&dir, &svc("local", "10.96.0.11", Some("Local")), &[ep_a.clone(), ep_b.clone()]).unwrap();
    write_service(&dir, &svc("remote", "10.96.0.12", Some("Local")), std::slice::from_ref(&ep_b)).unwrap();
    write_service(&dir, &svc("empty", "10.96.0.13", None), &[]).unwrap();
    let mut dns = Svc::new("dns", ip("10.96.0.53"), 53, 53);
    dns.protocol = "UDP";
    dns.traffic_distribution = Some("PreferSameNode".into());
    let dns_eps = [
        Ep::ready(dns_a.ip(), "node-1").prefer_same_node(),
        Ep::ready(dns_b.ip(), "node-2").prefer_same_node(),
    ];
    write_service(&dir, &dns, &dns_eps).unwrap();
    let mut remote_dns = Svc::new("remote-dns", ip("10.96.0.54"), 53, 53);
    remote_dns.protocol = "UDP";
    remote_dns.internal_traffic_policy = Some("Local");
    write_service(&dir, &remote_dns, &[Ep::ready(dns_b.ip(), "node-2")]).unwrap();
    // A healthCheckNodePort on a port something else holds: its listener cannot be bound.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut lb = svc("lb", "10.96.0.14", None);
    lb.health_check_node_port = Some(taken.local_addr().unwrap().port());
    write_service(&dir, &lb, std::slice::from_ref(&ep_a)).unwrap();
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    c.add_node(
        "node-1",
        &[
            "--bpffs",
            &pin,
            "--log-format",
            "json",
            "--max-services",
            "16",
            "--max-backends",
            "64",
            "--metrics-addr",
            &metrics_addr,
            "--service-health-bind",
            "127.0.0.1",
        ],
    )
    .unwrap();
    c.add_node("node-2", &[]).unwrap();

    let mut checks = common::Checks::default();
    let probe = |node: &str, vip: &str| c.probe(node, sa(vip), 10, Duration::ZERO).unwrap();
    checks.check(
        "connect() errnos: no endpoint ECONNREFUSED, Local policy with endpoints only elsewhere EHOSTUNREACH",
        || {
            assert_eq!(
                only_errors(&probe("node-1", "10.96.0.13:80"), "empty"),
                [("ECONNREFUSED".into(), 10)]
            );
            assert_eq!(
                only_errors(&probe("node-1", "10.96.0.12:80"), "remote"),
                [("EHOSTUNREACH".into(), 10)]
            );
        },
    );
    checks.check("UDP sendto() and connect() get the same errno at once", || {
        for connected in [false, true] {
            for l in c.dns("node-1", sa("10.96.0.54:53"), 5, connected).unwrap() {
                // The errno, not a timeout: it failed at once.
                assert_eq!(l.error.as_deref(), Some("EHOSTUNREACH"), "UDP connected={connected}: {l:?}");
            }
        }
    });
    checks.check("a dual-stack socket's v4-mapped VIP is translated and getpeername() shows it", || {
        let mapped = sa("[::ffff:10.96.0.10]:80");
        let r = c.probe("node-1", mapped, 10, Duration::ZERO).unwrap();
        assert_eq!(r.failures(), 0, "{:?}", r.errors());
        assert!(
            r.attempts.iter().all(|x| x.peer.as_deref() == Some("[::ffff:10.96.0.10]:80")),
            "{:?}",
            r.attempts[0]
        );
    });
    let mark_udp = |instance: &str| {
        tierlb(&[
            "backend",
            "down",
            "10.244.1.53:53",
            "--protocol",
            "UDP",
            "--instance",
            instance,
            "--bpffs",
            &pin,
        ])
    };
    checks.check("tierlb backend: TCP is the default protocol, an unknown --instance is refused", || {
        let (ok, _, err) = tierlb(&["backend", "down", "10.244.1.53:53", "--bpffs", &pin]);
        assert!(
            !ok && err.contains("check the address, the port and --protocol"),
            "TCP is the default: {err}"
        );
        let (ok, _, err) = mark_udp("node-9");
        assert!(!ok, "no instance node-9: {err}");
    });
    checks.check("marking a UDP backend down ends the connected sockets to it", || {
        let mut stream = c.client_command("node-1", &c.lab).unwrap();
        stream.args([
            "dns-stream",
            "--server",
            "10.96.0.53:53",
            "--duration-ms",
            "1200",
            "--interval-ms",
            "5",
        ]);
        let stream = stream.stdout(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let (ok, out, err) = mark_udp("node-1");
        assert!(ok, "{err}");
        assert!(out.contains("node-1: backend 10.244.1.53:53 UDP marked down"), "{out}");
        assert!(out.contains("destroyed 1 connected UDP sockets to it"), "{out}");
        let steps: Vec<StreamStep> =
            serde_json::from_slice(&stream.wait_with_output().unwrap().stdout).unwrap();
        let first_err = steps.iter().position(|s| s.error.is_some()).expect("the socket was ended");
        assert!(
            matches!(steps[first_err].error.as_deref(), Some("ECONNABORTED" | "EDESTADDRREQ")),
            "{steps:?}"
        );
        assert!(
            steps[..first_err].iter().all(|s| s.answer.as_deref() == Some("10.0.1.1")),
            "node tier before"
        );
        assert!(
            steps[first_err + 1..].iter().all(|s| s.answer.as_deref() == Some("10.0.2.2")),
            "then the other"
        );
    });
    checks.check("every backend of every tier marked down: the Service's own errno, at once", || {
        for backend in ["10.244.1.10:8080", "10.244.2.10:8080"] {
            let (ok, _, err) = tierlb(&["backend", "down", backend, "--bpffs", &pin]);
            assert!(ok, "{err}");
        }
        assert_eq!(only_errors(&probe("node-1", "10.96.0.10:80"), "web"), [("ECONNREFUSED".into(), 10)]);
        assert_eq!(only_errors(&probe("node-1", "10.96.0.11:80"), "local"), [("EHOSTUNREACH".into(), 10)]);
    });
    checks.check("tierlb status counts each refusal under its reason, per frontend", || {
        let (ok, out, err) = tierlb(&["status", "-o", "json", "--bpffs", &pin]);
        assert!(ok, "{err}");
        let st: serde_json::Value = serde_json::from_str(&out).unwrap();
        let counts = |service: &str| {
            let f = st[0]["frontends"].as_array().unwrap().iter().find(|f| f["service"] == service).unwrap();
            let n = |k: &str| f["connections"][k].as_u64().unwrap();
            (n("node") + n("zone") + n("cluster"), n("rejected"), n("dropped"))
        };
        assert_eq!(counts("default/empty"), (0, 10, 0));
        assert_eq!(counts("default/remote"), (0, 0, 10));
        assert_eq!(counts("default/web"), (10, 10, 0), "10 v4-mapped connects, then 10 refused");
        assert_eq!(counts("default/local"), (0, 0, 10));
        assert_eq!(counts("default/remote-dns"), (0, 0, 10), "5 sendto() and 5 connect()");
    });

    // /metrics: the same refusals by reason, the capacities the flags asked for, and the error counters.
    write_atomic(
        &dir,
        "broken.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: broken}\nspec: {ports: [{port: 0}]}\n",
    )
    .unwrap();
    let scrape = || get(metrics, "/metrics").1;
    checks.check("a manifest that does not parse counts in tierlb_reload_errors_total", || {
        assert!(
            eventually(5, || sample(&scrape(), "tierlb_reload_errors_total").is_some_and(|n| n >= 1.0)),
            "{}",
            scrape()
        );
    });
    let text = scrape();
    checks.check("tierlb_connections_refused_total by reason", || {
        let refused = |svc: &str, vip: &str, reason: &str| {
            let labels = format!(r#"service="default/{svc}",port="main",frontend="{vip}",reason="{reason}""#);
            sample(&text, &format!("tierlb_connections_refused_total{{{labels}}}"))
        };
        assert_eq!(refused("empty", "10.96.0.13:80", "no_endpoints"), Some(10.0), "{text}");
        assert_eq!(refused("remote", "10.96.0.12:80", "no_local_endpoint"), Some(10.0), "{text}");
    });
    checks.check("--max-services and --max-backends size the maps, tierlb_map_capacity says so", || {
        assert_eq!(sample(&text, r#"tierlb_map_capacity{map="FRONTENDS"}"#), Some(16.0), "{text}");
        let maps = bpffs.path().join("node-1");
        assert_eq!(
            (max_entries(&maps.join("FRONTENDS")), max_entries(&maps.join("BACKEND_STATE"))),
            (16, 64)
        );
    });
    checks.check(
        "a health check port that cannot be bound counts in tierlb_health_port_errors_total",
        || {
            // Counted per failed attempt: each sync tries the listener again (two syncs so far).
            assert!(sample(&text, "tierlb_health_port_errors_total").is_some_and(|n| n >= 1.0), "{text}");
            assert_eq!(sample(&text, "tierlb_apply_errors_total"), Some(0.0), "{text}");
        },
    );
    drop(taken);
    checks.check(
        "--log-format json: every log line is a JSON object, the sync line carries its fields",
        || {
            let log = std::fs::read_to_string(&c.node("node-1").log).unwrap();
            let lines: Vec<serde_json::Value> = log
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
                .collect();
            let synced = lines.iter().find(|l| l["fields"]["message"] == "synced").expect("a synced line");
            assert_eq!(synced["level"], "INFO", "{synced}");
            assert_eq!(synced["fields"]["frontends"], 7, "{synced}");
            assert!(synced["fields"]["took_us"].is_u64(), "{synced}");
        },
    );
    checks.check("an agent without --bpffs detaches when stopped", || {
        let r = c.probe("node-2", sa("10.96.0.10:80"), 10, Duration::ZERO).unwrap();
        assert_eq!(r.failures(), 0, "{:?}", r.errors());
        c.stop_agent("node-2");
        let r = c.probe("node-2", sa("10.96.0.10:80"), 10, Duration::ZERO).unwrap();
        assert_eq!(only_errors(&r, "after SIGTERM"), [("ENETUNREACH".into(), 10)]);
    });
    checks.finish();
}
