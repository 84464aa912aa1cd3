//! What docs/cli.md promises of the commands that need no BPF and no root, read from the binary's output:
//! `tierlb explain` (every part the docs list), `tierlb plan -o table`, `tierlb study -o json --chart`, and
//! the metric families `/metrics` serves (through the exposition the agent serves, with in-memory maps).
use std::{fmt::Write as _, net::SocketAddr, path::Path, process::Command, time::Instant};

use lb_testkit::sandbox::TempDir;
use tierlb::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, fake::FakeMaps},
    metrics::{AgentStats, Counts, ReadCounters, Snapshot, encode_text},
    model::{ObjKey, ServicePortName},
};

mod kubectl;
mod lint;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// Services for the faces: one labelled for another proxy, one with a TCP and an SCTP port, and a
/// LoadBalancer with externalTrafficPolicy Local, a node port, two ingress IPs (one ipMode Proxy) and two
/// externalIPs, endpoints on node-1 and node-2.
const SHOP: &str = "apiVersion: v1
kind: Service
metadata: {name: routed, namespace: shop, labels: {service.kubernetes.io/service-proxy-name: kube-router}}
spec: {clusterIP: 10.96.0.50, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: mixed, namespace: shop}
spec: {clusterIP: 10.96.0.51, ports: [{name: http, port: 80}, {name: sig, port: 9, protocol: SCTP}]}
---
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.52
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  externalIPs: [203.0.113.7, 198.18.0.7]
  ports: [{name: http, port: 80, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}, {ip: 198.51.100.8, ipMode: Proxy}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: edge-1, namespace: shop, labels: {kubernetes.io/service-name: edge}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.7], nodeName: node-1}
- {addresses: [10.244.2.7], nodeName: node-2}
---
apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {addresses: [{type: InternalIP, address: 192.0.2.11}]}
";

fn story() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/story").to_str().unwrap().to_owned()
}

/// Run `tierlb ARGS`: (exit code, stdout, stderr).
fn tierlb(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(TIERLB).args(args).output().expect("run tierlb");
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap(), text(out.stdout), text(out.stderr))
}

fn assert_lines(what: &str, out: &str, want: &[&str]) {
    for w in want {
        assert!(out.lines().any(|l| l.trim() == *w), "{what}: no line {w:?} in\n{out}");
    }
}

#[test]
fn explain_says_which_hints_apply_why_the_tier_the_fallbacks_and_the_errno() {
    let story = story();
    // pdf-resume's slices carry no hints: shown as they are, as kube-proxy reads them.
    let (code, out, _) =
        tierlb(&["explain", "booking/pdf-resume", "--node", "node-1", "--manifests", &story]);
    assert_eq!(code, 0, "{out}");
    assert_lines(
        "pdf-resume on node-1",
        &out,
        &[
            "its EndpointSlices carry no hints: shown as they are, as kube-proxy reads them (every endpoint); the agent plans with the hints the controller would write (metric reason hints_emulated): --emulate-hints shows that",
            "topology: requested PreferSameNode, applied cluster, reason no_node_hints (tierlb_service_topology)",
            "node hints not used: no ready endpoint carries a forNodes hint",
            "zone tier not used: no ready endpoint carries a forZones hint",
            "=> uses the cluster tier (all endpoints): 10.244.1.21:9000, 10.244.3.21:9000",
            "if every one is marked down: connect() fails at once with ECONNREFUSED (kube-proxy: REJECT)",
        ],
    );
    assert!(!out.contains("carry forNodes"), "no line claims hints the slices do not hold:\n{out}");
    // Asked for, the controller's hints are used and labelled wherever they show.
    let (code, out, _) = tierlb(&[
        "explain",
        "booking/pdf-resume",
        "--node",
        "node-1",
        "--manifests",
        &story,
        "--emulate-hints",
    ]);
    assert_eq!(code, 0, "{out}");
    assert_lines(
        "pdf-resume on node-1, emulated",
        &out,
        &[
            "topology: requested PreferSameNode, applied node, reason hints_emulated (tierlb_service_topology)",
            "node tier: all 2 ready endpoints carry emulated forNodes and 10.244.1.21 names node-1",
            "=> uses the node tier: 10.244.1.21:9000",
            "if those are marked down, the data path falls back to: cluster tier 10.244.1.21:9000, 10.244.3.21:9000",
        ],
    );
    assert!(out.contains("its EndpointSlices carry no hints: EMULATED below (--emulate-hints)"), "{out}");
    // A Local policy: its local set, falling back to a serving+terminating pod, and kube-proxy's DROP.
    let (_, out, _) = tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_lines(
        "nginx-cache on node-2",
        &out,
        &[
            "=> uses the local set: 10.244.2.10:8080",
            "if every one is marked down: connect() fails at once with EHOSTUNREACH (kube-proxy: DROP, the client would hang until its timeout)",
        ],
    );
    assert!(out.contains("warning: internalTrafficPolicy: Local overrides trafficDistribution"), "{out}");
    // A hint missing on one ready endpoint names it.
    let (_, out, _) = tierlb(&["explain", "booking/booking-api", "--node", "node-1", "--manifests", &story]);
    assert_lines("booking-api", &out, &["node hints not used: no ready endpoint carries a forNodes hint"]);
    let (code, _, err) = tierlb(&["explain", "booking/nope", "--node", "node-1", "--manifests", &story]);
    assert_eq!(code, 1);
    assert!(err.lines().any(|l| l.starts_with("tierlb: error: no Service booking/nope in ")), "{err}");
}

