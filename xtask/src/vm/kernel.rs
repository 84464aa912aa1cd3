//! Debian's kernels for the test VMs: the newest build of each series Debian 12 ships (6.1 from bookworm and
//! its updates and security updates, 6.12 from its updates or bookworm-backports), downloaded with a private apt state, unpacked and indexed
//! (`depmod`) into a cache directory named by the package's exact version.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::util::{self, PrivateApt, output};

/// A kernel series the VMs boot: its name on the command line and the Debian package names it matches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Series {
    /// `6.1`, `6.12`.
    pub name: &'static str,
    /// The package name's prefix and suffix around its ABI part (`linux-image-6.1.0-` `57` `-amd64-unsigned`).
    prefix: &'static str,
    suffix: &'static str,
}

/// Debian 12's kernel and its backport.
pub(crate) const SERIES: [Series; 2] = [
    Series { name: "6.1", prefix: "linux-image-6.1.0-", suffix: "-amd64-unsigned" },
    Series { name: "6.12", prefix: "linux-image-6.12.", suffix: "+deb12-amd64-unsigned" },
];

const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
";

/// An unpacked kernel: its image, its release (`uname -r`) and the directory holding `lib/modules/<release>`.
pub(crate) struct Kernel {
    pub series: &'static str,
    /// The Debian package and version it came from.
    pub package: String,
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules: PathBuf,
}

fn cache() -> PathBuf {
    super::cache_root().join("kernels")
}

/// The newest package of `series` Debian offers, unpacked into the cache unless it is there already. Without
/// a reachable mirror, the newest one cached.
pub(crate) fn ensure(series: &Series) -> anyhow::Result<Kernel> {
    let newest = PrivateApt::new("tierlb-vm-apt", SOURCES)
        .map_err(|e| eprintln!("vm: Debian's package lists could not be read ({e:#}); using the cache"))
        .ok()
        .and_then(|apt| newest_package(&apt, series).map(|p| (apt, p)));
    let dir = match newest {
        Some((apt, (package, version))) => {
            let dir = cache().join(format!("{package}_{version}"));
            if !dir.join(".complete").exists() {
                unpack(&apt, &package, &version, &dir)?;
            }
            dir
        }
        None => cached(series).with_context(|| {
            format!("no Debian kernel {} is cached and Debian's mirror is not reachable", series.name)
        })?,
    };
    open(series, &dir)
}

/// (package, version) of the highest ABI of `series`.
fn newest_package(apt: &PrivateApt, series: &Series) -> Option<(String, String)> {
    let pattern = format!("^{}[0-9.]+{}$", regex_escape(series.prefix), regex_escape(series.suffix));
    let names = output(apt.cmd("apt-cache").args(["search", "--names-only", &pattern]))?;
    let package = names
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|n| {
            let abi = n.strip_prefix(series.prefix)?.strip_suffix(series.suffix)?;
            let key: Vec<u32> = abi.split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
            Some((key, n.to_owned()))
        })
        .max()?
        .1;
    let policy = output(apt.cmd("apt-cache").args(["policy", &package]))?;
    let version = policy.lines().find_map(|l| l.trim().strip_prefix("Candidate: "))?.to_owned();
    Some((package, version))
}

fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if c == '.' || c == '+' { format!("\\{c}") } else { c.to_string() }).collect()
}

fn cached(series: &Series) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cache())
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.join(".complete").exists()
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(series.prefix)
                        && n.split('_').next().is_some_and(|p| p.ends_with(series.suffix))
                })
        })
        .collect();
    dirs.sort();
    dirs.pop()
}

fn unpack(apt: &PrivateApt, package: &str, version: &str, dir: &Path) -> anyhow::Result<()> {
    eprintln!("vm: fetching {package} {version}");
    let work = std::env::temp_dir().join("tierlb-vm-kernel");
    let deb = apt.download(&format!("{package}={version}"), &work)?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(dir))?;
    let _ = std::fs::remove_dir_all(&work);
    let release = release_of(dir)?;
    // Debian's package leaves the index to its postinst: make it here, for modprobe in the VM.
    util::run(Command::new("depmod").arg("-b").arg(dir).arg(&release))?;
    std::fs::write(dir.join(".complete"), format!("{package} {version}\n"))?;
    Ok(())
}

fn release_of(dir: &Path) -> anyhow::Result<String> {
    let modules = dir.join("lib/modules");
    let entry = std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .next()
        .with_context(|| format!("{} is empty", modules.display()))??;
    Ok(entry.file_name().to_string_lossy().into_owned())
}

fn open(series: &Series, dir: &Path) -> anyhow::Result<Kernel> {
    let release = release_of(dir)?;
    let vmlinuz = dir.join(format!("boot/vmlinuz-{release}"));
    if !vmlinuz.exists() {
        bail!("{} has no kernel image", dir.display());
    }
    let stamp = std::fs::read_to_string(dir.join(".complete")).unwrap_or_default();
    Ok(Kernel {
        series: series.name,
        package: stamp.trim().to_owned(),
        release,
        vmlinuz,
        modules: dir.join("lib/modules"),
    })
}

impl Kernel {
    /// The module files (relative to `lib/modules/<release>`) that `names` need, each after the ones it
    /// depends on, as `modules.dep` gives them; a name the kernel builds in is left out.
    pub(crate) fn load_order(&self, names: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
        let root = self.modules.join(&self.release);
        let dep = std::fs::read_to_string(root.join("modules.dep"))?;
        let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for line in dep.lines() {
            let Some((file, rest)) = line.split_once(':') else { continue };
            let needs = rest.split_whitespace().map(module_name).collect();
            deps.insert(module_name(file), (file.to_owned(), needs));
        }
        let builtin = std::fs::read_to_string(root.join("modules.builtin")).unwrap_or_default();
        let builtin: BTreeSet<String> = builtin.lines().map(module_name).collect();
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for name in names {
            let name = name.replace('-', "_");
            if builtin.contains(&name) {
                continue;
            }
            visit(&name, &deps, &mut seen, &mut order)
                .with_context(|| format!("module {name} of {}", self.release))?;
        }
        Ok(order.into_iter().map(|f| root.join(f)).collect())
    }
}

fn visit(
    name: &str,
    deps: &BTreeMap<String, (String, Vec<String>)>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<String>,
) -> anyhow::Result<()> {
    if !seen.insert(name.to_owned()) {
        return Ok(());
    }
    let (file, needs) = deps.get(name).context("not in modules.dep")?;
    for n in needs {
        visit(n, deps, seen, order)?;
    }
    order.push(file.clone());
    Ok(())
}

/// `kernel/fs/9p/9p.ko.xz` -> `9p`; dashes as underscores, as the kernel names modules.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}
