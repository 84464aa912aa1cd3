//! tierlb against the real Kubernetes: kube-apiserver, the EndpointSlice controller and kubectl v1.36.3, built
//! here from Kubernetes' code (`lb_testkit::kube`), with the agents' `--kube` source authenticating as the
//! service account of `deploy/rbac.yaml`, in the kernel, with real sockets. Every hint the agents read here was
//! written by Kubernetes' own controller; every object was made with kubectl.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lb_testkit::kube::{ControlPlane, KubeCluster, Options};

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

fn lab() -> PathBuf {
    lb_testkit::workspace_bin("tierlb-lab", "lb-lab")
}

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn cluster(tag: &str, options: Options) -> KubeCluster {
    KubeCluster::start(tag, Path::new(TIERLB), &lab(), &deploy(), options).unwrap()
}

/// The story's cache Service, as it was before the fix: `internalTrafficPolicy: Local`.
const CACHE: &str = "apiVersion: v1
kind: Service
metadata: {name: nginx-cache, namespace: booking}
spec:
  selector: {app: nginx-cache}
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}]
";

/// The ClusterIP the API server allocated to `namespace/name`, with `port`.
fn vip(cp: &ControlPlane, namespace: &str, name: &str, port: u16) -> SocketAddr {
    let ip =
        cp.kubectl(&["-n", namespace, "get", "service", name, "-o", "jsonpath={.spec.clusterIP}"]).unwrap();
    SocketAddr::new(ip.trim().parse().unwrap(), port)
}

/// The endpoints of a Service's slices: (address, ready, serving, terminating, nodeName, forNodes, forZones).
fn endpoints(c: &KubeCluster, namespace: &str, service: &str) -> Vec<serde_json::Value> {
    let slices = c.cp.slices(namespace, service).unwrap();
    slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Wait until `check` holds for the Service's endpoints (the controller wrote them).
fn wait_slices(
    c: &KubeCluster,
    namespace: &str,
    service: &str,
    what: &str,
    check: impl Fn(&[serde_json::Value]) -> bool,
) -> Duration {
    c.cp.wait_for(Duration::from_secs(30), what, |_| Ok(check(&endpoints(c, namespace, service)))).unwrap()
}

fn ready(e: &serde_json::Value) -> bool {
    e["conditions"]["ready"].as_bool().unwrap_or(true)
}

/// One request from `node` to `target`: the backend that answered, or the error.
fn once(c: &KubeCluster, node: &str, target: SocketAddr) -> Result<String, String> {
    let r =
        c.sim.start_probe_with_timeout(node, target, 1, Duration::ZERO, Duration::from_millis(500)).unwrap();
    let a = r.wait().unwrap().attempts.remove(0);
    a.backend.ok_or_else(|| a.error.unwrap_or_default())
}

/// Probe from `node` until `want` holds for one answer, for at most `timeout`; the time it took.
fn until(
    c: &KubeCluster,
    node: &str,
    target: SocketAddr,
    timeout: Duration,
    want: impl Fn(&Result<String, String>) -> bool,
) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = Err("no attempt".to_owned());
    while start.elapsed() < timeout {
        last = once(c, node, target);
        if want(&last) {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("after {timeout:?} the last answer from {node} to {target} was {last:?}"))
}

fn setup_booking(c: &mut KubeCluster) {
    c.cp.add_namespace("booking").unwrap();
}

#[test]
fn a_service_made_with_kubectl_is_translated_within_a_second_of_its_slice() {
    let mut c = cluster("rk-new", Options::default());
    c.add_node("node-1", Some("zone-a"), &[]).unwrap();
    setup_booking(&mut c);
    c.start_pod("booking", "web-1", "node-1", &[("app", "web")], addr("10.244.1.10:8080")).unwrap();
    c.cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: booking}\n\
         spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n",
    )
    .unwrap();
    let target = vip(&c.cp, "booking", "web", 80);
    assert!(target.ip().to_string().starts_with("10.96."), "allocated from the service CIDR: {target}");
    // The controller's slice, then the first connect to the VIP that reaches the pod.
    wait_slices(&c, "booking", "web", "web's slice with its ready endpoint", |eps| {
        eps.iter().any(|e| ready(e) && e["addresses"][0] == "10.244.1.10")
    });
    let took = until(&c, "node-1", target, Duration::from_secs(1), |r| r.as_deref() == Ok("web-1"));
    let took = took.unwrap_or_else(|e| panic!("not translated within 1 s of the slice: {e}"));
    eprintln!("slice seen -> first translated connect: {took:?}");
}

