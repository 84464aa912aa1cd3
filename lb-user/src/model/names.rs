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
static HINTS: LazyLock<Mutex<HashSet<Arc<HintLists>>>> = LazyLock::new(Mutex::default);

/// An endpoint's `hints`, `forNodes` and `forZones`, interned as a pair: the endpoints of one node carry the
/// same two lists, so an endpoint holds one pointer (8 bytes, where the two lists took 16: an endpoint is 48
/// bytes, and ten fill a 512-byte block where they needed 640) and no allocation. `None`: no hints at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hints(Option<Arc<HintLists>>);

#[derive(Debug, PartialEq, Eq, Hash)]
struct HintLists {
    for_nodes: Option<NameList>,
    for_zones: Option<NameList>,
}

impl Hints {
    /// The hints with these lists (`None`: the list is absent), the one shared copy of the pair.
    pub fn new(for_nodes: Option<NameList>, for_zones: Option<NameList>) -> Self {
        if for_nodes.is_none() && for_zones.is_none() {
            return Self(None);
        }
        let lists = HintLists { for_nodes, for_zones };
        let mut table = HINTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(h) = table.get(&lists) {
            return Self(Some(h.clone()));
        }
        let h = Arc::new(lists);
        table.insert(h.clone());
        Self(Some(h))
    }

    /// `hints.forNodes[].name`; `None` when the list is absent.
    pub fn for_nodes(&self) -> Option<&NameList> {
        self.0.as_ref()?.for_nodes.as_ref()
    }

    /// `hints.forZones[].name`; `None` when the list is absent.
    pub fn for_zones(&self) -> Option<&NameList> {
        self.0.as_ref()?.for_zones.as_ref()
    }

    /// Whether both lists are absent.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

/// As the two fields they were (`for_nodes`, `for_zones`): an endpoint flattens them into its own.
impl serde::Serialize for Hints {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("Hints", 2)?;
        st.serialize_field("for_nodes", &self.for_nodes())?;
        st.serialize_field("for_zones", &self.for_zones())?;
        st.end()
    }
}

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
    // Pairs, then lists: what a table alone holds still holds what it names.
    let mut hints = HINTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    hints.retain(|h| Arc::strong_count(h) > 1);
    drop(hints);
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
    fn the_hints_of_one_node_are_one_allocation_and_are_forgotten_when_unused() {
        let nodes = || Some(intern_list(vec![intern("node-h")]));
        let zones = || Some(intern_list(vec![intern("zone-h")]));
        let (a, b) = (Hints::new(nodes(), zones()), Hints::new(nodes(), zones()));
        let (Some(pa), Some(pb)) = (&a.0, &b.0) else { panic!("hints with lists are a pair") };
        assert!(Arc::ptr_eq(pa, pb));
        assert_eq!(a.for_nodes().map(|l| l.as_slice()), Some(&[intern("node-h")][..]));
        assert_eq!(Hints::new(nodes(), None).for_zones(), None);
        assert_ne!(Hints::new(nodes(), None), a);
        assert!(Hints::new(None, None).is_empty());
        assert_eq!(size_of::<Hints>(), 8, "one pointer");
        // An endpoint's JSON (`tierlb plan --output json`) keeps the two fields it had.
        let e = crate::model::Endpoint { hints: a.clone(), ..Default::default() };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["for_nodes"], serde_json::json!(["node-h"]));
        assert_eq!(json["for_zones"], serde_json::json!(["zone-h"]));
        assert!(json.get("hints").is_none(), "{json}");
        let none = serde_json::to_value(crate::model::Endpoint::default()).unwrap();
        assert!(none["for_nodes"].is_null() && none["for_zones"].is_null(), "{none}");
        let weak = Arc::downgrade(pa);
        drop((a, b, e));
        forget_unused();
        assert!(weak.upgrade().is_none(), "the table still holds hints no endpoint holds");
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
