//! Reverse translation under socket churn, in the kernel: a reply's source and getpeername() keep showing the
//! VIP however many sockets come and go, and the reverse maps hold no more than the live sockets need.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use lb_common::{MAP_CONNECTED_UDP, MAP_REVERSE, MAP_REVERSE_TCP, ReverseKey, ReverseValue};
use lb_testkit::{
    churn::Outcome,
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    sandbox::BpfFs,
};

mod common;

const TIERLB: &str = common::TIERLB;
const DNS_VIP: &str = "10.96.0.53:53";
const DNS_POD: &str = "10.244.1.10:5353";
const WEB_VIP: &str = "10.96.0.10:80";
const WEB_POD: &str = "10.244.1.20:8080";

/// One node with a DNS Service (UDP, 53 -> 5353) and a web Service (TCP, 80 -> 8080), each with one pod,
/// its agent started with `agent_args`.
fn cluster(tag: &str, agent_args: &[&str]) -> SimCluster {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let mut c = SimCluster::new(tag, Path::new(TIERLB), &lab).expect("sandbox");
    let dns_pod: SocketAddr = DNS_POD.parse().unwrap();
    let web_pod: SocketAddr = WEB_POD.parse().unwrap();
    c.add_dns_pod(dns_pod, "10.0.1.1".parse().unwrap()).unwrap();
    c.add_pod(web_pod, "web-1").unwrap();
    let dns_vip: SocketAddr = DNS_VIP.parse().unwrap();
    let mut dns = Svc::new("kube-dns", dns_vip.ip(), 53, 5353);
    dns.protocol = "UDP";
    write_service(c.manifests.path(), &dns, &[Ep::ready(dns_pod.ip(), "node-1")]).unwrap();
    let web_vip: SocketAddr = WEB_VIP.parse().unwrap();
    write_service(
        c.manifests.path(),
        &Svc::new("web", web_vip.ip(), 80, 8080),
        &[Ep::ready(web_pod.ip(), "node-1")],
    )
    .unwrap();
    c.add_node("node-1", agent_args).unwrap();
    c
}

