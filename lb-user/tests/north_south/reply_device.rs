//! A local backend's reply that leaves by a device other than the one its request came in on (policy
//! routing, a second uplink): node-1 routes its pod's traffic to the client out of a second uplink, which
//! holds no NodePort address. The agent attaches its egress program there too, so the reply still carries
//! the node port as its source (before, only the NodePort devices' egress translated: the reply left with
//! the pod's address, and the client's connect never completed).
use super::lab::{Lab, NODE_1, POD_1, names, ns_run, sa, tc_programs};

#[test]
fn north_south_a_reply_leaving_by_a_second_device_carries_the_node_port() {
    let lab = Lab::new("ns-reply2", "Local", true);
    let node = &lab.boxed.node.netns;
    // Two devices on one LAN: each answers ARP only for its own address (else the client may learn the
    // second uplink's MAC for the node's address, and its requests would arrive where no ingress program is).
    for (key, value) in [("arp_ignore", "1"), ("arp_announce", "2")] {
        ns_run(node, &["sysctl", "-qw", &format!("net.ipv4.conf.all.{key}={value}")]);
    }
    lab.lan
        .ip(&["link", "add", "p1b", "type", "veth", "peer", "name", "uplink2", "netns", node.name()])
        .unwrap();
    lab.lan.ip(&["link", "set", "p1b", "master", "br0", "up"]).unwrap();
    node.ip(&["addr", "add", "192.0.2.11/24", "dev", "uplink2"]).unwrap();
    node.ip(&["link", "set", "uplink2", "up"]).unwrap();
    // The pod's traffic to the LAN leaves by the second uplink.
    node.ip(&["rule", "add", "from", POD_1, "lookup", "100", "priority", "100"]).unwrap();
    node.ip(&["route", "add", "192.0.2.0/24", "dev", "uplink2", "src", "192.0.2.11", "table", "100"])
        .unwrap();
    // With `--devices` as without, the NodePort device gets both programs and the other the egress program
    // alone: the reply is translated where it leaves.
    let tc_progs = |device: &'static str| tc_programs(node, device).to_vec();
    let to = sa(NODE_1, 30080);
    let egress = vec![Vec::<String>::new(), vec!["tc_egress".to_owned()]];
    for (flags, want) in [(&[][..], egress.clone()), (&["--devices", "uplink"][..], egress)] {
        let agent = lab.start_agent_with(flags);
        let answers = lab.tcp(to, 6);
        assert!(answers.iter().all(Result::is_ok), "{flags:?}: {answers:?}");
        assert_eq!(
            names(&answers).get("web-node-1"),
            Some(&6),
            "{flags:?}: the local pod answered: {answers:?}"
        );
        assert_eq!(tc_progs("uplink2"), want, "{flags:?}: ingress, egress of uplink2");
        agent.stop();
        let pins = lab.boxed.bpffs.path().join("tierlb");
        let st = std::process::Command::new(super::lab::TIERLB)
            .args(["agent", "--cleanup", "--node", "node-1", "--bpffs", pins.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let _agent = lab.start_agent();
    // A device that comes after the agent started is followed too.
    lab.lan
        .ip(&["link", "add", "p1c", "type", "veth", "peer", "name", "uplink3", "netns", node.name()])
        .unwrap();
    node.ip(&["addr", "add", "192.0.2.12/24", "dev", "uplink3"]).unwrap();
    node.ip(&["link", "set", "uplink3", "up"]).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let attached = || tc_programs(node, "uplink3")[1].iter().any(|p| p == "tc_egress");
    while !attached() {
        assert!(
            std::time::Instant::now() < deadline,
            "uplink3 not attached within 10 s (the agent rescans every 2 s)"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
