//! The study's tierlb model against the kernel, with the agent's default passive-health flags (K = 3, the
//! quorum `--health-clients=2`, a first hold of 5 s doubling up to 2 m). The agent runs as `deploy/` runs it
//! (`lb_testkit::deployed::BoxedNode`: client pods in network namespaces of their own behind veths), in front
//! of a PreferSameNode Service with web-1 on the agent's node and web-2 on another; node-1's clients send a
//! request every 2/3 s (open-loop: a request that hangs does not hold back the next), from one pod or from two
//! taking turns. Then web-1 crashes, unseen by the EndpointSlice: its process killed (connects refused) or its
//! SYNs dropped (connects hang; the kernel counts each at its SYN's first retransmission timeout, 1 s).
//! `tierlb study` runs the same scenario (tests/study/fixtures/kernel.yaml, with the node's client pods set
//! per case) through its library, and each 14 s phase is compared with it:
//!
//! - the connects lost before the hold: with refused connects, exactly the model's (K: each is refused at once
//!   and counted before the next is sent, so the kernel's count is whole and so is the model's); with
//!   unanswered SYNs, within one of the model's (the model spreads the connects sent during the K-th one's 1 s
//!   timeout evenly, 1.5 of them; the kernel's are whole: 1, the next comes 1/3 s after the timeout);
//! - the hold's place in the order: every connect before it failed, every one after it goes to web-2 but the
//!   trials' (and, with two pods, the other pod's that completes the quorum again);
//! - the failed trials (the failures after the hold, grouped by the holds between them: a hold is 5 s or more,
//!   a trial's failures come within 2.5 s) and the connects lost after the hold, with the same tolerances
//!   (with two pods and unanswered SYNs the model's 2.75: the trial, the other pod's connect and 0.75 of its
//!   connects sent during that one's timeout, which in the kernel come 1/3 s after it: 2);
//! - the holds the kernel began (`status`'s `holds`): exactly the model's.
//!
//! The rate leaves 1/3 s between the SYN timeout that ends a window and the connects on either side of it (a
//! request every 2/3 s, one pod's every 4/3 s), so that a request sent late by a loaded machine changes no
//! count; the phase's counts do not depend on where in it the holds end (the next trial comes after 16 s).
//!
//! With one client pod, fewer than the quorum, the pod's own K failures hold web-1 for it alone (its next
//! connects skip it: the node still loses K), and each failed trial holds it for the pod again. With two, K
//! failures from both hold it for every client; a failed trial holds it for its pod only, and the other pod's
//! next connect, which still goes to web-1, fails and holds it for all: a trial costs two connects (with
//! unanswered SYNs, that pod's connects during its SYN timeout hang too) and two holds.
mod common;

use std::{
    io::Read as _,
    net::{IpAddr, SocketAddr},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{TIERLB, nft, tierlb};
use lb_testkit::{
    deployed::{AgentBox, BoxedNode},
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::{Child, NamedServer, NetNs, confine},
};
use tierlb::study::{self, Crash, Detection, ProxyModel};

const WEB_1: &str = "10.244.1.41";
const WEB_2: &str = "10.244.2.41";
/// A connect's own timeout: past the SYN's first retransmission timeout (1 s), which is the failure the kernel
/// counts, so no connect is a local abort.
const TIMEOUT_MS: u64 = 1500;
/// Failures after the hold more than this apart belong to different trials (each hold is 5 s or more).
const TRIAL_GAP_S: f64 = 2.5;

fn vip() -> SocketAddr {
    "10.96.0.40:80".parse().unwrap()
}

/// The scenario, with node-1's client pods set.
fn scenario(pods: u32) -> study::Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/study/fixtures/kernel.yaml");
    let mut sc = study::load(&path).unwrap();
    assert_eq!(sc.health, study::HealthParams::default(), "the agent's defaults");
    sc.nodes[0].client_pods = pods;
    sc
}