/// `tierlb-lab churn` on node-1.
fn churn(c: &SimCluster, tcp: usize, udp_connected: usize, udp_sent: usize) -> Outcome {
    let mut cmd = c.client_command("node-1", &c.lab).unwrap();
    cmd.args(["churn", "--dns", DNS_VIP, "--tcp", WEB_VIP])
        .args(["--tcp-connects", &tcp.to_string()])
        .args(["--udp-connects", &udp_connected.to_string()])
        .args(["--udp-sends", &udp_sent.to_string()]);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `tierlb-lab keep` on node-1: a TCP connection to the web VIP and a connected UDP socket to the DNS VIP,
/// held open until dropped.
fn keep(c: &SimCluster) -> common::Piped {
    let mut cmd = c.client_command("node-1", &c.lab).unwrap();
    cmd.args(["keep", "--tcp", WEB_VIP, "--dns", DNS_VIP]);
    common::Piped::spawn(cmd)
}

/// Entries of a pinned (socket cookie, backend) -> VIP map; 0 if the map does not exist. Read with aya
/// directly, not through the agent's code, so the figure is the kernel's.
fn entries(path: &Path) -> usize {
    if !path.exists() {
        return 0;
    }
    common::hash_entries::<ReverseKey, ReverseValue>(path).len()
}

/// The scenario: with a reverse LRU of 1,024 entries, one process sends a DNS query from an
/// unconnected socket and opens a TCP connection through VIPs, then makes 4,000 TCP connects and 1,500
/// connected UDP sockets through VIPs, and only then reads the reply: it comes from the VIP, and the early
/// TCP socket's peer is still the VIP.
#[test]
fn socket_churn_never_loses_a_live_sockets_vip() {
    let c = cluster("revchurn", &["--max-reverse", "1024"]);
    let o = churn(&c, 4000, 1500, 0);
    eprintln!("{o:?}");
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert_eq!(o.early_peer_before.as_deref(), Some(WEB_VIP), "before the churn");
    assert_eq!(o.answer.as_deref(), Some("10.0.1.1"), "the DNS pod answered");
    assert_eq!(o.reply_from.as_deref(), Some(DNS_VIP), "the reply's source after the churn");
    assert_eq!(
        o.early_peer.as_deref(),
        Some(WEB_VIP),
        "getpeername() of the early TCP socket after the churn"
    );
}

/// 100,000 short-lived sockets (5,000 TCP connects, 65,000 connected UDP sockets, 30,000 unconnected UDP
/// sends, each socket closed at
/// once): afterwards the reverse maps outside socket storage (the LRU and the connected-UDP registry) hold
/// nothing, since no socket is left alive. The LRU's capacity is the default, larger than the churn, so
/// only deletion can empty it.
#[test]
fn reverse_state_after_100000_short_sockets_is_bounded_by_the_live_ones() {
    let bpffs = BpfFs::new("revbound").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let c = cluster("revbound", &["--bpffs", &pin]);
    let o = churn(&c, 5_000, 65_000, 30_000);
    eprintln!("{} sockets in {:.1} s, errors {:?}", o.sockets, o.seconds, o.errors);
    assert_eq!(o.sockets, 100_000);
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert_eq!(o.reply_from.as_deref(), Some(DNS_VIP));
    let dir = bpffs.path().join("node-1");
    let (lru, registered) = (entries(&dir.join(MAP_REVERSE)), entries(&dir.join(MAP_CONNECTED_UDP)));
    eprintln!("after the churn (client exited): {lru} LRU entries, {registered} connected-UDP entries");
    assert_eq!((lru, registered), (0, 0), "reverse entries outlived their sockets");
    let held = common::tcp_slots_held(&dir.join(MAP_REVERSE_TCP));
    assert!(held.is_empty(), "TCP slots outlived their sockets: {held:?}");
    // The agent's own figure agrees.
    let maps = tierlb::datapath::ebpf::KernelMaps::open_pinned(&dir).unwrap();
    let occupancy = tierlb::datapath::MapReader::reverse_occupancy(&maps).unwrap();
    assert_eq!((occupancy.lru, occupancy.connected_udp), (0, 0));
}

/// A TCP socket whose `REVERSE_TCP` slot another open socket holds (here: every slot held, as if by 65,536
/// open sockets) has its entry in the LRU: through 2,000 connects its getpeername() stays the VIP, and once
/// the sockets closed the LRU holds nothing and the slots still name their holders. Then, the slots free, a
/// connection kept open has its entry in its slot (the one its cookie names), none in the LRU.
#[test]
fn a_tcp_socket_whose_slot_is_held_keeps_its_vip_in_the_lru() {
    let bpffs = BpfFs::new("revslots").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let c = cluster("revslots", &["--bpffs", &pin]);
    let dir = bpffs.path().join("node-1");
    common::hold_every_tcp_slot(&dir.join(MAP_REVERSE_TCP));
    let o = churn(&c, 2_000, 0, 0);
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert_eq!(o.early_peer.as_deref(), Some(WEB_VIP), "getpeername() through the LRU");
    assert_eq!(entries(&dir.join(MAP_REVERSE)), 0, "the LRU entries went with their sockets");
    let held = common::tcp_slots_held(&dir.join(MAP_REVERSE_TCP));
    assert_eq!(held.len(), lb_common::REVERSE_TCP_SLOTS as usize, "no slot was taken from its holder");
    assert!(held.iter().all(|(i, cookie)| *cookie == common::held_cookie(*i)));

    // The slots free again: an open connection's entry is in the slot of its cookie.
    common::set_every_tcp_slot(&dir.join(MAP_REVERSE_TCP), |_| lb_common::TcpReverse::default());
    let mut keep = keep(&c);
    assert_eq!(keep.check().tcp_peer.as_deref(), Some(WEB_VIP));
    let held = common::tcp_slots_held(&dir.join(MAP_REVERSE_TCP));
    let lru = entries(&dir.join(MAP_REVERSE));
    drop(keep);
    assert_eq!((held.len(), lru), (1, 0), "one slot held, nothing in the LRU: {held:?}");
    assert_eq!(held[0].0, lb_common::tcp_slot(held[0].1), "the slot its cookie names");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(common::tcp_slots_held(&dir.join(MAP_REVERSE_TCP)).is_empty(), "freed at close");
}

/// The socket storage and the TCP sockets' reverse slots are pinned with the other maps and an agent
/// restarted over the pins reuses the same maps (same kernel map ids), so live sockets keep their reverse
/// state across a restart (a TCP connection held open through it still shows the VIP); translation and
/// reverse translation work after it; `--cleanup` removes the pins and the `sock_release` link with the rest.
#[test]
fn a_restarted_agent_keeps_the_socket_storage() {
    let bpffs = BpfFs::new("revrestart").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let mut c = cluster("revrestart", &["--bpffs", &pin]);
    let socks = bpffs.path().join("node-1").join(lb_common::MAP_SOCKS);
    let slots = bpffs.path().join("node-1").join(MAP_REVERSE_TCP);
    assert!(socks.exists() && slots.exists(), "socket storage and slots pinned at {}", socks.display());
    let id = |p: &PathBuf| aya::maps::MapData::from_pin(p).unwrap().info().unwrap().id();
    let ids_before = (id(&socks), id(&slots));
    let mut keep = keep(&c);
    assert_eq!(keep.check().tcp_peer.as_deref(), Some(WEB_VIP), "before the restart");
    c.restart_agent("node-1").unwrap();
    assert_eq!((id(&socks), id(&slots)), ids_before, "the restarted agent reused the pinned maps");
    assert_eq!(keep.check().tcp_peer.as_deref(), Some(WEB_VIP), "a connection held through the restart");
    drop(keep);
    let o = churn(&c, 10, 10, 10);
    assert_eq!(o.reply_from.as_deref(), Some(DNS_VIP));
    assert_eq!(o.early_peer.as_deref(), Some(WEB_VIP));
    let removed = std::process::Command::new(TIERLB)
        .args(["agent", "--cleanup", "--node", "node-1", "--bpffs", &pin])
        .output()
        .unwrap();
    assert!(removed.status.success(), "{}", String::from_utf8_lossy(&removed.stderr));
    assert!(!socks.exists() && !slots.exists(), "--cleanup removes the socket storage's and the slots' pins");
    assert!(!bpffs.path().join("node-1").join("link_sock_release").exists());
}

/// One unconnected UDP socket sends a query to each of 10 DNS Services (10 backends): every reply comes from
/// its VIP; the socket's storage records 8 of its reverse entries, the kernel counts the other 2 as
/// unrecorded (`reverse_unrecorded_total`), and after the socket closes exactly those 2 stay in the LRU.
#[test]
fn a_udp_socket_sending_to_more_than_8_backends_leaves_exactly_the_unrecorded_entries() {
    let bpffs = BpfFs::new("rev8").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let mut c = SimCluster::new("rev8", Path::new(TIERLB), &lab).expect("sandbox");
    let mut vips = Vec::new();
    for i in 1..=10u8 {
        let pod: SocketAddr = format!("10.244.1.{}:5353", 60 + i).parse().unwrap();
        c.add_dns_pod(pod, format!("10.0.9.{i}").parse().unwrap()).unwrap();
        let vip: SocketAddr = format!("10.96.1.{i}:53").parse().unwrap();
        let mut svc = Svc::new(&format!("dns-{i}"), vip.ip(), 53, 5353);
        svc.protocol = "UDP";
        write_service(c.manifests.path(), &svc, &[Ep::ready(pod.ip(), "node-1")]).unwrap();
        vips.push(vip);
    }
    c.add_node("node-1", &["--bpffs", &pin]).unwrap();
    let list = vips.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = c.client_command("node-1", &c.lab).unwrap();
    cmd.args(["flood", "--tcp", WEB_VIP, "--send-to", &list]).stdin(std::process::Stdio::null());
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let f: lb_testkit::tenant::Flood = serde_json::from_slice(&out.stdout).unwrap();
    let want: Vec<String> = vips.iter().map(ToString::to_string).collect();
    assert_eq!(f.replies_from, want, "every reply's source is its VIP");
    let dir = bpffs.path().join("node-1");
    let left = entries(&dir.join(MAP_REVERSE));
    let (ok, status, err) = {
        let o = std::process::Command::new(TIERLB)
            .args(["status", "-o", "json", "--bpffs", &pin])
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    eprintln!(
        "after the socket closed: {left} LRU entries, unrecorded {}",
        status[0]["reverse_unrecorded_total"]
    );
    assert_eq!(left, 2, "the 2 entries beyond the socket's record of 8 outlive it");
    assert_eq!(status[0]["reverse_unrecorded_total"], 2, "{status}");
}
