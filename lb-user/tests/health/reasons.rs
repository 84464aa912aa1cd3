//! Under the shipped defaults (`--health-clients=2`, K = 3), the reasons a failure is counted for as the
//! kernel reports them, and the trial rule with the quorum. Two pods behind veths and the agent as `deploy/`
//! runs it (`Tenants`).
use std::{net::SocketAddrV4, time::Duration};

use lb_testkit::router::{Answer, HOST_UNREACHABLE, LateRouter};

use super::{Tenants, WEB_1, outcomes, vip};
use crate::common::nft;

const POD_A: &str = "10.244.9.41";

/// The node's device its route to `ip` leaves by (the veth of that pod).
fn device_to(t: &Tenants, ip: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", t.boxed.node.netns.name(), "-o", "route", "get", ip])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.by_ref().find(|w| *w == "dev");
    words.next().unwrap_or_else(|| panic!("no device in {text:?}")).to_owned()
}

/// Drop pod A's SYNs to web-1 on the node (a NetworkPolicy's doing, or a path that ends there).
fn drop_a_syns(t: &Tenants, verdict: &str) {
    let rule = format!(
        "table inet tierlb_policy {{\n  chain forward_policy {{\n    type filter hook forward priority 0;\n    ip saddr {POD_A} ip daddr {WEB_1} tcp flags & (syn|ack) == syn {verdict}\n  }}\n}}\n"
    );
    nft(&t.boxed.node.netns, &rule);
}

fn web_1_entry(t: &Tenants) -> serde_json::Value {
    let st = t.status();
    st["health"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["backend"] == format!("{WEB_1}:8080")).cloned())
        .unwrap_or_else(|| panic!("no health entry for web-1: {st}"))
}

/// A router on the way answers each of pod A's SYNs to web-1 with an ICMP host unreachable 100 ms after it
/// (the node drops the SYN itself): each connect ends `EHOSTUNREACH` before its SYN's retransmission timeout,
/// the kernel counts it as `unreachable`, and the third holds web-1 for A, whose next connects go to web-2.
#[test]
fn a_routers_host_unreachable_is_counted_unreachable_and_k_of_them_hold_the_backend_for_that_pod() {
    let t = Tenants::start("health-unreach", &["--health-hold=1m"]);
    let target = vip().to_string();
    assert_eq!(t.boxed.probe(&t.a, &target, 3).unwrap().count("web-1"), 3);
    drop_a_syns(&t, "drop");
    let answer = Answer {
        client: POD_A.parse().unwrap(),
        to: SocketAddrV4::new(WEB_1.parse().unwrap(), 8080),
        error: HOST_UNREACHABLE,
        from: "192.0.2.254".parse().unwrap(),
        delay: Duration::from_millis(100),
    };
    let router = LateRouter::start(&t.boxed.node.netns, &device_to(&t, POD_A), answer).unwrap();
    let seq = t.abort(&t.a, &["--count", "3", "--end", "wait", "--wait-ms", "900"]);
    assert_eq!(seq, vec!["EHOSTUNREACH"; 3], "the router's answer ends each connect");
    assert_eq!(router.answered(), 3);
    let e = web_1_entry(&t);
    assert_eq!(
        (e["state"].as_str(), e["reason"].as_str(), e["failures"].as_u64()),
        (Some("held-for-one-client"), Some("unreachable"), Some(3)),
        "{e}"
    );
    let next = outcomes(&t.boxed.probe(&t.a, &target, 5).unwrap());
    assert_eq!(next, vec!["web-2"; 5], "A skips web-1 at once");
}

