//! The two checks over a crate's files: no circle among them, and no import against its layer table.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt::Write as _,
};

use crate::{
    read::{Module, show},
    resolve::{File, Import},
    tables::{Crate, Part, ROOT},
};

/// One module contains the other (its own files, parent and children). The crate root is not the parent of
/// everything here: its items are a module of their own, related only to themselves.
fn related(a: &[String], b: &[String]) -> bool {
    if a.is_empty() || b.is_empty() { a == b } else { a.starts_with(b) || b.starts_with(a) }
}

/// The imports of `f` that make a file-level edge: to a known module outside `f`'s own, once per module.
fn edges<'a>(f: &'a File, known: &BTreeMap<&Module, &File>) -> Vec<&'a Import> {
    let mut seen = BTreeSet::new();
    f.imports
        .iter()
        .filter(|i| !related(&f.module, &i.target) && known.contains_key(&i.target))
        .filter(|i| seen.insert(i.target.clone()))
        .collect()
}

/// A circle's edges (file, import), and every file tied to it.
type Circle<'a> = (Vec<(&'a File, &'a Import)>, BTreeSet<Module>);
type Graph = BTreeMap<Module, BTreeSet<Module>>;

/// The modules reachable from `start` in `next`, `start` included.
fn reachable(start: &Module, next: &Graph) -> BTreeSet<Module> {
    let mut seen = BTreeSet::from([start.clone()]);
    let mut todo = vec![start.clone()];
    while let Some(m) = todo.pop() {
        for n in next.get(&m).into_iter().flatten() {
            if seen.insert(n.clone()) {
                todo.push(n.clone());
            }
        }
    }
    seen
}

/// The circles among files: for each group of files tied by one (the files that reach each other), the
/// shortest circle through its first file, as its edges (file, import), and every file of the group.
fn circles(files: &[File]) -> Vec<Circle<'_>> {
    let by_module: BTreeMap<&Module, &File> = files.iter().map(|f| (&f.module, f)).collect();
    let (mut forward, mut backward): (Graph, Graph) = Default::default();
    for f in files {
        for imp in edges(f, &by_module) {
            forward.entry(f.module.clone()).or_default().insert(imp.target.clone());
            backward.entry(imp.target.clone()).or_default().insert(f.module.clone());
        }
    }
    let mut out = Vec::new();
    let mut reported: BTreeSet<Module> = BTreeSet::new();
    for start in files {
        if reported.contains(&start.module) {
            continue;
        }
        // Breadth-first from `start`: the shortest way back to it, if any.
        let mut prev: BTreeMap<&Module, (&File, &Import)> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut found = None;
        while let Some(f) = queue.pop_front() {
            for imp in edges(f, &by_module) {
                if imp.target == start.module {
                    found = Some((f, imp));
                    break;
                }
                if !prev.contains_key(&imp.target) {
                    prev.insert(&imp.target, (f, imp));
                    queue.push_back(by_module[&imp.target]);
                }
            }
            if found.is_some() {
                break;
            }
        }
        let Some(mut step) = found else { continue };
        let mut cycle = vec![step];
        while step.0.module != start.module {
            step = prev[&step.0.module];
            cycle.push(step);
        }
        cycle.reverse();
        let tied: BTreeSet<Module> = reachable(&start.module, &forward)
            .intersection(&reachable(&start.module, &backward))
            .cloned()
            .collect();
        reported.extend(tied.iter().cloned());
        out.push((cycle, tied));
    }
    out
}

/// An import as a message shows it.
fn written(imp: &Import) -> String {
    match &imp.via {
        Some(via) => format!("`{}` (through the crate root's `{via}`)", imp.text),
        None => format!("`{}`", imp.text),
    }
}

/// A failure message per circle among `files`.
pub(crate) fn circle_failures(krate: &Crate, files: &[File]) -> Vec<String> {
    let mut failures = Vec::new();
    for (cycle, tied) in circles(files) {
        let mut msg = format!("{}: import circle through {}:", krate.dir, show(&cycle[0].0.module));
        for (f, imp) in &cycle {
            let _ = write!(
                msg,
                "\n    {}:{} imports {} ({})",
                f.path.display(),
                imp.line,
                show(&imp.target),
                written(imp)
            );
        }
        if tied.len() > cycle.len() {
            let all: Vec<String> = tied.iter().map(|m| show(m)).collect();
            let _ = write!(msg, "\n    ({} files are tied by circles: {})", tied.len(), all.join(", "));
        }
        failures.push(msg);
    }
    failures
}

/// The table's key for a module: its first segment, `ROOT` for the crate root's own items.
fn key(m: &[String]) -> &str {
    m.first().map_or(ROOT, String::as_str)
}

/// Every import of `files` against `krate`'s table: a failure message per forbidden one.
pub(crate) fn check_layers(krate: &Crate, files: &[File]) -> Vec<String> {
    let table = krate.table;
    let part_of = |m: &[String]| -> Option<&Part> { table.iter().find(|p| p.modules.contains(&key(m))) };
    let allowed = |p: &Part| -> BTreeSet<&str> {
        let mut out = BTreeSet::from([p.name]);
        let mut todo: Vec<&str> = p.below.to_vec();
        while let Some(n) = todo.pop() {
            if out.insert(n) {
                todo.extend(table.iter().find(|q| q.name == n).expect("a part named in `below`").below);
            }
        }
        out
    };
    let mut failures = Vec::new();
    for f in files {
        let Some(from) = part_of(&f.module) else {
            failures.push(format!(
                "{}: module {} is in no part of {}'s layer table (tests/layers/tables.rs): add it where it belongs",
                f.path.display(),
                show(&f.module),
                krate.dir
            ));
            continue;
        };
        let ok = allowed(from);
        for imp in &f.imports {
            let Some(to) = part_of(&imp.target) else { continue };
            let excepted = krate.exceptions.iter().any(|(m, p)| *m == f.module.join("/") && *p == to.name);
            if ok.contains(to.name) || excepted {
                continue;
            }
            let may: Vec<&str> = ok.iter().copied().filter(|n| *n != from.name).collect();
            failures.push(format!(
                "{}:{}: {} imports {} ({} part) from {} ({} part), against the layer rule: {} may import {}",
                f.path.display(),
                imp.line,
                written(imp),
                show(&imp.target),
                to.name,
                show(&f.module),
                from.name,
                from.name,
                if may.is_empty() { "nothing outside itself".to_owned() } else { may.join(", ") }
            ));
        }
    }
    failures.dedup();
    failures
}