#[test]
fn the_story_patch_moves_every_node_to_its_own_pod() {
    let mut c = cluster("rk-story", Options::default());
    // The story: two cache replicas on three nodes, in two zones.
    for (node, zone) in [("node-1", "zone-a"), ("node-2", "zone-b"), ("node-3", "zone-b")] {
        c.add_node(node, Some(zone), &[]).unwrap();
    }
    setup_booking(&mut c);
    let labels = [("app", "nginx-cache")];
    c.start_pod("booking", "cache-node-1", "node-1", &labels, addr("10.244.1.20:8080")).unwrap();
    c.start_pod("booking", "cache-node-2", "node-2", &labels, addr("10.244.2.20:8080")).unwrap();
    c.cp.apply(CACHE).unwrap();
    let target = vip(&c.cp, "booking", "nginx-cache", 80);
    wait_slices(&c, "booking", "nginx-cache", "two ready endpoints", |eps| {
        eps.iter().filter(|e| ready(e)).count() == 2
    });
    // internalTrafficPolicy: Local: node-3 has no local endpoint. kube-proxy drops (the client hangs);
    // tierlb fails the connect at once.
    until(&c, "node-1", target, Duration::from_secs(5), |r| r.as_deref() == Ok("cache-node-1")).unwrap();
    let before = once(&c, "node-3", target);
    assert!(before.is_err(), "node-3 has no local endpoint under Local: {before:?}");

    // The story's fix, with the story's exact command.
    let patched = Instant::now();
    c.cp.kubectl(&lb_testkit::story::PATCH).unwrap();
    // node-3 now reaches a cache pod: the time from the patch to that is the patch's way through the API
    // server, the controller's slice update, the watch and the maps.
    until(&c, "node-3", target, Duration::from_secs(10), Result::is_ok).unwrap();
    eprintln!("story patch -> node-3 translated: {:?}", patched.elapsed());
    // The controller wrote forNodes and forZones on every ready endpoint; the story's jsonpath shows each
    // node beside its own hint.
    wait_slices(&c, "booking", "nginx-cache", "forNodes on every ready endpoint", |eps| {
        eps.iter().filter(|e| ready(e)).all(|e| e["hints"]["forNodes"][0]["name"] == e["nodeName"])
    });
    let shown = c.cp.kubectl(&lb_testkit::story::HINTS).unwrap();
    let mut lines: Vec<&str> = shown.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["node-1\tnode-1\tzone-a", "node-2\tnode-2\tzone-b"], "{shown}");
    // Every node's node tier holds its own pod: node-1 and node-2 only ever reach their own. No endpoint
    // lists node-3, so kube-proxy's rule takes zone mode there (every ready endpoint has forZones, one lists
    // zone-b): node-2's pod, in node-3's zone.
    for (node, own) in [("node-1", "cache-node-1"), ("node-2", "cache-node-2")] {
        let r = c.sim.probe(node, target, 20, Duration::ZERO).unwrap();
        assert_eq!(r.count(own), 20, "{node}: {:?} {:?}", r.by_backend(), r.errors());
    }
    let r = c.sim.probe("node-3", target, 20, Duration::ZERO).unwrap();
    assert_eq!(
        r.count("cache-node-2"),
        20,
        "node-3 uses its zone's endpoint: {:?} {:?}",
        r.by_backend(),
        r.errors()
    );
}

/// Three nodes (node-1 and node-2 in zone-a, node-3 in zone-b), a `web` pod on each, `web` PreferSameNode.
fn web_cluster(tag: &str, options: Options, agent_args: &[&str]) -> (KubeCluster, SocketAddr) {
    let mut c = cluster(tag, options);
    for (node, zone) in [("node-1", "zone-a"), ("node-2", "zone-a"), ("node-3", "zone-b")] {
        c.add_node(node, Some(zone), agent_args).unwrap();
    }
    setup_booking(&mut c);
    for n in 1..=3 {
        let a = addr(&format!("10.244.{n}.30:8080"));
        c.start_pod("booking", &format!("web-{n}"), &format!("node-{n}"), &[("app", "web")], a).unwrap();
    }
    c.cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: booking}\n\
         spec:\n  selector: {app: web}\n  trafficDistribution: PreferSameNode\n  \
         ports: [{name: http, port: 80, targetPort: 8080}]\n",
    )
    .unwrap();
    let target = vip(&c.cp, "booking", "web", 80);
    wait_slices(&c, "booking", "web", "forNodes on three ready endpoints", |eps| {
        eps.iter().filter(|e| ready(e) && e["hints"]["forNodes"][0]["name"] == e["nodeName"]).count() == 3
    });
    for n in 1..=3 {
        let own = format!("web-{n}");
        until(&c, &format!("node-{n}"), target, Duration::from_secs(5), |r| r.as_deref() == Ok(&own))
            .unwrap();
    }
    (c, target)
}

