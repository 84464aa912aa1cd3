//! The rules the rendered DaemonSets must keep, one named check each with a mutation that breaks it.
use super::*;

/// API server (validateMountPropagation): a known mode, and Bidirectional only in a privileged container
/// (the rule that refused the first DaemonSet).
fn mount_propagation(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        let privileged = security(c).privileged == Some(true);
        for m in c.volume_mounts.iter().flatten() {
            match m.mount_propagation.as_deref() {
                None | Some("None" | "HostToContainer") => {}
                Some("Bidirectional") if privileged => {}
                Some("Bidirectional") => errors.push(format!(
                    "{} {}: Bidirectional mount propagation is available only to privileged containers",
                    c.name, m.mount_path
                )),
                Some(other) => {
                    errors.push(format!("{} {}: unsupported mountPropagation {other}", c.name, m.mount_path));
                }
            }
        }
    }
    verdict(&errors)
}

/// API server (ValidateVolumeMounts): every mount names a declared volume, at a path no other mount uses.
fn mounts_name_volumes(d: &Deploy) -> Verdict {
    let volumes: BTreeSet<&str> = d.pod().volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    let mut errors = Vec::new();
    for c in d.containers() {
        let mut paths = BTreeSet::new();
        for m in c.volume_mounts.iter().flatten() {
            if !volumes.contains(m.name.as_str()) {
                errors.push(format!("{}: volumeMounts name {}: not found among the volumes", c.name, m.name));
            }
            if !paths.insert(m.mount_path.as_str()) {
                errors.push(format!("{}: mountPath {} must be unique", c.name, m.mount_path));
            }
        }
    }
    verdict(&errors)
}

/// IANA_SVC_NAME, the API server's rule for port names (validation.IsValidPortName).
fn is_port_name(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn is_port_number(n: i32) -> bool {
    (1..=65535).contains(&n)
}

/// API server (validateContainerPorts, validateHostNetwork): numbers 1-65535, names IANA_SVC_NAME and unique
/// in the pod, a hostPort equal to its containerPort under hostNetwork.
fn container_ports(d: &Deploy) -> Verdict {
    let host_network = d.pod().host_network == Some(true);
    let mut names = BTreeSet::new();
    let mut errors = Vec::new();
    for c in d.containers() {
        for p in c.ports.iter().flatten() {
            if !is_port_number(p.container_port) {
                errors.push(format!("{}: containerPort {} out of range", c.name, p.container_port));
            }
            if let Some(name) = &p.name {
                if !is_port_name(name) {
                    errors.push(format!("{}: port name {name:?} is not an IANA_SVC_NAME", c.name));
                }
                if !names.insert(name.as_str()) {
                    errors.push(format!("{}: port name {name} is duplicated", c.name));
                }
            }
            if host_network && p.host_port.is_some_and(|h| h != p.container_port) {
                errors.push(format!("{}: hostPort must match containerPort under hostNetwork", c.name));
            }
        }
    }
    verdict(&errors)
}

/// API server (validateHTTPGetAction): a path, and a port that is a number or an IANA_SVC_NAME. The kubelet:
/// a named port must be one of the container's ports (else the probe fails). Ours: a numbered one too, so that
/// the ports the pod declares are the ports it serves.
fn probe_ports(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        let ports = c.ports.as_deref().unwrap_or_default();
        for (which, probe) in probes(c) {
            let Some(get) = &probe.http_get else {
                errors.push(format!("{} {which}: not an httpGet probe (the agent serves HTTP)", c.name));
                continue;
            };
            if get.path.as_deref().unwrap_or_default().is_empty() {
                errors.push(format!("{} {which}: httpGet.path is required", c.name));
            }
            let declared = match &get.port {
                IntOrString::Int(n) => is_port_number(*n) && ports.iter().any(|p| p.container_port == *n),
                IntOrString::String(s) => is_port_name(s) && ports.iter().any(|p| p.name.as_ref() == Some(s)),
            };
            if !declared {
                errors
                    .push(format!("{} {which}: port {:?} is not a declared containerPort", c.name, get.port));
            }
        }
    }
    verdict(&errors)
}

