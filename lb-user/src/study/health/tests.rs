//! The fluid model against the kernel's rule: for each case, the whole connects the model feeds to
//! `Health::fail` are the ones derived by hand from its assumption (a node's connects to a backend spread
//! evenly, from its pods in turn), and the same connects replayed on a fresh `lb_common::Health`, as the
//! connect programs and `sock_ops` would apply them, begin the same holds and give the same detection.
use std::{collections::BTreeMap, net::IpAddr};

use lb_common::{HEALTH_TRIAL_NS, Health, HealthVerdict, Held};

use crate::datapath::health::HealthSettings;

use super::{
    Crash, HealthParams,
    fluid::{Pod, ns, run},
};

const X: &str = "10.0.0.1";
const Y: &str = "10.0.0.2";

/// The node's tiers: the crashed X alone on the node, then X and the healthy Y (PreferSameNode's shape).
fn tiers() -> [Vec<IpAddr>; 3] {
    let (x, y) = (X.parse().unwrap(), Y.parse().unwrap());
    [vec![x], vec![x, y], vec![]]
}

/// What the model says of X: failed before the hold, held at, failed trials, failed after the hold, holds.
type Want = (f64, f64, u32, f64, u32);

struct Case {
    name: &'static str,
    /// K, the quorum, the node's client pods.
    failures: u32,
    clients: u32,
    pods: u32,
    crash: Crash,
    /// The node's requests per second, and the phase's length.
    rate: f64,
    duration: f64,
    /// The whole connects to X the fluid makes, (sent, pod), in the order they are reported.
    connects: Vec<(f64, Pod)>,
    /// The holds their failures begin, by index in `connects`; the others begin none.
    holds: &'static [(usize, Held)],
    want: Want,
}

/// `n` connects `1/rate` apart from the `first`-th (1-based) such time, from `pods` in turn.
fn turns(rate: f64, first: u32, n: u32, pods: &[Pod]) -> Vec<(f64, Pod)> {
    (0..n).map(|i| (f64::from(first + i) / rate, pods[i as usize % pods.len()])).collect()
}

