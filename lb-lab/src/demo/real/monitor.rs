//! The monitoring the story recommends, on the cluster in a box: `tierlb lint` and tierlb's topology metric
//! naming the dead line before the roll, and after the fix the check of endpoints against endpoints with
//! node hints (`kubectl ... | jq`) through a controller downgrade that strips the hints.
use std::{io::Write as _, net::SocketAddr, process::Stdio, time::Duration};

use anyhow::Context as _;
use lb_testkit::{kube_proxy::http_get, probe::Report};

use super::{Demo, NS, TL, pass};

/// The check: how many endpoints `nginx-cache` has, and how many of them carry a `forNodes` hint
/// (kube-proxy uses node hints only when every ready endpoint has one).
const SLICES: [&str; 8] =
    ["get", "endpointslices", "-n", "booking", "-l", "kubernetes.io/service-name=nginx-cache", "-o", "json"];
const JQ: &str = r#"[.items[].endpoints[]] | "\(length) endpoints, \(map(select(.hints.forNodes)) | length) with node hints""#;

/// `tierlb_service_topology`'s line for `booking/nginx-cache` on tierlb's `node`.
fn topology_line(demo: &Demo, node: &str) -> anyhow::Result<String> {
    let boxed = &demo.lab.node(node)?.boxed;
    // Where the DaemonSet's arguments bind the agent's metrics (loopback, inside the node).
    let metrics: SocketAddr = boxed
        .container
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-addr=")?.parse().ok())
        .context("the DaemonSet sets no --metrics-addr")?;
    let (code, text) = http_get(&boxed.node.netns, metrics, "/metrics")?;
    anyhow::ensure!(code == 200, "{node}'s /metrics answered {code}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("tierlb_service_topology{") && l.contains(r#"service="booking/nginx-cache""#)
        })
        .collect();
    anyhow::ensure!(!lines.is_empty(), "no tierlb_service_topology line for booking/nginx-cache on {node}");
    Ok(lines.join(" | "))
}

