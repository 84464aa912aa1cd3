//! `cargo xtask test --kernel 6.1|6.12|all`: the in-kernel suites on the kernels self-hosted nodes run,
//! Debian 12's 6.1 and its backported 6.12, each booted in qemu. The test binaries are built here as usual;
//! the VM mounts the workspace at its own path over 9p, so the binaries, the agent and the lab find each
//! other as on the host, and nextest runs them from the build's metadata (no cargo in the VM). The VM has no
//! network device: nothing it does leaves it.
//!
//! qemu runs under software emulation (TCG): on this machine kind (nested on AMD EPYC) every KVM CPU model
//! tried either failed to start (`-cpu host`/`max`: "failed to set MSR 0x10a") or hung at the kernel's
//! entry (kvm64, qemu64, EPYC), so the suites run as a named subset sized for emulation (`SUBSET`).
mod initramfs;
mod kernel;
mod rootfs;

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::util;

/// The suites the VMs run by default: the socket hooks (kernel), UDP, passive health, the tc packet tests,
/// north-south with real sockets, pins and restart, the agent as deploy/ runs it, and the node's preflight;
/// less the tests whose verdict is a pace set for real hardware, which software emulation (several times
/// slower) cannot keep:
/// the loads (north-south's three, 120 flows/s for 50 s among them; health's connects under load), a hold
/// that must still be running after 200 connects, a probe of 1,200 connects 5 ms apart that must
/// outlast an agent's restart (6 s under emulation, for the programs' verification), and 400 connects whose
/// client gives up after 300 ms, where every one to a live pod must succeed (one took longer on 6.12).
pub(crate) const SUBSET: &str = "(binary(kernel) | binary(udp) | binary(health) | binary(tc_packets) \
                                 | binary(north_south) | binary(pins) | binary(deployed) | binary(preflight)) \
                                 - (binary(north_south) & test(/^load::/)) \
                                 - test(=healthy_backends_are_never_held_under_load) \
                                 - test(=a_crashed_local_pod_costs_k_failed_connects_and_gets_traffic_back_after_the_hold) \
                                 - test(=an_agent_killed_and_restarted_loses_no_connection_and_cleanup_detaches_it) \
                                 - test(=a_trial_that_never_reports_keeps_the_backend_out_for_its_3_s_window)";

/// A VM's whole run may take this long before it is stopped (nextest's own timeouts end a hung test first).
const RUN_LIMIT: Duration = Duration::from_hours(3);

pub(crate) fn cache_root() -> PathBuf {
    util::cache_dir().join("vm")
}

/// One kernel's run.
struct Outcome {
    series: &'static str,
    package: String,
    uname: String,
    summary: String,
    passed: bool,
}

/// Run the subset (or `filter`, nextest's arguments) on each kernel `which` names (`6.1`, `6.12`, `all`).
pub(crate) fn run(which: &str, nextest_args: &[String]) -> anyhow::Result<()> {
    let series: Vec<&kernel::Series> = match which {
        "all" => kernel::SERIES.iter().collect(),
        name => vec![kernel::SERIES.iter().find(|s| s.name == name).with_context(|| {
            let names: Vec<&str> = kernel::SERIES.iter().map(|s| s.name).collect();
            format!("no Debian kernel {name:?}: choose one of {names:?} or all")
        })?],
    };
    let work = util::root();
    let dir = util::target_dir().join("vm");
    anyhow::ensure!(
        dir.starts_with(&work),
        "the VMs see only the workspace: put the target directory inside {}",
        work.display()
    );
    std::fs::create_dir_all(dir.join("bin"))?;
    util::run(util::cargo().args(["build", "--bins"]))?;
    to_file(
        util::cargo().args(["nextest", "list", "--list-type", "binaries-only", "--message-format", "json"]),
        &dir.join("binaries.json"),
    )?;
    to_file(util::cargo().args(["metadata", "--format-version", "1"]), &dir.join("cargo-metadata.json"))?;
    let nextest =
        util::output(Command::new("which").arg("cargo-nextest")).context("cargo-nextest not found")?;
    std::fs::copy(&nextest, dir.join("bin/cargo-nextest"))?;
    let rootfs = rootfs::ensure()?;
    let mut outcomes = Vec::new();
    for s in series {
        let k = kernel::ensure(s)?;
        outcomes.push(boot(&k, &rootfs, &work, &dir, nextest_args)?);
    }
    eprintln!(
        "\nkernel  package                                              uname -r                   result"
    );
    for o in &outcomes {
        eprintln!("{:<7} {:<52} {:<26} {}", o.series, o.package, o.uname, o.summary);
    }
    if outcomes.iter().any(|o| !o.passed) {
        bail!("the in-kernel subset failed on a Debian kernel (logs and junit in {})", dir.display());
    }
    Ok(())
}

fn to_file(cmd: &mut Command, path: &Path) -> anyhow::Result<()> {
    eprintln!("+ {} > {}", util::show(cmd), path.display());
    let status = cmd.stdout(File::create(path)?).status()?;
    anyhow::ensure!(status.success(), "{} failed ({status})", util::show(cmd));
    Ok(())
}

