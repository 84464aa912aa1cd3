//! The dependency rule of README's "How it is built", read from the source: faces -> agent -> {semantics,
//! datapath, sources} -> model. Every `.rs` file of lb-user, lb-common and lb-ebpf is read; its module
//! dependencies are the paths of `use crate::...` and `use super::...` trees (brace groups included, nested)
//! and the `crate::a::b` and `super::a` paths in code, each resolved to the longest module that has a file.
//! Comments, string and char literals do not count, nor `#[cfg(test)]` modules (inline or in their own file):
//! a test may read any module to check it, and no product code depends on it.
//!
//! Two checks: no circle among files once a module's own files are set aside (a parent and its child
//! modules, `plan.rs` and `plan/external_frontends.rs`, are one module and may use each other), and, in
//! lb-user and lb-ebpf, no import against the layer tables below.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

/// One part of a crate: the modules it holds (a module's children belong to it) and the parts directly
/// below it. A file may import its own part and every part below it, transitively; nothing else.
struct Part {
    name: &'static str,
    modules: &'static [&'static str],
    below: &'static [&'static str],
}

const fn part(name: &'static str, modules: &'static [&'static str], below: &'static [&'static str]) -> Part {
    Part { name, modules, below }
}

/// lb-user, bottom up. `main` is the binary (`main.rs`, which reads the library as `tierlb::`).
const LB_USER: &[Part] = &[
    // The model: Services, EndpointSlices, Nodes and the node's external-address settings.
    part("model", &["model"], &[]),
    // Work split over two threads (no tierlb type): the conversion and the planning use it.
    part("halves", &["halves"], &[]),
    // "Did you mean" (no tierlb type): the sources' unknown-field warnings and the faces' unknown node.
    part("spelling", &["spelling"], &[]),
    // Semantics: pure functions of the model. The hint rules and what is not programmed, the plan (which
    // calls both), the lints (which read a plan).
    part("hints", &["hints", "skipped"], &["model"]),
    part("plan", &["plan"], &["hints"]),
    part("lint", &["lint"], &["plan", "spelling"]),
    // Sources, data path and cgroups: siblings of the semantics, none imports another.
    part("source", &["source"], &["model", "halves", "spelling"]),
    part("datapath", &["datapath"], &["model"]),
    part("cgroup", &["cgroup"], &[]),
    part("metrics", &["metrics"], &["datapath", "source"]),
    part("agent", &["agent"], &["metrics", "lint", "cgroup"]),
    // Faces: what a user or a scraper sees. Servers and the reports that read pins first, then the commands
    // built on them, then the command line.
    part("output", &["output"], &[]),
    part("server", &["server"], &["agent"]),
    part("status", &["status"], &["agent"]),
    part("study", &["study"], &["agent"]),
    part("explain", &["explain"], &["status"]),
    part("trace", &["trace"], &["server", "output"]),
    part("chart", &["chart"], &["study"]),
    part("cli", &["cli"], &["explain", "trace", "chart", "output"]),
    part("main", &["main"], &["cli"]),
];

/// Files allowed one import beyond their part's: the agent's run loop starts the servers it reports to.
const LB_USER_EXCEPTIONS: &[(&str, &str)] = &[("agent/run", "server")];

/// lb-ebpf, bottom up: the program files (one per hook family) call down into helpers, never back.
const LB_EBPF: &[Part] = &[
    part("maps", &["maps", "counters", "netns_count"], &[]),
    part("helpers", &["affinity", "health", "reverse", "trace"], &["maps"]),
    part("programs", &["sock_addr", "sock", "tc"], &["helpers"]),
];

type Module = Vec<String>;

fn show(m: &[String]) -> String {
    if m.is_empty() { "(crate root)".to_owned() } else { m.join("/") }
}

/// One dependency found in a file: the module it names, the line (of the `use` or the path) and the path
/// as written.
struct Import {
    target: Module,
    line: usize,
    text: String,
}

struct File {
    path: PathBuf,
    module: Module,
    imports: Vec<Import>,
}

/// The text with comments, string literals and char literals blanked out (newlines kept, for line numbers).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for c in s {
            out.push(if *c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, 0);
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if !prev_ident
            && (rest.starts_with(b"r#") || rest.starts_with(b"r\"") || rest.starts_with(b"br"))
        {
            let start = if rest[0] == b'b' { 2 } else { 1 };
            let hashes = rest[start..].iter().take_while(|c| **c == b'#').count();
            if rest.get(start + hashes) != Some(&b'"') {
                out.push(rest[0] as char);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = start + hashes + 1;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close)
                .map_or(rest.len(), |p| body + p + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A char literal ('x', '\n', '\u{1F600}', '"'), else a lifetime or label ('a).
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|c| *c == b'\'').map_or(1, |p| p + 3)
            } else {
                let ch = src[i + 1..].chars().next().map_or(0, char::len_utf8);
                if rest.get(1 + ch) == Some(&b'\'') { 2 + ch } else { 1 }
            };
            if end == 1 {
                out.push('\'');
            } else {
                blank(&mut out, &rest[..end]);
            }
            i += end;
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
    PathSep,
}

fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = src.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut s = String::from(c);
            while let Some((_, n)) = chars.peek().copied().filter(|(_, n)| n.is_alphanumeric() || *n == '_') {
                s.push(n);
                chars.next();
            }
            out.push((Tok::Ident(s), line));
        } else if c == ':' && chars.peek().is_some_and(|(_, n)| *n == ':') {
            chars.next();
            out.push((Tok::PathSep, line));
        } else if !c.is_whitespace() {
            out.push((Tok::Punct(c), line));
        }
    }
    out
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// The paths of a use tree starting at `toks[*i]`, each prefixed by `prefix`; stops after the tree.
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(|t| &t.0) {
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 2;
                break;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Tok::PathSep) => *i += 1,
            Some(Tok::Punct('{')) => {
                *i += 1;
                while !matches!(toks.get(*i).map(|t| &t.0), Some(Tok::Punct('}')) | None) {
                    use_tree(toks, i, &path, out);
                    if matches!(toks.get(*i).map(|t| &t.0), Some(Tok::Punct(','))) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                break;
            }
            _ => break,
        }
    }
    if path.len() > prefix.len() {
        out.push(path);
    }
}

