//! Node and zone names, interned: every endpoint of a cluster names one of a few nodes and zones, so each
//! name is held once and shared instead of a `String` per endpoint. A `Name` is a thin pointer (`ArcStr`: the
//! length lives in the allocation with the counts), 8 bytes where `Arc<str>` took 16: an endpoint holds two,
//! an `ObjKey` (the key of a dozen maps per Service) two.
use std::{
    collections::HashSet,
    sync::{Arc, LazyLock, Mutex},
};

/// A shared node or zone name.
pub type Name = arcstr::ArcStr;

/// A hint list (`hints.forNodes` or `hints.forZones` names), interned: the endpoints on one node carry the
/// same lists, so each distinct list is held once, and an endpoint holds one pointer (8 bytes, where a
/// `Vec` took 24 and an allocation of its own).
pub type NameList = Arc<Vec<Name>>;

static NAMES: LazyLock<Mutex<HashSet<Name>>> = LazyLock::new(Mutex::default);
static LISTS: LazyLock<Mutex<HashSet<NameList>>> = LazyLock::new(Mutex::default);

/// The one shared copy of `s`. The table keeps every name seen (a cluster's node and zone names: a few
/// thousand at most); `forget_unused` drops those nothing holds any more.
pub fn intern(s: &str) -> Name {
    let mut table = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = table.get(s) {
        return n.clone();
    }
    let n = Name::from(s);
    table.insert(n.clone());
    n
}

/// The one shared copy of the list `names` (`NameList`).
pub fn intern_list(names: Vec<Name>) -> NameList {
    let mut table = LISTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(l) = table.get(&names) {
        return l.clone();
    }
    let l = Arc::new(super::compact::exact(names));
    table.insert(l.clone());
    l
}

/// Drop the names and lists only the tables hold (nodes and zones that left the cluster).
pub fn forget_unused() {
    // Lists first: a list the table alone holds still holds its names.
    let mut lists = LISTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    lists.retain(|l| Arc::strong_count(l) > 1);
    drop(lists);
    let mut table = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    table.retain(|n| Name::strong_count(n).is_none_or(|c| c > 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_is_one_allocation_however_often_it_is_read() {
        let (a, b) = (intern("node-1"), intern(&String::from("node-1")));
        assert!(Name::ptr_eq(&a, &b));
        assert!(!Name::ptr_eq(&a, &intern("node-2")));
        assert_eq!(size_of::<Name>(), 8, "a thin pointer");
        assert_eq!(size_of::<Option<Name>>(), 8);
    }

    #[test]
    fn one_hint_list_is_one_allocation_and_is_forgotten_when_unused() {
        let list = || vec![intern("node-a"), intern("node-b")];
        let (a, b) = (intern_list(list()), intern_list(list()));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &intern_list(vec![intern("node-a")])));
        let weak = Arc::downgrade(&a);
        drop((a, b));
        forget_unused();
        assert!(weak.upgrade().is_none(), "the table still holds a list no endpoint holds");
    }

    #[test]
    fn a_name_nothing_holds_is_forgotten_and_one_still_held_is_kept() {
        let (gone, kept) = (intern("node-that-left"), intern("node-that-stays"));
        drop(gone);
        forget_unused();
        let held = |s: &str| NAMES.lock().unwrap().contains(s);
        assert!(!held("node-that-left"), "the table still holds a name no endpoint names");
        assert!(held("node-that-stays"));
        assert!(Name::ptr_eq(&kept, &intern("node-that-stays")));
    }
}
