//! deploy/ as a cluster gets it: it renders with kustomize, every object deserializes into its k8s-openapi type,
//! the DaemonSets pass only flags `tierlb agent` really has, and they keep the rules that decide whether the
//! agent runs on a node exactly as deploy/ runs it: the API server's pod validation rules that apply to them,
//! the container runtime's, and the hardening deploy/README.md promises. Deserializing cannot see any of
//! those, so each rule is a named check, and each check is shown able to fail on a copy of the DaemonSet
//! mutated to break it.
use std::{collections::BTreeSet, path::Path};

use clap::CommandFactory as _;
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{
            ConfigMap, Container, EnvVar, PodSpec, Probe, SeccompProfile, SecurityContext, ServiceAccount,
        },
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};

mod helm;
mod rules;
use rules::{Scope, rules};

/// `kubectl kustomize DIR` (the kubectl `cargo xtask setup` builds), DIR relative to the repository's deploy/.
fn render(dir: &str) -> Vec<serde_json::Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(dir);
    let out = std::process::Command::new(lb_testkit::kube::k8s_bin("kubectl"))
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl kustomize");
    assert!(out.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap()
}

/// Every flag in `args` (`agent` first) is one `tierlb agent` has, and together they parse.
fn assert_agent_flags(args: &[String]) {
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
    let command_line: Vec<String> = std::iter::once("tierlb".to_owned())
        .chain(args.iter().map(|a| a.replace("$(NODE_NAME)", "node-1")))
        .collect();
    tierlb::cli::Cli::try_parse_from_args(&command_line).unwrap();
}

#[test]
fn deploy_renders_into_valid_objects_with_flags_the_agent_has() {
    let docs = render(".");
    let mut kinds = Vec::new();
    let mut daemonset = None;
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "DaemonSet" => daemonset = Some(serde_json::from_value::<DaemonSet>(doc).unwrap()),
            "ServiceAccount" => drop(serde_json::from_value::<ServiceAccount>(doc).unwrap()),
            "ClusterRole" => {
                let role: ClusterRole = serde_json::from_value(doc).unwrap();
                for rule in role.rules.unwrap() {
                    let verbs: Vec<&str> = rule.verbs.iter().map(String::as_str).collect();
                    assert_eq!(verbs, ["get", "list", "watch"], "read-only RBAC");
                }
            }
            "ClusterRoleBinding" => drop(serde_json::from_value::<ClusterRoleBinding>(doc).unwrap()),
            "ConfigMap" => drop(serde_json::from_value::<ConfigMap>(doc).unwrap()),
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
    assert_agent_flags(&args);
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
    let bpffs_mounted = mounts.iter().any(|m| Path::new(bpffs).starts_with(m));
    assert!(bpffs_mounted && mounts.iter().any(|m| m.contains("cgroup")), "{mounts:?}");
}

/// RBAC's own rule: `PolicyRule` grants (group, resource, verb) when each list names it or `*`, and no
/// `resourceNames` narrows it (list and watch cannot be narrowed by name).
fn grants(rule: &k8s_openapi::api::rbac::v1::PolicyRule, group: &str, resource: &str, verb: &str) -> bool {
    let has =
        |v: Option<&Vec<String>>, want: &str| v.is_some_and(|v| v.iter().any(|x| x == want || x == "*"));
    has(rule.api_groups.as_ref(), group)
        && has(rule.resources.as_ref(), resource)
        && has(Some(&rule.verbs), verb)
        && rule.resource_names.as_ref().is_none_or(Vec::is_empty)
}

