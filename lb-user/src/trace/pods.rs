//! Which pod a trace event's process belongs to: cgroup id -> cgroup path -> pod UID -> `namespace/name`.
//!
//! - cgroup id -> path: the id `bpf_get_current_cgroup_id` returns is the inode number of the cgroup's
//!   directory in the cgroup2 mount (kernfs), so a walk of the tree maps ids to paths. A miss (a container
//!   started after the walk) is tried first through `/proc/PID/cgroup` of the event's process, checked by
//!   inode, then by walking again (at most once a second).
//! - path -> pod UID: the kubelet names pod cgroups after the pod's UID under both cgroup drivers (`pod_uid`).
//! - UID -> name: the kubelet's pod log directories, `/var/log/pods/<namespace>_<name>_<uid>`
//!   (`BuildPodLogsDirectory` in pkg/kubelet/kuberuntime), on every node that runs a CRI runtime. Not the
//!   agent's source: it reads Services, EndpointSlices and Nodes, never Pods (its ClusterRole has no Pod
//!   access), and an EndpointSlice's targetRef names only pods that are endpoints, while the pods a trace
//!   asks about are clients. The log directories name every pod on the node, need no API access, and are
//!   what the kubelet itself wrote.
//!
//! Cilium's lookup broke on exactly these paths (cilium#21609, #26368: the systemd driver's escaped UIDs,
//! QoS-class levels, container scopes below the pod); the parser is tested on both drivers' layouts.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::model::ObjKey;

/// How often a miss may walk a tree (cgroups, pod log directories) again.
const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// Deepest cgroup walked (a pod's containers sit at depth 4 or 5 below the root under either driver).
const MAX_DEPTH: usize = 12;

/// The UID of the pod a cgroup path belongs to (the pod's own cgroup or a container's below it), or `None`.
///
/// - systemd driver: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
///   cri-containerd-<id>.scope` (guaranteed pods: `kubepods-pod<uid>.slice` directly under
///   `kubepods.slice`); the UID's dashes are written as underscores (systemd reserves `-` as the slice
///   hierarchy separator).
/// - cgroupfs driver: `kubepods/burstable/pod<uid>/<container id>` (guaranteed: `kubepods/pod<uid>/..`).
///
/// A kubelet `--cgroup-root` (kind's `/kubelet`) prefixes the systemd names (`kubelet-kubepods-...`).
pub fn pod_uid(path: &str) -> Option<String> {
    let mut under_kubepods = false;
    for part in path.split('/') {
        if let Some(slice) = part.strip_suffix(".slice")
            && slice.split('-').any(|w| w == "kubepods")
            && let Some((_, uid)) = slice.rsplit_once("-pod")
        {
            return valid_uid(&uid.replace('_', "-"));
        }
        if part == "kubepods" || part.starts_with("kubepods.") || part.starts_with("kubepods-") {
            under_kubepods = true;
            continue;
        }
        if under_kubepods && let Some(uid) = part.strip_prefix("pod") {
            return valid_uid(uid);
        }
    }
    None
}

/// A pod UID: a UUID (36 characters), or the 32 hex digits of a static pod's config hash.
fn valid_uid(uid: &str) -> Option<String> {
    let ok = matches!(uid.len(), 32 | 36) && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    ok.then(|| uid.to_ascii_lowercase())
}

/// A kubelet pod log directory's name, `<namespace>_<name>_<uid>`, as (uid, pod). Namespaces and pod names
/// are DNS labels and subdomains, which never hold `_`.
pub fn pod_log_dir(name: &str) -> Option<(String, ObjKey)> {
    let mut parts = name.split('_');
    let (ns, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || ns.is_empty() || pod.is_empty() {
        return None;
    }
    Some((valid_uid(uid)?, ObjKey::new(ns, pod)))
}

/// What a trace knows of one cgroup id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Client {
    /// The cgroup's path in the cgroup2 mount, if found.
    pub cgroup: Option<PathBuf>,
    /// The pod, if the path is a pod's and its UID has a log directory.
    pub pod: Option<ObjKey>,
    /// The pod's UID, if the path is a pod's.
    pub pod_uid: Option<String>,
}

/// Resolves cgroup ids to clients, with caches that a miss refreshes at most once per `RESCAN_EVERY`.
pub struct Resolver {
    root: PathBuf,
    pod_logs: PathBuf,
    paths: HashMap<u64, PathBuf>,
    pods: HashMap<String, ObjKey>,
    /// Clients fully resolved (a pod with its name, or a cgroup that is no pod's), by cgroup id: the common
    /// case costs one lookup per event.
    clients: HashMap<u64, Client>,
    walked_cgroups: Option<Instant>,
    walked_pods: Option<Instant>,
}

impl Resolver {
    /// Resolve under the cgroup2 mount `root`, with pod names from the kubelet's `pod_logs` directory.
    pub fn new(root: PathBuf, pod_logs: PathBuf) -> Self {
        Self {
            root,
            pod_logs,
            paths: HashMap::new(),
            pods: HashMap::new(),
            clients: HashMap::new(),
            walked_cgroups: None,
            walked_pods: None,
        }
    }

