//! The reader: one file's text to the paths it names, without a Rust parser. Comments, string and char
//! literals are blanked first (lex.rs); then `use` trees (brace groups included, nested) and the `crate::`,
//! `super::`, `self::` and child-module paths in code are taken, each made absolute from the module it is
//! written in. A crate root is read apart (see `Parsed::scope` and `Kind::Name`), and `#[cfg(test)]`
//! modules, inline or in their own file, are skipped: a test may read any module to check it.
use std::collections::{BTreeMap, BTreeSet};

use crate::lex::{Tok, Toks, tokens};

/// A module, as the path of its file from `src` (`plan/external_frontends.rs` is `["plan",
/// "external_frontends"]`); the crate root is the empty path.
pub(crate) type Module = Vec<String>;

pub(crate) fn show(m: &[String]) -> String {
    if m.is_empty() { "(crate root)".to_owned() } else { m.join("/") }
}

/// How a path was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A `use` tree's path.
    Use,
    /// A `use` tree's glob (`use crate::plan::*`): everything its target holds.
    Glob,
    /// A path in code (`crate::plan::build(..)`).
    Path,
    /// A bare name in a crate root's code, which one of the root's own `use`s may have brought in
    /// (`FrontendKey`, or `MAP_REVERSE` from `pub use reverse::*`); only those count.
    Name,
}

/// One path a file names, absolute (from the crate root, the module it is written in resolved), before it is
/// resolved to a module file.
#[derive(Debug)]
pub(crate) struct Raw {
    pub(crate) path: Vec<String>,
    pub(crate) kind: Kind,
    pub(crate) line: usize,
    /// The path as written, for messages.
    pub(crate) text: String,
    /// The top-level item of the file the path is in (`MAPS`, or `aya_pod!` for a macro called at the top):
    /// a crate root's items may sit in different parts (`tables::Crate::catalogue`).
    pub(crate) item: Option<String>,
}

/// What one `use` at a file's top brings into its scope.
#[derive(Debug)]
pub(crate) struct Brought {
    /// The absolute path, `None` for another crate's (`core::mem::size_of`).
    pub(crate) path: Option<Vec<String>>,
    /// The `use` as written, for messages.
    pub(crate) text: String,
}

/// The names a file holds at its top: what `crate::NAME` (for the root) or a glob of it reaches.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    /// Items defined there (functions, constants, types, inline modules, `macro_rules!`).
    pub(crate) defs: BTreeSet<String>,
    /// Those of `defs` and `uses` that are `pub` (in any form): what a glob of the module brings in.
    pub(crate) public: BTreeSet<String>,
    /// Macros called there as items (`aya_pod!(..)`), as `name!`.
    pub(crate) called: BTreeSet<String>,
    /// Names a `use` brings in (its alias or last segment), public or not: `crate::NAME` reaches a private
    /// `use` of the root too.
    pub(crate) uses: BTreeMap<String, Brought>,
    /// Glob `use`s of this crate (`pub use counters::*`): the absolute path, the `use` as written, and
    /// whether it is `pub` (then a glob of this module brings those names in too).
    pub(crate) globs: Vec<(Vec<String>, String, bool)>,
}

/// One file, read.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// Every path the file names. A crate root's top-level `use`s are not among them: there they only put
    /// names in the crate's scope (`pub use choice::{..}` is the crate's face, not a dependency of the root's
    /// items), and what the root's items name through them comes as `Kind::Name`.
    pub(crate) raws: Vec<Raw>,
    /// The child modules the file declares under `#[cfg(test)]`.
    pub(crate) test_children: BTreeSet<String>,
    pub(crate) scope: Scope,
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn punct(t: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(t, Some((Tok::Punct(p), _)) if *p == c)
}

/// One path of a use tree: `use a::{b as c, d::*}` has `a::b` (alias `c`) and the glob `a::d`.
struct UsePath {
    path: Vec<String>,
    alias: Option<String>,
    glob: bool,
}

impl UsePath {
    /// The name it brings in: the alias, else the last segment (`a::b::{self}` brings `b`); none for a glob
    /// or `as _`.
    fn name(&self) -> Option<&str> {
        if self.glob {
            return None;
        }
        let last = match self.path.as_slice() {
            [.., parent, last] if last == "self" => parent,
            [.., last] => last,
            [] => return None,
        };
        Some(self.alias.as_deref().unwrap_or(last)).filter(|n| *n != "_")
    }

