//! `cargo xtask setup`: install everything the build needs, idempotently, on a fresh Debian machine of this
//! kind. Each step checks first and says whether it did anything; a second run takes seconds.
use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::util::{self, output};

#[derive(clap::Args, Default)]
pub(crate) struct Options {}

/// Debian packages: LLVM 22 for bpf-linker (same major as rustc's LLVM), bpftool and iproute2 for the
/// in-kernel tests, the demo and debugging.
/// iptables and nftables are what the benchmark compares against.
/// librsvg2-bin's rsvg-convert rasterises the charts for the render test (lb-lab `render`), which looks at
/// them as a person would.
/// prometheus brings promtool, which checks and unit-tests deploy/monitoring's rules, and the server the
/// metrics test scrapes an agent with (it is only run by the tests, on loopback in their own namespace).
/// buildah builds the agent's image from deploy/image/Containerfile and podman loads it for the check. jq
/// runs the demo's monitoring check (`kubectl ... | jq`), as the story's operator ran it.
/// qemu-system-x86, debootstrap, busybox-static and kmod (depmod) make and boot the test VMs of Debian's
/// kernels (`cargo xtask test --kernel`), xz-utils unpacks their modules.
const PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "bpftool",
    "iproute2",
    "iptables",
    "nftables",
    "librsvg2-bin",
    "prometheus",
    "buildah",
    "podman",
    "jq",
    "qemu-system-x86",
    "debootstrap",
    "busybox-static",
    "kmod",
    "xz-utils",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

pub(crate) fn run(_o: &Options) -> anyhow::Result<()> {
    debian_packages()?;
    crate::k8s::build()?;
    rust_src()?;
    bpf_linker()?;
    nextest()?;
    cargo_fuzz()?;
    eprintln!("setup: everything is in place");
    Ok(())
}

fn installed(pkg: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .is_some_and(|s| s.ends_with(" installed"))
}

fn debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        eprintln!("setup: Debian packages present ({})", PACKAGES.join(", "));
        return Ok(());
    }
    if !util::is_root() {
        bail!(
            "setup needs root to install Debian packages {missing:?} (run as root, or install them yourself)"
        );
    }
    eprintln!("setup: installing Debian packages {missing:?}");
    util::run(Command::new("apt-get").arg("update").arg("-q"))?;
    util::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// rust-src matching `rustc -V` exactly, from Debian (rustup cannot download here), for `-Z build-std=core`.
/// Fetched with a private apt state directory so the system's apt sources are not touched.
fn rust_src() -> anyhow::Result<()> {
    let sysroot =
        output(Command::new("rustc").args(["--print", "sysroot"])).context("rustc --print sysroot")?;
    let dest = Path::new(&sysroot).join("lib/rustlib/src/rust");
    if dest.join("library/Cargo.lock").exists() && dest.join("library/core/src/lib.rs").exists() {
        eprintln!("setup: rust-src present in {}", dest.display());
        return Ok(());
    }
    let version = output(Command::new("rustc").arg("-V"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .context("rustc -V")?;
    eprintln!("setup: fetching Debian rust-src for rustc {version}");
    let apt = util::PrivateApt::new(
        "tierlb-setup-apt",
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian \
         trixie-backports main\n",
    )?;
    // Pick the Debian version built from exactly this rustc release, e.g. 1.95.0+dfsg1-2~bpo13+1.
    let listing = output(apt.cmd("apt-cache").args(["madison", "rust-src"])).unwrap_or_default();
    let deb_version = listing
        .lines()
        .filter_map(|l| l.split('|').nth(1).map(str::trim))
        .find(|v| v.starts_with(&format!("{version}+")))
        .with_context(|| {
            format!("Debian has no rust-src for rustc {version} in trixie-backports (found: {listing:?})")
        })?
        .to_owned();
    let work = std::env::temp_dir().join("tierlb-setup-apt");
    let deb = apt.download(&format!("rust-src={deb_version}"), &work.join("debs"))?;
    let extract = work.join("x");
    let _ = std::fs::remove_dir_all(&extract);
    util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extract))?;
    let library = extract.join(format!("usr/src/rustc-{version}/library"));
    anyhow::ensure!(library.join("core/src/lib.rs").exists(), "unexpected layout in {}", deb.display());
    std::fs::create_dir_all(&dest)?;
    let _ = std::fs::remove_dir_all(dest.join("library"));
    util::run(Command::new("cp").arg("-a").arg(&library).arg(&dest))?;
    let _ = std::fs::remove_dir_all(&extract);
    eprintln!("setup: rust-src {deb_version} installed in {}", dest.display());
    Ok(())
}

fn bpf_linker() -> anyhow::Result<()> {
    if output(Command::new("bpf-linker").arg("--version")).is_some_and(|v| v.contains(BPF_LINKER_VERSION)) {
        eprintln!("setup: bpf-linker {BPF_LINKER_VERSION} present");
        return Ok(());
    }
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    // Without LLVM_PREFIX its build script finds bookworm's LLVM 14 llvm-config and fails to link -lLLVM.
    let path = format!("{LLVM_PREFIX}/bin:{}", std::env::var("PATH").unwrap_or_default());
    util::run(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--locked"])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
            .env("PATH", path),
    )
}

fn nextest() -> anyhow::Result<()> {
    cargo_install("nextest", "cargo-nextest")
}

/// cargo-fuzz for `cargo xtask fuzz` (and the short fuzz runs of `cargo xtask test`).
fn cargo_fuzz() -> anyhow::Result<()> {
    cargo_install("fuzz", "cargo-fuzz")
}

/// `cargo install --locked` a cargo subcommand unless `cargo SUBCOMMAND --version` already answers.
fn cargo_install(subcommand: &str, package: &str) -> anyhow::Result<()> {
    if output(Command::new("cargo").args([subcommand, "--version"])).is_some() {
        eprintln!("setup: {package} present");
        return Ok(());
    }
    eprintln!("setup: installing {package}");
    util::run(Command::new("cargo").args(["install", package, "--locked"]))
}
