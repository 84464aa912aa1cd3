//! A cluster in a box: Kubernetes' own control plane (etcd, kube-apiserver, kube-controller-manager v1.36.3,
//! built from Kubernetes' code by `cargo xtask setup` into `target/k8s`) in a network namespace of its own,
//! started the way a real cluster runs it, and a kubelet's part played by the harness.
//!
//! - etcd (embedded 3.6) on 127.0.0.1 inside the control plane's namespace, its data in a temporary
//!   directory (no fsync).
//! - kube-apiserver on `API_ADDR:6443` (an address on that namespace's loopback), TLS with a CA of the test's
//!   own, client certificates, `--authorization-mode=Node,RBAC`, the default admission plugins, service
//!   account tokens signed with a key pair of the test's, ClusterIPs allocated from `SERVICE_CIDR`.
//! - kube-controller-manager with the EndpointSlice controller (and the service-account controller the
//!   ServiceAccount admission plugin needs), each controller with its own service account's credentials as
//!   kubeadm runs it, no leader election.
//! - Other namespaces (a simulated cluster's, a node's) reach the API server through a veth pair (`link`).
//!
//! The harness plays the kubelet ([`ControlPlane::pod_ready`] and friends): it binds pods to nodes at creation,
//! sets a pod's IP and its Ready condition from the real process behind it, and after a graceful deletion ends
//! that process and removes the pod object. What a kubelet does that it does not: no container runtime, images,
//! probes (readiness is set from the process listening), node heartbeats or Lease renewal (Nodes stay
//! `Unknown`; no node-lifecycle controller runs to taint them), no node status beyond what the test writes,
//! no cgroup per pod unless the test makes one, no eviction.
//!
//! Everything is stopped by its pid and removed on drop (controller manager, API server, etcd, then the
//! namespaces and directories).
use std::{
    io::Write as _,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::sandbox::{Child, NetNs, TempDir, confine, output};

/// The API server's address, on the control plane namespace's loopback.
pub const API_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 1);
/// The API server's secure port.
pub const API_PORT: u16 = 6443;
/// ClusterIPs are allocated from here (the story's cluster used kubeadm's default).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The client identities written with the certificates: (name, groups).
const USERS: &[&str] = &[
    "admin=system:masters",
    "system:kube-controller-manager",
    // kube-proxy's identity: the bootstrap policy binds it to `system:node-proxier`.
    "system:kube-proxy",
    // The story's operator: no group, so only what RBAC grants by name.
    "operator",
];

/// A binary of the control plane built by `cargo xtask setup` (`target/k8s/NAME`): `kubectl`,
/// `kube-apiserver`, `kube-controller-manager`, `kube-proxy`, `etcd`, `etcd-compact`, `pki`.
///
/// # Panics
/// When it is not there: a test that needs the control plane fails rather than skips.
#[must_use]
pub fn k8s_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's own path");
    // target/<profile>/deps/<test>-<hash>, or target/<profile>/<bin>
    let target = exe
        .ancestors()
        .find(|p| p.join("k8s").exists())
        .map_or_else(|| PathBuf::from("target/k8s"), |p| p.join("k8s"));
    let bin = target.join(name);
    assert!(
        bin.exists(),
        "{} is missing: the Kubernetes control plane is built by `cargo xtask setup` (part of `cargo xtask \
         test`)",
        bin.display()
    );
    bin
}

/// `kubectl --kubeconfig KUBECONFIG`, built here.
#[must_use]
pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(k8s_bin("kubectl"));
    cmd.arg("--kubeconfig").arg(kubeconfig);
    cmd
}

/// A running control plane.
pub struct ControlPlane {
    // Field order is drop order: controllers before the API server before etcd, then the namespace.
    kcm: Option<Child>,
    apiserver: Option<Child>,
    etcd: Option<Child>,
    /// The control plane's network namespace.
    pub netns: NetNs,
    /// Certificates, kubeconfigs, etcd's data and the components' logs.
    pub dir: TempDir,
    links: u8,
    options: Options,
}