    fn written(&self) -> String {
        let path = self.path.strip_suffix(&["self".to_owned()]).unwrap_or(&self.path).join("::");
        match (&self.alias, self.glob) {
            (_, true) => format!("use {path}::*"),
            (Some(a), false) => format!("use {path} as {a}"),
            (None, false) => format!("use {path}"),
        }
    }
}

/// The paths of a use tree starting at `toks[*i]`, each prefixed by `prefix`; stops after the tree.
fn use_tree(toks: &Toks, i: &mut usize, prefix: &[String], out: &mut Vec<UsePath>) {
    let mut path = prefix.to_vec();
    let (mut alias, mut glob) = (None, false);
    loop {
        match toks.get(*i).map(|t| &t.0) {
            Some(Tok::Ident(s)) if s == "as" => {
                alias = ident(toks.get(*i + 1)).map(str::to_owned);
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
                    if punct(toks.get(*i), ',') {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                glob = true;
                break;
            }
            _ => break,
        }
    }
    if path.len() > prefix.len() || glob {
        out.push(UsePath { path, alias, glob });
    }
}

/// Where a file sits, for making its paths absolute.
struct Base<'a> {
    /// What `crate::` means: the root, or for a binary beside a library its own module (`main`).
    krate: Module,
    /// The library's name as a binary beside it writes it (`tierlb`).
    lib_name: Option<&'a str>,
    /// The child modules the file declares (`mod plan;`): bare paths through them start here.
    children: BTreeSet<String>,
}

impl Base<'_> {
    /// The absolute path of `path`, written in module `here` (`top`: not inside an inline module); `None` for
    /// other crates and names not known to start a path of this crate.
    fn absolute(&self, here: &[String], path: &[String], top: bool) -> Option<Vec<String>> {
        let first = path.first()?.as_str();
        let (mut base, skip) = match first {
            "crate" => (self.krate.clone(), 1),
            s if Some(s) == self.lib_name => (Vec::new(), 1),
            "super" | "self" => (here.to_vec(), 0),
            s if top && self.children.contains(s) => (here.to_vec(), 0),
            _ => return None,
        };
        let mut rest = &path[skip..];
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

    /// `s` starts a path of this crate in code.
    fn starts_path(&self, s: &str, top: bool) -> bool {
        matches!(s, "crate" | "super" | "self")
            || Some(s) == self.lib_name
            || (top && self.children.contains(s))
    }
}

/// The child modules a file declares at its top (`mod a;`, `pub mod b;`).
fn declared(toks: &Toks) -> BTreeSet<String> {
    let mut nest = 0usize;
    let mut out = BTreeSet::new();
    for (i, (t, _)) in toks.iter().enumerate() {
        match t {
            Tok::Punct('{' | '[' | '(') => nest += 1,
            Tok::Punct('}' | ']' | ')') => nest = nest.saturating_sub(1),
            Tok::Ident(s) if s == "mod" && nest == 0 && punct(toks.get(i + 2), ';') => {
                out.extend(ident(toks.get(i + 1)).map(str::to_owned));
            }
            _ => {}
        }
    }
    out
}

/// The item an item keyword at `toks[i]` opens: its name (`const fn f` is `f`), `impl` for an impl block,
/// `None` for a word that is not an item keyword.
fn item_at(toks: &Toks, i: usize) -> Option<String> {
    let kw = ident(toks.get(i))?;
    if kw == "impl" {
        return Some("impl".to_owned());
    }
    if !matches!(kw, "fn" | "const" | "static" | "struct" | "enum" | "union" | "type" | "trait") {
        return None;
    }
    let mut j = i + 1;
    while let Some(n) = ident(toks.get(j)) {
        if !matches!(n, "fn" | "mut" | "unsafe" | "async" | "extern") {
            return Some(n.to_owned());
        }
        j += 1;
    }
    None
}

/// The item or `use` whose keyword is at `toks[i]` is `pub`, in any form (`pub`, `pub(crate)`; `pub unsafe
/// fn`).
fn is_pub(toks: &Toks, mut i: usize) -> bool {
    while i > 0 {
        i -= 1;
        match &toks[i].0 {
            Tok::Ident(s) if matches!(s.as_str(), "unsafe" | "async" | "extern" | "const") => {}
            Tok::Ident(s) => return s == "pub",
            Tok::Punct(')') => {
                while i > 0 && !punct(toks.get(i), '(') {
                    i -= 1;
                }
            }
            _ => return false,
        }
    }
    false
}

