//! What each Service and frontend adds to the maps the tc programs read besides the frontends: this node's
//! endpoint addresses (`LOCAL_BACKENDS`), the source ranges of load-balancer frontends (`SOURCE_RANGES`) and
//! the UDP backends whose flows stay in the conntrack map. Kept per Service and per frontend, with a count
//! per address, so that a sync which planned a few Services changes only what those Services add: an edit
//! costs the same at 100 Services as at 100,000 (the whole sets were rebuilt and compared on every sync).
use std::{collections::BTreeMap, net::IpAddr};

use lb_common::{Backend, FrontendKey, PROTO_UDP};

use crate::{
    datapath::{MapWriter, Reconciler, addr, tc::SourceRange},
    model::{Family, Model, ObjKey, node_addresses::Cidr},
};

/// One frontend's part: its source ranges, for a UDP frontend its backends, and whether its address is a
/// load-balancer IP or externalIP (an outside frontend that is not a node port), which the tc programs'
/// pre-filter holds.
#[derive(Debug, Default, PartialEq)]
struct Frontend {
    ranges: Box<[Cidr]>,
    udp: Box<[Backend]>,
    lb_addr: bool,
}

/// What changed in the sets since the last update: entries to add and to remove, and the UDP backends no
/// frontend holds any more (their flows are to be forgotten).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Delta {
    pub local_added: Vec<IpAddr>,
    pub local_removed: Vec<IpAddr>,
    pub ranges_added: Vec<SourceRange>,
    pub ranges_removed: Vec<SourceRange>,
    pub udp_departed: Vec<Backend>,
}

/// The sets, with what each Service and frontend added to them.
#[derive(Debug, Default)]
pub(super) struct Contributions {
    /// This node's endpoint addresses by Service (only Services that have some).
    local_of: BTreeMap<ObjKey, Box<[IpAddr]>>,
    /// How many Services each address is an endpoint of.
    local: BTreeMap<IpAddr, u32>,
    /// The frontends with a part, by the Service they were applied for when it was taken.
    frontends_of: BTreeMap<ObjKey, crate::model::compact::Few<FrontendKey>>,
    frontends: BTreeMap<FrontendKey, Frontend>,
    /// How many frontends each UDP backend is a backend of.
    udp: BTreeMap<Backend, u32>,
    /// How many load-balancer IP and externalIP frontends each address has.
    lb_addrs: BTreeMap<IpAddr, u32>,
}

impl Contributions {
    /// Every Service's part, from scratch.
    pub(super) fn of_all<W: MapWriter>(model: &Model, node: &str, rec: &Reconciler<W>) -> Self {
        let mut c = Self::default();
        // Nothing was written before: no delta to keep (at 100,000 Services, 400,000 local endpoints: this
        // pass took 0.62 s with the delta and 0.5 s without, single runs).
        c.take(model, node, rec, model.services.keys(), false);
        c
    }

    /// Rebuild the maps with full nodes (`model::compact::repack`; after `of_all` inserted them in key order,
    /// their nodes are a little over half full).
    pub(super) fn repack(&mut self) {
        use crate::model::compact::repack;
        repack(&mut self.local_of);
        repack(&mut self.local);
        repack(&mut self.frontends_of);
        repack(&mut self.frontends);
        repack(&mut self.udp);
        repack(&mut self.lb_addrs);
    }

