//! Real kube-proxy (v1.36.3, built by `cargo xtask setup` into `target/k8s/kube-proxy`) on a simulated node.
//!
//! It runs only inside a network namespace the test made, never in the host's: it rewrites the namespace's
//! iptables or nftables rules and its per-namespace sysctls. It authenticates as `system:kube-proxy` (a
//! client certificate of the control plane's CA), which the API server's bootstrap policy binds to the
//! `system:node-proxier` ClusterRole, as kubeadm's kube-proxy is bound. Its configuration file is a
//! `KubeProxyConfiguration`, as kubeadm writes one, with the conntrack settings that would write global
//! sysctls turned off (`maxPerCore: 0`, no timeouts): a network namespace other than the host's cannot set
//! them, and the host's must not be touched.
//!
//! Stopped by its pid on drop (SIGTERM, then SIGKILL); its rules go with the namespace.
use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    kube::{ControlPlane, k8s_bin},
    sandbox::{Child, NetNs, confine, output},
};

/// kube-proxy's proxy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `iptables` (the default on Linux).
    Iptables,
    /// `nftables` (GA in 1.33).
    Nftables,
}

impl Mode {
    /// As `--proxy-mode` and the configuration file spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        }
    }
}

/// Where kube-proxy serves `/healthz` and `/livez` by default.
pub const HEALTHZ_PORT: u16 = 10256;
/// Where kube-proxy serves `/metrics` by default (inside its namespace).
pub const METRICS_PORT: u16 = 10249;

/// How long a kube-proxy may take after its first sync to take its Node's zone and write its rules again
/// (`KubeProxy::launch_zoned`; milliseconds when it does, on an idle machine).
pub const TOPOLOGY_WAIT: Duration = Duration::from_secs(20);

/// How to start kube-proxy (`KubeProxy::launch`).
#[derive(Clone, Debug)]
pub struct Launch {
    /// Its proxy mode.
    pub mode: Mode,
    /// Where it serves `/healthz` and `/livez`.
    pub healthz: SocketAddr,
    /// Where it serves `/metrics`.
    pub metrics: SocketAddr,
    /// How long its first sync may take (the bench's 10,000 Services take minutes in iptables mode).
    pub limit: Duration,
    /// Another release `cargo xtask setup` built (`v1.34.4`: `target/k8s/kube-proxy-v1.34.4`); none: v1.36.3,
    /// the control plane's.
    pub release: Option<String>,
    /// Its log's verbosity (`--v`; 2 as kubeadm runs it, 4 to log when it takes its Node's topology
    /// labels: `synced_topology`).
    pub verbosity: u8,
}

/// A running kube-proxy.
pub struct KubeProxy {
    child: Child,
    /// Its log (klog, `-v=2`).
    pub log: PathBuf,
    /// Its proxy mode.
    pub mode: Mode,
    /// Where it serves `/metrics`.
    pub metrics: SocketAddr,
    netns_name: String,
}

