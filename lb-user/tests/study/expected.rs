//! Each model's figures for every shipped scenario and phase, computed by hand from the proxy's rule (the
//! comments show the arithmetic), never by calling plan or the study. Clients are split evenly unless the
//! scenario says otherwise; "cross-node" and "cross-zone" are shares of all requests.
use tierlb::study::ProxyModel::{
    self, CalicoEbpf332 as CALICO, Cilium117 as C117, Cilium118 as C118, Cilium120 as C120, KubeProxy as KP,
    Tierlb as TIERLB,
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

const T: f64 = 1.0 / 3.0;
const NONE: [f64; 2] = [0.0, 0.0];

/// PreferSameNode with one ready, hinted pod on each of three nodes in zones a, a, b: every node-aware model
/// keeps each node local; Cilium before 1.20 spreads cluster-wide (2/3 off node; zone a's 2/3 of the clients
/// send 1/3 to b, b's 1/3 send 2/3 to a: 4/9 cross-zone).
fn pod_per_node_same_node() -> Vec<Row> {
    vec![
        row(KP, &[T, T, T], NONE, NONE),
        row(TIERLB, &[T, T, T], NONE, NONE),
        row(C117, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
        row(C118, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
        row(C120, &[T, T, T], NONE, NONE),
        row(CALICO, &[T, T, T], NONE, NONE),
    ]
}

/// Every shipped scenario: its file name, then per phase (initial first) one row per model.
#[expect(clippy::too_many_lines, reason = "one table: ten scenarios, each phase a row per model")]
pub(crate) fn all() -> Vec<(&'static str, Vec<Vec<Row>>)> {
    vec![
        // Zones a (node-1, node-2), b (node-3); 3.5 has no hints. kube-proxy: a ready endpoint without hints
        // turns topology off, so a third each; cross-node 2/3; cross-zone: zone a's 2/3 of the clients send
        // 1/3 to b (2/9), b's 1/3 send 2/3 to a (2/9): 4/9. Cilium before 1.20 ignores PreferSameNode: the
        // same. Cilium 1.20: each node's own pod by nodeName. Calico: node-1 and node-2 by their node hints;
        // node-3 matches no node or zone hint, so all three: 1.5 gets 1/3 + 1/9 = 4/9; node-3 sends 2/3 of
        // its 1/3 off node and out of its zone: 2/9.
        (
            "endpoint-without-hints",
            vec![vec![
                row(KP, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                row(TIERLB, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                row(C117, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                row(C118, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                row(C120, &[T, T, T], NONE, NONE),
                row(CALICO, &[4.0 / 9.0, 4.0 / 9.0, 1.0 / 9.0], [2.0 / 9.0, 2.0 / 9.0], NONE),
            ]],
        ),
        // Endpoints 1.5 (node-1, a), 3.5 (node-3, b), 2.6 (node-2, a, empty hints at first). Initial:
        // kube-proxy has no topology (2.6 lacks hints): as above, 2/3 and 4/9. Calico judges each endpoint
        // alone: node-2 matches no node hint, its zone hint picks 1.5 only (2/3 of all requests go to 1.5,
        // node-2's third off node). Once the controller caught up, every node-aware model is local; Cilium
        // 1.17/1.18 still spread PreferSameNode cluster-wide: 2/3 and 4/9.
        (
            "hints-lag",
            vec![
                vec![
                    row(KP, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                    row(TIERLB, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                    row(C117, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                    row(C118, &[T, T, T], [2.0 / 3.0, 4.0 / 9.0], NONE),
                    row(C120, &[T, T, T], NONE, NONE),
                    row(CALICO, &[2.0 / 3.0, T, 0.0], [T, 0.0], NONE),
                ],
                pod_per_node_same_node(),
            ],
        ),
        // internalTrafficPolicy Local, one pod per node, no zones. Terminating: kube-proxy and tierlb use the
        // local serving+terminating pod, and so does Cilium (terminating backends serve when no active one
        // is left); Calico writes ready endpoints only, so node-2 has no backend: its third fails. Gone:
        // kube-proxy DROPs node-2's third (hang); tierlb, Cilium (EHOSTUNREACH) and Calico (NAT_NO_BACKEND)
        // fail it at once.
        (
            "local-policy-roll",
            vec![
                [KP, TIERLB, C117, C118, C120, CALICO].map(|m| row(m, &[T, T, T], NONE, NONE)).into(),
                vec![
                    row(KP, &[T, T, T], NONE, NONE),
                    row(TIERLB, &[T, T, T], NONE, NONE),
                    row(C117, &[T, T, T], NONE, NONE),
                    row(C118, &[T, T, T], NONE, NONE),
                    row(C120, &[T, T, T], NONE, NONE),
                    row(CALICO, &[T, 0.0, T], NONE, [T, 0.0]),
                ],
                vec![
                    row(KP, &[T, 0.0, T], NONE, [0.0, T]),
                    row(TIERLB, &[T, 0.0, T], NONE, [T, 0.0]),
                    row(C117, &[T, 0.0, T], NONE, [T, 0.0]),
                    row(C118, &[T, 0.0, T], NONE, [T, 0.0]),
                    row(C120, &[T, 0.0, T], NONE, [T, 0.0]),
                    row(CALICO, &[T, 0.0, T], NONE, [T, 0.0]),
                ],
            ],
        ),
        // PreferSameZone; 1.1 and 1.2 on a-1, 2.1 on a-2 (zone a), 3.1 on b-1; clients on a-1, a-2, b-1, b-2.
        // Zone hints: zone a's half over three pods (1/6 each), zone b's half to 3.1; cross-node: a-1 1/3,
        // a-2 2/3, b-1 0, b-2 1, mean 1/2; no cross-zone. Cilium before 1.20 reads only PreferClose: all
        // four, 1/4 each; cross-node (1/2 + 3/4 + 3/4 + 1)/4 = 3/4; cross-zone (1/2 x 1/4 + 1/2 x 3/4) = 1/2.
        (
            "multizone",
            vec![vec![
                row(KP, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
                row(TIERLB, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
                row(C117, &[0.25; 4], [0.75, 0.5], NONE),
                row(C118, &[0.25; 4], [0.75, 0.5], NONE),
                row(C120, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
                row(CALICO, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
            ]],
        ),
        // No topology; clients on node-1 and node-2 only (60/s for 40 s: 2400). Initially a third each, 2/3
        // off node. node-3 lost: everyone but tierlb sends a third into the void (hang) and 1/3 of all to the
        // other live node. tierlb: 32 of 2400 hang (tests below), the rest split evenly over the two live
        // pods (each node splits evenly before and after its hold): 1184 each, half of it off node.
        (
            "node-lost",
            vec![
                [KP, TIERLB, C117, C118, C120, CALICO]
                    .map(|m| row(m, &[T, T, T], [2.0 / 3.0, 0.0], NONE))
                    .into(),
                vec![
                    row(KP, &[T, T, 0.0], [T, 0.0], [0.0, T]),
                    row(
                        TIERLB,
                        &[1184.0 / 2400.0, 1184.0 / 2400.0, 0.0],
                        [1184.0 / 2400.0, 0.0],
                        [0.0, 32.0 / 2400.0],
                    ),
                    row(C117, &[T, T, 0.0], [T, 0.0], [0.0, T]),
                    row(C118, &[T, T, 0.0], [T, 0.0], [0.0, T]),
                    row(C120, &[T, T, 0.0], [T, 0.0], [0.0, T]),
                    row(CALICO, &[T, T, 0.0], [T, 0.0], [0.0, T]),
                ],
            ],
        ),
        // PreferClose; 1.1 (a-1), 2.1 (a-2), 3.1 (b-1), 4.2 (b-2, starting: not ready, no hints). Initial:
        // zone a's half over 1.1 and 2.1, zone b's half to 3.1; cross-node (1/2 + 1/2 + 0 + 1)/4 = 1/2.
        // Cilium 1.18 keeps the not-ready 4.2 and its missing hints turn zones off: the three ready pods, 1/3
        // each; cross-node (2/3 x 3 + 1)/4 = 3/4; cross-zone 1/2 x 1/3 + 1/2 x 2/3 = 1/2. Then 4.2 is ready
        // (hinted b) and 2.1 terminating (no hints): zone a's half to 1.1, zone b's over 3.1 and 4.2 (1/4
        // each); cross-node (0 + 1 + 1/2 + 1/2)/4 = 1/2. Cilium 1.17 and 1.18 see the terminating pod's missing
        // hints: 1/3 each over 1.1, 3.1, 4.2; cross-node (2/3 + 1 + 2/3 + 2/3)/4 = 3/4, cross-zone 1/2.
        (
            "prefer-close",
            vec![
                vec![
                    row(KP, &[0.25, 0.25, 0.5, 0.0], [0.5, 0.0], NONE),
                    row(TIERLB, &[0.25, 0.25, 0.5, 0.0], [0.5, 0.0], NONE),
                    row(C117, &[0.25, 0.25, 0.5, 0.0], [0.5, 0.0], NONE),
                    row(C118, &[T, T, T, 0.0], [0.75, 0.5], NONE),
                    row(C120, &[0.25, 0.25, 0.5, 0.0], [0.5, 0.0], NONE),
                    row(CALICO, &[0.25, 0.25, 0.5, 0.0], [0.5, 0.0], NONE),
                ],
                vec![
                    row(KP, &[0.5, 0.0, 0.25, 0.25], [0.5, 0.0], NONE),
                    row(TIERLB, &[0.5, 0.0, 0.25, 0.25], [0.5, 0.0], NONE),
                    row(C117, &[T, 0.0, T, T], [0.75, 0.5], NONE),
                    row(C118, &[T, 0.0, T, T], [0.75, 0.5], NONE),
                    row(C120, &[0.5, 0.0, 0.25, 0.25], [0.5, 0.0], NONE),
                    row(CALICO, &[0.5, 0.0, 0.25, 0.25], [0.5, 0.0], NONE),
                ],
            ],
        ),
        // PreferSameNode, one pod per node: node-1, node-2 (zone a), node-3 (b). Initial: node-aware models
        // are local; Cilium 1.17/1.18 cluster-wide (2/3, 4/9). node-1's pod terminating, then not ready:
        // kube-proxy, tierlb and Calico send node-1 to its zone (2.5): 2.5 gets 2/3, 1/3 off node, none
        // cross-zone. Cilium 1.20 has no ready local backend and falls back cluster-wide (no zone step):
        // node-1 splits over 2.5 and 3.5, so 1/2 each, 1/3 off node, 1/6 cross-zone. Cilium 1.17/1.18: every
        // node over the two ready pods: cross-node (1 + 1/2 + 1/2)/3 = 2/3, cross-zone 1/2.
        ("same-node-not-ready", {
            let replaced = || {
                vec![
                    row(KP, &[0.0, 2.0 / 3.0, T], [T, 0.0], NONE),
                    row(TIERLB, &[0.0, 2.0 / 3.0, T], [T, 0.0], NONE),
                    row(C117, &[0.0, 0.5, 0.5], [2.0 / 3.0, 0.5], NONE),
                    row(C118, &[0.0, 0.5, 0.5], [2.0 / 3.0, 0.5], NONE),
                    row(C120, &[0.0, 0.5, 0.5], [T, 1.0 / 6.0], NONE),
                    row(CALICO, &[0.0, 2.0 / 3.0, T], [T, 0.0], NONE),
                ]
            };
            vec![pod_per_node_same_node(), replaced(), replaced()]
        }),
        // multizone's cluster under PreferClose with Cilium's serviceTopology off: every Cilium version
        // spreads over all four (3/4, 1/2); kube-proxy, tierlb and Calico keep to the zone (1/2, 0).
        (
            "service-topology-off",
            vec![vec![
                row(KP, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
                row(TIERLB, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
                row(C117, &[0.25; 4], [0.75, 0.5], NONE),
                row(C118, &[0.25; 4], [0.75, 0.5], NONE),
                row(C120, &[0.25; 4], [0.75, 0.5], NONE),
                row(CALICO, &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.5], [0.5, 0.0], NONE),
            ]],
        ),
        // PreferSameNode, 1.21 on node-1 and 3.21 on node-3, clients 50/30/20, no zone labels. node-1 and
        // node-3 keep to their own pod, node-2 (no pod, no zones) splits: 1.21 gets 0.5 + 0.15 = 0.65, 3.21
        // 0.15 + 0.2 = 0.35; off node: node-2's 0.3. Cilium 1.17/1.18: 50/50, off node 0.25 + 0.3 + 0.1 = 0.65.
        // Crash (30 s, 3000 requests): node-1's half and node-2's 0.15 fail (0.65) for kube-proxy, Cilium 1.20
        // and Calico; Cilium 1.17/1.18 lose half of everything, 0.4 served off node. tierlb loses 10 (tests
        // below): node-1's 1495 and node-2's 895 go to 3.21 off node, node-3's 600 locally.
        (
            "story",
            vec![
                vec![
                    row(KP, &[0.65, 0.35], [0.3, 0.0], NONE),
                    row(TIERLB, &[0.65, 0.35], [0.3, 0.0], NONE),
                    row(C117, &[0.5, 0.5], [0.65, 0.0], NONE),
                    row(C118, &[0.5, 0.5], [0.65, 0.0], NONE),
                    row(C120, &[0.65, 0.35], [0.3, 0.0], NONE),
                    row(CALICO, &[0.65, 0.35], [0.3, 0.0], NONE),
                ],
                vec![
                    row(KP, &[0.0, 0.35], [0.15, 0.0], [0.65, 0.0]),
                    row(TIERLB, &[0.0, 2990.0 / 3000.0], [2390.0 / 3000.0, 0.0], [10.0 / 3000.0, 0.0]),
                    row(C117, &[0.0, 0.5], [0.4, 0.0], [0.5, 0.0]),
                    row(C118, &[0.0, 0.5], [0.4, 0.0], [0.5, 0.0]),
                    row(C120, &[0.0, 0.35], [0.15, 0.0], [0.65, 0.0]),
                    row(CALICO, &[0.0, 0.35], [0.15, 0.0], [0.65, 0.0]),
                ],
            ],
        ),
        // PreferSameNode; node-1, node-2 in a, node-3, node-4 in b; only 1.5 and 3.5 have forNodes. kube-proxy
        // needs every ready endpoint to have node hints, so zones: each node splits with its zone peer (1/2 off
        // node). Cilium 1.17/1.18 cluster-wide: 3/4 off node, 1/2 off zone. Cilium 1.20 picks each node's
        // own pod by nodeName. Calico: node-1 and node-3 by node hint, node-2 and node-4 by zone over two:
        // 1.5 gets 1/4 + 1/8 = 3/8, 2.5 1/8; off node 1/8 + 1/8.
        (
            "upgraded-halfway",
            vec![vec![
                row(KP, &[0.25; 4], [0.5, 0.0], NONE),
                row(TIERLB, &[0.25; 4], [0.5, 0.0], NONE),
                row(C117, &[0.25; 4], [0.75, 0.5], NONE),
                row(C118, &[0.25; 4], [0.75, 0.5], NONE),
                row(C120, &[0.25; 4], NONE, NONE),
                row(CALICO, &[0.375, 0.125, 0.375, 0.125], [0.25, 0.0], NONE),
            ]],
        ),
    ]
}
