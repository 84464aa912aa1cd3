//! The reader and the checks on small made-up crates: each check must be able to fail.
use std::{collections::BTreeSet, path::PathBuf};

use crate::{
    check::{check_layers, circle_failures},
    read::{Kind, read_file},
    resolve::read_tree,
    tables::{CATALOGUE, Crate, Known, Part, ROOT},
};

const TABLE: &[Part] = &[
    Part { name: "floor", modules: &["floor"], below: &[] },
    Part { name: "root", modules: &[ROOT], below: &[] },
    Part { name: "low", modules: &["low"], below: &["root"] },
    Part { name: "high", modules: &["high"], below: &["low"] },
    Part { name: "catalogue", modules: &[CATALOGUE], below: &["high"] },
];

const KRATE: Crate =
    Crate { dir: "made", lib_name: None, table: TABLE, exceptions: &[], catalogue: &["ALL"], known: &[] };

/// A crate that passes: the root's own `Base` under `low` and `high`, re-exports of both (one by name, one
/// by glob), and a catalogue item naming `high`.
const TREE: &[(&str, &str)] = &[
    (
        "lib.rs",
        "mod floor;\nmod high;\nmod low;\npub use high::{Top, helper as top_helper};\npub use low::*;\n\
         pub struct Base;\npub const ALL: [&str; 1] = [high::NAME];\n",
    ),
    ("floor.rs", "pub fn plain() {}\n"),
    ("low.rs", "use crate::Base;\npub fn low_fn(_: Base) {}\n"),
    (
        "high.rs",
        "use crate::{Base, low::low_fn};\npub struct Top;\npub fn helper() { low_fn(Base) }\n\
         pub const NAME: &str = \"n\";\n",
    ),
];

/// Every failure of both checks on `TREE` with `extra` appended to the named files.
fn failures(krate: &Crate, extra: &[(&str, &str)]) -> Vec<String> {
    let files: Vec<(PathBuf, String)> = TREE
        .iter()
        .map(|(path, text)| {
            let more: String = extra.iter().filter(|(p, _)| p == path).map(|(_, t)| *t).collect();
            (PathBuf::from(path), format!("{text}{more}"))
        })
        .collect();
    let read = read_tree(krate, &files);
    let mut out = read.problems;
    out.extend(check_layers(krate, &read.files));
    out.extend(circle_failures(krate, &read.files));
    out
}

/// `extra` makes a failure that says `want` (each of them, if several).
#[track_caller]
fn fails(extra: &[(&str, &str)], want: &[&str]) {
    let got = failures(&KRATE, extra);
    for w in want {
        assert!(
            got.iter().any(|f| f.contains(w)),
            "with {extra:?}, want a failure saying {w:?}; got {got:#?}"
        );
    }
}

#[test]
fn the_made_up_crate_passes_as_written() {
    assert_eq!(failures(&KRATE, &[]), Vec::<String>::new());
}

#[test]
fn an_item_of_the_crate_root_is_checked_like_a_module() {
    fails(
        &[("floor.rs", "use crate::Base;\n")],
        &["made/src/floor.rs:2: `use crate::Base` imports (crate root) (root part) from floor (floor part)"],
    );
    fails(
        &[("floor.rs", "fn f() { let _ = crate::Base; }\n")],
        &["`crate::Base` imports (crate root) (root part) from floor"],
    );
}

#[test]
fn a_re_export_in_the_root_reaches_the_module_that_holds_it() {
    fails(&[("low.rs", "use crate::Top;\n")], &["`use crate::Top` imports high (high part) from low"]);
    fails(&[("low.rs", "use crate::top_helper;\n")], &["`use crate::top_helper` imports high (high part)"]);
    // Through `pub use low::*`.
    fails(
        &[("floor.rs", "fn f() { crate::low_fn; }\n")],
        &["`crate::low_fn` imports low (low part) from floor"],
    );
}

#[test]
fn what_the_root_s_items_name_through_its_uses_counts() {
    fails(
        &[("lib.rs", "pub fn top() -> Top { Top }\n")],
        &[
            "`Top` (through the crate root's `use high::Top`) imports high (high part) from (crate root) (root part)",
            "made: import circle through (crate root):",
        ],
    );
    fails(
        &[("lib.rs", "pub fn l() { low_fn(Base) }\n")],
        &["`low_fn` (through the crate root's `use low::*`)"],
    );
    fails(
        &[("lib.rs", "pub fn h() { high::helper() }\n")],
        &["`high::helper` imports high (high part) from (crate root)"],
    );
}

