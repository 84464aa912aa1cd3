//! `tierlb study`: every shipped scenario runs, each model's shares in every shipped scenario and phase are
//! the ones computed by hand from the proxy's rule (tests/study/expected.rs), passive health costs what the
//! kernel's rules say, and (in the kernel) tierlb's measured shares match the simulator's prediction.
#[path = "study/expected.rs"]
mod expected;
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
};
use tierlb::study::{self, ProxyModel, StudyResult};

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn run(name: &str) -> StudyResult {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/study/{name}.yaml"));
    study::run(&study::load(&path).unwrap())
}

fn get(r: &StudyResult, phase: usize, m: ProxyModel) -> &study::ModelResult {
    r.phases[phase].models.iter().find(|x| x.model == m).unwrap()
}

#[test]
fn every_shipped_scenario_runs_and_accounts_for_every_request() {
    let files = scenarios();
    assert!(files.len() >= 5, "{files:?}");
    for f in files {
        let r = study::run(&study::load(&f).unwrap());
        for p in &r.phases {
            for m in &p.models {
                let total: f64 = m.shares.values().sum::<f64>() + m.failed + m.hang;
                assert!((total - 1.0).abs() < 1e-9, "{}: {} {:?}: {total}", f.display(), p.phase, m.model);
            }
        }
        assert!(!study::table(&r).is_empty());
        assert!(tierlb::chart::study_chart(&r).unwrap().starts_with("<svg"));
    }
}

#[test]
fn every_model_routes_every_shipped_scenario_as_computed_by_hand() {
    let table = expected::all();
    let mut names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    let files: Vec<String> =
        scenarios().iter().map(|f| f.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, files, "every shipped scenario has hand-written expectations, and only those");
    for (name, phases) in table {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/study/{name}.yaml"));
        let sc = study::load(&path).unwrap();
        let r = study::run(&sc);
        assert_eq!(r.phases.len(), phases.len(), "{name}: phases");
        for (p, rows) in r.phases.iter().zip(&phases) {
            let models: Vec<ProxyModel> = rows.iter().map(|w| w.model).collect();
            assert_eq!(models, study::MODELS, "{name} {}: one row per model, in order", p.phase);
            for w in rows {
                let got = get(&r, r.phases.iter().position(|x| x.phase == p.phase).unwrap(), w.model);
                let at = format!("{name} / {} / {}", p.phase, w.model.name());
                assert_eq!(w.shares.len(), sc.endpoints.len(), "{at}: one share per endpoint");
                for (e, want) in sc.endpoints.iter().zip(w.shares) {
                    let have = got.shares[&e.ip.to_string()];
                    assert!(close(have, *want), "{at}: {} has {have}, expected {want}", e.ip);
                }
                for (what, have, want) in [
                    ("cross-node", got.cross_node, w.cross_node),
                    ("cross-zone", got.cross_zone, w.cross_zone),
                    ("failed", got.failed, w.failed),
                    ("hang", got.hang, w.hang),
                ] {
                    assert!(close(have, want), "{at}: {what} is {have}, expected {want}");
                }
            }
        }
    }
}

#[test]
fn the_cilium_labels_say_whether_service_topology_was_on() {
    let on = run("multizone");
    let off = run("service-topology-off");
    for m in study::MODELS.into_iter().filter(|m| m.is_cilium()) {
        assert_eq!(get(&on, 0, m).label, format!("{} (service topology on)", m.name()));
        assert_eq!(get(&off, 0, m).label, format!("{} (service topology off)", m.name()));
    }
    assert_eq!(study::MODELS.iter().filter(|m| m.is_cilium()).count(), 7);
    assert_eq!(get(&on, 0, ProxyModel::CalicoEbpf332).label, "calico-ebpf-3.32");
    assert_eq!(get(&on, 0, ProxyModel::KubeProxy).label, "kube-proxy-1.34-1.37");
    let json = serde_json::to_value(&on).unwrap();
    let names: Vec<&str> = json["phases"][0]["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "kube-proxy-1.34-1.37",
            "tierlb",
            "cilium-1.11-1.15",
            "cilium-1.16-1.17",
            "cilium-1.18.0",
            "cilium-1.18.1",
            "cilium-1.18.x-1.19",
            "cilium-1.20",
            "cilium-1.20+47961",
            "calico-ebpf-3.31.0-3.31.4",
            "calico-ebpf-3.31.5-3.31.7",
            "calico-ebpf-3.32",
        ]
    );
}

