//! The `--manifests` directory watch: only files the loader reads make the agent reload. A log, an editor's
//! swap file or a temporary file in the directory used to make it sync on every write. Needs root (the agent
//! loads its programs).
use std::{path::Path, time::Duration};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
};

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

#[test]
fn only_files_the_loader_reads_make_the_agent_reload() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let mut c = SimCluster::new("watch", Path::new(TIERLB), &lab).expect("sandbox");
    c.add_node("node-1", &[]).unwrap();
    let dir = c.manifests.path().to_owned();
    let before = c.syncs("node-1");
    // Many writes to files the loader skips: hidden, swap, temporary, other extensions.
    for i in 0..20 {
        for name in [".web.yaml.swp", "notes.txt", "web.yaml.tmp", ".agent.log"] {
            std::fs::write(dir.join(name), format!("line {i}\n")).unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // A manifest does: once its sync is logged, the skipped files' writes (200 ms of them, before it, with the
    // agent's 5 ms debounce) must have made none of their own. No sleep that could pass by waiting too little.
    let svc = Svc::new("web", "10.96.0.10".parse().unwrap(), 80, 8080);
    let ep = Ep::ready("10.244.1.10".parse().unwrap(), "node-1");
    write_service(&dir, &svc, &[ep]).unwrap();
    c.wait_synced(&[before]).expect("a manifest written makes the agent sync");
    assert_eq!(c.syncs("node-1"), before + 1, "writes to files the loader skips made the agent reload");
}