    /// The client of cgroup `id`, whose process `pid` made the call (it may have exited since).
    pub fn client(&mut self, id: u64, pid: u32) -> Client {
        if let Some(c) = self.clients.get(&id) {
            return c.clone();
        }
        let cgroup = self.path(id, pid);
        let pod_uid = cgroup.as_deref().and_then(|p| pod_uid(&p.to_string_lossy()));
        let pod = pod_uid.as_ref().and_then(|uid| self.pod(uid));
        let client = Client { cgroup, pod, pod_uid };
        // What is missing may turn up later (a new cgroup, a pod's log directory not made yet): asked again.
        if client.cgroup.is_some() && client.pod.is_some() == client.pod_uid.is_some() {
            self.clients.insert(id, client.clone());
        }
        client
    }

    fn path(&mut self, id: u64, pid: u32) -> Option<PathBuf> {
        if let Some(p) = self.paths.get(&id) {
            return Some(p.clone());
        }
        if let Some(p) = self.via_proc(id, pid) {
            self.paths.insert(id, p.clone());
            return Some(p);
        }
        if due(&mut self.walked_cgroups) {
            self.paths.clear();
            walk(&self.root, 0, &mut self.paths);
        }
        self.paths.get(&id).cloned()
    }

    /// `/proc/PID/cgroup`'s cgroup2 line (`0::/path`), if that directory has inode `id`.
    fn via_proc(&self, id: u64, pid: u32) -> Option<PathBuf> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        let path = self.root.join(rel.trim_start_matches('/'));
        (std::fs::metadata(&path).ok()?.ino() == id).then_some(path)
    }

    fn pod(&mut self, uid: &str) -> Option<ObjKey> {
        if !self.pods.contains_key(uid) && due(&mut self.walked_pods) {
            self.pods = read_pod_logs(&self.pod_logs);
        }
        self.pods.get(uid).cloned()
    }
}

/// Whether a walk may run now (none ran in the last `RESCAN_EVERY`); records it if so.
fn due(last: &mut Option<Instant>) -> bool {
    if last.is_some_and(|t| t.elapsed() < RESCAN_EVERY) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// Every directory below `dir` (cgroups), by inode number.
fn walk(dir: &Path, depth: usize, out: &mut HashMap<u64, PathBuf>) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return };
    out.insert(meta.ino(), dir.to_owned());
    if depth >= MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&e.path(), depth + 1, out);
        }
    }
}

/// The kubelet's pod log directories under `dir`: pod UID -> pod.
fn read_pod_logs(dir: &Path) -> HashMap<String, ObjKey> {
    let Ok(entries) = std::fs::read_dir(dir) else { return HashMap::new() };
    entries.flatten().filter_map(|e| pod_log_dir(e.file_name().to_str()?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f6b9c2e-3d4a-4b5c-8d9e-123456789abc";

    #[test]
    fn pod_uids_come_from_both_kubelet_cgroup_drivers_paths() {
        let systemd_uid = UID.replace('-', "_");
        let cases = [
            (
                "systemd, burstable, a container scope",
                format!(
                    "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-4f1e2d.scope"
                ),
                Some(UID),
            ),
            (
                "systemd, besteffort, the pod slice itself",
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd_uid}.slice"
                ),
                Some(UID),
            ),
            (
                "systemd, guaranteed (no QoS level)",
                format!("/kubepods.slice/kubepods-pod{systemd_uid}.slice/crio-9a8b.scope"),
                Some(UID),
            ),
            ("cgroupfs, burstable", format!("/kubepods/burstable/pod{UID}/4f1e2d3c"), Some(UID)),
            ("cgroupfs, guaranteed", format!("/kubepods/pod{UID}/4f1e2d3c"), Some(UID)),
            (
                "systemd below a kubelet --cgroup-root (kind)",
                format!(
                    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{systemd_uid}.slice"
                ),
                Some(UID),
            ),
            (
                "a static pod's config hash",
                "/kubepods/burstable/pod0123456789abcdef0123456789abcdef/c".into(),
                Some("0123456789abcdef0123456789abcdef"),
            ),
            ("the QoS level alone", "/kubepods.slice/kubepods-burstable.slice".into(), None),
            ("not a pod: a system service", "/system.slice/containerd.service".into(), None),
            ("a `pod` directory outside kubepods", format!("/user.slice/pod{UID}"), None),
            ("a UID of the wrong length", "/kubepods/burstable/pod1234/c".into(), None),
        ];
        for (name, path, want) in cases {
            assert_eq!(pod_uid(&path).as_deref(), want, "{name}: {path}");
        }
    }

    #[test]
    fn pod_log_directories_name_namespace_pod_and_uid() {
        assert_eq!(
            pod_log_dir(&format!("kube-system_coredns-5d78c9869d-x2k4p_{UID}")),
            Some((UID.to_owned(), ObjKey::new("kube-system", "coredns-5d78c9869d-x2k4p")))
        );
        assert_eq!(pod_log_dir("default_web"), None, "no UID");
        assert_eq!(pod_log_dir(&format!("a_b_c_{UID}")), None, "one part too many");
        assert_eq!(pod_log_dir("default_web_not-a-uid"), None);
    }
}
