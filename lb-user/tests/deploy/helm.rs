//! The Helm chart (deploy/helm/tierlb) beside kustomize: `helm lint` passes; with its default values it renders
//! the same objects as `kubectl kustomize deploy/` (and, with `cleanup=true`, the DaemonSet of
//! deploy/uninstall/); each value users change reaches the agent's flags or the pod as documented, and every
//! render keeps the deploy rules; the renders pass the real API server's validation (a server-side dry run).
//! Helm is v4, built from its module like the control plane (`cargo xtask setup`).
use std::{collections::BTreeMap, path::Path};

use lb_testkit::{
    kube::{ControlPlane, Options},
    sandbox::TempDir,
};
use serde_json::{Value, json};

use super::{Deploy, Scope, assert_agent_flags, failures, render};

fn chart() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tierlb")
}

/// `helm ARGS` with its state in `home` (nothing read or written under the user's own directories).
fn helm(home: &TempDir, args: &[&str]) -> std::process::Output {
    std::process::Command::new(lb_testkit::kube::k8s_bin("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("helm")
}

/// `helm template tierlb CHART -n kube-system --set S...`: its text.
fn template_text(home: &TempDir, sets: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", "tierlb", chart.to_str().unwrap(), "--namespace", "kube-system"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = helm(home, &args);
    assert!(out.status.success(), "helm template {sets:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The objects `helm template` renders with `sets`.
fn template(home: &TempDir, sets: &[&str]) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(&template_text(home, sets))
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Objects keyed by kind and name, as comparable: kustomize's ConfigMap name suffix (a hash of its content)
/// and the references to it dropped, and the chart's checksum annotation (its way to roll the pods on a
/// change of that ConfigMap) dropped.
fn comparable(docs: &[Value]) -> BTreeMap<(String, String), Value> {
    let mut text = serde_json::to_string(docs).unwrap();
    let hashed = kustomize_hashed_names(&text, "tierlb-api-server-");
    for h in hashed {
        text = text.replace(&h, "tierlb-api-server");
    }
    let docs: Vec<Value> = serde_json::from_str(&text).unwrap();
    docs.into_iter()
        .map(|mut d| {
            if let Some(meta) = d.pointer_mut("/spec/template/metadata").and_then(Value::as_object_mut) {
                if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                    a.remove("checksum/api-server");
                }
                if meta
                    .get("annotations")
                    .is_some_and(|a| a.as_object().is_some_and(serde_json::Map::is_empty))
                {
                    meta.remove("annotations");
                }
            }
            let key =
                (d["kind"].as_str().unwrap().to_owned(), d["metadata"]["name"].as_str().unwrap().to_owned());
            (key, d)
        })
        .collect()
}

/// Each `prefix` followed by a 10-character kustomize hash in `text`, with the hash.
fn kustomize_hashed_names(text: &str, prefix: &str) -> Vec<String> {
    text.match_indices(prefix)
        .filter_map(|(i, _)| {
            let rest = &text[i + prefix.len()..];
            let hash: String = rest.chars().take_while(char::is_ascii_alphanumeric).collect();
            (hash.len() == 10).then(|| format!("{prefix}{hash}"))
        })
        .collect()
}

fn chart_field(name: &str) -> String {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    doc[name].as_str().unwrap().to_owned()
}

#[test]
fn the_chart_lints_and_its_defaults_render_what_kustomize_renders() {
    let home = TempDir::new("helm").unwrap();
    let out = helm(&home, &["lint", "--strict", chart().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The release's version everywhere: the chart, the image it tags, deploy/'s image.
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!((chart_field("version"), chart_field("appVersion")), (version.to_owned(), version.to_owned()));
    let image = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/kustomization.yaml"),
    )
    .unwrap();
    assert!(
        image.contains(&format!("newTag: {version}\n")),
        "deploy/image tags the release {version}:\n{image}"
    );

    let (helm_objects, kustomize) = (comparable(&template(&home, &[])), comparable(&render(".")));
    assert_eq!(
        helm_objects.keys().collect::<Vec<_>>(),
        kustomize.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, object) in &kustomize {
        assert_eq!(&helm_objects[key], object, "{key:?}: the chart's render differs from deploy/'s");
    }
    // Uninstall: `cleanup=true` renders deploy/uninstall/'s DaemonSet in place of the agent's.
    let cleanup = comparable(&template(&home, &["cleanup=true"]));
    let uninstall = comparable(&render("uninstall"));
    let ds = |m: &BTreeMap<(String, String), Value>| {
        m.iter().filter(|(k, _)| k.0 == "DaemonSet").map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
    };
    assert_eq!(ds(&cleanup), ds(&uninstall), "cleanup=true renders deploy/uninstall's DaemonSet alone");
}

/// The rendered DaemonSet's pod spec, with `sets`, checked against the deploy rules and the agent's flags.
fn daemonset(home: &TempDir, sets: &[&str]) -> Value {
    let docs = template(home, sets);
    let deploy = Deploy::from_docs(docs.clone());
    // Another image than the release's is the value's point: every other rule holds.
    let own_image = !sets.iter().any(|s| s.starts_with("image."));
    let failed: Vec<String> = failures(&deploy, &[Scope::Every, Scope::Agent])
        .into_iter()
        .filter(|f| own_image || !f.starts_with("image by version"))
        .collect();
    assert!(failed.is_empty(), "{sets:?} breaks:\n{}", failed.join("\n"));
    let agent = deploy.agent().expect("the agent's container");
    assert_agent_flags(agent.args.as_deref().unwrap());
    docs.into_iter().find(|d| d["kind"] == "DaemonSet").unwrap()
}

#[test]
fn each_value_reaches_the_agents_flags_or_the_pod_and_keeps_the_deploy_rules() {
    let home = TempDir::new("helm-values").unwrap();
    let defaults = daemonset(&home, &[]);
    let args = |ds: &Value, container: &str| -> Vec<String> {
        let spec = &ds["spec"]["template"]["spec"];
        let all =
            spec["containers"].as_array().unwrap().iter().chain(spec["initContainers"].as_array().unwrap());
        let c = all.into_iter().find(|c| c["name"] == container).unwrap();
        serde_json::from_value(c["args"].clone()).unwrap()
    };
    let added = |ds: &Value, container: &str| -> Vec<String> {
        let (now, before) = (args(ds, container), args(&defaults, container));
        now.into_iter().filter(|a| !before.contains(a)).collect()
    };
    let cases: [(&str, &[&str], &[&str]); 8] = [
        (
            "nodePortAddresses",
            &["nodePortAddresses={192.168.0.0/16,10.0.0.0/8}"],
            &["--nodeport-addresses=192.168.0.0/16,10.0.0.0/8"],
        ),
        ("devices", &["devices={eth0,bond0}"], &["--devices=eth0,bond0"]),
        ("lbAlgorithm", &["lbAlgorithm=maglev"], &["--lb-algorithm=maglev"]),
        ("xdp", &["xdp=off"], &["--xdp=off"]),
        ("dsr", &["dsr=true"], &["--dsr"]),
        (
            "maps",
            &["maps.services=200000", "maps.conntrack-udp=131072"],
            &["--max-conntrack-udp=131072", "--max-services=200000"],
        ),
        ("metrics", &["metrics.bindAddress=0.0.0.0:10249"], &["--metrics-addr=0.0.0.0:10249"]),
        ("nothing", &["canary.enabled=false"], &[]),
    ];
    for (name, sets, want) in cases {
        let ds = daemonset(&home, sets);
        assert_eq!(added(&ds, "tierlb"), want, "{name}: the agent's added flags");
    }
    // The preflight checks the port the agent will bind (a deploy rule also requires it).
    let ds = daemonset(&home, &["metrics.bindAddress=0.0.0.0:10249"]);
    assert_eq!(added(&ds, "preflight"), ["--metrics-addr=0.0.0.0:10249"]);
    let ds = daemonset(&home, &["canary.enabled=true"]);
    assert_eq!(ds["spec"]["template"]["spec"]["nodeSelector"], json!({"tierlb.io/canary": "true"}));
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let ds = daemonset(
        &home,
        &["image.repository=registry.example.com/tierlb", &format!("image.digest={digest}")],
    );
    let images: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| ds["spec"]["template"]["spec"][k].as_array().unwrap())
        .map(|c| c["image"].as_str().unwrap())
        .collect();
    let want = format!("registry.example.com/tierlb@{digest}");
    assert_eq!(images, [want.as_str(), want.as_str()]);
    let ds = daemonset(&home, &["resources.limits.memory=1Gi"]);
    let agent = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(agent["resources"]["limits"]["memory"], "1Gi");
    // The API server's address: in the ConfigMap, and a change rolls the pods (the checksum annotation).
    let (before, after) = (template(&home, &[]), template(&home, &["apiServer.host=10.0.0.10"]));
    let find = |docs: &[Value], kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap().clone();
    assert_eq!(find(&after, "ConfigMap")["data"]["KUBERNETES_SERVICE_HOST"], "10.0.0.10");
    let checksum = |docs: &[Value]| {
        find(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["checksum/api-server"].clone()
    };
    assert_ne!(checksum(&before), checksum(&after), "a new API server address rolls the DaemonSet");
    // NOTES: the upgrade note, and the warning while the API server is unset.
    let notes = |sets: &[&str]| {
        let chart = chart();
        let mut args =
            vec!["install", "tierlb", chart.to_str().unwrap(), "-n", "kube-system", "--dry-run=client"];
        for s in sets {
            args.extend(["--set", s]);
        }
        String::from_utf8(helm(&home, &args).stdout).unwrap()
    };
    let default_notes = notes(&[]);
    assert!(
        default_notes.contains("apiServer.host is not set") && default_notes.contains("helm rollback"),
        "{default_notes}"
    );
    assert!(!notes(&["apiServer.host=10.0.0.10"]).contains("apiServer.host is not set"));
}

#[test]
fn the_charts_renders_pass_the_api_servers_validation() {
    let cp = ControlPlane::start("helm", Options::default()).unwrap();
    let home = TempDir::new("helm-apply").unwrap();
    for sets in [
        &[][..],
        &["canary.enabled=true", "metrics.bindAddress=0.0.0.0:10249", "maps.services=200000"],
        &["cleanup=true"],
    ] {
        let file = home.path().join("render.yaml");
        std::fs::write(&file, template_text(&home, sets)).unwrap();
        let out = cp.kubectl(&["apply", "--dry-run=server", "-f", file.to_str().unwrap()]).unwrap();
        let ds = if sets.contains(&"cleanup=true") {
            "daemonset.apps/tierlb-cleanup"
        } else {
            "daemonset.apps/tierlb"
        };
        assert!(out.contains(&format!("{ds} created (server dry run)")), "{sets:?}: {out}");
    }
}