/// The ClusterRole grants every permission the agent checks at start (the access review's own table,
/// `source::kube::NEEDED`), and the binding gives it to the DaemonSet's service account.
#[test]
fn the_cluster_role_grants_every_permission_the_agents_access_review_asks_for() {
    let docs = render(".");
    let of_kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k).cloned();
    let roles: Vec<ClusterRole> =
        of_kind("ClusterRole").map(|d| serde_json::from_value(d).unwrap()).collect();
    let bindings: Vec<ClusterRoleBinding> =
        of_kind("ClusterRoleBinding").map(|d| serde_json::from_value(d).unwrap()).collect();
    let ds: DaemonSet = of_kind("DaemonSet").map(|d| serde_json::from_value(d).unwrap()).next().unwrap();
    let account = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap().service_account_name.clone();
    let namespace = ds.metadata.namespace.clone();
    // The roles bound to the agent's service account.
    let bound: Vec<&ClusterRole> = roles
        .iter()
        .filter(|r| {
            bindings.iter().any(|b| {
                b.role_ref.kind == "ClusterRole"
                    && Some(&b.role_ref.name) == r.metadata.name.as_ref()
                    && b.subjects.iter().flatten().any(|s| {
                        s.kind == "ServiceAccount"
                            && Some(&s.name) == account.as_ref()
                            && s.namespace == namespace
                    })
            })
        })
        .collect();
    assert!(!bound.is_empty(), "no ClusterRole is bound to the DaemonSet's service account {account:?}");
    for (group, resource, verbs) in tierlb::source::kube::NEEDED {
        for verb in verbs {
            let granted = bound
                .iter()
                .flat_map(|r| r.rules.iter().flatten())
                .any(|rule| grants(rule, group, resource, verb));
            assert!(
                granted,
                "the agent needs {verb} {resource} in API group {group:?}; no bound rule grants it"
            );
        }
    }
}

/// What the rules see: one rendered DaemonSet and the ConfigMaps rendered with it.
#[derive(Clone, Debug)]
struct Deploy {
    ds: DaemonSet,
    config_maps: Vec<ConfigMap>,
}

impl Deploy {
    /// The DaemonSet and ConfigMaps of `kubectl kustomize deploy/DIR` (the other kinds are checked above).
    fn load(dir: &str) -> Self {
        Self::from_docs(render(dir))
    }

    /// The DaemonSet and ConfigMaps among rendered objects (kustomize's or Helm's).
    fn from_docs(docs: Vec<serde_json::Value>) -> Self {
        let mut ds = None;
        let mut config_maps = Vec::new();
        for doc in docs {
            match doc["kind"].as_str() {
                Some("DaemonSet") => {
                    assert!(ds.is_none(), "one DaemonSet");
                    ds = Some(serde_json::from_value(doc).unwrap());
                }
                Some("ConfigMap") => config_maps.push(serde_json::from_value(doc).unwrap()),
                _ => {}
            }
        }
        Self { ds: ds.expect("a DaemonSet"), config_maps }
    }

    fn pod(&self) -> &PodSpec {
        self.ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn pod_mut(&mut self) -> &mut PodSpec {
        self.ds.spec.as_mut().unwrap().template.spec.as_mut().unwrap()
    }

    /// Init containers, then containers: the API server validates both alike.
    fn containers(&self) -> impl Iterator<Item = &Container> {
        let pod = self.pod();
        pod.init_containers.iter().flatten().chain(&pod.containers)
    }

    /// The container running `tierlb agent` (not `--cleanup`), if this DaemonSet has one.
    fn agent(&self) -> Option<&Container> {
        self.containers().find(|c| is_agent(c))
    }

    /// The first container (the agent, in deploy/daemonset.yaml), for mutations.
    fn first_mut(&mut self) -> &mut Container {
        &mut self.pod_mut().containers[0]
    }
}

fn is_agent(c: &Container) -> bool {
    let args = c.args.as_deref().unwrap_or_default();
    args.first().is_some_and(|a| a == "agent") && !args.iter().any(|a| a == "--cleanup")
}

/// The init container that checks the node before the agent starts (`tierlb preflight`).
fn is_preflight(c: &Container) -> bool {
    c.args.as_deref().unwrap_or_default().first().is_some_and(|a| a == "preflight")
}

fn security(c: &Container) -> SecurityContext {
    c.security_context.clone().unwrap_or_default()
}

fn security_mut(c: &mut Container) -> &mut SecurityContext {
    c.security_context.get_or_insert_with(SecurityContext::default)
}

fn caps_added(c: &Container) -> Vec<String> {
    security(c).capabilities.and_then(|caps| caps.add).unwrap_or_default()
}

fn caps_added_mut(c: &mut Container) -> &mut Vec<String> {
    let caps = security_mut(c).capabilities.get_or_insert_with(Default::default);
    caps.add.get_or_insert_with(Vec::new)
}

fn probes(c: &Container) -> impl Iterator<Item = (&'static str, &Probe)> {
    [
        ("startupProbe", &c.startup_probe),
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
    ]
    .into_iter()
    .filter_map(|(name, p)| p.as_ref().map(|p| (name, p)))
}

/// The value of `--flag=VALUE` in a container's args.
fn flag<'c>(c: &'c Container, flag: &str) -> Option<&'c str> {
    c.args.iter().flatten().find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
}