impl Drop for ControlPlane {
    /// Its links go with it at once: deleting one end of a veth deletes the pair, so a namespace it was linked
    /// to (which outlives it) can be linked to the next control plane; the namespace's own removal frees
    /// them only whenever the kernel gets to it.
    fn drop(&mut self) {
        for i in 1..=self.links {
            let _ = self.netns.ip(&["link", "del", &format!("cp{i}")]);
        }
    }
}

/// How to run the control plane.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--service-cluster-ip-range`; default [`SERVICE_CIDR`].
    pub service_cidr: Option<String>,
    /// `--service-node-port-range` (`30000-32767` by default, too few for the bench's 10,000 NodePort
    /// Services).
    pub node_port_range: Option<String>,
}

impl ControlPlane {
    /// Start etcd, the API server and the controller manager; returns once the API server is ready and the
    /// `default` service account exists (pods can be created).
    pub fn start(tag: &str, options: Options) -> anyhow::Result<Self> {
        anyhow::ensure!(
            nix::unistd::geteuid().is_root(),
            "the cluster in a box needs root (network namespaces)"
        );
        let netns = NetNs::new(&format!("{tag}-cp"))?;
        netns.add_address(IpAddr::V4(API_ADDR))?;
        let dir = TempDir::new(&format!("{tag}-k8s"))?;
        output(
            Command::new(k8s_bin("pki"))
                .arg("--dir")
                .arg(dir.path().join("pki"))
                .arg("--server")
                .arg(format!("https://{API_ADDR}:{API_PORT}"))
                .args(USERS.iter().flat_map(|u| ["--user", u])),
        )?;
        let mut cp = Self { kcm: None, apiserver: None, etcd: None, netns, dir, links: 0, options };
        cp.start_etcd()?;
        cp.start_apiserver()?;
        cp.start_controller_manager()?;
        cp.wait_for_default_account("default")?;
        Ok(cp)
    }

