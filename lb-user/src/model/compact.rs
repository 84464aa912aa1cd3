//! Vectors that hold exactly what they hold. A `Vec` that grows by `push` doubles from a capacity of 4, so
//! the one frontend key or claimant most Services have took room for four: at 100,000 Services these spare
//! slots were megabytes of the agent's heap (the heap profile's `finish_grow` under `Claims::set`,
//! `Slices::insert_shared` and the reconciler's index). The model's and the agent's long-lived vectors grow
//! through these instead.
//!
//! The same holds for B-trees: one filled in key order (the first sync inserts every Service in order) splits
//! each full leaf into 6 and 5 and never comes back to the left one, so its nodes stay a little over half
//! full. `repack` rebuilds a map from its sorted entries, which fills every node; the agent does it after a
//! sync that changed many frontends, before it hands free memory back (`agent::memory`).

/// A per-Service or per-frontend list that usually holds one element (a Service's frontend keys and slices, a
/// frontend's claimants), kept inline: a list of one is no allocation, 16 to 24 bytes less than a `Vec` of
/// one and its heap block (`SmallVec` with `union`: the element, or a pointer and length, and a capacity;
/// spilled to the heap it costs 8 bytes more than a `Vec`).
pub type Few<T> = smallvec::SmallVec<[T; 1]>;

/// `v` with no spare capacity (what a parse built by pushing, before it is kept).
pub fn exact<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

/// Push `x` growing `v` by exactly one (a spilled `SmallVec` would double).
pub fn push_exact<T>(v: &mut Few<T>, x: T) {
    v.reserve_exact(1);
    v.push(x);
}

/// Insert `x` into the sorted `v` unless it is there, growing `v` by exactly one; whether it was inserted.
pub fn insert_sorted<T: Ord>(v: &mut Few<T>, x: T) -> bool {
    match v.binary_search(&x) {
        Ok(_) => false,
        Err(at) => {
            v.reserve_exact(1);
            v.insert(at, x);
            true
        }
    }
}

/// Remove `x` from the sorted `v`; whether it was there. The room it took is given back: a set that shrank
/// from many to few does not keep the many's capacity.
pub fn remove_sorted<T: Ord>(v: &mut Few<T>, x: &T) -> bool {
    let Ok(at) = v.binary_search(x) else { return false };
    v.remove(at);
    if v.spilled() && (v.len() <= v.inline_size() || v.capacity() > 2 * v.len()) {
        v.shrink_to_fit();
    }
    true
}

/// Rebuild `map` with full nodes (see the module's note). Linear: its entries come out sorted and are
/// bulk-loaded.
pub fn repack<K: Ord, V>(map: &mut std::collections::BTreeMap<K, V>) {
    *map = std::mem::take(map).into_iter().collect();
}

/// `repack` for a set.
pub fn repack_set<K: Ord>(set: &mut std::collections::BTreeSet<K>) {
    *set = std::mem::take(set).into_iter().collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_grown_one_at_a_time_holds_no_spare_room() {
        let mut v: Few<u32> = Few::new();
        insert_sorted(&mut v, 3);
        assert!(!v.spilled(), "one element is held inline");
        for x in [1, 2, 1] {
            insert_sorted(&mut v, x);
            assert_eq!(v.capacity(), v.len(), "{v:?}");
        }
        assert_eq!(v.as_slice(), [1, 2, 3]);
        for x in [1, 2] {
            remove_sorted(&mut v, &x);
        }
        assert!(!v.spilled(), "back to one, back inline");
        let mut two: Few<u32> = Few::new();
        insert_sorted(&mut two, 1);
        insert_sorted(&mut two, 2);
        assert!(two.spilled());
        remove_sorted(&mut two, &2);
        assert!(!two.spilled(), "two down to one gives the heap block back");
        assert_eq!(size_of::<Few<[u8; 16]>>(), 24, "a key and a capacity, no more");
        let mut v: Few<u32> = Few::from_vec(vec![1, 2, 3]);
        push_exact(&mut v, 9);
        assert_eq!((v.len(), v.capacity()), (4, 4));
        let mut grown: Vec<u8> = Vec::new();
        grown.extend(std::iter::once(1).filter(|_| true));
        assert!(grown.capacity() > 1, "std's growth is what this module avoids");
        assert_eq!(exact(grown).capacity(), 1);
    }

    #[test]
    fn a_repacked_map_is_the_same_map() {
        let mut m: std::collections::BTreeMap<u32, String> = (0..1000).map(|i| (i, i.to_string())).collect();
        m.retain(|k, _| k % 3 != 0);
        let before: Vec<_> = m.clone().into_iter().collect();
        repack(&mut m);
        assert_eq!(m.into_iter().collect::<Vec<_>>(), before);
        let mut s: std::collections::BTreeSet<u32> = (0..100).collect();
        repack_set(&mut s);
        assert!(s.iter().copied().eq(0..100));
    }

    #[test]
    fn removing_gives_the_room_back() {
        let mut v: Few<u32> = (0..16).collect();
        for x in 0..14 {
            assert!(remove_sorted(&mut v, &x));
        }
        assert!(!remove_sorted(&mut v, &0));
        assert_eq!(v.as_slice(), [14, 15]);
        assert!(v.capacity() <= 4, "{}", v.capacity());
    }
}
