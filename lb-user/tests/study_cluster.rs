//! `tierlb study --manifests DIR` (a whole cluster): the story's cluster with its clients where they are, the
//! shares computed by hand from each proxy's rule; client shares from a file, from two agents' `status -o
//! json` merged, or uniform, and said which; the what-ifs (`--drain`, `--crash`, `--roll`) each from the
//! cluster as it is; and the errors a user can make. (`--kube` against the strict API-server mock:
//! tests/kube_mock/faces.rs; the agents' pinned counters with `--clients-from`: tests/kernel.rs.)
use std::path::{Path, PathBuf};

use lb_testkit::sandbox::TempDir;
use serde_json::Value;
use tierlb::cli::{Cli, Command, run_study};

fn root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/study/fixtures").join(name).display().to_string()
}

/// Run `tierlb study ARGS...` in-process; the error's text on failure.
fn study(flags: &[&str]) -> Result<String, String> {
    let mut argv = vec!["tierlb".to_owned(), "study".to_owned()];
    argv.extend(flags.iter().map(|a| (*a).to_owned()));
    let Command::Study(s) = Cli::try_parse_from_args(&argv).map_err(|e| e.to_string())?.command else {
        unreachable!()
    };
    run_study(&s).map_err(|e| format!("{e:#}"))
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&study(&a).unwrap()).unwrap()
}

fn clients_50_30_20() -> TempDir {
    let d = TempDir::new("study-clients").unwrap();
    std::fs::write(d.path().join("clients.yaml"), "nodes: {node-1: 50, node-2: 30, node-3: 20}\n").unwrap();
    d
}

fn service<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["service"] == name)
        .unwrap_or_else(|| panic!("{name}"))
}

/// A model's result in phase `phase` of a Service.
fn model<'a>(svc: &'a Value, phase: usize, name: &str) -> &'a Value {
    let p = &svc["study"]["phases"][phase];
    p["models"].as_array().unwrap().iter().find(|m| m["model"] == name).unwrap_or_else(|| panic!("{name}"))
}

fn close(v: &Value, want: f64, what: &str) {
    let got = v.as_f64().unwrap_or_else(|| panic!("{what}: {v}"));
    assert!((got - want).abs() < 1e-9, "{what}: {got}, want {want}");
}

const STORY: &str = "examples/story";

