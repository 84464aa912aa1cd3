//! Arbitrary objects -> plan -> map contents, through the agent's own path (`AgentCore`: hints, plan,
//! lowering, reconciler) into the in-memory maps. Invariants: no panic; the maps hold exactly one frontend
//! per VIP, port and protocol, and its tiers are what kube-proxy's rules select
//! (`tierlb_fuzz::cluster::expected`), so every backend of a tier is a usable endpoint of that Service.
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use tierlb::{
    agent::AgentCore,
    datapath::{addr, fake::FakeMaps, read_back},
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

fuzz_target!(|cluster: Cluster| {
    let model = cluster.model();
    let want = expected(&model, NODES[0], cluster.zone().as_deref());
    let zone_flag = cluster.zone_flag.and(cluster.zone());
    let mut agent =
        AgentCore::new(NODES[0], zone_flag, Box::new(Fixed(Some(model))), FakeMaps::new(4096, 1 << 16));
    let report = agent.sync(Instant::now()).expect("an in-memory source cannot fail");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let maps = read_back(agent.reconciler().writer()).expect("fake maps");
    let got: Vec<_> = maps.keys().map(addr::frontend_addr).collect();
    assert_eq!(maps.len(), want.len(), "frontends {got:?} vs {:?}", want.keys().collect::<Vec<_>>());
    for ((vip, proto), exp) in &want {
        let key = addr::frontend_key(vip.ip(), vip.port(), proto.number());
        let rb = maps.get(&key).unwrap_or_else(|| panic!("no frontend for {vip}/{proto:?}"));
        let tiers: Vec<Vec<std::net::SocketAddr>> = rb
            .tiers
            .iter()
            .map(|t| {
                let mut v: Vec<_> = t.iter().map(addr::backend_addr).collect();
                v.sort();
                v
            })
            .collect();
        assert_eq!(tiers, exp.tiers, "tiers of {vip}/{proto:?}");
        assert_eq!(rb.value.flags & lb_common::FLAG_POLICY_LOCAL != 0, exp.local, "Local flag of {vip}");
    }
});