#[test]
fn study_models_is_a_table_to_pick_a_release_from_with_provenance_behind_a_flag() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tierlb")).args(args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // The table: Cilium's setting said above it, one row per model, short enough to read.
    let table = run(&["study", "--models"]);
    assert!(table.starts_with(study::CILIUM_SETTING), "{table}");
    assert!(table.contains("Cilium's default (false) every Cilium release ignores hints"), "{table}");
    let rows: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("MODEL "))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), study::MODELS.len(), "{table}");
    for (row, m) in rows.iter().zip(study::MODELS) {
        let i = m.info();
        assert!(
            row.starts_with(i.name) && row.contains(i.short.releases) && row.contains(i.short.errno),
            "{row}"
        );
    }
    assert!(table.lines().all(|l| l.len() <= 240), "no paragraph in the table:\n{table}");
    for words in ["stored", "the index"] {
        assert!(!table.contains(words), "{words:?} means nothing to a user:\n{table}");
    }
    // --provenance: under the table, one block per model.
    let text = run(&["study", "--models", "--provenance"]);
    assert!(!text.contains("stored") && !text.contains("the index"), "{text}");
    let text = &text[text.find("\n\nkube-proxy-1.34-1.37: ").expect(&text) + 2..];
    // One block per model: its first line unindented, then its indented lines.
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        match blocks.last_mut() {
            Some(b) if line.starts_with("  ") => {
                b.push('\n');
                b.push_str(line);
            }
            _ => blocks.push(line.to_owned()),
        }
    }

    let want = [
        ("kube-proxy-1.34-1.37", "pkg/proxy/topology.go"),
        ("tierlb", "first_live_tier"),
        ("cilium-1.11-1.15", "pkg/k8s/service_cache.go"),
        ("cilium-1.16-1.17", "cilium#32678"),
        ("cilium-1.18.0", "cilium#41022"),
        ("cilium-1.18.1", "#41116"),
        ("cilium-1.18.x-1.19", "#42708"),
        ("cilium-1.20", "cilium#44771"),
        ("cilium-1.20+47961", "cilium/cilium#47961"),
        ("calico-ebpf-3.31.0-3.31.4", "syncer.go:607-608 at v3.31.0"),
        ("calico-ebpf-3.31.5-3.31.7", "go.mod:117"),
        ("calico-ebpf-3.32", "projectcalico#11751"),
    ];
    assert_eq!(blocks.len(), want.len(), "{text}");
    for ((name, source), block) in want.iter().zip(&blocks) {
        assert!(block.starts_with(&format!("{name}: ")), "{block}");
        for part in ["\n  rule: ", "\n  empty set: ", "\n  errno: ", "\n  source: ", "\n  code read: "] {
            assert!(block.contains(part), "{name} lacks {part:?}: {block}");
        }
        assert!(block.split("\n  source: ").nth(1).unwrap().contains(source), "{name}: {block}");
    }
    assert!(text.contains("errno: EHOSTUNREACH"), "{text}");
    assert!(text.contains("errno: EPERM"), "{text}");
    // A range whose code was not read at a tag says so on its first line.
    assert!(
        text.contains(
            "cilium-1.16-1.17: Cilium 1.16.0-1.17.x kube-proxy replacement (socket LB) [unverified]"
        )
    );
    assert!(
        text.lines().any(|l| l.starts_with("calico-ebpf-3.31.0-3.31.4: ") && !l.contains("[unverified]"))
    );
    // kube-proxy's model was checked against kube-proxy itself at four releases (kube_proxy_releases.rs).
    assert!(
        text.lines().any(|l| l.starts_with("kube-proxy-1.34-1.37: ") && !l.contains("[unverified]")),
        "{text}"
    );
    assert!(text.contains("hang (DROP)"), "{text}");
    let json = std::process::Command::new(env!("CARGO_BIN_EXE_tierlb"))
        .args(["study", "--models", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), study::MODELS.len());
    assert!(v.as_array().unwrap().iter().all(|m| m["source"].as_str().is_some_and(|s| !s.is_empty())));
}

/// Whether two models route a phase alike: the same share per endpoint, failed and hanging.
fn same_outcome(a: &study::ModelResult, b: &study::ModelResult) -> bool {
    a.shares.len() == b.shares.len()
        && a.shares.iter().all(|(ip, s)| b.shares.get(ip).is_some_and(|t| close(*s, *t)))
        && close(a.failed, b.failed)
        && close(a.hang, b.hang)
}

