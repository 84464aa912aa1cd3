//! Arbitrary clusters -> plan -> map contents, through the agent's own path (`AgentCore`: hints, plan,
//! lowering, claims, reconciler) into the in-memory maps, which are sometimes too small for them. The clusters
//! (`tierlb_fuzz::cluster`) have ClusterIP, NodePort and LoadBalancer Services with node ports, ingress IPs,
//! externalIPs, both traffic policies and sessionAffinity, on a node with addresses, under
//! `--nodeport-addresses`, `--external-ip-cidrs` and an API server address. Invariants: no panic; every
//! frontend in the maps, connect-time and outside scope, is one `tierlb_fuzz::cluster::expected` gives, with
//! its tiers, flags and affinity timeout (so every backend of a tier is a usable endpoint of that Service);
//! every expected frontend that is missing was refused by a full map, with an error for that frontend naming
//! its Service port (so each Service is wholly programmed or named in `errors`), and none is missing when the
//! maps have room; the slot and member entries are exactly those of the frontends present.
#![no_main]

use std::{collections::BTreeMap, net::SocketAddr, time::Instant};

use libfuzzer_sys::fuzz_target;
use tierlb::{
    agent::AgentCore,
    datapath::{MapError, addr, fake::FakeMaps, read_back},
    model::Model,
    source::{Changes, ModelSource, Refresh},
};
use tierlb_fuzz::cluster::{Cluster, NODES, expected};

/// A source that hands over one model.
struct Fixed(Option<Model>);

impl ModelSource for Fixed {
    fn refresh(&mut self) -> std::io::Result<Refresh> {
        let changes = match self.0.take() {
            Some(m) => Changes::All(m),
            None => Changes::Objects { removed: Vec::new(), upserted: Vec::new() },
        };
        Ok(Refresh { changes, diagnostics: Vec::new(), stale: Vec::new() })
    }
    fn describe(&self) -> String {
        "fuzz input".into()
    }
}

/// Roomy maps: far more than a generated cluster's frontends and slots.
const ROOMY: (u32, u32) = (4096, 1 << 16);

fuzz_target!(|cluster: Cluster| {
    let model = cluster.model();
    let want = expected(&model, &cluster.node_view());
    let zone_flag = cluster.zone_flag.and(cluster.zone());
    let (max_frontends, max_slots) = cluster.capacity().unwrap_or(ROOMY);
    // `BACKEND_STATE`'s capacity (`with_backends`) is left unbounded: a sync writes no backend mark (marking
    // a backend down does), so it cannot run out here.
    let maps = FakeMaps::new(max_frontends, max_slots);
    let mut agent = AgentCore::new(NODES[0], zone_flag, Box::new(Fixed(Some(model))), maps)
        .with_external(cluster.external_config());
    let report = agent.sync(Instant::now()).expect("an in-memory source cannot fail");
    assert!(report.conflicts.is_empty(), "no two Services claim one frontend: {:?}", report.conflicts);
    let writer = agent.reconciler().writer();
    let maps = read_back(writer).expect("fake maps");
    let keyed: BTreeMap<_, _> = want
        .iter()
        .map(|(f, exp)| {
            let proto = f.protocol.number();
            let key = if f.outside {
                addr::outside_frontend_key(f.addr.ip(), f.addr.port(), proto)
            } else {
                addr::frontend_key(f.addr.ip(), f.addr.port(), proto)
            };
            (key, (f, exp))
        })
        .collect();
    for (key, rb) in &maps {
        let Some((f, exp)) = keyed.get(key) else {
            let expected: Vec<_> = want.keys().collect();
            panic!(
                "unexpected frontend {} (outside: {}), expected {expected:?}",
                addr::frontend_addr(key),
                key.is_outside()
            );
        };
        let tiers: Vec<Vec<SocketAddr>> = rb
            .tiers
            .iter()
            .map(|t| {
                let mut v: Vec<_> = t.iter().map(addr::backend_addr).collect();
                v.sort();
                v
            })
            .collect();
        assert_eq!(tiers, exp.tiers, "tiers of {f:?}");
        assert_eq!(rb.value.flags, exp.flags, "flags of {f:?}");
        assert_eq!(rb.value.affinity_timeout_s, exp.affinity_timeout_s, "affinity timeout of {f:?}");
    }
    for e in &report.errors {
        assert!(matches!(e.error, MapError::Full { .. } | MapError::NoServiceId { .. }), "{e}");
        assert!(keyed.contains_key(&e.frontend), "{e}: a frontend kube-proxy's rules do not give");
        assert!(!maps.contains_key(&e.frontend), "{e}, yet the frontend is in the maps");
    }
    for (key, (f, exp)) in &keyed {
        if maps.contains_key(key) {
            continue;
        }
        let error = report.errors.iter().find(|e| e.frontend == *key);
        let error =
            error.unwrap_or_else(|| panic!("no frontend for {f:?} and no error: {:?}", report.errors));
        assert_eq!(*error.name, exp.port, "the error for {f:?} names another Service port");
    }
    if cluster.capacity().is_none() {
        assert!(report.errors.is_empty(), "{:?}", report.errors);
    }
    // A refused write leaves nothing behind: the slot map holds the slots of the frontends present (in
    // `SLOT_BLOCK`s), the member map one entry per distinct backend of each with sessionAffinity.
    let slots: usize =
        maps.values().map(|rb| lb_common::slot_blocks(rb.tiers.iter().map(Vec::len).sum())).sum();
    assert_eq!(writer.slot_entries(), slots, "slot map entries");
    let members: usize = maps
        .values()
        .filter(|rb| rb.value.affinity_timeout_s != 0)
        .map(|rb| rb.tiers.iter().flatten().collect::<std::collections::BTreeSet<_>>().len())
        .sum();
    assert_eq!(writer.member_map().len(), members, "member map entries");
});
