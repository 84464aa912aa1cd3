//! The demo's chart: what each node's booking clients saw in the acts that run clients over time (the two
//! rolls and the pod crash), one panel an act and one row a node. The demo records what the chart needs
//! ([`Act`]: per node, 250 ms bins of requests, answered and served off-node, when each failure happened, the
//! node's windows) and writes it next to the chart as `demo-timeline.json`, so the chart can be redrawn and
//! tested without running the demo again (the render test draws one recorded run, `fixtures/`).
use serde::{Deserialize, Serialize};
use tierlb::chart::{self, ChartError, Panel, Row, Series, Span, Timeline, okabe_ito};

use lb_testkit::probe::Report;

/// The width of a bin, in seconds.
const BIN_S: f64 = 0.25;

/// One act as the chart draws it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Act {
    /// The panel's title (the act and its Service settings).
    pub(crate) title: String,
    /// The act's verdict, under the title.
    pub(crate) verdict: String,
    /// One entry per node, in [`NODES`] order.
    pub(crate) nodes: Vec<NodeSeen>,
}

/// What one node's clients saw in an act; times in seconds from the clients' start.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct NodeSeen {
    /// The node's name.
    pub(crate) node: String,
    /// The node's windows (its pod rolling, down, held), shaded.
    pub(crate) windows: Vec<Window>,
    /// The requests in consecutive bins from 0.
    pub(crate) bins: Vec<Bin>,
    /// When each failed request was sent.
    pub(crate) failed_at: Vec<f64>,
}

/// A window of an act on one node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Window {
    /// Its start, seconds from the clients' start.
    pub(crate) from: f64,
    /// Its end.
    pub(crate) to: f64,
    /// What happens in it, a word or two.
    pub(crate) label: String,
}

/// The requests a node's clients sent in one bin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Bin {
    /// Sent in the bin.
    pub(crate) sent: u32,
    /// Answered (by any node).
    pub(crate) answered: u32,
    /// Answered by another node's pod.
    pub(crate) off_node: u32,
    /// Waited `WAITED_MS` or more, answered late or not at all (a dropped SYN and its retransmissions).
    #[serde(default)]
    pub(crate) waited: u32,
}

/// A request that took this long waited on the network rather than being answered or refused (both take
/// about a millisecond in the demo's namespaces).
pub(crate) const WAITED_MS: f64 = 500.0;

/// An act's record from its clients' reports, one per node of `names` in that order, and each node's windows;
/// `own(node, backend)` says whether a backend (a pod's name) runs on the node.
pub(crate) fn record(
    title: &str,
    verdict: String,
    names: &[String],
    reports: &[Report],
    windows: &[Vec<Window>],
    own: &dyn Fn(&str, &str) -> bool,
) -> Act {
    let nodes = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut bins: Vec<Bin> = Vec::new();
            let mut failed_at = Vec::new();
            for a in &r.attempts {
                #[expect(clippy::cast_sign_loss, reason = "clamped at 0.0 first")]
                let k = (a.t_ms / 1e3 / BIN_S).floor().max(0.0) as usize;
                if bins.len() <= k {
                    bins.resize(k + 1, Bin::default());
                }
                bins[k].sent += 1;
                if a.error.is_none() {
                    bins[k].answered += 1;
                } else {
                    // Rounded to the millisecond: the chart cannot show finer, and the record stays small.
                    failed_at.push((a.t_ms).round() / 1e3);
                }
                if a.ms >= WAITED_MS {
                    bins[k].waited += 1;
                }
                if a.backend.as_deref().is_some_and(|b| !own(&names[i], b)) {
                    bins[k].off_node += 1;
                }
            }
            NodeSeen {
                node: names[i].clone(),
                windows: windows.get(i).cloned().unwrap_or_default(),
                bins,
                failed_at,
            }
        })
        .collect();
    Act { title: title.to_owned(), verdict, nodes }
}

/// The demo's chart of `acts`, one panel each.
pub(crate) fn timeline_chart(acts: &[Act]) -> Result<String, ChartError> {
    let panels = acts.iter().map(panel).collect();
    chart::timeline_chart(&Timeline {
        title: "tierlb demo: what each node's booking clients saw".into(),
        subtitle: subtitle(acts).into(),
        x_desc: "time since the clients started (s)".into(),
        y_desc: "share of the node's requests (%)".into(),
        series: vec![
            Series { name: "answered".into(), colour: okabe_ito::BLUE, dashed: false },
            Series { name: "answered by another node".into(), colour: okabe_ito::ORANGE, dashed: true },
            Series { name: "waited 0.5 s or more".into(), colour: okabe_ito::PURPLE, dashed: false },
        ],
        marks: ("failed request".into(), okabe_ito::VERMILLION),
        spans: "the node's pod rolling, down or held".into(),
        panels,
    })
}

/// What the chart's nodes are: the cluster in a box's two halves, or the simulated demo's three nodes.
fn subtitle(acts: &[Act]) -> &'static str {
    if acts.iter().flat_map(|a| &a.nodes).any(|n| n.node.starts_with("kp-node-")) {
        "one cluster: real kube-proxy (iptables) on kp-node-*, tierlb on tl-node-*; each a request every 50 ms \
         (5 s timeout); lines per 250 ms bin"
    } else {
        "three simulated nodes, each a request every 50 ms (5 s timeout); lines per 250 ms bin"
    }
}