/// Answers of `count` requests from `node`, by backend; fails on any failed request.
fn spread_from(c: &KubeCluster, node: &str, target: SocketAddr, count: usize) -> Vec<String> {
    let r = c.sim.probe(node, target, count, Duration::ZERO).unwrap();
    assert_eq!(r.failures(), 0, "{node} -> {target}: {:?}", r.errors());
    r.by_backend().into_keys().collect()
}

/// `kubectl patch svc web -n booking --type=TYPE -p PATCH`.
fn patch_web(c: &KubeCluster, kind: &str, patch: &str) {
    c.cp.kubectl(&["-n", "booking", "patch", "svc", "web", &format!("--type={kind}"), "-p", patch]).unwrap();
}

#[test]
fn pod_node_and_service_changes_reach_the_maps_and_traffic_never_fails_where_an_endpoint_is_ready() {
    let (mut c, target) = web_cluster("rk-changes", Options::default(), &[]);
    let web = |n: &[u32]| n.iter().map(|n| format!("web-{n}")).collect::<Vec<_>>();

    // A pod not Ready (its readiness fails; the process still runs): node-1 leaves node mode for its zone.
    c.pod_ready("booking", "web-1", false).unwrap();
    until(&c, "node-1", target, Duration::from_secs(5), |r| r.as_deref() == Ok("web-2")).unwrap();
    assert_eq!(spread_from(&c, "node-1", target, 20), web(&[2]));

    // A rolling update's deletion of node-2's pod, with a client on node-2 running throughout: the
    // endpoint turns terminating (not ready) while the process serves, node-2 moves on (no endpoint of
    // zone-a is ready now: web-1 is not Ready either, so no zone mode: the cluster, web-3), and not one
    // request fails.
    let during = c.sim.start_probe("node-2", target, 150, Duration::from_millis(20)).unwrap();
    c.roll_out_pod("booking", "web-2", Duration::from_secs(1)).unwrap();
    let report = during.wait().unwrap();
    assert_eq!(report.failures(), 0, "requests failed during the roll: {:?}", report.errors());
    until(&c, "node-2", target, Duration::from_secs(5), |r| r.as_deref() == Ok("web-3")).unwrap();
    assert_eq!(spread_from(&c, "node-2", target, 20), web(&[3]));

    // A Node's zone label changed. web-1 is Ready again (node-1 back on its own pod, node-2 on its zone's
    // web-1); then node-2 moves to zone-b: no slice changes (no pod runs there), node-2's agent reads its own
    // Node's MODIFIED event and takes zone-b's endpoint, web-3.
    c.pod_ready("booking", "web-1", true).unwrap();
    until(&c, "node-1", target, Duration::from_secs(5), |r| r.as_deref() == Ok("web-1")).unwrap();
    until(&c, "node-2", target, Duration::from_secs(5), |r| r.as_deref() == Ok("web-1")).unwrap();
    c.cp.kubectl(&["label", "node", "node-2", "topology.kubernetes.io/zone=zone-b", "--overwrite"]).unwrap();
    until(&c, "node-2", target, Duration::from_secs(5), |r| r.as_deref() == Ok("web-3")).unwrap();
    assert_eq!(spread_from(&c, "node-2", target, 20), web(&[3]));

    // The Service's port changed: the new port is translated, the old one no longer.
    patch_web(&c, "json", r#"[{"op":"replace","path":"/spec/ports/0/port","value":8000}]"#);
    let moved = SocketAddr::new(target.ip(), 8000);
    until(&c, "node-1", moved, Duration::from_secs(5), |r| r.as_deref() == Ok("web-1")).unwrap();
    until(&c, "node-1", target, Duration::from_secs(5), Result::is_err).unwrap();

    // trafficDistribution removed: the controller removes the hints, every node uses every ready endpoint.
    patch_web(&c, "merge", r#"{"spec":{"trafficDistribution":null}}"#);
    wait_slices(&c, "booking", "web", "hints removed", |eps| eps.iter().all(|e| e["hints"].is_null()));
    c.cp.wait_for(Duration::from_secs(5), "node-2 using both ready endpoints", |_| {
        Ok(spread_from(&c, "node-2", moved, 40) == web(&[1, 3]))
    })
    .unwrap();

    // Labelled for another proxy (kube-proxy's label selector, sent on every list and watch): the API
    // server's filtered watch sends the Service as deleted, and the controller copies the label to the
    // slices; node-1 no longer translates it. The label removed: translated again.
    let label = "service.kubernetes.io/service-proxy-name";
    c.cp.kubectl(&["-n", "booking", "label", "svc", "web", &format!("{label}=other-proxy")]).unwrap();
    until(&c, "node-1", moved, Duration::from_secs(5), Result::is_err).unwrap();
    c.cp.kubectl(&["-n", "booking", "label", "svc", "web", &format!("{label}-")]).unwrap();
    until(&c, "node-1", moved, Duration::from_secs(5), Result::is_ok).unwrap();
}

/// How many lists the agent has started (its log says each: the first per kind, and each relist).
fn lists(c: &KubeCluster, node: &str) -> usize {
    std::fs::read_to_string(&c.sim.node(node).log)
        .unwrap_or_default()
        .matches("listing from the API server")
        .count()
}

/// `GET path` on the agent's health listener inside the cluster's namespace: the status code.
fn http_status(c: &KubeCluster, at: SocketAddr, path: &str) -> u16 {
    lb_testkit::kube_proxy::http_get(&c.sim.netns, at, path).unwrap().0
}

/// One node (`agent_args` for its agent), the `web` Service with one pod, `web-1`, on it at `pod`; returns
/// once node-1's connects to the VIP reach it.
fn one_web(tag: &str, agent_args: &[&str], pod: SocketAddr) -> (KubeCluster, SocketAddr) {
    let mut c = cluster(tag, Options::default());
    c.add_node("node-1", Some("zone-a"), agent_args).unwrap();
    setup_booking(&mut c);
    c.start_pod("booking", "web-1", "node-1", &[("app", "web")], pod).unwrap();
    c.cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: booking}\n\
         spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n",
    )
    .unwrap();
    let target = vip(&c.cp, "booking", "web", 80);
    until(&c, "node-1", target, Duration::from_secs(5), |r| r.as_deref() == Ok("web-1")).unwrap();
    (c, target)
}

