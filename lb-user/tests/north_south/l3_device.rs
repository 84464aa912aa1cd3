//! A local backend's reply that leaves by an L3 device (no Ethernet header): node-1 routes its pod's traffic
//! to the client into a tun device, as a userspace tunnel (wireguard-go, Tailscale) would, and the test plays
//! the tunnel: what node-1's tun0 gives it, it hands to the client's tun1. The agent attaches
//! `tc_egress_l3` there, so the reply carries the node port as its source; before, L3 devices got no
//! program (the Ethernet one would misparse them) and the reply left with the pod's address.
use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use lb_testkit::sandbox::NetNs;

use super::lab::{CLIENT, Lab, NODE_1, POD_1, from, names, ns_run, sa, tc_programs};

/// A tun device named `name` (`IFF_TUN | IFF_NO_PI`: IP packets, no header) in `ns`, and its file.
fn tun(ns: &NetNs, name: &'static str) -> File {
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    const IFF_TUN: libc::c_short = 0x0001;
    const IFF_NO_PI: libc::c_short = 0x1000;
    from(ns, move || {
        let f = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").unwrap();
        // struct ifreq: the name (16 bytes), then the flags.
        let mut req = [0u8; 40];
        req[..name.len()].copy_from_slice(name.as_bytes());
        req[16..18].copy_from_slice(&(IFF_TUN | IFF_NO_PI).to_ne_bytes());
        // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `req` is large enough for.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, req.as_mut_ptr()) };
        assert_eq!(rc, 0, "TUNSETIFF {name}: {}", std::io::Error::last_os_error());
        f
    })
}

#[test]
fn north_south_a_reply_leaving_by_an_l3_device_carries_the_node_port() {
    let lab = Lab::new("ns-l3", "Local", true);
    let node = &lab.boxed.node.netns;
    let (mut into, mut out) = (tun(node, "tun0"), tun(&lab.client, "tun1"));
    node.ip(&["addr", "add", "10.98.0.1/30", "dev", "tun0"]).unwrap();
    node.ip(&["link", "set", "tun0", "up"]).unwrap();
    lab.client.ip(&["addr", "add", "10.98.0.2/30", "dev", "tun1"]).unwrap();
    lab.client.ip(&["link", "set", "tun1", "up"]).unwrap();
    // The replies arrive by tun1 from an address the client reaches by its uplink.
    for conf in ["all", "tun1"] {
        ns_run(&lab.client, &["sysctl", "-qw", &format!("net.ipv4.conf.{conf}.rp_filter=0")]);
    }
    // The pod's traffic to the client goes into the tunnel.
    node.ip(&["rule", "add", "from", POD_1, "lookup", "100", "priority", "100"]).unwrap();
    node.ip(&["route", "add", &format!("{CLIENT}/32"), "dev", "tun0", "table", "100"]).unwrap();
    // The tunnel: node-1's tun0 to the client's tun1, one packet at a time.
    let (stop, carried) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let tunnel = {
        let (stop, carried) = (stop.clone(), carried.clone());
        // SAFETY: fcntl on the tun file this test owns.
        unsafe { libc::fcntl(into.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Ordering::Relaxed) {
                match into.read(&mut buf) {
                    Ok(n) => {
                        let _ = out.write(&buf[..n]);
                        carried.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        })
    };
    let _agent = lab.start_agent();
    let [_, programs] = tc_programs(node, "tun0");
    let answers = lab.tcp(sa(NODE_1, 30080), 6);
    stop.store(true, Ordering::Relaxed);
    tunnel.join().unwrap();
    let carried = carried.load(Ordering::Relaxed);
    let figures =
        format!("answers {answers:?}; tun0's egress programs {programs:?}; {carried} packets tunnelled");
    assert_eq!(programs, ["tc_egress_l3"], "{figures}");
    assert!(answers.iter().all(Result::is_ok), "{figures}");
    assert_eq!(names(&answers).get("web-node-1"), Some(&6), "{figures}");
    assert!(carried >= 6, "the replies went through the tunnel: {figures}");
}
