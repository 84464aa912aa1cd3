//! Each model's figures for every shipped scenario and phase, computed by hand from the proxy's rule (the
//! comments show the arithmetic), never by calling plan or the study. Clients are split evenly unless the
//! scenario says otherwise; "cross-node" and "cross-zone" are shares of all requests.
//!
//! The models, in order: kube-proxy, tierlb; Cilium 1.11-1.15 (annotation only), 1.16-1.17 (zone hints for
//! any Service whose backends all carry them), 1.18.0 (no safeguards: a backend without hints is kept, one
//! hinted elsewhere skipped), 1.18.1 (safeguards, starting pods dropped by the parser), 1.18.x-1.19 (starting
//! pods kept and seen by the safeguards), 1.20 (PreferSameNode by nodeName; safeguards skip terminating
//! backends), 1.20+#47961 (also skip a starting backend without hints); Calico 3.31.0-3.31.4 (hints
//! ignored), 3.31.5-3.31.7 (zone hints only, each endpoint alone), 3.32 (node, then zone hints, each alone).
use tierlb::study::ProxyModel::{
    self, CalicoEbpf332 as CA332, CalicoEbpf3310 as CA310, CalicoEbpf3315 as CA315, Cilium111 as C111,
    Cilium116 as C116, Cilium118x as C118X, Cilium120 as C120, Cilium120Fix as C120F, Cilium1180 as C1180,
    Cilium1181 as C1181, KubeProxy as KP, Tierlb as TIERLB,
};

/// One model's expected row in one phase: shares per endpoint in the scenario file's endpoint order, then
/// cross-node, cross-zone, failed, hang.
pub(crate) struct Row {
    pub(crate) model: ProxyModel,
    pub(crate) shares: &'static [f64],
    pub(crate) cross_node: f64,
    pub(crate) cross_zone: f64,
    pub(crate) failed: f64,
    pub(crate) hang: f64,
}

const fn row(model: ProxyModel, shares: &'static [f64], cross: [f64; 2], lost: [f64; 2]) -> Row {
    Row { model, shares, cross_node: cross[0], cross_zone: cross[1], failed: lost[0], hang: lost[1] }
}

/// The same figures for several models.
fn same(models: &[ProxyModel], shares: &'static [f64], cross: [f64; 2], lost: [f64; 2]) -> Vec<Row> {
    models.iter().map(|&m| row(m, shares, cross, lost)).collect()
}

/// A phase's rows, given as groups of models with the same figures, put in the study's model order.
fn phase(groups: Vec<Vec<Row>>) -> Vec<Row> {
    let mut rows: Vec<Row> = groups.into_iter().flatten().collect();
    rows.sort_by_key(|r| tierlb::study::MODELS.iter().position(|m| *m == r.model));
    rows
}

const T: f64 = 1.0 / 3.0;
const NONE: [f64; 2] = [0.0, 0.0];
/// Three endpoints, one per node, nodes in zones a, a, b, routed cluster-wide: 2/3 off node; zone a's 2/3 of
/// the clients send 1/3 to b (2/9), b's 1/3 send 2/3 to a (2/9): 4/9 cross-zone.
const SPREAD_3: [f64; 2] = [2.0 / 3.0, 4.0 / 9.0];
/// Four endpoints (three in zone a, one in b) or four nodes in two zones routed cluster-wide: 3/4 off node,
/// 1/2 off zone.
const SPREAD_4: [f64; 2] = [0.75, 0.5];
/// Cilium 1.11-1.15, 1.18.0, 1.18.1, 1.18.x-1.19 and Calico 3.31.0-3.31.4 route PreferSameNode cluster-wide.
const CLUSTER_WIDE_SAME_NODE: [ProxyModel; 5] = [C111, C1180, C1181, C118X, CA310];