fn boot(
    k: &kernel::Kernel,
    rootfs: &Path,
    work: &Path,
    dir: &Path,
    nextest_args: &[String],
) -> anyhow::Result<Outcome> {
    let out = dir.join(k.series);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let guest = out.join("guest.sh");
    std::fs::write(&guest, guest_script(work, dir, &out, nextest_args))?;
    let initrd = out.join("initramfs.cpio");
    // The workspace, and the control plane `cargo xtask setup` built (target/k8s links into it), at their
    // own paths: the tests find both as on the host.
    let mut shares = vec![initramfs::Share { tag: "work", path: work.to_owned(), read_only: false }];
    let k8s = util::cache_dir().join("k8s");
    if k8s.exists() {
        shares.push(initramfs::Share { tag: "k8s", path: k8s, read_only: true });
    }
    initramfs::build(k, &shares, &guest, &initrd)?;
    let junit = util::target_dir().join("nextest/vm/junit.xml");
    let _ = std::fs::remove_file(&junit);
    eprintln!("vm: booting {} ({}) under qemu", k.release, k.package);
    let share = |path: &Path, tag: &str, ro: bool| {
        format!(
            "local,path={},mount_tag={tag},security_model=none{}",
            path.display(),
            if ro { ",readonly=on" } else { "" }
        )
    };
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "4096"])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&k.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off"])
        .arg("-virtfs")
        .arg(share(rootfs, "rootfs", true))
        .arg("-virtfs")
        .arg(share(&k.modules, "modules", true))
        .stdin(Stdio::null());
    for s in &shares {
        qemu.arg("-virtfs").arg(share(&s.path, s.tag, s.read_only));
    }
    let started = Instant::now();
    let mut vm = Vm(qemu.spawn().context("starting qemu-system-x86_64 (cargo xtask setup installs it)")?);
    loop {
        if vm.0.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > RUN_LIMIT {
            bail!("the {} VM ran over {} s and was stopped", k.series, RUN_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let read =
        |f: &str| std::fs::read_to_string(out.join(f)).map(|s| s.trim().to_owned()).unwrap_or_default();
    let status = read("status");
    let uname = read("uname");
    if uname.is_empty() {
        bail!("the {} VM stopped before its guest script ran (its console output is above)", k.series);
    }
    anyhow::ensure!(uname == k.release, "the VM booted {uname}, not {}", k.release);
    let _ = std::fs::copy(&junit, out.join("junit.xml"));
    let counts = std::fs::read_to_string(&junit).ok().and_then(|x| junit_counts(&x));
    let summary = match counts {
        Some((tests, failed)) => format!(
            "{} of {tests} passed in {} s{}",
            tests - failed,
            started.elapsed().as_secs(),
            if status == "0" { String::new() } else { format!(" (nextest exit {status})") }
        ),
        None => format!("no test results (nextest exit {status:?})"),
    };
    Ok(Outcome {
        series: k.series,
        package: k.package.clone(),
        uname,
        summary,
        passed: status == "0" && counts.is_some_and(|(t, f)| t > 0 && f == 0),
    })
}

/// qemu, stopped by its pid if this run ends first.
struct Vm(Child);

impl Drop for Vm {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// (tests, failures + errors) from nextest's JUnit report's first element.
fn junit_counts(xml: &str) -> Option<(u64, u64)> {
    let head = &xml[xml.find("<testsuites")?..];
    let head = &head[..head.find('>')?];
    let attr = |name: &str| -> Option<u64> {
        let at = head.find(&format!(" {name}=\""))? + name.len() + 3;
        head[at..].split('"').next()?.parse().ok()
    };
    Some((attr("tests")?, attr("failures")? + attr("errors").unwrap_or(0)))
}

/// The script the VM runs after its root is mounted: the mounts a node has (cgroup2, bpffs, tmpfs on /run and
/// /tmp), loopback up, the limits the agent's unit gives, then nextest on the subset; its exit code and the
/// kernel's release are left in `out`, then the VM powers off.
fn guest_script(work: &Path, dir: &Path, out: &Path, nextest_args: &[String]) -> String {
    let args = if nextest_args.is_empty() {
        format!("-E '{SUBSET}'")
    } else {
        nextest_args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect::<Vec<_>>().join(" ")
    };
    let (work, dir, out) = (work.display(), dir.display(), out.display());
    format!(
        r#"#!/bin/bash
# Written by cargo xtask test --kernel; run by the VM's /init.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
# An agent's start waited for 5 times as long (lb_testkit::ready_wait): verification alone takes ~6 s here.
export TIERLB_TEST_PATIENCE=5
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/netns
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
ip link set lo up
hostname tierlb-vm
# /dev/net/tun exists once tun is loaded: a node's udev loads it on the device's first open, the VM has no udev.
modprobe tun
ulimit -l unlimited
ulimit -n 1048576
uname -r > {out}/uname
echo "tierlb-vm: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {{print $2}}' /proc/meminfo) kB"
cd {work}
{dir}/bin/cargo-nextest nextest run --profile vm --no-fail-fast --hide-progress-bar --color never \
    --binaries-metadata {dir}/binaries.json --cargo-metadata {dir}/cargo-metadata.json \
    --workspace-remap {work} {args}
echo $? > {out}/status
sync
echo o > /proc/sysrq-trigger
sleep 60
"#
    )
}