/// API server (ValidateSecurityContext): allowPrivilegeEscalation false is refused with privileged, or with a
/// capability added as `CAP_SYS_ADMIN` (it compares that spelling).
fn escalation_consistent(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        let sc = security(c);
        if sc.allow_privilege_escalation != Some(false) {
            continue;
        }
        if sc.privileged == Some(true) {
            errors.push(format!(
                "{}: cannot set allowPrivilegeEscalation to false and privileged to true",
                c.name
            ));
        }
        if caps_added(c).iter().any(|cap| cap == "CAP_SYS_ADMIN") {
            errors.push(format!(
                "{}: cannot set allowPrivilegeEscalation to false and capabilities.add CAP_SYS_ADMIN",
                c.name
            ));
        }
    }
    verdict(&errors)
}

/// Linux capabilities 0-40 (linux/capability.h), as Kubernetes names them.
const CAPABILITIES: &str = "\
    CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE \
    NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO \
    SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG \
    MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM \
    BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE";

/// Container runtime: it refuses to create a container with a capability it does not know. Names come without
/// `CAP_` (the runtime adds it); `drop` may also say ALL.
fn capability_names(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        let caps = security(c).capabilities.unwrap_or_default();
        let added = caps.add.iter().flatten();
        let dropped = caps.drop.iter().flatten().filter(|cap| *cap != "ALL");
        for cap in added.chain(dropped) {
            if !CAPABILITIES.split_whitespace().any(|known| known == cap) {
                errors.push(format!("{}: {cap:?} is not a Linux capability name without CAP_", c.name));
            }
        }
    }
    verdict(&errors)
}

/// The capabilities deploy/daemonset.yaml justifies one by one (PERFMON is not among them: SYS_ADMIN grants the
/// verifier what it would).
const AGENT_CAPABILITIES: [&str; 3] = ["BPF", "NET_ADMIN", "SYS_ADMIN"];

/// The init container that runs `tierlb preflight` checks that it holds what the agent needs and verifies the
/// programs as the agent loads them: it adds exactly the agent's capabilities, mounts its cgroup and bpffs at
/// the agent's paths, and is given the agent's `--cgroup`, `--bpffs`, instance and listen addresses.
fn preflight_holds_what_the_agent_holds(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    let added = |c: &Container| security(c).capabilities.unwrap_or_default().add.unwrap_or_default();
    let mounts = |c: &Container| -> Vec<(String, String)> {
        let m = c.volume_mounts.iter().flatten();
        m.filter(|m| m.name != "netns").map(|m| (m.name.clone(), m.mount_path.clone())).collect()
    };
    let Some(agent) = d.agent() else { return verdict(&errors) };
    let flag = |c: &Container, name: &str| -> Option<String> {
        let prefix = format!("{name}=");
        c.args.iter().flatten().find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
    };
    for c in d.containers().filter(|c| is_preflight(c)) {
        // The same paths, instance and listen addresses as the agent's: what it checks is where the agent goes.
        let instance = flag(agent, "--instance").or_else(|| flag(agent, "--node"));
        for (name, want) in [
            ("--cgroup", flag(agent, "--cgroup")),
            ("--bpffs", flag(agent, "--bpffs")),
            ("--healthz-addr", flag(agent, "--healthz-addr")),
            ("--metrics-addr", flag(agent, "--metrics-addr")),
            ("--instance", instance),
        ] {
            if flag(c, name) != want {
                errors.push(format!("{}: {name} {:?}, the agent's {want:?}", c.name, flag(c, name)));
            }
        }
        if added(c) != added(agent) {
            errors.push(format!("{}: adds {:?}, the agent {:?}", c.name, added(c), added(agent)));
        }
        if mounts(c) != mounts(agent) {
            errors.push(format!("{}: mounts {:?}, the agent {:?}", c.name, mounts(c), mounts(agent)));
        }
    }
    verdict(&errors)
}