/// The longest a watch waits to retry after the API server went away, and the time to list again: kube-rs'
/// default backoff waits up to 30 s plus a jitter of up to as much again (backon's `with_jitter`), 60 s. A
/// bound of 45 s failed once, in a full run beside the differential's load.
const BACKOFF: Duration = Duration::from_secs(75);

#[test]
fn the_api_server_restarted_etcd_compacted_and_watches_ended_by_the_server_keep_the_maps_serving() {
    // Watches of 2 to 4 s: the API server ends them often, and the agent resumes each from its last
    // resourceVersion.
    let healthz = addr("127.0.0.1:10256");
    let args = ["--watch-timeout", "2s", "--healthz-addr", "127.0.0.1:10256"];
    let (mut c, target) = one_web("rk-restart", &args, addr("10.244.1.40:8080"));
    let first = lists(&c, "node-1");
    assert_eq!(first, 3, "one list per kind at start");

    // Watches ended by the server (each kind's at least twice in 9 s): resumed, never listed again, and a
    // change made after them still arrives.
    std::thread::sleep(Duration::from_secs(9));
    assert_eq!(lists(&c, "node-1"), first, "a watch the server ended was resumed with a new list");
    c.start_pod("booking", "web-2", "node-1", &[("app", "web")], addr("10.244.1.41:8080")).unwrap();
    c.cp.wait_for(Duration::from_secs(10), "web-2 in node-1's maps", |_| {
        Ok(spread_from(&c, "node-1", target, 30).len() == 2)
    })
    .unwrap();

    // The API server restarted while a client on node-1 connects every 20 ms: not one connect fails, and
    // /healthz stays 200 meanwhile (nothing is pending: kube-proxy's rule, so load balancers keep the node).
    let during = c.sim.start_probe("node-1", target, 300, Duration::from_millis(20)).unwrap();
    c.cp.stop_apiserver();
    assert_eq!(http_status(&c, healthz, "/healthz"), 200, "/healthz with the API server down");
    std::thread::sleep(Duration::from_secs(1));
    let back = c.cp.start_apiserver().unwrap();
    eprintln!("API server back after {back:?}; lists so far {}", lists(&c, "node-1"));
    let report = during.wait().unwrap();
    assert_eq!(report.failures(), 0, "connects failed across the restart: {:?}", report.errors());
    // A change after the restart reaches the maps once the watches are back: each retries with kube-rs'
    // default backoff (0.8 s doubling to 30 s, each wait plus up to as much again), as client-go's reflectors
    // in kube-proxy retry theirs.
    c.pod_ready("booking", "web-2", false).unwrap();
    c.cp.wait_for(BACKOFF, "web-2 out of node-1's maps after the restart", |_| {
        Ok(spread_from(&c, "node-1", target, 30) == ["web-1"])
    })
    .unwrap();
    let after_restart = lists(&c, "node-1");
    eprintln!("lists after the restart: {after_restart}");

    // etcd compacted past every resourceVersion the agent holds, then the API server restarted so the
    // watches must resume from them: 410 Gone, a relist, and no connect fails during it.
    let during = c.sim.start_probe("node-1", target, 300, Duration::from_millis(20)).unwrap();
    c.pod_ready("booking", "web-2", true).unwrap();
    c.cp.wait_for(Duration::from_secs(15), "web-2 back in node-1's maps", |_| {
        Ok(spread_from(&c, "node-1", target, 30).len() == 2)
    })
    .unwrap();
    c.cp.stop_apiserver();
    let revision = c.cp.compact().unwrap();
    c.cp.start_apiserver().unwrap();
    c.cp.wait_for(BACKOFF, "a relist after the compaction", |_| Ok(lists(&c, "node-1") > after_restart))
        .unwrap();
    let report = during.wait().unwrap();
    assert_eq!(report.failures(), 0, "connects failed across the relist: {:?}", report.errors());
    eprintln!(
        "compacted at revision {revision}: lists {first} -> {after_restart} -> {}",
        lists(&c, "node-1")
    );
    // The relisted state is the truth: a change made now arrives.
    c.pod_ready("booking", "web-2", false).unwrap();
    c.cp.wait_for(BACKOFF, "web-2 out of node-1's maps after the relist", |_| {
        Ok(spread_from(&c, "node-1", target, 30) == ["web-1"])
    })
    .unwrap();
}

