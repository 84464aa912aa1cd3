//! Which Service programs a frontend (VIP, port, protocol) that several Services claim. The API server never
//! gives one cluster IP to two Services, but manifests can, and externalIPs and ingress IPs can be anything;
//! the winner is `plan::vip_winner`'s (a cluster IP's claim, then the first in namespace/name order), the same
//! whatever the order the objects arrived in, and when it leaves the frontend the next claimant is programmed
//! without a restart.
use std::collections::{BTreeMap, BTreeSet};

use lb_common::FrontendKey;

use crate::{
    datapath::{Desired, addr},
    model::{Model, ObjKey},
    plan::{self, Claimant},
};

/// `mine`, the frontends Service `svc` wants, as claims: external unless the address is one of its cluster IPs
/// (a Service gone from the model claims nothing).
pub(super) fn claimed(model: &Model, svc: &ObjKey, mine: &Desired) -> Vec<(FrontendKey, bool)> {
    let cluster_ips = model.services.get(svc).map(|s| s.cluster_ips.as_slice()).unwrap_or_default();
    mine.keys().map(|k| (*k, !cluster_ips.contains(&addr::frontend_addr(k).ip()))).collect()
}

/// Every frontend's claimants, and every Service's frontends.
#[derive(Debug, Default)]
pub(super) struct Claims {
    by_frontend: BTreeMap<FrontendKey, Vec<Claimant>>,
    by_service: BTreeMap<ObjKey, Vec<FrontendKey>>,
    /// Frontends with more than one claimant (kept so that reporting them walks only them).
    contested: BTreeSet<FrontendKey>,
}

impl Claims {
    /// Forget every claim (a full replan follows).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Replace `service`'s claims by `keys` (each with whether it is an external address; none: the Service
    /// is gone). Returns the frontends whose claimants changed.
    pub(super) fn set(
        &mut self,
        service: &ObjKey,
        keys: impl IntoIterator<Item = (FrontendKey, bool)>,
    ) -> BTreeSet<FrontendKey> {
        let claims: BTreeMap<FrontendKey, bool> = keys.into_iter().collect();
        let new: Vec<FrontendKey> = claims.keys().copied().collect();
        let old = self.by_service.remove(service).unwrap_or_default();
        let mut changed = BTreeSet::new();
        for key in &old {
            let Some(who) = self.by_frontend.get_mut(key) else { continue };
            let before = who.len();
            // Dropped, or now claimed the other way (a cluster IP became an externalIP): claimed again below.
            who.retain(|c| c.service != *service || claims.get(key) == Some(&c.external));
            if who.len() != before {
                changed.insert(*key);
            }
            if who.is_empty() {
                self.by_frontend.remove(key);
            }
        }
        for (key, external) in &claims {
            let who = self.by_frontend.entry(*key).or_default();
            if !who.iter().any(|c| c.service == *service) {
                who.push(Claimant { external: *external, service: service.clone() });
                changed.insert(*key);
            }
        }
        for key in &changed {
            if self.by_frontend.get(key).is_some_and(|w| w.len() > 1) {
                self.contested.insert(*key);
            } else {
                self.contested.remove(key);
            }
        }
        if !new.is_empty() {
            self.by_service.insert(service.clone(), new);
        }
        changed
    }

    /// The Service that programs `key`, if any claims it.
    pub(super) fn winner(&self, key: &FrontendKey) -> Option<&ObjKey> {
        plan::vip_winner(self.by_frontend.get(key)?).map(|c| &c.service)
    }

    /// Claims that lose (a frontend with n claimants has n - 1): planned frontends that are not programmed.
    pub(super) fn lost(&self) -> usize {
        self.contested.iter().filter_map(|k| self.by_frontend.get(k)).map(|w| w.len() - 1).sum()
    }

    /// Every frontend claimed by more than one Service: the winner, then the others in claim order.
    pub(super) fn conflicts(&self) -> impl Iterator<Item = (FrontendKey, Vec<&Claimant>)> + '_ {
        self.contested.iter().filter_map(|key| {
            let mut sorted: Vec<&Claimant> = self.by_frontend.get(key)?.iter().collect();
            sorted.sort();
            Some((*key, sorted))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fe(port: u16) -> FrontendKey {
        addr::frontend_key([10, 96, 0, 10].into(), port, 6)
    }

    fn svc(name: &str) -> ObjKey {
        ObjKey::new("default", name)
    }

    #[test]
    fn the_first_service_in_name_order_wins_whatever_the_arrival_order() {
        for order in [["b", "a"], ["a", "b"]] {
            let mut c = Claims::default();
            for name in order {
                c.set(&svc(name), [(fe(80), false)]);
            }
            assert_eq!(c.winner(&fe(80)), Some(&svc("a")), "{order:?}");
            assert_eq!(c.lost(), 1);
            let conflicts: Vec<_> = c
                .conflicts()
                .map(|(k, who)| (k, who.iter().map(|c| c.service.clone()).collect::<Vec<_>>()))
                .collect();
            assert_eq!(conflicts, [(fe(80), vec![svc("a"), svc("b")])]);
        }
        let mut c = Claims::default();
        c.set(&ObjKey::new("zeta", "a"), [(fe(80), false)]);
        c.set(&ObjKey::new("alpha", "z"), [(fe(80), false)]);
        assert_eq!(c.winner(&fe(80)), Some(&ObjKey::new("alpha", "z")), "the namespace sorts first");
    }

    #[test]
    fn when_the_winner_leaves_the_next_claimant_wins_and_the_conflict_ends() {
        let mut c = Claims::default();
        c.set(&svc("a"), [(fe(80), false), (fe(443), false)]);
        c.set(&svc("b"), [(fe(80), false)]);
        assert_eq!(c.set(&svc("a"), [(fe(443), false)]), BTreeSet::from([fe(80)]), "only port 80 changed");
        assert_eq!(c.winner(&fe(80)), Some(&svc("b")));
        assert_eq!(c.conflicts().count(), 0);
        assert_eq!(c.set(&svc("a"), []), BTreeSet::from([fe(443)]));
        assert_eq!(c.winner(&fe(443)), None);
        assert!(c.set(&svc("b"), [(fe(80), false)]).is_empty(), "an unchanged claim changes nothing");
    }

    #[test]
    fn an_external_address_never_takes_a_frontend_from_a_cluster_ip() {
        // CVE-2020-8554: "aaa/evil" lists another Service's cluster IP as an externalIP; its name sorts first.
        let evil = ObjKey::new("aaa", "evil");
        let dns = ObjKey::new("kube-system", "kube-dns");
        for order in [[&evil, &dns], [&dns, &evil]] {
            let mut c = Claims::default();
            for who in order {
                c.set(who, [(fe(53), *who == evil)]);
            }
            assert_eq!(c.winner(&fe(53)), Some(&dns), "{order:?}");
        }
        // The same Service moving its claim from external to cluster IP changes the frontend's claimants.
        let mut c = Claims::default();
        c.set(&evil, [(fe(53), true)]);
        c.set(&dns, [(fe(53), true)]);
        assert_eq!(c.winner(&fe(53)), Some(&evil), "both external: name order");
        assert_eq!(c.set(&dns, [(fe(53), false)]), BTreeSet::from([fe(53)]));
        assert_eq!(c.winner(&fe(53)), Some(&dns));
    }
}