/// Hardening: no privileged container, every capability dropped, and only the justified ones added (the agent's
/// three, and the same for the init container that runs `tierlb preflight`; none for any other container).
fn capabilities_justified(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        let sc = security(c);
        if sc.privileged == Some(true) {
            errors.push(format!("{}: privileged", c.name));
        }
        let caps = sc.capabilities.unwrap_or_default();
        if !caps.drop.iter().flatten().any(|cap| cap == "ALL") {
            errors.push(format!("{}: capabilities.drop lacks ALL", c.name));
        }
        let allowed: &[&str] = if is_agent(c) || is_preflight(c) { &AGENT_CAPABILITIES } else { &[] };
        for cap in caps.add.iter().flatten().filter(|cap| !allowed.contains(&cap.as_str())) {
            errors.push(format!("{}: capability {cap} is added without a justification", c.name));
        }
    }
    verdict(&errors)
}

/// Hardening: seccomp RuntimeDefault for every container (its own profile, else the pod's), as decided in
/// deploy/README.md: bpf(2) and setns(2) pass it with the agent's capabilities.
fn seccomp_runtime_default(d: &Deploy) -> Verdict {
    let pod = d.pod().security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
    let mut errors = Vec::new();
    for c in d.containers() {
        let own = c.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
        let effective = own.or(pod).map(|p| p.type_.as_str());
        if effective != Some("RuntimeDefault") {
            errors.push(format!("{}: seccomp profile {effective:?}, not RuntimeDefault", c.name));
        }
    }
    verdict(&errors)
}

/// Hardening: a read-only root filesystem (the agent writes pins and logs only).
fn read_only_root(d: &Deploy) -> Verdict {
    let errors: Vec<String> = d
        .containers()
        .filter(|c| security(c).read_only_root_filesystem != Some(true))
        .map(|c| format!("{}: readOnlyRootFilesystem is not true", c.name))
        .collect();
    verdict(&errors)
}

/// Hardening: allowPrivilegeEscalation false (unset means allowed).
fn no_privilege_escalation(d: &Deploy) -> Verdict {
    let errors: Vec<String> = d
        .containers()
        .filter(|c| security(c).allow_privilege_escalation != Some(false))
        .map(|c| format!("{}: allowPrivilegeEscalation is not false", c.name))
        .collect();
    verdict(&errors)
}

/// Hardening: images by version, never `latest` or no tag; tierlb's at this workspace's version.
fn images_by_version(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        let image = c.image.as_deref().unwrap_or_default();
        let (name, digest) = image.split_once('@').map_or((image, None), |(n, d)| (n, Some(d)));
        // A tag follows the last ':' after the last '/' (a registry's ':port' comes before it).
        let last = name.rsplit('/').next().unwrap_or_default();
        let tag = last.rsplit_once(':').map(|(_, t)| t);
        match tag {
            Some("latest") => errors.push(format!("{}: image {image} uses the moving tag latest", c.name)),
            None if digest.is_none() => errors.push(format!("{}: image {image} has no version", c.name)),
            _ => {}
        }
        if last.split(':').next() == Some("tierlb") && tag != Some(env!("CARGO_PKG_VERSION")) {
            errors.push(format!("{}: image {image} is not tierlb:{}", c.name, env!("CARGO_PKG_VERSION")));
        }
    }
    verdict(&errors)
}

/// Hardening: every hostPath mount is read-only but the bpffs one (where the pins go).
fn host_paths_read_only_but_bpffs(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        for m in c.volume_mounts.iter().flatten() {
            if let Some(host) = host_path(d, &m.name)
                && m.read_only != Some(true)
                && !is_bpffs(host)
            {
                errors.push(format!("{}: hostPath {host} is writable at {}", c.name, m.mount_path));
            }
        }
    }
    verdict(&errors)
}

