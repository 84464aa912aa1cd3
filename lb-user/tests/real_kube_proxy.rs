//! Real kube-proxy v1.36.3 (built here from Kubernetes' code, `lb_testkit::kube_proxy`) beside tierlb, on the
//! cluster in a box: the program tierlb replaces, run in a network namespace the test made, in iptables
//! mode and in nftables mode, reading the same API server as tierlb's agent.
//!
//! The differential (kube-proxy against tierlb over every Service shape) is in `kube_proxy_differential.rs`.
use std::{net::SocketAddr, path::Path, time::Duration};

use lb_testkit::{
    kube::{KubeCluster, Options},
    kube_proxy::{HEALTHZ_PORT, KubeProxy, METRICS_PORT, Mode, http_get},
};
use serde_json::Value;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// tierlb's `/healthz` beside kube-proxy's (which has 10256) in the one namespace.
const TIERLB_HEALTHZ: &str = "127.0.0.1:10257";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// `/healthz` of kube-proxy and of tierlb: (status, body) each.
fn both_healthz(c: &KubeCluster) -> [(u16, Value); 2] {
    let kube_proxy = SocketAddr::new([127, 0, 0, 1].into(), HEALTHZ_PORT);
    [kube_proxy, addr(TIERLB_HEALTHZ)].map(|at| {
        let (code, body) = http_get(&c.sim.netns, at, "/healthz").unwrap();
        (code, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{at}: {e}: {body:?}")))
    })
}

/// Wait until kube-proxy's and tierlb's `/healthz` both answer `code` with `nodeEligible` `eligible`.
fn healthz_agree(c: &KubeCluster, code: u16, eligible: bool, what: &str) {
    c.cp.wait_for(Duration::from_secs(15), what, |c2| {
        let _ = c2;
        Ok(both_healthz(c).iter().all(|(s, body)| *s == code && body["nodeEligible"] == eligible))
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", both_healthz(c)));
}

#[test]
fn kube_proxy_in_iptables_and_nftables_mode_programs_the_cluster_and_its_healthz_agrees_with_tierlbs() {
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut c =
        KubeCluster::start("kp-health", Path::new(TIERLB), &lab, &deploy, Options::default()).unwrap();
    c.add_node("node-1", Some("zone-a"), &["--healthz-addr", TIERLB_HEALTHZ]).unwrap();
    c.cp.add_namespace("booking").unwrap();
    c.start_pod("booking", "web-1", "node-1", &[("app", "web")], addr("10.244.1.10:8080")).unwrap();
    c.cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: booking}\n\
         spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n",
    )
    .unwrap();
    let healthz = SocketAddr::new([127, 0, 0, 1].into(), HEALTHZ_PORT);
    let metrics = SocketAddr::new([127, 0, 0, 1].into(), METRICS_PORT);

    // iptables mode: its rules name the Service and the pod; both say 200, the node eligible.
    let mut proxy =
        KubeProxy::start(&c.cp, "node-1", &c.sim.netns, Mode::Iptables, healthz, metrics).unwrap();
    c.cp.wait_for(Duration::from_secs(15), "kube-proxy's iptables rules for booking/web", |_| {
        let rules = proxy.rules()?;
        Ok(rules.contains("booking/web:http") && rules.contains("10.244.1.10:8080"))
    })
    .unwrap();
    healthz_agree(&c, 200, true, "both healthy");
    for (code, body) in both_healthz(&c) {
        for field in ["lastUpdated", "currentTime"] {
            assert!(body[field].as_str().is_some_and(|t| t.ends_with('Z')), "{code} {body}");
        }
    }
    // The cluster autoscaler's taint: kube-proxy (1.31+) fails /healthz so that load balancers drain the
    // node; so does tierlb. Removed: both healthy again.
    let taint = "ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule";
    c.cp.kubectl(&["taint", "node", "node-1", taint]).unwrap();
    healthz_agree(&c, 503, false, "both draining the tainted node");
    c.cp.kubectl(&["taint", "node", "node-1", &format!("{taint}-")]).unwrap();
    healthz_agree(&c, 200, true, "both healthy once the taint is gone");
    proxy.stop(Duration::from_secs(10));

    // nftables mode, the same namespace: its table names the Service; a Node being deleted (held by a
    // finalizer) fails both; once it is gone, neither has a Node: both still fail.
    let proxy = KubeProxy::start(&c.cp, "node-1", &c.sim.netns, Mode::Nftables, healthz, metrics).unwrap();
    c.cp.wait_for(Duration::from_secs(15), "kube-proxy's nftables rules for booking/web", |_| {
        let rules = proxy.rules()?;
        Ok(rules.contains("booking/web/tcp/http") && rules.contains("10.244.1.10"))
    })
    .unwrap_or_else(|e| panic!("{e}: {}", proxy.rules().unwrap_or_default()));
    healthz_agree(&c, 200, true, "both healthy under nftables");
    c.cp.kubectl(&["patch", "node", "node-1", "-p", r#"{"metadata":{"finalizers":["tierlb.test/hold"]}}"#])
        .unwrap();
    c.cp.kubectl(&["delete", "node", "node-1", "--wait=false"]).unwrap();
    healthz_agree(&c, 503, false, "both draining the node being deleted");
    c.cp.kubectl(&[
        "patch",
        "node",
        "node-1",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .unwrap();
    c.cp.wait_for(Duration::from_secs(15), "node-1 gone", |cp| {
        Ok(cp.kubectl(&["get", "node", "node-1"]).is_err())
    })
    .unwrap();
    healthz_agree(&c, 503, false, "both without a Node");
}
