//! The demo on the cluster in a box: kube-apiserver, etcd and the EndpointSlice controller built from
//! Kubernetes' own code (v1.36.3), six simulated nodes in network namespaces of their own, and the story's
//! objects in namespace `booking`. Three nodes (`kp-node-*`, zone `zone-kp`) are proxied by real kube-proxy
//! in iptables mode, three (`tl-node-*`, zone `zone-tl`) by tierlb's agent as the DaemonSet runs it; each half
//! is its own zone only so that PreferSameNode's fallback (the node, then its zone) stays in its half, as the
//! story's three unlabelled nodes fall back to the whole cluster. The `nginx-cache` DaemonSet's pods are
//! processes in their nodes' pod namespaces with Pod objects kept as a kubelet would (Running, Ready,
//! deleted with a grace period, gone); the controller writes the slices and their hints; each node's booking
//! client is a pod sending a request every 50 ms, each with a 5 s timeout, whether earlier ones answered or
//! not (users do not wait for each other).
//!
//! 1. `internalTrafficPolicy: Local` (with `trafficDistribution: PreferSameNode`, the dead line `tierlb lint`
//!    names first): the DaemonSet rolls, one node of each half at a time; measured on both halves.
//! 2. The story's fix with its exact commands (`kubectl patch`, then the `jsonpath` check), the same roll.
//! 3. PDF resume: two replicas on three nodes in each half, clients 50/30/20, against the simulator.
//! 4. The monitoring the story recommends: endpoints against endpoints with node hints (`kubectl | jq`),
//!    tierlb's topology metric, and a controller downgrade that strips the hints (simulated, and said so).
mod acts;
mod monitor;

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_testkit::{
    differential::DiffLab,
    kube_proxy::Mode,
    probe::Report,
    story::{HINTS, PATCH},
};

use super::timeline;

/// The nodes kube-proxy proxies, and their zone.
const KP: [&str; 3] = ["kp-node-1", "kp-node-2", "kp-node-3"];
const KP_ZONE: &str = "zone-kp";
/// The nodes tierlb proxies, and their zone.
const TL: [&str; 3] = ["tl-node-1", "tl-node-2", "tl-node-3"];
const TL_ZONE: &str = "zone-tl";
/// The story's namespace.
const NS: &str = "booking";
/// The `nginx-cache` Service's ClusterIP, as in examples/story.
const CACHE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
/// The `pdf-resume` Service's ClusterIP.
const PDF_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
/// A booking client's request timeout.
const TIMEOUT: Duration = Duration::from_secs(5);
/// A booking client sends a request this often.
const INTERVAL: Duration = Duration::from_millis(50);

/// How long the demo's steps last.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Each step of a node's roll (terminating, replaced but not ready, ready).
    pub step: Duration,
    /// Requests per node in the PDF-resume act (split 50/30/20 over a half's nodes).
    pub pdf_requests: usize,
}

impl Pace {
    /// The demo as a person watches it: steps of 2 s (kube-proxy writes its rules at most once a second).
    pub const FULL: Self = Self { step: Duration::from_secs(2), pdf_requests: 1000 };
    /// The test's: shorter steps and fewer requests, the same claims.
    pub const QUICK: Self = Self { step: Duration::from_millis(1500), pdf_requests: 400 };
}

/// The demo's clock, for its narration.
struct Elapsed(Instant);

impl Elapsed {
    fn say(&self, what: &str) {
        println!("   t={:>5.1} s  {what}", self.0.elapsed().as_secs_f64());
    }
}

/// Every node, kube-proxy's half first.
fn nodes() -> impl Iterator<Item = &'static str> {
    KP.into_iter().chain(TL)
}

/// Which proxy runs on `node`.
fn proxy_of(node: &str) -> &'static str {
    if KP.contains(&node) { "kube-proxy" } else { "tierlb" }
}

/// The lab's cache pod of `generation` on `node`.
fn cache_pod(node: &str, generation: u8) -> String {
    format!("nginx-cache-{node}-g{generation}")
}