/// Container runtime (its default AppArmor profile, applied to every unprivileged container on AppArmor
/// nodes): no writes below /sys but /sys/fs/cgroup (`deny /sys/fs/[^c]*/** wklx` and its siblings), none
/// directly in /proc. A writable mount there would have every pin refused, so writable mounts stay elsewhere.
fn writable_mounts_outside_apparmor_denials(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        for m in c.volume_mounts.iter().flatten().filter(|m| m.read_only != Some(true)) {
            let path = Path::new(&m.mount_path);
            let denied = (path.starts_with("/sys") && !path.starts_with("/sys/fs/cgroup"))
                || path.starts_with("/proc");
            if denied {
                errors.push(format!(
                    "{}: writable mount {}: AppArmor's runtime/default denies writes there",
                    c.name, m.mount_path
                ));
            }
        }
    }
    verdict(&errors)
}

/// The agent's flags name host paths where they are mounted: --cgroup inside a mount of the node's /sys/fs/cgroup,
/// --bpffs inside a mount of the node's bpffs, and that mount has no propagation (pins need none).
fn flags_name_mounted_host_paths(d: &Deploy) -> Verdict {
    let mut errors = Vec::new();
    for c in d.containers() {
        for (name, host_root) in [("--cgroup", "/sys/fs/cgroup"), ("--bpffs", "/sys/fs/bpf")] {
            let Some(value) = flag(c, name) else { continue };
            let mount = c.volume_mounts.iter().flatten().find(|m| {
                Path::new(value).starts_with(&m.mount_path)
                    && host_path(d, &m.name).is_some_and(|h| Path::new(h).starts_with(host_root))
            });
            match mount {
                None => errors.push(format!(
                    "{}: {name}={value} is not inside a mount of the node's {host_root}",
                    c.name
                )),
                Some(m) if m.mount_propagation.as_deref().is_some_and(|p| p != "None") => {
                    errors.push(format!("{}: {name} mount {} has propagation", c.name, m.mount_path));
                }
                Some(_) => {}
            }
        }
    }
    verdict(&errors)
}

/// Names only cluster DNS resolves (the API server must be reachable without it).
fn is_cluster_dns_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    // kubernetes, kubernetes.default, NAME.NAMESPACE.svc, NAME.NAMESPACE.svc.cluster.local.
    host == "kubernetes"
        || host.starts_with("kubernetes.default")
        || host.split('.').any(|label| label == "svc")
}

/// The required setting (deploy/api-server.env): the agent's KUBERNETES_SERVICE_HOST and _PORT come from the
/// generated ConfigMap (never a literal, never optional), which holds a host no cluster DNS is needed for and a
/// port number.
fn api_server_from_required_setting(d: &Deploy) -> Verdict {
    let Some(agent) = d.agent() else { return Err("no agent container".to_owned()) };
    let mut errors = Vec::new();
    for key in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
        let env = agent.env.iter().flatten().find(|e: &&EnvVar| e.name == key);
        let Some(sel) = env.and_then(|e| e.value_from.as_ref()?.config_map_key_ref.as_ref()) else {
            errors.push(format!("{key} is not taken from the api-server ConfigMap"));
            continue;
        };
        if sel.optional == Some(true) || sel.key != key {
            errors.push(format!("{key}: must be the ConfigMap's key {key}, not optional"));
        }
        let cm = d.config_maps.iter().find(|cm| cm.metadata.name.as_deref() == Some(sel.name.as_str()));
        let Some(value) = cm.and_then(|cm| cm.data.as_ref()?.get(key)) else {
            errors.push(format!("{key}: ConfigMap {} with that key is not in deploy/", sel.name));
            continue;
        };
        let valid = if key.ends_with("_PORT") {
            value.parse::<u16>().is_ok_and(|p| p > 0)
        } else {
            !value.is_empty() && !is_cluster_dns_name(value)
        };
        if !valid {
            errors.push(format!("{key}={value:?} is not a reachable API server address"));
        }
    }
    verdict(&errors)
}

