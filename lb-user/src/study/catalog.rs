//! What `tierlb study --models` says about each model: the release range it stands for, its rule, what a
//! client meets when its set is empty and with which errno, the code it was read from (repository, path, tag
//! or commit, lines, quoted where it decides), and whether that code was read at the tags of the range.
use std::fmt::Write as _;

use serde::Serialize;

use super::models::{MODELS, ProxyModel};

/// What `tierlb study --models` says about a model (the same facts as its doc comment).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModelInfo {
    /// Its name in tables, charts and JSON.
    pub name: &'static str,
    /// The proxy and the exact release range it stands for.
    pub stands_for: &'static str,
    /// How it picks a client's endpoints.
    pub rule: &'static str,
    /// What a client meets when that set is empty.
    pub when_empty: &'static str,
    /// The errno connect() returns when it is refused (or "none: the client hangs").
    pub errno: &'static str,
    /// Where the rule was read: repository, path, tag or commit, lines.
    pub source: &'static str,
    /// Whether the code was read at the tags of the range; `false`: marked unverified.
    pub verified: bool,
    /// What was and was not read at a tag.
    pub verification: &'static str,
    /// The same in a few words each, for `study --models`' table.
    pub short: Short,
}

/// A model as one row of `study --models`' table: what a user picks a release by.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Short {
    /// The releases it stands for, as their users name them.
    pub releases: &'static str,
    /// What it does with `hints.forNodes`.
    pub for_nodes: &'static str,
    /// What it does with `hints.forZones`.
    pub for_zones: &'static str,
    /// What a client meets when no endpoint is left.
    pub nothing_left: &'static str,
    /// The errno `connect()` returns then.
    pub errno: &'static str,
    /// How its rule was read.
    pub read: &'static str,
}

const CILIUM_EMPTY: &str = "refused: the frontend has no backend, connect() fails at once, never a hang";
const CILIUM_ERRNO: &str =
    "EHOSTUNREACH (bpf/bpf_sock.c __sock4_xlate_fwd, svc->count == 0; not read at a tag)";
const CILIUM_UNVERIFIED: &str = "unverified: the rule is read from the pull requests named and from the files at \
                                 the commits named; none of those commits could be tied to a release tag";
const CALICO_EMPTY: &str = "refused: NAT_NO_BACKEND, connect() fails at once";
const CALICO_ERRNO: &str = "EPERM: on NAT_NO_BACKEND the connect4 hook returns 0 without bpf_set_retval \
                            (projectcalico/calico felix/bpf-gpl/connect.h:33-34 `if (res == NAT_NO_BACKEND) \
                            { err = -1;` and :120 `ret = 0; /* ret != 1 generates an error in pre-connect \
                            */`, at v3.31.0, v3.31.5, v3.32.0, v3.32.1), and the kernel fails the syscall \
                            with EPERM";

