//! A directory of Kubernetes YAML (Service, EndpointSlice, Node, List) as a source.
//!
//! Bad input never takes the rest down: a document that does not parse or convert is reported with its file,
//! document index and field, and skipped (`parse`); a file with any problem keeps the objects it had at the
//! last load that was clean ("last good state"), so a half-saved edit cannot drop a Service's endpoints.
//! Only files whose stamp changed are read again, and a refresh reports the objects they changed.
mod parse;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, btree_map::Entry},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use self::parse::{FileContents, parse_file};
use super::{Changes, Diagnostic, ModelSource, Object, Origin, Refresh, Severity};
use crate::model::{Model, ObjKey, ObjectId};

/// One file's text as the directory source reads it: the objects it gives (only valid ones) and every
/// problem found, errors and warnings (for tools that read one file, and the fuzz targets).
pub fn parse_text(path: &Path, text: &str) -> (Vec<Object>, Vec<Diagnostic>) {
    let contents = parse_file(path, text);
    (contents.objects, contents.diagnostics)
}

/// The model of one file's (or stdin's) text, read once: what `--manifests FILE` and `--manifests -` give the
/// one-shot commands (a `kubectl get ... -o yaml` dump is one file, a `kind: List` of everything).
pub fn load_text(path: &Path, text: &str) -> Loaded {
    let (objects, mut diagnostics) = parse_text(path, text);
    let model = assemble(objects.into_iter().map(|o| (path.to_owned(), o)).collect(), &mut diagnostics);
    Loaded { model, diagnostics, stale_files: Vec::new() }
}