/// The one-shot commands run in the agent's pod (`kubectl exec ds/tierlb -- tierlb status`) find its pins with
/// no flag: the container's TIERLB_BPFFS is the agent's --bpffs, as a literal.
fn tools_in_the_pod_find_the_pins(d: &Deploy) -> Verdict {
    let Some(agent) = d.agent() else { return Err("no agent container".to_owned()) };
    let bpffs = flag(agent, "--bpffs").ok_or("the agent has no --bpffs")?;
    let env = agent.env.iter().flatten().find(|e: &&EnvVar| e.name == tierlb::datapath::pins::BPFFS_ENV);
    match env.and_then(|e| e.value.as_deref()) {
        Some(v) if v == bpffs => Ok(()),
        other => Err(format!(
            "{} is {other:?}, not the agent's --bpffs {bpffs}: `tierlb status` in the pod would look elsewhere",
            tierlb::datapath::pins::BPFFS_ENV
        )),
    }
}

/// No cluster DNS: dnsPolicy Default (the node's resolv.conf). ClusterFirstWithHostNet would send lookups to a
/// ClusterIP.
fn no_cluster_dns(d: &Deploy) -> Verdict {
    match d.pod().dns_policy.as_deref() {
        Some("Default") => Ok(()),
        other => Err(format!("dnsPolicy {other:?}: needs cluster DNS (set Default)")),
    }
}

/// The first sync gets time: a startup probe on /healthz (200 only after the first sync) holds liveness back
/// for at least five minutes.
fn startup_probe_waits_for_first_sync(d: &Deploy) -> Verdict {
    let Some(agent) = d.agent() else { return Err("no agent container".to_owned()) };
    let Some(probe) = &agent.startup_probe else {
        return Err("no startupProbe: liveness can kill a slow first sync".to_owned());
    };
    let path = probe.http_get.as_ref().and_then(|g| g.path.as_deref());
    // The API server's defaults: period 10 s, failure threshold 3.
    let budget = probe.period_seconds.unwrap_or(10) * probe.failure_threshold.unwrap_or(3);
    if path != Some("/healthz") || budget < 300 {
        return Err(format!("startupProbe on {path:?} for {budget} s; want /healthz for >= 300 s"));
    }
    Ok(())
}

/// Which DaemonSets a rule is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Scope {
    /// Every DaemonSet in deploy/ (the agent's and the uninstall one).
    Every,
    /// The agent's only (its API server, DNS and probes).
    Agent,
}

/// A named rule, its check, and a mutation of deploy/daemonset.yaml that breaks it.
pub(super) struct Rule {
    pub(super) name: &'static str,
    pub(super) scope: Scope,
    pub(super) check: fn(&Deploy) -> Verdict,
    pub(super) broken_by: fn(&mut Deploy),
}

fn rule(name: &'static str, scope: Scope, check: fn(&Deploy) -> Verdict, broken_by: fn(&mut Deploy)) -> Rule {
    Rule { name, scope, check, broken_by }
}

