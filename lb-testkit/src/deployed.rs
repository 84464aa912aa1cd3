//! The agent as `deploy/` runs it, on a simulated node: the DaemonSet is rendered with `kubectl kustomize`,
//! and its container's constraints are applied to a real `tierlb agent` process.
//!
//! - A network namespace plays the node (the DaemonSet has `hostNetwork: true`); pods live in namespaces of
//!   their own behind veth pairs, routed through the node.
//! - The agent runs in a new PID namespace (unless `hostPID`), with /proc mounted for it, and a new mount
//!   namespace whose root is an empty tmpfs (read-only when `readOnlyRootFilesystem`) holding only the
//!   host's /usr, /lib*, /bin, /sbin, /etc, /dev and /sys (read-only, as a container runtime gives them),
//!   each `hostPath` volume at its `mountPath`, and the binary. A private bpffs stands in for the node's
//!   /sys/fs/bpf, so tests never touch the host's pins.
//! - Its capability bounding set is cut to `capabilities.add` (unless `privileged`), with `no_new_privs`
//!   when `allowPrivilegeEscalation: false`.
//! - Only two things differ from a node: the source (`--manifests` instead of `--kube`, unless the test gives
//!   the box a real API server's address and a service account's credentials: `InCluster`) and the cgroup (a
//!   child cgroup instead of the cgroup2 root, never a root one).
//!
//! Not emulated: the seccomp profile (the runtime's RuntimeDefault), the CPU limit. The memory limit is:
//! the agent runs in a memory cgroup of the container's `limits.memory`, which the kernel charges the BPF
//! maps to as well.
use std::{
    fmt::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::sandbox::{Child, NetNs, TempDir, confine};

/// A `hostPath` volume mounted into the container.
#[derive(Clone, Debug)]
pub struct HostMount {
    /// The node's path.
    pub host: PathBuf,
    /// Where the container sees it.
    pub path: PathBuf,
    /// `readOnly`.
    pub read_only: bool,
    /// `mountPropagation` (`None`, `HostToContainer`, `Bidirectional`).
    pub propagation: Option<String>,
}

/// What the DaemonSet's pod and container ask for.
#[derive(Clone, Debug, Default)]
pub struct Container {
    /// `args`, as written.
    pub args: Vec<String>,
    /// `env` with literal values.
    pub env: Vec<(String, String)>,
    /// `securityContext.capabilities.add`.
    pub capabilities: Vec<String>,
    /// `securityContext.privileged`.
    pub privileged: bool,
    /// `securityContext.allowPrivilegeEscalation` (Kubernetes' default: true).
    pub allow_privilege_escalation: bool,
    /// `securityContext.readOnlyRootFilesystem`.
    pub read_only_root: bool,
    /// `hostPID`.
    pub host_pid: bool,
    /// `hostNetwork`.
    pub host_network: bool,
    /// The `hostPath` volumes the container mounts.
    pub mounts: Vec<HostMount>,
    /// (path, port) of each HTTP probe (liveness, readiness, startup).
    pub probes: Vec<(String, u16)>,
    /// `resources.limits.memory` in bytes.
    pub memory_limit: Option<u64>,
    /// The pod's init container that runs `tierlb preflight` before the agent, if it has one.
    pub preflight: Option<Box<Container>>,
}

impl Container {
    /// Render `deploy_dir` with `kubectl kustomize` (the kubectl built with the control plane, not one on
    /// PATH) and read the DaemonSet's container that runs `tierlb agent` (an init container for the
    /// uninstall's one-shot cleanup).
    pub fn render(deploy_dir: &Path) -> anyhow::Result<Self> {
        let out = Command::new(crate::kube::k8s_bin("kubectl"))
            .arg("kustomize")
            .arg(deploy_dir)
            .output()
            .context("kubectl (it renders deploy/ with kustomize)")?;
        if !out.status.success() {
            bail!("kubectl kustomize: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8(out.stdout)?;
        for v in serde_saphyr::from_multiple::<serde_json::Value>(&text)? {
            if v["kind"].as_str() == Some("DaemonSet") {
                return Ok(Self::from_daemonset(&v));
            }
        }
        bail!("no DaemonSet in {}", deploy_dir.display())
    }

    fn from_daemonset(ds: &serde_json::Value) -> Self {
        let pod = &ds["spec"]["template"]["spec"];
        let runs = |what: &'static str| move |c: &&serde_json::Value| c["args"][0].as_str() == Some(what);
        let all = || {
            pod["initContainers"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(pod["containers"].as_array().into_iter().flatten())
        };
        let c = all().find(runs("agent")).unwrap_or(&pod["containers"][0]);
        let mut out = Self::from_container(pod, c);
        out.preflight = all().find(runs("preflight")).map(|p| Box::new(Self::from_container(pod, p)));
        out
    }

    fn from_container(pod: &serde_json::Value, c: &serde_json::Value) -> Self {
        let sc = &c["securityContext"];
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
        };
        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        let mounts = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let vol = volumes.iter().find(|v| v["name"] == m["name"])?;
                Some(HostMount {
                    host: PathBuf::from(vol["hostPath"]["path"].as_str()?),
                    path: PathBuf::from(m["mountPath"].as_str()?),
                    read_only: m["readOnly"].as_bool().unwrap_or(false),
                    propagation: m["mountPropagation"].as_str().map(str::to_owned),
                })
            })
            .collect();
        let port_of = |p: &serde_json::Value| -> Option<u16> {
            match &p["port"] {
                serde_json::Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
                serde_json::Value::String(name) => c["ports"]
                    .as_array()?
                    .iter()
                    .find(|cp| cp["name"].as_str() == Some(name))?["containerPort"]
                    .as_u64()
                    .and_then(|n| u16::try_from(n).ok()),
                _ => None,
            }
        };
        let probes = ["livenessProbe", "readinessProbe", "startupProbe"]
            .iter()
            .filter_map(|k| {
                let get = &c[*k]["httpGet"];
                Some((get["path"].as_str()?.to_owned(), port_of(get)?))
            })
            .collect();
        let env = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned())))
            .collect();
        Self {
            args: strings(&c["args"]),
            env,
            capabilities: strings(&sc["capabilities"]["add"]),
            privileged: sc["privileged"].as_bool().unwrap_or(false),
            allow_privilege_escalation: sc["allowPrivilegeEscalation"].as_bool().unwrap_or(true),
            read_only_root: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
            host_pid: pod["hostPID"].as_bool().unwrap_or(false),
            host_network: pod["hostNetwork"].as_bool().unwrap_or(false),
            mounts,
            probes,
            memory_limit: c["resources"]["limits"]["memory"].as_str().and_then(quantity),
            preflight: None,
        }
    }

    /// The container's mount of the node's path `host`, if any.
    pub fn mount_of(&self, host: &str) -> Option<&HostMount> {
        self.mounts.iter().find(|m| m.host == Path::new(host))
    }
}