/// The story's PDF service: two replicas (node-1, node-3) on three nodes, PreferSameNode, no zone label;
/// clients 50/30/20. kube-proxy (and tierlb): node-1's and node-3's clients stay local, node-2 has no local
/// endpoint, no zone hints name a zone, so it spreads over both: 10.244.1.21 gets 50 + 15 = 65%, 10.244.3.21
/// 20 + 15 = 35%, and only node-2's 30% cross nodes. Cilium 1.11-1.19 ignore forNodes (and there is no
/// zone): every node spreads over both, 50/50, and half of node-1's and node-3's clients plus all of node-2's
/// cross nodes: 25 + 30 + 10 = 65%.
#[test]
fn the_story_cluster_with_clients_50_30_20_gives_the_pdf_service_65_35_and_cilium_1_18_50_50() {
    let d = clients_50_30_20();
    let clients = d.path().join("clients.yaml");
    let c = json(&["--manifests", root(STORY).to_str().unwrap(), "--clients", clients.to_str().unwrap()]);
    let pdf = service(&c, "booking/pdf-resume");
    assert!(pdf["clients"].as_str().unwrap().contains("for every Service"), "{}", pdf["clients"]);
    for m in ["kube-proxy-1.34-1.37", "tierlb"] {
        let r = model(pdf, 0, m);
        close(&r["shares"]["10.244.1.21"], 0.65, m);
        close(&r["shares"]["10.244.3.21"], 0.35, m);
        close(&r["cross_node"], 0.30, m);
    }
    for m in ["cilium-1.18.0", "cilium-1.18.1", "cilium-1.18.x-1.19", "cilium-1.16-1.17", "cilium-1.11-1.15"]
    {
        let r = model(pdf, 0, m);
        close(&r["shares"]["10.244.1.21"], 0.5, m);
        close(&r["shares"]["10.244.3.21"], 0.5, m);
        close(&r["cross_node"], 0.65, m);
    }
    // The line that says why: the hints taken away, their figures did not move, kube-proxy's did.
    let lines: Vec<(Vec<String>, String)> = pdf["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (serde_json::from_value(d["models"].clone()).unwrap(), d["why"].as_str().unwrap().to_owned())
        })
        .collect();
    let (models, why) = lines.iter().find(|(m, _)| m.contains(&"cilium-1.18.0".to_owned())).unwrap();
    assert_eq!(why, "ignores forNodes: 65% of requests cross nodes instead of 30%");
    assert!(
        !models.contains(&"tierlb".to_owned()) && !models.contains(&"cilium-1.20".to_owned()),
        "{models:?}"
    );
    // Skew: 65% over an even 50% is 1.30x, named in the summary (above the default 1.25x).
    close(&pdf["skew"]["prefer_same_node"], 1.3, "skew");
    let skewed = c["summary"]["skewed"].as_array().unwrap();
    assert!(skewed.iter().any(|s| s[0] == "booking/pdf-resume" && s[2] == true), "{skewed:?}");
    // Services some model serves differently come first.
    let order: Vec<&str> =
        c["services"].as_array().unwrap().iter().map(|s| s["service"].as_str().unwrap()).collect();
    assert_eq!(order.last(), Some(&"booking/booking-api"), "{order:?}");
    // The table says the same.
    let t = study(&["--manifests", root(STORY).to_str().unwrap(), "--clients", clients.to_str().unwrap()])
        .unwrap();
    assert!(t.contains("ignores forNodes: 65% of requests cross nodes instead of 30%"), "{t}");
    assert!(t.contains("clients: node-1 50%, node-2 30%, node-3 20%"), "{t}");
}

#[test]
fn without_clients_the_shares_are_uniform_over_the_nodes_and_said_so() {
    let c = json(&["--manifests", root(STORY).to_str().unwrap(), "--service", "booking/pdf-resume"]);
    assert_eq!(c["services"].as_array().unwrap().len(), 1);
    let pdf = service(&c, "booking/pdf-resume");
    assert_eq!(pdf["clients"], "uniform over 3 nodes: no --clients");
    // Uniform: node-2's third splits: 1/3 + 1/6 = 50% each.
    close(&model(pdf, 0, "kube-proxy-1.34-1.37")["shares"]["10.244.1.21"], 0.5, "uniform");
}

