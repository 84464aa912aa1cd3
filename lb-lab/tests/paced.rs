//! The paced load client, as the bench drives it (`tierlb-lab load --paced`): it runs one slice per line it
//! reads and is idle in between, which is what lets the bench alternate direct and tierlb slice by slice.
//! Runs as root: a private netns with only `lo`.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use lb_lab::bench::LoadResult;
use lb_testkit::sandbox::{NetNs, confine};

/// A listener in `ns` on `addr` that counts the connections it accepts.
fn counting_backend(ns: &NetNs, addr: SocketAddr) -> Arc<AtomicU64> {
    let accepted = Arc::new(AtomicU64::new(0));
    let (file, n) = (ns.file().try_clone().unwrap(), accepted.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    // Detached: it ends with the test process.
    std::thread::spawn(move || {
        nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let listener = TcpListener::bind(addr).unwrap();
        tx.send(()).unwrap();
        for s in listener.incoming() {
            drop(s);
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    rx.recv().unwrap();
    accepted
}

/// `tierlb-lab load --paced` in `ns` against `backend` (connect mode) with `args`: the child, its stdin and
/// its stdout.
fn paced_client(
    ns: &NetNs,
    backend: SocketAddr,
    args: &[&str],
) -> (std::process::Child, std::process::ChildStdin, BufReader<std::process::ChildStdout>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tierlb-lab"));
    confine(&mut cmd, None, Some(ns)).unwrap();
    let mut child = cmd
        .args(["load", "--paced", "--target", &backend.to_string(), "--mode", "connect"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdin, stdout)
}

/// Each line on stdin gets one slice and one result line; between slices no connection is made; closing
/// stdin ends the client cleanly.
#[test]
fn the_paced_client_runs_one_slice_per_request_and_is_idle_between() {
    let ns = NetNs::new("paced").unwrap();
    let backend: SocketAddr = "10.244.0.10:8080".parse().unwrap();
    ns.add_address(backend.ip()).unwrap();
    let accepted = counting_backend(&ns, backend);
    let (mut child, mut stdin, mut stdout) =
        paced_client(&ns, backend, &["--threads", "1", "--seconds", "0.1"]);
    for slice in 0..3 {
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let r: LoadResult = serde_json::from_str(&line).unwrap();
        assert!(r.ops > 10 && r.errors == 0 && r.p50_us > 0.0, "slice {slice}: {r:?}");
        assert!(r.secs >= 0.1 && r.secs < 1.0, "slice {slice} lasts its length: {r:?}");
        // Idle until asked again: the backend sees no connection meanwhile.
        std::thread::sleep(Duration::from_millis(50));
        let before = accepted.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(accepted.load(Ordering::Relaxed), before, "slice {slice}: connects while idle");
    }
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(rest.is_empty(), "no slice without a request: {rest:?}");
}

/// The CPUs a task may run on and the one it last ran on (`/proc/PID/task/TID/{status,stat}`).
fn task_cpus(pid: u32) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let (Ok(status), Ok(stat)) =
            (std::fs::read_to_string(dir.join("status")), std::fs::read_to_string(dir.join("stat")))
        else {
            continue; // the task ended meanwhile
        };
        let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim();
        // Field 39 of stat, `processor`; counted after the command name's closing parenthesis (field 2).
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let last = after.split(' ').nth(39 - 3).unwrap().parse().unwrap();
        out.push((allowed.to_owned(), last));
    }
    out
}

/// `--cpu N` holds every thread of the client to CPU N, the main one and the load threads (what keeps a
/// connect's latency to one mode in the bench): read from the kernel during a slice.
#[test]
fn the_load_client_runs_only_on_the_cpu_it_is_given() {
    let allowed = lb_lab::bench::allowed_cpus();
    // With one CPU every task is on it whatever the client does: nothing would be shown.
    assert!(allowed.len() >= 2, "this test needs two CPUs, the process may use {allowed:?}");
    let cpu = *allowed.last().unwrap();
    let ns = NetNs::new("paced-cpu").unwrap();
    let backend: SocketAddr = "10.244.0.10:8080".parse().unwrap();
    ns.add_address(backend.ip()).unwrap();
    let _accepted = counting_backend(&ns, backend);
    let (mut child, mut stdin, mut stdout) =
        paced_client(&ns, backend, &["--threads", "2", "--seconds", "1", "--cpu", &cpu.to_string()]);
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    // The main thread and the two load threads, mid-slice (the client may start late on a busy machine).
    let deadline = std::time::Instant::now() + Duration::from_millis(900);
    let mut tasks = task_cpus(child.id());
    while tasks.len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        tasks = task_cpus(child.id());
    }
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let r: LoadResult = serde_json::from_str(&line).unwrap();
    assert!(r.ops > 10 && r.errors == 0, "{r:?}");
    assert!(tasks.len() >= 3, "{tasks:?}");
    for (allowed, last) in &tasks {
        assert_eq!((allowed.as_str(), *last), (cpu.to_string().as_str(), cpu), "every task: {tasks:?}");
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
}
