//! Builds `lb-ebpf` for `bpfel-unknown-none` with aya-build (which links with BTF) and leaves the object in
//! OUT_DIR for `include_bytes_aligned!`. Needs `RUSTC_BOOTSTRAP=1` (stable toolchain + `-Z build-std=core`)
//! and bpf-linker; `cargo xtask setup` installs both. `AYA_BUILD_SKIP=1` skips the BPF build (then the
//! binary carries no object and every command that needs BPF says so).
use std::path::PathBuf;

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    println!("cargo::rustc-check-cfg=cfg(embedded_ebpf)");
    println!("cargo::rerun-if-env-changed=AYA_BUILD_SKIP");
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