/// Quote for `sh`.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The node a boxed agent runs on: a network namespace with forwarding on, and pods behind veth pairs.
pub struct Node {
    /// The node's network namespace.
    pub netns: NetNs,
    pods: usize,
}

/// The node side of every pod's default route (the same address on each veth, as Calico does).
const GATEWAY: &str = "169.254.1.1";

fn nsenter(ns: &NetNs, args: &[&str]) -> anyhow::Result<()> {
    let path = format!("/run/netns/{}", ns.name());
    let out = Command::new("nsenter").arg(format!("--net={path}")).args(args).output()?;
    if !out.status.success() {
        bail!("nsenter {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

impl Node {
    /// A node namespace that routes between its pods.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let netns = NetNs::new(tag)?;
        nsenter(&netns, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
        nsenter(&netns, &["sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"])?;
        Ok(Self { netns, pods: 0 })
    }

    /// A pod: its own namespace with `ip` on `eth0`, a veth to the node, a route each way.
    pub fn add_pod(&mut self, tag: &str, ip: IpAddr) -> anyhow::Result<NetNs> {
        self.add_pod_ips(tag, &[ip])
    }

    /// A pod with each of `ips` on `eth0` (a dual-stack pod: one of each family); an IPv6 pod's default
    /// route goes to `fe80::1`, the node side of every veth (as `GATEWAY` is for IPv4).
    pub fn add_pod_ips(&mut self, tag: &str, ips: &[IpAddr]) -> anyhow::Result<NetNs> {
        let pod = NetNs::new(tag)?;
        let host_if = format!("veth{}", self.pods);
        self.pods += 1;
        self.netns.ip(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ])?;
        self.netns.ip(&["addr", "add", &format!("{GATEWAY}/32"), "dev", &host_if])?;
        if ips.iter().any(IpAddr::is_ipv6) {
            self.netns.ip(&["addr", "add", "fe80::1/64", "dev", &host_if, "nodad"])?;
        }
        self.netns.ip(&["link", "set", &host_if, "up"])?;
        for ip in ips {
            let host = if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") };
            self.netns.ip(&["route", "add", &host, "dev", &host_if])?;
            let mut add = vec!["addr", "add", host.as_str(), "dev", "eth0"];
            if ip.is_ipv6() {
                add.push("nodad");
            }
            pod.ip(&add)?;
        }
        pod.ip(&["link", "set", "eth0", "up"])?;
        if ips.iter().any(IpAddr::is_ipv4) {
            pod.ip(&["route", "add", "default", "via", GATEWAY, "dev", "eth0", "onlink"])?;
        }
        if ips.iter().any(IpAddr::is_ipv6) {
            pod.ip(&["-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"])?;
        }
        Ok(pod)
    }
}

/// Where the pieces a boxed agent needs are on this machine.
pub struct BoxPaths<'a> {
    /// The `tierlb` binary.
    pub tierlb: &'a Path,
    /// The manifests directory that stands in for the API server.
    pub manifests: &'a Path,
    /// The child cgroup that stands in for the cgroup2 root.
    pub cgroup: &'a Path,
    /// The private bpffs that stands in for the node's /sys/fs/bpf.
    pub bpffs: &'a Path,
    /// Where the agent's output goes.
    pub log: &'a Path,
}

/// A `tierlb` command run as the DaemonSet's container runs it.
pub struct AgentBox {
    child: Child,
    root: TempDir,
    /// The container's memory limit (after `child`: removed once the agent is gone).
    _memory: Option<crate::sandbox::Cgroup>,
}

/// A Kubernetes memory quantity in bytes (`512Mi`, `1Gi`, `268435456`; the binary suffixes only).
fn quantity(q: &str) -> Option<u64> {
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

/// The directory (under /sys/fs/cgroup) of the cgroup2 mount, on hybrid hosts `unified`.
fn cgroup_relative(cgroup: &Path) -> anyhow::Result<PathBuf> {
    Ok(cgroup.strip_prefix("/sys/fs/cgroup").context("the test cgroup is under /sys/fs/cgroup")?.to_owned())
}

/// What the kubelet gives the DaemonSet's pod to reach the API server: the service account's token, CA and
/// namespace at /var/run/secrets/kubernetes.io/serviceaccount (its projected volume), and the API server's
/// address in `KUBERNETES_SERVICE_HOST`/`PORT` (from deploy/api-server.env, the required setting).
#[derive(Clone, Debug)]
pub struct InCluster {
    /// A directory holding `token`, `ca.crt` and `namespace`.
    pub secrets: PathBuf,
    /// The API server's address, as api-server.env gives it.
    pub host: IpAddr,
    /// Its port.
    pub port: u16,
}

/// Where a pod finds its service account's credentials.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl AgentBox {
    /// The agent's arguments with the node's name, the manifests source and the child cgroup put in.
    pub fn agent_args(c: &Container, node: &str, cgroup: &Path) -> anyhow::Result<Vec<String>> {
        Self::args_for(c, node, cgroup, false)
    }

    /// The agent's arguments with the node's name and the child cgroup put in, and `--kube` kept: the
    /// container's command line as deployed, for a box started with [`InCluster`] credentials.
    pub fn agent_args_kube(c: &Container, node: &str, cgroup: &Path) -> anyhow::Result<Vec<String>> {
        Self::args_for(c, node, cgroup, true)
    }

    fn args_for(c: &Container, node: &str, cgroup: &Path, kube: bool) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        for a in &c.args {
            let a = a.replace("$(NODE_NAME)", node);
            match a.split_once('=').map_or(a.as_str(), |(f, _)| f) {
                "--kube" if kube => out.push(a),
                "--kube" => out.push("--manifests=/manifests".to_owned()),
                "--cgroup" => {
                    let mount = c
                        .mount_of("/sys/fs/cgroup")
                        .context("--cgroup, but no mount of the host's cgroup2")?;
                    out.push(format!("--cgroup={}", mount.path.join(cgroup_relative(cgroup)?).display()));
                }
                "--allow-root-cgroup" => {}
                _ => out.push(a),
            }
        }
        Ok(out)
    }

    /// Run `tierlb ARGS` in the box on `node` (the command line is the container's, see `agent_args`).
    pub fn start(c: &Container, node: &Node, paths: &BoxPaths<'_>, args: &[String]) -> anyhow::Result<Self> {
        Self::start_with(c, node, paths, args, None)
    }

    /// `start`, with what the kubelet gives a pod that talks to the API server (`in_cluster`).
    pub fn start_with(
        c: &Container,
        node: &Node,
        paths: &BoxPaths<'_>,
        args: &[String],
        in_cluster: Option<&InCluster>,
    ) -> anyhow::Result<Self> {
        // Every box runs in the node's network namespace: the agent's DaemonSet has hostNetwork, and the
        // uninstall's cleanup uses no network at all.
        let root = TempDir::new("box-root")?;
        let r = root.path().display().to_string();
        let mut s = String::from("set -e\n");
        let _ = writeln!(s, "mount -t tmpfs -o mode=755 tmpfs {r}");
        for d in ["bin", "sbin", "lib", "lib64", "usr", "etc", "dev", "sys"] {
            let host = Path::new("/").join(d);
            if host.is_symlink() {
                let target = std::fs::read_link(&host)?;
                let _ = writeln!(s, "ln -s {} {r}/{d}", q(&target.display().to_string()));
            } else if host.is_dir() {
                let _ = writeln!(s, "mkdir {r}/{d}\nmount --rbind /{d} {r}/{d}");
                if d != "dev" {
                    let _ = writeln!(s, "mount -o remount,bind,ro {r}/{d}");
                }
            }
        }
        let _ = writeln!(s, "mkdir -p {r}/proc {r}/tmp {r}/manifests");
        let _ = writeln!(s, "mount --bind -o ro {} {r}/manifests", q(&paths.manifests.display().to_string()));
        if let Some(k) = in_cluster {
            let _ = writeln!(s, "mkdir -p {r}{SERVICE_ACCOUNT_DIR}");
            let _ = writeln!(
                s,
                "mount --bind -o ro {} {r}{SERVICE_ACCOUNT_DIR}",
                q(&k.secrets.display().to_string())
            );
        }
        let _ = writeln!(
            s,
            "touch {r}/tierlb\nmount --bind {} {r}/tierlb",
            q(&paths.tierlb.display().to_string())
        );
        for m in &c.mounts {
            // The node's bpffs is the test's private one; the kubelet makes a missing hostPath directory
            // (DirectoryOrCreate), so the harness does too, there.
            let host = match m.host.strip_prefix("/sys/fs/bpf") {
                Ok(rel) => {
                    let dir = paths.bpffs.join(rel);
                    std::fs::create_dir_all(&dir)?;
                    dir
                }
                Err(_) => m.host.clone(),
            };
            let target = format!("{r}{}", m.path.display());
            // A mount point below /sys (read-only now) exists already or cannot be made: mount over it.
            let _ = writeln!(s, "mkdir -p {} 2>/dev/null || true", q(&target));
            // Recursive, as a runtime binds a hostPath (the cgroup2 mount may sit below /sys/fs/cgroup);
            // `readOnly` then applies to the top mount only, as Kubernetes' (non-recursive) readOnly does.
            let _ = writeln!(s, "mount --rbind {} {}", q(&host.display().to_string()), q(&target));
            if m.read_only {
                let _ = writeln!(s, "mount -o remount,bind,ro {}", q(&target));
            }
            // Mounts the node makes later (a new pod's namespace under /run/netns) reach the container only
            // with HostToContainer propagation: the box's mounts are private otherwise.
            match m.propagation.as_deref() {
                Some("HostToContainer") => {
                    let _ = writeln!(s, "mount --make-rslave {}", q(&target));
                }
                Some("Bidirectional") => {
                    let _ = writeln!(s, "mount --make-rshared {}", q(&target));
                }
                _ => {}
            }
        }
        if c.read_only_root {
            let _ = writeln!(s, "mount -o remount,ro {r}");
        }
        let mut inner = String::from("mount -t proc proc /proc\n");
        let mut setpriv = vec!["exec".to_owned(), "setpriv".to_owned()];
        if !c.privileged {
            let caps: Vec<String> = std::iter::once("-all".to_owned())
                .chain(c.capabilities.iter().map(|c| format!("+{}", c.to_lowercase())))
                .collect();
            setpriv.push(format!("--bounding-set={}", caps.join(",")));
        }
        if !c.allow_privilege_escalation {
            setpriv.push("--no-new-privs".to_owned());
        }
        setpriv.push("/tierlb".to_owned());
        setpriv.extend(args.iter().map(|a| q(a)));
        inner += &setpriv.join(" ");
        let _ = writeln!(s, "exec chroot {r} /bin/sh -c {}", q(&inner));

        let log = std::fs::OpenOptions::new().create(true).append(true).open(paths.log)?;
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--fork", "--kill-child=SIGTERM"]);
        if !c.host_pid {
            cmd.arg("--pid");
        }
        cmd.args(["sh", "-c", &s]).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        if let Some(k) = in_cluster {
            cmd.env("KUBERNETES_SERVICE_HOST", k.host.to_string())
                .env("KUBERNETES_SERVICE_PORT", k.port.to_string());
        }
        cmd.env("NO_COLOR", "1");
        let memory = match c.memory_limit {
            Some(bytes) => crate::sandbox::Cgroup::memory_limited("agent-memory", bytes)?,
            None => None,
        };
        confine(&mut cmd, memory.as_ref(), Some(&node.netns))?;
        Ok(Self { child: Child::spawn(&mut cmd)?, root, _memory: memory })
    }

    /// Wait for `needle` in the log after byte `from` (e.g. `tierlb agent ready`), or for the box to end.
    pub fn wait_for(
        &mut self,
        log: &Path,
        from: usize,
        needle: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        self.child.wait_for_log(log, from, needle, timeout).context("the boxed agent")
    }

    /// Wait until the box ends by itself (a one-shot command); its exit status.
    pub fn wait(mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.inner().try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("the box did not end within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The agent's pid (in the host's PID namespace), once `unshare` has started it: `unshare --fork` waits for
    /// its one child, and the agent is that child (sh, chroot and setpriv exec into it).
    pub fn agent_pid(&self) -> Option<i32> {
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", self.child.pid(), self.child.pid()))
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<i32>().ok())
    }

    /// SIGKILL the agent itself (the box's PID 1 when it has a PID namespace: everything in it dies), as the
    /// kubelet's kill or an OOM kill would.
    pub fn kill(mut self) {
        if let Some(pid) = self.agent_pid() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.inner().wait();
        drop(self.root);
    }

    /// Stop the agent as the kubelet does: SIGTERM to the agent itself, and wait until it has exited (the box
    /// ends with it) for up to a grace period, then SIGKILL. (SIGTERM to `unshare` alone would return while
    /// the agent, signalled by its parent's death, still runs its way out.)
    pub fn stop(mut self) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.agent_pid() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(st)) = self.child.inner().try_wait() {
                    return Some(st);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.child.stop(Duration::from_secs(5))
    }
}