/// `GET path` on `at` from inside `ns`: the status code and the body.
pub fn http_get(ns: &NetNs, at: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let path = path.to_owned();
    ns.run(move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect_timeout(&at, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let code = text.split_whitespace().nth(1).context("no status line")?.parse()?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        // A chunked body (Go's server chunks what it does not know the length of): its chunks joined.
        let chunked = text.to_ascii_lowercase().contains("transfer-encoding: chunked");
        let body = if chunked { unchunk(body) } else { body.to_owned() };
        Ok((code, body))
    })
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl KubeProxy {
    /// Start kube-proxy for `node` in `ns` (which must reach the API server: `ControlPlane::link`), serving
    /// `/healthz` on `healthz` and `/metrics` on `metrics`; returns once it has written its rules once (its
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` is set).
    pub fn start(
        cp: &ControlPlane,
        node: &str,
        ns: &NetNs,
        mode: Mode,
        healthz: SocketAddr,
        metrics: SocketAddr,
    ) -> anyhow::Result<Self> {
        Self::launch(
            cp,
            node,
            ns,
            &Launch { mode, healthz, metrics, limit: Duration::from_mins(1), release: None, verbosity: 2 },
        )
    }

    /// As `launch`, for a node whose Node has a zone label: returns once its proxier has taken the zone and
    /// written its rules since, with how many of its starts never took it. kube-proxy v1.34 to v1.37 can miss
    /// its Node's zone at start for good: `NodeTopologyConfig` adds its handler to the node informer that
    /// `NodeManager` has already started and synced, so the informer may deliver the Node before the proxier
    /// is registered (`RegisterEventHandler`, the next line of `cmd/kube-proxy/app/server.go`); the labels are
    /// stored with no one to tell, and later events carrying the same labels are skipped as unchanged. Such a
    /// kube-proxy logs "Ignoring same-zone topology hints ... node is missing label" and spreads over every
    /// endpoint until the zone label changes or it restarts. A start that has not taken the zone within
    /// `TOPOLOGY_WAIT` is stopped and started again, as an operator would (at most 3 times).
    pub fn launch_zoned(
        cp: &ControlPlane,
        node: &str,
        ns: &NetNs,
        how: &Launch,
    ) -> anyhow::Result<(Self, usize)> {
        let how = Launch { verbosity: how.verbosity.max(4), ..how.clone() };
        for missed in 0..3 {
            let mut proxy = Self::launch(cp, node, ns, &how)?;
            let start = Instant::now();
            while start.elapsed() < TOPOLOGY_WAIT {
                if proxy.synced_topology(ns)? {
                    return Ok((proxy, missed));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            proxy.stop(Duration::from_secs(10));
        }
        bail!("kube-proxy for {node} ({} mode) did not take its Node's zone in 3 starts", how.mode.as_str())
    }

    /// Start kube-proxy for `node` in `ns` as `how` says; returns once it has written its rules once.
    pub fn launch(cp: &ControlPlane, node: &str, ns: &NetNs, how: &Launch) -> anyhow::Result<Self> {
        let Launch { mode, healthz, metrics, limit, release, verbosity } = how.clone();
        let dir = cp.dir.path().join(format!(
            "kube-proxy-{node}-{}{}",
            mode.as_str(),
            release.as_deref().map(|r| format!("-{r}")).unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                 clientConnection:\n  kubeconfig: {kubeconfig}\nhostnameOverride: {node}\nmode: {mode}\n\
                 clusterCIDR: 10.244.0.0/16,fd00:244::/32\nhealthzBindAddress: {healthz}\nmetricsBindAddress: {metrics}\n\
                 conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  \
                 tcpCloseWaitTimeout: 0s\n",
                kubeconfig = cp.kubeconfig("system-kube-proxy").display(),
                mode = mode.as_str(),
            ),
        )?;
        let log = dir.join("kube-proxy.log");
        let file = || std::fs::OpenOptions::new().create(true).append(true).open(&log);
        let program =
            release.as_deref().map_or_else(|| "kube-proxy".to_owned(), |r| format!("kube-proxy-{r}"));
        let mut cmd = Command::new(k8s_bin(&program));
        cmd.arg(format!("--config={}", config.display()))
            .arg(format!("--v={verbosity}"))
            // Its log's times in UTC, as its metrics' Unix times are (`synced_topology` compares them).
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(file()?)
            .stderr(file()?);
        confine(&mut cmd, None, Some(ns))?;
        let child = Child::spawn(&mut cmd)?;
        let mut proxy = Self { child, log, mode, metrics, netns_name: ns.name().to_owned() };
        let start = Instant::now();
        while proxy.last_sync(ns).unwrap_or(0.0) <= 0.0 {
            if let Ok(Some(status)) = proxy.child.inner().try_wait() {
                bail!("kube-proxy for {node} exited ({status}):\n{}", proxy.log_text());
            }
            if start.elapsed() > limit {
                bail!("kube-proxy for {node} wrote no rules in {limit:?}:\n{}", proxy.log_text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(proxy)
    }

    /// Its log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its `/metrics`, as text (read from inside `ns`, its namespace).
    pub fn metrics_text(&self, ns: &NetNs) -> anyhow::Result<String> {
        Ok(http_get(ns, self.metrics, "/metrics")?.1)
    }

    /// Whether every EndpointSlice change it has counted is in the rules it wrote: `changes` or more
    /// counted (`kubeproxy_sync_proxy_rules_endpoint_changes_total`), none pending, and its last sync
    /// ended after the last one was queued.
    pub fn synced_past(&self, ns: &NetNs, changes: f64) -> anyhow::Result<bool> {
        let text = self.metrics_text(ns)?;
        let get = |name: &str| metric(&text, name).with_context(|| format!("kube-proxy's {name}"));
        Ok(get("kubeproxy_sync_proxy_rules_endpoint_changes_total")? >= changes
            && get("kubeproxy_sync_proxy_rules_endpoint_changes_pending")? == 0.0
            && get("kubeproxy_sync_proxy_rules_last_timestamp_seconds")?
                >= get("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds")?)
    }

    /// Whether its IPv4 rules were written after it took its Node's zone: its first sync waits for Services
    /// and EndpointSlices, not for the Node, whose labels reach it later (`OnTopologyChange`, which queues a
    /// sync). For a Node without a zone label the line may never come (v1.34.4 starts from no labels and
    /// calls no handler for none): ask only about a Node with a zone. Needs `verbosity` 4: the time of its last "Updated proxier
    /// node topology labels" line for IPv4, against its IPv4 `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
    pub fn synced_topology(&self, ns: &NetNs) -> anyhow::Result<bool> {
        let log = self.log_text();
        let Some(line) = log
            .lines()
            .rfind(|l| l.contains("Updated proxier node topology labels") && l.contains("\"IPv4\""))
        else {
            return Ok(false);
        };
        let took = klog_seconds_of_day(line).with_context(|| format!("a klog time in {line}"))?;
        let text = self.metrics_text(ns)?;
        let synced = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} ")
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        Ok(later_in_day(synced.rem_euclid(86_400.0), took))
    }

    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total`: the EndpointSlice changes it has seen.
    pub fn endpoint_changes(&self, ns: &NetNs) -> anyhow::Result<f64> {
        metric(&self.metrics_text(ns)?, "kubeproxy_sync_proxy_rules_endpoint_changes_total")
            .context("no kubeproxy_sync_proxy_rules_endpoint_changes_total")
    }

    /// When it last wrote its rules (`kubeproxy_sync_proxy_rules_last_timestamp_seconds`, the latest of its IP
    /// families, Unix seconds; 0 before the first time).
    pub fn last_sync(&self, ns: &NetNs) -> anyhow::Result<f64> {
        let metrics = self.metrics_text(ns)?;
        metric(&metrics, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
            .context("no kubeproxy_sync_proxy_rules_last_timestamp_seconds")
    }

    /// The rules it wrote, as the namespace holds them: `iptables-save` (IPv4) or `nft list table ip
    /// kube-proxy`.
    pub fn rules(&self) -> anyhow::Result<String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns_name]);
        match self.mode {
            Mode::Iptables => cmd.arg("iptables-save"),
            Mode::Nftables => cmd.args(["nft", "list", "table", "ip", "kube-proxy"]),
        };
        output(&mut cmd)
    }

    /// Stop it (SIGTERM, then SIGKILL after `timeout`), and the programs it was running (an `iptables-restore`
    /// of a large rule set runs on for minutes after kube-proxy has gone).
    pub fn stop(&mut self, timeout: Duration) {
        let children = descendants(self.child.pid());
        self.child.stop(timeout);
        for pid in children {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// The seconds since midnight of a klog line's header (`I1206 14:55:01.123456 ...`).
fn klog_seconds_of_day(line: &str) -> Option<f64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// Whether `a` (seconds since midnight) comes after `b`, across midnight too (within half a day).
fn later_in_day(a: f64, b: f64) -> bool {
    let d = (a - b).rem_euclid(86_400.0);
    d > 0.0 && d < 43_200.0
}

/// The processes below `pid` (children first, then theirs), as /proc lists them now.
fn descendants(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid.cast_signed()];
    while let Some(p) = todo.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten();
        for task in tasks {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

/// The largest value of a metric in Prometheus' text format, over its label sets (kube-proxy labels most of
/// its own by `ip_family`).
#[must_use]
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse::<f64>().ok()
        })
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chunked_body_is_joined_and_a_metric_read_over_its_labels() {
        assert_eq!(super::unchunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), "hello world");
        let text = "# HELP x\nx_total{a=\"b\"} 3\nx 1.5e+09\nxy 2\n";
        assert_eq!(super::metric(text, "x"), Some(1.5e9));
        assert_eq!(super::metric(text, "y"), None);
        let labelled = "k{ip_family=\"IPv4\"} 1.7e+09\nk{ip_family=\"IPv6\"} 0\n";
        assert_eq!(super::metric(labelled, "k"), Some(1.7e9));
    }

    #[test]
    fn a_klog_time_is_read_and_compared_across_midnight() {
        let line = "I1206 14:55:01.250000   42 proxier.go:631] \"Updated proxier node topology labels\"";
        assert_eq!(super::klog_seconds_of_day(line), Some(14.0 * 3600.0 + 55.0 * 60.0 + 1.25));
        assert_eq!(super::klog_seconds_of_day("no header"), None);
        assert!(super::later_in_day(10.0, 9.5));
        assert!(!super::later_in_day(9.5, 10.0));
        assert!(!super::later_in_day(10.0, 10.0));
        assert!(super::later_in_day(0.5, 86_399.0), "a sync just after midnight");
    }
}