/// Reads one file of module `module`; `lib_name` for a binary beside a library (its `tierlb::` paths).
pub(crate) fn read_file(module: &Module, text: &str, lib_name: Option<&str>) -> Parsed {
    let toks = tokens(text);
    let children = declared(&toks);
    let krate = if lib_name.is_some() { module.clone() } else { Vec::new() };
    let mut r = Reader {
        module,
        base: Base { krate, lib_name, children },
        toks,
        out: Parsed::default(),
        inline: Vec::new(),
        nest: 0,
        item: None,
    };
    let mut i = 0;
    while i < r.toks.len() {
        i = r.step(i);
    }
    r.out
}

/// The state of reading one file, token by token.
struct Reader<'a> {
    module: &'a Module,
    base: Base<'a>,
    toks: Vec<(Tok, usize)>,
    out: Parsed,
    /// Inline modules: (name, nesting inside it), for `super::` inside them.
    inline: Vec<(String, usize)>,
    /// Open brackets, braces and parentheses: an item starts and ends at 0.
    nest: usize,
    /// The top-level item being read.
    item: Option<String>,
}

impl Reader<'_> {
    /// The module the tokens are in (inline modules included).
    fn here(&self) -> Module {
        self.module.iter().cloned().chain(self.inline.iter().map(|(n, _)| n.clone())).collect()
    }

    /// Reads the token at `i`; the index of the next one to read.
    fn step(&mut self, i: usize) -> usize {
        let after_sep = i > 0 && matches!(self.toks[i - 1].0, Tok::PathSep | Tok::Punct('.'));
        let top = self.inline.is_empty();
        match self.toks[i].0.clone() {
            Tok::Punct('#') if is_cfg_test(&self.toks[i..]) => return self.skip_test_item(i),
            Tok::Ident(s) if s == "mod" && !after_sep => return self.module_decl(i),
            Tok::Ident(s) if s == "use" && !after_sep => return self.use_decl(i),
            Tok::Ident(s)
                if !after_sep
                    && self.base.starts_path(&s, top)
                    && self.toks.get(i + 1).is_some_and(|t| t.0 == Tok::PathSep) =>
            {
                return self.path(i, s);
            }
            Tok::Ident(s) => return self.word(i, s, after_sep),
            Tok::Punct('{' | '[' | '(') => self.nest += 1,
            Tok::Punct(c @ ('}' | ']' | ')')) => {
                if self.inline.last().is_some_and(|(_, d)| *d == self.nest) {
                    self.inline.pop();
                }
                self.nest = self.nest.saturating_sub(1);
                if self.nest == 0 && c == '}' {
                    self.item = None;
                }
            }
            Tok::Punct(';') if self.nest == 0 => self.item = None,
            _ => {}
        }
        i + 1
    }

    /// `#[cfg(test)]` at `i`: skips the attribute, further attributes, then the test item (a module, here).
    fn skip_test_item(&mut self, i: usize) -> usize {
        let i = skip_attrs(&self.toks, i);
        let Some(j) = (i..self.toks.len().min(i + 3)).find(|j| ident(self.toks.get(*j)) == Some("mod"))
        else {
            return i;
        };
        let name = ident(self.toks.get(j + 1)).unwrap_or_default().to_owned();
        if punct(self.toks.get(j + 2), ';') {
            self.out.test_children.insert(name);
            j + 3
        } else {
            skip_block(&self.toks, j + 2)
        }
    }

    /// `mod name;` or `mod name {` at `i`.
    fn module_decl(&mut self, i: usize) -> usize {
        let Some(name) = ident(self.toks.get(i + 1)).map(str::to_owned) else { return i + 1 };
        if self.nest == 0 {
            self.out.scope.defs.insert(name.clone());
        }
        if punct(self.toks.get(i + 2), '{') {
            self.nest += 1;
            self.inline.push((name, self.nest));
            return i + 3;
        }
        i + 2
    }

    /// A `use` at `i`: its paths are the file's dependencies, and at the file's top they also bring names in;
    /// at a crate root's top only that (see `Parsed::raws`).
    fn use_decl(&mut self, mut i: usize) -> usize {
        let (line, here, top) = (self.toks[i].1, self.here(), self.inline.is_empty());
        let public = is_pub(&self.toks, i);
        let mut paths = Vec::new();
        i += 1;
        use_tree(&self.toks, &mut i, &[], &mut paths);
        for u in paths {
            let target = self.base.absolute(&here, &u.path, top);
            if self.nest == 0 {
                if let Some(name) = u.name() {
                    let brought = Brought { path: target.clone(), text: u.written() };
                    self.out.scope.uses.insert(name.to_owned(), brought);
                    if public {
                        self.out.scope.public.insert(name.to_owned());
                    }
                }
                if let (true, Some(t)) = (u.glob, &target) {
                    self.out.scope.globs.push((t.clone(), u.written(), public));
                }
                if self.module.is_empty() {
                    continue;
                }
            }
            if let Some(path) = target {
                let kind = if u.glob { Kind::Glob } else { Kind::Use };
                self.out.raws.push(Raw { path, kind, line, text: u.written(), item: self.item.clone() });
            }
        }
        i
    }

    /// A path of this crate in code at `i` (`crate::a::b`, `super::c`, `plan::build`).
    fn path(&mut self, i: usize, first: String) -> usize {
        let mut p = vec![first];
        let mut j = i + 1;
        while let (Some((Tok::PathSep, _)), Some(next)) = (self.toks.get(j), ident(self.toks.get(j + 1))) {
            p.push(next.to_owned());
            j += 2;
        }
        if let Some(path) = self.base.absolute(&self.here(), &p, self.inline.is_empty()) {
            let (line, item) = (self.toks[i].1, self.item.clone());
            self.out.raws.push(Raw { path, kind: Kind::Path, line, text: p.join("::"), item });
        }
        j
    }

    /// Any other word at `i`: at the top it may open an item; in a crate root it may be a name the root's
    /// `use`s brought in.
    fn word(&mut self, i: usize, s: String, after_sep: bool) -> usize {
        // `name!(..)`, `name![..]`, `name! {..}`: a macro call (not `a != b`).
        let bang = punct(self.toks.get(i + 1), '!')
            && ['(', '[', '{'].iter().any(|c| punct(self.toks.get(i + 2), *c));
        let at_top = self.nest == 0 && self.item.is_none();
        if at_top && s == "macro_rules" && punct(self.toks.get(i + 1), '!') {
            let name = ident(self.toks.get(i + 2)).unwrap_or_default().to_owned();
            self.out.scope.defs.insert(name.clone());
            self.item = Some(format!("macro_rules! {name}"));
            return i + 3;
        }
        if at_top {
            if bang {
                self.out.scope.called.insert(format!("{s}!"));
                self.item = Some(format!("{s}!"));
            } else if let Some(name) = item_at(&self.toks, i) {
                if name != "impl" && name != "_" {
                    self.out.scope.defs.insert(name.clone());
                    if is_pub(&self.toks, i) {
                        self.out.scope.public.insert(name.clone());
                    }
                }
                self.item = Some(name);
            }
        }
        if self.module.is_empty() && !after_sep && !bang {
            let (line, item) = (self.toks[i].1, self.item.clone());
            self.out.raws.push(Raw { path: vec![s.clone()], kind: Kind::Name, line, text: s, item });
        }
        i + 1
    }
}

/// `#[cfg(test)]` at `toks[0]`.
fn is_cfg_test(toks: &Toks) -> bool {
    let want = [Tok::Punct('#'), Tok::Punct('['), Tok::Ident("cfg".into()), Tok::Punct('(')];
    toks.len() > 6
        && toks.iter().zip(&want).all(|(a, b)| a.0 == *b)
        && toks[4].0 == Tok::Ident("test".into())
        && toks[5].0 == Tok::Punct(')')
}

/// The index after the attributes starting at `i`.
fn skip_attrs(toks: &Toks, mut i: usize) -> usize {
    while punct(toks.get(i), '#') {
        i = skip_block(toks, i + 1);
    }
    i
}

/// The index after the bracketed or braced group opening at `i`.
fn skip_block(toks: &Toks, mut i: usize) -> usize {
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
