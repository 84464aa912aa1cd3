//! From the paths each file names to the module files they reach: a path points into the longest module
//! that has a file; a path that stops at the crate root (`crate::Backend`, `super::MAPS` from a top-level
//! module) names one of the root's items, looked up in its scope: its own definitions are the root's part
//! (or the catalogue's, `tables::Crate::catalogue`), and a name one of its `use`s brings in (a re-export,
//! `pub use choice::below`, or `pub use nat::*`) is followed to the module that holds it. So a re-export in
//! the root cannot carry an import past the layer rule, and a name the reader cannot find there is reported
//! rather than let through.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use crate::{
    read::{Kind, Module, Parsed, Raw, Scope, read_file},
    tables::{CATALOGUE, Crate, ROOT},
};

/// One dependency found in a file: the module it names, the line (of the `use` or the path) and the path
/// as written.
pub(crate) struct Import {
    pub(crate) target: Module,
    pub(crate) line: usize,
    pub(crate) text: String,
    /// For a bare name in the crate root: the root's `use` that brought it in.
    pub(crate) via: Option<String>,
}

/// A module file with its dependencies. The crate root's catalogue items (`tables::Crate::catalogue`) are a
/// file of their own here, module `[CATALOGUE]`, though they are written in the root's file.
pub(crate) struct File {
    pub(crate) path: PathBuf,
    pub(crate) module: Module,
    pub(crate) imports: Vec<Import>,
}

/// A crate, read: its product files (test modules left out), and what could not be resolved.
pub(crate) struct Read {
    pub(crate) files: Vec<File>,
    pub(crate) problems: Vec<String>,
}

/// The module of a file at `rel` (from `src`): `foo.rs` and `foo/mod.rs` are module `foo`, `lib.rs` the
/// root; `main.rs` is the root too unless the crate also has a `lib.rs` (then it is the binary, `main`).
pub(crate) fn module_of(rel: &Path, has_lib: bool) -> Module {
    let mut m: Module = rel.with_extension("").iter().map(|s| s.to_string_lossy().into_owned()).collect();
    match m.last().map(String::as_str) {
        Some("mod" | "lib") => {
            m.pop();
        }
        Some("main") if m.len() == 1 && !has_lib => {
            m.pop();
        }
        _ => {}
    }
    m
}

/// Every `.rs` file under the crate's `src`, as (path from `src`, text).
pub(crate) fn sources(src: &Path) -> Vec<(PathBuf, String)> {
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
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable source file");
            (p.strip_prefix(src).expect("under src").to_path_buf(), text)
        })
        .collect()
}

/// Reads `krate` from `sources` (paths from its `src`): every product file with its imports resolved.
pub(crate) fn read_tree(krate: &Crate, sources: &[(PathBuf, String)]) -> Read {
    let has_lib = sources.iter().any(|(p, _)| p == Path::new("lib.rs"));
    let mut parsed: BTreeMap<Module, (PathBuf, Parsed)> = BTreeMap::new();
    for (rel, text) in sources {
        let module = module_of(rel, has_lib);
        let lib = (module.as_slice() == ["main"]).then_some(krate.lib_name).flatten();
        let path = Path::new(krate.dir).join("src").join(rel);
        parsed.insert(module.clone(), (path, read_file(&module, text, lib)));
    }
    let tests: BTreeSet<Module> = parsed
        .iter()
        .flat_map(|(m, (_, p))| {
            p.test_children.iter().map(|c| m.iter().cloned().chain([c.clone()]).collect())
        })
        .collect();
    let scopes = Scopes { files: &parsed, catalogue: krate.catalogue };
    let mut read = Read { files: Vec::new(), problems: Vec::new() };
    let mut let_through = BTreeSet::new();
    let Some((root_path, root)) = parsed.get(&Module::new()) else {
        read.problems.push(format!("{}: no crate root (lib.rs or main.rs)", krate.dir));
        return read;
    };
    for entry in krate.catalogue {
        let held = root.scope.defs.contains(*entry) || root.scope.called.contains(*entry);
        if !held {
            read.problems.push(format!(
                "{}: {entry}, in {}'s catalogue (tests/layers/tables.rs), is no longer an item of the crate root: \
                 take it off the list",
                root_path.display(),
                krate.dir
            ));
        }
    }
    for (module, (path, file)) in &parsed {
        if tests.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let mut split: BTreeMap<Module, Vec<Import>> = BTreeMap::from([(module.clone(), Vec::new())]);
        if module.is_empty() && !krate.catalogue.is_empty() {
            split.insert(vec![CATALOGUE.to_owned()], Vec::new());
        }
        for raw in &file.raws {
            let from = match &raw.item {
                Some(item) if module.is_empty() && krate.catalogue.contains(&item.as_str()) => {
                    vec![CATALOGUE.to_owned()]
                }
                _ => module.clone(),
            };
            match scopes.import(raw) {
                Ok(Some(imp)) if !known(krate, &from, raw, &mut let_through) => {
                    split.entry(from).or_default().push(imp);
                }
                Ok(_) => {}
                Err(why) => {
                    read.problems.push(format!("{}:{}: `{}`: {why}", path.display(), raw.line, raw.text));
                }
            }
        }
        for (module, imports) in split {
            read.files.push(File { path: path.clone(), module, imports });
        }
    }
    for k in krate.known {
        let who = if k.module == ROOT { "the crate root" } else { k.module };
        for name in k.names.iter().filter(|n| !let_through.contains(&(k.module, **n))) {
            read.problems.push(format!(
                "{}: {who} no longer imports {name}, a known import of tests/layers/tables.rs: take it off the list",
                krate.dir
            ));
        }
    }
    read
}

