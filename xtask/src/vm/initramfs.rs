//! The initramfs that turns a Debian kernel into a test VM: busybox (static, from Debian's busybox-static),
//! the modules the kernel needs to reach its root (virtio PCI, 9p, overlay; decompressed, in load order) and an
//! `/init` that mounts the root filesystem read-only over 9p beneath a tmpfs overlay, the kernel's modules and
//! the shared host directories (the workspace, the Go-built control plane) at their own paths, then hands
//! over to the guest script. Written as a newc cpio archive.
use std::{fmt::Write as _, io::Write as _, path::Path, process::Command};

use anyhow::Context as _;

use super::kernel::Kernel;

/// What `/init` needs to mount its root: 9p over virtio PCI, and overlayfs.
const MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// 9p's options for every share: the Linux dialect, large messages (the default 8 KiB makes reads slow).
pub(crate) const NINEP: &str = "trans=virtio,version=9p2000.L,msize=512000";

/// The archive for `kernel`, booting into `guest` (a script on the workspace share) with each of `shares`
/// (its 9p tag, its path on the host and in the VM, read-only or not) mounted.
pub(crate) fn build(kernel: &Kernel, shares: &[Share], guest: &Path, out: &Path) -> anyhow::Result<()> {
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "lib", "lib/m", "proc", "sys", "lower", "upper", "newroot"] {
        cpio.dir(d);
    }
    cpio.node("dev/console", 0o020_600, (5, 1));
    let busybox = std::fs::read("/bin/busybox").context("reading /bin/busybox (Debian's busybox-static)")?;
    cpio.file("bin/busybox", 0o755, &busybox);
    for (i, module) in kernel.load_order(MODULES)?.iter().enumerate() {
        let name = module.file_name().and_then(|n| n.to_str()).context("module name")?;
        let plain = name.split(".ko").next().unwrap_or(name);
        cpio.file(&format!("lib/m/{i:02}-{plain}.ko"), 0o644, &decompress(module)?);
    }
    cpio.file("init", 0o755, init(shares, guest).as_bytes());
    std::fs::write(out, cpio.finish())?;
    Ok(())
}

/// A module file's bytes: Debian compresses 6.12's with xz, 6.1's not at all.
fn decompress(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz").arg("-dc").arg(path).output()?;
        anyhow::ensure!(out.status.success(), "xz -dc {} failed", path.display());
        Ok(out.stdout)
    } else {
        Ok(std::fs::read(path)?)
    }
}

/// A host directory the VM mounts at the same path.
pub(crate) struct Share {
    pub tag: &'static str,
    pub path: std::path::PathBuf,
    pub read_only: bool,
}

fn init(shares: &[Share], guest: &Path) -> String {
    let guest = guest.display();
    let mut mounts = String::new();
    for s in shares {
        let (path, tag, ro) = (s.path.display(), s.tag, if s.read_only { ",ro" } else { "" });
        writeln!(mounts, "$b mkdir -p /newroot{path}").expect("writing to a String");
        writeln!(mounts, "$b mount -t 9p -o {NINEP}{ro} {tag} /newroot{path} || fail \"no {tag} share\"")
            .expect("writing to a String");
    }
    format!(
        r#"#!/bin/busybox sh
# tierlb's test VM: mount the root, the modules and the workspace, then run the guest script.
b=/bin/busybox
fail() {{ echo "tierlb-vm: $*"; echo o > /proc/sysrq-trigger; $b sleep 60; }}
$b mount -t devtmpfs dev /dev
$b mount -t proc proc /proc
$b mount -t sysfs sys /sys
for m in /lib/m/*.ko; do $b insmod "$m" || fail "insmod $m failed"; done
$b mount -t 9p -o {NINEP},cache=loose,ro rootfs /lower || fail "no root share"
$b mount -t tmpfs -o mode=0755 upper /upper
$b mkdir /upper/u /upper/w
$b mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w root /newroot || fail "no overlay"
$b mkdir -p /newroot/lib/modules
$b mount -t 9p -o {NINEP},ro modules /newroot/lib/modules || fail "no modules share"
{mounts}for d in dev proc sys; do $b mount --move /$d /newroot/$d; done
exec $b switch_root /newroot /bin/bash {guest}
"#
    )
}

/// A newc ("070701") cpio archive, as the kernel unpacks an initramfs.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn node(&mut self, name: &str, mode: u32, rdev: (u32, u32)) {
        self.entry(name, mode, rdev, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            if mode & 0o170_000 == 0o040_000 { 2 } else { 1 },
            0,
            u32::try_from(data.len()).expect("initramfs members are under 4 GiB"),
            0,
            0,
            rdev.0,
            rdev.1,
            u32::try_from(name.len() + 1).expect("short names"),
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            write!(self.buf, "{f:08x}").expect("writing to a Vec");
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
}
