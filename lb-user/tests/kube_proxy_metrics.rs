//! kube-proxy's metric families from a running agent, scraped from `/metrics` and parsed strictly
//! (`common::exposition`): names, types, labels and buckets as kube-proxy 1.35 has them, and values that
//! follow what the agent did (slice edits counted, network programming observed from the trigger-time
//! annotation, a Local Service without a local endpoint counted). And kube-proxy's label filter in the
//! kernel: a labelled Service's VIP is not translated, an unlabelled one is. Real sockets in a private netns.
#![expect(
    clippy::float_cmp,
    reason = "the values compared are counts and bucket bounds, written exactly in the text and in f64"
)]
mod common;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use common::{OwnAgent, cluster, eventually, exposition, free_port, get};
use lb_testkit::manifests::{Ep, Svc, to_yaml, write_atomic, write_service};
use serde_json::{Value, json};

/// `svc` with its slice, the slice annotated with `trigger` (and every object labelled `labels`).
fn write_with(dir: &std::path::Path, svc: &Svc, eps: &[Ep], trigger: Option<SystemTime>, labels: &Value) {
    let mut docs = vec![svc.service()];
    docs.extend(svc.slices(eps));
    for d in &mut docs {
        let meta = d["metadata"].as_object_mut().unwrap();
        let l = meta.entry("labels").or_insert_with(|| json!({}));
        for (k, v) in labels.as_object().unwrap() {
            l[k] = v.clone();
        }
        if let (Some(t), "EndpointSlice") = (trigger, d["kind"].as_str().unwrap()) {
            d["metadata"]["annotations"] =
                json!({"endpoints.kubernetes.io/last-change-trigger-time": tierlb::server::rfc3339(t)});
        }
    }
    write_atomic(dir, &format!("{}.yaml", svc.name), &to_yaml(&docs)).unwrap();
}

fn scrape(port: u16) -> BTreeMap<String, exposition::MetricFamily> {
    let (status, body) = get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    exposition::parse(&body)
}

