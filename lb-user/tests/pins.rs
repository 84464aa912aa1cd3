//! Pins on a node's bpffs, in the kernel: the agent makes its own pin directory on a fresh bpffs, refuses a
//! directory that is not on one, refuses pinned maps of another capacity (naming both values), and
//! `--cleanup` removes every pin it may have left, including a link pinned but not yet renamed.
use std::{path::Path, process::Command};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    sandbox::{BpfFs, TempDir, attached_programs as attached},
};

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

fn cluster(tag: &str) -> SimCluster {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
    SimCluster::new(tag, Path::new(TIERLB), &lb_testkit::workspace_bin("tierlb-lab", "lb-lab"))
        .expect("sandbox")
}

/// `tierlb agent` on node-1's cgroup and manifests with these extra arguments, run to its end (it fails before
/// attaching, or is not expected to start).
fn agent_once(c: &SimCluster, extra: &[&str]) -> std::process::Output {
    Command::new(TIERLB)
        .args(["agent", "--node", "node-1", "--manifests"])
        .arg(c.manifests.path())
        .arg("--cgroup")
        .arg(c.node("node-1").cgroup.path())
        .args(["--healthz-addr", "off", "--metrics-addr", "off", "--service-health-bind", "off"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn the_agent_makes_its_pin_directory_refuses_other_capacities_and_cleanup_removes_every_pin() {
    let (mut c, bpffs) = web_cluster("pins");

    // A fresh node: the bpffs is mounted, nothing below it exists yet.
    let base = bpffs.path().join("tierlb");
    let pin = base.to_str().unwrap().to_owned();
    c.add_node("node-1", &["--bpffs", &pin]).unwrap();
    let dir = base.join("node-1");
    assert!(dir.join(lb_common::MAP_FRONTENDS).exists(), "the agent made {} and pinned there", dir.display());
    c.stop_agent("node-1");
    let cg = c.node("node-1").cgroup.path().to_owned();
    assert_eq!(
        attached(&cg),
        tierlb::datapath::ebpf::PROGRAMS.len(),
        "pinned links keep the programs attached"
    );

    // Other capacities than the pinned maps': refused, naming both values and the way out.
    let out = agent_once(&c, &["--bpffs", &pin, "--max-services", "100"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("was made for --max-services 65536 but the agent now asks for --max-services 100"),
        "{err}"
    );
    assert!(err.contains("tierlb agent --cleanup"), "{err}");

    // Not on a bpffs: refused, naming the directory checked.
    let plain = TempDir::new("pins-plain").unwrap();
    let not_bpf = plain.path().join("tierlb");
    let out = agent_once(&c, &["--bpffs", not_bpf.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("{} is not on a bpf filesystem", plain.path().display())), "{err}");
    assert!(!not_bpf.exists(), "nothing created off bpffs");

    // An agent killed between pinning a new link and renaming it over the old one leaves `link_*_new`.
    std::fs::rename(dir.join("link_connect4"), dir.join("link_connect4_new")).unwrap();
    let out = Command::new(TIERLB)
        .args(["agent", "--cleanup", "--node", "node-1", "--bpffs", &pin])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dir.exists(), "every pin removed: {:?}", std::fs::read_dir(&dir).map(Iterator::count));
    assert_eq!(attached(&cg), 0, "nothing attached after --cleanup");
}

/// A cluster with web (10.96.0.10:80) and its one pod on node-1, and a fresh bpffs.
fn web_cluster(tag: &str) -> (SimCluster, BpfFs) {
    let mut c = cluster(tag);
    let bpffs = BpfFs::new(tag).unwrap();
    c.add_pod("10.244.1.10:8080".parse().unwrap(), "pod-node-1").unwrap();
    let svc = Svc::new("web", "10.96.0.10".parse().unwrap(), 80, 8080);
    write_service(c.manifests.path(), &svc, &[Ep::ready("10.244.1.10".parse().unwrap(), "node-1")]).unwrap();
    (c, bpffs)
}

/// A connect to web's VIP from node-1's cgroup: the backend that answered, or the error.
fn web_answers(c: &SimCluster) -> bool {
    let r = c.probe("node-1", "10.96.0.10:80".parse().unwrap(), 3, std::time::Duration::ZERO).unwrap();
    r.failures() == 0 && r.count("pod-node-1") == 3
}

/// GET `/healthz` from 127.0.0.1:`port`: the reply.
fn healthz(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn programs_detached_under_a_running_agent_are_attached_again_and_healthz_counts_it() {
    let (mut c, bpffs) = web_cluster("pins-watch");
    let base = bpffs.path().join("tierlb");
    let pin = base.to_str().unwrap().to_owned();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    c.add_node("node-1", &["--bpffs", &pin, "--healthz-addr", &format!("127.0.0.1:{port}")]).unwrap();
    assert!(web_answers(&c));
    assert!(healthz(port).contains("\"programsReattached\":0"), "{}", healthz(port));
    // Every link pin removed (an uninstall applied while the agent runs): the kernel detaches the programs.
    let dir = base.join("node-1");
    for p in tierlb::datapath::ebpf::PROGRAMS {
        std::fs::remove_file(dir.join(format!("link_{p}"))).unwrap();
    }
    let cg = c.node("node-1").cgroup.path().to_owned();
    let log = c.node("node-1").log.clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !std::fs::read_to_string(&log).unwrap().contains("programs attached again") {
        assert!(std::time::Instant::now() < deadline, "{}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("programs found detached: attaching them again"), "{text}");
    assert_eq!(attached(&cg), tierlb::datapath::ebpf::PROGRAMS.len(), "attached again, once each");
    assert!(dir.join("link_connect4").exists(), "pinned again");
    assert!(web_answers(&c), "translated again");
    let reply = healthz(port);
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains("\"programsReattached\":1"), "{reply}");
    assert!(reply.contains("\"programsDetached\":null"), "{reply}");
}

#[test]
fn programs_another_instance_left_on_the_cgroup_are_named_and_the_agent_refuses_to_start() {
    let (mut c, bpffs) = web_cluster("pins-stale");
    let pin = bpffs.path().join("tierlb").to_str().unwrap().to_owned();
    // Instance "old" stops and leaves its programs attached (its links pinned), as an agent does.
    c.add_node("node-1", &["--bpffs", &pin, "--instance", "old"]).unwrap();
    c.stop_agent("node-1");
    let cg = c.node("node-1").cgroup.path().to_owned();
    assert_eq!(attached(&cg), tierlb::datapath::ebpf::PROGRAMS.len());
    // An agent with another instance name on the same cgroup would run beside them: refused, naming them.
    let out = agent_once(&c, &["--bpffs", &pin, "--instance", "new"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("programs of another tierlb instance are attached to"), "{err}");
    for p in tierlb::datapath::ebpf::PROGRAMS {
        assert!(err.contains(&format!("{p} (program id ")), "{p} named: {err}");
    }
    assert!(err.contains("tierlb agent --cleanup"), "{err}");
    assert_eq!(attached(&cg), tierlb::datapath::ebpf::PROGRAMS.len(), "nothing attached beside them");
    // The same instance adopts its own pins and starts.
    c.restart_agent("node-1").unwrap();
    assert!(web_answers(&c));
    c.stop_agent("node-1");
    let out = Command::new(TIERLB)
        .args(["agent", "--cleanup", "--node", "node-1", "--bpffs", &pin, "--instance", "old"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(attached(&cg), 0);
}
