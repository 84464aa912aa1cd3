//! The read-only faces (`plan`, `explain`, `lint` with `--kube`) against a strict API server that plays a
//! namespace's read-only role: lists only (a watch, a POST, a selector or an unknown parameter fails the
//! test), namespaced or cluster-wide as RBAC allows, 403 as a real API server words it, and pages of `limit`
//! objects with a `continue` token, as the API server pages a long list.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use http::{Request, Response};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tierlb::cli::{Cli, Command, kube_input};

/// What the faces' API server holds and allows, and what it saw.
#[derive(Default)]
struct Faces {
    /// Objects per resource (plural).
    objects: BTreeMap<&'static str, Vec<Value>>,
    /// The only namespace Services and EndpointSlices may be listed in (`None`: any, and cluster-wide).
    namespace_only: Option<&'static str>,
    /// Nodes answer 403.
    nodes_forbidden: bool,
    /// List requests per resource.
    lists: BTreeMap<&'static str, usize>,
    /// What a real API server would not serve as meant, or that breaks the faces' contract.
    unexpected: Vec<String>,
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason,
                      "code": code, "message": message});
    let mut r = Response::new(Body::from(serde_json::to_vec(&body).unwrap()));
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap();
    r
}

/// (resource, namespace) of a list path: `/api/v1/services`, `/api/v1/namespaces/NS/services`, the
/// discovery group's, `/api/v1/nodes` (cluster-scoped only).
fn route(path: &str) -> Option<(&'static str, Option<String>)> {
    let (group_path, rest) = if let Some(r) = path.strip_prefix("/apis/discovery.k8s.io/v1/") {
        ("discovery", r)
    } else {
        ("core", path.strip_prefix("/api/v1/")?)
    };
    let (ns, res) = match rest.strip_prefix("namespaces/") {
        Some(r) => {
            let (ns, res) = r.split_once('/')?;
            (Some(ns.to_owned()), res)
        }
        None => (None, rest),
    };
    let resource = match (group_path, res) {
        ("core", "services") => "services",
        ("discovery", "endpointslices") => "endpointslices",
        ("core", "nodes") if ns.is_none() => "nodes",
        _ => return None,
    };
    Some((resource, ns))
}

async fn serve(mut handle: super::server::Handle, script: Arc<Mutex<Faces>>) {
    while let Some((req, send)) = handle.next_request().await {
        let uri = req.uri().clone();
        let mut s = script.lock().unwrap();
        let Some((resource, ns)) = route(uri.path()).filter(|_| req.method() == http::Method::GET) else {
            s.unexpected.push(format!("{} {uri}", req.method()));
            send.send_response(status(404, "NotFound", "not served"));
            continue;
        };
        let p: BTreeMap<String, String> =
            form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()).into_owned().collect();
        if let Some(k) = p.keys().find(|k| !["limit", "continue"].contains(&k.as_str())) {
            s.unexpected
                .push(format!("parameter {k} on a list of {resource} ({uri}): the faces list, no more"));
        }
        *s.lists.entry(resource).or_default() += 1;
        let scope =
            ns.as_deref().map_or("at the cluster scope".to_owned(), |n| format!("in the namespace \"{n}\""));
        let denied = match resource {
            "nodes" => s.nodes_forbidden,
            _ => s.namespace_only.is_some_and(|only| ns.as_deref() != Some(only)),
        };
        if denied {
            let group = if resource == "endpointslices" { "discovery.k8s.io" } else { "" };
            let msg = format!(
                "{resource} is forbidden: User \"system:serviceaccount:shop:reader\" cannot list resource \
                 \"{resource}\" in API group \"{group}\" {scope}"
            );
            send.send_response(status(403, "Forbidden", &msg));
            continue;
        }
        let all: Vec<Value> = s.objects[resource]
            .iter()
            .filter(|o| ns.as_deref().is_none_or(|n| o["metadata"]["namespace"] == n))
            .cloned()
            .collect();
        let start: usize = p.get("continue").map_or(0, |c| c.parse().unwrap());
        let limit: usize = p.get("limit").map_or(all.len(), |l| l.parse().unwrap());
        let end = (start + limit).min(all.len());
        let mut meta = json!({"resourceVersion": "100"});
        if end < all.len() {
            meta["continue"] = json!(end.to_string());
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "metadata": meta, "items": all[start..end]});
        send.send_response(Response::new(Body::from(serde_json::to_vec(&list).unwrap())));
    }
}