#[test]
fn every_pair_of_adjacent_models_routes_some_shipped_phase_differently() {
    // A model per behaviour: two neighbours in MODELS that no shipped scenario tells apart are one behaviour
    // (or a scenario is missing), and the study would not show the change it claims.
    let studies: Vec<StudyResult> =
        scenarios().iter().map(|f| study::run(&study::load(f).unwrap())).collect();
    for pair in study::MODELS.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let told_apart =
            studies.iter().any(|r| (0..r.phases.len()).any(|i| !same_outcome(get(r, i, a), get(r, i, b))));
        assert!(told_apart, "no shipped scenario and phase tells {} from {}", a.name(), b.name());
    }
}

/// The scenarios in README's study table: the story first, then the others by file name.
fn readme_scenarios() -> Vec<study::Scenario> {
    let mut files = scenarios();
    files.sort_by_key(|f| (f.file_stem().unwrap() != "story", f.clone()));
    files.iter().map(|f| study::load(f).unwrap()).collect()
}

#[test]
fn readmes_study_table_is_what_the_study_computes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- study-table:begin -->\n", "<!-- study-table:end -->");
    let start = readme.find(begin).expect("README marks its study table's start") + begin.len();
    let stop = start + readme[start..].find(end).expect("README marks its study table's end");
    let fresh = study::markdown_table(&readme_scenarios());
    assert!(
        readme[start..stop] == fresh,
        "README's study table is stale; paste this between the markers:\n{begin}{fresh}{end}"
    );
}

#[test]
fn the_cli_docs_mark_unverified_the_models_study_models_marks() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    for m in study::MODELS {
        let i = m.info();
        let row = doc.lines().find(|l| l.starts_with(&format!("| `{}` |", i.name)));
        let row = row.unwrap_or_else(|| panic!("docs/cli.md lists no {}", i.name));
        assert_eq!(row.contains("[unverified]"), !i.verified, "docs/cli.md: {row}");
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// (node, failed before the hold, held at, failed trials) of tierlb's detections.
fn detections(m: &study::ModelResult) -> Vec<(&str, f64, Option<f64>, u32)> {
    m.detections
        .iter()
        .map(|d| (d.node.as_str(), d.failed_before_hold, d.held_at_s, d.failed_trials))
        .collect()
}

fn same_detections(got: &[(&str, f64, Option<f64>, u32)], want: &[(&str, f64, f64, u32)]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.0 == w.0 && close(g.1, w.1) && g.2.is_some_and(|t| close(t, w.2)) && g.3 == w.3)
}

#[test]
fn a_crashed_process_costs_tierlb_k_refused_connects_per_client_node_and_a_failed_trial_per_hold() {
    // story: 100 requests/s for 30 s (3000), node-1 50/s, node-2 30/s, node-3 20/s; K=3, holds 5 s, 10 s, 20 s.
    // node-1 sends all to its own pod (node tier): refused at 0, 0.02, 0.04 -> the 3rd at 0.06 s holds it;
    // trials when holds end: 5.06 + 0.02 = 5.08 s, then 15.08 + 0.02 = 15.10 s; the next hold ends at 35.10.
    // node-2 has no topology (cluster set, 15/s to each pod): 3rd refused at 0.2 s; trials at 5.2 + 1/15 and
    // 15.27 + 1/15 s. node-3 never sends to node-1's pod. Lost: 2 x (3 + 2) = 10 of 3000.
    let story = run("story");
    let t = get(&story, 1, ProxyModel::Tierlb);
    assert_eq!(t.label, "tierlb (passive health, K=3, 2 clients)");
    assert!(close(t.failed, 10.0 / 3000.0) && t.hang == 0.0, "{t:?}");
    assert!(close(t.shares["10.244.3.21"], 2990.0 / 3000.0), "{t:?}");
    // Off-node: node-1's 1500 - 5 and node-2's 900 - 5, all to node-3's pod.
    assert!(close(t.cross_node, 2390.0 / 3000.0), "{t:?}");
    let d = detections(t);
    assert!(same_detections(&d, &[("node-1", 3.0, 0.06, 2), ("node-2", 3.0, 0.2, 2)]), "{d:?}");
    assert_eq!(story.phases[1].requests, Some(3000.0));
    let text = study::table(&story);
    assert!(
        text.contains("K=3")
            && text.contains("0.3%")
            && text.contains("node-2 (1 client pod): 3 connects failed")
            && text.contains(
                "then 2 failed trials as holds ended in 30 s: 2 connects failed after the hold, 3 holds"
            ),
        "{text}"
    );
}

