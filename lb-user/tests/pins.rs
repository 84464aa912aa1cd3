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
    let mut c = cluster("pins");
    let bpffs = BpfFs::new("pins").unwrap();
    c.add_pod("10.244.1.10:8080".parse().unwrap(), "pod-node-1").unwrap();
    let svc = Svc::new("web", "10.96.0.10".parse().unwrap(), 80, 8080);
    write_service(c.manifests.path(), &svc, &[Ep::ready("10.244.1.10".parse().unwrap(), "node-1")]).unwrap();

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
