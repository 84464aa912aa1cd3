//! Real kube-proxy's rows: kube-proxy v1.36.3 (built here from Kubernetes' code, `lb_testkit::kube_proxy`) in
//! iptables mode and in nftables mode, as kubeadm configures it but for the conntrack sysctls, programming
//! the bench's Services from the real API server (created through it, as `real_apiserver` does for the
//! agent), in the bench's namespace. Per mode and Service count: how long its first sync took (from its start
//! to its rules for every Service, and the sync itself by its own `kubeproxy_sync_proxy_rules_duration_seconds`),
//! one EndpointSlice change (from `kubectl replace` to its rules, and that sync's own duration), and connects
//! to the measured Service through its rules against direct, interleaved pair by pair as the tierlb rows
//! are. Its rules are removed afterwards with `kube-proxy --cleanup`, in the namespace only.
use std::{
    net::{IpAddr, SocketAddr},
    process::Command,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use lb_testkit::{
    kube::k8s_bin,
    kube_proxy::{KubeProxy, Mode, http_get, metric},
    manifests::{Ep, Svc},
    sandbox::{NetNs, confine},
};
use serde_json::Value;

use super::{
    figures::{DataPath, KubeProxyAfter, KubeProxySync, LoadTime, NsRow, Row},
    load::BACKEND,
    real_apiserver::RealApiServer,
    run::Loader,
    workloads::{EDITED, endpoints_to, target, vip},
};

/// How long kube-proxy's first sync may take before it is stopped (in iptables mode at 10,000 Services it did
/// not finish within 10 minutes here: its `iptables-restore` of 110,000 chains on the nf_tables backend).
pub(super) const FIRST_SYNC_LIMIT: Duration = Duration::from_mins(5);

/// The Service counts real kube-proxy is measured at.
pub(super) const COUNTS: [usize; 3] = [1, 1_000, 10_000];

/// kube-proxy's modes, with the bench's name for each.
const MODES: [(Mode, DataPath); 2] =
    [(Mode::Iptables, DataPath::KubeProxyIptables), (Mode::Nftables, DataPath::KubeProxyNftables)];

/// Service `i` of `n`, `per` endpoints (the measured one's is the bench's backend, on this node), as
/// objects for the API server.
fn docs(i: usize, n: usize, per: usize) -> Vec<Value> {
    let svc = Svc::new(&format!("svc-{i}"), IpAddr::V4(vip(i)), 80, 8080);
    let eps: Vec<Ep> = endpoints_to(BACKEND.parse().expect("valid"), i, per, n)
        .into_iter()
        .enumerate()
        .map(|(e, a)| Ep::ready(a.ip(), &format!("node-{}", (i + e) % 3 + 1)))
        .collect();
    let mut out = vec![svc.service()];
    out.extend(svc.slices(&eps));
    out
}

/// Everything measured of real kube-proxy: its sync figures, its rows, and their ratios to direct.
pub(super) struct Measured {
    pub syncs: Vec<KubeProxySync>,
    pub rows: Vec<Row>,
    pub ratios: Vec<NsRow>,
}

/// Real kube-proxy in both modes at each of `counts`, `pairs` interleaved pairs of slices per load mode.
pub(super) fn measure(
    loader: &Loader,
    counts: &[usize],
    per: usize,
    pairs: usize,
) -> anyhow::Result<Measured> {
    let mut m = Measured { syncs: Vec::new(), rows: Vec::new(), ratios: Vec::new() };
    for &n in counts {
        let objects: Vec<Value> = (0..n).flat_map(|i| docs(i, n, per)).collect();
        let mut api = RealApiServer::start(objects)?;
        api.link(loader.ns)?;
        // The edited slice as created; each change flips it (an endpoint more, then as created), so that
        // every mode that gets that far sees one.
        let mut grown = false;
        for (mode, path) in MODES {
            let (sync, proxy) = one_mode(&api, loader, mode, (n, per), &mut grown)?;
            m.syncs.push(sync);
            let Some(mut proxy) = proxy else {
                cleanup(loader.ns)?;
                continue;
            };
            let target = SocketAddr::new(IpAddr::V4(vip(target(n))), 80);
            let (rows, ratios) = loader.interleaved(path, n, None, target, pairs)?;
            proxy.stop(Duration::from_secs(10));
            cleanup(loader.ns)?;
            m.rows.extend(rows);
            m.ratios.extend(ratios);
        }
    }
    Ok(m)
}

/// The first sync and one change (`grown` false: a not-Ready endpoint added to the edited Service's slice;
/// true: the slice as created again; flipped once the change is made) of kube-proxy in `mode` at `n` Services of `per` endpoints; kube-proxy still running.
fn one_mode(
    api: &RealApiServer,
    loader: &Loader,
    mode: Mode,
    (n, per): (usize, usize),
    grown: &mut bool,
) -> anyhow::Result<(KubeProxySync, Option<KubeProxy>)> {
    let t0 = Instant::now();
    let proxy = match api.kube_proxy(loader.ns, mode, FIRST_SYNC_LIMIT) {
        Ok(p) => p,
        Err(e) if t0.elapsed() >= FIRST_SYNC_LIMIT => {
            let why = e.to_string();
            eprintln!(
                "bench: kube-proxy {:<8} {n:>6} services: {}",
                mode.as_str(),
                why.lines().next().unwrap_or("")
            );
            let first_sync = LoadTime::Stopped { limit: FIRST_SYNC_LIMIT };
            return Ok((KubeProxySync { mode: mode.as_str(), services: n, first_sync, after: None }, None));
        }
        Err(e) => return Err(e),
    };
    let first_sync = t0.elapsed();
    // kube-proxy sets its last-sync timestamp before it observes the sync's duration (a deferred call, after
    // its health-check and conntrack housekeeping: at 10,000 Services in nftables mode the histogram was still
    // empty when the timestamp was read), so the duration is read once it has one observation.
    let observed = Instant::now();
    let (first_sum, first_count) = loop {
        match sync_metric(&proxy, loader) {
            Ok(m) => break m,
            Err(e) if observed.elapsed() > Duration::from_mins(1) => {
                return Err(e.context("a minute after kube-proxy's first sync"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    // One change: the edited Service's slice with a not-Ready endpoint more (or, once grown, as created), as
    // an operator's `kubectl replace`; what the connects reach does not change.
    let edited = EDITED.min(n - 1);
    let mut slice = docs(edited, n, per).pop().context("a slice")?;
    if !*grown && let Some(eps) = slice["endpoints"].as_array_mut() {
        eps.push(serde_json::json!({
            "addresses": ["10.255.255.1"],
            "nodeName": "node-2",
            "conditions": {"ready": false, "serving": false, "terminating": false},
        }));
    }
    let since = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let t1 = Instant::now();
    api.replace(&slice)?;
    *grown = !*grown;
    loop {
        let last = proxy.last_sync(loader.ns)?;
        let (_, count) = sync_metric(&proxy, loader)?;
        if last >= since && count > first_count {
            break;
        }
        anyhow::ensure!(
            t1.elapsed() < Duration::from_mins(2),
            "kube-proxy did not sync the change in 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let one_change = t1.elapsed();
    let (sum, count) = sync_metric(&proxy, loader)?;
    let after = KubeProxyAfter {
        first_sync_metric: first_sum / first_count.max(1.0),
        one_change,
        one_change_metric: (sum - first_sum) / (count - first_count).max(1.0),
    };
    eprintln!(
        "bench: kube-proxy {:<8} {n:>6} services: first sync {:.2} s after its start ({:.3} s by its own metric), \
         one change {:.2} s to its rules ({:.3} s by its metric)",
        mode.as_str(),
        first_sync.as_secs_f64(),
        after.first_sync_metric,
        one_change.as_secs_f64(),
        after.one_change_metric
    );
    let sync = KubeProxySync {
        mode: mode.as_str(),
        services: n,
        first_sync: LoadTime::Done(first_sync),
        after: Some(after),
    };
    Ok((sync, Some(proxy)))
}

/// kube-proxy's `kubeproxy_sync_proxy_rules_duration_seconds` sum and count.
fn sync_metric(proxy: &KubeProxy, loader: &Loader) -> anyhow::Result<(f64, f64)> {
    let (_, text) = http_get(loader.ns, proxy.metrics, "/metrics")?;
    let get = |name: &str| metric(&text, name).with_context(|| format!("kube-proxy's {name}"));
    Ok((
        get("kubeproxy_sync_proxy_rules_duration_seconds_sum")?,
        get("kubeproxy_sync_proxy_rules_duration_seconds_count")?,
    ))
}

/// `kube-proxy --cleanup` in `ns` (the bench's namespace or the north-south lab's node): its iptables and
/// nftables rules gone.
pub(super) fn cleanup(ns: &NetNs) -> anyhow::Result<()> {
    let mut cmd = Command::new(k8s_bin("kube-proxy"));
    cmd.arg("--cleanup");
    confine(&mut cmd, None, Some(ns))?;
    let out = cmd.output().context("kube-proxy --cleanup")?;
    anyhow::ensure!(out.status.success(), "kube-proxy --cleanup: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_measured_service_points_at_the_backend_and_the_others_elsewhere() {
        let n = 1_000;
        let measured = super::docs(super::target(n), n, 10);
        assert_eq!(measured[1]["endpoints"].as_array().unwrap().len(), 1);
        assert_eq!(measured[1]["endpoints"][0]["addresses"][0], "10.244.0.10");
        let other = super::docs(3, n, 10);
        assert_eq!(other[1]["endpoints"].as_array().unwrap().len(), 10);
        assert!(other[1]["endpoints"].as_array().unwrap().iter().all(|e| e["addresses"][0] != "10.244.0.10"));
    }
}