/// What the model says node-1's kernel does about web-1 in the phase of `crash`, and the phase's length.
fn model(crash: Crash, pods: u32) -> (Detection, f64) {
    let sc = scenario(pods);
    let r = study::run(&sc);
    let p = r
        .phases
        .iter()
        .find(|p| p.models.iter().any(|m| m.detections.iter().any(|d| d.crash == crash)))
        .unwrap_or_else(|| panic!("no phase crashes web-1 with {crash:?}"));
    let m = p.models.iter().find(|m| m.model == ProxyModel::Tierlb).unwrap();
    assert_eq!(m.label, "tierlb (passive health, K=3, 2 clients)");
    let [d] = m.detections.as_slice() else { panic!("node-1 alone sends to web-1: {:?}", m.detections) };
    assert_eq!((d.node.as_str(), d.backend.as_str(), d.client_pods), ("node-1", WEB_1, pods));
    (d.clone(), p.duration_s.unwrap())
}

/// node-1 as deployed, web-1 and web-2 behind the Service, two client pods; the agent with its defaults.
/// Fields drop in order: the agent first, the node last.
struct Node {
    _agent: AgentBox,
    web_1: Option<NamedServer>,
    _web_2: NamedServer,
    clients: [NetNs; 2],
    _pods: Vec<NetNs>,
    boxed: BoxedNode,
}

impl Node {
    fn start(tag: &str) -> Self {
        assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let mut boxed = BoxedNode::new(tag, Path::new(TIERLB), &deploy).unwrap();
        let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
        let (mut servers, mut pods, mut eps) = (Vec::new(), Vec::new(), Vec::new());
        for (ip, node, name) in [(WEB_1, "node-1", "web-1"), (WEB_2, "node-2", "web-2")] {
            let ip: IpAddr = ip.parse().unwrap();
            let ns = boxed.node.add_pod(name, ip).unwrap();
            servers.push(NamedServer::start(&lab, &ns, SocketAddr::new(ip, 8080), name).unwrap());
            pods.push(ns);
            eps.push(Ep::ready(ip, node).zone("a").prefer_same_node());
        }
        let clients = [
            boxed.node.add_pod("client-a", "10.244.9.41".parse().unwrap()).unwrap(),
            boxed.node.add_pod("client-b", "10.244.9.42".parse().unwrap()).unwrap(),
        ];
        let mut svc = Svc::new("web", vip().ip(), 80, 8080);
        svc.traffic_distribution = Some("PreferSameNode".into());
        write_service(boxed.manifests.path(), &svc, &eps).unwrap();
        let agent = boxed.start_agent("node-1", &[]).unwrap();
        let web_2 = servers.pop().unwrap();
        Self { _agent: agent, web_1: servers.pop(), _web_2: web_2, clients, _pods: pods, boxed }
    }

    /// web-1's entry in `status`: (state, reason, holds), and the node's hold transitions (for all, for one).
    fn web_1_health(&self) -> ((String, String, u64), (u64, u64)) {
        let pin = self.boxed.bpffs.path().join("tierlb");
        let (ok, out, err) = tierlb(&["status", "-o", "json", "--bpffs", pin.to_str().unwrap()]);
        assert!(ok, "{err}");
        let st = serde_json::from_str::<serde_json::Value>(&out).unwrap()[0].clone();
        let h = st["health"].as_array().unwrap().iter().find(|h| h["backend"] == format!("{WEB_1}:8080"));
        let h = h.unwrap_or_else(|| panic!("no entry for web-1: {st}"));
        let text = |v: &serde_json::Value| v.as_str().unwrap().to_owned();
        let t = &st["health_transitions"];
        (
            (text(&h["state"]), text(&h["reason"]), h["holds"].as_u64().unwrap()),
            (t["held"].as_u64().unwrap(), t["held_for_one_client"].as_u64().unwrap()),
        )
    }

