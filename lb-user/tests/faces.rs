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
fn the_faces_speak_kubectl_namespaces_output_formats_all_nodes_and_empty_lists() {
    let story = story();
    // explain NAME -n NS, as kubectl; NS/NAME alone; a contradiction is a usage error naming both.
    let (code, by_n, _) =
        tierlb(&["explain", "-n", "booking", "nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_eq!(code, 0, "{by_n}");
    let (_, by_key, _) =
        tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_eq!(by_n, by_key);
    let (code, _, err) =
        tierlb(&["explain", "-n", "shop", "booking/nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_eq!(code, 1);
    assert!(err.contains("--namespace shop does not hold Service booking/nginx-cache"), "{err}");
    // explain -o json|yaml: the Service's port plans with their warnings, as plan -o json has them.
    let (code, json, _) =
        tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story, "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ports = v["services"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "only the Service asked for: {json}");
    assert_eq!(ports[0]["internal"]["endpoints"], serde_json::json!(["10.244.2.10:8080"]));
    assert!(ports[0]["warnings"][0].as_str().unwrap().contains("dead line"), "{json}");
    let (_, yaml, _) =
        tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story, "-o", "yaml"]);
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(from_yaml, v, "YAML holds what JSON does");
    // plan -o wide: READY and TOPOLOGY columns, as the agent's metric says them.
    let (_, wide, _) = tierlb(&["plan", "--node", "node-1", "--manifests", &story, "-o", "wide"]);
    let header: Vec<&str> =
        wide.lines().nth(1).unwrap().split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(header[header.len() - 2..], ["READY", "TOPOLOGY (requested:applied:reason)"], "{wide}");
    let cache: Vec<&str> = wide
        .lines()
        .find(|l| l.starts_with("booking/nginx-cache:http"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(cache[cache.len() - 2..], ["2/3,local=1", "Local:local:local_policy_overrides_distribution"]);
    // plan --all-nodes: one table, NODE first, a row per node and port.
    let (code, all, _) = tierlb(&["plan", "--all-nodes", "--manifests", &story]);
    assert_eq!(code, 0);
    let cache_rows: Vec<Vec<&str>> = all
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|r| r.get(1) == Some(&"booking/nginx-cache:http"))
        .collect();
    let by_node: Vec<(&str, &str)> = cache_rows.iter().map(|r| (r[0], r[6])).collect();
    assert_eq!(
        by_node,
        [
            ("node-1", "10.244.1.10:8080"),
            ("node-2", "10.244.2.10:8080(terminating)"),
            ("node-3", "10.244.3.10:8080")
        ],
        "{all}"
    );
    let (_, json, _) = tierlb(&["plan", "--all-nodes", "--manifests", &story, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let nodes: Vec<&str> = v.as_array().unwrap().iter().map(|p| p["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"]);
    // A namespace with nothing: kubectl's sentence, no table, exit 0.
    let (code, out, err) = tierlb(&["plan", "--node", "node-1", "--manifests", &story, "-n", "nope"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(err.lines().any(|l| l.starts_with("No resources found in ")), "{err}");
    assert!(!err.contains("pdf-resume"), "notes about other namespaces' Services are not said: {err}");
}

#[test]
fn completion_and_man_pages_are_generated_from_the_command_line() {
    // bash completes a subcommand and a flag from the script `tierlb completion bash` prints.
    let complete = |words: &str| {
        let script = format!(
            "source <({TIERLB} completion bash); COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _tierlb tierlb \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; echo \"${{COMPREPLY[@]}}\""
        );
        let out = Command::new("bash").args(["-c", &script]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(complete("tierlb pl"), "plan");
    assert_eq!(complete("tierlb plan --all-n"), "--all-nodes");
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let (code, out, _) = tierlb(&["completion", shell]);
        assert!(code == 0 && out.contains("explain"), "{shell}: {out}");
    }
    // A page for tierlb listing every command, and one per command with its flags.
    let (code, page, _) = tierlb(&["man"]);
    assert_eq!(code, 0);
    assert!(page.contains(".TH tierlb 1"), "{page}");
    for cmd in ["agent", "plan", "explain", "lint", "study", "status", "backend", "trace", "completion"] {
        assert!(page.contains(&format!("tierlb\\-{cmd}(1)")), "tierlb(1) lists {cmd}:\n{page}");
    }
    let (_, plan, _) = tierlb(&["man", "plan"]);
    assert!(plan.contains(".TH tierlb-plan 1") && plan.contains("\\-\\-all\\-nodes"), "{plan}");
    let (code, _, err) = tierlb(&["man", "plna"]);
    assert_eq!(code, 1);
    assert!(err.contains("no command plna: one of agent, plan"), "{err}");
}

/// Every command's path (`[]`, `["plan"]`, `["backend", "down"]`), from the command line's definition.
fn command_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, path: &[String], out: &mut Vec<Vec<String>>) {
        out.push(path.to_vec());
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut p = path.to_vec();
            p.push(sub.get_name().to_owned());
            walk(sub, &p, out);
        }
    }
    let mut out = Vec::new();
    walk(&<tierlb::cli::Cli as clap::CommandFactory>::command(), &[], &mut out);
    out
}

/// docs/cli-reference.md: every command's `--help`, as the binary prints it (`TIERLB_BLESS=1` rewrites it),
/// and every long flag of every command named in docs/cli.md, so neither drifts from the command line.
#[test]
fn the_cli_docs_match_every_commands_help() {
    let mut reference = String::from(
        "# tierlb command line reference\n\nGenerated from the binary: each command's `--help` (a test checks it \
         and `TIERLB_BLESS=1` rewrites it). [cli.md](cli.md) explains each command.\n",
    );
    let cli_md =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md")).unwrap();
    let mut undocumented = Vec::new();
    for path in command_paths() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out =
            Command::new(TIERLB).args(&args).env_remove(tierlb::datapath::pins::BPFFS_ENV).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let help = String::from_utf8(out.stdout).unwrap();
        let name =
            std::iter::once("tierlb").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ");
        let _ = write!(reference, "\n## `{name}`\n\n```\n{}\n```\n", help.trim_end());
        for flag in help.split_whitespace().filter_map(|w| w.strip_prefix("--")) {
            let flag = flag.trim_end_matches([',', '.', ')', ':', ';', ']']);
            let flag = flag.split(['=', '<', '[']).next().unwrap();
            if flag.len() > 1
                && !["help", "version"].contains(&flag)
                && !cli_md.contains(&format!("--{flag}"))
            {
                undocumented.push(format!("{name} --{flag}"));
            }
        }
    }
    undocumented.sort();
    undocumented.dedup();
    assert!(undocumented.is_empty(), "flags docs/cli.md never names:\n{}", undocumented.join("\n"));
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli-reference.md");
    if std::env::var_os("TIERLB_BLESS").is_some() {
        std::fs::write(&file, &reference).unwrap();
    }
    let written = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        written == reference,
        "docs/cli-reference.md differs from the commands' --help: run `TIERLB_BLESS=1 cargo nextest run -E \
         'test(the_cli_docs_match)'` and commit it"
    );
}

#[test]
fn status_names_a_missing_bpffs_once_with_the_fix() {
    let (code, _, err) = tierlb(&["status", "--bpffs", "/nonexistent/tierlb"]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim_end(),
        "tierlb: error: --bpffs /nonexistent/tierlb: no such directory, so no agent pins there: pass the agent's \
         --bpffs, or set TIERLB_BPFFS to it (the DaemonSet's pod has it set)"
    );
    let (code, _, err) = tierlb(&["plan", "--node", "n", "--kube", "--kubeconfig", "/nonexistent/config"]);
    assert_eq!(code, 1);
    assert_eq!(err.matches("No such file or directory").count(), 1, "each cause once: {err}");
}

#[test]
fn study_writes_json_with_every_model_per_phase_and_a_chart() {
    let dir = TempDir::new("faces-study").unwrap();
    let chart = dir.path().join("story.svg");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study/story.yaml");
    let (code, out, err) =
        tierlb(&["study", scenario.to_str().unwrap(), "-o", "json", "--chart", chart.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["requests_per_second"], 100.0);
    assert_eq!(v["health"], serde_json::json!({"failures": 3, "hold_s": 5.0, "max_hold_s": 120.0}));
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

/// A cluster with each pitfall `tierlb lint` knows once, and a clean Service in namespace `ok`: two nodes in
/// one zone.
fn lint_fixture(dir: &Path) {
    use lb_testkit::manifests::{Ep, Svc, node, to_yaml, write_atomic, write_service};
    let ip = |s: &str| s.parse().unwrap();
    write_atomic(dir, "nodes.yaml", &to_yaml(&[node("node-1", Some("a")), node("node-2", Some("a"))]))
        .unwrap();
    let ep = |a: &str, n: &str| Ep::ready(ip(a), n).zone("a");
    let svc = |name: &str, vip: &str, td: Option<&str>| {
        let mut s = Svc::new(name, ip(vip), 80, 8080);
        s.traffic_distribution = td.map(str::to_owned);
        s
    };
    let both = |x: u8| [ep(&format!("10.0.{x}.1"), "node-1"), ep(&format!("10.0.{x}.2"), "node-2")];
    let hinted = |x: u8| both(x).map(Ep::prefer_same_node);
    let mut dead = svc("dead", "10.96.0.1", Some("PreferSameNode"));
    dead.internal_traffic_policy = Some("Local");
    write_service(dir, &dead, &hinted(1)).unwrap();
    let auto = svc("auto", "10.96.0.2", Some("PreferSameNode"));
    let mut docs = vec![auto.service()];
    docs[0]["metadata"]["annotations"] = serde_json::json!({"service.kubernetes.io/topology-mode": "Auto"});
    docs.extend(auto.slices(&both(2).map(|e| e.hints(None, Some(&["a"])))));
    write_atomic(dir, "auto.yaml", &to_yaml(&docs)).unwrap();
    write_service(dir, &svc("unknown", "10.96.0.3", Some("PreferNearby")), &both(3)).unwrap();
    write_service(dir, &svc("close", "10.96.0.4", Some("PreferClose")), &hinted(4)).unwrap();
    write_service(dir, &svc("bare", "10.96.0.5", Some("PreferSameNode")), &both(5)).unwrap();
    let [h, u] = both(6);
    write_service(dir, &svc("half", "10.96.0.6", Some("PreferSameNode")), &[h.prefer_same_node(), u])
        .unwrap();
    write_service(
        dir,
        &svc("skew", "10.96.0.7", Some("PreferSameNode")),
        &[ep("10.0.7.1", "node-1").prefer_same_node()],
    )
    .unwrap();
    let mut local = svc("local", "10.96.0.8", None);
    local.internal_traffic_policy = Some("Local");
    write_service(dir, &local, &[ep("10.0.8.1", "node-1")]).unwrap();
    write_service(dir, &svc("vip-a", "10.96.0.9", None), &both(9)).unwrap();
    write_service(dir, &svc("vip-b", "10.96.0.9", None), &both(10)).unwrap();
    let mut clean = svc("clean", "10.96.0.11", None);
    clean.namespace = "ok".into();
    write_service(dir, &clean, &both(11)).unwrap();
}

/// The story's cache Service on a control plane that wrote zone hints only (`zoned`), and one whose slices
/// lost `forNodes` on two of three endpoints (`partial`); every endpoint names its pod.
const HINTLESS: &str = r"
apiVersion: v1
kind: Service
metadata: {name: zoned, namespace: booking}
spec: {clusterIP: 10.96.0.50, trafficDistribution: PreferSameNode, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: zoned-1, namespace: booking, labels: {kubernetes.io/service-name: zoned}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [10.244.1.50], nodeName: node-1, zone: a, hints: {forZones: [{name: a}]}, targetRef: {kind: Pod, namespace: booking, name: zoned-x1}}
  - {addresses: [10.244.2.50], nodeName: node-2, zone: a, hints: {forZones: [{name: a}]}, targetRef: {kind: Pod, namespace: booking, name: zoned-x2}}
  - {addresses: [10.244.3.50], nodeName: node-3, zone: a, hints: {forZones: [{name: a}]}, targetRef: {kind: Pod, namespace: booking, name: zoned-x3}}
---
apiVersion: v1
kind: Service
metadata: {name: partial, namespace: booking}
spec: {clusterIP: 10.96.0.51, trafficDistribution: PreferSameNode, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: partial-1, namespace: booking, labels: {kubernetes.io/service-name: partial}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [10.244.1.51], nodeName: node-1, zone: a, hints: {forNodes: [{name: node-1}], forZones: [{name: a}]}, targetRef: {kind: Pod, namespace: booking, name: partial-y1}}
  - {addresses: [10.244.2.51], nodeName: node-2, zone: a, hints: {forZones: [{name: a}]}, targetRef: {kind: Pod, namespace: booking, name: partial-y2}}
  - {addresses: [10.244.3.51], nodeName: node-3, zone: a, hints: {forZones: [{name: a}]}, targetRef: {kind: Pod, namespace: booking, name: partial-y3}}
";

#[test]
fn lint_names_every_endpoint_without_for_nodes_with_its_node_and_pod() {
    let dir = TempDir::new("faces-hintless").unwrap();
    let file = dir.path().join("hintless.yaml");
    std::fs::write(&file, HINTLESS).unwrap();
    let (code, out, err) = tierlb(&["lint", "--manifests", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    let line = |svc: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("booking/{svc} port http: node-hints-missing [all 3 nodes]: ")))
            .unwrap_or_else(|| panic!("no node-hints-missing line for {svc} in\n{out}"))
    };
    assert!(
        line("zoned").contains(
            "3 of 3 ready endpoints carry no forNodes hint (forZones only): 10.244.1.50 (node node-1, pod \
             booking/zoned-x1), 10.244.2.50 (node node-2, pod booking/zoned-x2), 10.244.3.50 (node node-3, pod \
             booking/zoned-x3): node hints apply only when every ready endpoint has one"
        ),
        "{out}"
    );
    assert!(
        line("partial").contains(
            "2 of 3 ready endpoints carry no forNodes hint (forZones only): 10.244.2.51 (node node-2, pod \
             booking/partial-y2), 10.244.3.51 (node node-3, pod booking/partial-y3):"
        ),
        "{out}"
    );
    // explain names both too.
    let (_, out, _) =
        tierlb(&["explain", "booking/partial", "--node", "node-1", "--manifests", file.to_str().unwrap()]);
    assert!(out.contains("10.244.2.51 (node node-2, pod booking/partial-y2), 10.244.3.51 (node node-3, pod booking/partial-y3)"), "{out}");
}

/// The story with a misspelt field on pdf-resume and a misspelt trafficDistribution value on the cache.
fn story_with_typos(dir: &Path) {
    for f in std::fs::read_dir(story()).unwrap() {
        let f = f.unwrap().path();
        let text = std::fs::read_to_string(&f).unwrap();
        let text = text
            .replace("  trafficDistribution: PreferSameNode\n  ports: [{name: http, port: 80, targetPort: 9000", "  trafficDistribution: PreferSameNode\n  sessionAfinity: ClientIP\n  ports: [{name: http, port: 80, targetPort: 9000")
            .replace("internalTrafficPolicy: Local\n  trafficDistribution: PreferSameNode\n", "internalTrafficPolicy: Local\n  trafficDistribution: PreferSameNodes\n");
        std::fs::write(dir.join(f.file_name().unwrap()), text).unwrap();
    }
}

#[test]
fn lint_reports_a_misspelt_field_or_value_as_a_finding_with_did_you_mean_and_its_line() {
    let tmp = TempDir::new("faces-typos").unwrap();
    story_with_typos(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let (code, out, err) = tierlb(&["lint", "--manifests", dir]);
    assert_eq!(code, 1, "{out}{err}");
    let field = format!(
        "booking/pdf-resume: unknown-field [all 3 nodes]: {dir}/pdf-resume.yaml:5 document 1 (Service pdf-resume) \
         field spec.sessionAfinity: unknown field \"sessionAfinity\", ignored: did you mean \"sessionAffinity\"?"
    );
    assert!(out.lines().any(|l| l.starts_with(&field)), "no {field:?} in\n{out}");
    assert!(
        out.contains(
            "booking/nginx-cache port http: unknown-distribution [all 3 nodes]: unknown trafficDistribution value \
             \"PreferSameNodes\": did you mean PreferSameNode? "
        ),
        "{out}"
    );
    // An unknown value is no fallback that the Local policy hides: no dead-line advice to get it.
    assert!(!out.contains("nginx-cache port http: dead-local-line"), "{out}");
    let (_, json, _) = tierlb(&["lint", "--manifests", dir, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rules: Vec<&str> = v.as_array().unwrap().iter().map(|f| f["rule"].as_str().unwrap()).collect();
    assert!(rules.contains(&"unknown-field"), "{json}");
}

/// The skew `lint` reports is `study`'s figure: 1.33x for the cache example's zoned cluster, and nothing for
/// the story's pdf-resume, whose two replicas take 50/50 with equal clients per node (study's default).
#[test]
fn lint_reports_the_skew_study_computes_and_only_above_its_threshold() {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cache");
    let cache = cache.to_str().unwrap();
    for (dir, service) in [(cache, "booking/nginx-cache"), (story().as_str(), "booking/pdf-resume")] {
        let (_, json, err) = tierlb(&["study", "--manifests", dir, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {err}"));
        let study = v["services"].as_array().unwrap().iter().find(|s| s["service"] == service).unwrap();
        let k = study["skew"]["prefer_same_node"].as_f64().unwrap();
        let (_, out, _) = tierlb(&["lint", "--manifests", dir]);
        let line =
            out.lines().find(|l| l.starts_with(&format!("{service} port http: prefer-same-node-skew")));
        if k > tierlb::lint::MAX_SKEW {
            let line = line.unwrap_or_else(|| panic!("study says {k}, lint says nothing:\n{out}"));
            assert!(line.contains(&format!("the busiest {k:.2}x an even share")), "{line}");
        } else {
            assert!(line.is_none(), "study says {k}, not skewed:\n{out}");
        }
        assert!(!out.contains("50/30/20"), "no fixed figure of another cluster:\n{out}");
    }
}

#[test]
fn lint_judges_every_service_across_the_nodes_names_the_rule_the_nodes_and_the_fix_and_exits_1() {
    let tmp = TempDir::new("faces-lint").unwrap();
    lint_fixture(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let (code, out, err) = tierlb(&["lint", "--manifests", dir]);
    assert_eq!(code, 1, "{out}{err}");
    // (Service, rule, nodes) of each finding, from the table's lines.
    let all = "all 2 nodes";
    let want = [
        ("default/dead port main", "dead-local-line", all),
        ("default/auto port main", "annotation-overrides-field", all),
        ("default/unknown port main", "unknown-distribution", all),
        ("default/close port main", "deprecated-prefer-close", all),
        ("default/close", "one-zone", all),
        ("default/bare port main", "no-hints", all),
        ("default/half port main", "node-hints-missing", all),
        ("default/local port main", "no-local-endpoint", "node-2"),
        ("default/vip-a port main", "vip-conflict", all),
        ("default/vip-b port main", "vip-conflict", all),
    ];
    for (svc, rule, nodes) in want {
        let head = format!("{svc}: {rule} [{nodes}]: ");
        assert!(out.lines().any(|l| l.starts_with(&head) && l.contains("; fix: ")), "no {head:?} in\n{out}");
    }
    assert_eq!(out.lines().count(), want.len(), "one line per finding, nothing else:\n{out}");
    assert!(!out.contains("ok/clean"), "{out}");
    // One endpoint on two nodes takes every client: no endpoint is busier than another.
    assert!(!out.contains("default/skew"), "{out}");
    let (code, json, _) = tierlb(&["lint", "--manifests", dir, "-o", "json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let local = v.as_array().unwrap().iter().find(|f| f["rule"] == "no-local-endpoint").unwrap();
    assert_eq!(local["service"], serde_json::json!({"namespace": "default", "name": "local"}));
    assert_eq!(local["nodes"], serde_json::json!(["node-2"]));
    assert_eq!(local["all_nodes"], false);
    assert!(local["fix"].as_str().unwrap().contains("DaemonSet"), "{local}");
    let (code, out, _) = tierlb(&["lint", "--manifests", dir, "--namespace", "ok"]);
    assert_eq!((code, out.as_str()), (0, "no findings (2 nodes)\n"));
    let (code, _, err) = tierlb(&["lint", "--namespace", "ok"]);
    assert_eq!(code, 2, "usage: {err}");
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

/// `tierlb lint` as a CI gate: input it cannot read whole is exit 3 (as `plan`'s invalid input), never a pass,
/// and beats findings (whose lines are still printed); findings alone 1; a usage error 2.
#[test]
fn lint_exits_3_on_input_it_cannot_read_whole_and_never_passes_it() {
    let tmp = TempDir::new("faces-lint-input").unwrap();
    let story = story();
    let bad_service = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n\
                       spec:\n  clusterIP: 10.96.0.020\n  ports: [{port: 80000}]\n";
    let cases: &[LintCase] = &[
        ("a file with a YAML error, alone", &[("bad.yaml", "a: [1, 2\nb: 3\n")], "", 3, "error:"),
        ("clusterIP 10.96.0.020 and port 80000", &[("web.yaml", bad_service)], "", 3, "error:"),
        ("an empty directory", &[], "", 3, "no Service in --manifests"),
        ("the story beside a file with a YAML error", &[("bad.yaml", "a: [1, 2\n")], "story", 3, "error:"),
        ("a namespace with no Service", &[], "story-nope", 3, "no Service in --manifests"),
        ("a missing directory", &[], "missing", 3, "cannot read the directory"),
        ("the story", &[], "story-only", 1, ""),
    ];
    for (i, (what, files, base, want, says)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("case-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        if base.starts_with("story") {
            for f in std::fs::read_dir(&story).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
            }
        }
        for (name, text) in *files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let path = if *base == "missing" { tmp.path().join("no-such-dir") } else { dir };
        let mut args = vec!["lint", "--manifests", path.to_str().unwrap()];
        if *base == "story-nope" {
            args.extend(["--namespace", "nope"]);
        }
        let (code, out, err) = tierlb(&args);
        assert_eq!(code, *want, "{what}: exit {code}\nstdout: {out}\nstderr: {err}");
        assert!(err.contains(says), "{what}: stderr says {err:?}");
        if base.starts_with("story") && *base != "story-nope" {
            assert!(
                out.contains("dead-local-line"),
                "{what}: the findings of what was read are printed: {out}"
            );
        }
    }
    let (code, _, err) = tierlb(&["lint"]);
    assert_eq!(code, 2, "no source is a usage error: {err}");
}

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
        let (code, _, err) = tierlb(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let warned = err.lines().find(|l| l.starts_with("warning: node "));
        if says.is_empty() {
            assert_eq!(warned, None, "{args:?}: a known node gets no warning");
        } else {
            let w = warned.unwrap_or_else(|| panic!("{args:?}: no warning in {err}"));
            assert!(
                w.contains("is in no Node object and no endpoint of the source") && w.ends_with(says),
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
