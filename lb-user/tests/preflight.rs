//! `tierlb preflight` in the kernel, run in a network namespace of the test's as the DaemonSet's init
//! container runs it: this node is ready (the programs verified), and each thing taken away is named with
//! its fix and exit status 4: a directory off bpffs, a cgroup v1 hierarchy or a plain directory as the
//! cgroup, CAP_BPF out of the bounding set, kube-proxy's port held. kube-proxy's rules (nftables and
//! iptables-nft) are warnings: an install runs the agent beside them. Another instance's programs on the
//! cgroup fail it, this instance's own do not; a socket load balancer of Cilium's name fails it.
use std::{os::fd::AsRawFd as _, path::Path, process::Command};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Svc, write_service},
    sandbox::{BpfFs, Cgroup, NetNs, TempDir, confine},
};
use serde_json::Value;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

fn require_root() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
}

/// `tierlb preflight -o json` in `netns`, behind `prefix` (a command that runs the rest, such as setpriv),
/// for the cgroup, pins and instance given: its exit status and report.
fn preflight(netns: &NetNs, prefix: &[&str], cgroup: &Path, bpffs: &Path, instance: &str) -> (i32, Value) {
    // setns(2) alone, not `ip netns exec`: that also mounts a fresh sysfs on /sys in a mount namespace of
    // its own, where the cgroup2 mount below /sys/fs/cgroup is gone.
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(TIERLB);
            c
        }
        None => Command::new(TIERLB),
    };
    confine(&mut cmd, None, Some(netns)).unwrap();
    let out = cmd
        .args(["preflight", "-o", "json", "--instance", instance, "--cgroup"])
        .arg(cgroup)
        .arg("--bpffs")
        .arg(bpffs)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), report)
}

/// The first finding of `check` in `report`: (result, detail, fix).
fn finding(report: &Value, check: &str) -> (String, String, String) {
    let c = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == check)
        .unwrap_or_else(|| panic!("no {check} check: {report}"));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("result"), s("detail"), s("fix"))
}

fn fails(report: &Value) -> Vec<&str> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["result"] == "fail")
        .filter_map(|c| c["check"].as_str())
        .collect()
}

#[test]
fn preflight_finds_this_node_ready_with_the_programs_verified() {
    require_root();
    let (netns, cgroup, bpffs) =
        (NetNs::new("pf-ok").unwrap(), Cgroup::new("pf-ok").unwrap(), BpfFs::new("pf-ok").unwrap());
    let (code, report) = preflight(&netns, &[], cgroup.path(), &bpffs.path().join("tierlb"), "node-1");
    assert_eq!((code, fails(&report)), (0, vec![]), "{report:#}");
    let (result, detail, _) = finding(&report, "programs");
    assert_eq!(result, "ok", "{detail}");
    assert!(detail.starts_with("verified: "), "{detail}");
    for check in
        ["kernel", "btf", "capabilities", "cgroup", "bpffs", "cgroup-programs", "kube-proxy-rules", "ports"]
    {
        assert_eq!(finding(&report, check).0, "ok", "{check}: {report:#}");
    }
}

/// A cgroup v1 hierarchy of the test's own (a named one, no controller), unmounted on drop.
struct V1Hierarchy(TempDir);