    /// An open-loop `tierlb-lab probe` from client pod `i`: `count` requests `interval` apart.
    fn probe(&self, i: usize, count: usize, interval: Duration) -> Child {
        let mut cmd = Command::new(lb_testkit::workspace_bin("tierlb-lab", "lb-lab"));
        cmd.args(["probe", "--open", "--target", &vip().to_string(), "--count", &count.to_string()])
            .args([
                "--interval-ms",
                &interval.as_millis().to_string(),
                "--timeout-ms",
                &TIMEOUT_MS.to_string(),
            ])
            .stdout(Stdio::piped())
            .stdin(Stdio::null());
        confine(&mut cmd, Some(&self.boxed.cgroup), Some(&self.clients[i])).unwrap();
        Child::spawn(&mut cmd).unwrap()
    }
}

/// One connect of the phase: seconds from the crash (negative before it), the client pod, the backend that
/// answered or the error.
type Seen = (f64, usize, String);

/// What the kernel did: every connect in the order they were sent, and web-1's health at the end.
struct Measured {
    seen: Vec<Seen>,
    health: ((String, String, u64), (u64, u64)),
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// Run the phase on a boxed node: `pods` clients taking turns at `interval` from the node (started a request
/// apart), web-1 crashing midway between two requests a few requests in, then `phase` seconds of requests.
fn measure(tag: &str, crash: Crash, pods: usize, interval: Duration, phase: f64) -> Measured {
    let mut node = Node::start(tag);
    for i in 0..pods {
        let r = node.boxed.probe(&node.clients[i], &vip().to_string(), 3).unwrap();
        assert_eq!(r.count("web-1"), 3, "the node tier first: {:?}", r.by_backend());
    }
    // 3.5 requests before the crash (midway between two, so that none is in flight when it comes).
    let before = interval.mul_f64(3.5);
    let count = (before + Duration::from_secs_f64(phase)).as_millis().div_ceil(interval.as_millis()) as usize;
    let start = Instant::now();
    let mut runs: Vec<(Instant, Child)> = Vec::new();
    for i in 0..pods {
        sleep_until(start + interval * i as u32);
        runs.push((Instant::now(), node.probe(i, count.div_ceil(pods), interval * pods as u32)));
    }
    sleep_until(start + before);
    let crashed_at = Instant::now();
    match crash {
        Crash::Process => {
            let web_1 = node.web_1.take().unwrap();
            web_1.signal(nix::sys::signal::Signal::SIGKILL);
            drop(web_1);
        }
        Crash::Node => {
            // Every SYN to web-1 dropped on the node's forward path: nothing answers, as a dead node.
            let rule = format!(
                "table inet tierlb_lost {{\n  chain forward {{\n    type filter hook forward priority 0;\n    ip daddr {WEB_1} tcp dport 8080 tcp flags & (syn|ack) == syn drop\n  }}\n}}\n"
            );
            nft(&node.boxed.node.netns, &rule);
        }
        Crash::Running => unreachable!(),
    }
    let mut seen: Vec<Seen> = Vec::new();
    for (i, (spawned, mut child)) in runs.into_iter().enumerate() {
        let mut out = String::new();
        child.inner().stdout.take().unwrap().read_to_string(&mut out).unwrap();
        drop(child);
        let r: Report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("probe {i}: {e}: {out}"));
        let offset = spawned.duration_since(crashed_at.min(spawned)).as_secs_f64()
            - crashed_at.duration_since(spawned.min(crashed_at)).as_secs_f64();
        for a in r.attempts {
            let what = a.backend.or(a.error).unwrap_or_default();
            seen.push((offset + a.t_ms / 1e3, i, what));
        }
    }
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    let health = node.web_1_health();
    Measured { seen, health }
}

