//! The demo on the cluster in a box at the test's pace (`--quick`): real kube-apiserver, etcd and the
//! EndpointSlice controller, real kube-proxy on three nodes and tierlb's agent as deployed on three. The demo
//! exits 0 only if every act's verdict holds (each from measurements: kube-proxy's clients waited on a
//! roll where tierlb's failed at once, the story's fix left no failed request under either, the PDF shares
//! within 5 points of the simulator's, the monitoring check caught the stripped hints); its chart's data has
//! both halves' rows. Runs as root.
use std::process::Command;

#[test]
fn the_demo_on_the_real_control_plane_passes_every_act() {
    let out_dir = std::env::temp_dir().join(format!("tierlb-demo-test-{}", std::process::id()));
    let tierlb = lb_testkit::workspace_bin("tierlb", "lb-user");
    let out = Command::new(env!("CARGO_BIN_EXE_tierlb-lab"))
        .args(["demo", "--quick", "--tierlb"])
        .arg(&tierlb)
        .arg("--out-dir")
        .arg(&out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let chart = std::fs::read_to_string(out_dir.join("demo-timeline.json"));
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(
        out.status.success(),
        "the demo failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for act in ["-- 0.", "-- 1.", "-- 2.", "-- 3.", "-- 4."] {
        assert!(stdout.contains(act), "act {act} did not run");
    }
    assert_eq!(stdout.matches("verdict: PASS").count(), 5, "{stdout}");
    let acts: serde_json::Value = serde_json::from_str(&chart.unwrap()).unwrap();
    let rows: Vec<Vec<&str>> = acts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect())
        .collect();
    let six = ["kp-node-1", "kp-node-2", "kp-node-3", "tl-node-1", "tl-node-2", "tl-node-3"];
    assert_eq!(rows, [six, six], "two rolls charted, a row per node of both halves");
}