    fn log(&self, name: &str) -> anyhow::Result<std::fs::File> {
        Ok(std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(name))?)
    }

    fn spawn(&self, program: &str, args: &[String], log: &str) -> anyhow::Result<Child> {
        let mut cmd = Command::new(k8s_bin(program));
        cmd.args(args).stdin(Stdio::null()).stdout(self.log(log)?).stderr(self.log(log)?);
        confine(&mut cmd, None, Some(&self.netns))?;
        Child::spawn(&mut cmd)
    }

    fn start_etcd(&mut self) -> anyhow::Result<()> {
        let data = self.dir.path().join("etcd");
        let args = vec![
            format!("--data-dir={}", data.display()),
            "--listen-client-urls=http://127.0.0.1:2379".to_owned(),
            "--listen-peer-urls=http://127.0.0.1:2380".to_owned(),
            "--unsafe-no-fsync".to_owned(),
        ];
        let log = self.dir.path().join("etcd.log");
        let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        let mut etcd = self.spawn("etcd", &args, "etcd.log")?;
        etcd.wait_for_log(&log, from, "etcd: ready", Duration::from_secs(30)).context("etcd")?;
        self.etcd = Some(etcd);
        Ok(())
    }

    fn pki(&self, file: &str) -> String {
        self.dir.path().join("pki").join(file).display().to_string()
    }

    /// A kubeconfig written for `user` (`admin`, `operator`, `system-kube-controller-manager`).
    #[must_use]
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        self.dir.path().join("pki").join(format!("{user}.kubeconfig"))
    }

    /// The API server's URL.
    #[must_use]
    pub fn server(&self) -> String {
        format!("https://{API_ADDR}:{API_PORT}")
    }

    /// Start (or start again) the API server on the same etcd; returns once `/readyz` answers.
    pub fn start_apiserver(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let args = vec![
            "--etcd-servers=http://127.0.0.1:2379".to_owned(),
            format!("--bind-address={API_ADDR}"),
            format!("--advertise-address={API_ADDR}"),
            format!("--secure-port={API_PORT}"),
            format!("--tls-cert-file={}", self.pki("apiserver.crt")),
            format!("--tls-private-key-file={}", self.pki("apiserver.key")),
            format!("--client-ca-file={}", self.pki("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", self.pki("sa.pub")),
            format!("--service-account-signing-key-file={}", self.pki("sa.key")),
            format!(
                "--service-cluster-ip-range={}",
                self.options.service_cidr.as_deref().unwrap_or(SERVICE_CIDR)
            ),
            format!(
                "--service-node-port-range={}",
                self.options.node_port_range.as_deref().unwrap_or("30000-32767")
            ),
            "--authorization-mode=Node,RBAC".to_owned(),
            // As kubeadm's API server: kube-proxy's own DaemonSet (privileged) must be admitted.
            "--allow-privileged=true".to_owned(),
            format!("--cert-dir={}", self.dir.path().join("apiserver-certs").display()),
        ];
        self.apiserver = Some(self.spawn("kube-apiserver", &args, "apiserver.log")?);
        self.wait_for(Duration::from_mins(1), "the API server's /readyz", |cp| {
            Ok(cp.kubectl(&["get", "--raw", "/readyz"]).is_ok())
        })?;
        Ok(started.elapsed())
    }

    /// Stop the API server (SIGTERM, as a restart of its static pod does); etcd and the controllers stay.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut a) = self.apiserver.take() {
            a.stop(Duration::from_secs(10));
        }
    }

    /// Stop kube-controller-manager (the EndpointSlice controller with it); the slices stay as it left them.
    pub fn stop_controller_manager(&mut self) {
        if let Some(mut kcm) = self.kcm.take() {
            kcm.stop(Duration::from_secs(10));
        }
    }

    /// Start kube-controller-manager with the EndpointSlice and service-account controllers (again, after
    /// `stop_controller_manager`).
    pub fn start_controller_manager(&mut self) -> anyhow::Result<()> {
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig("system-kube-controller-manager").display()),
            "--leader-elect=false".to_owned(),
            // The EndpointSlice controller writes the slices and their hints; the service-account controller
            // makes each namespace's `default` account (pods need it).
            "--controllers=endpointslice-controller,serviceaccount-controller".to_owned(),
            // Each controller acts with its own service account, bound to its bootstrap role (kubeadm's way).
            "--use-service-account-credentials=true".to_owned(),
            format!("--root-ca-file={}", self.pki("ca.crt")),
            "--secure-port=0".to_owned(),
        ];
        self.kcm = Some(self.spawn("kube-controller-manager", &args, "controller-manager.log")?);
        Ok(())
    }

    /// Compact etcd's history to its current revision: every resourceVersion a watcher holds from before is
    /// gone, and resuming from it is answered 410 Gone. Returns the revision.
    pub fn compact(&self) -> anyhow::Result<u64> {
        let mut cmd = Command::new(k8s_bin("etcd-compact"));
        cmd.arg("--endpoints=http://127.0.0.1:2379");
        confine(&mut cmd, None, Some(&self.netns))?;
        output(&mut cmd)?.trim().parse().context("etcd-compact's revision")
    }

    /// Poll `check` every 50 ms until it holds, for at most `timeout`.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&Self) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            if check(self)? {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!("{what}: not after {timeout:?} (logs in {})", self.dir.path().display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kubectl` as `admin`, inside the control plane's namespace: its stdout, or an error with its stderr.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl_as("admin", args)
    }

    /// `kubectl` as `user` (a kubeconfig of `kubeconfig`, or a path to one).
    pub fn kubectl_as(&self, user: &str, args: &[&str]) -> anyhow::Result<String> {
        let config = if user.contains('/') { PathBuf::from(user) } else { self.kubeconfig(user) };
        let mut cmd = kubectl(&config);
        cmd.args(args);
        confine(&mut cmd, None, Some(&self.netns))?;
        output(&mut cmd)
    }

    /// `kubectl apply -f -` of `yaml` as `admin`.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        self.kubectl_stdin(&["apply", "-f", "-"], yaml)
    }

    /// `kubectl ARGS` as `admin` with `stdin` on its standard input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> anyhow::Result<String> {
        let mut cmd = kubectl(&self.kubeconfig("admin"));
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        confine(&mut cmd, None, Some(&self.netns))?;
        let mut child = cmd.spawn()?;
        child.stdin.take().context("kubectl stdin")?.write_all(stdin.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Let `ns` reach the API server: a veth pair, `API_ADDR` routed through it. Returns the address `ns`
    /// gets on its end.
    pub fn link(&mut self, ns: &NetNs) -> anyhow::Result<IpAddr> {
        self.links += 1;
        let i = self.links;
        let peer = Ipv4Addr::new(10, 254, 1, i);
        let here = format!("cp{i}");
        self.netns.ip(&[
            "link",
            "add",
            &here,
            "type",
            "veth",
            "peer",
            "name",
            "to-api",
            "netns",
            ns.name(),
        ])?;
        self.netns.ip(&["link", "set", &here, "up"])?;
        self.netns.ip(&[
            "route",
            "add",
            &format!("{peer}/32"),
            "dev",
            &here,
            "src",
            &API_ADDR.to_string(),
        ])?;
        ns.ip(&["addr", "add", &format!("{peer}/32"), "dev", "to-api"])?;
        ns.ip(&["link", "set", "to-api", "up"])?;
        ns.ip(&["route", "add", &format!("{API_ADDR}/32"), "dev", "to-api", "src", &peer.to_string()])?;
        Ok(IpAddr::V4(peer))
    }

    /// A kubeconfig for the service account `namespace/name` with a token the API server issued for it
    /// (`kubectl create token`), as the kubelet's projected token gives a pod. Written into the test's
    /// directory; returns its path.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
        let token = self.service_account_token(namespace, name)?;
        let path = self.dir.path().join(format!("sa-{namespace}-{name}.kubeconfig"));
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.server(),
                "certificate-authority": self.pki("ca.crt"),
            }}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
            "current-context": "test",
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
        Ok(path)
    }

    /// What the kubelet mounts into a pod of the service account `namespace/name`, at
    /// /var/run/secrets/kubernetes.io/serviceaccount: a directory with `token` (issued by the API server now,
    /// valid for an hour), `ca.crt` and `namespace`, and the API server's address, for a deployed agent's box.
    pub fn in_cluster(&self, namespace: &str, name: &str) -> anyhow::Result<crate::deployed::InCluster> {
        let dir = self.dir.path().join(format!("serviceaccount-{namespace}-{name}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("token"), self.service_account_token(namespace, name)?)?;
        std::fs::copy(self.dir.path().join("pki/ca.crt"), dir.join("ca.crt"))?;
        std::fs::write(dir.join("namespace"), namespace)?;
        Ok(crate::deployed::InCluster { secrets: dir, host: IpAddr::V4(API_ADDR), port: API_PORT })
    }

    /// A token for `namespace/name`, valid for an hour.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> anyhow::Result<String> {
        Ok(self.kubectl(&["-n", namespace, "create", "token", name, "--duration=1h"])?.trim().to_owned())
    }

    /// A Node object, as a kubelet registers one: its zone label (if any) and InternalIP.
    pub fn add_node(&self, name: &str, zone: Option<&str>, internal_ip: IpAddr) -> anyhow::Result<()> {
        self.add_node_ips(name, zone, &[internal_ip])
    }

    /// As `add_node`, with each of `internal_ips` (a dual-stack node's) an `InternalIP`.
    pub fn add_node_ips(
        &self,
        name: &str,
        zone: Option<&str>,
        internal_ips: &[IpAddr],
    ) -> anyhow::Result<()> {
        let labels =
            zone.map_or_else(String::new, |z| format!(", labels: {{topology.kubernetes.io/zone: {z}}}"));
        let addresses: Vec<String> =
            internal_ips.iter().map(|ip| format!("{{type: InternalIP, address: '{ip}'}}")).collect();
        self.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}{labels}}}\n\
             status: {{addresses: [{}]}}\n",
            addresses.join(", ")
        ))?;
        Ok(())
    }

    /// A namespace, once its `default` service account exists (pods can be created in it).
    pub fn add_namespace(&self, name: &str) -> anyhow::Result<()> {
        self.apply(&format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n"))?;
        self.wait_for_default_account(name)
    }

    /// Wait until the service-account controller made `default` in `namespace`: the ServiceAccount admission
    /// plugin refuses pods until then.
    fn wait_for_default_account(&self, namespace: &str) -> anyhow::Result<()> {
        let what = format!("the default service account of namespace {namespace}");
        self.wait_for(Duration::from_secs(30), &what, |cp| {
            Ok(cp.kubectl(&["-n", namespace, "get", "serviceaccount", "default"]).is_ok())
        })?;
        Ok(())
    }

    /// A pod bound to `node` (created with `spec.nodeName`, as the scheduler's binding leaves it), with
    /// `labels` and one container port, `Pending` until [`pod_ready`](Self::pod_ready).
    pub fn add_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        port: u16,
    ) -> anyhow::Result<()> {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        self.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}, labels: {{{}}}}}\n\
             spec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 30\n  containers:\n  \
             - {{name: app, image: registry.invalid/app:1, ports: [{{containerPort: {port}}}]}}\n",
            labels.join(", ")
        ))?;
        Ok(())
    }

    /// Set a pod's status as its kubelet would: Running with `ip`, and the Ready condition `ready` (true
    /// while the process behind it listens).
    pub fn pod_status(&self, namespace: &str, name: &str, ip: IpAddr, ready: bool) -> anyhow::Result<()> {
        self.pod_status_ips(namespace, name, &[ip], ready)
    }

    /// As `pod_status`, with each of `ips` (a dual-stack pod's, the primary first) in `podIPs`.
    pub fn pod_status_ips(
        &self,
        namespace: &str,
        name: &str,
        ips: &[IpAddr],
        ready: bool,
    ) -> anyhow::Result<()> {
        let status = if ready { "True" } else { "False" };
        let first = ips.first().context("a pod has an address")?;
        let all: Vec<serde_json::Value> =
            ips.iter().map(|ip| serde_json::json!({"ip": ip.to_string()})).collect();
        let patch = serde_json::json!({"status": {
            "phase": "Running",
            "podIP": first.to_string(),
            "podIPs": all,
            "conditions": [
                {"type": "Ready", "status": status},
                {"type": "ContainersReady", "status": status},
            ],
        }});
        self.kubectl(&[
            "-n",
            namespace,
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &patch.to_string(),
        ])?;
        Ok(())
    }

    /// Delete a pod with a grace period, as a rolling update does: it is terminating (and, while its process
    /// runs, serving) until [`pod_gone`](Self::pod_gone).
    pub fn delete_pod_gracefully(
        &self,
        namespace: &str,
        name: &str,
        grace_seconds: u32,
    ) -> anyhow::Result<()> {
        self.delete_pod(namespace, name, &[&format!("--grace-period={grace_seconds}")])
    }

    /// The kubelet's last step once a deleted pod's process has ended: remove the object.
    pub fn pod_gone(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        self.delete_pod(namespace, name, &["--grace-period=0", "--force"])
    }

    fn delete_pod(&self, namespace: &str, name: &str, flags: &[&str]) -> anyhow::Result<()> {
        let mut args = vec!["-n", namespace, "delete", "pod", name, "--wait=false"];
        args.extend_from_slice(flags);
        self.kubectl(&args)?;
        Ok(())
    }

    /// The EndpointSlices of a Service as JSON (`kubectl get endpointslice -l kubernetes.io/service-name=`).
    pub fn slices(&self, namespace: &str, service: &str) -> anyhow::Result<serde_json::Value> {
        let out = self.kubectl(&[
            "-n",
            namespace,
            "get",
            "endpointslice",
            "-l",
            &format!("kubernetes.io/service-name={service}"),
            "-o",
            "json",
        ])?;
        Ok(serde_json::from_str(&out)?)
    }

    /// The log of a component (`apiserver`, `etcd`, `controller-manager`), for a failing test's message.
    #[must_use]
    pub fn component_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