#[test]
fn a_lost_node_hangs_the_connects_sent_until_the_syn_timeout_reports_the_kth() {
    // node-lost: 60 requests/s for 40 s (2400), node-1 and node-2 30/s each, 10/s to each of three pods.
    // The 3rd connect to node-3's pod leaves at 0.3 s and is reported at 1.3 s: 13 connects hung meanwhile.
    // Holds 5, 10, 20 s, each trial 0.1 s after the hold ends and reported 1 s later: trials at 6.4, 17.5 and
    // 38.6 s (the next hold starts at 39.6). Hung: 2 x (13 + 3) = 32 of 2400.
    let lost = run("node-lost");
    let t = get(&lost, 1, ProxyModel::Tierlb);
    assert!(close(t.hang, 32.0 / 2400.0) && t.failed == 0.0, "{t:?}");
    assert!(close(t.shares["10.244.1.7"], (2400.0 - 32.0) / 2.0 / 2400.0), "{t:?}");
    let d = detections(t);
    assert!(same_detections(&d, &[("node-1", 13.0, 1.3, 3), ("node-2", 13.0, 1.3, 3)]), "{d:?}");
    // Everybody else keeps sending a third of the requests into the void until the node is NotReady.
    for m in study::MODELS.into_iter().filter(|m| *m != ProxyModel::Tierlb) {
        let r = get(&lost, 1, m);
        assert!(close(r.hang, 1.0 / 3.0) && r.failed == 0.0, "{m:?}: {r:?}");
    }
}

#[test]
fn without_a_duration_the_shares_are_after_detection_and_the_cost_is_reported_apart() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study/story.yaml");
    let mut sc = study::load(&path).unwrap();
    sc.phases[0].duration = None;
    let r = study::run(&sc);
    let t = get(&r, 1, ProxyModel::Tierlb);
    assert!(t.failed == 0.0 && close(t.shares["10.244.3.21"], 1.0), "{t:?}");
    let d = detections(t);
    assert!(same_detections(&d, &[("node-1", 3.0, 0.06, 0), ("node-2", 3.0, 0.2, 0)]), "{d:?}");
    assert_eq!(r.phases[1].requests, None);
    assert!(study::table(&r).contains("the phase has no duration"));
}

#[test]
fn holds_stop_doubling_at_the_max_hold() {
    // story with holds capped at 5 s: node-1's trials at 5.08, 10.10, 15.12, 20.14, 25.16 s (each 0.02 s after
    // the hold ends); node-2's at 5.2 + 1/15 and then every 5 + 1/15 s: 25.53 s is its 5th. Lost 2 x (3 + 5).
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study/story.yaml");
    let text = std::fs::read_to_string(path).unwrap() + "health: {hold: 5s, maxHold: 5s}\n";
    let r = study::run(&serde_saphyr::from_str_with_options(&text, tierlb::source::yaml::options()).unwrap());
    assert_eq!((r.health.failures, r.health.hold_s, r.health.max_hold_s), (3, 5.0, 5.0));
    let t = get(&r, 1, ProxyModel::Tierlb);
    let d = detections(t);
    assert!(same_detections(&d, &[("node-1", 3.0, 0.06, 5), ("node-2", 3.0, 0.2, 5)]), "{d:?}");
    assert!(close(t.failed, 16.0 / 3000.0), "{t:?}");
}

/// (node, client pods, failed before the hold, held at, failed trials, failed after the hold, holds).
type Cost<'a> = (&'a str, u32, f64, f64, u32, f64, u32);

