//! Maglev for new flows from outside (`FLAG_MAGLEV`): the backend of each new flow is the one the tier's table
//! names at the flow's bucket, as the agent builds the table and `lb_common::flow_hash` places the flow, so a
//! node whose plan lists the same backends in another order sends every flow to the same backend; without the
//! table (or with its backend down) the tier's random choice serves the flow, counted.
use lb_common::{
    FLAG_MAGLEV, FLAG_SNAT_TO_FRONTEND, MAP_MAGLEV, MaglevKey, MaglevTable, NS_MAGLEV_FALLBACK, PROTO_TCP,
    TIER_CLUSTER,
};
use tierlb::datapath::{addr, maglev};

use super::{
    NODE, PASS,
    lab::{Lab, sa},
    pkt::{Pkt, dst_of},
};

/// Ten local pods (the client's address kept: the DNAT alone shows the choice).
fn pods() -> Vec<String> {
    (2..12).map(|i| format!("10.244.1.{i}:8080")).collect()
}

/// A lab whose node port 30080 balances `backends` (in that order) with Maglev; the table written as the
/// agent writes it if `with_table`.
fn lab(tag: &str, backends: &[String], with_table: bool) -> Lab {
    let mut lab = Lab::new(tag);
    let names: Vec<&str> = backends.iter().map(String::as_str).collect();
    let fe = format!("{NODE}:30080");
    let svc_id = lab.frontend(&fe, PROTO_TCP, TIER_CLUSTER, &names, FLAG_SNAT_TO_FRONTEND | FLAG_MAGLEV);
    for b in backends {
        lab.local(&sa(b).ip().to_string());
    }
    if with_table {
        let tier: Vec<_> = backends.iter().map(|b| addr::backend(sa(b), PROTO_TCP)).collect();
        let table = maglev::table(&tier).unwrap();
        let mut m: aya::maps::HashMap<_, MaglevKey, MaglevTable> =
            aya::maps::HashMap::try_from(lab.map(MAP_MAGLEV)).unwrap();
        m.insert(MaglevKey { svc_id, generation: 1, tier: TIER_CLUSTER as u32 }, *table, 0).unwrap();
    }
    lab
}

/// Where `n` new flows from ports 40000 on went.
fn sent(lab: &mut Lab, n: u16) -> Vec<String> {
    (0..n)
        .map(|i| {
            let syn = Pkt::tcp(&format!("192.0.2.100:{}", 40000 + i), &format!("{NODE}:30080"), 0x02);
            let (rc, out) = lab.run("tc_ingress", &syn.bytes());
            assert_eq!(rc, PASS);
            dst_of(&out).to_string()
        })
        .collect()
}

#[test]
fn tc_maglev_sends_each_new_flow_to_its_buckets_backend_whatever_order_the_node_lists_them() {
    let backends = pods();
    let mut one = lab("tc-maglev", &backends, true);
    let got = sent(&mut one, 200);
    // The prediction: the agent's table at the flow's bucket.
    let tier: Vec<_> = backends.iter().map(|b| addr::backend(sa(b), PROTO_TCP)).collect();
    let table = maglev::table(&tier).unwrap();
    let want: Vec<String> = (0..200u16)
        .map(|i| {
            let bucket = maglev::flow_bucket(
                sa(&format!("192.0.2.100:{}", 40000 + i)),
                sa(&format!("{NODE}:30080")),
                PROTO_TCP,
            );
            backends[usize::from(table.slots[bucket])].clone()
        })
        .collect();
    assert_eq!(got, want, "each flow at its bucket's backend");
    assert_eq!(one.ns_counter(NS_MAGLEV_FALLBACK), 0);
    let used: std::collections::BTreeSet<&String> = got.iter().collect();
    assert!(used.len() >= 9, "200 flows spread over the ten: {used:?}");
    drop(one);

    // Another node listing the same backends in another order: the same backend for every flow.
    let mut reordered = backends.clone();
    reordered.reverse();
    reordered.rotate_left(4);
    let mut other = lab("tc-maglev-2", &reordered, true);
    assert_eq!(sent(&mut other, 200), want, "the same flows, the same backends on another node");
}

#[test]
fn tc_maglev_without_its_table_falls_back_to_the_random_choice_counted() {
    let backends = pods();
    let mut lab = lab("tc-maglev-miss", &backends, false);
    let got = sent(&mut lab, 50);
    assert!(got.iter().all(|g| backends.contains(g)), "{got:?}");
    assert_eq!(lab.ns_counter(NS_MAGLEV_FALLBACK), 50, "every flow counted");
}