/// The `nginx-cache` Service before the fix: the story's Local policy, with PreferSameNode beside it.
const CACHE_BEFORE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: nginx-cache, namespace: booking}\n\
spec:\n  clusterIP: 10.96.0.20\n  selector: {app: nginx-cache}\n  internalTrafficPolicy: Local\n  \
trafficDistribution: PreferSameNode\n  ports: [{name: http, port: 80, targetPort: http}]\n";

/// A command line as a shell user types it: arguments with spaces, quotes or braces in single quotes.
fn shell_line(program: &str, args: &[&str]) -> String {
    let quote = |a: &&str| {
        if a.chars().any(|c| " \"{}$\\|'".contains(c)) { format!("'{a}'") } else { (*a).to_owned() }
    };
    std::iter::once(program.to_owned()).chain(args.iter().map(quote)).collect::<Vec<_>>().join(" ")
}

/// The demo's lab and state.
pub(super) struct Demo {
    lab: DiffLab,
    lab_bin: PathBuf,
    tierlb: PathBuf,
    clock: Elapsed,
    pace: Pace,
    /// Per node, its cache pod now: name, generation, addresses.
    cache: BTreeMap<&'static str, (String, u8, [IpAddr; 2])>,
}

impl Demo {
    /// The cluster in a box with the story's objects, kube-proxy on one half and tierlb on the other.
    fn start(tierlb: &Path, lab_bin: &Path, pace: Pace) -> anyhow::Result<Self> {
        let clock = Elapsed(Instant::now());
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let layout: Vec<(&str, Option<&str>)> =
            KP.iter().map(|n| (*n, Some(KP_ZONE))).chain(TL.iter().map(|n| (*n, Some(TL_ZONE)))).collect();
        let lab = DiffLab::new("demo", tierlb, lab_bin, &deploy, &layout)?;
        clock.say(
            "control plane up: etcd, kube-apiserver and the EndpointSlice controller (v1.36.3, built here)",
        );
        lab.cp.add_namespace(NS)?;
        // The story's operator reads Services and EndpointSlices in booking, nothing else.
        lab.cp.apply(lb_testkit::story::OPERATOR_READ)?;
        let mut demo = Self {
            lab,
            lab_bin: lab_bin.to_owned(),
            tierlb: tierlb.to_owned(),
            clock,
            pace,
            cache: BTreeMap::new(),
        };
        demo.lab.cp.apply(CACHE_BEFORE)?;
        for node in nodes() {
            let name = cache_pod(node, 0);
            let ips = demo.lab.add_pod(NS, &name, node, &[("app", "nginx-cache")], true)?;
            demo.cache.insert(node, (name, 0, ips));
        }
        demo.wait_slices("nginx-cache", 6, false)?;
        for node in KP {
            demo.lab.start_proxy(node, Mode::Iptables)?;
        }
        demo.clock.say("kube-proxy v1.36.3 (iptables mode) running on kp-node-1..3");
        for node in TL {
            demo.lab.start_agent(node, &[])?;
        }
        demo.clock.say("tierlb's agent (as the DaemonSet runs it, --kube) running on tl-node-1..3");
        Ok(demo)
    }

