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

/// Each line on stdin gets one slice and one result line; between slices no connection is made; closing
/// stdin ends the client cleanly.
#[test]
fn the_paced_client_runs_one_slice_per_request_and_is_idle_between() {
    let ns = NetNs::new("paced").unwrap();
    let backend: SocketAddr = "10.244.0.10:8080".parse().unwrap();
    ns.add_address(backend.ip()).unwrap();
    let accepted = counting_backend(&ns, backend);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tierlb-lab"));
    confine(&mut cmd, None, Some(&ns)).unwrap();
    let mut child = cmd
        .args(["load", "--paced", "--target", &backend.to_string(), "--mode", "connect"])
        .args(["--threads", "1", "--seconds", "0.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
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