/// The kernel's figures of a phase: failed before the hold, where the hold began (seconds from the crash, of
/// the first connect it sent to web-2), failed trials, failed after the hold.
fn figures(seen: &[Seen]) -> (usize, f64, usize, usize) {
    let (before, after): (Vec<&Seen>, Vec<&Seen>) = seen.iter().partition(|s| s.0 < 0.0);
    assert!(before.iter().all(|s| s.2 == "web-1"), "node-1's own pod before the crash: {before:?}");
    let first = after.iter().position(|s| s.2 == "web-2").unwrap_or_else(|| panic!("never held: {after:?}"));
    assert!(
        after[..first].iter().all(|s| s.2 != "web-1"),
        "from the crash, every connect to web-1 fails: {after:?}"
    );
    assert!(
        after[first..].iter().all(|s| s.2 != "web-1"),
        "after the hold, web-2 or a failed connect (a trial's, the quorum's): {after:?}"
    );
    let failed_after: Vec<f64> = after[first..].iter().filter(|s| s.2 != "web-2").map(|s| s.0).collect();
    let trials =
        failed_after.iter().enumerate().filter(|&(k, t)| k == 0 || t - failed_after[k - 1] > TRIAL_GAP_S);
    (first, after[first].0, trials.count(), failed_after.len())
}

/// Run one phase in the kernel and in the model, print both and compare them.
fn compare(tag: &str, crash: Crash, pods: u32) {
    let (model, phase) = model(crash, pods);
    let sc = scenario(pods);
    let interval = Duration::from_secs_f64(1.0 / sc.requests_per_second);
    let m = measure(tag, crash, pods as usize, interval, phase);
    let (before, held_at, trials, after) = figures(&m.seen);
    let ((state, reason, holds), (for_all, for_one)) = m.health.clone();
    eprintln!(
        "{crash:?}, {pods} client pod(s): kernel {before} lost before the hold (first fallback {held_at:.2} s \
         after the crash), {trials} failed trial(s), {after} lost after, {holds} holds ({for_all} for all, \
         {for_one} for one pod), web-1 {state} ({reason}); model {:.2} before (held at {:.2} s), {} failed \
         trial(s), {:.2} after, {} holds",
        model.failed_before_hold,
        model.held_at_s.unwrap_or(f64::NAN),
        model.failed_trials,
        model.failed_after_hold,
        model.holds
    );
    let within = |kernel: usize, fluid: f64| match crash {
        // Refused at once, each counted before the next is sent: whole in both.
        Crash::Process => (kernel as f64 - fluid).abs() < 1e-9,
        // The connects sent during a SYN timeout: whole in the kernel, spread evenly in the model.
        _ => (kernel as f64 - fluid).abs() < 1.0,
    };
    // The connects from the crash, for the messages: seconds, client pod, outcome.
    let seen: Vec<String> = m
        .seen
        .iter()
        .filter(|s| s.0 >= 0.0)
        .map(|s| format!("{:.2} {} {}", s.0, ["A", "B"][s.1], s.2))
        .collect();
    assert!(
        within(before, model.failed_before_hold),
        "lost before the hold: kernel {before}, {model:?}: {seen:#?}"
    );
    assert!(
        within(after, model.failed_after_hold),
        "lost after the hold: kernel {after}, {model:?}: {seen:#?}"
    );
    assert_eq!(trials, model.failed_trials as usize, "failed trials: {seen:#?}");
    assert_eq!(holds, u64::from(model.holds), "the kernel's holds: {:?}", m.health);
    assert_eq!(for_all + for_one, holds, "{:?}", m.health);
    let want_reason = if crash == Crash::Process { "refused" } else { "timeout" };
    // One pod, fewer than the quorum: its own holds only; two: the last hold is for every client.
    let want_state = if pods == 1 { "held-for-one-client" } else { "held" };
    assert_eq!((state.as_str(), reason.as_str()), (want_state, want_reason), "{:?}", m.health);
    assert_eq!(for_all == 0, pods == 1, "held for all only with two pods: {:?}", m.health);
}

#[test]
fn a_killed_process_with_one_client_pod_costs_what_the_study_says() {
    compare("sk-proc-1", Crash::Process, 1);
}

#[test]
fn a_killed_process_with_two_client_pods_costs_what_the_study_says() {
    compare("sk-proc-2", Crash::Process, 2);
}

#[test]
fn a_lost_node_with_one_client_pod_costs_what_the_study_says() {
    compare("sk-node-1", Crash::Node, 1);
}

#[test]
fn a_lost_node_with_two_client_pods_costs_what_the_study_says() {
    compare("sk-node-2", Crash::Node, 2);
}
