//! Real kube-proxy from outside the node: kube-proxy v1.36.3 (iptables mode, then nftables mode) on the
//! north-south lab's node, programming N NodePort Services (`externalTrafficPolicy: Cluster`, 10 endpoints
//! each; the measured one, in the middle, has the lab's pod) that it reads from the real API server, the
//! external client connecting to the node's address at the measured Service's node port. The hand-written
//! rule sets are gone from the node's namespace by then (kube-proxy owns chains of the same names); tierlb's
//! tc programs stay attached to the uplink, as they are for the hand-written rows (their lookup misses and
//! passes the packet). Each round runs direct, then kube-proxy (then kube-proxy, then direct, the next
//! round), and a ratio is taken per round, as the other north-south rows are. kube-proxy's rules are removed
//! with `kube-proxy --cleanup` in the node's namespace afterwards.
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use lb_testkit::{kube_proxy::Mode, manifests::Ep};
use serde_json::Value;

use super::{
    figures::{DataPath, KubeProxySync, LoadTime, NsRow},
    kube_proxy::{FIRST_SYNC_LIMIT, cleanup},
    load::{LoadMode, LoadResult},
    north_south::{Lab, NODE, POD, POD_PORT},
    real_apiserver::RealApiServer,
    run::Loader,
    workloads::{endpoints_to, target, vip},
};

/// The node port of Service `i`: 40000 + `i` (the hand-written sets and tierlb's have theirs below).
pub(super) const BASE: u16 = 40_000;
/// The API server's node-port range, wide enough for 10,000 Services from `BASE`.
const RANGE: &str = "40000-50999";

/// NodePort Service `i` of `n` and its slice (`per` endpoints; the measured Service's is the lab's pod).
fn docs(i: usize, n: usize, per: usize) -> Vec<Value> {
    let svc = lb_testkit::manifests::Svc::new(&format!("np-{i}"), IpAddr::V4(vip(i)), 80, POD_PORT);
    let mut service = svc.service();
    service["spec"]["type"] = "NodePort".into();
    service["spec"]["ports"][0]["nodePort"] = (u64::from(BASE) + i as u64).into();
    let eps: Vec<Ep> = endpoints_to(SocketAddr::new(POD.into(), POD_PORT), i, per, n)
        .into_iter()
        .map(|a| Ep::ready(a.ip(), "node-1"))
        .collect();
    let mut out = vec![service];
    out.extend(svc.slices(&eps));
    out
}

/// Real kube-proxy's rows from outside at `n` Services, `rounds` interleaved rounds per load mode; a mode whose
/// first sync on the node did not finish (`on_node`, the on-node rows' syncs) is not started again here.
pub(super) fn rows(
    lab: &Lab,
    loader: &Loader,
    n: usize,
    per: usize,
    rounds: usize,
    on_node: &[KubeProxySync],
) -> anyhow::Result<Vec<NsRow>> {
    let objects: Vec<Value> = (0..n).flat_map(|i| docs(i, n, per)).collect();
    let mut api = RealApiServer::start_with(objects, IpAddr::V4(NODE), Some(RANGE))?;
    api.link(&lab.node.netns)?;
    let direct_to = SocketAddr::new(POD.into(), POD_PORT);
    let via = SocketAddr::new(NODE.into(), BASE + u16::try_from(target(n))?);
    let mut out = Vec::new();
    for (mode, path) in
        [(Mode::Iptables, DataPath::KubeProxyIptables), (Mode::Nftables, DataPath::KubeProxyNftables)]
    {
        let stopped = on_node.iter().any(|s| {
            s.mode == mode.as_str() && s.services == n && matches!(s.first_sync, LoadTime::Stopped { .. })
        });
        if stopped {
            eprintln!(
                "bench: from outside {:<20} {n:>6} services: not started (its first sync on the node did not finish within {} s)",
                path.as_str(),
                FIRST_SYNC_LIMIT.as_secs()
            );
            continue;
        }
        let mut proxy = api.kube_proxy(&lab.node.netns, mode, FIRST_SYNC_LIMIT)?;
        for load in LoadMode::ALL {
            let (mut direct, mut proxied): (Vec<LoadResult>, Vec<LoadResult>) = (Vec::new(), Vec::new());
            for r in 0..rounds {
                if r % 2 == 0 {
                    direct.push(loader.run(None, direct_to, load)?);
                    proxied.push(loader.run(None, via, load)?);
                } else {
                    proxied.push(loader.run(None, via, load)?);
                    direct.push(loader.run(None, direct_to, load)?);
                }
            }
            let row = NsRow::of(path, n, load, &proxied, &direct, None);
            super::north_south::progress(&row);
            out.push(row);
        }
        proxy.stop(Duration::from_secs(10));
        cleanup(&lab.node.netns)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_measured_node_port_service_points_at_the_pod_and_every_port_is_in_the_range() {
        let n = 10_000;
        let measured = super::docs(super::target(n), n, 10);
        assert_eq!(measured[0]["spec"]["type"], "NodePort");
        assert_eq!(measured[1]["endpoints"].as_array().unwrap().len(), 1);
        assert_eq!(measured[1]["endpoints"][0]["addresses"][0], super::POD.to_string());
        let (lo, hi) = super::RANGE.split_once('-').unwrap();
        let last = super::docs(n - 1, n, 10)[0]["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        assert_eq!(lo.parse::<u16>().unwrap(), super::BASE);
        assert!(last <= hi.parse::<u64>().unwrap(), "{last} beyond {hi}");
    }
}