    /// Wait until `service`'s slices hold `ready` ready endpoints (with a `forNodes` hint each if `hinted`).
    fn wait_slices(&self, service: &str, ready: usize, hinted: bool) -> anyhow::Result<()> {
        let what =
            format!("{ready} ready endpoints of {service}{}", if hinted { " with node hints" } else { "" });
        self.lab.cp.wait_for(Duration::from_secs(30), &what, |cp| {
            let slices = cp.slices(NS, service)?;
            let eps: Vec<&serde_json::Value> = slices["items"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
                .filter(|e| e["conditions"]["ready"] == true)
                .collect();
            Ok(eps.len() == ready && (!hinted || eps.iter().all(|e| e["hints"]["forNodes"].is_array())))
        })?;
        Ok(())
    }

    /// Run `kubectl ARGS` as `user` (`admin` for a change, `operator` for a read) and print it with its output
    /// as a terminal would show it.
    fn kubectl_shown(&self, user: &str, args: &[&str]) -> anyhow::Result<String> {
        println!("   $ {}", shell_line("kubectl", args));
        let out = self.lab.cp.kubectl_as(user, args)?;
        for line in out.lines() {
            println!("     {line}");
        }
        Ok(out)
    }

    /// The booking clients: on every node a pod sending `count` requests to `target`, one every
    /// `INTERVAL`, each with `TIMEOUT`, through the node's proxy.
    fn start_clients(&self, target: SocketAddr, count: usize) -> anyhow::Result<Vec<std::process::Child>> {
        nodes()
            .map(|node| {
                let mut cmd = self.lab.pod_client(node, &self.lab_bin)?;
                cmd.args(["probe", "--open", "--target", &target.to_string(), "--count", &count.to_string()])
                    .args(["--interval-ms", &INTERVAL.as_millis().to_string()])
                    .args(["--timeout-ms", &TIMEOUT.as_millis().to_string()])
                    .stdout(Stdio::piped());
                cmd.spawn().with_context(|| format!("booking client on {node}"))
            })
            .collect()
    }

    /// The reports of `clients` (in `nodes()` order), once all have finished.
    fn reports(clients: Vec<std::process::Child>) -> anyhow::Result<Vec<Report>> {
        clients
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output()?;
                anyhow::ensure!(out.status.success(), "a booking client failed: {}", out.status);
                serde_json::from_slice(&out.stdout).context("a booking client's report")
            })
            .collect()
    }

    /// One roll of the DaemonSet while the booking clients run: one node of each half at a time, each pod
    /// deleted (terminating, still serving), its container stopping (not ready: no longer serving), gone and
    /// replaced (not ready), then ready, a step each. The old server stops only a step after its endpoint
    /// stopped serving, as a pod with a preStop pause does, so that no proxy's lag sends a request to a
    /// process already gone: what the clients meet is the node without a serving local endpoint. Returns
    /// the clients' reports and each node's roll window (seconds from the clients' start).
    fn roll(&mut self) -> anyhow::Result<(Vec<Report>, Vec<Vec<timeline::Window>>)> {
        let step = self.pace.step;
        let lead = Duration::from_secs(1);
        // Twelve steps and the API calls between them (a few hundred ms a step), then room for the last
        // requests' timeouts: the clients run past the roll's end.
        let total = lead + (step + Duration::from_millis(400)) * 12 + Duration::from_secs(2);
        let count = usize::try_from(total.as_millis() / INTERVAL.as_millis())?;
        let vip = SocketAddr::new(IpAddr::V4(CACHE_VIP), 80);
        let clients = self.start_clients(vip, count)?;
        let t0 = Instant::now();
        std::thread::sleep(lead);
        let mut windows: BTreeMap<&str, Vec<timeline::Window>> = BTreeMap::new();
        for pair in KP.into_iter().zip(TL) {
            let pair = [pair.0, pair.1];
            let from = t0.elapsed().as_secs_f64();
            let olds: Vec<String> = pair.iter().map(|n| self.cache[n].0.clone()).collect();
            for old in &olds {
                self.lab.cp.delete_pod_gracefully(NS, old, 30)?;
            }
            self.clock.say(&format!("{}: terminating (still serving)", olds.join(", ")));
            std::thread::sleep(step);
            for node in pair {
                let (name, _, ips) = &self.cache[node];
                self.lab.cp.pod_status_ips(NS, name, ips, false)?;
            }
            self.clock.say("their containers stopping: not ready, so no longer serving");
            std::thread::sleep(step);
            let mut news = Vec::new();
            for (node, old) in pair.iter().zip(&olds) {
                self.lab.stop_pod(old)?;
                self.lab.cp.pod_gone(NS, old)?;
                let generation = self.cache[node].1 + 1;
                let name = cache_pod(node, generation);
                let ips = self.lab.add_pod(NS, &name, node, &[("app", "nginx-cache")], false)?;
                self.cache.insert(node, (name.clone(), generation, ips));
                news.push(name);
            }
            self.clock.say(&format!("gone; {} created, not ready yet", news.join(", ")));
            std::thread::sleep(step);
            for node in pair {
                let (name, _, ips) = &self.cache[node];
                self.lab.cp.pod_status_ips(NS, name, ips, true)?;
            }
            self.clock.say(&format!("{} ready", news.join(", ")));
            let to = t0.elapsed().as_secs_f64();
            for node in pair {
                windows.entry(node).or_default().push(timeline::Window { from, to, label: "rolling".into() });
            }
            std::thread::sleep(step);
        }
        let reports = Self::reports(clients)?;
        Ok((reports, nodes().map(|n| windows.remove(n).unwrap_or_default()).collect()))
    }

    /// `tierlb ARGS` as the story's operator (read-only), printed as typed with its output; its exit code.
    fn tierlb_shown(&self, args: &[&str]) -> anyhow::Result<(i32, String)> {
        println!("   $ {}", shell_line("tierlb", args));
        let mut cmd = std::process::Command::new(&self.tierlb);
        cmd.args(args).env("KUBECONFIG", self.lab.cp.kubeconfig("operator")).env("NO_COLOR", "1");
        lb_testkit::sandbox::confine(&mut cmd, None, Some(&self.lab.cp.netns))?;
        let out = cmd.output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        for line in text.lines().chain(String::from_utf8_lossy(&out.stderr).lines()) {
            println!("     {line}");
        }
        Ok((out.status.code().unwrap_or(-1), text))
    }
}

