//! What the kernel offers the programs: its release, BTF, and whether the programs verify, with the program
//! types, map types and helpers they use probed one by one where they do not, so that what is missing is
//! named.
use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};

use super::Check;
use crate::datapath::{
    ebpf::{Capacities, Loaded, MIN_KERNEL, embedded_object},
    tc,
};

/// The release against `MIN_KERNEL`.
pub(super) fn kernel(release: &str) -> Check {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let version = (parts.next().and_then(|p| p.parse().ok()), parts.next().and_then(|p| p.parse().ok()));
    let floor = format!("{}.{}", MIN_KERNEL.0, MIN_KERNEL.1);
    match version {
        (Some(major), Some(minor)) if (major, minor) >= MIN_KERNEL => {
            Check::ok("kernel", format!("Linux {release} (tierlb needs {floor} or later)"))
        }
        (Some(_), Some(_)) => Check::fail(
            "kernel",
            format!("Linux {release} is older than {floor}"),
            format!("run a kernel of {floor} or later (Debian 12's 6.1 is tested: docs/kernels.md)"),
        ),
        _ => Check::warn(
            "kernel",
            format!("release {release:?} does not parse as a version"),
            "the programs' verification below says whether it has what they need",
        ),
    }
}

/// The kernel's own BTF, which the programs' relocations are resolved against.
pub(super) fn btf() -> Check {
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    if std::fs::metadata(VMLINUX).is_ok() {
        Check::ok("btf", VMLINUX.to_owned())
    } else {
        Check::fail(
            "btf",
            format!("{VMLINUX} is missing: the kernel was built without CONFIG_DEBUG_INFO_BTF"),
            "run a kernel built with CONFIG_DEBUG_INFO_BTF=y (every Debian, Ubuntu and Fedora kernel is)",
        )
    }
}

/// The capacities the verification loads with: the programs are the same at any size, the maps a few pages.
const SMALL: Capacities = Capacities::all(64);

/// Whether the programs verify on this kernel, loaded as the agent loads them (small maps, nothing pinned or
/// attached); where they do not, the program types, map types and helpers they use, probed one by one.
pub(super) fn programs(verify: bool) -> Vec<Check> {
    let Some(object) = embedded_object() else {
        return vec![Check::fail(
            "programs",
            "this binary was built without the BPF object",
            "build it with the BPF toolchain (`cargo xtask setup`, then `cargo build`)",
        )];
    };
    let used = match Used::of(object) {
        Ok(used) => used,
        Err(e) => return vec![Check::fail("programs", format!("the BPF object does not parse: {e}"), "")],
    };
    if !verify {
        return vec![Check::warn("programs", format!("not verified (--no-verify): {}", used.summary()), "")];
    }
    match Loaded::load(SMALL, None) {
        Ok(_) => vec![Check::ok("programs", format!("verified: {}", used.summary()))],
        Err(e) => {
            let mut out = vec![Check::fail(
                "programs",
                format!("do not load: {}", crate::output::error_text(&anyhow::Error::from(e))),
                "see the missing features below; a kernel of 6.1 or later with BTF has them all",
            )];
            out.extend(used.missing());
            out
        }
    }
}

/// How the tc programs will be attached.
pub(super) fn tc_attach() -> Check {
    if tc::kernel_has_tcx() {
        Check::ok("tc-attach", "tcx links (Linux 6.6)")
    } else {
        Check::ok(
            "tc-attach",
            "netlink filters on a clsact qdisc (no tcx before Linux 6.6), at priority 65000",
        )
    }
}

/// What the object's programs use of the kernel: program types, map types and (program type, helper).
struct Used {
    programs: Vec<(String, ProgramType)>,
    maps: Vec<(String, MapType)>,
    helpers: Vec<(ProgramType, u32)>,
}

