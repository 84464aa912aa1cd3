//! Which cgroup the agent attaches to, and the refusal to attach to a root cgroup by accident.
use std::path::{Path, PathBuf};

/// `CGROUP2_SUPER_MAGIC` from linux/magic.h.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Why `check` refused a cgroup, or why there is no default one.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The path given does not exist.
    #[error("cgroup {path} does not exist: create it, or pass --cgroup with an existing cgroup2 directory")]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// The path is on another filesystem (cgroup v1, or not a cgroup at all).
    #[error(
        "{path} is not on a cgroup2 filesystem: tierlb needs cgroup v2 (mount it, e.g. \
         `mount -t cgroup2 none /sys/fs/cgroup`, or pass --cgroup with a directory under the cgroup2 mount)"
    )]
    NotCgroup2 {
        /// The path, resolved.
        path: PathBuf,
    },
    /// The path is the cgroup2 root and `--allow-root-cgroup` was not given.
    #[error(
        "refusing to attach to the root cgroup {path}: that rewrites traffic of every process on this host. On a \
         Kubernetes node that is intended: pass --allow-root-cgroup. Otherwise pass --cgroup with a child cgroup"
    )]
    Root {
        /// The root, resolved.
        path: PathBuf,
    },
    /// No default: /proc/self/mountinfo lists no cgroup2 mount.
    #[error("no cgroup2 filesystem is mounted: tierlb needs cgroup v2; mount it or pass --cgroup")]
    NoCgroup2,
    /// Resolving the path or statfs on it failed otherwise.
    #[error("cannot inspect cgroup {path}: {source}")]
    Io {
        /// The path being inspected.
        path: PathBuf,
        /// What resolving or statfs returned.
        #[source]
        source: std::io::Error,
    },
}

/// `CGROUP_SUPER_MAGIC` (a cgroup v1 hierarchy) from linux/magic.h.
const CGROUP1_SUPER_MAGIC: i64 = 0x0027_e0eb;

/// Which kind of cgroup filesystem a directory is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2, where the agent's programs attach.
    V2,
    /// A cgroup v1 hierarchy.
    V1,
    /// Another filesystem.
    None,
}

/// The cgroup filesystem `path` is on (`statfs`), `None` when it cannot be read.
pub fn hierarchy(path: &Path) -> Option<Hierarchy> {
    let fs = nix::sys::statfs::statfs(path).ok()?;
    #[expect(clippy::useless_conversion, reason = "the magic's integer type differs between libc targets")]
    Some(match i64::from(fs.filesystem_type().0) {
        CGROUP2_SUPER_MAGIC => Hierarchy::V2,
        CGROUP1_SUPER_MAGIC => Hierarchy::V1,
        _ => Hierarchy::None,
    })
}

/// Mount points of cgroup2 filesystems, from /proc/self/mountinfo.
pub fn cgroup2_mounts() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let mount_point = pre.split_whitespace().nth(4)?;
            (fstype == "cgroup2").then(|| PathBuf::from(mount_point.replace("\\040", " ")))
        })
        .collect()
}

/// The cgroup2 root, for the default `--cgroup`.
pub fn default_root() -> Result<PathBuf, CgroupError> {
    cgroup2_mounts().into_iter().next().ok_or(CgroupError::NoCgroup2)
}

/// Resolve and check the cgroup the agent will attach to.
pub fn check(path: &Path, allow_root: bool) -> Result<PathBuf, CgroupError> {
    let canon = std::fs::canonicalize(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CgroupError::NotFound { path: path.to_owned() },
        _ => CgroupError::Io { path: path.to_owned(), source: e },
    })?;
    let fs = nix::sys::statfs::statfs(&canon)
        .map_err(|e| CgroupError::Io { path: canon.clone(), source: std::io::Error::from(e) })?;
    #[expect(clippy::useless_conversion, reason = "the magic's integer type differs between libc targets")]
    let magic = i64::from(fs.filesystem_type().0);
    if magic != CGROUP2_SUPER_MAGIC {
        return Err(CgroupError::NotCgroup2 { path: canon });
    }
    let is_root = cgroup2_mounts().iter().any(|m| m == &canon) || canon == Path::new("/sys/fs/cgroup");
    if is_root && !allow_root {
        return Err(CgroupError::Root { path: canon });
    }
    Ok(canon)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cgroup_names_the_path() {
        let e = check(Path::new("/nonexistent/tierlb-test"), false).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/tierlb-test"), "{e}");
    }

    #[test]
    fn a_directory_that_is_not_cgroup2_is_refused() {
        let e = check(Path::new("/tmp"), false).unwrap_err();
        assert!(matches!(e, CgroupError::NotCgroup2 { .. }), "{e}");
    }

    #[test]
    fn the_root_cgroup_is_refused_without_the_flag() {
        // tierlb needs cgroup2 (its programs attach there), and so do its tests: no mount is a failure.
        let root = cgroup2_mounts().into_iter().next().expect("a cgroup2 mount on the test machine");
        let e = check(&root, false).unwrap_err();
        assert!(matches!(e, CgroupError::Root { .. }), "{e}");
        assert!(e.to_string().contains("--allow-root-cgroup"));
        assert!(check(&root, true).is_ok());
    }
}