/// Everything a test needs to run the boxed agent on one node: the rendered DaemonSet container, the node,
/// the child cgroup and private bpffs that stand in for the node's, the manifests directory and the agent's
/// log (inside the manifests directory, hidden, so the loader skips it).
pub struct BoxedNode {
    /// The DaemonSet's container, rendered from `deploy/`.
    pub container: Container,
    /// The node's network namespace and pods.
    pub node: Node,
    /// The cgroup the agent attaches to; pods' processes join it.
    pub cgroup: crate::sandbox::Cgroup,
    /// The node's /sys/fs/bpf.
    pub bpffs: crate::sandbox::BpfFs,
    /// The agent's `--manifests`.
    pub manifests: TempDir,
    /// The agent's output.
    pub log: PathBuf,
    tierlb: PathBuf,
}

impl BoxedNode {
    /// A node for `tierlb` with the DaemonSet of `deploy_dir`; needs root.
    pub fn new(tag: &str, tierlb: &Path, deploy_dir: &Path) -> anyhow::Result<Self> {
        anyhow::ensure!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
        let manifests = TempDir::new(tag)?;
        Ok(Self {
            container: Container::render(deploy_dir)?,
            node: Node::new(tag)?,
            cgroup: crate::sandbox::Cgroup::new(tag)?,
            bpffs: crate::sandbox::BpfFs::new(tag)?,
            log: manifests.path().join(".agent.log"),
            manifests,
            tierlb: tierlb.to_owned(),
        })
    }