#[test]
fn a_permission_removed_from_the_cluster_role_is_named_and_the_maps_keep_serving() {
    let (mut c, target) = one_web("rk-rbac", &["--watch-timeout", "2s"], addr("10.244.1.50:8080"));

    // The ClusterRole of deploy/rbac.yaml without its EndpointSlice rule.
    c.cp.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: tierlb}\nrules:\n\
         - apiGroups: [\"\"]\n  resources: [services, nodes]\n  verbs: [get, list, watch]\n",
    )
    .unwrap();
    let log = c.sim.node("node-1").log.clone();
    let named = "the service account may not watch endpointslices.discovery.k8s.io";
    c.cp.wait_for(Duration::from_secs(15), "the agent naming the permission it lost", |_| {
        Ok(std::fs::read_to_string(&log).unwrap_or_default().contains(named))
    })
    .unwrap();
    let r = c.sim.probe("node-1", target, 20, Duration::ZERO).unwrap();
    assert_eq!(r.count("web-1"), 20, "the maps keep serving: {:?}", r.errors());

    // An agent starting meanwhile (node-2's) asks for its access first, and refuses to start, naming the
    // rule to add.
    let refused = c.add_node("node-2", Some("zone-a"), &[]).expect_err("no agent starts without the rule");
    let text = format!("{refused:#}");
    let start = "the service account may not list endpointslices.discovery.k8s.io: add to its ClusterRole a \
                 rule with apiGroups [\"discovery.k8s.io\"]";
    assert!(text.contains(start), "{text}");

    // Given back, the watch resumes and changes arrive again.
    c.cp.kubectl(&["apply", "-f", &deploy().join("rbac.yaml").display().to_string()]).unwrap();
    c.start_pod("booking", "web-2", "node-1", &[("app", "web")], addr("10.244.1.51:8080")).unwrap();
    c.cp.wait_for(Duration::from_secs(20), "web-2 in node-1's maps once the permission is back", |_| {
        Ok(spread_from(&c, "node-1", target, 30).len() == 2)
    })
    .unwrap();
}

#[test]
fn deploy_is_accepted_by_the_api_server_and_grants_exactly_what_the_agent_uses() {
    let cp = ControlPlane::start("rk-deploy", Options::default()).unwrap();
    let dir = deploy().display().to_string();
    // deploy/ as the README says to apply it, with the required setting made.
    let out = cp.kubectl(&["apply", "--dry-run=server", "-k", &dir]).unwrap();
    assert!(out.contains("daemonset.apps/tierlb created (server dry run)"), "{out}");
    let out = cp.kubectl(&["apply", "-k", &dir]).unwrap();
    assert!(out.contains("daemonset.apps/tierlb created"), "{out}");
    let sa = "system:serviceaccount:kube-system:tierlb";
    let can = |verb: &str, resource: &str| match cp.kubectl(&[
        "auth",
        "can-i",
        verb,
        resource,
        "--all-namespaces",
        &format!("--as={sa}"),
    ]) {
        Ok(out) => out.trim() == "yes",
        Err(e) => {
            assert!(e.to_string().contains("no"), "{e}");
            false
        }
    };
    for (group, resource, verbs) in tierlb::source::kube::NEEDED {
        let resource = if group.is_empty() { resource.to_owned() } else { format!("{resource}.{group}") };
        for verb in verbs {
            assert!(can(verb, &resource), "{sa} may not {verb} {resource}");
        }
    }
    for (verb, resource) in
        [("create", "endpointslices.discovery.k8s.io"), ("get", "secrets"), ("list", "pods")]
    {
        assert!(!can(verb, resource), "{sa} may {verb} {resource}: more than the agent needs");
    }
    // The uninstall manifests too.
    let uninstall = deploy().join("uninstall").display().to_string();
    let out = cp.kubectl(&["apply", "--dry-run=server", "-k", &uninstall]).unwrap();
    assert!(out.contains("(server dry run)"), "{out}");
}

