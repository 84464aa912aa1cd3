//! The test VMs' root filesystem: Debian 12 (bookworm, the release whose kernels they boot), minimal, with
//! the tools the in-kernel tests call, made by debootstrap into the cache once per package list. The VM mounts
//! it read-only over 9p beneath a tmpfs overlay, so a run never changes it.
use std::{path::PathBuf, process::Command};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

use crate::util;

/// What the tests call beyond the base system: `ip` and `tc` (iproute2), `bpftool`, `iptables` and `nft`
/// (the tests that prove tierlb leaves them alone), `modprobe` for the kernel's module autoloading (kmod),
/// `ps`/`pgrep` (procps).
const PACKAGES: &[&str] = &["kmod", "iproute2", "iptables", "nftables", "bpftool", "procps"];
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";

/// The root filesystem's directory, made unless cached.
pub(crate) fn ensure() -> anyhow::Result<PathBuf> {
    let key = Sha256::digest(format!("{SUITE} {MIRROR} {}", PACKAGES.join(",")));
    let hex = util::hex(&key[..6]);
    let dir = super::cache_root().join(format!("rootfs-{SUITE}-{hex}"));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let tmp = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.parent().context("cache has a parent")?)?;
    eprintln!("vm: making the root filesystem (debootstrap {SUITE}, {})", PACKAGES.join(", "));
    util::run(
        Command::new("debootstrap")
            .args(["--variant=minbase", &format!("--include={}", PACKAGES.join(","))])
            .arg(SUITE)
            .arg(&tmp)
            .arg(MIRROR),
    )?;
    std::fs::write(tmp.join(".complete"), format!("{SUITE} {}\n", PACKAGES.join(" ")))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)?;
    Ok(dir)
}
