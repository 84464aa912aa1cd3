//! `tierlb lint` across the cluster: its findings, their nodes, pods and lines, and its exit codes.
use super::*;

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
    // study names each endpoint's pod and node beside the address its columns show.
    let (_, out, _) = tierlb(&["study", "--manifests", file.to_str().unwrap(), "--service", "booking/zoned"]);
    assert!(
        out.contains("  endpoints: 10.244.1.50 pod booking/zoned-x1 on node-1, 10.244.2.50 pod booking/zoned-x2 on node-2"),
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
        "booking/pdf-resume: unknown-field [all 3 nodes]: {dir}/pdf-resume.yaml:11 document 1 (Service pdf-resume) \
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
    assert_eq!(local["port"], "main");
    assert_eq!(
        local["message"],
        "internalTrafficPolicy: Local and no ready endpoint on the node: connects from its pods fail (EHOSTUNREACH; \
         kube-proxy drops them and clients hang until their timeout)"
    );
    let whole = v.as_array().unwrap().iter().find(|f| f["rule"] == "one-zone").unwrap();
    assert_eq!(whole["port"], "", "a finding about the whole Service names no port: {whole}");
    let (code, out, _) = tierlb(&["lint", "--manifests", dir, "--namespace", "ok"]);
    assert_eq!((code, out.as_str()), (0, "no findings (2 nodes)\n"));
    let (code, _, err) = tierlb(&["lint", "--namespace", "ok"]);
    assert_eq!(code, 2, "usage: {err}");
}

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
        // Input not read whole is never summed up as clean on stdout either.
        assert!(!out.contains("no findings ("), "{what}: stdout {out:?}");
        if *want == 3 && says == &"error:" {
            assert!(out.contains("error(s) above: not judged (exit status 3)"), "{what}: stdout {out:?}");
        }
    }
    let (code, _, err) = tierlb(&["lint"]);
    assert_eq!(code, 2, "no source is a usage error: {err}");
}

/// PreferSameZone where no node has a zone: `one-zone`'s other branch, which says no zone hints apply.
#[test]
fn lint_says_prefer_same_zone_does_nothing_where_no_node_has_a_zone() {
    use lb_testkit::manifests::{Ep, Svc, node, to_yaml, write_atomic, write_service};
    let tmp = TempDir::new("faces-zoneless").unwrap();
    let dir = tmp.path();
    write_atomic(dir, "nodes.yaml", &to_yaml(&[node("node-1", None), node("node-2", None)])).unwrap();
    let mut svc = Svc::new("web", "10.96.0.60".parse().unwrap(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameZone".into());
    let eps = [
        Ep::ready("10.0.60.1".parse().unwrap(), "node-1"),
        Ep::ready("10.0.60.2".parse().unwrap(), "node-2"),
    ];
    write_service(dir, &svc, &eps).unwrap();
    let (code, out, _) = tierlb(&["lint", "--manifests", dir.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with(
            "default/web: one-zone [all 2 nodes]: trafficDistribution: PreferSameZone in a cluster whose nodes have \
             no zone: no zone hints apply; fix: "
        )),
        "{out}"
    );
}