/// The pods the EndpointSlices of one file's text name, by address (`convert::pod_refs`). Documents that do
/// not read as EndpointSlices are passed over (`load_text` reports them).
pub fn pod_refs_text(text: &str) -> BTreeMap<std::net::IpAddr, ObjKey> {
    fn walk(v: serde_json::Value, out: &mut BTreeMap<std::net::IpAddr, ObjKey>) {
        match v.get("kind").and_then(|k| k.as_str()) {
            Some("EndpointSlice") => {
                if let Ok(s) = serde_json::from_value::<k8s_openapi::api::discovery::v1::EndpointSlice>(v) {
                    out.extend(super::convert::pod_refs(&s));
                }
            }
            Some(k) if k.ends_with("List") => {
                if let Some(items) = v.get("items").and_then(|i| i.as_array()) {
                    for item in items.clone() {
                        walk(item, out);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    super::yaml::each_document(text, |_, doc| doc.map(|v| walk(v, &mut out)).is_ok());
    out
}

/// A manifests directory with per-file memory: what each file contributed (its last clean version while the
/// current one has errors), and the file's stamp, so an unchanged file is neither read nor parsed again.
#[derive(Debug, Default)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// How many files (or documents) define each object.
    defined: HashMap<ObjectId, usize>,
    /// Duplicate-object errors from the last full assembly.
    duplicates: Vec<Diagnostic>,
    assembled: bool,
    /// What a file watcher saw since the last refresh; without one, every refresh looks at every file.
    watched: Option<Watched>,
}

/// What a file watcher saw in the directory for the next refresh: the manifest files named in its events,
/// or that the directory is to be looked at whole (an event on the directory itself, on the kubelet's
/// `..data` swap of a ConfigMap or Secret volume, or a watcher that lost events), so an edit costs one
/// file's stat and read however many files there are.
#[derive(Clone, Debug, Default)]
pub struct Watched(Arc<Mutex<Seen>>);

#[derive(Debug, Default)]
struct Seen {
    all: bool,
    paths: BTreeSet<PathBuf>,
}

impl Watched {
    /// An event on `path` in `dir` (or on `dir`): noted; whether it calls for a refresh (an editor's swap
    /// file or a log kept beside the manifests does not).
    pub fn saw(&self, dir: &Path, path: &Path) -> bool {
        let mut seen = self.0.lock().expect("watched lock");
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        // Anything but a file of the directory (which a watch of it does not report) is taken as a change
        // to the directory.
        if path.parent() != Some(dir) || name.starts_with("..") {
            seen.all = true;
        } else if is_manifest_file_name(path) {
            seen.paths.insert(path.to_owned());
        } else {
            return false;
        }
        true
    }

    /// The watcher lost events or cannot name them: the next refresh looks at every file.
    pub fn everything(&self) {
        self.0.lock().expect("watched lock").all = true;
    }

    /// The paths seen since the last call, or `None` when every file is to be looked at.
    fn take(&self) -> Option<BTreeSet<PathBuf>> {
        let seen = std::mem::take(&mut *self.0.lock().expect("watched lock"));
        (!seen.all).then_some(seen.paths)
    }
}

#[derive(Debug)]
struct FileState {
    /// `None` when the file could not be read: it is read again on the next refresh.
    stamp: Option<Stamp>,
    /// The objects the model takes from this file.
    used: Vec<Object>,
    diagnostics: Vec<Diagnostic>,
    /// `used` is the last clean version; the current content has errors.
    stale: bool,
    /// `used` came from a clean version (so it is the one to keep while the file has errors).
    good: bool,
}

/// A file and its stamp.
type StampedFile = (PathBuf, Stamp);

/// What tells that a file changed without reading it: a save rewrites it (new size or mtime/ctime) or
/// replaces it (new inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The whole model of a directory, for one-shot readers (`tierlb plan`, `explain`) and tests.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every object of the directory (the first of duplicates, last good versions of broken files).
    pub model: Model,
    /// Every problem the files have.
    pub diagnostics: Vec<Diagnostic>,
    /// Files whose objects come from an earlier load because the current content has errors.
    pub stale_files: Vec<PathBuf>,
}

impl ManifestDir {
    /// The directory `dir`, not read yet (the first `refresh` or `load` reads it).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), ..Self::default() }
    }

    /// The directory `dir` with a file watcher's events: a refresh after the first looks only at the files
    /// the watcher named through the returned handle.
    pub fn watched(dir: impl Into<PathBuf>) -> (Self, Watched) {
        let watched = Watched::default();
        (Self { dir: dir.into(), watched: Some(watched.clone()), ..Self::default() }, watched)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The YAML files of the directory with their stamps (one stat each), sorted by path (so duplicates
    /// resolve the same way every time).
    fn files(&self) -> std::io::Result<Vec<(PathBuf, Stamp)>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if !is_manifest_file_name(&path) {
                continue;
            }
            // Follows a symlink, as reading the file does.
            if let Ok(m) = std::fs::metadata(&path)
                && m.is_file()
            {
                files.push((path, Stamp::of(&m)));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(files)
    }

    /// The pods the EndpointSlices of the directory name, by address (`pod_refs_text`); read apart from
    /// the model, which does not keep them.
    pub fn pod_refs(&self) -> std::io::Result<BTreeMap<std::net::IpAddr, ObjKey>> {
        let mut out = BTreeMap::new();
        for (path, _) in self.files()? {
            out.extend(pod_refs_text(&std::fs::read_to_string(&path)?));
        }
        Ok(out)
    }

    /// The whole model as of now (reads whatever changed first).
    pub fn load(&mut self) -> std::io::Result<Loaded> {
        let r = self.refresh()?;
        let model = match r.changes {
            Changes::All(model) => model,
            Changes::Objects { .. } => assemble(self.objects(), &mut Vec::new()),
        };
        let stale_files = r
            .stale
            .into_iter()
            .filter_map(|o| match o {
                Origin::File { path, .. } => Some(path),
                Origin::Api(_) => None,
            })
            .collect();
        Ok(Loaded { model, diagnostics: r.diagnostics, stale_files })
    }

    /// The files to look at (with their stamps) and the files that are gone: those the watcher named since
    /// the last refresh, or every file of the directory (the first refresh, no watcher, or a watcher that
    /// asks for it).
    fn changed_files(&self) -> std::io::Result<(Vec<StampedFile>, Vec<PathBuf>)> {
        let named = self.watched.as_ref().and_then(Watched::take).filter(|_| self.assembled);
        let Some(named) = named else {
            let files = self.files()?;
            let gone = self
                .files
                .keys()
                .filter(|p| files.binary_search_by(|(f, _)| f.cmp(p)).is_err())
                .cloned()
                .collect();
            return Ok((files, gone));
        };
        // A file that could not be read is tried again on every refresh, as without a watcher.
        let unread = self.files.iter().filter(|(_, f)| f.stamp.is_none()).map(|(p, _)| p.clone());
        let named: BTreeSet<PathBuf> = named.into_iter().chain(unread).collect();
        let (mut files, mut gone) = (Vec::new(), Vec::new());
        for path in named {
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => files.push((path, Stamp::of(&m))),
                _ if self.files.contains_key(&path) => gone.push(path),
                _ => {}
            }
        }
        Ok((files, gone))
    }

    fn objects(&self) -> Vec<(PathBuf, Object)> {
        self.files.iter().flat_map(|(p, f)| f.used.iter().map(move |o| (p.clone(), o.clone()))).collect()
    }
}

impl ModelSource for ManifestDir {
    /// Read the files that changed since the last refresh. Fails only when the directory itself cannot be
    /// read.
    fn refresh(&mut self) -> std::io::Result<Refresh> {
        let (files, gone) = self.changed_files()?;
        // (objects the file gave before, objects it gives now) for every file that changed (its edit).
        let mut edits: Vec<(Vec<Object>, Vec<Object>)> = Vec::new();
        for path in gone {
            if let Some(state) = self.files.remove(&path) {
                edits.push((state.used, Vec::new()));
            }
        }
        let to_read: Vec<&StampedFile> =
            files.iter().filter(|(p, s)| !self.files.get(p).is_some_and(|f| f.stamp == Some(*s))).collect();
        for ((path, _), (contents, now)) in to_read.iter().copied().zip(read_all(&to_read)) {
            let previous = self.files.remove(path);
            let before = previous.as_ref().map(|f| f.used.clone()).unwrap_or_default();
            let state = match previous.filter(|f| f.good) {
                Some(last_good) if contents.has_errors() => FileState {
                    stamp: now,
                    used: last_good.used,
                    diagnostics: contents.diagnostics,
                    stale: true,
                    good: true,
                },
                _ => FileState {
                    stamp: now,
                    good: !contents.has_errors(),
                    used: contents.objects,
                    diagnostics: contents.diagnostics,
                    stale: false,
                },
            };
            if before != state.used {
                edits.push((before, state.used.clone()));
            }
            self.files.insert(path.clone(), state);
        }

        // A change that touches an object defined more than once (before or after) may change which copy
        // wins: assemble everything again. Otherwise the difference is exact.
        let mut duplicate_involved = false;
        for (before, after) in &edits {
            for o in before {
                let id = o.id();
                let n = self.defined.get(&id).copied().unwrap_or(0);
                duplicate_involved |= n > 1;
                if n > 1 {
                    self.defined.insert(id, n - 1);
                } else {
                    self.defined.remove(&id);
                }
            }
            for o in after {
                let defined = self.defined.entry(o.id()).or_default();
                *defined += 1;
                duplicate_involved |= *defined > 1;
            }
        }
        let changes = if !self.assembled || duplicate_involved {
            self.assembled = true;
            self.duplicates.clear();
            Changes::All(assemble(self.objects(), &mut self.duplicates))
        } else {
            let mut removed = Vec::new();
            let mut upserted = Vec::new();
            for (before, after) in edits {
                let mut before: HashMap<ObjectId, Object> = before.into_iter().map(|o| (o.id(), o)).collect();
                for o in after {
                    if before.remove(&o.id()).as_ref() != Some(&o) {
                        upserted.push(o);
                    }
                }
                removed.extend(before.into_values());
            }
            Changes::Objects { removed, upserted }
        };
        let mut diagnostics: Vec<Diagnostic> =
            self.files.values().flat_map(|f| f.diagnostics.iter().cloned()).collect();
        diagnostics.extend(self.duplicates.iter().cloned());
        let stale = self.files.iter().filter(|(_, f)| f.stale).map(|(p, _)| Origin::file(p)).collect();
        Ok(Refresh { changes, diagnostics, stale })
    }

    fn repack(&mut self) {
        crate::model::compact::repack(&mut self.files);
    }

    fn describe(&self) -> String {
        format!("directory {}", self.dir.display())
    }
}

/// Read and parse `files`, in order: on every CPU when there are many (the first load of a large
/// directory is mostly YAML parsing).
fn read_all(files: &[&StampedFile]) -> Vec<(FileContents, Option<Stamp>)> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from).min(files.len() / 4).max(1);
    if threads == 1 {
        return files.iter().map(|f| read_one(f)).collect();
    }
    let chunk = files.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = files
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(|f| read_one(f)).collect::<Vec<_>>()))
            .collect();
        parts.into_iter().flat_map(|h| h.join().expect("a manifest parser thread panicked")).collect()
    })
}