impl V1Hierarchy {
    fn new() -> Self {
        let dir = TempDir::new("pf-v1").unwrap();
        let name = format!("name=tierlb-pf-{}", std::process::id());
        let st = Command::new("mount")
            .args(["-t", "cgroup", "-o", &format!("none,{name}"), "cgroup"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mounting a named cgroup v1 hierarchy");
        Self(dir)
    }
}

impl Drop for V1Hierarchy {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Where a case points preflight: the test's cgroup and bpffs, or something else in their place.
#[derive(Clone, Copy)]
enum Place {
    Good,
    /// `--bpffs` in a plain directory.
    OffBpffs,
    /// `--cgroup` at a cgroup v1 hierarchy.
    V1,
    /// `--cgroup` at a plain directory.
    Plain,
}

/// A thing taken away: how (commands run in the node's namespace first, a command preflight runs behind,
/// where it points), and what preflight must say: the check, its result, words of its detail and of its fix,
/// and the exit status.
struct Case {
    name: &'static str,
    setup: &'static [&'static [&'static str]],
    prefix: &'static [&'static str],
    place: Place,
    check: &'static str,
    result: &'static str,
    detail: &'static str,
    fix: &'static str,
    code: i32,
}

const CASES: [Case; 6] = [
    Case {
        name: "pins off bpffs",
        setup: &[],
        prefix: &[],
        place: Place::OffBpffs,
        check: "bpffs",
        result: "fail",
        detail: "is not on a bpf filesystem",
        fix: "mount -t bpf",
        code: 4,
    },
    Case {
        name: "a cgroup v1 hierarchy",
        setup: &[],
        prefix: &[],
        place: Place::V1,
        check: "cgroup",
        result: "fail",
        detail: "is a cgroup v1 hierarchy",
        fix: "pass the cgroup2 mount as --cgroup",
        code: 4,
    },
    Case {
        name: "a plain directory as the cgroup",
        setup: &[],
        prefix: &[],
        place: Place::Plain,
        check: "cgroup",
        result: "fail",
        detail: "is not a cgroup v2 directory",
        fix: "--cgroup",
        code: 4,
    },
    Case {
        name: "CAP_BPF out of the bounding set",
        setup: &[],
        prefix: &["setpriv", "--bounding-set", "-bpf", "--"],
        place: Place::Good,
        check: "capabilities",
        result: "fail",
        detail: "missing CAP_BPF",
        fix: "deploy/daemonset.yaml",
        code: 4,
    },
    Case {
        name: "kube-proxy's nftables tables",
        setup: &[
            &["nft", "add", "table", "ip", "kube-proxy"],
            &["nft", "add", "chain", "ip", "kube-proxy", "services"],
        ],
        prefix: &[],
        place: Place::Good,
        check: "kube-proxy-rules",
        result: "warn",
        detail: "nftables: ip kube-proxy",
        fix: "kube-proxy --cleanup",
        code: 0,
    },
    Case {
        name: "kube-proxy's iptables-nft chains",
        setup: &[
            &["iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"],
            &["iptables-nft", "-t", "nat", "-N", "KUBE-NODEPORTS"],
        ],
        prefix: &[],
        place: Place::Good,
        check: "kube-proxy-rules",
        result: "warn",
        detail: "ip nat; 2 KUBE- chains",
        fix: "kube-proxy --cleanup",
        code: 0,
    },
];

#[test]
fn preflight_names_what_is_taken_away_with_its_fix_and_exit_status_4() {
    require_root();
    let (cgroup, bpffs) = (Cgroup::new("pf-away").unwrap(), BpfFs::new("pf-away").unwrap());
    let plain = TempDir::new("pf-plain").unwrap();
    let v1 = V1Hierarchy::new();
    let pins = bpffs.path().join("tierlb");
    let off_bpffs = plain.path().join("tierlb");
    let mut wrong = Vec::new();
    for c in &CASES {
        let netns = NetNs::new("pf-away").unwrap();
        for cmd in c.setup {
            let st = Command::new("ip").args(["netns", "exec", netns.name()]).args(*cmd).status().unwrap();
            assert!(st.success(), "{}: {cmd:?}", c.name);
        }
        let (cg, pin) = match c.place {
            Place::Good => (cgroup.path(), pins.as_path()),
            Place::OffBpffs => (cgroup.path(), off_bpffs.as_path()),
            Place::V1 => (v1.0.path(), pins.as_path()),
            Place::Plain => (plain.path(), pins.as_path()),
        };
        let (code, report) = preflight(&netns, c.prefix, cg, pin, "node-1");
        let (result, detail, fix) = finding(&report, c.check);
        if (code, result.as_str()) != (c.code, c.result) || !detail.contains(c.detail) || !fix.contains(c.fix)
        {
            wrong.push(format!("{}: exit {code}, {} {result}: {detail} (fix: {fix})", c.name, c.check));
        }
        // Only what was taken away fails.
        let failed = fails(&report);
        if failed.iter().any(|f| *f != c.check) {
            wrong.push(format!("{}: also failed {failed:?}: {report:#}", c.name));
        }
    }
    // kube-proxy's port, held in the node's namespace.
    let netns = NetNs::new("pf-port").unwrap();
    let held = netns.run(|| Ok(std::net::TcpListener::bind("0.0.0.0:10256")?)).unwrap();
    let (code, report) = preflight(&netns, &[], cgroup.path(), &pins, "node-1");
    let (result, detail, fix) = finding(&report, "ports");
    if (code, result.as_str()) != (4, "fail")
        || !detail.contains("0.0.0.0:10256")
        || !fix.contains("Delete its DaemonSet")
    {
        wrong.push(format!("port held: exit {code}, ports {result}: {detail} (fix: {fix})"));
    }
    drop(held);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A trivial cgroup/connect4 program loaded under `name` and attached to `cgroup` (`r0 = 1; exit`: the
/// connect goes on untouched), detached on drop: another project's program, as far as its name tells.
struct NamedProgram {
    prog: std::os::fd::OwnedFd,
    cgroup: std::fs::File,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const CGROUP_INET4_CONNECT: u32 = 10;

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> std::io::Result<i64> {
    // SAFETY: bpf(2) with a zero-filled attr of 128 bytes whose pointers (set by the callers) stay alive.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}

impl NamedProgram {
    fn attach(name: &str, cgroup: &Path) -> Self {
        // mov64 r0, 1; exit
        let insns: [u64; 2] = [0xb7 | (1u64 << 32), 0x95];
        let license = b"GPL\0";
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&18u32.to_ne_bytes()); // BPF_PROG_TYPE_CGROUP_SOCK_ADDR
        attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
        attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
        attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
        attr[48..48 + name.len().min(15)].copy_from_slice(&name.as_bytes()[..name.len().min(15)]);
        attr[68..72].copy_from_slice(&CGROUP_INET4_CONNECT.to_ne_bytes());
        let fd = bpf(BPF_PROG_LOAD, &mut attr).expect("loading a trivial connect4 program");
        // SAFETY: the kernel returned a new program descriptor that nothing else owns.
        let prog = unsafe {
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(i32::try_from(fd).unwrap())
        };
        let cgroup = std::fs::File::open(cgroup).unwrap();
        let mut attr = Self::attach_attr(&cgroup, &prog);
        attr[12..16].copy_from_slice(&2u32.to_ne_bytes()); // BPF_F_ALLOW_MULTI
        bpf(BPF_PROG_ATTACH, &mut attr).expect("attaching it to the test's cgroup");
        Self { prog, cgroup }
    }

    fn attach_attr(cgroup: &std::fs::File, prog: &std::os::fd::OwnedFd) -> [u8; 128] {
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&cgroup.as_raw_fd().cast_unsigned().to_ne_bytes());
        attr[4..8].copy_from_slice(&prog.as_raw_fd().cast_unsigned().to_ne_bytes());
        attr[8..12].copy_from_slice(&CGROUP_INET4_CONNECT.to_ne_bytes());
        attr
    }
}

impl Drop for NamedProgram {
    fn drop(&mut self) {
        let mut attr = Self::attach_attr(&self.cgroup, &self.prog);
        let _ = bpf(BPF_PROG_DETACH, &mut attr);
    }
}

#[test]
fn preflight_tells_this_instances_programs_from_another_instances_and_from_cilium() {
    require_root();
    let mut c =
        SimCluster::new("pf-inst", Path::new(TIERLB), &lb_testkit::workspace_bin("tierlb-lab", "lb-lab"))
            .unwrap();
    let bpffs = BpfFs::new("pf-inst").unwrap();
    write_service(c.manifests.path(), &Svc::new("web", "10.96.0.10".parse().unwrap(), 80, 8080), &[])
        .unwrap();
    let pins = bpffs.path().join("tierlb");
    c.add_node("node-1", &["--bpffs", pins.to_str().unwrap()]).unwrap();
    let cgroup = c.node("node-1").cgroup.path().to_owned();
    let netns = NetNs::new("pf-inst").unwrap();

    // node-1's own agent: its programs are this instance's, to be replaced.
    let (code, report) = preflight(&netns, &[], &cgroup, &pins, "node-1");
    let (result, detail, _) = finding(&report, "cgroup-programs");
    assert_eq!((code, result.as_str()), (0, "ok"), "{report:#}");
    assert!(detail.contains("this instance's earlier programs (10)"), "{detail}");
    assert_eq!(finding(&report, "pins").1, "this instance's pins, which the agent adopts");

    // Asked as node-2 on the same cgroup: another instance's, which would translate beside it.
    let (code, report) = preflight(&netns, &[], &cgroup, &pins, "node-2");
    let (result, detail, fix) = finding(&report, "cgroup-programs");
    assert_eq!((code, result.as_str()), (4, "fail"), "{report:#}");
    assert!(detail.contains("another tierlb instance's programs are attached: connect4 (id "), "{detail}");
    assert!(fix.contains("tierlb agent --cleanup"), "{fix}");
    let (result, detail, _) = finding(&report, "pins");
    assert_eq!(result, "warn");
    assert!(detail.ends_with("node-1"), "{detail}");

    // A program named as Cilium's socket load balancer on a cgroup of its own: that fails it, naming Cilium.
    let other = Cgroup::new("pf-cil").unwrap();
    let cil = NamedProgram::attach("cil_sock4_connect", other.path());
    let (code, report) = preflight(&netns, &[], other.path(), &pins, "node-1");
    let (result, detail, fix) = finding(&report, "socket-lb");
    assert_eq!((code, result.as_str()), (4, "fail"), "{report:#}");
    assert!(
        detail.starts_with("Cilium's socket load balancing is attached: cil_sock4_conne (id "),
        "{detail}"
    );
    assert!(fix.contains("socketLB.enabled=false"), "{fix}");
    drop(cil);
    let (code, report) = preflight(&netns, &[], other.path(), &pins, "node-1");
    assert_eq!(code, 0, "detached, nothing of Cilium's: {report:#}");
}
