//! Node and zone names, interned: every endpoint of a cluster names one of a few nodes and zones, so each
//! name is held once and shared (`Arc<str>`, 16 bytes in an endpoint and no allocation of its own) instead
//! of a `String` per endpoint.
use std::{
    collections::HashSet,
    sync::{Arc, LazyLock, Mutex},
};

/// A shared node or zone name.
pub type Name = Arc<str>;

static NAMES: LazyLock<Mutex<HashSet<Name>>> = LazyLock::new(Mutex::default);

/// The one shared copy of `s`. The table keeps every name seen (a cluster's node and zone names: a few
/// thousand at most); `forget_unused` drops those nothing holds any more.
pub fn intern(s: &str) -> Name {
    let mut table = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = table.get(s) {
        return n.clone();
    }
    let n: Name = Arc::from(s);
    table.insert(n.clone());
    n
}

/// Drop the names only the table holds (nodes and zones that left the cluster).
pub fn forget_unused() {
    let mut table = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    table.retain(|n| Arc::strong_count(n) > 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_is_one_allocation_however_often_it_is_read() {
        let (a, b) = (intern("node-1"), intern(&String::from("node-1")));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &intern("node-2")));
    }

    #[test]
    fn a_name_nothing_holds_is_forgotten_and_one_still_held_is_kept() {
        let (gone, kept) = (intern("node-that-left"), intern("node-that-stays"));
        let weak = Arc::downgrade(&gone);
        drop(gone);
        forget_unused();
        assert!(weak.upgrade().is_none(), "the table still holds a name no endpoint names");
        assert!(Arc::ptr_eq(&kept, &intern("node-that-stays")));
    }
}