/// An act's panel: per node, the answered and off-node shares at the middle of each bin.
fn panel(act: &Act) -> Panel {
    let x_max = act.nodes.iter().map(|n| n.bins.len() as f64 * BIN_S).fold(BIN_S, f64::max);
    let rows = act
        .nodes
        .iter()
        .map(|n| {
            let share = |f: fn(&Bin) -> u32| {
                (0..)
                    .zip(&n.bins)
                    .filter(|(_, b)| b.sent > 0)
                    .map(|(k, b)| ((f64::from(k) + 0.5) * BIN_S, f64::from(f(b)) / f64::from(b.sent)))
                    .collect()
            };
            Row {
                label: n.node.clone(),
                lines: vec![share(|b| b.answered), share(|b| b.off_node), share(|b| b.waited)],
                spans: n
                    .windows
                    .iter()
                    .map(|w| Span { from: w.from, to: w.to, label: w.label.clone() })
                    .collect(),
                marks: n.failed_at.clone(),
            }
        })
        .collect();
    Panel { title: act.title.clone(), note: act.verdict.clone(), x_max, rows }
}

#[cfg(test)]
mod tests {
    use lb_testkit::probe::Attempt;

    use super::{
        super::{node_names as names, own_by_name as own, pod_name},
        *,
    };

    /// A roll as the clients see it: every 50 ms for 10 s; node `i` fails or goes to another node (as
    /// `fail` says) during its window, i..i+1 s after 2 s.
    fn roll(fail: bool) -> Vec<Report> {
        (0..3)
            .map(|i| Report {
                target: "10.96.0.20:80".into(),
                attempts: (0..200)
                    .map(|k| {
                        let t_ms = 50.0 * f64::from(k);
                        let window = (2000.0 + 1000.0 * i as f64..3000.0 + 1000.0 * i as f64).contains(&t_ms);
                        let other = pod_name((i + 1) % 3, 0);
                        let (backend, error) = match (window, fail) {
                            (false, _) => (Some(pod_name(i, 0)), None),
                            (true, true) => (None, Some("EHOSTUNREACH".to_owned())),
                            (true, false) => (Some(other), None),
                        };
                        Attempt { t_ms, ms: 0.2, backend, error, peer: None }
                    })
                    .collect(),
            })
            .collect()
    }

    fn windows() -> Vec<Vec<Window>> {
        (0..3)
            .map(|i| {
                let from = 2.0 + f64::from(i);
                vec![Window { from, to: from + 1.0, label: "rolling".into() }]
            })
            .collect()
    }

    #[test]
    fn a_request_that_waited_is_counted_in_the_bin_it_was_sent_in_answered_or_not() {
        let at = |t_ms: f64, ms: f64, error: Option<&str>| Attempt {
            t_ms,
            ms,
            backend: error.is_none().then(|| pod_name(0, 0)),
            error: error.map(str::to_owned),
            peer: None,
        };
        let report = Report {
            target: "10.96.0.20:80".into(),
            attempts: vec![at(0.0, 0.3, None), at(50.0, 1003.0, None), at(100.0, 5000.0, Some("ETIMEDOUT"))],
        };
        let act = record("Local", "PASS".into(), &names()[..1], &[report], &[], &own);
        assert_eq!(act.nodes[0].bins, [Bin { sent: 3, answered: 2, off_node: 0, waited: 2 }]);
        assert_eq!(act.nodes[0].failed_at, [0.1]);
    }

    #[test]
    fn a_record_bins_each_nodes_requests_and_keeps_its_failures() {
        let act = record("Local", "PASS".into(), &names(), &roll(true), &windows(), &own);
        let n1 = &act.nodes[0];
        assert_eq!(n1.node, "node-1");
        assert_eq!(n1.bins.len(), 40);
        // 2.0..3.0 s: four bins of five requests, none answered.
        assert_eq!(n1.bins[7], Bin { sent: 5, answered: 5, off_node: 0, waited: 0 });
        assert_eq!(n1.bins[8], Bin { sent: 5, answered: 0, off_node: 0, waited: 0 });
        assert_eq!(n1.failed_at.len(), 20);
        assert!((n1.failed_at[0] - 2.0).abs() < 1e-9 && (n1.failed_at[19] - 2.95).abs() < 1e-9);
        let served = record("PreferSameNode", "PASS".into(), &names(), &roll(false), &windows(), &own);
        assert_eq!(served.nodes[1].bins[12], Bin { sent: 5, answered: 5, off_node: 5, waited: 0 });
        assert!(served.nodes[1].failed_at.is_empty());
    }

    #[test]
    fn the_chart_has_a_panel_per_act_and_a_row_per_node() {
        let acts = [
            record(
                "1. internalTrafficPolicy: Local",
                "PASS: lost in the windows".into(),
                &names(),
                &roll(true),
                &windows(),
                &own,
            ),
            record(
                "2. trafficDistribution: PreferSameNode",
                "PASS: none lost".into(),
                &names(),
                &roll(false),
                &windows(),
                &own,
            ),
        ];
        let p = panel(&acts[0]);
        assert_eq!((p.rows.len(), p.x_max), (3, 10.0));
        // node-1's answered share: all in the bin before its window, none in its first bin.
        assert!(p.rows[0].lines[0].contains(&(1.875, 1.0)) && p.rows[0].lines[0].contains(&(2.125, 0.0)));
        let svg = timeline_chart(&acts).unwrap();
        for want in
            ["1. internalTrafficPolicy: Local", "2. trafficDistribution: PreferSameNode", "rolling", "node-3"]
        {
            assert!(svg.contains(want), "no {want:?}");
        }
        // The record survives its JSON file (what `fixtures/demo-timeline.json` is).
        let back: Vec<Act> = serde_json::from_str(&serde_json::to_string(&acts).unwrap()).unwrap();
        assert_eq!(timeline_chart(&back).unwrap(), svg);
    }
}