fn cases() -> Vec<Case> {
    let after = |mut a: Vec<(f64, Pod)>, b: &[(f64, Pod)]| {
        a.extend_from_slice(b);
        a
    };
    vec![
        Case {
            // 10/s to X: the 3rd at 0.3 s holds it for the pod (fewer pods than the quorum); 5 s later the trial
            // (0.1 s after the hold ends) holds it for the pod again, 10 s; then 20 s.
            name: "one pod, quorum 2, refused: its own K hold it for itself, each failed trial again",
            failures: 3,
            clients: 2,
            pods: 1,
            crash: Crash::Process,
            rate: 10.0,
            duration: 20.0,
            connects: after(turns(10.0, 1, 3, &[1]), &[(5.4, 1), (15.5, 1)]),
            holds: &[(2, Held::Client), (3, Held::Client), (4, Held::Client)],
            want: (3.0, 0.3, 2, 2.0, 3),
        },
        Case {
            // The per-node rule: the same connects, each hold for every client; the node sees the same.
            name: "one pod, quorum 1: the same connects and figures, held for all",
            failures: 3,
            clients: 1,
            pods: 1,
            crash: Crash::Process,
            rate: 10.0,
            duration: 20.0,
            connects: after(turns(10.0, 1, 3, &[1]), &[(5.4, 1), (15.5, 1)]),
            holds: &[(2, Held::All), (3, Held::All), (4, Held::All)],
            want: (3.0, 0.3, 2, 2.0, 3),
        },
        Case {
            // Pods 1, 2, 1: K from two pods, held for all at 0.3 s. The trial (pod 2's turn, 5.4 s) holds it
            // for pod 2 alone (10 s); pod 1, at 5/s, fails 0.2 s later: the quorum, held for all, 20 s.
            name: "two pods, quorum 2, refused: K in turn hold it for all; a failed trial costs another pod's connect",
            failures: 3,
            clients: 2,
            pods: 2,
            crash: Crash::Process,
            rate: 10.0,
            duration: 20.0,
            connects: after(turns(10.0, 1, 3, &[1, 2]), &[(5.4, 2), (5.6, 1)]),
            holds: &[(2, Held::All), (3, Held::Client), (4, Held::All)],
            want: (3.0, 0.3, 1, 2.0, 3),
        },
        Case {
            name: "two pods, quorum 1: a failed trial holds it for all at once",
            failures: 3,
            clients: 1,
            pods: 2,
            crash: Crash::Process,
            rate: 10.0,
            duration: 20.0,
            connects: after(turns(10.0, 1, 3, &[1, 2]), &[(5.4, 2), (15.5, 1)]),
            holds: &[(2, Held::All), (3, Held::All), (4, Held::All)],
            want: (3.0, 0.3, 2, 2.0, 3),
        },
        Case {
            // Pod 1's first failure holds it for pod 1 (5 s); pod 2 alone sends to it, at 5/s: its failure at
            // 0.3 s holds it for all (10 s). The trial at 10.4 s (pod 1) for pod 1 (20 s), pod 2's at 10.6 s
            // for all (40 s).
            name: "two pods, K 1, quorum 2: one pod's failure holds it for that pod, the other's for all",
            failures: 1,
            clients: 2,
            pods: 2,
            crash: Crash::Process,
            rate: 10.0,
            duration: 12.0,
            connects: vec![(0.1, 1), (0.3, 2), (10.4, 1), (10.6, 2)],
            holds: &[(0, Held::Client), (1, Held::All), (2, Held::Client), (3, Held::All)],
            want: (2.0, 0.3, 1, 2.0, 4),
        },
        Case {
            // 7.5/s: the 3rd connect at 0.4 s is reported at 1.4 s; the 7 sent meanwhile hang and are reported
            // inside the hold (10.5 requests' worth before it). The trial at 6.4 + 1/7.5 s hangs alone (the
            // others skip it until it reports, 1 s later): held 10 s, then the next trial.
            name: "one pod, quorum 2, dead node: K timeouts, those sent meanwhile hang, each trial alone",
            failures: 3,
            clients: 2,
            pods: 1,
            crash: Crash::Node,
            rate: 7.5,
            duration: 20.0,
            connects: after(turns(7.5, 1, 10, &[1]), &[(6.4 + 1.0 / 7.5, 1), (17.0 + 5.0 / 7.5, 1)]),
            holds: &[(2, Held::Client), (10, Held::Client), (11, Held::Client)],
            want: (10.5, 1.4, 2, 2.0, 3),
        },
        Case {
            // As above with pods 1, 2, 1: held for all at 1.4 s. The trial (pod 1's turn) is reported at
            // 7.5333 s: held for pod 1; pod 2 (3.75/s) sends at 7.8 s, reported at 8.8 s: held for all; the
            // three pod 2 sent meanwhile hang too. After the hold: 1 + 3.75 x 1.2667 = 5.75.
            name: "two pods, quorum 2, dead node: the trial holds it for its pod, the other's hang a timeout more",
            failures: 3,
            clients: 2,
            pods: 2,
            crash: Crash::Node,
            rate: 7.5,
            duration: 20.0,
            connects: after(
                turns(7.5, 1, 10, &[1, 2]),
                &after(
                    vec![(6.4 + 1.0 / 7.5, 1)],
                    &(1..=4).map(|k| (7.4 + 1.0 / 7.5 + f64::from(k) / 3.75, 2)).collect::<Vec<_>>(),
                ),
            ),
            holds: &[(2, Held::All), (10, Held::Client), (11, Held::All)],
            want: (10.5, 1.4, 1, 5.75, 3),
        },
    ]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The kernel's rule applied to `connects` (sent, pod), each failure reported the crash's delay later: the
/// connect programs' verdict at each send (a half-open backend's first connect becomes the trial,
/// `start_trial`), `Health::fail` at each report. The hold each failure began, when every pod first skipped
/// the backend, the trials and the holds.
fn replay(
    params: &HealthParams,
    pods: u32,
    crash: Crash,
    connects: &[(f64, Pod)],
) -> (Vec<Held>, Option<f64>, u32, u32) {
    // The settings as the agent writes them, not through the model's own `HealthParams::config`.
    let settings =
        HealthSettings { failures: params.failures, clients: params.clients, ..HealthSettings::default() };
    let cfg = settings.config();
    let mut h = Health::default();
    // Sends and reports in time order; a connect's own report never comes before it.
    let mut events: Vec<(f64, bool, usize)> = (0..connects.len())
        .flat_map(|i| [(connects[i].0, false, i), (connects[i].0 + crash.report_delay_s(), true, i)])
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut held = vec![Held::No; connects.len()];
    let (mut held_at, mut trials) = (None, 0);
    for (t, report, i) in events {
        let (now, pod) = (ns(t), connects[i].1);
        if report {
            held[i] = h.fail(pod, crash.reason(), &cfg, now);
            if held_at.is_none() && (1..=u64::from(pods)).all(|p| h.verdict(p, now) == HealthVerdict::Skip) {
                held_at = Some(t);
            }
        } else {
            match h.verdict(pod, now) {
                HealthVerdict::Skip => panic!("a connect at {t} s from pod {pod} the kernel would skip"),
                HealthVerdict::Trial => {
                    h.trial_until_ns = now + HEALTH_TRIAL_NS;
                    trials += 1;
                }
                HealthVerdict::Use => {}
            }
        }
    }
    (held, held_at, trials, h.holds)
}

#[test]
fn the_fluid_feeds_the_kernels_rule_the_connects_it_assumes_and_reads_back_what_the_rule_decides() {
    for c in cases() {
        let params = HealthParams { failures: c.failures, clients: c.clients, ..HealthParams::default() };
        let crashed: BTreeMap<IpAddr, Crash> = [(X.parse().unwrap(), c.crash)].into();
        let (flow, fed) = run("n", &tiers(), &crashed, &params, c.pods, c.rate, Some(c.duration));
        let name = c.name;
        // The fluid's connects, as derived by hand.
        let sent: Vec<(f64, Pod)> = fed.iter().map(|f| (f.sent_s, f.pod)).collect();
        assert!(
            sent.len() == c.connects.len()
                && sent.iter().zip(&c.connects).all(|(a, b)| close(a.0, b.0) && a.1 == b.1),
            "{name}: the model fed {sent:?}, the derivation says {:?}",
            c.connects
        );
        // The kernel's rule on the same connects: the holds the derivation says, and the model's.
        let (held, held_at, trials, holds) = replay(&params, c.pods, c.crash, &c.connects);
        let mut want_held = vec![Held::No; c.connects.len()];
        for &(i, h) in c.holds {
            want_held[i] = h;
        }
        assert_eq!(held, want_held, "{name}: the kernel's rule");
        assert_eq!(fed.iter().map(|f| f.held).collect::<Vec<_>>(), held, "{name}: the model's holds");
        assert_eq!(fed.iter().filter(|f| f.trial).count(), trials as usize, "{name}: trials");
        // What the model reports is what the replay gives, and the figures derived by hand.
        let [d] = flow.detections.as_slice() else { panic!("{name}: one detection: {:?}", flow.detections) };
        let (before, at, failed_trials, after_hold, n_holds) = c.want;
        assert!(
            held_at.is_some_and(|t| close(t, at)),
            "{name}: the kernel held it for every pod at {held_at:?}"
        );
        assert_eq!((d.failed_trials, d.holds), (trials, holds), "{name}: {d:?}");
        assert_eq!((d.failed_trials, d.holds), (failed_trials, n_holds), "{name}: {d:?}");
        assert!(d.held_at_s.is_some_and(|t| close(t, at)), "{name}: {d:?}");
        assert!(
            close(d.failed_before_hold, before) && close(d.failed_after_hold, after_hold),
            "{name}: {d:?}"
        );
        assert_eq!(d.client_pods, c.pods, "{name}");
        // Every request to X was lost, and counted before or after the hold.
        let lost = if c.crash.hangs() { flow.hang } else { flow.failed } * c.rate * c.duration;
        assert!(close(lost, before + after_hold), "{name}: {lost} lost, {d:?}");
    }
}

#[test]
fn with_one_client_pod_the_quorum_changes_nothing_the_node_sees() {
    for crash in [Crash::Process, Crash::Node] {
        let crashed: BTreeMap<IpAddr, Crash> = [(X.parse().unwrap(), crash)].into();
        let flow = |clients| {
            let params = HealthParams { clients, ..HealthParams::default() };
            run("n", &tiers(), &crashed, &params, 1, 10.0, Some(60.0)).0
        };
        let (one, two) = (flow(1), flow(2));
        assert_eq!(one, two, "{crash:?}");
        assert!(one.detections[0].failed_trials >= 2, "{one:?}");
    }
}