impl Used {
    fn of(object: &[u8]) -> Result<Self, String> {
        use aya_obj::{Object, ProgramSection};
        let mut obj = Object::parse(object).map_err(|e| e.to_string())?;
        let text = obj.functions.keys().map(|(section, _)| *section).collect();
        obj.relocate_calls(&text).map_err(|e| e.to_string())?;
        let mut programs = Vec::new();
        let mut helpers: Vec<(ProgramType, u32)> = Vec::new();
        for (name, p) in &obj.programs {
            let kind = match p.section {
                ProgramSection::CgroupSockAddr { .. } => ProgramType::CgroupSockAddr,
                ProgramSection::CgroupSock { .. } => ProgramType::CgroupSock,
                ProgramSection::SockOps => ProgramType::SockOps,
                ProgramSection::SchedClassifier => ProgramType::SchedClassifier,
                _ => continue,
            };
            programs.push((name.clone(), kind));
            let Some(f) = obj.functions.get(&p.function_key()) else { continue };
            // A helper call: BPF_JMP | BPF_CALL with source register 0 (1 is a call of a function of the
            // program, 2 a kfunc), the helper's id in the immediate.
            for insn in &f.instructions {
                let call = (kind, insn.imm.cast_unsigned());
                if insn.code == 0x85 && insn.src_reg() == 0 && !helpers.contains(&call) {
                    helpers.push(call);
                }
            }
        }
        programs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut maps: Vec<(String, MapType)> = obj
            .maps
            .iter()
            .filter(|(name, _)| !name.starts_with('.'))
            .filter_map(|(name, m)| {
                let kind = aya_obj::generated::bpf_map_type::try_from(m.map_type()).ok()?;
                Some((name.clone(), MapType::try_from(kind).ok()?))
            })
            .collect();
        maps.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self { programs, maps, helpers })
    }

    fn summary(&self) -> String {
        format!(
            "{} programs, {} maps, {} (program type, helper) pairs",
            self.programs.len(),
            self.maps.len(),
            self.helpers.len()
        )
    }

    /// A check per program type, map type and helper the kernel does not have.
    fn missing(&self) -> Vec<Check> {
        let mut out = Vec::new();
        for (name, kind) in first_of_each(&self.programs) {
            if !is_program_supported(kind).unwrap_or(false) {
                out.push(Check::fail(
                    "program-type",
                    format!("{kind:?} (program {name}) is not supported"),
                    "a kernel of 6.1 or later with CONFIG_CGROUP_BPF and CONFIG_NET_CLS_BPF",
                ));
            }
        }
        for (name, kind) in first_of_each(&self.maps) {
            if !is_map_supported(kind).unwrap_or(false) {
                out.push(Check::fail(
                    "map-type",
                    format!("{kind:?} (map {name}) is not supported"),
                    "a kernel of 6.1 or later",
                ));
            }
        }
        for (kind, id) in &self.helpers {
            let Some(helper) = helper(*id) else { continue };
            if !is_helper_supported(*kind, helper).unwrap_or(true) {
                out.push(Check::fail(
                    "helper",
                    format!("{helper:?} is not available to {kind:?} programs"),
                    "a kernel of 6.1 or later",
                ));
            }
        }
        out
    }
}

/// The first (name, kind) of each kind, in order.
fn first_of_each<K: Copy + PartialEq>(items: &[(String, K)]) -> Vec<(&str, K)> {
    let mut out: Vec<(&str, K)> = Vec::new();
    for (name, kind) in items {
        if !out.iter().any(|(_, k)| k == kind) {
            out.push((name, *kind));
        }
    }
    out
}

/// The helper of id `id`, if this aya knows it.
fn helper(id: u32) -> Option<BpfHelper> {
    if id == 0 || id >= BpfHelper::__BPF_FUNC_MAX_ID as u32 {
        return None;
    }
    // SAFETY: `bpf_func_id` is a `repr(u32)` enum whose variants are every number from 0 to
    // `__BPF_FUNC_MAX_ID` (the kernel's enum, generated from one list), and `id` is in that range.
    Some(unsafe { std::mem::transmute::<u32, BpfHelper>(id) })
}