    /// Run `tierlb` as the DaemonSet of `deploy_dir` runs it from now on (another release's binary and
    /// manifests: an upgrade or a rollback on the same node, pins and cgroup).
    pub fn use_release(&mut self, tierlb: &Path, deploy_dir: &Path) -> anyhow::Result<()> {
        self.container = Container::render(deploy_dir)?;
        tierlb.clone_into(&mut self.tierlb);
        Ok(())
    }

    /// Start the agent as the DaemonSet runs it on `node`, with `extra` flags; returns once it is ready.
    pub fn start_agent(&self, node: &str, extra: &[&str]) -> anyhow::Result<AgentBox> {
        self.start(node, None, extra)
    }

    /// Start the agent as the DaemonSet runs it on `node`, reading the API server (`--kube`, as deployed) with
    /// the service account credentials and address of `in_cluster`; returns once it is ready.
    pub fn start_agent_kube(
        &self,
        node: &str,
        in_cluster: &InCluster,
        extra: &[&str],
    ) -> anyhow::Result<AgentBox> {
        self.start(node, Some(in_cluster), extra)
    }

    fn start(&self, node: &str, in_cluster: Option<&InCluster>, extra: &[&str]) -> anyhow::Result<AgentBox> {
        let from = std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize);
        let mut args = match in_cluster {
            Some(_) => AgentBox::agent_args_kube(&self.container, node, self.cgroup.path())?,
            None => AgentBox::agent_args(&self.container, node, self.cgroup.path())?,
        };
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let paths = BoxPaths {
            tierlb: &self.tierlb,
            manifests: self.manifests.path(),
            cgroup: self.cgroup.path(),
            bpffs: self.bpffs.path(),
            log: &self.log,
        };
        let mut agent = AgentBox::start_with(&self.container, &self.node, &paths, &args, in_cluster)?;
        agent.wait_for(&self.log, from, "tierlb agent ready", crate::ready_wait())?;
        Ok(agent)
    }

    /// `count` requests to `target`, back to back, from a `tierlb-lab probe` in `netns` (a pod's, or the
    /// node's own) and the agent's cgroup.
    pub fn probe(&self, netns: &NetNs, target: &str, count: usize) -> anyhow::Result<crate::probe::Report> {
        self.probe_in(&self.cgroup, netns, target, count)
    }

    /// `probe` from `cgroup` (a pod's own, below the agent's, as the kubelet makes one per pod).
    pub fn probe_in(
        &self,
        cgroup: &crate::sandbox::Cgroup,
        netns: &NetNs,
        target: &str,
        count: usize,
    ) -> anyhow::Result<crate::probe::Report> {
        let mut cmd = Command::new(crate::workspace_bin("tierlb-lab", "lb-lab"));
        let count = count.to_string();
        cmd.args(["probe", "--target", target, "--count", &count, "--interval-ms", "0"]);
        cmd.stdout(Stdio::piped()).stdin(Stdio::null());
        confine(&mut cmd, Some(cgroup), Some(netns))?;
        let out = cmd.spawn()?.wait_with_output()?;
        serde_json::from_slice(&out.stdout).context("probe output")
    }
}
