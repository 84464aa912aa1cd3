//! sessionAffinity ClientIP for clients outside the node: keyed by the client's address, as kube-proxy's
//! `recent` match keys it, every new flow of a client goes to the backend its first one got.
use std::collections::BTreeSet;

use lb_common::{FLAG_SNAT_TO_FRONTEND, PROTO_TCP};

use super::{
    NODE, PASS,
    lab::Lab,
    pkt::{Pkt, dst_of},
};

const BACKENDS: [&str; 2] = ["10.244.1.2:8080", "10.244.1.3:8080"];

/// The backends `n` new flows from `client` (from ports 40000 on) to `fe` were sent to.
fn backends_of(lab: &mut Lab, client: &str, fe: &str, n: u16) -> BTreeSet<String> {
    (0..n)
        .map(|i| {
            let syn = Pkt::tcp(&format!("{client}:{}", 40000 + i), fe, 0x02);
            let (rc, out) = lab.run("tc_ingress", &syn.bytes());
            assert_eq!(rc, PASS);
            dst_of(&out).to_string()
        })
        .collect()
}

#[test]
fn tc_session_affinity_sends_every_new_flow_of_an_outside_client_to_its_first_backend() {
    let mut lab = Lab::new("tc-affinity");
    for fe in ["30080", "30081"] {
        lab.frontend(&format!("{NODE}:{fe}"), PROTO_TCP, 2, &BACKENDS, FLAG_SNAT_TO_FRONTEND);
    }
    lab.local("10.244.1.2");
    lab.local("10.244.1.3");
    lab.affinity(&format!("{NODE}:30080"), PROTO_TCP, 2, &BACKENDS, 10_800);
    let (sticky, plain) = (format!("{NODE}:30080"), format!("{NODE}:30081"));
    for client in ["192.0.2.100", "192.0.2.101", "192.0.2.102"] {
        let got = backends_of(&mut lab, client, &sticky, 20);
        assert_eq!(got.len(), 1, "{client}: 20 new flows, one backend: {got:?}");
    }
    let got = backends_of(&mut lab, "192.0.2.100", &plain, 20);
    assert_eq!(got.len(), 2, "without affinity the same client is balanced: {got:?}");
}