/// A simulated cluster (one agent per node, `--kube`) on a real control plane, with the harness as every
/// node's kubelet: each pod is a Pod object bound to its node and a real server process in the cluster's
/// namespace, whose status follows the process.
pub struct KubeCluster {
    // Field order is drop order: agents and pods before the control plane they watch.
    /// The nodes, their agents and the pods' processes.
    pub sim: crate::cluster::SimCluster,
    /// The API server, etcd and the controllers.
    pub cp: ControlPlane,
    /// Pod objects and where their process listens: (namespace, name) -> address.
    pods: std::collections::BTreeMap<(String, String), std::net::SocketAddr>,
}

impl KubeCluster {
    /// The control plane, `deploy/rbac.yaml` applied with kubectl, and a simulated cluster whose agents
    /// authenticate as its service account (`kube-system/tierlb`), with a token the API server issued.
    pub fn start(
        tag: &str,
        tierlb: &Path,
        lab: &Path,
        deploy: &Path,
        options: Options,
    ) -> anyhow::Result<Self> {
        let mut cp = ControlPlane::start(tag, options)?;
        cp.kubectl(&["apply", "-f", &deploy.join("rbac.yaml").display().to_string()])?;
        let kubeconfig = cp.service_account_kubeconfig("kube-system", "tierlb")?;
        let sim = crate::cluster::SimCluster::with_kube(tag, tierlb, lab, &mut cp, &kubeconfig)?;
        Ok(Self { sim, cp, pods: std::collections::BTreeMap::new() })
    }

