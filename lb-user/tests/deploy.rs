//! deploy/ renders with kustomize, every object deserializes into its k8s-openapi type, and the DaemonSet
//! only passes flags `tierlb agent` really has.
use clap::CommandFactory as _;
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::Deserialize as _;

fn render() -> Vec<serde_yaml::Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let out = std::process::Command::new("kubectl").arg("kustomize").arg(&dir).output().expect(
        "kubectl is needed for this test (it renders deploy/ with kustomize); install kubectl or put it on PATH",
    );
    assert!(out.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text).map(|d| serde_yaml::Value::deserialize(d).unwrap()).collect()
}

#[test]
fn deploy_renders_into_valid_objects_with_flags_the_agent_has() {
    let docs = render();
    let mut kinds = Vec::new();
    let mut daemonset = None;
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "DaemonSet" => daemonset = Some(serde_yaml::from_value::<DaemonSet>(doc).unwrap()),
            "ServiceAccount" => drop(serde_yaml::from_value::<ServiceAccount>(doc).unwrap()),
            "ClusterRole" => {
                let role: ClusterRole = serde_yaml::from_value(doc).unwrap();
                for rule in role.rules.unwrap() {
                    let verbs: Vec<&str> = rule.verbs.iter().map(String::as_str).collect();
                    assert_eq!(verbs, ["get", "list", "watch"], "read-only RBAC");
                }
            }
            "ClusterRoleBinding" => drop(serde_yaml::from_value::<ClusterRoleBinding>(doc).unwrap()),
            "ConfigMap" => drop(serde_yaml::from_value::<ConfigMap>(doc).unwrap()),
            other => panic!("unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    kinds.sort();
    assert_eq!(kinds, ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]);

    let ds = daemonset.unwrap();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap();
    assert_eq!(args[0], "agent");
    let cli = tierlb::cli::Cli::command();
    let agent = cli.find_subcommand("agent").unwrap();
    // The agent's own flags and the global ones (declared on the root command).
    let known: Vec<String> = agent
        .get_arguments()
        .chain(cli.get_arguments().filter(|a| a.is_global_set()))
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap();
        assert!(known.iter().any(|k| k == flag), "DaemonSet passes {flag}, which tierlb agent does not have");
    }
    // And they parse together.
    let command_line: Vec<String> = std::iter::once("tierlb".to_owned())
        .chain(args.iter().map(|a| a.replace("$(NODE_NAME)", "node-1")))
        .collect();
    tierlb::cli::Cli::try_parse_from_args(&command_line).unwrap();
    let caps = c.security_context.as_ref().unwrap().capabilities.as_ref().unwrap().add.clone().unwrap();
    for cap in ["BPF", "NET_ADMIN", "SYS_ADMIN"] {
        assert!(caps.iter().any(|c| c == cap), "missing capability {cap}");
    }
    let probes = [c.liveness_probe.as_ref().unwrap(), c.readiness_probe.as_ref().unwrap()];
    let paths: Vec<String> =
        probes.iter().map(|p| p.http_get.as_ref().unwrap().path.clone().unwrap()).collect();
    assert_eq!(paths, ["/livez", "/healthz"]);
    let mounts: Vec<&str> = c.volume_mounts.as_ref().unwrap().iter().map(|m| m.mount_path.as_str()).collect();
    let bpffs = args.iter().find_map(|a| a.strip_prefix("--bpffs=")).expect("--bpffs");
    let bpffs_mounted = mounts.iter().any(|m| std::path::Path::new(bpffs).starts_with(m));
    assert!(bpffs_mounted && mounts.iter().any(|m| m.contains("cgroup")), "{mounts:?}");
}