#[test]
fn explain_lists_external_destinations_what_is_not_translated_and_what_is_not_programmed() {
    let dir = TempDir::new("faces-explain").unwrap();
    std::fs::write(dir.path().join("shop.yaml"), SHOP).unwrap();
    let m = dir.path().to_str().unwrap();
    let explain = |svc: &str, extra: &[&str]| {
        let mut args = vec!["explain", svc, "--node", "node-1", "--manifests", m];
        args.extend(extra);
        let (code, out, err) = tierlb(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    let out = explain("shop/edge", &["--external-ip-cidrs", "203.0.113.0/24"]);
    assert_lines(
        "edge",
        &out,
        &[
            "node port 192.0.2.11:30080: translated for connects made on this node and for traffic from outside",
            "load-balancer IP 198.51.100.7:80: translated for connects made on this node and for traffic from outside",
            "external IP 203.0.113.7:80: translated for connects made on this node and for traffic from outside",
            "external IP 198.18.0.7: NOT translated, outside --external-ip-cidrs (203.0.113.0/24)",
            "load-balancer IP 198.51.100.8: NOT translated, ipMode Proxy: the load balancer proxies to the nodes, so connects must reach it (kube-proxy skips it too)",
            // From pods and the node: the cluster set; from outside under ETP Local: the local endpoint.
            "=> uses the cluster tier (all endpoints): 10.244.1.7:8080, 10.244.2.7:8080",
            "endpoints: 10.244.1.7:8080",
            "traffic arriving from outside the node (externalTrafficPolicy Local; translated per packet by the tc programs on the devices holding the node's NodePort addresses: this node's endpoints only, no source translation: the backend sees the client's address):",
        ],
    );
    assert_lines(
        "routed",
        &explain("shop/routed", &[]),
        &[
            "not programmed: labelled service.kubernetes.io/service-proxy-name=kube-router: meant for another proxy, as kube-proxy skips it",
        ],
    );
    let out = explain("shop/mixed", &[]);
    assert!(out.contains("port sig 9/SCTP: not programmed: "), "{out}");
    assert_lines(
        "mixed",
        &out,
        &[
            "=> uses no endpoint",
            "no endpoint to use: connect() fails at once with ECONNREFUSED (kube-proxy: REJECT)",
        ],
    );
}

#[test]
fn plan_table_has_a_row_per_port_and_family_and_lists_what_is_not_programmed() {
    let (code, out, _) = tierlb(&["plan", "--node", "node-2", "--manifests", &story(), "-o", "table"]);
    assert_eq!(code, 0);
    let table = &out[..out.find("\n\n").unwrap_or(out.len())];
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    let row = |cells: &[&str]| assert!(rows.iter().any(|r| r == cells), "no row {cells:?} in\n{out}");
    assert_eq!(rows[0], ["node", "node-2", "zone", "<none>"]);
    assert_eq!(rows[1][..6], ["SERVICE", "PORT", "VIPS", "POLICY", "TIER", "ENDPOINTS"]);
    let booking = "10.244.1.31:8080,10.244.2.31:8080,10.244.3.32:8081";
    row(&[
        "booking/booking-api:http",
        "80/TCP",
        "10.96.0.40",
        "Cluster",
        "cluster",
        booking,
        "-",
        "|",
        booking,
        "ECONNREFUSED(kube-proxy:REJECT)",
    ]);
    let v6 = "[fd00:244::1:31]:8080";
    let refused = "ECONNREFUSED(kube-proxy:REJECT)";
    row(&[
        "booking/booking-api:http",
        "80/TCP",
        "fd00:96::40",
        "Cluster",
        "cluster",
        v6,
        "-",
        "|",
        v6,
        refused,
    ]);
    // Node-2's cache pod is terminating: kube-proxy's fallback, marked; tierlb's errno beside kube-proxy's DROP.
    row(&[
        "booking/nginx-cache:http",
        "80/TCP",
        "10.96.0.20",
        "Local",
        "local",
        "10.244.2.10:8080(terminating)",
        "-",
        "|",
        "-",
        "EHOSTUNREACH(kube-proxy:DROP)",
    ]);
    let pdf = "10.244.1.21:9000,10.244.3.21:9000";
    row(&[
        "booking/pdf-resume:http",
        "80/TCP",
        "10.96.0.30",
        "Cluster",
        "cluster",
        pdf,
        "-",
        "|",
        pdf,
        refused,
    ]);
    assert_eq!(rows.len(), 6, "{out}");
    // The warnings the story needs are in the table's output, not only in JSON and explain.
    let warnings = &out[out.find("\nwarnings (").expect(&out)..];
    assert!(
        warnings.contains("\n  booking/nginx-cache:http internalTrafficPolicy: Local overrides trafficDistribution: PreferSameNode (dead line)"),
        "{out}"
    );
    let unhinted = &out[out.find("\nslices without the hints their Service asks for").expect(&out)..];
    assert_lines("unhinted", unhinted, &["booking/pdf-resume"]);
    // With --emulate-hints the tier says so.
    let (_, out, _) = tierlb(&["plan", "--node", "node-1", "--manifests", &story(), "--emulate-hints"]);
    let pdf: Vec<&str> =
        out.lines().find(|l| l.starts_with("booking/pdf-resume:http")).unwrap().split_whitespace().collect();
    assert_eq!(pdf[4..6], ["node(emulated-hints)", "10.244.1.21:9000"], "{out}");
    let (_, json, _) =
        tierlb(&["plan", "--node", "node-1", "--manifests", &story(), "--emulate-hints", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["hints_emulated"], serde_json::json!([{"namespace": "booking", "name": "pdf-resume"}]));
    // What is not programmed, under its own heading.
    let dir = TempDir::new("faces-plan").unwrap();
    std::fs::write(dir.path().join("shop.yaml"), SHOP).unwrap();
    let (_, out, _) = tierlb(&["plan", "--node", "node-1", "--manifests", dir.path().to_str().unwrap()]);
    let skipped = &out[out.find("\nnot programmed:\n").expect(&out)..];
    assert_lines(
        "not programmed",
        skipped,
        &[
            "shop/routed: labelled service.kubernetes.io/service-proxy-name=kube-router: meant for another proxy, as kube-proxy skips it",
        ],
    );
    assert!(skipped.contains("shop/mixed port sig 9/SCTP: protocol SCTP is not translated"), "{skipped}");
    let mixed: Vec<&str> =
        out.lines().find(|l| l.starts_with("shop/mixed:http")).unwrap().split_whitespace().collect();
    assert_eq!(mixed[4..], ["none", "-", "-", "|", "-", "now:ECONNREFUSED(kube-proxy:REJECT)"], "{out}");
}

#[test]
fn study_writes_json_with_every_model_per_phase_and_a_chart() {
    let dir = TempDir::new("faces-study").unwrap();
    let chart = dir.path().join("story.svg");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study/story.yaml");
    let (code, out, err) =
        tierlb(&["study", scenario.to_str().unwrap(), "-o", "json", "--chart", chart.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("wrote {}", chart.display())), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["requests_per_second"], 100.0);
    assert_eq!(
        v["health"],
        serde_json::json!({"failures": 3, "hold_s": 5.0, "max_hold_s": 120.0, "clients": 2})
    );
    let phases = v["phases"].as_array().unwrap();
    assert!(!phases.is_empty());
    let names = |phase: &serde_json::Value| -> Vec<String> {
        phase["models"].as_array().unwrap().iter().map(|m| m["model"].as_str().unwrap().to_owned()).collect()
    };
    // Every proxy model in every phase: kube-proxy's and tierlb's among them (the others are the study's to
    // choose; docs/cli.md names them).
    let models = names(&phases[0]);
    assert!(models.len() >= 5 && models.iter().any(|m| m.starts_with("kube-proxy")), "{models:?}");
    assert!(models.iter().any(|m| m == "tierlb"), "{models:?}");
    for phase in phases {
        assert!(phase.get("duration_s").is_some() && phase.get("requests").is_some(), "{phase}");
        assert_eq!(names(phase), models, "{phase}");
        for m in phase["models"].as_array().unwrap() {
            let shares: f64 = m["shares"].as_object().unwrap().values().map(|s| s.as_f64().unwrap()).sum();
            let lost = m["failed"].as_f64().unwrap() + m["hang"].as_f64().unwrap();
            assert!((shares + lost - 1.0).abs() < 1e-6, "every request accounted for: {m}");
            for k in ["cross_node", "cross_zone"] {
                assert!((0.0..=1.0).contains(&m[k].as_f64().unwrap()), "{k}: {m}");
            }
        }
    }
    let svg = std::fs::read_to_string(&chart).expect("--chart writes the file");
    assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
}

/// Per-Service counters as the data path's counter kinds would hold them: rejected 7, dropped 3.
struct Refusals;

impl ReadCounters for Refusals {
    fn counters(&self, svc_id: u32) -> Option<Counts> {
        let mut c = Counts::default();
        if svc_id != lb_common::GLOBAL_SVC_ID {
            c[lb_common::COUNTER_REJECTED as usize] = 7;
            c[lb_common::COUNTER_DROPPED as usize] = 3;
        }
        Some(c)
    }
}

/// The encoder alone: which counter index becomes which `reason`, which map capacity and error counter
/// which line, from values fed in. That real refusals are counted (REJECT and DROP from the kernel) is
/// `claims.rs`'s `tierlb_connections_refused_total by reason`, from connects.
#[test]
fn metrics_serve_refusals_by_reason_map_capacities_and_the_error_counters() {
    let mut desired = Desired::new();
    let key = addr::frontend_key([10, 96, 0, 10].into(), 80, 6);
    let b = addr::backend(SocketAddr::from(([10, 244, 1, 1], 8080)), 6);
    let name = ServicePortName::new(ObjKey::new("default", "web"), "http");
    desired.insert(
        key,
        DesiredFrontend {
            name: name.into(),
            tiers: [vec![], vec![], vec![b]],
            flags: 0,
            affinity_timeout_s: 0,
        },
    );
    let mut rec = Reconciler::new(FakeMaps::new(16, 64));
    rec.apply(&desired, Instant::now());
    let stats = AgentStats::default();
    stats.apply_errors.inc_by(2);
    stats.reload_errors.inc_by(4);
    stats.health_port_errors.inc();
    let text = encode_text(&Snapshot::of(&rec, 64), &stats, Some(&Refusals));
    let labels = r#"service="default/web",port="http",frontend="10.96.0.10:80""#;
    for want in [
        format!(r#"tierlb_connections_refused_total{{{labels},reason="no_endpoints"}} 7"#),
        format!(r#"tierlb_connections_refused_total{{{labels},reason="no_local_endpoint"}} 3"#),
        r#"tierlb_map_capacity{map="FRONTENDS"} 16"#.to_owned(),
        r#"tierlb_map_capacity{map="SLOTS"} 64"#.to_owned(),
        "tierlb_apply_errors_total 2".to_owned(),
        "tierlb_reload_errors_total 4".to_owned(),
        "tierlb_health_port_errors_total 1".to_owned(),
    ] {
        assert!(text.lines().any(|l| l == want), "no line {want:?} in\n{text}");
    }
}

/// Two Services on one cluster IP and port (manifests can say so), and one taking the other's as an
/// externalIP: the table marks the claims that are not programmed, and names who holds each.
const CONTESTED: &str = "apiVersion: v1
kind: Service
metadata: {name: a, namespace: shop}
spec: {clusterIP: 10.96.0.70, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: shop}
spec: {clusterIP: 10.96.0.70, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: c, namespace: shop}
spec: {clusterIP: 10.96.0.71, externalIPs: [10.96.0.70], ports: [{port: 80}]}
";

#[test]
fn plan_table_marks_the_services_not_programmed_on_a_contested_vip() {
    let dir = TempDir::new("faces-contested").unwrap();
    std::fs::write(dir.path().join("shop.yaml"), CONTESTED).unwrap();
    let (code, out, _) = tierlb(&["plan", "--node", "node-1", "--manifests", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let vips = |svc: &str| {
        let row = out.lines().find(|l| l.starts_with(svc)).unwrap_or_else(|| panic!("no {svc} in\n{out}"));
        row.split_whitespace().nth(2).unwrap().to_owned()
    };
    assert_eq!(vips("shop/a "), "10.96.0.70");
    assert_eq!(vips("shop/b "), "10.96.0.70(not-programmed)");
    assert_eq!(vips("shop/c "), "10.96.0.71");
    let section = &out[out.find("\ncontested VIP:ports (").expect(&out)..];
    let lines: Vec<&str> = section.lines().skip(2).take_while(|l| !l.is_empty()).map(str::trim).collect();
    assert_eq!(
        lines,
        [
            "shop/b 10.96.0.70:80/TCP: NOT programmed until shop/a leaves it",
            "shop/c 10.96.0.70:80/TCP: NOT programmed until shop/a leaves it",
        ],
        "{out}"
    );
}

/// One lint input case: what it is, the files written, what it is based on (`story*`, `missing`, or nothing),
/// the exit status wanted and what stderr must say.
type LintCase<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, i32, &'a str);

/// A `--node` that no Node object and no endpoint of the source names is planned (as a node with no local
/// endpoint) with a warning that says so and names the node it is likely a typo of.
#[test]
fn a_node_the_source_does_not_know_is_named_with_the_closest_known_one() {
    let story = story();
    let cases: &[(&[&str], &str)] = &[
        (&["plan", "--node", "node-9", "-o", "json"], "did you mean node-1?"),
        (&["explain", "booking/nginx-cache", "--node", "nod-2"], "did you mean node-2?"),
        (&["plan", "--node", "worker-7"], "(nodes there: node-1, node-2, node-3)"),
        (&["plan", "--node", "node-2"], ""),
    ];
    for (args, says) in cases {
        let mut args = args.to_vec();
        args.extend(["--manifests", &story]);
        let (code, out, err) = tierlb(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        // In the answer itself (the table's warnings, explain's lines, JSON's node_warnings), not on stderr.
        let warned: Vec<String> = if args.contains(&"json") {
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let ws = v["node_warnings"].as_array().cloned().unwrap_or_default();
            ws.iter().map(|w| format!("unknown-node: {}", w.as_str().unwrap())).collect()
        } else {
            out.lines().filter(|l| l.contains("unknown-node: ")).map(|l| l.trim().to_owned()).collect()
        };
        assert!(!err.contains("is in no Node object"), "{args:?}: said once, in the answer: {err}");
        if says.is_empty() {
            assert!(warned.is_empty(), "{args:?}: a known node gets no warning: {warned:?}");
        } else {
            assert_eq!(warned.len(), 1, "{args:?}: {out}");
            let w = &warned[0];
            assert!(
                w.contains("unknown-node: node ")
                    && w.contains("is in no Node object and no endpoint of the source")
                    && w.ends_with(says),
                "{w}"
            );
        }
    }
}

/// `--manifests` takes what its help says: a directory, one file (a `kubectl get ... -o yaml` dump), or `-`
/// for standard input; the three give the same answers for the same objects.
#[test]
fn manifests_is_a_directory_a_file_or_standard_input() {
    let tmp = TempDir::new("faces-one-file").unwrap();
    let dump = tmp.path().join("dump.yaml");
    let mut text = String::new();
    let mut files: Vec<_> = std::fs::read_dir(story()).unwrap().map(|f| f.unwrap().path()).collect();
    files.sort();
    for f in files {
        text.push_str("---\n");
        text.push_str(&std::fs::read_to_string(f).unwrap());
    }
    std::fs::write(&dump, &text).unwrap();
    for args in [&["lint"][..], &["plan", "--node", "node-2", "-o", "json"]] {
        let from = |source: &str, stdin: Option<&str>| {
            let mut cmd = Command::new(TIERLB);
            cmd.args(args).args(["--manifests", source]);
            cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            let mut input = child.stdin.take().unwrap();
            if let Some(t) = stdin {
                std::io::Write::write_all(&mut input, t.as_bytes()).unwrap();
            }
            drop(input);
            let out = child.wait_with_output().unwrap();
            (out.status.code(), String::from_utf8(out.stdout).unwrap())
        };
        let dir = from(&story(), None);
        assert!(!dir.1.is_empty(), "{args:?}");
        assert_eq!(from(dump.to_str().unwrap(), None), dir, "{args:?} from one file");
        assert_eq!(from("-", Some(&text)), dir, "{args:?} from standard input");
    }
}

/// `tierlb --version` names the release, the commit and the pinned maps' layout number, which an upgrade is
/// judged by (CHANGELOG.md says which releases change it).
#[test]
fn version_names_the_release_the_commit_and_the_map_layout() {
    let (code, out, _) = tierlb(&["--version"]);
    let want = format!("tierlb {} (commit ", env!("CARGO_PKG_VERSION"));
    let layout = format!(", map layout {})", tierlb::datapath::MAP_LAYOUT);
    assert!(code == 0 && out.starts_with(&want) && out.trim_end().ends_with(&layout), "{out}");
}