    /// The addresses of the load-balancer IP and externalIP frontends.
    pub(super) fn lb_addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.lb_addrs.keys().copied()
    }

    /// This node's endpoint addresses.
    pub(super) fn local(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.local.keys().copied()
    }

    /// Every source range.
    pub(super) fn ranges(&self) -> impl Iterator<Item = SourceRange> + '_ {
        self.frontends.iter().flat_map(|(k, f)| f.ranges.iter().map(|c| (*k, *c)))
    }

    /// Every UDP backend.
    pub(super) fn udp(&self) -> impl Iterator<Item = Backend> + '_ {
        self.udp.keys().copied()
    }

    /// Take the parts of `services` again (the Services a sync planned, with those whose frontends it moved)
    /// and say what changed in the sets.
    pub(super) fn update<'a, W: MapWriter>(
        &mut self,
        model: &Model,
        node: &str,
        rec: &Reconciler<W>,
        services: impl IntoIterator<Item = &'a ObjKey>,
    ) -> Delta {
        self.take(model, node, rec, services, true)
    }

    /// `update`; without `track`, the sets only (the delta comes back empty).
    fn take<'a, W: MapWriter>(
        &mut self,
        model: &Model,
        node: &str,
        rec: &Reconciler<W>,
        services: impl IntoIterator<Item = &'a ObjKey>,
        track: bool,
    ) -> Delta {
        let mut delta = Delta::default();
        let mut touched: BTreeMap<IpAddr, bool> = BTreeMap::new();
        let mut frontends: Vec<FrontendKey> = Vec::new();
        for svc in services {
            let old = self.local_of.remove(svc).unwrap_or_default();
            let mut new: Vec<IpAddr> = model
                .slices_of(svc)
                .filter(|_| model.services.contains_key(svc))
                .flat_map(|s| &s.endpoints)
                .filter(|e| e.node_name.as_deref() == Some(node))
                .filter_map(|e| e.address)
                .collect();
            new.sort_unstable();
            new.dedup();
            if track {
                for ip in old.iter().chain(&new) {
                    touched.entry(*ip).or_insert_with(|| self.local.contains_key(ip));
                }
            }
            for ip in &old {
                count_down(&mut self.local, ip);
            }
            for ip in &new {
                *self.local.entry(*ip).or_default() += 1;
            }
            if !new.is_empty() {
                self.local_of.insert(svc.clone(), new.into_boxed_slice());
            }
            frontends.extend(self.frontends_of.remove(svc).unwrap_or_default());
            // Only a UDP or an outside frontend can have a part (`frontend_part`): the key says which, so
            // the others (at 100,000 ClusterIP Services, every frontend) are not looked at.
            frontends.extend(rec.applied_of(svc).map(|(k, _, _)| *k).filter(may_have_part));
        }
        for (ip, was) in touched {
            match (was, self.local.contains_key(&ip)) {
                (false, true) => delta.local_added.push(ip),
                (true, false) => delta.local_removed.push(ip),
                _ => {}
            }
        }
        frontends.sort_unstable();
        frontends.dedup();
        let mut udp_touched: BTreeMap<Backend, bool> = BTreeMap::new();
        for key in frontends {
            let old = self.frontends.remove(&key).unwrap_or_default();
            let (new, owner) = match rec.applied_get(&key) {
                Some((value, applied)) => (frontend_part(model, &key, value.flags, &applied), Some(applied)),
                None => (Frontend::default(), None),
            };
            if track {
                delta
                    .ranges_removed
                    .extend(old.ranges.iter().filter(|c| !new.ranges.contains(c)).map(|c| (key, *c)));
                delta
                    .ranges_added
                    .extend(new.ranges.iter().filter(|c| !old.ranges.contains(c)).map(|c| (key, *c)));
                for b in old.udp.iter().chain(new.udp.iter()) {
                    udp_touched.entry(*b).or_insert_with(|| self.udp.contains_key(b));
                }
            }
            for b in &old.udp {
                count_down(&mut self.udp, b);
            }
            for b in &new.udp {
                *self.udp.entry(*b).or_default() += 1;
            }
            let ip = addr::frontend_addr(&key).ip();
            if old.lb_addr {
                count_down(&mut self.lb_addrs, &ip);
            }
            if new.lb_addr {
                *self.lb_addrs.entry(ip).or_default() += 1;
            }
            if new != Frontend::default()
                && let Some(desired) = owner
            {
                let of = self.frontends_of.entry(desired.name.service.clone()).or_default();
                if !of.contains(&key) {
                    crate::model::compact::push_exact(of, key);
                }
                self.frontends.insert(key, new);
            }
        }
        delta.udp_departed = udp_touched
            .into_iter()
            .filter(|(b, was)| *was && !self.udp.contains_key(b))
            .map(|(b, _)| b)
            .collect();
        delta
    }
}

fn count_down<K: Ord>(counts: &mut BTreeMap<K, u32>, k: &K) {
    if let Some(n) = counts.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            counts.remove(k);
        }
    }
}

/// Whether a frontend can have a part at all: it is UDP (its backends) or from outside (source ranges).
fn may_have_part(key: &FrontendKey) -> bool {
    key.proto == PROTO_UDP || key.is_outside()
}