/// Two agents' `status -o json` (node-1's; node-2's and node-3's in one file), merged: per Service, the connects
/// each node's agent counted on its "connect" frontends (any port, family or node address; refused ones
/// too), "outside" frontends (traffic from other machines) left out. pdf-resume: node-1 400 + 90 + 10 = 500,
/// node-2 250 + 50 = 300, node-3 200: 50/30/20, so 65/35 as from the clients file.
#[test]
fn shares_from_two_agents_status_outputs_are_merged_as_written() {
    let (one, two) = (fixture("status-node-1.json"), fixture("status-node-2-3.json"));
    let c = json(&["--manifests", root(STORY).to_str().unwrap(), "--clients", &one, "--clients", &two]);
    let pdf = service(&c, "booking/pdf-resume");
    close(&pdf["client_shares"]["node-1"], 0.5, "node-1");
    close(&pdf["client_shares"]["node-2"], 0.3, "node-2");
    close(&pdf["client_shares"]["node-3"], 0.2, "node-3");
    let source = pdf["clients"].as_str().unwrap();
    assert!(source.starts_with("counted: 1000 connects (node-1 500, node-2 300, node-3 200)"), "{source}");
    close(&model(pdf, 0, "kube-proxy-1.34-1.37")["shares"]["10.244.1.21"], 0.65, "kube-proxy");
    // Counted by node-1 only: all of its clients are there.
    let cache = service(&c, "booking/nginx-cache");
    close(&cache["client_shares"]["node-1"], 1.0, "cache node-1");
    close(&cache["client_shares"]["node-2"], 0.0, "cache node-2");
    // Counted by nobody: uniform, and said why.
    let api = service(&c, "booking/booking-api");
    assert_eq!(api["clients"], "uniform over 3 nodes: the agents of 3 nodes counted no connect to it");
    // A status output from an agent that names no node cannot be placed.
    let tmp = TempDir::new("study-old").unwrap();
    let old = tmp.path().join("old.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&one).unwrap()).unwrap();
    v[0]["node"] = Value::Null;
    std::fs::write(&old, v.to_string()).unwrap();
    let e = study(&["--manifests", root(STORY).to_str().unwrap(), "--clients", old.to_str().unwrap()])
        .unwrap_err();
    assert!(e.contains("instance \"node-1\" names no node") && e.contains("clients file"), "{e}");
}

/// The cache Service (internalTrafficPolicy Local beside PreferSameNode) with node-1 drained: while its
/// endpoint terminates (still serving) every proxy keeps node-1's clients on it; once it is gone,
/// kube-proxy DROPs node-1's 50% (they hang until their timeout), tierlb refuses them at once (a Local
/// policy allows no other node). With the Local policy taken away (the story's fix: PreferSameNode alone),
/// tierlb falls back: node-1's clients go to node-3 (node-2's endpoint is terminating), nothing is lost.
#[test]
fn drain_node_1_on_the_cache_shows_kube_proxys_local_hang_and_tierlbs_fallback() {
    let tmp = clients_50_30_20();
    let clients = tmp.path().join("clients.yaml");
    let args = |dir: &Path| {
        json(&[
            "--manifests",
            dir.to_str().unwrap(),
            "--clients",
            clients.to_str().unwrap(),
            "--service",
            "booking/nginx-cache",
            "--drain",
            "node-1",
        ])
    };
    let c = args(&root(STORY));
    let cache = service(&c, "booking/nginx-cache");
    let phases: Vec<&str> =
        cache["study"]["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(
        phases,
        ["initial", "drain node-1: its endpoints terminating", "drain node-1: its endpoints gone"]
    );
    let (kp, t) = (model(cache, 1, "kube-proxy-1.34-1.37"), model(cache, 1, "tierlb"));
    close(&kp["shares"]["10.244.1.10"], 0.5, "terminating, still serving (kube-proxy)");
    close(&t["shares"]["10.244.1.10"], 0.5, "terminating, still serving (tierlb)");
    let (kp, t) = (model(cache, 2, "kube-proxy-1.34-1.37"), model(cache, 2, "tierlb"));
    close(&kp["hang"], 0.5, "kube-proxy hangs node-1's clients");
    close(&t["hang"], 0.0, "tierlb never hangs");
    close(&t["failed"], 0.5, "tierlb refuses them at once");
    // Time-weighted over 30 s + 10 s: kube-proxy hangs 50% for 10 s of 40 (500 requests at 100/s).
    let w =
        cache["what_if"].as_array().unwrap().iter().find(|w| w["model"] == "kube-proxy-1.34-1.37").unwrap();
    close(&w["seconds"], 40.0, "seconds");
    close(&w["hang"], 0.125, "weighted hang");
    close(&w["hung_requests"], 500.0, "hung requests");

    // The fix: no Local policy.
    let fixed = TempDir::new("study-fix").unwrap();
    for f in std::fs::read_dir(root(STORY)).unwrap() {
        let p = f.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap().replace("  internalTrafficPolicy: Local\n", "");
        std::fs::write(fixed.path().join(p.file_name().unwrap()), text).unwrap();
    }
    let c = args(fixed.path());
    let t = model(service(&c, "booking/nginx-cache"), 2, "tierlb");
    close(&t["failed"], 0.0, "tierlb falls back");
    close(&t["hang"], 0.0, "tierlb falls back");
    // node-2's endpoint terminates (not ready), so node-3's is the only ready one: node-1's and node-2's
    // clients both cross to it.
    close(&t["shares"]["10.244.3.10"], 1.0, "every client on node-3's endpoint");
    close(&t["cross_node"], 0.8, "node-1's and node-2's clients cross");
}

/// `--crash POD` by the pod's name in targetRef (or its IP), then `--roll`: each what-if starts from the
/// cluster as it is (the roll's first phase does not inherit the crashed, not-ready pod).
#[test]
fn crash_by_pod_name_and_roll_each_start_from_the_cluster_as_it_is() {
    let d = TempDir::new("study-pods").unwrap();
    std::fs::copy(root("examples/story/nodes.yaml"), d.path().join("nodes.yaml")).unwrap();
    let text = std::fs::read_to_string(root("examples/story/pdf-resume.yaml")).unwrap().replace(
        "    nodeName: node-1\n",
        "    nodeName: node-1\n    targetRef: {kind: Pod, namespace: booking, name: pdf-resume-7d9f-a}\n",
    );
    std::fs::write(d.path().join("pdf.yaml"), text).unwrap();
    let dir = d.path().to_str().unwrap();
    let c = json(&["--manifests", dir, "--crash", "pdf-resume-7d9f-a", "--roll"]);
    let pdf = service(&c, "booking/pdf-resume");
    let phases: Vec<&str> =
        pdf["study"]["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(
        phases,
        [
            "initial",
            "booking/pdf-resume-7d9f-a crashed, unseen by the control plane",
            "booking/pdf-resume-7d9f-a not ready (seen), restarting",
            "roll node-1: old pod terminating",
            "roll node-1: old pod gone, replacement not ready",
            "roll node-3: old pod terminating",
            "roll node-3: old pod gone, replacement not ready",
        ]
    );
    // Crashed, unseen: kube-proxy keeps sending node-1's third and half of node-2's to it: 50% refused.
    close(&model(pdf, 1, "kube-proxy-1.34-1.37")["failed"], 0.5, "crash");
    assert!(model(pdf, 1, "tierlb")["failed"].as_f64().unwrap() < 0.01, "passive health holds it down");
    // Rolling node-3 after node-1: node-1's pod is ready again, node-3's terminates: all to node-1.
    close(&model(pdf, 5, "kube-proxy-1.34-1.37")["shares"]["10.244.1.21"], 1.0, "node-1 restored");
    let models = |c: &Value| -> Vec<Value> {
        let phases = service(c, "booking/pdf-resume")["study"]["phases"].as_array().unwrap().clone();
        phases.iter().map(|p| p["models"].clone()).collect()
    };
    let by_name = json(&["--manifests", dir, "--crash", "booking/pdf-resume-7d9f-a"]);
    let by_ip = json(&["--manifests", dir, "--crash", "10.244.1.21"]);
    assert_eq!(models(&by_name), models(&by_ip));
    // Each what-if has its own time-weighted totals.
    let w: Vec<&str> =
        pdf["what_if"].as_array().unwrap().iter().map(|w| w["what_if"].as_str().unwrap()).collect();
    assert!(w.contains(&"--crash booking/pdf-resume-7d9f-a") && w.contains(&"--roll"), "{w:?}");
}

/// A dual-stack pod named by its targetRef is crashed in the family the Service is studied in (its IPv4
/// endpoint in one slice, its IPv6 one in another: one pod, not two).
#[test]
fn a_dual_stack_pod_is_one_pod() {
    let d = TempDir::new("study-dual").unwrap();
    std::fs::copy(root("examples/story/nodes.yaml"), d.path().join("nodes.yaml")).unwrap();
    let text = std::fs::read_to_string(root("examples/story/booking-api.yaml"))
        .unwrap()
        .replace(
            "  - {addresses: [10.244.1.31], nodeName: node-1}",
            "  - {addresses: [10.244.1.31], nodeName: node-1, targetRef: {kind: Pod, name: api-a}}",
        )
        .replace(
            "  - {addresses: [\"fd00:244::1:31\"], nodeName: node-1}",
            "  - {addresses: [\"fd00:244::1:31\"], nodeName: node-1, targetRef: {kind: Pod, name: api-a}}",
        );
    assert_eq!(text.matches("api-a").count(), 2);
    std::fs::write(d.path().join("api.yaml"), text).unwrap();
    let c = json(&["--manifests", d.path().to_str().unwrap(), "--crash", "api-a"]);
    let api = service(&c, "booking/booking-api");
    assert_eq!(api["study"]["phases"][1]["phase"], "booking/api-a crashed, unseen by the control plane");
    // kube-proxy keeps sending a third of every node's requests to it: refused.
    close(&model(api, 1, "kube-proxy-1.34-1.37")["failed"], 1.0 / 3.0, "one of three endpoints crashed");
}

/// Draining a node does not make its endpoint serving: an endpoint that is not serving (crash-looping) stays
/// so while it terminates, and with no other endpoint kube-proxy REJECTs (refused), never uses it.
#[test]
fn a_drained_endpoint_that_was_not_serving_stays_not_serving() {
    let d = TempDir::new("study-notserving").unwrap();
    std::fs::copy(root("examples/story/nodes.yaml"), d.path().join("nodes.yaml")).unwrap();
    std::fs::write(
        d.path().join("svc.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: one, namespace: t}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: one-1, namespace: t, labels: {kubernetes.io/service-name: one}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n  - {addresses: [10.244.1.50], nodeName: node-1, conditions: {ready: false, serving: false}}\n",
    )
    .unwrap();
    let c = json(&["--manifests", d.path().to_str().unwrap(), "--drain", "node-1"]);
    let one = service(&c, "t/one");
    assert_eq!(one["study"]["phases"][1]["phase"], "drain node-1: its endpoints terminating");
    let kp = model(one, 1, "kube-proxy-1.34-1.37");
    close(&kp["failed"], 1.0, "no serving endpoint anywhere: REJECT");
    close(&kp["shares"]["10.244.1.50"], 0.0, "not used");
}

/// Shares that add up to nothing are refused; a node or Service the cluster does not have is warned about;
/// a file that looks like a status output but does not read as one says so; affinity hits are not counted
/// twice.
#[test]
fn client_inputs_that_cannot_be_right_are_refused_or_warned_about() {
    let story = root(STORY);
    let story = story.to_str().unwrap();
    let d = TempDir::new("study-inputs").unwrap();
    let write = |name: &str, text: &str| {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let zero = write("zero.yaml", "nodes: {node-1: 0, node-2: 0}\n");
    let e = study(&["--manifests", story, "--clients", &zero]).unwrap_err();
    assert!(e.contains("nodes: the shares add up to 0"), "{e}");
    let typo = write("typo.yaml", "nodes: {node-1: 1, nod-2: 1}\nservices: {booking/pdf: {node-1: 1}}\n");
    let c = json(&["--manifests", story, "--clients", &typo]);
    let warnings: Vec<&str> = c["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    assert!(warnings.iter().any(|w| w.contains("node nod-2 is no Node")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("Service booking/pdf is not in the cluster")), "{warnings:?}");
    let broken =
        write("broken.json", r#"[{"instance": "node-1", "node": "node-1", "frontends": [{"service": 3}]}]"#);
    let e = study(&["--manifests", story, "--clients", &broken]).unwrap_err();
    assert!(e.contains("not a `tierlb status -o json` output"), "{e}");
    // 500 connects of node-1 to pdf-resume, 200 of them (also) affinity hits: still 500.
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("status-node-1.json")).unwrap()).unwrap();
    v[0]["frontends"][1]["connections"]["affinity"] = 200.into();
    let affinity = write("affinity.json", &v.to_string());
    let c =
        json(&["--manifests", story, "--clients", &affinity, "--clients", &fixture("status-node-2-3.json")]);
    let source = service(&c, "booking/pdf-resume")["clients"].as_str().unwrap().to_owned();
    assert!(source.starts_with("counted: 1000 connects (node-1 500, node-2 300, node-3 200)"), "{source}");
    // Only node-1's agent read: the other nodes are named as unread.
    let c = json(&["--manifests", story, "--clients", &fixture("status-node-1.json")]);
    let source = service(&c, "booking/pdf-resume")["clients"].as_str().unwrap().to_owned();
    assert!(source.ends_with("no agent read on node-2, node-3 (taken as no clients)"), "{source}");
}

#[test]
fn user_errors_name_the_flag_and_the_fix() {
    let story = root(STORY);
    let story = story.to_str().unwrap();
    let scenario = root("examples/study/story.yaml");
    let cases: [(&str, Vec<&str>, &str); 8] = [
        (
            "a what-if on a scenario file",
            vec![scenario.to_str().unwrap(), "--roll"],
            "--roll applies only when studying a cluster",
        ),
        ("an unknown pod", vec!["--manifests", story, "--crash", "nope"], "--crash nope: no EndpointSlice"),
        ("an unknown node", vec!["--manifests", story, "--drain", "node-9"], "--drain node-9: no Node"),
        ("a chart of many", vec!["--manifests", story, "--chart", "/dev/null"], "add --service"),
        (
            "an unknown Service",
            vec!["--manifests", story, "--service", "booking/nope"],
            "no such Service in --manifests",
        ),
        (
            "an unknown address",
            vec!["--manifests", story, "--crash", "10.9.9.9"],
            "--crash 10.9.9.9: no EndpointSlice has",
        ),
        ("a zero phase", vec!["--manifests", story, "--grace", "0s"], "a phase lasts more than 0"),
        (
            "a setting on a scenario file",
            vec![scenario.to_str().unwrap(), "--max-skew", "2"],
            "--max-skew applies only when studying a cluster",
        ),
    ];
    for (what, args, want) in cases {
        let e = study(&args).expect_err(what);
        assert!(e.contains(want), "{what}: {e}");
    }
    let d = TempDir::new("study-bad").unwrap();
    let bad = d.path().join("clients.yaml");
    std::fs::write(&bad, "nodes: {node-1: 50}\nservice: {}\n").unwrap();
    let e = study(&["--manifests", story, "--clients", bad.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("unknown field `service`") && e.contains("a clients file has"), "{e}");
}

/// The multizone example runs end to end, and every request is accounted for in every Service and model.
#[test]
fn every_model_accounts_for_every_request_in_the_multizone_example() {
    let c = json(&["--manifests", root("examples/multizone").to_str().unwrap(), "--roll"]);
    assert!(!c["services"].as_array().unwrap().is_empty());
    for s in c["services"].as_array().unwrap() {
        for p in s["study"]["phases"].as_array().unwrap() {
            for m in p["models"].as_array().unwrap() {
                let shares: f64 =
                    m["shares"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
                let total = shares + m["failed"].as_f64().unwrap() + m["hang"].as_f64().unwrap();
                assert!(
                    (total - 1.0).abs() < 1e-9,
                    "{} {} {}: {total}",
                    s["service"],
                    p["phase"],
                    m["model"]
                );
            }
        }
    }
}

/// The table a person reads: a phase's requests are whole (a rate times a duration is an expectation, never
/// "6666.7 requests"), and Cilium's rows come with the setting they assume, stated above the table.
#[test]
fn the_roll_table_counts_whole_requests_and_states_the_cilium_setting() {
    // 333.33 requests a second over phases of 30 s and 10 s: 9,999.9 and 3,333.3 expected, printed whole.
    let text = study(&[
        "--manifests",
        root("examples/story").to_str().unwrap(),
        "--roll",
        "--requests-per-second",
        "333.33",
    ])
    .unwrap();
    let totals: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split(" s, ").nth(1))
        .filter_map(|rest| rest.strip_suffix(" requests)"))
        .collect();
    assert!(!totals.is_empty(), "{text}");
    assert!(totals.iter().all(|n| n.parse::<u64>().is_ok()), "whole requests: {totals:?}");
    assert!(text.contains(tierlb::study::CILIUM_SETTING), "{text}");
}