#[test]
fn the_catalogue_sits_above_what_it_names_and_below_nothing() {
    fails(
        &[("low.rs", "pub fn n() -> usize { crate::ALL.len() }\n")],
        &["`crate::ALL` imports (crate root's catalogue) (catalogue part) from low"],
    );
    // Without the catalogue, `ALL` is one of the root's own items, under `low`, naming `high`.
    let plain = Crate { catalogue: &[], ..KRATE };
    let got = failures(&plain, &[]);
    assert!(
        got.iter().any(|f| f.contains("`high::NAME` imports high (high part) from (crate root)")),
        "{got:#?}"
    );
    let stale = Crate { catalogue: &["ALL", "GONE"], ..KRATE };
    let got = failures(&stale, &[]);
    assert!(got.iter().any(|f| f.contains("GONE, in made's catalogue")), "{got:#?}");
}

#[test]
fn a_known_import_lets_through_only_the_names_it_lists_and_only_while_they_are_imported() {
    let top = [("lib.rs", "pub fn top() -> Top { Top }\n")];
    let known = Crate { known: &[Known { module: ROOT, names: &["Top"] }], ..KRATE };
    assert_eq!(failures(&known, &top), Vec::<String>::new());
    let got = failures(&known, &[("lib.rs", "pub fn h() { high::helper() }\n")]);
    assert!(
        got.iter().any(|f| f.contains("`high::helper` imports high (high part) from (crate root)")),
        "{got:#?}"
    );
    assert!(got.iter().any(|f| f.contains("made: the crate root no longer imports Top")), "{got:#?}");
}

#[test]
fn a_glob_of_the_root_and_a_name_it_does_not_hold_are_reported() {
    fails(&[("low.rs", "use crate::*;\n")], &["`use crate::*`: a glob of the crate root"]);
    fails(
        &[("low.rs", "use crate::Missing;\n")],
        &["`use crate::Missing`: Missing is no item of the crate root"],
    );
}

#[test]
fn the_reader_finds_paths_in_use_trees_and_code_but_not_in_comments_or_strings() {
    let src = "use crate::{a::{b, c::D}, e as f};\n// use crate::g;\nfn x() { let s = \"crate::h\"; \
               crate::i::j(); super::k(); let c = '\"'; }\n#[cfg(test)]\nmod tests { use crate::l; }\n\
               mod inner { use super::super::m; }\n#[cfg(test)]\nmod more;\n";
    let module = vec!["p".to_owned(), "q".to_owned()];
    let parsed = read_file(&module, src, None);
    let got: Vec<String> = parsed.raws.iter().map(|r| r.path.join("/")).collect();
    assert_eq!(got, ["a/b", "a/c/D", "e", "i/j", "p/k", "p/m"]);
    assert_eq!(parsed.test_children, BTreeSet::from(["more".to_owned()]));
}

#[test]
fn in_a_crate_root_top_level_uses_bring_names_in_and_the_names_used_are_read() {
    let src = "mod a;\npub use a::{B, c as d, e::*};\nuse core::mem::size_of;\npub struct Own;\n\
               pub const K: usize = size_of::<B>() + a::F;\npub fn g() { d(); }\naya!(Own);\n";
    let parsed = read_file(&Vec::new(), src, None);
    let s = &parsed.scope;
    assert_eq!(s.defs, BTreeSet::from(["Own".to_owned(), "K".to_owned(), "g".to_owned(), "a".to_owned()]));
    assert_eq!(s.called, BTreeSet::from(["aya!".to_owned()]));
    assert_eq!(s.uses["d"].path, Some(vec!["a".to_owned(), "c".to_owned()]));
    assert_eq!(s.uses["size_of"].path, None);
    assert_eq!(s.globs, [(vec!["a".to_owned(), "e".to_owned()], "use a::e::*".to_owned(), true)]);
    let paths: Vec<(String, Option<&str>)> = parsed
        .raws
        .iter()
        .filter(|r| r.kind == Kind::Path)
        .map(|r| (r.path.join("/"), r.item.as_deref()))
        .collect();
    assert_eq!(paths, [("a/F".to_owned(), Some("K"))], "the top-level `use`s are no dependency of the root");
    let names: BTreeSet<&str> =
        parsed.raws.iter().filter(|r| r.kind == Kind::Name).map(|r| r.text.as_str()).collect();
    assert!(names.is_superset(&BTreeSet::from(["B", "d", "size_of", "Own"])), "{names:?}");
}