    /// A Node object (zone label, InternalIP 10.0.0.N for the N-th) and its agent; returns once the agent is
    /// ready (it has listed everything).
    pub fn add_node(&mut self, name: &str, zone: Option<&str>, agent_args: &[&str]) -> anyhow::Result<()> {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, u8::try_from(self.sim.nodes.len() + 1)?));
        self.cp.add_node(name, zone, ip)?;
        self.sim.add_node(name, agent_args)
    }

    /// A pod on `node`: the object, then its process listening on `addr` (answering with the pod's name),
    /// then its status Ready with `addr`'s IP.
    pub fn start_pod(
        &mut self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        addr: std::net::SocketAddr,
    ) -> anyhow::Result<()> {
        self.cp.add_pod(namespace, name, node, labels, addr.port())?;
        self.sim.add_pod(addr, name)?;
        self.cp.pod_status(namespace, name, addr.ip(), true)?;
        self.pods.insert((namespace.to_owned(), name.to_owned()), addr);
        Ok(())
    }

    /// The pod's Ready condition as its kubelet's readiness probe would set it (the process keeps running).
    pub fn pod_ready(&mut self, namespace: &str, name: &str, ready: bool) -> anyhow::Result<()> {
        let addr = self.addr(namespace, name)?;
        self.cp.pod_status(namespace, name, addr.ip(), ready)?;
        Ok(())
    }

    /// A rolling update's deletion: the pod is deleted with a grace period (terminating; its process
    /// keeps serving), then after `serving_for` its process ends and the object is removed, as the kubelet
    /// does.
    pub fn roll_out_pod(&mut self, namespace: &str, name: &str, serving_for: Duration) -> anyhow::Result<()> {
        let addr = self.addr(namespace, name)?;
        self.cp.delete_pod_gracefully(namespace, name, 30)?;
        std::thread::sleep(serving_for);
        self.sim.stop_pod(addr);
        self.cp.pod_gone(namespace, name)?;
        self.pods.remove(&(namespace.to_owned(), name.to_owned()));
        Ok(())
    }

    fn addr(&self, namespace: &str, name: &str) -> anyhow::Result<std::net::SocketAddr> {
        self.pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
            .with_context(|| format!("no pod {namespace}/{name} in this cluster"))
    }
}
