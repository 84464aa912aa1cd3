//! Fragments from outside, with real sockets, IPv4 and IPv6: the client's kernel fragments a 3,000-byte UDP
//! datagram to the node port (its MTU is 1500; IPv6 with a Fragment header); both pods, node-1's (DNAT) and
//! node-2's (SNAT), get it whole and answer. Without the later fragments following the first one's
//! translation no datagram is reassembled.
use std::{collections::BTreeMap, net::UdpSocket, time::Duration};

use super::lab::{Lab, NODE_1, NODE_1_6, from, sa};

#[test]
fn north_south_fragmented_udp_datagrams_reach_both_pods_whole() {
    let lab = Lab::new("ns-frag", "Cluster", true);
    let _agent = lab.start_agent();
    for to in [sa(NODE_1, 30053), sa(NODE_1_6, 30053)] {
        let answers: Vec<Result<String, String>> = from(&lab.client, move || {
            (0..20)
                .map(|_| {
                    let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                    let s = UdpSocket::bind(any).map_err(|e| e.to_string())?;
                    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
                    s.send_to(&[b'x'; 3000], to).map_err(|e| e.to_string())?;
                    let mut buf = [0u8; 512];
                    let (n, _) = s.recv_from(&mut buf).map_err(|e| e.to_string())?;
                    Ok(String::from_utf8_lossy(&buf[..n]).split(' ').next().unwrap_or_default().to_owned())
                })
                .collect()
        });
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for a in &answers {
            *by.entry(a.clone().unwrap_or_else(|e| format!("error: {e}"))).or_default() += 1;
        }
        assert!(answers.iter().all(Result::is_ok), "{to}: every fragmented datagram answered: {by:?}");
        assert!(by.contains_key("web-node-1") && by.contains_key("web-node-2"), "{to}: both pods: {by:?}");
    }
    let st = lab.status();
    assert_eq!(st[0]["north_south"]["counters"]["pass_fragment"], 0, "no fragment passed untranslated: {st}");
}