/// A frontend's part: the ranges of the Service it is programmed for if it is an outside frontend that has
/// them (`FLAG_SOURCE_RANGES`; `plan::source_ranges`, so a Service that lost a contested address adds none),
/// and its backends if it is UDP.
fn frontend_part(
    model: &Model,
    key: &FrontendKey,
    flags: u32,
    desired: &crate::datapath::AppliedFrontend<'_>,
) -> Frontend {
    let ranges = match model.services.get(&desired.name.service) {
        Some(svc) if key.is_outside() && flags & lb_common::FLAG_SOURCE_RANGES != 0 => {
            crate::plan::source_ranges(svc, Family::of(&addr::frontend_addr(key).ip())).into_boxed_slice()
        }
        _ => Box::default(),
    };
    let udp = if key.proto == PROTO_UDP {
        // The slots, and every serving endpoint of the port: a terminating pod still serving keeps its
        // flows (QUIC, VPN and SIP sessions outlive a rollout's grace period), as kube-proxy keeps the
        // conntrack entries of any serving endpoint; only a departed or no longer serving one loses them.
        let mut b: Vec<Backend> = desired.slots.to_vec();
        b.extend(serving_udp(model, &desired.name.service, &desired.name.port, key.family));
        b.sort_unstable();
        b.dedup();
        b.into_boxed_slice()
    } else {
        Box::default()
    };
    let lb_addr = key.is_outside() && flags & lb_common::FLAG_SNAT_TO_FRONTEND == 0;
    Frontend { ranges, udp, lb_addr }
}