/// Whether `backend` (a pod's name) runs on `node`.
fn own(node: &str, backend: &str) -> bool {
    backend.ends_with(&format!("-{node}")) || backend.contains(&format!("-{node}-"))
}

/// A verdict as the demo prints it.
fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

/// Run the demo on the cluster in a box with the `tierlb` binary and the lab's (`tierlb-lab`), at `pace`;
/// writes `demo-timeline.svg` and its data into `out_dir`. `Ok(true)` if every verdict passed.
pub fn run(tierlb: &Path, lab_bin: &Path, out_dir: &Path, pace: Pace) -> anyhow::Result<bool> {
    println!(
        "== tierlb demo: the booking form incident on a real control plane, real kube-proxy beside tierlb, in private \
         network namespaces"
    );
    let mut demo = Demo::start(tierlb, lab_bin, pace)?;
    let mut chart = Vec::new();
    let linted = monitor::lint_dead_line(&demo)?;
    let local = acts::local_roll(&mut demo, &mut chart)?;
    let fixed = acts::the_fix(&mut demo, &mut chart)?;
    let pdf = acts::pdf_resume(&mut demo)?;
    let watched = monitor::downgrade(&mut demo)?;
    let ok = linted && local && fixed && pdf && watched;
    std::fs::create_dir_all(out_dir)?;
    let svg = out_dir.join("demo-timeline.svg");
    std::fs::write(&svg, timeline::timeline_chart(&chart)?)?;
    std::fs::write(out_dir.join("demo-timeline.json"), serde_json::to_string(&chart)? + "\n")?;
    let took = demo.clock.0.elapsed().as_secs_f64();
    drop(demo);
    println!("\n{} demo finished in {took:.0} s; chart: {}", pass(ok), svg.display());
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_shown_as_typed() {
        assert_eq!(
            shell_line("kubectl", &PATCH),
            r#"kubectl patch svc nginx-cache -n booking --type=merge -p '{"spec":{"internalTrafficPolicy":"Cluster","trafficDistribution":"PreferSameNode"}}'"#
        );
        assert_eq!(shell_line("tierlb", &["lint", "--kube"]), "tierlb lint --kube");
    }

    #[test]
    fn a_pod_is_its_nodes_own() {
        assert!(own("kp-node-1", "nginx-cache-kp-node-1-g0"));
        assert!(own("tl-node-3", "pdf-resume-tl-node-3"));
        assert!(!own("kp-node-1", "nginx-cache-kp-node-2-g0"));
        assert!(!own("kp-node-1", "nginx-cache-tl-node-1-g0"));
    }
}