/// The host path behind a volume, if it is a hostPath volume.
fn host_path<'d>(d: &'d Deploy, volume: &str) -> Option<&'d str> {
    let v = d.pod().volumes.iter().flatten().find(|v| v.name == volume)?;
    v.host_path.as_ref().map(|h| h.path.as_str())
}

fn is_bpffs(host: &str) -> bool {
    Path::new(host).starts_with("/sys/fs/bpf")
}

type Verdict = Result<(), String>;

fn verdict(errors: &[String]) -> Verdict {
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

/// Run the rules of `scopes` on `d`; the failures, by rule name.
fn failures(d: &Deploy, scopes: &[Scope]) -> Vec<String> {
    rules()
        .iter()
        .filter(|r| scopes.contains(&r.scope))
        .filter_map(|r| (r.check)(d).err().map(|e| format!("{}: {e}", r.name)))
        .collect()
}

#[test]
fn the_daemonset_keeps_every_rule_of_the_api_server_the_runtime_and_the_hardening() {
    let failed = failures(&Deploy::load("."), &[Scope::Every, Scope::Agent]);
    assert!(failed.is_empty(), "deploy/daemonset.yaml breaks:\n{}", failed.join("\n"));
}

#[test]
fn every_rule_fails_on_a_daemonset_mutated_to_break_it() {
    let deploy = Deploy::load(".");
    for rule in rules() {
        assert_eq!((rule.check)(&deploy), Ok(()), "{}: the unmutated DaemonSet must pass", rule.name);
        let mut broken = deploy.clone();
        (rule.broken_by)(&mut broken);
        assert!((rule.check)(&broken).is_err(), "{}: its check passes a DaemonSet that breaks it", rule.name);
    }
}

#[test]
fn uninstall_cleans_every_node_with_flags_the_agent_has_and_keeps_the_rules() {
    let kinds: Vec<String> =
        render("uninstall").iter().map(|d| d["kind"].as_str().unwrap().to_owned()).collect();
    assert_eq!(kinds, ["DaemonSet"]);
    let cleanup = Deploy::load("uninstall");
    let init = cleanup.pod().init_containers.as_deref().unwrap_or_default();
    let args = init.first().and_then(|c| c.args.clone()).expect("the cleanup runs as an init container");
    assert_agent_flags(&args);
    assert!(args.iter().any(|a| a == "--cleanup"), "{args:?}");
    // The same pin directory and instance as the agent's.
    let deploy = Deploy::load(".");
    let agent = deploy.agent().unwrap();
    for name in ["--bpffs", "--node"] {
        assert_eq!(flag(&init[0], name), flag(agent, name), "{name}");
    }
    let failed = failures(&cleanup, &[Scope::Every]);
    assert!(failed.is_empty(), "deploy/uninstall breaks:\n{}", failed.join("\n"));
}