impl ProxyModel {
    /// The model's range, rule, empty-set outcome, errno and sources.
    #[expect(clippy::too_many_lines, reason = "one table: a block per model")]
    pub fn info(self) -> ModelInfo {
        match self {
            Self::KubeProxy => ModelInfo {
                name: "kube-proxy-1.34-1.37",
                short: Short {
                    releases: "kube-proxy v1.34.0 to v1.37.x",
                    for_nodes: "used if every ready endpoint has one",
                    for_zones: "same rule, after node hints",
                    nothing_left: "REJECT; Local: DROP (hang)",
                    errno: "ECONNREFUSED; hang",
                    read: "run beside it, compared",
                },
                stands_for: "kube-proxy 1.34-1.37 (v1.34.x-v1.37.x with their default feature gates; iptables \
                             and nftables modes)",
                rule: "node hints if every ready endpoint has forNodes and one names this node, else zone hints \
                       under the same rule, else all ready endpoints (then serving+terminating ones); a Local \
                       policy uses the local ready (else serving+terminating) endpoints",
                when_empty: "refused (REJECT) when the Service has no usable endpoint; hang (DROP) under a Local \
                             policy with endpoints elsewhere",
                errno: "ECONNREFUSED (REJECT); none under DROP: the client hangs",
                source: "kubernetes/kubernetes at v1.34.4, v1.35.4, v1.36.3 and v1.37.2 (the module \
                         k8s.io/kubernetes at each tag, from the Go module proxy): pkg/proxy/topology.go \
                         topologyModeFromHints `if allEndpointsHaveNodeHints {` (v1.34.4:194, v1.36.3:195), \
                         CategorizeEndpoints' fallback `if ep.IsServing() && ep.IsTerminating() {` (:76 at each); \
                         pkg/proxy/endpointslicecache.go:223 `if len(endpoint.Hints.ForNodes) > 0 && \
                         utilfeature.DefaultFeatureGate.Enabled(features.PreferSameTrafficDistribution) {`; \
                         pkg/features/kube_features.go: PreferSameTrafficDistribution Beta, default on at \
                         v1.34.4 (:1600 `{Version: version.MustParse(\"1.34\"), Default: true, PreRelease: \
                         featuregate.Beta},`), GA and locked from v1.35.4 (:1663 `{Version: \
                         version.MustParse(\"1.35\"), Default: true, PreRelease: featuregate.GA, LockToDefault: \
                         true},`); KEP-3015",
                verified: true,
                verification: "checked against kube-proxy itself: v1.34.4, v1.35.4, v1.36.3 and v1.37.2, each \
                               built here from its own module version, in iptables mode, on every scenario of \
                               examples/study/ in every state and on every node: the endpoints its ClusterIP \
                               leads to and their shares (from its `statistic` probabilities), or REJECT, or \
                               DROP, equal to this model's (lb-user/tests/kube_proxy_releases.rs, \
                               the_study_kube_proxy_model_matches_real_kube_proxy_of_every_release_in_every_scenario: \
                               236 answers, 0 differences); v1.36.3 in iptables and nftables modes against \
                               tierlb's data path on 560 Service ports, IPv4 and IPv6 \
                               (kube_proxy_and_tierlb_reach_the_same_backends_for_every_service_shape_node_and_client). \
                               Assumed: kube-proxy took its Node's zone; a start that never does (its \
                               NodeTopologyConfig registers the proxier after the node informer may have delivered \
                               the Node: about one start in 30 there, restarted before comparing) uses every \
                               endpoint where zone hints apply. Not covered: PreferSameTrafficDistribution turned \
                               off on 1.34 (node hints ignored); one endpoint in two slices (v1.34-v1.35 keep the local copy, \
                               endpointslicecache.go:238 `!exists || isLocal`; v1.36-v1.37 the one not \
                               terminating, :247 `!exists || !terminating`; the study's scenarios have one slice)",
            },
            Self::Tierlb => ModelInfo {
                name: "tierlb",
                short: Short {
                    releases: "this build",
                    for_nodes: "kube-proxy's rule, then falls back",
                    for_zones: "kube-proxy's rule, a fallback tier",
                    nothing_left: "refused at once",
                    errno: "ECONNREFUSED, EHOSTUNREACH",
                    read: "this repository",
                },
                stands_for: "tierlb (this repository), with passive health",
                rule: "kube-proxy's rule as tiers node, zone, cluster; a backend held down by passive health \
                       (K failed connects from the node) moves the node's connects to the next live backend or \
                       tier",
                when_empty: "refused: connect() fails at once in both of kube-proxy's cases",
                errno: "ECONNREFUSED (no usable endpoint), EHOSTUNREACH (Local policy, none local)",
                source: "lb-user/src/plan.rs, lb-common first_live_tier, lb-ebpf/src/health.rs",
                verified: true,
                verification: "this repository's code",
            },
            Self::Cilium111 => ModelInfo {
                name: "cilium-1.11-1.15",
                short: Short {
                    releases: "Cilium v1.11.0 to v1.15.x",
                    for_nodes: "ignored",
                    for_zones: "only with a topology annotation",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "pull requests, no tag",
                },
                stands_for: "Cilium 1.11.0-1.15.x kube-proxy replacement (socket LB)",
                rule: "with serviceTopology: zone hints only for a Service with a topology annotation (not \"\" \
                       or disabled), no Local policy and a zoned node; all kept endpoints if one lacks zone \
                       hints or none names the zone; trafficDistribution never read, forNodes never read; \
                       the parser drops endpoints that are not serving; ready backends first, terminating \
                       ones if none is ready",
                when_empty: CILIUM_EMPTY,
                errno: CILIUM_ERRNO,
                source: "cilium/cilium pkg/k8s/service_cache.go filterEndpoints (cilium#17929), read at two \
                         pre-#32678 commits, neither tied to a tag: at \
                         005d3ed35c1313c9097b820a0c7179fbbf0a431a `if !option.Config.EnableServiceTopology || \
                         svc == nil || !svc.TopologyAware {`, at 4309d933eaa5e1f3e4a681428adef6b9d77d9024 `if \
                         !s.config.EnableServiceTopology || svc == nil || !svc.TopologyAware {`; in both `if \
                         len(backend.HintsForZones) == 0 { return localEndpoints }`, `if \
                         len(filteredEndpoints.Backends) == 0 { return localEndpoints }`",
                verified: false,
                verification: CILIUM_UNVERIFIED,
            },
            Self::Cilium116 => ModelInfo {
                name: "cilium-1.16-1.17",
                short: Short {
                    releases: "Cilium v1.16.0 to v1.17.x",
                    for_nodes: "ignored (zone-routed)",
                    for_zones: "used if every endpoint has one",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "pull requests, no tag",
                },
                stands_for: "Cilium 1.16.0-1.17.x kube-proxy replacement (socket LB)",
                rule: "with serviceTopology, for every Service (no Local policy, a zoned node): zone hints if \
                       every kept endpoint has them and one names the zone, else all; so PreferClose, \
                       PreferSameZone and PreferSameNode are all zone-routed (the controller writes zone hints \
                       for each); forNodes never read; the parser drops endpoints that are not serving (`if \
                       !isServing { continue }`); ready backends first, terminating ones if none is ready",
                when_empty: CILIUM_EMPTY,
                errno: CILIUM_ERRNO,
                source: "cilium/cilium pkg/k8s/service_cache.go filterEndpoints after cilium#32678 (\"we've \
                         removed the check ... that verified that a topology annotation was set before \
                         honoring hints\"; TopologyAware kept only to re-send Services when the node's zone \
                         changes), read at a post-#32678 version of the file whose commit is not \
                         known (`func (s *ServiceCacheImpl) filterEndpoints`): `if \
                         !s.config.EnableServiceTopology || svc == nil {`",
                verified: false,
                verification: CILIUM_UNVERIFIED,
            },
            Self::Cilium1180 => ModelInfo {
                name: "cilium-1.18.0",
                short: Short {
                    releases: "Cilium v1.18.0",
                    for_nodes: "ignored (cluster-wide)",
                    for_zones: "PreferClose only, no safeguard",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "pull requests, no tag",
                },
                stands_for: "Cilium 1.18.0 kube-proxy replacement (socket LB)",
                rule: "with serviceTopology, PreferClose or the topology annotation, a zoned node: each backend \
                       whose zone hints do not name the zone is skipped, one without hints is kept; no \
                       safeguards, so a zone without a fitting backend has none (refused, cilium#41022); \
                       PreferSameZone and PreferSameNode cluster-wide; the parser drops endpoints that are not \
                       serving (before #40969)",
                when_empty: CILIUM_EMPTY,
                errno: "EHOSTUNREACH (bpf/bpf_sock.c, not read at a tag); cilium#41022 reports ECONNREFUSED \
                        on 1.18.0: unverified",
                source: "cilium/cilium pkg/loadbalancer/writer/writer.go DefaultSelectBackends (cilium#38277), \
                         read at da6d7b49f4457398c6277edf8a076174730e9537, pre-1.18.0 development code \
                         (NewWriter `if !p.Config.EnableExperimentalLB {`) without the safeguards: `if \
                         fe.RedirectTo == nil && fe.Service.TrafficDistribution == \
                         loadbalancer.TrafficDistributionPreferClose {`, \
                         `thisZone := w.nodeZone.Load()`, `if len(be.ForZones) > 0 && thisZone != nil {`; \
                         cilium#41022",
                verified: false,
                verification: CILIUM_UNVERIFIED,
            },
            Self::Cilium1181 => ModelInfo {
                name: "cilium-1.18.1",
                short: Short {
                    releases: "Cilium v1.18.1 to the 1.18 patch before #42708 (unknown)",
                    for_nodes: "ignored (cluster-wide)",
                    for_zones: "PreferClose only, with safeguards",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "pull requests, no tag",
                },
                stands_for: "Cilium 1.18.1 up to the last 1.18 patch release without #42708 (merged \
                             2025-11-11; which patch release first carries it: not found in its release notes \
                             or threads)",
                rule: "as cilium-1.18.0 but with the safeguards (#41024, backport #41116): all kept backends if \
                       one lacks zone hints or none names the zone; the parser still drops endpoints that are \
                       not serving, so a starting pod is not seen (as in 1.17)",
                when_empty: CILIUM_EMPTY,
                errno: CILIUM_ERRNO,
                source: "cilium/cilium pkg/loadbalancer/writer/writer.go DefaultSelectBackends, read at a version \
                         of the file with the safeguards whose commit is not known: \
                         `for be := range bes { if be.Zone != nil && len(be.Zone.ForZones) > 0 { ... } else { \
                         missingHints = true; break } }`, `checkZoneHints = candidatesFound && !missingHints`; \
                         pkg/loadbalancer/reflectors/conversions.go isTopologyAware; #41116, #42708",
                verified: false,
                verification: CILIUM_UNVERIFIED,
            },
            Self::Cilium118x => ModelInfo {
                name: "cilium-1.18.x-1.19",
                short: Short {
                    releases: "Cilium 1.18 patches with #42708, v1.19.x",
                    for_nodes: "ignored (cluster-wide)",
                    for_zones: "off while a pod lacks hints",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "pull requests, no tag",
                },
                stands_for: "Cilium 1.18 patch releases with #42708 (backports #40969, #41234, #42170; the \
                             first of them is not known), and 1.19.x",
                rule: "as cilium-1.18.1, but not-ready backends are kept (maintenance, #42170) and the \
                       safeguards scan every backend, so a starting pod without hints turns zone routing off \
                       for the whole Service; PreferSameNode cluster-wide",
                when_empty: CILIUM_EMPTY,
                errno: CILIUM_ERRNO,
                source: "cilium/cilium pkg/loadbalancer/writer/writer.go DefaultSelectBackends (the safeguard \
                         loop above, over every backend of the Service); #42170 (\"keep the backends in the \
                         backends BPF map, but not in the services map\"), #42708; cilium#48259 (v1.19.7)",
                verified: false,
                verification: CILIUM_UNVERIFIED,
            },
            Self::Cilium120 => ModelInfo {
                name: "cilium-1.20",
                short: Short {
                    releases: "Cilium v1.20.x",
                    for_nodes: "nodeName instead (no hints)",
                    for_zones: "off while a pod starts",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "pull requests, no tag",
                },
                stands_for: "Cilium 1.20 as released, without #47961 (open)",
                rule: "with serviceTopology: PreferSameNode prefers the ready backends whose nodeName is this \
                       node (no hints read), else all backends cluster-wide; PreferClose/PreferSameZone use \
                       zone hints with the safeguards judged on every kept backend but the terminating ones \
                       (#45947), so a starting pod without hints still turns zones off (cilium#47960)",
                when_empty: CILIUM_EMPTY,
                errno: CILIUM_ERRNO,
                source: "cilium/cilium pkg/loadbalancer/writer/writer.go DefaultSelectBackends: cilium#44771, \
                         fixes #45215, #45947 (topologyPreferenceCandidate skips terminating backends), \
                         #46339, #47054; still affected: cilium#47960, #48259",
                verified: false,
                verification: CILIUM_UNVERIFIED,
            },
            Self::Cilium120Fix => ModelInfo {
                name: "cilium-1.20+47961",
                short: Short {
                    releases: "none yet: v1.20 with PR #47961",
                    for_nodes: "nodeName instead (no hints)",
                    for_zones: "starting pods skipped",
                    nothing_left: "refused at once",
                    errno: "EHOSTUNREACH",
                    read: "an open pull request",
                },
                stands_for: "Cilium 1.20 with cilium#47961 applied (open, in no release)",
                rule: "as cilium-1.20, but the safeguard scan also skips a not-ready (maintenance) backend that \
                       has no zone hints; one with a stale hint still counts",
                when_empty: CILIUM_EMPTY,
                errno: CILIUM_ERRNO,
                source: "cilium/cilium#47961 (pkg/loadbalancer/writer/writer.go: \"a continue in the scan \
                         loop\" for Maintenance backends without hints)",
                verified: false,
                verification: "unverified: an open pull request, read from its description; no release \
                               contains it",
            },
            Self::CalicoEbpf3310 => ModelInfo {
                name: "calico-ebpf-3.31.0-3.31.4",
                short: Short {
                    releases: "Calico v3.31.0 to v3.31.4, eBPF",
                    for_nodes: "ignored",
                    for_zones: "ignored",
                    nothing_left: "refused at once",
                    errno: "EPERM",
                    read: "read at every tag",
                },
                stands_for: "Calico eBPF data plane 3.31.0-3.31.4",
                rule: "hints ignored: every ready or terminating endpoint is selected, the ready ones are \
                       written; a Local policy keeps the local ones",
                when_empty: CALICO_EMPTY,
                errno: CALICO_ERRNO,
                source: "projectcalico/calico felix/bpf/proxy/syncer.go:607-608 at v3.31.0 and v3.31.4: `if \
                         ep.IsReady() || ep.IsTerminating() { if ShouldAppendTopologyAwareEndpoint(nodeZone, \
                         \"\", zoneHints) {`; felix/bpf/proxy/topology.go:36-41 at v3.31.4: `if \
                         hintsAnnotation != \"Auto\" && hintsAnnotation != \"auto\" { ... return true }`",
                verified: true,
                verification: "read at every tag v3.31.0-v3.31.4",
            },
            Self::CalicoEbpf3315 => ModelInfo {
                name: "calico-ebpf-3.31.5-3.31.7",
                short: Short {
                    releases: "Calico v3.31.5 to v3.31.7, eBPF",
                    for_nodes: "ignored (zone-routed)",
                    for_zones: "per endpoint, no all-or-nothing",
                    nothing_left: "refused at once",
                    errno: "EPERM",
                    read: "tags, not the gate",
                },
                stands_for: "Calico eBPF data plane 3.31.5-3.31.7 (projectcalico#11859 on k8s.io/kubernetes \
                             1.33)",
                rule: "topology-mode Auto: zone hints with the safeguards; else (any Service) the ready or \
                       terminating endpoints whose forZones names the node's zone, else all, each endpoint \
                       judged alone; node hints never seen (kube-proxy 1.33 reads forNodes only under the \
                       PreferSameTrafficDistribution gate, alpha and off, and Felix sets no gate), so \
                       PreferSameNode is zone-routed, and cluster-wide without zones; ready endpoints written",
                when_empty: CALICO_EMPTY,
                errno: CALICO_ERRNO,
                source: "projectcalico/calico at v3.31.5: felix/bpf/proxy/syncer.go:607,611 \
                         (FilterEpsByTopologyAwareRouting, then FilterEpsByTrafficDistribution), topology.go:128-150 \
                         (node hints, then zone hints, then all), proxy.go:174 \
                         `k8sp.NewEndpointsChangeTracker(ipVersion, p.hostname, nil, nil)`, go.mod:117 \
                         `k8s.io/kubernetes v1.33.10` (v3.31.7: v1.33.13), no feature gate set under felix/; \
                         kubernetes/kubernetes pkg/proxy/endpointslicecache.go addEndpoints at \
                         c2c7d507620b919d8c6cd5d43e689e7656186df5: `if len(endpoint.Hints.ForNodes) > 0 && \
                         utilfeature.DefaultFeatureGate.Enabled(features.PreferSameTrafficDistribution) {`; \
                         pkg/features/kube_features.go at b0b89d3bd251db932ed5a7bef66039fb88acab64 (a \
                         1.33-cycle tree): `PreferSameTrafficDistribution: { {Version: \
                         version.MustParse(\"1.33\"), Default: false, PreRelease: featuregate.Alpha} }`",
                verified: false,
                verification: "partly unverified: Calico read at every tag v3.31.5-v3.31.7; the kube-proxy files at \
                               the commits named, not at the v1.33.10-v1.33.13 tags Calico pins",
            },
            Self::CalicoEbpf332 => ModelInfo {
                name: "calico-ebpf-3.32",
                short: Short {
                    releases: "Calico v3.32.0 to v3.32.1, eBPF",
                    for_nodes: "per endpoint, no all-or-nothing",
                    for_zones: "per endpoint, no all-or-nothing",
                    nothing_left: "refused at once",
                    errno: "EPERM",
                    read: "tags, gate off-tag",
                },
                stands_for: "Calico eBPF data plane 3.32.0-3.32.1 (k8s.io/kubernetes 1.35)",
                rule: "topology-mode Auto: zone hints with the safeguards; else (any Service) the ready or \
                       terminating endpoints whose forNodes names this node, else whose forZones names its \
                       zone, else all, each endpoint judged alone (no all-or-nothing rule); only ready \
                       endpoints are written; a Local policy keeps the local ones",
                when_empty: CALICO_EMPTY,
                errno: CALICO_ERRNO,
                source: "projectcalico/calico at v3.32.0: felix/bpf/proxy/syncer.go:643,647, \
                         topology.go:128-150, proxy.go:184, go.mod:113 `k8s.io/kubernetes v1.35.4` (v3.32.1: \
                         v1.35.6); kubernetes/kubernetes pkg/features/kube_features.go in a post-1.35 \
                         main-branch tree (it has 1.36 entries; its commit is not known), where the gate is GA \
                         and locked on in 1.35: `{Version: version.MustParse(\"1.35\"), Default: true, \
                         PreRelease: featuregate.GA, LockToDefault: true},` (projectcalico#11751)",
                verified: false,
                verification: "partly unverified: Calico read at v3.32.0 and v3.32.1; the 1.35 gate in a \
                               post-1.35 main-branch kubernetes tree (no commit given), not at the \
                               v1.35.4/v1.35.6 tags Calico pins",
            },
        }
    }
}