fn service(ns: &str, name: &str, ip: &str, extra: Value) -> Value {
    let mut spec = json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80}]});
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            spec[k] = v;
        }
    }
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// A slice of `svc` with endpoints (ip, node, zone), each hinted for its own node and zone.
fn slice(ns: &str, svc: &str, eps: &[(&str, &str, &str)]) -> Value {
    let eps: Vec<Value> = eps
        .iter()
        .map(|(ip, node, zone)| {
            json!({"addresses": [ip], "nodeName": node, "zone": zone,
                   "hints": {"forNodes": [{"name": node}], "forZones": [{"name": zone}]}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{svc}-1"), "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

/// The shop namespace: web (PreferSameNode, one endpoint on node-1 and one on node-2) and cache
/// (internalTrafficPolicy Local, its only endpoint on node-2); another team's Service in namespace other.
fn cluster() -> Faces {
    let mut f = Faces::default();
    f.objects.insert(
        "services",
        vec![
            service("shop", "web", "10.96.0.10", json!({"trafficDistribution": "PreferSameNode"})),
            service("shop", "cache", "10.96.0.11", json!({"internalTrafficPolicy": "Local"})),
            service("other", "api", "10.96.0.12", json!({})),
        ],
    );
    f.objects.insert(
        "endpointslices",
        vec![
            slice("shop", "web", &[("10.244.1.5", "node-1", "a"), ("10.244.2.5", "node-2", "b")]),
            slice("shop", "cache", &[("10.244.2.6", "node-2", "b")]),
            slice("other", "api", &[("10.244.1.7", "node-1", "a")]),
        ],
    );
    let node = |name: &str, zone: &str| {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
               "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.1"}]}})
    };
    f.objects.insert("nodes", vec![node("node-1", "a"), node("node-2", "b")]);
    f
}

fn client(script: &Arc<Mutex<Faces>>) -> (Client, tokio::task::JoinHandle<()>) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), tokio::spawn(serve(handle, script.clone())))
}

fn parse(argv: &str) -> Command {
    Cli::try_parse_from_args(&argv.split(' ').map(str::to_owned).collect::<Vec<_>>()).unwrap().command
}

fn done(script: &Mutex<Faces>, server: &tokio::task::JoinHandle<()>) {
    server.abort();
    let s = script.lock().unwrap();
    assert!(s.unexpected.is_empty(), "requests the faces should not make: {:#?}", s.unexpected);
}

#[tokio::test]
async fn a_namespace_reader_without_nodes_gets_plan_explain_and_lint_of_its_namespace() {
    let script =
        Arc::new(Mutex::new(Faces { namespace_only: Some("shop"), nodes_forbidden: true, ..cluster() }));
    let (c, server) = client(&script);
    let input = kube_input(c, Some("shop")).await.unwrap();
    assert!(input.model.nodes.is_empty(), "Nodes were forbidden");
    assert_eq!(input.model.services.len(), 2, "only namespace shop is read");
    assert_eq!(input.origin, "the API server (namespace shop)");

    let Command::Plan(args) = parse("tierlb plan --kube -n shop --node node-1") else { unreachable!() };
    let plan = tierlb::cli::plan_on(&args, &input).unwrap().text;
    // The zone comes from node-1's endpoint; web uses its node tier, cache has nothing local.
    assert!(plan.starts_with("node node-1 zone a\n"), "{plan}");
    let web = plan.lines().find(|l| l.starts_with("shop/web:http")).unwrap();
    assert!(web.contains("10.244.1.5:8080") && web.contains(" node "), "{web}");
    let cache = plan.lines().find(|l| l.starts_with("shop/cache:http")).unwrap();
    assert!(cache.contains("Local") && cache.contains("drop"), "{cache}");

    let Command::Explain(args) = parse("tierlb explain shop/web --kube --node node-1") else {
        unreachable!()
    };
    let text = tierlb::cli::explain_on(&args, &input).unwrap();
    assert!(text.contains("10.244.1.5:8080"), "{text}");

    let Command::Lint(args) = parse("tierlb lint --kube -n shop") else { unreachable!() };
    let found = tierlb::cli::lint_on(&args, &input).unwrap();
    assert!(found.findings >= 1, "{}", found.text);
    assert!(
        found.text.lines().any(|l| l.starts_with("shop/cache") && l.contains("[node-1]")),
        "cache has no endpoint on node-1: {}",
        found.text
    );
    assert!(!found.text.contains("other/"), "{}", found.text);
    let s = script.lock().unwrap();
    assert_eq!((s.lists["services"], s.lists["endpointslices"], s.lists["nodes"]), (1, 1, 1));
    drop(s);
    done(&script, &server);
}

#[tokio::test]
async fn without_namespace_a_namespace_reader_is_told_to_pass_one() {
    let script =
        Arc::new(Mutex::new(Faces { namespace_only: Some("shop"), nodes_forbidden: true, ..cluster() }));
    let (c, server) = client(&script);
    let e = format!("{:#}", kube_input(c, None).await.err().expect("a cluster-wide list is forbidden"));
    assert!(e.contains("may not list services in any namespace"), "{e}");
    assert!(e.contains("pass --namespace NS"), "{e}");
    assert!(e.contains("cannot list resource \"services\""), "the API server's words: {e}");
    done(&script, &server);
}

