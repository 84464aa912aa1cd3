//! A simulated cluster on one kernel: one private netns holding every pod IP, and per node a child cgroup
//! with its own `tierlb agent` process. Clients run as child processes confined to a node's cgroup and the
//! netns. Everything is removed on drop, agents first (which detaches their programs).
use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::probe::Report;
use crate::sandbox::{Cgroup, Child, NamedServer, NetNs, TempDir, confine};

/// One simulated node: a child cgroup and the agent that serves it.
pub struct SimNode {
    /// The node name the agent runs with (`--node`).
    pub name: String,
    // Field order is drop order: the agent (which detaches) goes before its cgroup.
    agent: Option<Child>,
    /// The node's cgroup: its clients run in it, its agent attaches to it.
    pub cgroup: Cgroup,
    /// The agent's stderr, appended across restarts; tests read syncs and readiness from it.
    pub log: PathBuf,
    args: Vec<String>,
}

/// The cluster: its nodes, its pods and the manifests directory every agent watches.
pub struct SimCluster {
    /// The nodes, in the order they were added (a restarted node goes last).
    pub nodes: Vec<SimNode>,
    pods: Vec<NamedServer>,
    dns_pods: Vec<crate::dns::DnsServer>,
    addresses: std::collections::BTreeSet<IpAddr>,
    /// The one network namespace that holds every pod IP and where every client runs.
    pub netns: NetNs,
    /// The agents' `--manifests` directory: tests write Services and EndpointSlices here.
    pub manifests: TempDir,
    /// The agents' logs, outside the manifests directory (a log line there would be a file event the agents
    /// watch, and every agent would sync again on each line another one writes).
    logs: TempDir,
    /// The `tierlb` binary the agents run.
    pub tierlb: PathBuf,
    /// The `tierlb-lab` binary: pods' servers and the probe and DNS clients.
    pub lab: PathBuf,
    /// `Some(kubeconfig)`: the agents watch a real API server (`--kube`) with it, from inside `netns` (which
    /// the control plane linked), instead of the manifests directory.
    kube: Option<PathBuf>,
}