/// Before act 1: what the story's operator, with read-only access, is told about the Service.
pub(super) fn lint_dead_line(demo: &Demo) -> anyhow::Result<bool> {
    println!("\n-- 0. What the story's operator (read-only access) is told before the roll");
    let (code, out) = demo.tierlb_shown(&["lint", "--kube", "--namespace", NS])?;
    let linted = code == 1 && out.contains("dead-local-line");
    let mut metric = true;
    for node in TL {
        let line = topology_line(demo, node)?;
        println!("   {node} /metrics: {line}");
        metric &= line.contains(r#"reason="local_policy_overrides_distribution""#);
    }
    let ok = linted && metric;
    println!(
        "   verdict: {} - lint (exit 1) and the topology metric name the dead line before it costs a request",
        pass(ok)
    );
    Ok(ok)
}

/// The story's check, printed as typed with its answer.
fn endpoints_with_node_hints(demo: &Demo) -> anyhow::Result<String> {
    println!("   $ {} | jq -r '{JQ}'", super::shell_line("kubectl", &SLICES));
    let json = demo.lab.cp.kubectl_as("operator", &SLICES)?;
    let mut jq = std::process::Command::new("jq")
        .args(["-r", JQ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("jq (cargo xtask setup installs it)")?;
    jq.stdin.take().context("jq's stdin")?.write_all(json.as_bytes())?;
    let out = jq.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "jq failed: {}", String::from_utf8_lossy(&out.stderr));
    let answer = String::from_utf8(out.stdout)?.trim().to_owned();
    println!("     {answer}");
    Ok(answer)
}

/// Act 4: the check after the fix, a downgrade that strips the hints, and the check and the metric catching
/// it; the controller back, the hints back.
pub(super) fn downgrade(demo: &mut Demo) -> anyhow::Result<bool> {
    println!(
        "\n-- 4. Monitoring: endpoints against endpoints with node hints, through a downgrade that strips them"
    );
    let before = endpoints_with_node_hints(demo)?;
    demo.clock.say(
        "SIMULATED downgrade: the EndpointSlice controller is stopped and its slices' hints removed, as a \
         controller that does not know PreferSameNode writes them",
    );
    demo.lab.cp.stop_controller_manager();
    // kube-proxy's EndpointSlice changes before the patches: its probe below must meet rules written after them.
    let kp = super::KP[1];
    let kp_changes = demo.lab.proxy(kp)?.endpoint_changes(&demo.lab.node(kp)?.boxed.node.netns)?;
    let mut patched = 0.0;
    let slices = demo.lab.cp.slices(NS, "nginx-cache")?;
    for slice in slices["items"].as_array().into_iter().flatten() {
        let name = slice["metadata"]["name"].as_str().context("a slice's name")?;
        let count = slice["endpoints"].as_array().map_or(0, Vec::len);
        let ops: Vec<String> =
            (0..count).map(|i| format!(r#"{{"op":"remove","path":"/endpoints/{i}/hints"}}"#)).collect();
        demo.lab.cp.kubectl(&[
            "patch",
            "endpointslice",
            name,
            "-n",
            NS,
            "--type=json",
            "-p",
            &format!("[{}]", ops.join(",")),
        ])?;
        patched += 1.0;
    }
    let after = endpoints_with_node_hints(demo)?;
    // tierlb reads the change from its watch: its metric says the hints it now uses are its own.
    let mut lines = Vec::new();
    let waited =
        demo.lab.cp.wait_for(Duration::from_secs(10), "tierlb's topology metric after the downgrade", |_| {
            lines = TL.iter().map(|n| topology_line(demo, n)).collect::<Result<Vec<_>, _>>()?;
            Ok(lines.iter().all(|l| l.contains(r#"reason="hints_emulated""#)))
        });
    if let Err(e) = waited {
        let log = std::fs::read_to_string(&demo.lab.node(TL[0])?.boxed.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        anyhow::bail!("{e:#}; the metric says: {lines:#?}; {}'s agent log ends: {tail:#?}", TL[0]);
    }
    for (node, line) in TL.iter().zip(&lines) {
        println!("   {node} /metrics: {line}");
    }
    // And kube-proxy has written its rules from the stripped slices (its own metrics say so).
    demo.lab.cp.wait_for(Duration::from_secs(30), "kube-proxy's rules after the downgrade", |_| {
        demo.lab.proxy(kp)?.synced_past(&demo.lab.node(kp)?.boxed.node.netns, kp_changes + patched)
    })?;
    // What each proxy does with hint-less slices: kube-proxy uses every endpoint in the cluster; tierlb the
    // hints the controller would have written (node, then zone), as before the downgrade.
    let mut kp_spread = false;
    let mut tl_local = false;
    for node in [super::KP[1], TL[1]] {
        let mut cmd = demo.lab.pod_client(node, &demo.lab_bin)?;
        cmd.args(["probe", "--target", "10.96.0.20:80", "--count", "60", "--timeout-ms", "2000"]);
        let r: Report = serde_json::from_slice(&cmd.output()?.stdout).context("a client's report")?;
        let off =
            r.attempts.iter().filter(|a| a.backend.as_deref().is_some_and(|b| !super::own(node, b))).count();
        let pods = r.by_backend().len();
        println!(
            "   {node} ({}): {} requests, {off} answered by another node's pod, from {pods} pods",
            super::proxy_of(node),
            r.attempts.len(),
        );
        if super::KP.contains(&node) {
            kp_spread = r.failures() == 0 && off > 0 && pods > 3;
        } else {
            tl_local = r.failures() == 0 && off == 0;
        }
    }
    demo.lab.cp.start_controller_manager()?;
    demo.wait_slices("nginx-cache", 6, true)?;
    demo.clock.say("the controller is back: it wrote the hints again");
    let restored = endpoints_with_node_hints(demo)?;
    let ok = before == "6 endpoints, 6 with node hints"
        && after == "6 endpoints, 0 with node hints"
        && restored == before
        && kp_spread
        && tl_local;
    println!(
        "   verdict: {} - the check and tierlb's metric (reason hints_emulated) catch the stripped hints at once; \
         kube-proxy spread node-2's traffic over the cluster, tierlb kept it on the node with the hints the \
         controller would write, until the controller wrote them again",
        pass(ok)
    );
    Ok(ok)
}
