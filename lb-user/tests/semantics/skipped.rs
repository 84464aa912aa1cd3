//! kube-proxy's label filters and the ports tierlb does not translate: what the manifests source takes in
//! (through parse, conversion and the model, as the agent does), what `plan` lists as not programmed, with
//! which reason, and what `explain` says.
use std::path::Path;

use serde_json::{Value, json};
use tierlb::{
    model::{Model, NodeInfo, ObjKey},
    plan,
    source::manifests::parse_text,
};

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop, labels: LABELS}
spec:
  clusterIP: 10.96.0.10
  ports: PORTS
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: SLICE_LABELS}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: sig, port: 3868, protocol: SCTP}]
endpoints: [{addresses: [10.244.1.5], nodeName: node-1}]
";

const TCP: &str = "[{name: http, port: 80}]";

/// The model the manifests source builds from one file.
fn model_of(labels: &str, ports: &str, slice_labels: &str) -> Model {
    let text =
        SERVICE.replace("SLICE_LABELS", slice_labels).replace("LABELS", labels).replace("PORTS", ports);
    let (objects, diagnostics) = parse_text(Path::new("web.yaml"), &text);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let mut m = Model::default();
    for o in objects {
        o.insert_into(&mut m);
    }
    m
}

const SLICE: &str = "{kubernetes.io/service-name: web}";

/// (case, Service labels, ports, ports planned as "name/protocol", `skipped` as `plan -o json` writes it).
type Case = (&'static str, &'static str, &'static str, &'static [&'static str], Value);

#[test]
fn services_kube_proxy_skips_and_sctp_ports_are_listed_as_not_programmed_with_the_reason() {
    let proxy_name = "labelled service.kubernetes.io/service-proxy-name=kube-router: meant for another proxy, \
                      as kube-proxy skips it";
    let headless = "labelled service.kubernetes.io/headless: the EndpointSlice controller's mark of a headless \
                    Service, which kube-proxy skips";
    let cases: Vec<Case> = vec![
        ("no label", "{app: web}", TCP, &["http/TCP"], json!([])),
        (
            "another proxy's Service",
            "{service.kubernetes.io/service-proxy-name: kube-router}",
            TCP,
            &[],
            json!([{"service": "shop/web", "reason": "label", "label": "service_proxy_name",
                    "value": "kube-router", "message": proxy_name}]),
        ),
        (
            "the label with an empty value counts",
            "{service.kubernetes.io/service-proxy-name: ''}",
            TCP,
            &[],
            json!([{"service": "shop/web", "reason": "label", "label": "service_proxy_name", "value": "",
                    "message": proxy_name.replace("=kube-router", "=")}]),
        ),
        (
            "the headless mark on a Service",
            "{service.kubernetes.io/headless: ''}",
            TCP,
            &[],
            json!([{"service": "shop/web", "reason": "label", "label": "headless", "value": "",
                    "message": headless}]),
        ),
        (
            "a label of a similar name is not kube-proxy's",
            "{service.kubernetes.io/service-proxy: x}",
            TCP,
            &["http/TCP"],
            json!([]),
        ),
        (
            "an SCTP port is listed, the TCP port beside it programmed",
            "{}",
            "[{name: http, port: 80}, {name: sig, port: 3868, protocol: SCTP}]",
            &["http/TCP"],
            json!([{"service": "shop/web", "port_name": "sig", "port": 3868, "protocol": "SCTP",
                    "reason": "sctp",
                    "message": "protocol SCTP is not translated by tierlb (its socket hooks are tested with TCP \
                                and UDP only): connects to this port need kube-proxy or another data plane"}]),
        ),
    ];
    let node = NodeInfo::new("node-1", None);
    for (case, labels, ports, planned, want) in cases {
        let m = model_of(labels, ports, SLICE);
        let p = plan::plan(&m, &node);
        let got: Vec<String> =
            p.services.iter().map(|s| format!("{}/{}", s.name.port, s.protocol.as_str())).collect();
        assert_eq!(got, planned, "{case}: ports planned");
        assert_eq!(serde_json::to_value(&p).unwrap()["skipped"], want, "{case}: plan -o json");
        // The table's section holds one line per expected entry, naming its Service and saying its message
        // (both from the expected JSON above, not from the entry's own rendering).
        let table = tierlb::cli::plan_table(&p, &tierlb::cli::TableNotes::default());
        let section: Vec<&str> = table
            .split("\nnot programmed:\n")
            .nth(1)
            .map(|t| t.lines().take_while(|l| l.starts_with("  ")).collect())
            .unwrap_or_default();
        let want = want.as_array().unwrap();
        assert_eq!(section.len(), want.len(), "{case}:\n{table}");
        for (line, w) in section.iter().zip(want) {
            let (svc, msg) = (w["service"].as_str().unwrap(), w["message"].as_str().unwrap());
            assert!(line.contains(svc) && line.ends_with(msg), "{case}: {line:?} for {w}");
        }
    }
}

#[test]
fn a_slice_kube_proxy_skips_leaves_its_service_without_those_endpoints() {
    // A slice marked headless is never seen by kube-proxy: the Service has no endpoint and rejects.
    let m = model_of("{}", TCP, "{kubernetes.io/service-name: web, service.kubernetes.io/headless: ''}");
    assert!(m.slices.is_empty());
    let p = plan::plan(&m, &NodeInfo::new("node-1", None));
    assert_eq!(p.services[0].internal.when_empty, Some(plan::WhenEmpty::Reject));
    let m = model_of("{}", TCP, SLICE);
    let p = plan::plan(&m, &NodeInfo::new("node-1", None));
    assert_eq!(p.services[0].internal.when_empty, None, "the same slice without the label is used");
}

#[test]
fn explain_says_why_a_service_or_a_port_is_not_programmed() {
    let node = NodeInfo::new("node-1", None);
    let key = ObjKey::new("shop", "web");
    let m = model_of("{service.kubernetes.io/service-proxy-name: kube-router}", TCP, SLICE);
    let text = tierlb::explain::explain(&m, &node, &key).expect("a skipped Service is explained");
    assert!(
        text.contains(
            "not programmed: labelled service.kubernetes.io/service-proxy-name=kube-router: meant for another \
             proxy, as kube-proxy skips it"
        ),
        "{text}"
    );
    assert!(!text.contains("internal traffic"), "nothing is planned for it:\n{text}");
    let m = model_of("{}", "[{name: http, port: 80}, {name: sig, port: 3868, protocol: SCTP}]", SLICE);
    let text = tierlb::explain::explain(&m, &node, &key).unwrap();
    assert!(text.contains("port http 80/TCP"), "{text}");
    assert!(text.contains("port sig 3868/SCTP: not programmed: protocol SCTP is not translated"), "{text}");
}
