//! The netlink attach, which kernels 6.1-6.5 take (no tcx), forced on this kernel (`--tc-attach netlink`):
//! every start of the agent replaces its filter in place with its own programs. Before, every start after
//! the first failed ("adding a clsact qdisc": the qdisc the first start added was there, and aya reports
//! that as a netlink EEXIST the agent took for an error), so the first start's programs stayed attached and
//! an upgrade's new code never was (a review had read the code as stacking a filter per start; run, it
//! does not get that far). And `--cleanup` removed none of them, so after an uninstall the old programs went
//! on translating from frozen maps.
use serde_json::json;

use super::lab::{Lab, NODE_1, TIERLB, sa, tc_filters};

/// The program ids of tierlb's filters on the node's uplink (`id N` of `tc filter show`), both directions.
fn ids(text: &str) -> Vec<u32> {
    text.lines()
        .filter(|l| l.contains("tc_ingress") || l.contains("tc_egress"))
        .filter_map(|l| l.split(" id ").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// tierlb's filters on the node's uplink, both directions: how many, and `tc filter show`'s text.
fn filters(lab: &Lab) -> (usize, String) {
    let mut text = String::new();
    for dir in ["ingress", "egress"] {
        text.push_str(&tc_filters(&lab.boxed.node.netns, "uplink", dir));
    }
    let n = text.lines().filter(|l| l.contains("tc_ingress") || l.contains("tc_egress")).count();
    (n, text)
}

#[test]
fn north_south_netlink_restarts_attach_their_own_programs_in_place_and_cleanup_removes_them() {
    let lab = Lab::new("ns-netlink", "Cluster", true);
    let to = sa(NODE_1, 30080);
    let mut before: Vec<u32> = Vec::new();
    for start in 1..=3 {
        let agent = lab.start_agent_with(&["--tc-attach", "netlink"]);
        let answers = lab.tcp(to, 6);
        assert!(answers.iter().all(Result::is_ok), "start {start}: {answers:?}");
        let (n, text) = filters(&lab);
        assert_eq!(n, 2, "start {start}: one filter per direction: {text}");
        assert!(text.contains("pref 65000"), "start {start}: at priority 65000: {text}");
        // This start's programs, not the last one's: an attach that failed for the filter in place (a
        // second filter at an automatic priority is refused here) would leave the old programs running,
        // an upgrade's new code never attached.
        let now = ids(&text);
        assert!(
            now.iter().all(|id| !before.contains(id)),
            "start {start}: programs {now:?} were {before:?}: {text}"
        );
        before = now;
        // What an operator sees: the devices the filters are on, and how they are attached (the programs are
        // pinned per device as the record; netlink filters leave no link to pin).
        let ns = &lab.status()[0]["north_south"];
        assert_eq!((&ns["attach"], &ns["devices"]), (&json!("netlink"), &json!(["uplink"])), "{ns}");
        // Killed: its filters stay (netlink filters outlive their process), as in a crash or a rolling update.
        agent.kill();
    }
    // A node port keeps working from the filters alone, with no agent.
    assert!(lab.tcp(to, 2).iter().all(Result::is_ok));
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let st = std::process::Command::new("ip")
        .args(["netns", "exec", lab.boxed.node.netns.name(), TIERLB, "agent", "--cleanup", "--tc-attach"])
        .args(["netlink", "--node", "node-1", "--bpffs", pins.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let (n, text) = filters(&lab);
    assert_eq!(n, 0, "--cleanup leaves no filter of ours: {text}");
    let left: Vec<_> = std::fs::read_dir(&pins)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|instance| std::fs::read_dir(instance.path()).into_iter().flatten().flatten())
        .map(|pin| pin.file_name())
        .filter(|name| name.to_string_lossy().starts_with("prog_tc_"))
        .collect();
    assert!(left.is_empty(), "--cleanup leaves no program pin of the filters: {left:?}");
}

/// The attach is chosen by what the kernel has, probed (`tc::kernel_has_tcx`), not by its version: with
/// `--tc-attach` left at auto, a kernel with tcx (6.6 and later) gets tcx links and no netlink filter, one
/// without (Debian 12's 6.1, run by `cargo xtask test --kernel 6.1`) gets the netlink filters at tierlb's
/// priority; the node port works either way.
#[test]
fn north_south_the_attach_is_the_one_the_kernel_has() {
    let has_tcx =
        aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0));
    assert_eq!(
        tierlb::datapath::tc::kernel_has_tcx(),
        has_tcx,
        "the probe disagrees with the kernel's release"
    );
    let lab = Lab::new("ns-attach", "Cluster", true);
    let agent = lab.start_agent();
    assert!(lab.tcp(sa(NODE_1, 30080), 4).iter().all(Result::is_ok));
    let (n, text) = filters(&lab);
    let ns = &lab.status()[0]["north_south"];
    assert_eq!(ns["attach"], json!(if has_tcx { "tcx" } else { "netlink" }), "{ns}");
    assert_eq!(ns["devices"], json!(["uplink"]), "{ns}");
    if has_tcx {
        assert_eq!(n, 0, "tcx links, no netlink filter: {text}");
    } else {
        assert_eq!(n, 2, "one netlink filter per direction: {text}");
        assert!(text.contains("pref 65000"), "at tierlb's priority: {text}");
    }
    agent.kill();
}
