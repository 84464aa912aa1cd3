//! An interrupted benchmark cleans up after itself: SIGTERM (as Ctrl-C's SIGINT) in the middle of the on-node
//! rows, with the data path attached to its cgroup and the load running in its namespace, ends it with
//! 128 + 15 and leaves no network namespace or cgroup of its own behind. Runs as root.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// This run's names of process `pid` in `dir` (`tierlb-TAG-PID-N`).
fn left_in(dir: &Path, pid: u32) -> Vec<String> {
    let ours = lb_testkit::interrupt::ours_in(dir, pid);
    ours.iter().filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned())).collect()
}

#[test]
fn an_interrupted_bench_removes_its_namespace_and_cgroup() {
    let root = lb_testkit::sandbox::cgroup2_root().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tierlb-lab"))
        .args([
            "bench",
            "--tierlb",
            "/nonexistent/tierlb",
            "--on-node",
            "1",
            "--rounds",
            "1",
            "--seconds",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Until the rows run: the namespace and the cgroup made, and the cgroup holding a load client.
    let t0 = Instant::now();
    let loading = loop {
        let cgs = left_in(&root, pid);
        let busy = cgs.iter().any(|c| {
            !std::fs::read_to_string(root.join(c).join("cgroup.procs")).unwrap_or_default().trim().is_empty()
        });
        if !left_in(Path::new("/run/netns"), pid).is_empty() && busy {
            break true;
        }
        if t0.elapsed() > Duration::from_mins(1) || child.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(loading, "the bench never reached its rows: {stderr}");
    assert_eq!(out.status.code(), Some(128 + 15), "{stderr}");
    assert!(stderr.contains("interrupted (signal 15)"), "{stderr}");
    assert_eq!(left_in(Path::new("/run/netns"), pid), Vec::<String>::new(), "namespaces left");
    assert_eq!(left_in(&root, pid), Vec::<String>::new(), "cgroups left");
}