/// `tierlb ARGS` with `kubeconfig`, inside the control plane's namespace: (exit code, stdout, stderr).
fn tierlb_as(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(TIERLB);
    cmd.args(args).env("KUBECONFIG", kubeconfig).env("NO_COLOR", "1");
    lb_testkit::sandbox::confine(&mut cmd, None, Some(&cp.netns)).unwrap();
    let out = cmd.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_read_only_faces_read_the_real_api_server_as_the_storys_operator() {
    let cp = ControlPlane::start("rk-faces", Options::default()).unwrap();
    for (i, (node, zone)) in
        [("node-1", "zone-a"), ("node-2", "zone-b"), ("node-3", "zone-b")].iter().enumerate()
    {
        cp.add_node(node, Some(zone), format!("10.0.0.{}", i + 1).parse().unwrap()).unwrap();
    }
    cp.add_namespace("booking").unwrap();
    for (pod, node, ip) in
        [("cache-node-1", "node-1", "10.244.1.20"), ("cache-node-2", "node-2", "10.244.2.20")]
    {
        cp.add_pod("booking", pod, node, &[("app", "nginx-cache")], 8080).unwrap();
        cp.pod_status("booking", pod, ip.parse().unwrap(), true).unwrap();
    }
    // The dead line the story's fix removes: Local beside PreferSameNode (the Local policy wins).
    cp.apply(&CACHE.replace(
        "  internalTrafficPolicy: Local\n",
        "  internalTrafficPolicy: Local\n  trafficDistribution: PreferSameNode\n",
    ))
    .unwrap();
    cp.wait_for(Duration::from_secs(30), "the controller's hints", |cp| {
        let slices = cp.slices("booking", "nginx-cache")?;
        Ok(slices["items"][0]["endpoints"].as_array().is_some_and(|eps| {
            eps.len() == 2 && eps.iter().all(|e| e["hints"]["forNodes"][0]["name"] == e["nodeName"])
        }))
    })
    .unwrap();
    // The story's operator: get and list on Services and EndpointSlices in booking, nothing else.
    cp.apply(lb_testkit::story::OPERATOR_READ).unwrap();
    let operator = cp.kubeconfig("operator");

    // lint finds the dead line, from the real slices, and says what it could not read.
    let (code, out, err) = tierlb_as(&cp, &operator, &["lint", "--kube", "--namespace", "booking"]);
    assert_eq!(code, 1, "findings exit 1\n{out}\n{err}");
    assert!(out.contains("booking/nginx-cache") && out.contains("dead-local-line"), "{out}");
    assert!(err.contains("may not list Nodes"), "the operator may not list Nodes, and is told: {err}");
    assert!(!err.contains("carry no hints"), "the controller's own hints are read, not emulated: {err}");

    // plan and explain for node-1: the Local policy gives node-1 its own pod.
    let (code, out, err) =
        tierlb_as(&cp, &operator, &["plan", "--node", "node-1", "--kube", "-n", "booking"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("booking/nginx-cache") && out.contains("10.244.1.20"), "{out}");
    let (code, out, err) =
        tierlb_as(&cp, &operator, &["explain", "booking/nginx-cache", "--node", "node-1", "--kube"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("10.244.1.20"), "{out}");

    // Without --namespace the operator may list nothing: the error names the resource and the fix.
    let (code, out, err) = tierlb_as(&cp, &operator, &["plan", "--node", "node-1", "--kube"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("services") && err.contains("--namespace"), "{err}");

    // kubectl's --kubeconfig and --context, with no KUBECONFIG: a file whose current context names an
    // address nothing listens on, beside the operator's context.
    let (_dir, file) = context_file(&operator);
    let faces = |extra: &[&str]| {
        let mut cmd = std::process::Command::new(TIERLB);
        cmd.args(["lint", "--kube", "-n", "booking", "--kubeconfig", file.to_str().unwrap()])
            .args(extra)
            .env_remove("KUBECONFIG")
            .env("NO_COLOR", "1");
        lb_testkit::sandbox::confine(&mut cmd, None, Some(&cp.netns)).unwrap();
        let out = cmd.output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, out) = faces(&["--context", "operator"]);
    assert_eq!(code, 1, "the operator's context reads the findings:\n{out}");
    assert!(out.contains("dead-local-line"), "{out}");
    let (code, _) = faces(&[]);
    assert_eq!(code, 3, "the file's current context (nothing listening) cannot be read");
}

/// A kubeconfig with the operator's user and cluster as context `operator`, and a current context `broken`
/// whose server is a loopback port nothing listens on.
fn context_file(operator: &Path) -> (lb_testkit::sandbox::TempDir, PathBuf) {
    let text = std::fs::read_to_string(operator).unwrap();
    let mut v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let cluster = v["clusters"][0].clone();
    let user = v["users"][0]["name"].as_str().unwrap().to_owned();
    let mut broken = cluster.clone();
    broken["name"] = "broken".into();
    broken["cluster"]["server"] = "https://127.0.0.1:1".into();
    v["clusters"] = serde_json::json!([cluster, broken]);
    let name = v["clusters"][0]["name"].as_str().unwrap().to_owned();
    v["contexts"] = serde_json::json!([
        {"name": "operator", "context": {"cluster": name, "user": user}},
        {"name": "broken", "context": {"cluster": "broken", "user": user}},
    ]);
    v["current-context"] = "broken".into();
    let dir = lb_testkit::sandbox::TempDir::new("rk-contexts").unwrap();
    let file = dir.path().join("config");
    std::fs::write(&file, serde_json::to_string(&v).unwrap()).unwrap();
    (dir, file)
}

/// Requests the API server has served (`apiserver_request_total`) of `verb` on `resource` at `scope`.
fn served(cp: &ControlPlane, verb: &str, resource: &str, scope: &str) -> u64 {
    let metrics = cp.kubectl(&["get", "--raw", "/metrics"]).unwrap();
    let labels =
        [format!("resource=\"{resource}\""), format!("scope=\"{scope}\""), format!("verb=\"{verb}\"")];
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{") && labels.iter().all(|k| l.contains(k.as_str()))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn a_cluster_reader_reads_every_namespace_page_by_page_and_study_reads_the_story_as_its_files_say() {
    // Dual-stack, as booking-api is.
    let cidrs = Options { service_cidr: Some("10.96.0.0/16,fd00:96::/108".into()), ..Options::default() };
    let cp = ControlPlane::start("rk-study", cidrs).unwrap();
    let admin = cp.kubeconfig("admin");
    let story = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/story");
    cp.add_namespace("booking").unwrap();
    // booking-api's stray trafficDistribution (PreferNearby) is a value the API server refuses: only a
    // manifests dump can hold it. The rest of the story is applied as its files say, into a copy the
    // manifests runs read too; node-1's PDF endpoint names its pod, as the controller's slices do.
    let api = story.join("booking-api.yaml").display().to_string();
    let refused = cp.kubectl(&["apply", "--dry-run=server", "-f", &api]);
    let refused = refused.expect_err("the API server validates trafficDistribution").to_string();
    assert!(refused.contains("trafficDistribution") && refused.contains("PreferNearby"), "{refused}");
    let files = lb_testkit::sandbox::TempDir::new("rk-story").unwrap();
    for name in ["nodes.yaml", "nginx-cache.yaml", "pdf-resume.yaml"] {
        let mut text = std::fs::read_to_string(story.join(name)).unwrap();
        if name == "pdf-resume.yaml" {
            text = text.replacen(
                "    nodeName: node-1\n",
                "    nodeName: node-1\n    targetRef: {kind: Pod, namespace: booking, name: pdf-a}\n",
                1,
            );
        }
        std::fs::write(files.path().join(name), &text).unwrap();
        cp.kubectl_stdin(&["apply", "-f", "-"], &text).unwrap();
    }
    let dir = files.path().display().to_string();
    let run = |args: &[&str]| {
        let (code, out, err) = tierlb_as(&cp, &admin, args);
        assert_eq!(code, 0, "tierlb {args:?}\n{out}\n{err}");
        out
    };
    for argv in [
        &["study", "-n", "booking", "--drain", "node-1", "--crash", "10.244.3.21"][..],
        &["study", "-n", "booking", "-o", "json", "--roll"][..],
    ] {
        let from_kube = run(&[argv, &["--kube"]].concat());
        let from_files = run(&[argv, &["--manifests", &dir]].concat());
        let (kube, files) = (
            from_kube.replacen("the API server", "ORIGIN", 1),
            from_files.replacen(&format!("--manifests {dir}"), "ORIGIN", 1),
        );
        let differ = kube.lines().zip(files.lines()).position(|(a, b)| a != b);
        assert!(
            differ.is_none() && kube.lines().count() == files.lines().count(),
            "{argv:?}: line {differ:?} differs\n--kube:      {:?}\n--manifests: {:?}",
            differ.map(|i| kube.lines().nth(i)),
            differ.map(|i| files.lines().nth(i)),
        );
        assert!(from_kube.contains("booking/pdf-resume"), "{from_kube}");
    }
    // A pod named by its targetRef, as the API server's slices have it: the same figures as by its IP.
    let phases = |crash: &str| {
        let out =
            run(&["study", "--kube", "-o", "json", "--service", "booking/pdf-resume", "--crash", crash]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["services"][0]["study"]["phases"].clone()
    };
    let (by_name, by_ip) = (phases("pdf-a"), phases("10.244.1.21"));
    assert_eq!(by_name[1]["phase"], "booking/pdf-a crashed, unseen by the control plane");
    assert_eq!(by_name[1]["models"], by_ip[1]["models"]);

    // A cluster reader (the admin) reads every namespace: 1,201 more Services in another, listed in pages
    // of 500 (three requests, counted by the API server itself), and the Nodes' zones.
    cp.add_namespace("bulk").unwrap();
    let bulk: Vec<String> = (0..1_201)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: bulk}}\n\
                 spec: {{ports: [{{port: 80}}]}}\n"
            )
        })
        .collect();
    let bulk = bulk.join("---\n");
    cp.kubectl_stdin(&["create", "-f", "-"], &bulk).unwrap();
    cp.kubectl(&["label", "node", "node-2", "topology.kubernetes.io/zone=zone-b"]).unwrap();
    let before = served(&cp, "LIST", "services", "cluster");
    let out = run(&["plan", "--node", "node-2", "--kube"]);
    assert_eq!(served(&cp, "LIST", "services", "cluster") - before, 3, "three pages of 500");
    assert!(out.contains("node node-2 zone zone-b"), "{out}");
    let planned = out.lines().filter(|l| l.starts_with("bulk/s")).count();
    assert_eq!(planned, 1_201, "{out}");
    assert!(out.contains("booking/pdf-resume") && out.contains("default/kubernetes"), "{out}");
}

#[test]
fn the_agent_as_deployed_reads_the_real_api_server_with_its_service_accounts_token() {
    // deploy/ applied to the API server, the DaemonSet's container run as the kubelet would run it on
    // node-1: its constraints (lb_testkit::deployed), its service account's token and the API server's
    // address (api-server.env's required setting) given as the kubelet gives them.
    let mut cp = ControlPlane::start("rk-boxed", Options::default()).unwrap();
    cp.kubectl(&["apply", "-k", &deploy().display().to_string()]).unwrap();
    let mut boxed = lb_testkit::deployed::BoxedNode::new("rk-boxed", Path::new(TIERLB), &deploy()).unwrap();
    cp.link(&boxed.node.netns).unwrap();
    cp.add_node("node-1", Some("zone-a"), "10.0.0.1".parse().unwrap()).unwrap();
    cp.add_node("node-2", Some("zone-a"), "10.0.0.2".parse().unwrap()).unwrap();
    cp.add_namespace("booking").unwrap();
    // Two web pods behind node-1's veths (one of them node-2's by its Pod object) and a client pod.
    let mut servers = Vec::new();
    for (pod, node, ip) in [("web-node-1", "node-1", "10.244.1.60"), ("web-node-2", "node-2", "10.244.2.60")]
    {
        let ns = boxed.node.add_pod(pod, ip.parse().unwrap()).unwrap();
        let at = SocketAddr::new(ip.parse().unwrap(), 8080);
        servers.push((lb_testkit::sandbox::NamedServer::start(&lab(), &ns, at, pod).unwrap(), ns));
        cp.add_pod("booking", pod, node, &[("app", "web")], 8080).unwrap();
        cp.pod_status("booking", pod, at.ip(), true).unwrap();
    }
    let client = boxed.node.add_pod("client", "10.244.1.99".parse().unwrap()).unwrap();
    cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: booking}\n\
         spec:\n  selector: {app: web}\n  trafficDistribution: PreferSameNode\n  \
         ports: [{name: http, port: 80, targetPort: 8080}]\n",
    )
    .unwrap();
    let target = vip(&cp, "booking", "web", 80);
    let in_cluster = cp.in_cluster("kube-system", "tierlb").unwrap();
    let agent = boxed.start_agent_kube("node-1", &in_cluster, &[]).unwrap();
    let log = std::fs::read_to_string(&boxed.log).unwrap();
    assert!(log.contains("listing from the API server"), "the agent read the API server:\n{log}");

    // The controller's forNodes hint: node-1's client reaches only node-1's pod.
    let only = |want: &str| {
        let r = boxed.probe(&client, &target.to_string(), 20).unwrap();
        r.count(want) == 20
    };
    cp.wait_for(Duration::from_secs(10), "node-1's client on its own pod", |_| Ok(only("web-node-1")))
        .unwrap();
    // Its pod not Ready: the agent follows the slice the controller rewrote.
    cp.pod_status("booking", "web-node-1", "10.244.1.60".parse().unwrap(), false).unwrap();
    cp.wait_for(Duration::from_secs(10), "node-1's client on node-2's pod", |_| Ok(only("web-node-2")))
        .unwrap();
    agent.stop();
}