/// The module a path names, from `module` (the one the path is written in): `crate::`, `super::`, `self::`
/// and, for the binary, the library's name; `None` for other crates and bare names.
fn absolute(module: &[String], path: &[String], lib_name: Option<&str>) -> Option<Module> {
    let mut base: Module = match path.first().map(String::as_str)? {
        "crate" => Vec::new(),
        s if Some(s) == lib_name => Vec::new(),
        "super" | "self" => module.to_vec(),
        _ => return None,
    };
    let mut rest = &path[usize::from(path[0] == "crate" || Some(path[0].as_str()) == lib_name)..];
    while let Some(first) = rest.first() {
        match first.as_str() {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Module files of one `src` directory: `foo.rs` and `foo/mod.rs` are module `foo`, `lib.rs` the root;
/// `main.rs` is the root too unless the crate also has a `lib.rs` (then it is the binary, module `main`).
fn module_files(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("readable source dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut paths = Vec::new();
    walk(src, &mut paths);
    let has_lib = src.join("lib.rs").exists();
    let mut out = BTreeMap::new();
    for p in paths {
        let rel = p.strip_prefix(src).expect("under src").with_extension("");
        let mut m: Module = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        match m.last().map(String::as_str) {
            Some("mod" | "lib") => {
                m.pop();
            }
            Some("main") if m.len() == 1 && !has_lib => {
                m.pop();
            }
            _ => {}
        }
        out.insert(m, p);
    }
    out
}

/// The imports of one file, and the child modules it declares under `#[cfg(test)]`.
fn read_file(module: &Module, text: &str, lib_name: Option<&str>) -> (Vec<Import>, BTreeSet<String>) {
    let toks = tokens(&strip(text));
    let mut imports = Vec::new();
    let mut test_children = BTreeSet::new();
    // Inline modules: (name, brace depth inside it), for `super::` inside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let here: Module = module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        let line = toks[i].1;
        match &toks[i].0 {
            Tok::Punct('#') if is_cfg_test(&toks[i..]) => {
                // Skip the attribute, further attributes, then the test item (a module, here).
                i = skip_attrs(&toks, i);
                let mod_at = (i..toks.len().min(i + 3)).find(|j| ident(toks.get(*j)) == Some("mod"));
                if let Some(j) = mod_at {
                    let name = ident(toks.get(j + 1)).unwrap_or_default().to_owned();
                    match toks.get(j + 2).map(|t| &t.0) {
                        Some(Tok::Punct(';')) => {
                            test_children.insert(name);
                            i = j + 3;
                        }
                        _ => i = skip_block(&toks, j + 2),
                    }
                }
                continue;
            }
            Tok::Ident(s) if s == "mod" => {
                if let (Some(name), Some((Tok::Punct('{'), _))) = (ident(toks.get(i + 1)), toks.get(i + 2)) {
                    depth += 1;
                    inline.push((name.to_owned(), depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(s) if s == "use" => {
                let mut paths = Vec::new();
                i += 1;
                use_tree(&toks, &mut i, &[], &mut paths);
                for p in paths {
                    if let Some(target) = absolute(&here, &p, lib_name) {
                        let written = p.strip_suffix(&["self".to_owned()]).unwrap_or(&p);
                        imports.push(Import { target, line, text: format!("use {}", written.join("::")) });
                    }
                }
                continue;
            }
            Tok::Ident(s)
                if (s == "crate" || s == "super" || Some(s.as_str()) == lib_name)
                    && matches!(toks.get(i + 1), Some((Tok::PathSep, _)))
                    && !matches!(i.checked_sub(1).and_then(|j| toks.get(j)), Some((Tok::PathSep, _))) =>
            {
                let mut p = vec![s.clone()];
                let mut j = i + 1;
                while let (Some((Tok::PathSep, _)), Some(next)) = (toks.get(j), ident(toks.get(j + 1))) {
                    p.push(next.to_owned());
                    j += 2;
                }
                if let Some(target) = absolute(&here, &p, lib_name) {
                    imports.push(Import { target, line, text: p.join("::") });
                }
                i = j;
                continue;
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
    (imports, test_children)
}

/// `#[cfg(test)]` at `toks[0]`.
fn is_cfg_test(toks: &[(Tok, usize)]) -> bool {
    let want = [Tok::Punct('#'), Tok::Punct('['), Tok::Ident("cfg".into()), Tok::Punct('(')];
    toks.len() > 6
        && toks.iter().zip(&want).all(|(a, b)| a.0 == *b)
        && toks[4].0 == Tok::Ident("test".into())
        && toks[5].0 == Tok::Punct(')')
}

/// The index after the attributes starting at `i`.
fn skip_attrs(toks: &[(Tok, usize)], mut i: usize) -> usize {
    while matches!(toks.get(i).map(|t| &t.0), Some(Tok::Punct('#'))) {
        i = skip_block(toks, i + 1);
    }
    i
}

/// The index after the bracketed or braced group opening at `i`.
fn skip_block(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0usize;
    while let Some((t, _)) = toks.get(i) {
        i += 1;
        match t {
            Tok::Punct('{' | '[' | '(') => depth += 1,
            Tok::Punct('}' | ']' | ')') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    i
}

/// Every product file of `src` with its imports resolved to module files (test modules left out).
fn read_crate(src: &Path, lib_name: Option<&str>) -> Vec<File> {
    let modules = module_files(src);
    let mut files = Vec::new();
    let mut tests: BTreeSet<Module> = BTreeSet::new();
    for (module, path) in &modules {
        let text = std::fs::read_to_string(path).expect("readable source file");
        let lib = (module.as_slice() == ["main"]).then_some(lib_name).flatten();
        let (imports, test_children) = read_file(module, &text, lib);
        for c in test_children {
            tests.insert(module.iter().cloned().chain([c]).collect());
        }
        let imports = imports
            .into_iter()
            .map(|mut imp| {
                let mut t = imp.target.clone();
                while !t.is_empty() && !modules.contains_key(&t) {
                    t.pop();
                }
                imp.target = t;
                imp
            })
            .collect();
        files.push(File { path: path.clone(), module: module.clone(), imports });
    }
    files.retain(|f| !tests.iter().any(|t| f.module.starts_with(t)));
    files
}

/// One module contains the other (its own files, parent and children).
fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
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

/// The circles among files, each as its edges (file, import).
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
    let (mut forward, mut backward): (
        BTreeMap<Module, BTreeSet<Module>>,
        BTreeMap<Module, BTreeSet<Module>>,
    ) = Default::default();
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
        let mut queue = std::collections::VecDeque::from([start]);
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

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("lb-user is in the workspace")
}

fn crate_src(name: &str) -> PathBuf {
    workspace().join(name).join("src")
}

/// A file's path from the workspace root, for messages.
fn rel(p: &Path) -> std::path::Display<'_> {
    p.strip_prefix(workspace()).unwrap_or(p).display()
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let mut failures = Vec::new();
    for (krate, lib) in [("lb-user", Some("tierlb")), ("lb-common", None), ("lb-ebpf", None)] {
        let files = read_crate(&crate_src(krate), lib);
        assert!(files.len() > 3, "{krate}: no source files found");
        for (cycle, tied) in circles(&files) {
            let mut msg = format!("{krate}: import circle through {}:", show(&cycle[0].0.module));
            for (f, imp) in &cycle {
                let _ = write!(
                    msg,
                    "\n    {}:{} imports {} (`{}`)",
                    rel(&f.path),
                    imp.line,
                    show(&imp.target),
                    imp.text
                );
            }
            if tied.len() > cycle.len() {
                let all: Vec<String> = tied.iter().map(|m| show(m)).collect();
                let _ = write!(msg, "\n    ({} files are tied by circles: {})", tied.len(), all.join(", "));
            }
            failures.push(msg);
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nMove what both sides need down into a module both may import (README, \"How it is built\").",
        failures.join("\n")
    );
}

/// Every import of `files` against `table`: a failure message per forbidden one.
fn check_layers(krate: &str, files: &[File], table: &[Part], exceptions: &[(&str, &str)]) -> Vec<String> {
    let part_of = |m: &[String]| -> Option<&Part> {
        table.iter().find(|p| p.modules.iter().any(|pm| m.first().map(String::as_str) == Some(pm)))
    };
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
        if f.module.is_empty() {
            continue;
        }
        let Some(from) = part_of(&f.module) else {
            failures.push(format!(
                "{}: module {} is in no part of {krate}'s layer table (tests/layers.rs): add it where it belongs",
                rel(&f.path),
                show(&f.module)
            ));
            continue;
        };
        let ok = allowed(from);
        for imp in &f.imports {
            let Some(to) = part_of(&imp.target) else { continue };
            let excepted = exceptions.iter().any(|(m, p)| *m == f.module.join("/") && *p == to.name);
            if ok.contains(to.name) || excepted {
                continue;
            }
            let may: Vec<&str> = ok.iter().copied().filter(|n| *n != from.name).collect();
            failures.push(format!(
                "{}:{}: `{}` imports {} ({} part) from {} ({} part), against the layer rule: {} may import {}",
                rel(&f.path),
                imp.line,
                imp.text,
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

#[test]
fn imports_point_down_the_layers() {
    let mut failures = check_layers(
        "lb-user",
        &read_crate(&crate_src("lb-user"), Some("tierlb")),
        LB_USER,
        LB_USER_EXCEPTIONS,
    );
    failures.extend(check_layers("lb-ebpf", &read_crate(&crate_src("lb-ebpf"), None), LB_EBPF, &[]));
    assert!(
        failures.is_empty(),
        "{}\nfaces -> agent -> {{semantics, datapath, sources}} -> model: move the definition down (README, \"How it \
         is built\")",
        failures.join("\n")
    );
}

#[test]
fn the_reader_finds_paths_in_use_trees_and_code_but_not_in_comments_or_strings() {
    let src = "use crate::{a::{b, c::D}, e as f};\n// use crate::g;\nfn x() { let s = \"crate::h\"; \
               crate::i::j(); super::k(); let c = '\"'; }\n#[cfg(test)]\nmod tests { use crate::l; }\n\
               mod inner { use super::super::m; }\n#[cfg(test)]\nmod more;\n";
    let module = vec!["p".to_owned(), "q".to_owned()];
    let (imports, tests) = read_file(&module, src, None);
    let got: Vec<String> = imports.iter().map(|i| i.target.join("/")).collect();
    assert_eq!(got, ["a/b", "a/c/D", "e", "i/j", "p/k", "p/m"]);
    assert_eq!(tests, BTreeSet::from(["more".to_owned()]));
}