fn same_costs(m: &study::ModelResult, want: &[Cost<'_>]) -> bool {
    m.detections.len() == want.len()
        && m.detections.iter().zip(want).all(|(d, w)| {
            (d.node.as_str(), d.client_pods, d.failed_trials, d.holds) == (w.0, w.1, w.4, w.6)
                && close(d.failed_before_hold, w.2)
                && d.held_at_s.is_some_and(|t| close(t, w.3))
                && close(d.failed_after_hold, w.5)
        })
}

#[test]
fn with_two_client_pods_and_the_quorum_each_failed_trial_costs_another_pods_connect_too() {
    // story, node-1's 50/s from two pods (25/s each, pods taking turns): the 3rd refused connect (0.06 s)
    // comes from both, held for all. The trial at 5.08 s holds it for its pod only (10 s); the other pod's next
    // connect, 0.04 s later, fails and holds it for all (20 s); the same at 25.14 and 25.18 s (then 40 s and
    // 80 s): 2 trials, 4 lost after the hold, 5 holds. node-2 (one pod) as before. 12 of 3000 lost.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study/story.yaml");
    let text =
        std::fs::read_to_string(path).unwrap().replace("{name: node-1,", "{name: node-1, clientPods: 2,");
    let sc: study::Scenario =
        serde_saphyr::from_str_with_options(&text, tierlb::source::yaml::options()).unwrap();
    assert_eq!(sc.nodes.iter().map(|n| n.client_pods).collect::<Vec<_>>(), [2, 1, 1]);
    let r = study::run(&sc);
    let t = get(&r, 1, ProxyModel::Tierlb);
    let d = &t.detections;
    let node_2 = ("node-2", 1, 3.0, 0.2, 2, 2.0, 3);
    assert!(same_costs(t, &[("node-1", 2, 3.0, 0.06, 2, 4.0, 5), node_2]), "{d:?}");
    assert!(close(t.failed, 12.0 / 3000.0), "{t:?}");
    assert!(study::table(&r).contains("node-1 (2 client pods): 3 connects failed"), "{}", study::table(&r));
    // The per-node rule (--health-clients=1): each failed trial holds it for all at once (5 s, 10 s, 20 s).
    let mut per_node = sc.clone();
    per_node.health.clients = 1;
    let r = study::run(&per_node);
    let t = get(&r, 1, ProxyModel::Tierlb);
    assert_eq!(t.label, "tierlb (passive health, K=3, 1 client)");
    assert!(same_costs(t, &[("node-1", 2, 3.0, 0.06, 2, 2.0, 3), node_2]), "{:?}", t.detections);
    assert!(close(t.failed, 10.0 / 3000.0), "{t:?}");
}

#[test]
fn a_scenarios_client_pods_and_quorum_are_read_and_checked() {
    let yaml = |nodes: &str, health: &str| {
        format!("name: s\nnodes: [{nodes}]\nservice: {{}}\nendpoints: [{{ip: 10.0.1.1, node: n1}}]\n{health}")
    };
    // As `study::load` reads a file: the field and the error.
    let load = |text: &str| {
        tierlb::source::yaml::typed::<study::Scenario>(text).map_err(|(field, e)| format!("{field}: {e}"))
    };
    let sc = load(&yaml("{name: n1, clients: 1}", "")).unwrap();
    assert_eq!((sc.nodes[0].client_pods, sc.health.clients), (1, 2), "one pod, the agent's quorum");
    let sc = load(&yaml("{name: n1, clients: 1, clientPods: 3}", "health: {clients: 1}")).unwrap();
    assert_eq!((sc.nodes[0].client_pods, sc.health.clients), (3, 1));
    let err = load(&yaml("{name: n1, clients: 1, clientPods: 0}", "")).unwrap_err();
    assert!(err.contains("clientPods") && err.contains("one client pod or more"), "{err}");
    let err = load(&yaml("{name: n1, clients: 1}", "health: {clients: 3}")).unwrap_err();
    assert!(err.contains("clients") && err.contains("1 or 2"), "{err}");
}

#[test]
fn with_passive_health_off_tierlb_loses_what_kube_proxy_loses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study/story.yaml");
    let mut sc = study::load(&path).unwrap();
    sc.health.failures = 0;
    let r = study::run(&sc);
    let t = get(&r, 1, ProxyModel::Tierlb);
    assert_eq!(t.label, "tierlb (passive health off)");
    // node-1's half to its dead pod, node-2's 30% split over both pods.
    assert!(close(t.failed, 0.65) && t.detections.is_empty(), "{t:?}");
}

