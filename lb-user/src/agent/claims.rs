//! Which Service programs a frontend (VIP, port, protocol) that several Services claim. The API server never
//! gives one cluster IP to two Services, but manifests can, and externalIPs and ingress IPs can be anything;
//! the winner is `plan::vip_winner`'s (a cluster IP's claim, then the oldest Service, then the first in
//! namespace/name order), the same
//! whatever the order the objects arrived in, and when it leaves the frontend the next claimant is programmed
//! without a restart.
use std::collections::{BTreeMap, BTreeSet};

use lb_common::FrontendKey;

use crate::{
    datapath::{DesiredFrontend, addr},
    model::{Model, ObjKey, compact},
    plan::{self, Claimant},
};

/// `mine`, the frontends Service `svc` wants, as claims: external unless the address is one of its cluster IPs
/// (a Service gone from the model claims nothing).
pub(super) fn claimed(
    model: &Model,
    svc: &ObjKey,
    mine: &[(FrontendKey, DesiredFrontend)],
) -> Vec<(FrontendKey, bool)> {
    let cluster_ips = model.services.get(svc).map(|s| &*s.cluster_ips).unwrap_or_default();
    mine.iter().map(|(k, _)| (*k, !cluster_ips.contains(&addr::frontend_addr(k).ip()))).collect()
}

/// Service `svc`'s `metadata.creationTimestamp`, which orders its claims (none if it is gone or has none).
pub(super) fn created(model: &Model, svc: &ObjKey) -> Option<i64> {
    model.services.get(svc).and_then(|s| s.created)
}

/// Every frontend's claimants, and every Service's frontends.
#[derive(Debug, Default)]
pub(super) struct Claims {
    by_frontend: BTreeMap<FrontendKey, compact::Few<Claimant>>,
    by_service: BTreeMap<ObjKey, compact::Few<FrontendKey>>,
    /// Frontends with more than one claimant (kept so that reporting them walks only them).
    contested: BTreeSet<FrontendKey>,
}

impl Claims {
    /// Forget every claim (a full replan follows).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Rebuild the maps with full nodes (`compact::repack`).
    pub(super) fn repack(&mut self) {
        compact::repack(&mut self.by_frontend);
        compact::repack(&mut self.by_service);
    }

    /// Replace `service`'s claims by `keys` (each with whether it is an external address; none: the Service
    /// is gone); `created` is its creation time. Returns the frontends whose claimants changed.
    pub(super) fn set(
        &mut self,
        service: &ObjKey,
        created: Option<i64>,
        keys: impl IntoIterator<Item = (FrontendKey, bool)>,
    ) -> BTreeSet<FrontendKey> {
        let created = Claimant::created(created);
        let claims: BTreeMap<FrontendKey, bool> = keys.into_iter().collect();
        let new = compact::Few::from_vec(claims.keys().copied().collect());
        let old = self.by_service.remove(service).unwrap_or_default();
        let mut changed = BTreeSet::new();
        for key in &old {
            let Some(who) = self.by_frontend.get_mut(key) else { continue };
            let before = who.len();
            // Dropped, or now claimed the other way (a cluster IP became an externalIP): claimed again below.
            who.retain(|c| {
                c.service != *service || (claims.get(key) == Some(&c.external) && c.created == created)
            });
            if who.spilled() && who.len() < before {
                who.shrink_to_fit();
            }
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
                compact::push_exact(who, Claimant { external: *external, created, service: service.clone() });
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
                c.set(&svc(name), None, [(fe(80), false)]);
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
        c.set(&ObjKey::new("zeta", "a"), None, [(fe(80), false)]);
        c.set(&ObjKey::new("alpha", "z"), None, [(fe(80), false)]);
        assert_eq!(c.winner(&fe(80)), Some(&ObjKey::new("alpha", "z")), "the namespace sorts first");
    }

    /// kubernetes#69599's case: a Service created later with another's externalIP does not take it, though
    /// its namespace sorts first; with equal (or unknown) times, name order decides.
    #[test]
    fn of_two_services_on_one_external_address_the_older_keeps_it() {
        let (old, new) = (ObjKey::new("shop", "web"), ObjKey::new("aaa", "web"));
        for order in [[(&old, 1_000), (&new, 2_000)], [(&new, 2_000), (&old, 1_000)]] {
            let mut c = Claims::default();
            for (who, at) in order {
                c.set(who, Some(at), [(fe(80), true)]);
            }
            assert_eq!(c.winner(&fe(80)), Some(&old), "{order:?}");
        }
        let mut c = Claims::default();
        c.set(&old, Some(1_000), [(fe(80), true)]);
        c.set(&new, None, [(fe(80), true)]);
        assert_eq!(c.winner(&fe(80)), Some(&old), "an unknown time is later than any known one");
        c.set(&new, Some(1_000), [(fe(80), true)]);
        assert_eq!(c.winner(&fe(80)), Some(&new), "the same time: name order; the new time replaced the old");
    }

    #[test]
    fn when_the_winner_leaves_the_next_claimant_wins_and_the_conflict_ends() {
        let mut c = Claims::default();
        c.set(&svc("a"), None, [(fe(80), false), (fe(443), false)]);
        c.set(&svc("b"), None, [(fe(80), false)]);
        assert_eq!(
            c.set(&svc("a"), None, [(fe(443), false)]),
            BTreeSet::from([fe(80)]),
            "only port 80 changed"
        );
        assert_eq!(c.winner(&fe(80)), Some(&svc("b")));
        assert_eq!(c.conflicts().count(), 0);
        assert_eq!(c.set(&svc("a"), None, []), BTreeSet::from([fe(443)]));
        assert_eq!(c.winner(&fe(443)), None);
        assert!(c.set(&svc("b"), None, [(fe(80), false)]).is_empty(), "an unchanged claim changes nothing");
    }

    #[test]
    fn an_external_address_never_takes_a_frontend_from_a_cluster_ip() {
        // CVE-2020-8554: "aaa/evil" lists another Service's cluster IP as an externalIP; its name sorts first.
        let evil = ObjKey::new("aaa", "evil");
        let dns = ObjKey::new("kube-system", "kube-dns");
        for order in [[&evil, &dns], [&dns, &evil]] {
            let mut c = Claims::default();
            for who in order {
                c.set(who, None, [(fe(53), *who == evil)]);
            }
            assert_eq!(c.winner(&fe(53)), Some(&dns), "{order:?}");
        }
        // The same Service moving its claim from external to cluster IP changes the frontend's claimants.
        let mut c = Claims::default();
        c.set(&evil, None, [(fe(53), true)]);
        c.set(&dns, None, [(fe(53), true)]);
        assert_eq!(c.winner(&fe(53)), Some(&evil), "both external: name order");
        assert_eq!(c.set(&dns, None, [(fe(53), false)]), BTreeSet::from([fe(53)]));
        assert_eq!(c.winner(&fe(53)), Some(&dns));
    }
}
