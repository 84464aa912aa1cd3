//! Which Service programs a frontend (VIP, port, protocol) that several Services claim. The API server never
//! gives one cluster IP to two Services, but manifests can; the winner is `plan::vip_winner`'s (the first in
//! namespace/name order), the same whatever the order the objects arrived in, and when it leaves the frontend
//! the next claimant is programmed without a restart.
use std::collections::{BTreeMap, BTreeSet};

use lb_common::FrontendKey;

use crate::{model::ObjKey, plan};

/// Every frontend's claimants, and every Service's frontends.
#[derive(Debug, Default)]
pub(super) struct Claims {
    by_frontend: BTreeMap<FrontendKey, Vec<ObjKey>>,
    by_service: BTreeMap<ObjKey, Vec<FrontendKey>>,
    /// Frontends with more than one claimant (kept so that reporting them walks only them).
    contested: BTreeSet<FrontendKey>,
}

impl Claims {
    /// Forget every claim (a full replan follows).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Replace `service`'s claims by `keys` (none: it is gone). Returns the frontends whose claimants
    /// changed.
    pub(super) fn set(
        &mut self,
        service: &ObjKey,
        keys: impl IntoIterator<Item = FrontendKey>,
    ) -> BTreeSet<FrontendKey> {
        let new: Vec<FrontendKey> = keys.into_iter().collect();
        let old = self.by_service.remove(service).unwrap_or_default();
        let mut changed = BTreeSet::new();
        for key in old.iter().filter(|k| !new.contains(k)) {
            if let Some(who) = self.by_frontend.get_mut(key) {
                who.retain(|s| s != service);
                if who.is_empty() {
                    self.by_frontend.remove(key);
                }
            }
            changed.insert(*key);
        }
        for key in new.iter().filter(|k| !old.contains(k)) {
            let who = self.by_frontend.entry(*key).or_default();
            who.push(service.clone());
            changed.insert(*key);
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
        plan::vip_winner(self.by_frontend.get(key)?)
    }

    /// Claims that lose (a frontend with n claimants has n - 1): planned frontends that are not programmed.
    pub(super) fn lost(&self) -> usize {
        self.contested.iter().filter_map(|k| self.by_frontend.get(k)).map(|w| w.len() - 1).sum()
    }

    /// Every frontend claimed by more than one Service: the winner, then the others in name order.
    pub(super) fn conflicts(&self) -> impl Iterator<Item = (FrontendKey, Vec<&ObjKey>)> + '_ {
        self.contested.iter().filter_map(|key| {
            let who = self.by_frontend.get(key)?;
            let mut sorted: Vec<&ObjKey> = who.iter().collect();
            sorted.sort();
            let winner = self.winner(key)?;
            sorted.retain(|k| *k != winner);
            sorted.insert(0, winner);
            Some((*key, sorted))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::addr;

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
                c.set(&svc(name), [fe(80)]);
            }
            assert_eq!(c.winner(&fe(80)), Some(&svc("a")), "{order:?}");
            assert_eq!(c.lost(), 1);
            let conflicts: Vec<_> = c.conflicts().collect();
            assert_eq!(conflicts, [(fe(80), vec![&svc("a"), &svc("b")])]);
        }
        let mut c = Claims::default();
        c.set(&ObjKey::new("zeta", "a"), [fe(80)]);
        c.set(&ObjKey::new("alpha", "z"), [fe(80)]);
        assert_eq!(c.winner(&fe(80)), Some(&ObjKey::new("alpha", "z")), "the namespace sorts first");
    }

    #[test]
    fn when_the_winner_leaves_the_next_claimant_wins_and_the_conflict_ends() {
        let mut c = Claims::default();
        c.set(&svc("a"), [fe(80), fe(443)]);
        c.set(&svc("b"), [fe(80)]);
        assert_eq!(c.set(&svc("a"), [fe(443)]), BTreeSet::from([fe(80)]), "only port 80 changed");
        assert_eq!(c.winner(&fe(80)), Some(&svc("b")));
        assert_eq!(c.conflicts().count(), 0);
        assert_eq!(c.set(&svc("a"), []), BTreeSet::from([fe(443)]));
        assert_eq!(c.winner(&fe(443)), None);
        assert!(c.set(&svc("b"), [fe(80)]).is_empty(), "an unchanged claim changes nothing");
    }
}