#[test]
#[expect(clippy::too_many_lines, reason = "one agent's story, checked step by step")]
fn kube_proxys_metrics_follow_the_agent_and_a_labelled_service_is_not_translated() {
    let mut c = cluster("kpmetrics");
    let dir = c.manifests.path().to_owned();
    let web_pod: SocketAddr = "10.244.2.10:8080".parse().unwrap();
    let routed_pod: SocketAddr = "10.244.2.20:8080".parse().unwrap();
    c.add_pod(web_pod, "web-pod").unwrap();
    c.add_pod(routed_pod, "routed-pod").unwrap();
    let web = Svc::new("web", "10.96.0.10".parse().unwrap(), 80, 8080);
    write_with(&dir, &web, &[Ep::ready(web_pod.ip(), "node-2")], None, &json!({}));
    let routed = Svc::new("routed", "10.96.0.20".parse().unwrap(), 80, 8080);
    let other_proxy = json!({"service.kubernetes.io/service-proxy-name": "kube-router"});
    write_with(&dir, &routed, &[Ep::ready(routed_pod.ip(), "node-2")], None, &other_proxy);
    // Internal traffic policy Local, its only endpoint on node-2: kube-proxy on node-1 would DROP.
    let mut local = Svc::new("local", "10.96.0.30".parse().unwrap(), 80, 8080);
    local.internal_traffic_policy = Some("Local");
    write_service(&dir, &local, &[Ep::ready(web_pod.ip(), "node-2")]).unwrap();

    let mp = free_port();
    let mp_s = format!("127.0.0.1:{mp}");
    let agent = OwnAgent::start(&c, &["--healthz-addr", "off", "--metrics-addr", &mp_s]);

    // The label filter, in the kernel: the unlabelled VIP reaches its pod, the labelled one is left alone.
    let web_vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let routed_vip: SocketAddr = "10.96.0.20:80".parse().unwrap();
    let timeout = Duration::from_secs(1);
    assert_eq!(agent.probe(&c, web_vip, 5, timeout).count("web-pod"), 5);
    let r = agent.probe(&c, routed_vip, 5, timeout);
    assert_eq!((r.failures(), r.count("routed-pod")), (5, 0), "not translated: {:?}", r.errors());

    let m = scrape(mp);
    let family = |m: &BTreeMap<String, exposition::MetricFamily>, name: &str, kind: &str| {
        let f = m.get(name).unwrap_or_else(|| panic!("no {name} in {:?}", m.keys().collect::<Vec<_>>()));
        assert_eq!(f.kind, kind, "{name}");
        f.clone()
    };
    // Names, types, help, labels and buckets as kube-proxy's.
    let sync = family(&m, "kubeproxy_sync_proxy_rules_duration_seconds", "histogram");
    // prometheus-client ends every help text with a period.
    assert_eq!(sync.help, "SyncProxyRules latency in seconds.");
    let les: Vec<String> = sync
        .samples
        .iter()
        .filter(|s| s.name.ends_with("_bucket") && s.labels["ip_family"] == "IPv4")
        .map(|s| s.labels["le"].clone())
        .collect();
    let want: Vec<f64> = (0..15).map(|i| 0.001 * 2f64.powi(i)).collect();
    assert_eq!(les.len(), 16, "15 buckets and +Inf: {les:?}");
    for (le, w) in les.iter().zip(&want) {
        assert!((le.parse::<f64>().unwrap() - w).abs() < 1e-9, "{les:?}");
    }
    let synced = |m: &BTreeMap<String, exposition::MetricFamily>, fam: &str| {
        family(m, "kubeproxy_sync_proxy_rules_duration_seconds", "histogram")
            .value("kubeproxy_sync_proxy_rules_duration_seconds_count", &[("ip_family", fam)])
    };
    assert!(synced(&m, "IPv4") >= 1.0 && synced(&m, "IPv6") == synced(&m, "IPv4"));
    let last = family(&m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let at = last.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", &[("ip_family", "IPv4")]);
    assert!(now - 60.0 < at && at <= now, "last sync at {at}, now {now}");
    let no_local = family(&m, "kubeproxy_sync_proxy_rules_no_local_endpoints_total", "gauge");
    let nl = |policy, fam| {
        no_local.value(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            &[("traffic_policy", policy), ("ip_family", fam)],
        )
    };
    assert_eq!((nl("internal", "IPv4"), nl("external", "IPv4"), nl("internal", "IPv6")), (1.0, 0.0, 0.0));
    let changes = |m: &BTreeMap<String, exposition::MetricFamily>, what: &str| {
        let name = format!("kubeproxy_sync_proxy_rules_{what}_changes");
        let f = family(m, &name, "counter");
        let pending = family(m, &format!("{name}_pending"), "gauge");
        (f.value(&format!("{name}_total"), &[]), pending.value(&format!("{name}_pending"), &[]))
    };
    // At start: web's and local's Service and slice (routed's are kube-proxy's to skip); a directory has
    // no queue.
    assert_eq!(changes(&m, "service"), (2.0, 0.0));
    assert_eq!(changes(&m, "endpoint"), (2.0, 0.0));
    let programming = |m: &BTreeMap<String, exposition::MetricFamily>| {
        let f = family(m, "kubeproxy_network_programming_duration_seconds", "histogram");
        let labels = [("ip_family", "IPv4")];
        let count = f.value("kubeproxy_network_programming_duration_seconds_count", &labels);
        let sum = f.value("kubeproxy_network_programming_duration_seconds_sum", &labels);
        (count, sum, f)
    };
    // Nothing was triggered after the agent started: like kube-proxy's histogram vector, the family has no
    // series yet, so it is not written.
    assert!(!m.contains_key("kubeproxy_network_programming_duration_seconds"));

    // Trigger times are whole seconds (as the EndpointSlice controller's, written RFC 3339): wait for the
    // next second, so that "now" written that way is after the agent's start.
    let ready = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    std::thread::sleep(Duration::from_nanos(1_000_000_000 - u64::from(ready.subsec_nanos())));
    // Three edits of web's slice, each triggered now: three endpoint changes, three latencies observed.
    for i in 0..3u8 {
        let before = agent.syncs();
        let eps = [
            Ep::ready(web_pod.ip(), "node-2"),
            Ep::ready(format!("10.244.3.{i}").parse().unwrap(), "node-3"),
        ];
        write_with(&dir, &web, &eps, Some(SystemTime::now()), &json!({}));
        assert!(eventually(5, || agent.syncs() > before), "edit {i} synced");
    }
    // A fourth edit triggered before the agent started: a change, but no latency (kube-proxy's
    // trackerStartTime).
    let before = agent.syncs();
    // 2020-01-01T00:00:00Z.
    let old = UNIX_EPOCH + Duration::from_hours(438_288);
    write_with(&dir, &web, &[Ep::ready(web_pod.ip(), "node-2")], Some(old), &json!({}));
    assert!(eventually(5, || agent.syncs() > before));
    let mut m = scrape(mp);
    // The metrics snapshot follows the loop's tick; the statistics are shared atomics, read as they are.
    assert!(eventually(3, || {
        m = scrape(mp);
        changes(&m, "endpoint").0 == 6.0
    }));
    assert_eq!(changes(&m, "service"), (2.0, 0.0), "the Service itself did not change");
    let (count, sum, f) = programming(&m);
    assert_eq!(count, 3.0, "{:?}", f.samples);
    // Each latency is one sync after the edit plus the second's fraction the annotation drops.
    assert!(sum > 0.0 && sum < 3.0 * 2.0, "sum {sum}");
    let les: Vec<&str> = f
        .samples
        .iter()
        .filter(|s| s.name.ends_with("_bucket") && s.labels["ip_family"] == "IPv4")
        .map(|s| s.labels["le"].as_str())
        .collect();
    assert_eq!(
        les.len(),
        82,
        "kube-proxy's 81 buckets (from 0, 0.25, 0.5, 1..59, 60..115, 120..300) and +Inf"
    );
    assert_eq!(&les[..4], ["0.0", "0.25", "0.5", "1.0"]);
    assert_eq!(les[les.len() - 2].parse::<f64>().unwrap(), 300.0);
    assert!(synced(&m, "IPv4") >= 5.0);
    // tierlb's own families are still there beside kube-proxy's.
    assert_eq!(family(&m, "tierlb_syncs", "counter").value("tierlb_syncs_total", &[]), synced(&m, "IPv4"));
    drop(agent);
}