/// The serving endpoints of Service `svc`'s UDP port named `port`, in `family` (the frontend key's, scope
/// bits ignored), as backends.
fn serving_udp<'a>(
    model: &'a Model,
    svc: &'a ObjKey,
    port: &'a str,
    family: u8,
) -> impl Iterator<Item = Backend> + 'a {
    model.slices_of(svc).flat_map(move |s| {
        let target = s.ports.iter().find(|p| p.name == port && p.protocol == crate::model::Protocol::Udp);
        s.endpoints.iter().filter(|e| e.is_serving()).filter_map(move |e| {
            let b = addr::backend(std::net::SocketAddr::new(e.address?, target?.port), PROTO_UDP);
            (b.family == family & lb_common::FAMILY_MASK).then_some(b)
        })
    })
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, net::IpAddr, time::Instant};

    use lb_testkit::{
        manifests::{Ep, Svc, to_yaml, write_atomic, write_service},
        sandbox::TempDir,
    };
    use serde_json::json;

    use super::{Contributions, Delta};
    use crate::{agent::AgentCore, datapath::fake::FakeMaps, source::manifests::ManifestDir};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A LoadBalancer Service with one UDP port, an ingress IP and `ranges`, its endpoint on node-1.
    fn write_lb(dir: &std::path::Path, ranges: &[&str]) {
        let mut svc = Svc::new("lb", ip("10.96.0.30"), 53, 5353);
        svc.protocol = "UDP";
        let mut docs = vec![svc.service()];
        docs[0]["spec"]["type"] = json!("LoadBalancer");
        docs[0]["spec"]["loadBalancerSourceRanges"] = json!(ranges);
        docs[0]["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.30"}]}});
        docs.extend(svc.slices(&[Ep::ready(ip("10.1.0.4"), "node-1")]));
        write_atomic(dir, "lb.yaml", &to_yaml(&docs)).unwrap();
    }

    fn sets(
        c: &Contributions,
    ) -> (BTreeSet<IpAddr>, BTreeSet<super::SourceRange>, BTreeSet<lb_common::Backend>) {
        (c.local().collect(), c.ranges().collect(), c.udp().collect())
    }

    /// Sync, take the planned Services' parts again, and check the sets against every Service's part taken
    /// from scratch; the delta.
    fn step(core: &mut AgentCore<FakeMaps>, c: &mut Contributions) -> Delta {
        let r = core.sync(Instant::now()).unwrap();
        let touched: Vec<_> = r.touched.expect("a sync of a few Services").into_iter().collect();
        let delta = c.update(core.model(), "node-1", core.reconciler(), &touched);
        let scratch = Contributions::of_all(core.model(), "node-1", core.reconciler());
        assert_eq!(sets(c), sets(&scratch), "taken again for {touched:?} vs from scratch");
        delta
    }

    /// Taking again only the Services a sync planned keeps the sets what every Service's part gives, and
    /// the delta is exactly what changed: an address two Services share stays while one of them has it, a
    /// UDP backend departs when no frontend holds it, a changed range replaces the old one.
    #[test]
    fn the_parts_of_the_services_planned_keep_the_sets_as_from_scratch() {
        let tmp = TempDir::new("ns-contrib").unwrap();
        let dir = tmp.path();
        let web = Svc::new("web", ip("10.96.0.10"), 80, 8080);
        let mut dns = Svc::new("dns", ip("10.96.0.20"), 53, 5353);
        dns.protocol = "UDP";
        let shared = Ep::ready(ip("10.1.0.1"), "node-1");
        write_service(dir, &web, &[shared.clone(), Ep::ready(ip("10.1.0.2"), "node-2")]).unwrap();
        write_service(dir, &dns, &[shared.clone(), Ep::ready(ip("10.1.0.3"), "node-1")]).unwrap();
        write_lb(dir, &["198.51.100.0/24"]);
        let mut core =
            AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, 4096));
        core.sync(Instant::now()).unwrap();
        let mut c = Contributions::of_all(core.model(), "node-1", core.reconciler());
        let (local, ranges, udp) = sets(&c);
        assert_eq!(local, [ip("10.1.0.1"), ip("10.1.0.3"), ip("10.1.0.4")].into());
        assert_eq!(ranges.len(), 1, "{ranges:?}");
        assert_eq!(udp.len(), 3, "dns's two backends and lb's: {udp:?}");

        // dns lets go of the shared address: web still has it; its UDP backend departs.
        write_service(dir, &dns, &[Ep::ready(ip("10.1.0.3"), "node-1")]).unwrap();
        let d = step(&mut core, &mut c);
        assert_eq!((d.local_added, d.local_removed), (vec![], vec![]));
        assert_eq!(d.udp_departed.len(), 1);
        assert_eq!(crate::datapath::addr::backend_addr(&d.udp_departed[0]).ip(), ip("10.1.0.1"));

        // web goes: the address is no longer an endpoint here.
        std::fs::remove_file(dir.join("web.yaml")).unwrap();
        let d = step(&mut core, &mut c);
        assert_eq!((d.local_added, d.local_removed), (vec![], vec![ip("10.1.0.1")]));

        // lb's range changes: one out, one in.
        write_lb(dir, &["192.0.2.0/24"]);
        let d = step(&mut core, &mut c);
        assert_eq!((d.ranges_added.len(), d.ranges_removed.len()), (1, 1), "{d:?}");
        assert_eq!(d.ranges_added[0].1.to_string(), "192.0.2.0/24");

        // dns comes back to the shared address.
        write_service(dir, &dns, &[shared, Ep::ready(ip("10.1.0.3"), "node-1")]).unwrap();
        let d = step(&mut core, &mut c);
        assert_eq!(d.local_added, vec![ip("10.1.0.1")]);
    }

    /// A UDP endpoint that terminates but still serves keeps its flows (kube-proxy keeps the conntrack
    /// entries of any serving endpoint); once it stops serving, or leaves the slice, they are forgotten.
    #[test]
    fn udp_flows_stay_with_a_terminating_endpoint_while_it_serves() {
        let tmp = TempDir::new("ns-serving").unwrap();
        let dir = tmp.path();
        let mut dns = Svc::new("dns", ip("10.96.0.20"), 53, 5353);
        dns.protocol = "UDP";
        let (a, b) = (ip("10.1.0.1"), ip("10.1.0.2"));
        write_service(dir, &dns, &[Ep::ready(a, "node-1"), Ep::ready(b, "node-2")]).unwrap();
        let mut core =
            AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, 4096));
        core.sync(Instant::now()).unwrap();
        let mut c = Contributions::of_all(core.model(), "node-1", core.reconciler());
        let departed = |d: &Delta| -> Vec<IpAddr> {
            d.udp_departed.iter().map(|b| crate::datapath::addr::backend_addr(b).ip()).collect()
        };
        let steps: [(&str, Vec<Ep>, Vec<IpAddr>); 3] = [
            (
                "b terminates, still serving",
                vec![Ep::ready(a, "node-1"), Ep::ready(b, "node-2").terminating()],
                vec![],
            ),
            ("b stops serving", vec![Ep::ready(a, "node-1"), Ep::ready(b, "node-2").not_ready()], vec![b]),
            ("b leaves the slice", vec![Ep::ready(a, "node-1")], vec![]),
        ];
        for (what, eps, want) in steps {
            write_service(dir, &dns, &eps).unwrap();
            let d = step(&mut core, &mut c);
            assert_eq!(departed(&d), want, "{what}");
        }
    }
}