#[test]
fn under_a_local_policy_the_panic_threshold_keeps_sending_to_the_held_local_pod() {
    // Local policy: node-1's only tier is its own pod. Once held, every backend of every tier is held, so the
    // connects go to it anyway (and fail): passive health cannot save node-1's clients, and tierlb says so.
    // 20 requests/s (10/s per node) for 10 s: held at 0.3 s, trial at 5.3 + 0.1 s, next hold ends at 15.4 s.
    let yaml = "name: local\nnodes: [{name: n1, clients: 1}, {name: n2, clients: 1}]\n\
        service: {internalTrafficPolicy: Local}\n\
        endpoints: [{ip: 10.0.1.1, node: n1}, {ip: 10.0.2.1, node: n2}]\nrequestsPerSecond: 20\n\
        phases: [{name: crash, duration: 10s, set: [{ip: 10.0.1.1, crash: process}]}]\n";
    let sc: study::Scenario =
        serde_saphyr::from_str_with_options(yaml, tierlb::source::yaml::options()).unwrap();
    let r = study::run(&sc);
    let t = get(&r, 1, ProxyModel::Tierlb);
    assert!(close(t.failed, 0.5) && close(t.shares["10.0.2.1"], 0.5), "{t:?}");
    let d = detections(t);
    assert!(same_detections(&d, &[("n1", 3.0, 0.3, 1)]), "{d:?}");
    assert!(close(get(&r, 1, ProxyModel::KubeProxy).failed, 0.5));
}

/// Build the scenario's cluster for real (one agent per node, one pod per endpoint), send each node's share
/// of connects through the VIP, and compare tierlb's measured shares with the simulator's.
fn measure(name: &str, connects: usize) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/study/{name}.yaml"));
    let sc = study::load(&path).unwrap();
    let predicted = study::run(&sc).phases[0]
        .models
        .iter()
        .find(|m| m.model == ProxyModel::Tierlb)
        .unwrap()
        .shares
        .clone();
    let model = study::model_of(&sc, &sc.endpoints);
    let mut c = SimCluster::new(
        "study",
        Path::new(env!("CARGO_BIN_EXE_tierlb")),
        &lb_testkit::workspace_bin("tierlb-lab", "lb-lab"),
    )
    .unwrap();
    let slice = model.slices.values().next().unwrap();
    let mut eps = Vec::new();
    for e in &slice.endpoints {
        let ip = e.address.unwrap();
        c.add_pod(SocketAddr::new(ip, 8080), &ip.to_string()).unwrap();
        let mut ep = Ep::ready(ip, e.node_name.as_deref().unwrap());
        let names =
            |v: Option<&tierlb::model::NameList>| v.map(|v| v.iter().map(ToString::to_string).collect());
        ep.zone = e.zone.as_deref().map(str::to_owned);
        ep.for_nodes = names(e.hints.for_nodes());
        ep.for_zones = names(e.hints.for_zones());
        eps.push(ep);
    }
    let vip: IpAddr = "10.96.0.99".parse().unwrap();
    let mut svc = Svc::new("svc", vip, 80, 8080);
    svc.traffic_distribution.clone_from(&sc.service.traffic_distribution);
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    for n in &sc.nodes {
        let mut args = vec![];
        if let Some(z) = &n.zone {
            args.extend(["--zone", z.as_str()]);
        }
        c.add_node(&n.name, &args).unwrap();
    }
    let total: f64 = sc.nodes.iter().map(|n| n.clients).sum();
    let mut counts: BTreeMap<String, f64> = predicted.keys().map(|k| (k.clone(), 0.0)).collect();
    let mut sent = 0.0;
    for n in &sc.nodes {
        #[expect(clippy::cast_sign_loss, reason = "a node's share of the connects, never negative")]
        let k = (connects as f64 * n.clients / total).round() as usize;
        let r = c.probe(&n.name, SocketAddr::new(vip, 80), k, Duration::ZERO).unwrap();
        assert_eq!(r.failures(), 0);
        for (b, x) in r.by_backend() {
            *counts.get_mut(&b).unwrap() += x as f64;
        }
        sent += k as f64;
    }
    let measured = counts.into_iter().map(|(k, v)| (k, v / sent)).collect();
    (predicted, measured)
}

#[test]
fn tierlbs_measured_shares_match_the_simulator_within_five_points() {
    for (name, connects) in [("story", 1000), ("multizone", 800)] {
        let (predicted, measured) = measure(name, connects);
        eprintln!("{name}: predicted {predicted:?}\n{name}: measured  {measured:?}");
        for (ip, p) in &predicted {
            let m = measured[ip];
            assert!((p - m).abs() < 0.05, "{name} {ip}: predicted {p:.3}, measured {m:.3}");
        }
    }
}