#[tokio::test]
async fn a_cluster_reader_gets_every_namespace_and_the_nodes_zones_page_by_page() {
    let mut f = cluster();
    // 1,201 Services: three pages of 500 (the last with one).
    let services = f.objects.get_mut("services").unwrap();
    for i in 0..1_198 {
        services.push(service(
            "bulk",
            &format!("s{i}"),
            &format!("10.97.{}.{}", i / 250, i % 250 + 1),
            json!({}),
        ));
    }
    let script = Arc::new(Mutex::new(f));
    let (c, server) = client(&script);
    let input = kube_input(c, None).await.unwrap();
    assert_eq!(input.model.services.len(), 1_201);
    assert_eq!(input.model.nodes["node-2"].zone.as_deref(), Some("b"));
    assert_eq!(script.lock().unwrap().lists["services"], 3, "pages of {}", tierlb::source::kube::list::PAGE);

    let Command::Lint(args) = parse("tierlb lint --kube -o json") else { unreachable!() };
    let found = tierlb::cli::lint_on(&args, &input).unwrap();
    let v: Value = serde_json::from_str(&found.text).unwrap();
    assert!(
        v.as_array().unwrap().iter().any(|f| f["service"] == json!({"name": "cache", "namespace": "shop"})),
        "{v}"
    );
    done(&script, &server);
}

/// The story's cluster (examples/story) served as an API server holds it: its YAML documents as JSON objects,
/// the Nodes' List unrolled.
fn story() -> Faces {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/story");
    let mut f = Faces::default();
    for kind in ["services", "endpointslices", "nodes"] {
        f.objects.insert(kind, Vec::new());
    }
    let mut add = |v: Value| {
        let kind = match v["kind"].as_str() {
            Some("Service") => "services",
            Some("EndpointSlice") => "endpointslices",
            Some("Node") => "nodes",
            other => panic!("{other:?} in the story"),
        };
        f.objects.get_mut(kind).unwrap().push(v);
    };
    for file in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut v: Value = serde::Deserialize::deserialize(doc).unwrap();
            // As the EndpointSlice controller writes it: the pod behind node-1's PDF endpoint.
            if v["metadata"]["name"] == "pdf-resume-a1b2c" {
                v["endpoints"][0]["targetRef"] =
                    json!({"kind": "Pod", "namespace": "booking", "name": "pdf-a"});
            }
            match v["items"].as_array() {
                Some(items) => items.iter().cloned().for_each(&mut add),
                None if !v.is_null() => add(v),
                None => {}
            }
        }
    }
    f
}

/// `tierlb study --kube` reads the same cluster as `--manifests examples/story` and gives the same tables
/// (all but the line that says where it read), with a what-if and a pod crashed by its IP.
#[tokio::test]
async fn study_with_kube_gives_the_tables_the_manifests_give() {
    let script = Arc::new(Mutex::new(story()));
    let (c, server) = client(&script);
    let input = kube_input(c, None).await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/story");
    let files = tierlb::cli::load_for_cli(&dir).unwrap();
    for argv in
        ["tierlb study --kube --drain node-1 --crash 10.244.3.21", "tierlb study --kube -o json --roll"]
    {
        let Command::Study(args) = parse(argv) else { unreachable!() };
        let from_kube = tierlb::cli::study_on(&args, &input).unwrap();
        let from_files = tierlb::cli::study_on(&args, &files).unwrap();
        let body = |t: &str, origin: &str| t.replacen(origin, "ORIGIN", 1);
        assert_eq!(
            body(&from_kube, "the API server"),
            body(&from_files, &format!("--manifests {}", dir.display())),
            "{argv}"
        );
        assert!(from_kube.contains("booking/pdf-resume"), "{from_kube}");
    }
    // A pod named by its targetRef, as the API server's slices have it: the same figures as by its IP.
    let figures = |argv: &str| {
        let Command::Study(args) = parse(argv) else { unreachable!() };
        let v: Value = serde_json::from_str(&tierlb::cli::study_on(&args, &input).unwrap()).unwrap();
        let phases = v["services"][0]["study"]["phases"].as_array().unwrap().clone();
        let names: Vec<Value> = phases.iter().map(|p| p["phase"].clone()).collect();
        (names, phases.iter().map(|p| p["models"].clone()).collect::<Vec<_>>())
    };
    let (names, by_name) = figures("tierlb study --kube -o json --service booking/pdf-resume --crash pdf-a");
    let (_, by_ip) = figures("tierlb study --kube -o json --service booking/pdf-resume --crash 10.244.1.21");
    assert_eq!(names[1], "booking/pdf-a crashed, unseen by the control plane");
    assert_eq!(by_name, by_ip);
    done(&script, &server);
}