pub(super) fn rules() -> Vec<Rule> {
    use Scope::{Agent, Every};
    vec![
        rule("Bidirectional propagation needs privileged", Every, mount_propagation, |d| {
            let bpffs = d.first_mut().volume_mounts.as_mut().unwrap().iter_mut().find(|m| m.name == "bpffs");
            bpffs.unwrap().mount_propagation = Some("Bidirectional".to_owned());
        }),
        rule("volume mounts name declared volumes", Every, mounts_name_volumes, |d| {
            "cgroups".clone_into(&mut d.first_mut().volume_mounts.as_mut().unwrap()[0].name);
        }),
        rule("container ports are valid and unique", Every, container_ports, |d| {
            let ports = d.first_mut().ports.as_mut().unwrap();
            let twice = ports[0].clone();
            ports.push(twice);
        }),
        rule("probe ports are declared container ports", Every, probe_ports, |d| {
            let get = d.first_mut().liveness_probe.as_mut().unwrap().http_get.as_mut().unwrap();
            get.port = IntOrString::String("livez".to_owned());
        }),
        rule("no allowPrivilegeEscalation false with CAP_SYS_ADMIN", Every, escalation_consistent, |d| {
            caps_added_mut(d.first_mut()).push("CAP_SYS_ADMIN".to_owned());
        }),
        rule("capability names are valid", Every, capability_names, |d| {
            caps_added_mut(d.first_mut()).push("BFP".to_owned());
        }),
        rule("only justified capabilities", Every, capabilities_justified, |d| {
            caps_added_mut(d.first_mut()).push("PERFMON".to_owned());
        }),
        rule("preflight holds what the agent holds", Every, preflight_holds_what_the_agent_holds, |d| {
            let init = d.pod_mut().init_containers.as_mut().unwrap().iter_mut().find(|c| is_preflight(c));
            caps_added_mut(init.unwrap()).retain(|c| c != "SYS_ADMIN");
        }),
        rule(
            "preflight checks the agent's paths and ports",
            Every,
            preflight_holds_what_the_agent_holds,
            |d| {
                let agent = d.first_mut().args.as_mut().unwrap();
                let hz = agent.iter_mut().find(|a| a.starts_with("--healthz-addr=")).unwrap();
                "--healthz-addr=0.0.0.0:10266".clone_into(hz);
            },
        ),
        rule("seccomp RuntimeDefault", Every, seccomp_runtime_default, |d| {
            let sc = d.pod_mut().security_context.get_or_insert_with(Default::default);
            sc.seccomp_profile =
                Some(SeccompProfile { type_: "Unconfined".to_owned(), ..Default::default() });
        }),
        rule("read-only root filesystem", Every, read_only_root, |d| {
            security_mut(d.first_mut()).read_only_root_filesystem = Some(false);
        }),
        rule("allowPrivilegeEscalation false", Every, no_privilege_escalation, |d| {
            security_mut(d.first_mut()).allow_privilege_escalation = None;
        }),
        rule("image by version", Every, images_by_version, |d| {
            d.first_mut().image = Some("tierlb:latest".to_owned());
        }),
        rule("no writable hostPath but the bpffs", Every, host_paths_read_only_but_bpffs, |d| {
            d.first_mut().volume_mounts.as_mut().unwrap()[0].read_only = None;
        }),
        rule(
            "writable mounts avoid AppArmor's denied paths",
            Every,
            writable_mounts_outside_apparmor_denials,
            |d| {
                // Where the first DaemonSet mounted the bpffs (and pointed --bpffs), consistently.
                let c = d.first_mut();
                let bpffs = c.volume_mounts.as_mut().unwrap().iter_mut().find(|m| m.name == "bpffs").unwrap();
                "/sys/fs/bpf/tierlb".clone_into(&mut bpffs.mount_path);
                let args = c.args.as_mut().unwrap();
                let flag = args.iter_mut().find(|a| a.starts_with("--bpffs=")).unwrap();
                "--bpffs=/sys/fs/bpf/tierlb".clone_into(flag);
            },
        ),
        rule("flags name mounted host paths", Every, flags_name_mounted_host_paths, |d| {
            let args = d.first_mut().args.as_mut().unwrap();
            let bpffs = args.iter_mut().find(|a| a.starts_with("--bpffs=")).unwrap();
            // Outside every mount: the agent would pin into the container's own /sys.
            "--bpffs=/sys/fs/bpf/tierlb".clone_into(bpffs);
        }),
        rule("the tools in the pod find the pins", Agent, tools_in_the_pod_find_the_pins, |d| {
            let env = d.first_mut().env.as_mut().unwrap();
            env.retain(|e| e.name != tierlb::datapath::pins::BPFFS_ENV);
        }),
        rule("API server from the required setting", Agent, api_server_from_required_setting, |d| {
            let env = d.first_mut().env.as_mut().unwrap();
            let host = env.iter_mut().find(|e| e.name == "KUBERNETES_SERVICE_HOST").unwrap();
            *host =
                EnvVar { name: host.name.clone(), value: Some("10.96.0.1".to_owned()), ..Default::default() };
        }),
        rule("no cluster DNS", Agent, no_cluster_dns, |d| {
            d.pod_mut().dns_policy = Some("ClusterFirstWithHostNet".to_owned());
        }),
        rule("startup probe waits for the first sync", Agent, startup_probe_waits_for_first_sync, |d| {
            d.first_mut().startup_probe = None;
        }),
    ]
}