/// The node's own nft `reject with icmp type host-unreachable` answers the SYN within the `connect()` call
/// that sends it (veth to veth, one softirq pass), while that call still holds the socket (the kernel counts
/// it in `TcpExtLockDroppedIcmps`): measured on 6.18, the connect ends `EHOSTUNREACH` at once and `sock_ops`
/// counts nothing (not even as the client's own abort: a rule that counted every connect ended with its SYN
/// still queued left this test passing). The error comes from the client's own node (its NetworkPolicy's
/// reject), so the tenant rule loses nothing by it.
#[test]
fn the_nodes_own_reject_ends_the_connect_at_once_and_counts_nothing() {
    let t = Tenants::start("health-reject", &["--health-hold=1m"]);
    let target = vip().to_string();
    assert_eq!(t.boxed.probe(&t.a, &target, 3).unwrap().count("web-1"), 3);
    drop_a_syns(&t, "reject with icmp type host-unreachable");
    let r = t.boxed.probe(&t.a, &target, 3).unwrap();
    assert_eq!(outcomes(&r), vec!["EHOSTUNREACH"; 3], "a blocking connect() returns the error");
    let st = t.status();
    assert_eq!(st["health"], serde_json::json!([]), "nothing counted: {st}");
}

/// `IP_TTL=1` as measured: the SYN dies at the node's forward, whose ICMP time exceeded comes back within
/// `connect()`, as the reject above: the connect ends `EHOSTUNREACH` and nothing is counted. (Once the node
/// rate-limits its ICMP errors the SYN goes unanswered instead, and its retransmission timeout counts a
/// `timeout` for that pod alone, which one pod's failures never turn into a hold for another:
/// `one_pods_own_connect_failures_never_hold_a_healthy_backend_for_another_pod`.)
#[test]
fn ip_ttl_1_ends_the_connect_with_the_nodes_time_exceeded_and_counts_nothing() {
    let t = Tenants::start("health-ttl", &["--health-hold=1m"]);
    let seq = t.abort(&t.a, &["--count", "1", "--ttl", "1", "--end", "wait", "--wait-ms", "2500"]);
    assert_eq!(seq, ["EHOSTUNREACH"]);
    let st = t.status();
    assert_eq!(st["health"], serde_json::json!([]), "nothing counted: {st}");
}

/// The trial rule with the quorum: web-1's process dies; A, B, A are refused and hold it for every client.
/// After the hold, A's connect is the trial and is refused: the failures since the hold come from A alone,
/// so it is held for A only (twice as long); B still tries it, is refused, and with A's failure that is the
/// quorum: held for every client again, four times the first hold. Each failure is one connect, none more.
#[test]
fn a_failed_trial_holds_for_everyone_only_once_a_second_pod_fails_too() {
    let mut t = Tenants::start("health-trial", &["--health-hold=2s", "--health-max-hold=1m"]);
    let target = vip().to_string();
    assert_eq!(t.boxed.probe(&t.a, &target, 3).unwrap().count("web-1"), 3);
    drop(t.servers.remove(0));
    let mut seq = Vec::new();
    for ns in [&t.a, &t.b, &t.a] {
        seq.extend(outcomes(&t.boxed.probe(ns, &target, 1).unwrap()));
    }
    assert_eq!(seq, vec!["ECONNREFUSED"; 3], "K = 3 from two pods");
    let e = web_1_entry(&t);
    assert_eq!((e["state"].as_str(), e["holds"].as_u64()), (Some("held"), Some(1)), "{e}");
    assert!(crate::common::eventually(30, || web_1_entry(&t)["state"] == "half-open"), "the 2 s hold ends");
    let trial = outcomes(&t.boxed.probe(&t.a, &target, 2).unwrap());
    assert_eq!(trial, ["ECONNREFUSED", "web-2"], "A's trial fails, and A skips web-1 at once");
    let e = web_1_entry(&t);
    assert_eq!((e["state"].as_str(), e["holds"].as_u64()), (Some("held-for-one-client"), Some(2)), "{e}");
    let b = outcomes(&t.boxed.probe(&t.b, &target, 2).unwrap());
    assert_eq!(
        b,
        ["ECONNREFUSED", "web-2"],
        "B was not held for: it tries web-1 once, and that is the quorum"
    );
    let e = web_1_entry(&t);
    assert_eq!((e["state"].as_str(), e["holds"].as_u64()), (Some("held"), Some(3)), "{e}");
    let tr = &t.status()["health_transitions"];
    assert_eq!((tr["held"].as_u64(), tr["held_for_one_client"].as_u64()), (Some(2), Some(1)), "{tr}");
}