/// `raw`, an import of module `from`, is one of `krate`'s known imports (`tables::Known`); noted in `seen`.
fn known<'k>(krate: &'k Crate, from: &[String], raw: &Raw, seen: &mut BTreeSet<(&'k str, &'k str)>) -> bool {
    let from = if from.is_empty() { ROOT.to_owned() } else { from.join("/") };
    let name = raw.path.last().map_or("", String::as_str);
    let Some(k) = krate.known.iter().find(|k| k.module == from && k.names.contains(&name)) else {
        return false;
    };
    let name = k.names.iter().find(|n| **n == name).expect("just found");
    seen.insert((k.module, name));
    true
}

/// The files' top-level scopes, for following a name through the crate root.
struct Scopes<'a> {
    files: &'a BTreeMap<Module, (PathBuf, Parsed)>,
    catalogue: &'a [&'a str],
}

/// Re-exports followed before the reader gives up (a loop, which the compiler would refuse anyway).
const HOPS: usize = 16;

impl Scopes<'_> {
    /// The import a raw path makes: `None` for another crate's name, or a bare name in the root that is
    /// none of the root's own (a local, a field, the prelude).
    fn import(&self, raw: &Raw) -> Result<Option<Import>, String> {
        let target = match raw.kind {
            Kind::Glob if raw.path.is_empty() => {
                return Err("a glob of the crate root brings in every name it re-exports, from any part: \
                            name what you use"
                    .to_owned());
            }
            Kind::Name => self.root_name(&raw.path[0], &[], 0).ok().flatten(),
            Kind::Use | Kind::Glob | Kind::Path => self.resolve(&raw.path, 0)?,
        };
        let via = match raw.kind {
            Kind::Name => self.brought_by(&raw.path[0]),
            _ => None,
        };
        Ok(target.map(|target| Import { target, line: raw.line, text: raw.text.clone(), via }))
    }

    /// The crate root's `use` that brings `name` in, as written.
    fn brought_by(&self, name: &str) -> Option<String> {
        let root = self.scope(&[])?;
        if let Some(b) = root.uses.get(name) {
            return Some(b.text.clone());
        }
        let holds = |g: &[String]| self.resolve(g, 1).ok().flatten().is_some_and(|m| self.holds(&m, name, 1));
        root.globs.iter().find(|(g, _, _)| holds(g)).map(|(_, text, _)| text.clone())
    }

    fn scope(&self, m: &[String]) -> Option<&Scope> {
        self.files.get(m).map(|(_, p)| &p.scope)
    }

    /// The longest prefix of `path` that is a module file.
    fn longest(&self, path: &[String]) -> Module {
        let mut t = path.to_vec();
        while !t.is_empty() && !self.files.contains_key(&t) {
            t.pop();
        }
        t
    }

    /// The module `path` reaches; `None` for another crate's.
    fn resolve(&self, path: &[String], hops: usize) -> Result<Option<Module>, String> {
        let t = self.longest(path);
        if !t.is_empty() {
            return Ok(Some(t));
        }
        match path.split_first() {
            None => Ok(Some(Vec::new())),
            Some((name, rest)) => self.root_name(name, rest, hops),
        }
    }

    /// The module that holds `name` of the crate root (followed by `rest`).
    fn root_name(&self, name: &str, rest: &[String], hops: usize) -> Result<Option<Module>, String> {
        if hops > HOPS {
            return Err(format!("the crate root's re-exports of {name} go round"));
        }
        if self.catalogue.contains(&name) {
            return Ok(Some(vec![CATALOGUE.to_owned()]));
        }
        let root = self.scope(&[]).ok_or("no crate root")?;
        if root.defs.contains(name) {
            return Ok(Some(Vec::new()));
        }
        if let Some(b) = root.uses.get(name) {
            let Some(p) = &b.path else { return Ok(None) };
            let full: Vec<String> = p.iter().chain(rest).cloned().collect();
            return self.resolve(&full, hops + 1);
        }
        for (g, _, _) in &root.globs {
            if let Some(m) = self.resolve(g, hops + 1)?.filter(|m| !m.is_empty())
                && self.holds(&m, name, hops + 1)
            {
                return Ok(Some(m));
            }
        }
        Err(format!(
            "{name} is no item of the crate root and none of its `use`s brings it in (a macro's item?): the \
             reader cannot tell which part it belongs to"
        ))
    }

    /// A glob of module file `m` brings `name` in: `m` defines it `pub`, or brings it in by a `pub use`.
    fn holds(&self, m: &[String], name: &str, hops: usize) -> bool {
        let Some(s) = self.scope(m) else { return false };
        s.public.contains(name)
            || (hops <= HOPS
                && s.globs.iter().filter(|(_, _, public)| *public).any(|(g, _, _)| {
                    self.resolve(g, hops + 1).ok().flatten().is_some_and(|gm| self.holds(&gm, name, hops + 1))
                }))
    }
}
