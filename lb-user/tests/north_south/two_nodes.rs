//! A pod on node-2 reaching node-1's node port, with an agent on each node (both as the DaemonSet runs
//! them): node-2's agent leaves the connect alone (node-1's address is no node port of node-2's, as
//! kube-proxy's `KUBE-NODEPORTS` matches local addresses only), so the SYN crosses the wire and node-1's tc
//! programs translate it: to node-1's pod with the client's address kept (its reply leaves from the node
//! port), or back to node-2's pod with SNAT (a hairpin through node-1). node-2's own node port, from the same
//! pod, is translated at connect by node-2's agent and never reaches node-1's tc.
use std::{collections::BTreeMap, net::SocketAddr, process::Command};

use lb_testkit::{
    manifests::{to_yaml, write_atomic},
    sandbox::confine,
};
use serde_json::Value;

use super::lab::{Lab, NODE_1, NODE_2, POD_1, POD_1_6, POD_2, POD_2_6, manifests, sa, status_of};

/// One line-protocol request to `to` from node-2's pod, a process in node-2's agent cgroup: `NAME PEER`.
fn from_pod_2(lab: &Lab, to: SocketAddr) -> Result<(String, String), String> {
    let script = format!("exec 3<>/dev/tcp/{}/{}; echo hello >&3; head -1 <&3", to.ip(), to.port());
    let mut cmd = Command::new("timeout");
    cmd.args(["3", "bash", "-c", &script]);
    confine(&mut cmd, Some(&lab.node_2.cgroup), Some(&lab.pods.last().unwrap().0)).unwrap();
    let out = cmd.output().map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (name, peer) = line.split_once(' ').ok_or_else(|| format!("{to}: {line:?} {:?}", out.status))?;
    Ok((name.to_owned(), peer.to_owned()))
}

/// Node-1's new flows from outside, both kinds.
fn new_flows(st: &Value) -> u64 {
    let c = &st[0]["north_south"]["counters"];
    c["new_local"].as_u64().unwrap() + c["new_snat"].as_u64().unwrap()
}

#[test]
fn north_south_a_pod_on_another_node_reaches_the_node_port_through_node_1s_tc() {
    let lab = Lab::new("ns-2n", "Cluster", true);
    let eps = [(POD_1, POD_1_6, "node-1"), (POD_2, POD_2_6, "node-2")];
    write_atomic(lab.node_2.manifests.path(), "web.yaml", &to_yaml(&manifests("Cluster", &eps))).unwrap();
    let _agent_1 = lab.start_agent();
    let _agent_2 = lab.start_node_2_with(&[]);
    let before = new_flows(&lab.status());
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..20 {
        let (name, peer) =
            from_pod_2(&lab, sa(NODE_1, 30080)).expect("node-1's node port answers node-2's pod");
        let peer: SocketAddr = peer.parse().unwrap();
        let want = if name == "web-node-1" { POD_2 } else { NODE_1 };
        assert_eq!(
            peer.ip().to_string(),
            want,
            "{name}: the client kept for a local pod, SNAT for the other"
        );
        *by.entry(name).or_default() += 1;
    }
    assert_eq!(by.len(), 2, "both pods, through node-1: {by:?}");
    assert_eq!(new_flows(&lab.status()) - before, 20, "every connection a new flow at node-1's tc");
    let node_2 = status_of(&lab.node_2);
    let fes = node_2[0]["frontends"].as_array().unwrap();
    assert!(
        !fes.iter().any(|f| f["frontend"].as_str().is_some_and(|a| a.starts_with(&format!("{NODE_1}:")))),
        "node-2's agent has no frontend on node-1's address: {fes:?}"
    );
    // node-2's own node port: translated at connect on node-2, so node-1's tc sees no new flow.
    let before = new_flows(&lab.status());
    for _ in 0..10 {
        from_pod_2(&lab, sa(NODE_2, 30080)).expect("node-2's node port, at connect");
    }
    assert_eq!(new_flows(&lab.status()), before, "node-1's tc saw none of them");
}