/// One file's contents and the stamp to keep (`None` when it could not be read: it is tried again).
fn read_one((path, stamp): &StampedFile) -> (FileContents, Option<Stamp>) {
    match std::fs::read_to_string(path) {
        Ok(text) => (parse_file(path, &text), Some(*stamp)),
        Err(e) => (
            FileContents {
                objects: Vec::new(),
                diagnostics: vec![Diagnostic {
                    service: None,
                    severity: Severity::Error,
                    origin: Origin::file(path),
                    field: None,
                    message: format!("cannot read: {e}"),
                }],
            },
            None,
        ),
    }
}

/// Build a model, reporting duplicates (the first one, in file order, is kept).
fn assemble(objects: Vec<(PathBuf, Object)>, diagnostics: &mut Vec<Diagnostic>) -> Model {
    let mut model = Model::default();
    let mut seen: BTreeMap<ObjectId, PathBuf> = BTreeMap::new();
    for (path, obj) in objects {
        match seen.entry(obj.id()) {
            Entry::Occupied(first) => {
                diagnostics.push(Diagnostic {
                    service: None,
                    severity: Severity::Error,
                    origin: Origin::File {
                        path,
                        document: None,
                        line: None,
                        object: Some(first.key().to_string()),
                    },
                    field: Some("metadata.name".into()),
                    message: format!("duplicate object; the one in {} is used", first.get().display()),
                });
                continue;
            }
            Entry::Vacant(v) => {
                v.insert(path);
            }
        }
        obj.insert_into(&mut model);
    }
    model
}