/// PreferSameNode with one ready, hinted pod on each of three nodes in zones a, a, b: kube-proxy, tierlb,
/// Cilium 1.20 (nodeName) and Calico 3.32 keep each node local. Cilium 1.16-1.17 and Calico 3.31.5 use the
/// zone hints: node-1 and node-2 split over zone a's two pods (half off node each), node-3 keeps its own:
/// a third each, 1/3 cross-node, none cross-zone. The others spread cluster-wide (2/3, 4/9).
fn pod_per_node_same_node() -> Vec<Row> {
    phase(vec![
        same(&[KP, TIERLB, C120, C120F, CA332], &[T, T, T], NONE, NONE),
        same(&[C116, CA315], &[T, T, T], [T, 0.0], NONE),
        same(&CLUSTER_WIDE_SAME_NODE, &[T, T, T], SPREAD_3, NONE),
    ])
}

/// Every shipped scenario: its file name, then per phase (initial first) one row per model.
#[expect(clippy::too_many_lines, reason = "one table: ten scenarios, each phase a row per model")]
pub(crate) fn all() -> Vec<(&'static str, Vec<Vec<Row>>)> {
    vec![
        // Zones a (node-1, node-2), b (node-3); 3.5 has no hints. kube-proxy: a ready endpoint without hints
        // turns topology off, so a third each (2/3, 4/9). Cilium 1.16-1.17: 3.5 lacks hints, all: the same;
        // the other Cilium versions before 1.20 and Calico 3.31.0 route cluster-wide: the same. Cilium 1.20:
        // each node's own pod by nodeName. Calico 3.32: node-1 and node-2 by their node hints; node-3 matches
        // no node or zone hint, so all three: 1.5 gets 1/3 + 1/9 = 4/9; node-3 sends 2/3 of its 1/3 off node
        // and out of its zone: 2/9. Calico 3.31.5 (zone hints only): node-1 and node-2 split over 1.5 and 2.5
        // (1/6 each), node-3 over all three (1/9 each): 1.5 and 2.5 get 4/9, 3.5 1/9; off node 1/6 + 1/6 +
        // 2/9 = 5/9; off zone node-3's 2/9.
        (
            "endpoint-without-hints",
            vec![phase(vec![
                same(&[KP, TIERLB, C116], &[T, T, T], SPREAD_3, NONE),
                same(&CLUSTER_WIDE_SAME_NODE, &[T, T, T], SPREAD_3, NONE),
                same(&[C120, C120F], &[T, T, T], NONE, NONE),
                same(&[CA315], &[4.0 / 9.0, 4.0 / 9.0, 1.0 / 9.0], [5.0 / 9.0, 2.0 / 9.0], NONE),
                same(&[CA332], &[4.0 / 9.0, 4.0 / 9.0, 1.0 / 9.0], [2.0 / 9.0, 2.0 / 9.0], NONE),
            ])],
        ),
        // Endpoints 1.5 (node-1, a), 3.5 (node-3, b), 2.6 (node-2, a, empty hints at first). Initial:
        // kube-proxy has no topology (2.6 lacks hints): 2/3 and 4/9; Cilium 1.16-1.17 likewise (missing hints).
        // Calico 3.32 judges each endpoint alone: node-2 matches no node hint, its zone hint picks 1.5 only (2/3
        // of all requests go to 1.5, node-2's third off node); Calico 3.31.5 gets there by zone hints for every
        // node: the same. Once the controller caught up: pod_per_node_same_node.
        (
            "hints-lag",
            vec![
                phase(vec![
                    same(&[KP, TIERLB, C116], &[T, T, T], SPREAD_3, NONE),
                    same(&CLUSTER_WIDE_SAME_NODE, &[T, T, T], SPREAD_3, NONE),
                    same(&[C120, C120F], &[T, T, T], NONE, NONE),
                    same(&[CA315, CA332], &[2.0 / 3.0, T, 0.0], [T, 0.0], NONE),
                ]),
                pod_per_node_same_node(),
            ],
        ),
        // internalTrafficPolicy Local, one pod per node, no zones. Terminating: kube-proxy and tierlb use the
        // local serving+terminating pod, and so does every Cilium (the parser keeps a serving terminating pod;
        // terminating backends serve when no active one is left); Calico writes ready endpoints only, so
        // node-2 has no backend: its third fails. Gone: kube-proxy DROPs node-2's third (hang); tierlb, Cilium
        // (before #42708 the parser drops it, after it is kept but neither active nor terminating) and Calico
        // fail it at once.
        (
            "local-policy-roll",
            vec![
                tierlb::study::MODELS.map(|m| row(m, &[T, T, T], NONE, NONE)).into(),
                phase(vec![
                    same(&[KP, TIERLB, C111, C116, C1180, C1181, C118X, C120, C120F], &[T, T, T], NONE, NONE),
                    same(&[CA310, CA315, CA332], &[T, 0.0, T], NONE, [T, 0.0]),
                ]),
                phase(vec![
                    same(&[KP], &[T, 0.0, T], NONE, [0.0, T]),
                    same(&tierlb::study::MODELS[1..], &[T, 0.0, T], NONE, [T, 0.0]),
                ]),
            ],
        ),
        // PreferSameZone; 1.1 and 1.2 on a-1, 2.1 on a-2 (zone a), 3.1 on b-1; clients on a-1, a-2, b-1, b-2.
        // Zone hints: zone a's half over three pods (1/6 each), zone b's half to 3.1; cross-node: a-1 1/3,
        // a-2 2/3, b-1 0, b-2 1, mean 1/2; no cross-zone: kube-proxy, tierlb, Cilium 1.16-1.17 (any Service
        // with hints), Cilium 1.20, Calico 3.31.5 and 3.32. Cilium 1.11-1.15 (no annotation), 1.18.0-1.19 (only
        // PreferClose) and Calico 3.31.0 (hints ignored): all four, 1/4 each; cross-node (1/2 + 3/4 + 3/4 +
        // 1)/4 = 3/4; cross-zone (1/2 x 1/4 + 1/2 x 3/4) = 1/2.
        (
            "multizone",
            vec![phase(vec![
                same(
                    &[KP, TIERLB, C116, C120, C120F, CA315, CA332],
                    &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5],
                    [0.5, 0.0],
                    NONE,
                ),
                same(&CLUSTER_WIDE_SAME_NODE, &[0.25; 4], SPREAD_4, NONE),
            ])],
        ),
        // No topology; clients on node-1 and node-2 only (60/s for 40 s: 2400). Initially a third each, 2/3
        // off node. node-3 lost: everyone but tierlb sends a third into the void (hang) and 1/3 of all to the
        // other live node. tierlb: 32 of 2400 hang (tests below), the rest split evenly over the two live
        // pods (each node splits evenly before and after its hold): 1184 each, half of it off node.
        (
            "node-lost",
            vec![
                tierlb::study::MODELS.map(|m| row(m, &[T, T, T], [2.0 / 3.0, 0.0], NONE)).into(),
                phase(vec![
                    same(&[KP], &[T, T, 0.0], [T, 0.0], [0.0, T]),
                    vec![row(
                        TIERLB,
                        &[1184.0 / 2400.0, 1184.0 / 2400.0, 0.0],
                        [1184.0 / 2400.0, 0.0],
                        [0.0, 32.0 / 2400.0],
                    )],
                    same(&tierlb::study::MODELS[2..], &[T, T, 0.0], [T, 0.0], [0.0, T]),
                ]),
            ],
        ),
        // PreferClose; 1.1 (a-1), 2.1 (a-2), 3.1 (b-1), 4.2 (b-2, starting: not ready, no hints). Initial,
        // zones: zone a's half over 1.1 and 2.1, zone b's half to 3.1; cross-node (1/2 + 1/2 + 0 + 1)/4 = 1/2:
        // kube-proxy, tierlb, Cilium 1.16-1.17, 1.18.0 and 1.18.1 (the parser drops the starting 4.2, the rest
        // carry hints), 1.20+#47961 (skips 4.2: not ready, no hints), Calico 3.31.5 and 3.32 (4.2 is neither
        // ready nor terminating). Cluster-wide over the three ready pods, 1/3 each, cross-node (2/3 x 3 +
        // 1)/4 = 3/4, cross-zone 1/2 x 1/3 + 1/2 x 2/3 = 1/2: Cilium 1.11-1.15 (no annotation), 1.18.x-1.19 and
        // 1.20 (4.2 kept in maintenance, its missing hints turn zones off), Calico 3.31.0 (hints ignored).
        // Then 4.2 is ready (hinted b) and 2.1 terminating (no hints): zones: zone a's half to 1.1, zone b's
        // over 3.1 and 4.2 (1/4 each); cross-node (0 + 1 + 1/2 + 1/2)/4 = 1/2: kube-proxy, tierlb, Cilium
        // 1.18.0 (no safeguards: 2.1 kept for every zone, but not active; zone a gets 1.1, zone b 3.1 and 4.2),
        // 1.20 and 1.20+#47961 (terminating 2.1 skipped by the safeguards), Calico 3.31.5 and 3.32. Cluster-wide
        // over 1.1, 3.1, 4.2 (1/3 each), cross-node (2/3 + 1 + 2/3 + 2/3)/4 = 3/4, cross-zone 1/2: Cilium
        // 1.11-1.15, 1.16-1.17, 1.18.1, 1.18.x-1.19 (2.1's missing hints), Calico 3.31.0.
        (
            "prefer-close",
            vec![
                phase(vec![
                    same(
                        &[KP, TIERLB, C116, C1180, C1181, C120F, CA315, CA332],
                        &[0.25, 0.25, 0.5, 0.0],
                        [0.5, 0.0],
                        NONE,
                    ),
                    same(&[C111, C118X, C120, CA310], &[T, T, T, 0.0], SPREAD_4, NONE),
                ]),
                phase(vec![
                    same(
                        &[KP, TIERLB, C1180, C120, C120F, CA315, CA332],
                        &[0.5, 0.0, 0.25, 0.25],
                        [0.5, 0.0],
                        NONE,
                    ),
                    same(&[C111, C116, C1181, C118X, CA310], &[T, 0.0, T, T], SPREAD_4, NONE),
                ]),
            ],
        ),
        // PreferSameNode, one pod per node: node-1, node-2 (zone a), node-3 (b). Initial:
        // pod_per_node_same_node. node-1's pod terminating (no hints): kube-proxy, tierlb and Calico 3.32 send
        // node-1 to its zone (2.5): 2.5 gets 2/3, 1/3 off node, none cross-zone; Calico 3.31.5 the same by zone
        // hints. Cilium 1.20 has no ready local backend and falls back cluster-wide (no zone step): node-1
        // splits over 2.5 and 3.5, so 1/2 each, 1/3 off node, 1/6 cross-zone. Cilium 1.16-1.17 (1.5 without
        // hints: all) and the cluster-wide models: every node over the two ready pods: cross-node (1 + 1/2 +
        // 1/2)/3 = 2/3, cross-zone 1/2. node-1's new pod not ready: the same, except Cilium 1.16-1.17, whose
        // parser drops the not-serving 1.5: 2.5 and 3.5 carry hints, zones: as kube-proxy.
        ("same-node-not-ready", {
            let replaced = |c116_zones: bool| {
                let (zoned, spread): (Vec<ProxyModel>, Vec<ProxyModel>) = if c116_zones {
                    (vec![KP, TIERLB, C116, CA315, CA332], CLUSTER_WIDE_SAME_NODE.to_vec())
                } else {
                    let mut s = CLUSTER_WIDE_SAME_NODE.to_vec();
                    s.push(C116);
                    (vec![KP, TIERLB, CA315, CA332], s)
                };
                phase(vec![
                    same(&zoned, &[0.0, 2.0 / 3.0, T], [T, 0.0], NONE),
                    same(&spread, &[0.0, 0.5, 0.5], [2.0 / 3.0, 0.5], NONE),
                    same(&[C120, C120F], &[0.0, 0.5, 0.5], [T, 1.0 / 6.0], NONE),
                ])
            };
            vec![pod_per_node_same_node(), replaced(false), replaced(true)]
        }),
        // multizone's cluster under PreferClose with Cilium's serviceTopology off: every Cilium version and
        // Calico 3.31.0 spread over all four (3/4, 1/2); kube-proxy, tierlb and Calico 3.31.5/3.32 keep to the
        // zone (1/2, 0).
        (
            "service-topology-off",
            vec![phase(vec![
                same(&[KP, TIERLB, CA315, CA332], &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
                same(&[C111, C116, C1180, C1181, C118X, C120, C120F, CA310], &[0.25; 4], SPREAD_4, NONE),
            ])],
        ),
        // PreferSameNode, 1.21 on node-1 and 3.21 on node-3, clients 50/30/20, no zone labels. node-1 and
        // node-3 keep to their own pod, node-2 (no pod, no zones) splits: 1.21 gets 0.5 + 0.15 = 0.65, 3.21
        // 0.15 + 0.2 = 0.35; off node: node-2's 0.3 (kube-proxy, tierlb, Cilium 1.20, Calico 3.32). Cilium
        // before 1.20 (1.16-1.17: no zone label, all) and Calico 3.31.0 and 3.31.5 (no node hints seen, no
        // zone hint matches an unzoned node): 50/50, off node 0.25 + 0.3 + 0.1 = 0.65. Crash (30 s, 3000
        // requests): node-1's half and node-2's 0.15 fail (0.65) for kube-proxy, Cilium 1.20 and Calico 3.32;
        // the 50/50 models lose half of everything, 0.4 served off node. tierlb loses 10 (tests below):
        // node-1's 1495 and node-2's 895 go to 3.21 off node, node-3's 600 locally.
        (
            "story",
            vec![
                phase(vec![
                    same(&[KP, TIERLB, C120, C120F, CA332], &[0.65, 0.35], [0.3, 0.0], NONE),
                    same(&CLUSTER_WIDE_SAME_NODE, &[0.5, 0.5], [0.65, 0.0], NONE),
                    same(&[C116, CA315], &[0.5, 0.5], [0.65, 0.0], NONE),
                ]),
                phase(vec![
                    same(&[KP, C120, C120F, CA332], &[0.0, 0.35], [0.15, 0.0], [0.65, 0.0]),
                    vec![row(TIERLB, &[0.0, 2990.0 / 3000.0], [2390.0 / 3000.0, 0.0], [10.0 / 3000.0, 0.0])],
                    same(&CLUSTER_WIDE_SAME_NODE, &[0.0, 0.5], [0.4, 0.0], [0.5, 0.0]),
                    same(&[C116, CA315], &[0.0, 0.5], [0.4, 0.0], [0.5, 0.0]),
                ]),
            ],
        ),
        // PreferSameNode; node-1, node-2 in a, node-3, node-4 in b; only 1.5 and 3.5 have forNodes. kube-proxy
        // needs every ready endpoint to have node hints, so zones: each node splits with its zone peer (1/2 off
        // node); Cilium 1.16-1.17 and Calico 3.31.5 (zone hints, all present) the same. The cluster-wide
        // models: 3/4 off node, 1/2 off zone. Cilium 1.20 picks each node's own pod by nodeName. Calico 3.32:
        // node-1 and node-3 by node hint, node-2 and node-4 by zone over two: 1.5 gets 1/4 + 1/8 = 3/8, 2.5
        // 1/8; off node 1/8 + 1/8.
        (
            "upgraded-halfway",
            vec![phase(vec![
                same(&[KP, TIERLB, C116, CA315], &[0.25; 4], [0.5, 0.0], NONE),
                same(&CLUSTER_WIDE_SAME_NODE, &[0.25; 4], SPREAD_4, NONE),
                same(&[C120, C120F], &[0.25; 4], NONE, NONE),
                same(&[CA332], &[0.375, 0.125, 0.375, 0.125], [0.25, 0.0], NONE),
            ])],
        ),
    ]
}