/// What `study --models` says above its table: the setting every Cilium row assumes.
pub const CILIUM_SETTING: &str = "Cilium rows assume loadBalancer.serviceTopology=true. With Cilium's default \
(false) every Cilium release ignores hints and uses all endpoints, as kube-proxy does with none.";

/// `tierlb study --models`: one row per model, what a user picks a release by; `provenance` adds, under
/// each row, the full rule and where and how it was read.
pub fn models_text(provenance: bool) -> String {
    let mut rows = vec![
        ["MODEL", "RELEASES", "forNodes", "forZones", "NO ENDPOINT LEFT", "ERRNO", "RULE READ FROM"]
            .map(str::to_owned)
            .to_vec(),
    ];
    let mut details = Vec::new();
    for m in MODELS {
        let i = m.info();
        let s = i.short;
        rows.push(
            [i.name, s.releases, s.for_nodes, s.for_zones, s.nothing_left, s.errno, s.read]
                .map(str::to_owned)
                .to_vec(),
        );
        let mark = if i.verified { "" } else { " [unverified]" };
        details.push(format!(
            "{}: {}{mark}\n  rule: {}\n  empty set: {}\n  errno: {}\n  source: {}\n  code read: {}",
            i.name, i.stands_for, i.rule, i.when_empty, i.errno, i.source, i.verification
        ));
    }
    let mut widths = vec![0usize; rows[0].len()];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = format!("{CILIUM_SETTING}\n\n");
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if provenance {
        for d in details {
            let _ = write!(out, "\n{d}\n");
        }
    } else {
        out.push_str("\n--provenance adds each model's full rule, its sources and how they were read.\n");
    }
    out
}
