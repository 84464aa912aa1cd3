//! Builds `lb-ebpf` for `bpfel-unknown-none` with aya-build (which links with BTF) and leaves the object in
//! OUT_DIR for `include_bytes_aligned!`. Needs `RUSTC_BOOTSTRAP=1` (stable toolchain + `-Z build-std=core`)
//! and bpf-linker; `cargo xtask setup` installs both. `AYA_BUILD_SKIP=1` skips the BPF build (then the
//! binary carries no object and every command that needs BPF says so). It also names the git commit the
//! binary is built from, for `tierlb --version` and the image's tag (`cargo xtask image`).
use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    println!("cargo::rustc-check-cfg=cfg(embedded_ebpf)");
    println!("cargo::rerun-if-env-changed=AYA_BUILD_SKIP");
    git_commit();
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../lb-ebpf").canonicalize().context("locating lb-ebpf")?;
    // aya-build watches lb-ebpf; the BPF code also compiles lb-common, so watch that too.
    let common_dir = manifest_dir.join("../lb-common").canonicalize().context("locating lb-common")?;
    println!("cargo::rerun-if-changed={}", common_dir.display());
    let ebpf_dir = ebpf_dir.to_str().context("lb-ebpf path is not UTF-8")?.to_owned();
    aya_build::build_ebpf(
        [aya_build::Package { name: "lb-ebpf", root_dir: &ebpf_dir, ..Default::default() }],
        aya_build::Toolchain::Custom("stable"),
    )?;
    if PathBuf::from(std::env::var("OUT_DIR")?).join("lb-ebpf").exists() {
        println!("cargo::rustc-cfg=embedded_ebpf");
    }
    Ok(())
}

/// Sets `TIERLB_GIT_COMMIT` for the crate: the commit HEAD names, or `TIERLB_GIT_COMMIT` from the environment
/// (a build from a source tarball that knows its commit), or "unknown" outside a git checkout or without git.
/// No "-dirty" mark: it would need a rerun on every file of the tree; `cargo xtask image` checks a clean tree.
fn git_commit() {
    println!("cargo::rerun-if-env-changed=TIERLB_GIT_COMMIT");
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
        Some(String::from_utf8(out.stdout).ok()?.trim().to_owned())
    };
    let commit = std::env::var("TIERLB_GIT_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--verify", "-q", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // Rerun when HEAD moves: HEAD itself (a checkout), the branch it names (a commit) and packed-refs (where a
    // gc moves that branch). Absolute paths, since a worktree keeps them in the main repository's .git. Only
    // existing files: cargo reruns a script on every build while a watched path is missing.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && PathBuf::from(&path).exists()
        {
            println!("cargo::rerun-if-changed={path}");
        }
    }
    println!("cargo::rustc-env=TIERLB_GIT_COMMIT={commit}");
}