/// Whether the directory's loader reads a file of this name: `.yaml`, `.yml` or `.json`, not hidden (an
/// editor's swap file, a temporary file renamed into place, a log kept beside the manifests are not).
pub fn is_manifest_file_name(path: &Path) -> bool {
    let is_yaml = matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"));
    let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
    is_yaml && !hidden
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}]\n";

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tierlb-manifests-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn duplicates_are_reported_and_the_first_file_wins() {
        let d = tempdir("dup");
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        std::fs::write(d.join("b.yaml"), GOOD.replace("10.96.0.10", "10.96.0.11")).unwrap();
        let loaded = ManifestDir::new(&d).load().unwrap();
        let web = &loaded.model.services[&ObjKey::new("default", "web")];
        assert_eq!(web.cluster_ips[0].to_string(), "10.96.0.10");
        assert!(loaded.diagnostics.iter().any(|x| x.message.contains("duplicate")
            && matches!(&x.origin, Origin::File { path, .. } if path.ends_with("b.yaml"))));
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn ip_of(loaded: &Loaded, name: &str) -> String {
        loaded.model.services[&ObjKey::new("default", name)].cluster_ips[0].to_string()
    }

    /// With a watcher, a refresh reads only the files its events named (an edit is one file's stat and
    /// read); an event on the directory, the kubelet's `..data` swap or a lost event reads them all; a
    /// hidden file's event calls for nothing.
    #[test]
    fn with_a_watcher_a_refresh_reads_only_the_files_named() {
        let d = tempdir("watched");
        let api = GOOD.replace("name: web", "name: api");
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        std::fs::write(d.join("b.yaml"), api.replace("10.96.0.10", "10.96.0.12")).unwrap();
        let (mut md, seen) = ManifestDir::watched(&d);
        assert_eq!(md.load().unwrap().model.services.len(), 2, "the first refresh reads everything");
        // Both files change; only a.yaml's event is seen.
        std::fs::write(d.join("a.yaml"), GOOD.replace("10.96.0.10", "10.96.0.20")).unwrap();
        std::fs::write(d.join("b.yaml"), api.replace("10.96.0.10", "10.96.0.22")).unwrap();
        assert!(seen.saw(&d, &d.join("a.yaml")));
        assert!(!seen.saw(&d, &d.join(".a.yaml.swp")), "a hidden file is not a manifest");
        assert!(!seen.saw(&d, &d.join("notes.txt")));
        let loaded = md.load().unwrap();
        assert_eq!(
            (ip_of(&loaded, "web").as_str(), ip_of(&loaded, "api").as_str()),
            ("10.96.0.20", "10.96.0.12")
        );
        // A file removed: its event names it.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        assert!(seen.saw(&d, &d.join("a.yaml")));
        assert_eq!(md.load().unwrap().model.services.len(), 1);
        // The kubelet's atomic writer swaps `..data`; every file is looked at.
        assert!(seen.saw(&d, &d.join("..data")));
        assert_eq!(ip_of(&md.load().unwrap(), "api"), "10.96.0.22");
        std::fs::write(d.join("b.yaml"), api.replace("10.96.0.10", "10.96.0.32")).unwrap();
        seen.everything();
        assert_eq!(ip_of(&md.load().unwrap(), "api"), "10.96.0.32");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_objects_and_other_files_still_load() {
        let d = tempdir("lastgood");
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        std::fs::write(
            d.join("other.yaml"),
            GOOD.replace("name: web", "name: api").replace("10.96.0.10", "10.96.0.12"),
        )
        .unwrap();
        let mut md = ManifestDir::new(&d);
        assert_eq!(md.load().unwrap().model.services.len(), 2);
        std::fs::write(d.join("a.yaml"), "kind: Service\n  broken: [").unwrap();
        let loaded = md.load().unwrap();
        assert_eq!(loaded.model.services.len(), 2, "web is kept from the last good version");
        assert_eq!(loaded.stale_files, vec![d.join("a.yaml")]);
        assert!(loaded.diagnostics.iter().any(|x| x.severity == Severity::Error));
        // Fixing the file takes the new content.
        std::fs::write(d.join("a.yaml"), GOOD.replace("10.96.0.10", "10.96.0.20")).unwrap();
        let loaded = md.load().unwrap();
        assert_eq!(
            loaded.model.services[&ObjKey::new("default", "web")].cluster_ips[0].to_string(),
            "10.96.0.20"
        );
        // Deleting the file deletes its objects.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        assert_eq!(md.load().unwrap().model.services.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