impl SimCluster {
    /// `tierlb` and `tierlb-lab` are the binaries to run for agents and clients.
    pub fn new(tag: &str, tierlb: &Path, lab: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            nodes: Vec::new(),
            pods: Vec::new(),
            dns_pods: Vec::new(),
            addresses: std::collections::BTreeSet::new(),
            netns: NetNs::new(tag)?,
            manifests: TempDir::new(tag)?,
            logs: TempDir::new(&format!("{tag}-logs"))?,
            tierlb: tierlb.to_owned(),
            lab: lab.to_owned(),
            kube: None,
        })
    }

    /// A cluster whose agents watch the API server of `cp` with `kubeconfig` (`--kube`), as deployed agents
    /// do, instead of a manifests directory. They run inside the cluster's namespace, which `cp` links to
    /// itself.
    pub fn with_kube(
        tag: &str,
        tierlb: &Path,
        lab: &Path,
        cp: &mut crate::kube::ControlPlane,
        kubeconfig: &Path,
    ) -> anyhow::Result<Self> {
        let mut cluster = Self::new(tag, tierlb, lab)?;
        cp.link(&cluster.netns)?;
        cluster.kube = Some(kubeconfig.to_owned());
        Ok(cluster)
    }

    /// Start a pod: its IP on `lo` in the netns and a server that answers with `name`.
    pub fn add_pod(&mut self, addr: SocketAddr, name: &str) -> anyhow::Result<()> {
        self.ensure_address(addr.ip())?;
        self.pods.push(NamedServer::start(&self.lab, &self.netns, addr, name)?);
        Ok(())
    }

    fn ensure_address(&mut self, ip: IpAddr) -> anyhow::Result<()> {
        if self.addresses.insert(ip) {
            self.netns.add_address(ip)?;
        }
        Ok(())
    }

    /// Stop a pod's server (the pod process exits); its IP stays, so connects to it are refused.
    pub fn stop_pod(&mut self, addr: SocketAddr) {
        self.pods.retain(|p| p.addr() != addr);
    }

    /// Crash a pod: SIGKILL its server (no chance to close anything itself); its IP stays and no EndpointSlice
    /// changes, so connects to it are refused as a crashed pod's are before the control plane notices.
    pub fn kill_pod(&mut self, addr: SocketAddr) {
        for p in self.pods.iter().filter(|p| p.addr() == addr) {
            p.signal(nix::sys::signal::Signal::SIGKILL);
        }
        self.pods.retain(|p| p.addr() != addr);
    }

    /// Add a node with its own cgroup and agent; returns once the agent reports ready.
    pub fn add_node(&mut self, name: &str, extra_args: &[&str]) -> anyhow::Result<()> {
        let cgroup = Cgroup::new(name)?;
        let log = self.logs.path().join(format!("agent-{name}.log"));
        let mut node = SimNode {
            name: name.to_owned(),
            agent: None,
            cgroup,
            log,
            args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
        };
        self.spawn_agent(&mut node)?;
        self.nodes.push(node);
        Ok(())
    }

    fn spawn_agent(&self, node: &mut SimNode) -> anyhow::Result<()> {
        let logfile = std::fs::OpenOptions::new().create(true).append(true).open(&node.log)?;
        let start_len = logfile.metadata()?.len() as usize;
        let mut cmd = Command::new(&self.tierlb);
        cmd.args(["agent", "--node", &node.name]);
        match &self.kube {
            Some(kubeconfig) => {
                cmd.arg("--kube").env("KUBECONFIG", kubeconfig);
                confine(&mut cmd, None, Some(&self.netns))?;
            }
            None => {
                cmd.arg("--manifests").arg(self.manifests.path());
            }
        }
        cmd.arg("--cgroup")
            .arg(node.cgroup.path())
            .args(&node.args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null());
        // Simulated nodes share the host's network namespace: listeners are off unless a test asks.
        for flag in ["--healthz-addr", "--metrics-addr", "--service-health-bind"] {
            if !node.args.iter().any(|a| a == flag) {
                cmd.args([flag, "off"]);
            }
        }
        cmd.stderr(logfile);
        let agent = node.agent.insert(Child::spawn(&mut cmd)?);
        agent
            .wait_for_log(&node.log, start_len, "tierlb agent ready", crate::ready_wait())
            .with_context(|| format!("agent for {}", node.name))
    }

    /// Kill a node's agent with SIGKILL (no chance to clean up) and reap it.
    pub fn kill_agent(&mut self, node: &str) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == node)
            && let Some(mut a) = n.agent.take()
        {
            a.signal(nix::sys::signal::Signal::SIGKILL);
            let _ = a.inner().wait();
        }
    }

    /// Start a node's agent again (same cgroup, same arguments); returns once it is ready.
    pub fn restart_agent(&mut self, node: &str) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let mut n = self
            .nodes
            .iter()
            .position(|n| n.name == node)
            .map(|i| self.nodes.remove(i))
            .context("no such node")?;
        let r = self.spawn_agent(&mut n);
        self.nodes.push(n);
        r.map(|()| start.elapsed())
    }

    /// The node called `name`; panics if there is none (a test's typo).
    pub fn node(&self, name: &str) -> &SimNode {
        self.nodes.iter().find(|n| n.name == name).expect("node exists")
    }

    /// How many syncs the node's agent has logged.
    pub fn syncs(&self, node: &str) -> usize {
        std::fs::read_to_string(&self.node(node).log).unwrap_or_default().matches(" synced").count()
    }

    /// Wait until every agent logged more syncs than `before` (from `syncs_all`).
    pub fn wait_synced(&self, before: &[usize]) -> anyhow::Result<Duration> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.nodes.iter().zip(before).all(|(n, b)| self.syncs(&n.name) > *b) {
                return Ok(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        bail!("agents did not sync within 10 s")
    }

    /// Every node's `syncs`, in node order: the `before` of `wait_synced`.
    pub fn syncs_all(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| self.syncs(&n.name)).collect()
    }

    /// A command confined to a node's cgroup and the cluster netns.
    pub fn client_command(&self, node: &str, program: &Path) -> anyhow::Result<Command> {
        let mut cmd = Command::new(program);
        confine(&mut cmd, Some(&self.node(node).cgroup), Some(&self.netns))?;
        Ok(cmd)
    }

    /// Start a probe client on a node; collect it with `ProbeRun::wait`.
    pub fn start_probe(
        &self,
        node: &str,
        target: SocketAddr,
        count: usize,
        interval: Duration,
    ) -> anyhow::Result<ProbeRun> {
        self.start_probe_with_timeout(node, target, count, interval, Duration::from_secs(2))
    }

    /// The same with the client's per-request timeout.
    pub fn start_probe_with_timeout(
        &self,
        node: &str,
        target: SocketAddr,
        count: usize,
        interval: Duration,
        timeout: Duration,
    ) -> anyhow::Result<ProbeRun> {
        let mut cmd = self.client_command(node, &self.lab)?;
        cmd.args(["probe", "--target", &target.to_string(), "--count", &count.to_string()])
            .args(["--interval-ms", &format!("{}", interval.as_secs_f64() * 1e3)])
            .args(["--timeout-ms", &timeout.as_millis().to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        Ok(ProbeRun { child: Child::spawn(&mut cmd)? })
    }

    /// `start_probe` and wait for its report.
    pub fn probe(
        &self,
        node: &str,
        target: SocketAddr,
        count: usize,
        interval: Duration,
    ) -> anyhow::Result<Report> {
        self.start_probe(node, target, count, interval)?.wait()
    }

    /// Resolve through a DNS server address from a node (a `tierlb-lab dns` client in its cgroup).
    pub fn dns(
        &self,
        node: &str,
        server: SocketAddr,
        count: usize,
        connected: bool,
    ) -> anyhow::Result<Vec<crate::dns::Lookup>> {
        let mut cmd = self.client_command(node, &self.lab)?;
        cmd.args(["dns", "--server", &server.to_string(), "--count", &count.to_string()]);
        if connected {
            cmd.arg("--connected");
        }
        let out = cmd.stderr(Stdio::inherit()).output()?;
        anyhow::ensure!(out.status.success(), "dns client failed");
        serde_json::from_slice(&out.stdout).context("dns client output")
    }

    /// Start a DNS server at `addr` (its IP added to the netns) answering with `answer`.
    pub fn add_dns_pod(&mut self, addr: SocketAddr, answer: IpAddr) -> anyhow::Result<()> {
        self.ensure_address(addr.ip())?;
        self.dns_pods.push(crate::dns::DnsServer::start(&self.netns, addr, answer)?);
        Ok(())
    }

    /// Stop a node's agent (SIGTERM; detaches).
    pub fn stop_agent(&mut self, node: &str) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == node) {
            n.agent = None;
        }
    }
}

/// A probe client running on a node, so a test can change the cluster while it runs.
pub struct ProbeRun {
    child: Child,
}

impl ProbeRun {
    /// Wait for the client to finish and read its report.
    pub fn wait(mut self) -> anyhow::Result<Report> {
        let mut out = String::new();
        std::io::Read::read_to_string(self.child.inner().stdout.as_mut().context("probe stdout")?, &mut out)?;
        let status = self.child.inner().wait()?;
        if !status.success() {
            bail!("probe failed ({status})");
        }
        serde_json::from_str(&out).with_context(|| format!("probe output: {out}"))
    }
}
