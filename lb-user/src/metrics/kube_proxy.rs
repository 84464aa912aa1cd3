//! kube-proxy's own metric families, under their names, types, labels and buckets (pkg/proxy/metrics/
//! metrics.go, Kubernetes 1.35), so that dashboards and alerts written for kube-proxy keep working when tierlb
//! replaces it. What each measures in tierlb: a sync is the agent applying one batch of source changes (or a
//! retry) to the maps, as kube-proxy's `syncProxyRules` applies one batch to iptables/nftables.
//!
//! - `sync_proxy_rules_duration_seconds{ip_family}`: each sync's duration, observed whatever its outcome (as
//!   kube-proxy's deferred observation). tierlb programs both families in one sync, so it is observed under
//!   `IPv4` and `IPv6`, as a dual-stack kube-proxy's two proxiers each observe theirs.
//! - `sync_proxy_rules_last_timestamp_seconds{ip_family}`: when a sync last applied everything it planned
//!   (a sync with a frontend that failed to apply is kube-proxy's failed restore: the time stays).
//! - `network_programming_duration_seconds{ip_family}`: per EndpointSlice version a successful sync applied,
//!   from its `endpoints.kubernetes.io/last-change-trigger-time` to the maps written (only trigger times later
//!   than the agent's start, as kube-proxy's `trackerStartTime`).
//! - `sync_proxy_rules_no_local_endpoints_total{traffic_policy, ip_family}` (a gauge despite the name):
//!   Service ports with a Local policy whose endpoints are all elsewhere, after the last sync.
//! - `sync_proxy_rules_endpoint_changes_total`, `sync_proxy_rules_service_changes_total`: EndpointSlices and
//!   Services added, changed or removed, as the source handed them over.
//! - `..._endpoint_changes_pending`, `..._service_changes_pending`: changes the source has received and the
//!   agent not yet taken in (read at scrape time from the source's counters; a source without a queue, the
//!   manifests directory, has none).
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime},
};

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets, linear_buckets},
    },
    registry::Registry,
};

use super::Labels;
use crate::{model::Family as IpFamily, source::PendingChanges};

/// `SyncProxyRulesLatency`'s buckets: `ExponentialBuckets(0.001, 2, 15)`.
fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// `NetworkProgrammingLatency`'s buckets: `MergeBuckets` of 0.25 s and 0.5 s, 1-59 s by 1 s, 60-115 s by 5 s
/// and 2-5 min by 30 s, after the 0 that `MergeBuckets` starts its result with.
fn programming_histogram() -> Histogram {
    let buckets = std::iter::once(0.0)
        .chain(linear_buckets(0.25, 0.25, 2))
        .chain(linear_buckets(1.0, 1.0, 59))
        .chain(linear_buckets(60.0, 5.0, 12))
        .chain(linear_buckets(120.0, 30.0, 7));
    Histogram::new(buckets)
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn family_label(f: IpFamily) -> Labels {
    vec![("ip_family".into(), f.as_str().into())]
}

/// Seconds since the Unix epoch; negative for a time before it.
fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// kube-proxy's metrics as tierlb keeps them. Clones share the metrics (the loop records, scrapes encode).
#[derive(Clone)]
pub struct KubeProxyStats {
    sync_duration: HistogramFamily,
    last_timestamp: Family<Labels, Gauge<f64, AtomicU64>>,
    network_programming: HistogramFamily,
    no_local: Family<Labels, Gauge>,
    endpoint_changes: Counter,
    service_changes: Counter,
    /// The source's received-but-not-taken changes (`None`: the source has no queue).
    pub pending: Option<PendingChanges>,
}

impl Default for KubeProxyStats {
    fn default() -> Self {
        Self {
            sync_duration: Family::new_with_constructor(sync_histogram),
            last_timestamp: Family::default(),
            network_programming: Family::new_with_constructor(programming_histogram),
            no_local: Family::default(),
            endpoint_changes: Counter::default(),
            service_changes: Counter::default(),
            pending: None,
        }
    }
}

impl KubeProxyStats {
    /// A sync took `took` and ended at `at`; `clean`: everything it planned was applied.
    pub fn synced(&self, took: Duration, at: SystemTime, clean: bool) {
        for f in [IpFamily::V4, IpFamily::V6] {
            self.sync_duration.get_or_create(&family_label(f)).observe(took.as_secs_f64());
            if clean {
                self.last_timestamp.get_or_create(&family_label(f)).set(unix_seconds(at));
            }
        }
    }

    /// A successful sync wrote, at `at`, slice versions whose changes were triggered at these times.
    pub fn programmed(&self, triggers: &[(IpFamily, SystemTime)], at: SystemTime) {
        for (f, t) in triggers {
            let latency = unix_seconds(at) - unix_seconds(*t);
            self.network_programming.get_or_create(&family_label(*f)).observe(latency);
        }
    }

    /// A sync took in this many Service and EndpointSlice changes.
    pub fn changes(&self, services: usize, endpoint_slices: usize) {
        self.service_changes.inc_by(services as u64);
        self.endpoint_changes.inc_by(endpoint_slices as u64);
    }

    /// After a sync: `count` Service ports of family `f` have a Local `traffic_policy` (`internal` or
    /// `external`) and no local endpoint.
    pub fn no_local_endpoints(&self, f: IpFamily, traffic_policy: &str, count: usize) {
        let labels =
            vec![("traffic_policy".into(), traffic_policy.into()), ("ip_family".into(), f.as_str().into())];
        self.no_local.get_or_create(&labels).set(super::gauge(count));
    }

    /// Register every family in `reg` (whose prefix is `kubeproxy`), with kube-proxy's help texts.
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        reg.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            self.last_timestamp.clone(),
        );
        reg.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            self.network_programming.clone(),
        );
        reg.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            self.no_local.clone(),
        );
        reg.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            self.endpoint_changes.clone(),
        );
        reg.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            self.service_changes.clone(),
        );
        let (services, slices) = self.pending.as_ref().map_or((0, 0), |p| {
            (p.services.load(Ordering::Relaxed), p.endpoint_slices.load(Ordering::Relaxed))
        });
        let pending = |n: i64| {
            let g = Gauge::<i64>::default();
            g.set(n.max(0));
            g
        };
        reg.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            pending(slices),
        );
        reg.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            pending(services),
        );
    }
}
